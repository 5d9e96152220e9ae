"""The course as data (issue 52): each notebook's part, prerequisites, needs and skill, the order to read them in,
and a glossary of the words the notebooks use before they define them. Notebook 00 prints it; a figure draws it.

Every notebook in ``notebooks/`` must have an entry (:func:`course_rows` refuses a folder that has one without),
and the learning path must read each notebook after its prerequisites (:func:`check_course`). Reading minutes are
never typed: they are counted from each notebook's prose (:func:`labkit.core.prose.reading_minutes`). Run times are
the fast-mode wall times ``scripts/notebook_budget.py`` measured, read from the README's budget table beside the
notebooks folder (:func:`measured_run_seconds`; none where the README is absent, as in an installed package).
Torch-free.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from labkit.core.notebook_map import notebook_map, notebooks_folder
from labkit.core.prose import reading_minutes

PARTS = ("1 · one device",
         "2 · many devices: communication and data parallelism",
         "3 · model parallelism",
         "4 · the capstone: every lesson on one job",
         "5 · many machines and planning")
CPU_ONLY = "CPU only"                 # what every notebook needs; the needs below unlock some of its checks
NAMESPACES = "network namespaces (root)"
TENSORFLOW = "TensorFlow"
MPI = "MPI"
GPU = "a GPU"
GPUS = "2+ GPUs"
NEEDS = (NAMESPACES, TENSORFLOW, MPI, GPU, GPUS)


@dataclass(frozen=True)
class Lesson:
    """One notebook's place in the course: its number (``05b``), part, a short topic for the figure, the one
    skill it teaches, the notebooks to read first (numbers) and what beyond a CPU some of its checks need."""

    number: str
    part: str
    topic: str
    skill: str
    prerequisites: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.part not in PARTS:
            raise ValueError(f"{self.number}: part {self.part!r} is not one of {PARTS}")
        if unknown := [n for n in self.needs if n not in NEEDS]:
            raise ValueError(f"{self.number}: needs {unknown} are not among {NEEDS}")
        if not self.skill or "\n" in self.skill or len(self.topic) > 24:
            raise ValueError(f"{self.number}: the skill is one line and the topic at most 24 characters")
        if self.number in self.prerequisites:
            raise ValueError(f"{self.number} lists itself as a prerequisite")


def _lesson(number: str, part: int, topic: str, skill: str, prerequisites: str = "",
            needs: tuple[str, ...] = ()) -> Lesson:
    return Lesson(number, PARTS[part - 1], topic, skill, tuple(prerequisites.split()), needs)


# One entry per notebook, from its header ("Skill", "Prerequisites", "Hardware needed"). A need means some checks
# print NOT CHECKED without it; every notebook runs on a CPU.
LESSONS = {lesson.number: lesson for lesson in (
    _lesson("00", 1, "start here", "run the kit, read `labkit doctor` and time one training step honestly"),
    _lesson("01", 1, "GPU utilisation", "read GPU utilisation and the data-wait fraction, and stop a starved device",
            "00"),
    _lesson("02", 1, "batch size", "choose a batch size by throughput, memory and convergence, each measured", "01",
            (TENSORFLOW,)),
    _lesson("02b", 1, "critical batch", "pick the batch that reaches a target accuracy soonest, from the noise scale",
            "02"),
    _lesson("03", 1, "profiling", "profile a training step with `torch.profiler` and read its trace", "01",
            (TENSORFLOW, GPU)),
    _lesson("03b", 1, "roofline", "tell whether a step is bound by compute, memory traffic or overhead", "02 03",
            (GPU,)),
    _lesson("04", 1, "input pipelines", "feed the device faster with loader workers, prefetching and `tf.data`",
            "03", (TENSORFLOW,)),
    _lesson("06", 2, "all-reduce", "run collectives on real ranks and price all-reduce with the α-β model", "00"),
    _lesson("07", 2, "synchronous SGD", "build data parallelism from two collectives and predict when it pays",
            "02 06"),
    _lesson("06b", 2, "MPI", "run collectives and synchronous SGD under `mpiexec`, as MPI clusters do", "06 07",
            (MPI,)),
    _lesson("08", 2, "TensorFlow distribution", "train with `MirroredStrategy`; measure threads and mixed precision",
            "07", (TENSORFLOW,)),
    _lesson("09", 2, "multi-GPU pitfalls", "trigger the classic multi-GPU pitfalls, then fix each one", "07 08",
            (TENSORFLOW,)),
    _lesson("09b", 2, "hangs and drift", "find the rank, the call and the cause of a hang or a silent drift", "09"),
    _lesson("11", 2, "ZeRO and FSDP", "predict and measure per-rank memory under DDP, ZeRO-1/2/3 and checkpointing",
            "02 06 07"),
    _lesson("05", 3, "model parallelism", "split a model into stages and shrink the bubble with micro-batches", "07"),
    _lesson("05b", 3, "pipeline schedules", "call torch's pipeline schedules and weigh bubble, memory and messages",
            "05"),
    _lesson("10", 4, "tuning ladder", "make one job faster rung by rung, each rung measured and checked for accuracy",
            "02 03 04 07 08", (GPU, GPUS)),
    _lesson("12", 5, "many machines", "launch one job on several nodes, measure the link, predict its cost",
            "06 07", (NAMESPACES, MPI)),
    _lesson("13", 5, "tensor parallelism", "split a transformer layer with the f/g operators and `parallelize_module`",
            "06 07 11 12", (NAMESPACES,)),
    _lesson("15", 5, "expert parallelism", "spread a mixture of experts over ranks and count its all-to-all",
            "06 12 13", (NAMESPACES,)),
    _lesson("16", 5, "distributed checkpoints", "save and resume sharded checkpoints with DCP, resharding on the way",
            "11 12 13", (NAMESPACES,)),
    _lesson("17", 5, "overlap", "hide gradient communication behind backward with buckets and prefetch", "06 07 12",
            (NAMESPACES, GPUS)),
    _lesson("14", 5, "which parallelism", "choose dp, tp, pp and cp with a planner that scores itself", "05b 11 12 13",
            (NAMESPACES, GPUS)),
    _lesson("18", 5, "one mesh", "compose every parallelism on one mesh, each checked against one process",
            "05b 07 13 14"),
)}
# The learning path: LESSONS' order (all-reduce and data parallelism before model parallelism; the capstone after
# every single-machine notebook; notebook 12's emulated nodes before the notebooks that use them).
LEARNING_PATH = tuple(LESSONS)

# Words the notebooks use before they define them: (term, one line, the notebook that teaches it).
GLOSSARY = (
    ("rank", "one process of a distributed job, numbered 0 to N−1; usually one per device", "06"),
    ("world size", "N, the number of ranks in the job", "06"),
    ("process group", "a set of ranks that run collectives together; the world is the largest", "06"),
    ("backend (gloo, NCCL)", "the library that moves the bytes: gloo on CPUs, NCCL between NVIDIA GPUs", "06"),
    ("collective", "a call every rank of a group makes together: broadcast, all-gather, reduce-scatter", "06"),
    ("all-reduce", "a collective that leaves the sum of every rank's tensor on every rank", "06"),
    ("data parallelism", "a full model copy per rank, each on its own slice of the batch", "07"),
    ("micro-batch", "a slice of the step's batch: one replica's share, or one piece in a pipeline", "07"),
    ("ZeRO / FSDP", "data parallelism that shards parameters, gradients and optimizer state over ranks", "11"),
    ("pipeline parallelism", "consecutive layers on different ranks, fed micro-batch by micro-batch", "05"),
    ("tensor parallelism", "each weight matrix of a layer split across ranks", "13"),
    ("expert parallelism", "a mixture of experts with its experts on different ranks", "15"),
    ("context parallelism", "the sequence split across ranks, attention passed around a ring", "14"),
    ("MFU", "model FLOPs utilisation: useful FLOP/s over the device's peak", "01"),
)


@dataclass(frozen=True)
class CourseRow:
    """One notebook on the learning path: its place, file, title, lesson data and measured reading time."""

    order: int
    file: str
    title: str
    lesson: Lesson
    prerequisite_files: tuple[str, ...]
    reading_minutes: float
    run_seconds: float | None = None        # fast mode, measured by scripts/notebook_budget.py; None: not measured


def find_cycle(prerequisites: dict[str, tuple[str, ...]]) -> list[str] | None:
    """A cycle of prerequisites as a list of numbers (first repeated last), or None when there is none."""
    state: dict[str, int] = {}          # 1 = on the current walk, 2 = done

    def walk(node: str, trail: list[str]) -> list[str] | None:
        state[node] = 1
        for before in prerequisites.get(node, ()):
            if state.get(before) == 1:
                return trail[trail.index(before):] + [before]
            if before not in state and (found := walk(before, trail + [before])):
                return found
        state[node] = 2
        return None

    for start in prerequisites:
        if start not in state and (found := walk(start, [start])):
            return found
    return None


def check_course(lessons: dict[str, Lesson], path: tuple[str, ...]) -> None:
    """Raise a one-line ValueError unless every prerequisite exists, none is circular, and the path reads every
    lesson exactly once, each after its prerequisites."""
    for lesson in lessons.values():
        if missing := [p for p in lesson.prerequisites if p not in lessons]:
            raise ValueError(f"{lesson.number} needs {missing}, which the course does not have")
    if cycle := find_cycle({n: lesson.prerequisites for n, lesson in lessons.items()}):
        raise ValueError(f"the prerequisites go round in a circle (each needs the next): {' -> '.join(cycle)}")
    if sorted(path) != sorted(lessons):
        raise ValueError(f"the path must read every lesson once: it has {sorted(path)}, the course {sorted(lessons)}")
    place = {number: i for i, number in enumerate(path)}
    for number in path:
        if late := [p for p in lessons[number].prerequisites if place[p] > place[number]]:
            raise ValueError(f"the path reads {number} before its prerequisites {late}")


def course_rows(folder: str | Path | None = None, lessons: dict[str, Lesson] | None = None,
                path: tuple[str, ...] | None = None) -> list[CourseRow]:
    """The course in reading order, joined with the notebooks in ``folder`` (the repository's by default); a
    notebook without a lesson, or a lesson without a notebook, is a ValueError naming it."""
    lessons, path = (LESSONS, LEARNING_PATH) if lessons is None else (lessons, path or tuple(lessons))
    check_course(lessons, path)
    where = notebooks_folder(folder)
    found = {row.number: row for row in notebook_map(where)}
    if missing := sorted(set(found) - set(lessons)):
        raise ValueError(f"notebooks {missing} have no entry in labkit.core.course.LESSONS: add one")
    if absent := sorted(set(lessons) - set(found)):
        raise ValueError(f"the course lists notebooks {absent} that are not in {where}")
    run = measured_run_seconds(where.parent / "README.md")
    return [CourseRow(i, found[n].file, found[n].title, lessons[n],
                      tuple(found[p].file for p in lessons[n].prerequisites), reading_minutes(where / found[n].file),
                      run.get(n)) for i, n in enumerate(path, start=1)]


def measured_run_seconds(readme: Path) -> dict[str, float]:
    """Notebook number -> fast-mode wall seconds, from the README table whose header has a ``time`` column
    (``scripts/notebook_budget.py --markdown`` writes its figures there); empty when there is no README."""
    try:
        lines = readme.read_text(encoding="utf-8").splitlines()
    except OSError:
        return {}
    seconds: dict[str, float] = {}
    column = None
    for line in lines:
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if not cells:
            column = None
        elif cells[0] == "#" and "time" in cells:
            column = cells.index("time")
        elif column is not None and len(cells) > column and (m := re.fullmatch(r"(\d+) s", cells[column])):
            seconds[cells[0]] = float(m.group(1))
    return seconds


def time_line(row: CourseRow) -> str:
    """The header's time line, the map's two figures: '**Time:** 31 s to run in fast mode, about 7 min to read.'"""
    return f"**Time:** {run_text(row)} to run in fast mode, about {max(row.reading_minutes, 1):.0f} min to read."


def run_text(row: CourseRow) -> str:
    """'31 s', or 'not measured' where the README has no figure for the notebook."""
    return "not measured" if row.run_seconds is None else f"{row.run_seconds:.0f} s"


def needs_text(lesson: Lesson) -> str:
    """What a notebook needs, in words: 'CPU only', or the CPU and what some of its checks need beyond it."""
    return CPU_ONLY if not lesson.needs else "CPU; some checks: " + ", ".join(lesson.needs)


def _link(file: str) -> str:
    return f"[{file.split('_')[0]}]({file})"


def path_markdown(rows: list[CourseRow]) -> str:
    """The learning path as a Markdown table: order, notebook, skill, prerequisites, needs, reading minutes and
    the measured fast-mode run time."""
    lines = ["| # | Notebook | Skill | Read first | Needs | Reading | Run (fast mode, measured) |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r.order} | {_link(r.file)} {r.lesson.topic} | {r.lesson.skill} | "
              f"{', '.join(_link(p) for p in r.prerequisite_files) or '—'} | {needs_text(r.lesson)} | "
              f"{r.reading_minutes:.0f} min | {run_text(r)} |" for r in rows]
    return "\n".join(lines)


def parts_markdown(rows: list[CourseRow]) -> str:
    """One line per part: its notebooks in reading order and their reading time added up."""
    lines = []
    for part in PARTS:
        mine = [r for r in rows if r.lesson.part == part]
        if mine:
            minutes = sum(r.reading_minutes for r in mine)
            run = sum(r.run_seconds or 0.0 for r in mine) / 60
            lines.append(f"- **{part}**: {', '.join(_link(r.file) for r in mine)} (about {minutes:.0f} min to read, "
                         f"{run:.0f} min to run in fast mode)")
    return "\n".join(lines)


def glossary_markdown(rows: list[CourseRow], glossary: tuple[tuple[str, str, str], ...] = GLOSSARY) -> str:
    """The glossary as a Markdown table, each term linked to the notebook that teaches it (which must be on the
    path: a ValueError otherwise)."""
    files = {r.lesson.number: r.file for r in rows}
    if unknown := [term for term, _, number in glossary if number not in files]:
        raise ValueError(f"glossary terms {unknown} point at notebooks the course does not have")
    lines = ["| Term | Meaning | Taught in |", "|---|---|---|"]
    lines += [f"| {term} | {meaning} | {_link(files[number])} |" for term, meaning, number in glossary]
    return "\n".join(lines)
