"""Judge a learner's distributed code on live ranks: "write the all-reduce hook", run on real gloo processes.

The learner writes a function in a notebook cell. :func:`ship_answer` copies its source (``inspect.getsource``)
into ``answer.py`` in a fresh run folder, below a fixed preamble (``torch`` and ``dist``), so the ranks, forked from
the launcher's forkserver that never saw the kernel's ``__main__``, import it by path (:func:`load_answer`). Only a
self-contained function travels: one that reads any other name from the notebook gets a one-line error naming it.

A :class:`RankExercise` keeps the checker's rules (:mod:`labkit.core.exercises`) for multi-process answers: the
cases are seeded, and each check adds fresh ones drawn with a new seed; inside every rank the kit's answers (the
``expected`` one and each typical :class:`~labkit.core.exercises.Mistake`) run first, on every case, then the
learner's, each on its own deep copy of the case and its own model; the launcher's timeout is a time limit per case
(``case_s``, plus ``start_s`` to start the ranks); the outputs are compared as plain data with the checker's
tolerance and shapes (:func:`labkit.core.answers.mismatch`), rank by rank. A wrong, crashing (it raises, or
``os._exit`` ends its process) or hanging answer (the launcher's timeout) each gets one verdict line, and the launcher
leaves no process or folder behind (a later launch removes a killed kernel's run folder). Verdicts are the checker's
:class:`~labkit.core.exercises.Verdict`, kept in its ``ExerciseBook``. Torch-free: ``run_case`` imports torch.
"""
from __future__ import annotations

import ast
import builtins
import contextlib
import copy
import dis
import importlib.util
import inspect
import os
import random
import sys
import tempfile
import textwrap
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from labkit.comm.launch import (RUN_DIR_PREFIX, LaunchError, LaunchTimeout, RankFailedError, launch, resolve_target,
                                target_name)
from labkit.core.answers import FLOAT32_REL_TOL, mismatch, show, show_args
from labkit.core.exercises import CORRECT, NOT_ATTEMPTED, WRONG, ExerciseBook, Mistake, Verdict

PREAMBLE = "import torch\nimport torch.distributed as dist\n"     # the names an answer may use from outside itself
PREAMBLE_NAMES = ("torch", "dist")
ANSWER_FILE, _GLOBAL_OPS = "answer.py", {"LOAD_GLOBAL", "LOAD_NAME", "STORE_GLOBAL", "DELETE_GLOBAL"}


class AnswerRaised(RuntimeError):
    """Raised in a rank when the learner's code raised there; its message is the verdict's reason."""


class AnswerNotShippable(ValueError):
    """The learner's function cannot run on the ranks as written (the message says why, in one line)."""


@dataclass(frozen=True)
class ShippedAnswer:
    """Where a learner's function lies for the ranks: the run folder, the file and the function's name."""

    folder: str
    name: str

    @property
    def path(self) -> str:
        return str(Path(self.folder) / ANSWER_FILE)


def _function_node(fn: Callable[..., Any]) -> ast.FunctionDef:
    """The ``def`` of ``fn`` as parsed from its source, decorators dropped; AnswerNotShippable when unreadable."""
    if not isinstance(fn, types.FunctionType) or fn.__name__ == "<lambda>":
        raise AnswerNotShippable(f"pass a function written with def in a cell, not a {type(fn).__name__}")
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError) as err:
        raise AnswerNotShippable(f"the source of {fn.__name__} cannot be read ({err}): define it with def in a cell "
                                 "and run that cell") from None
    node = tree.body[0] if tree.body else None
    if not isinstance(node, ast.FunctionDef) or node.name != fn.__name__:
        raise AnswerNotShippable(f"the source of {fn.__name__} is not one plain def: define it with def in a cell")
    node.decorator_list = []
    return node


def unfilled(fn: Any) -> bool:
    """True for None, ``...`` or a function whose body is only a docstring, ``...`` or ``pass`` (the stub)."""
    if fn is None or fn is Ellipsis:
        return True
    try:
        body = _function_node(fn).body
    except AnswerNotShippable:
        return False
    return all(isinstance(s, ast.Pass) or (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)
                                           and (s.value.value is Ellipsis or isinstance(s.value.value, str)))
               for s in body)


def outside_names(fn: types.FunctionType) -> list[str]:
    """Names ``fn`` (and the functions and lambdas inside it) reads from its module's globals, not builtins, not the
    preamble's and not its own name: what would be missing on the ranks."""
    found, codes = [], [fn.__code__]
    while codes:
        code = codes.pop()
        codes += [c for c in code.co_consts if isinstance(c, types.CodeType)]
        found += [i.argval for i in dis.get_instructions(code) if i.opname in _GLOBAL_OPS]
    allowed = set(PREAMBLE_NAMES) | {fn.__name__} | set(dir(builtins))
    return sorted(set(found) - allowed)


def answer_source(fn: Callable[..., Any]) -> str:
    """The module the ranks import: the preamble and ``fn``'s own def; AnswerNotShippable names what is missing."""
    node = _function_node(fn)
    if fn.__closure__:
        raise AnswerNotShippable(f"{fn.__name__} uses {', '.join(fn.__code__.co_freevars)} from an enclosing "
                                 "function: the ranks get its source alone; define it at the top of a cell")
    missing = outside_names(fn)
    if missing:
        raise AnswerNotShippable(f"{fn.__name__} uses {', '.join(missing)}, defined outside it in the notebook: the "
                                 f"ranks run its source alone; import or define {missing[0]} inside the function "
                                 f"(only {', '.join(PREAMBLE_NAMES)} are given)")
    return PREAMBLE + "\n\n" + ast.unparse(node) + "\n"


@contextlib.contextmanager
def ship_answer(fn: Callable[..., Any]) -> Iterator[ShippedAnswer]:
    """A run folder holding ``fn`` as ``answer.py`` (named like the launcher's own, so a later launch removes it if
    this process dies), removed on exit."""
    source = answer_source(fn)
    with tempfile.TemporaryDirectory(prefix=f"{RUN_DIR_PREFIX}{os.getpid()}-answer-") as folder:
        (Path(folder) / ANSWER_FILE).write_text(source)
        os.chmod(folder, 0o777)                     # ranks in a user namespace (emulated nodes) write markers too
        yield ShippedAnswer(folder, fn.__name__)


def load_answer(shipped: ShippedAnswer) -> Callable[..., Any]:
    """In a rank: import ``answer.py`` by path and return the learner's function."""
    sys.dont_write_bytecode = True                  # no __pycache__ left in the run folder
    spec = importlib.util.spec_from_file_location("labkit_learner_answer", shipped.path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except BaseException as err:  # noqa: BLE001 - the learner's file: whatever it raises is the learner's
        text = (str(err).strip().splitlines() or [""])[0][:200]
        _mark(shipped, text, f"raised.{os.environ.get('RANK', '0')}")   # raised, not died: the verdict says so
        raise AnswerRaised(f"your function's cell raised {type(err).__name__} on import: {text}") from None
    return getattr(module, shipped.name)


def call_answer(shipped: ShippedAnswer, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """In a rank: ``fn(*args, **kwargs)`` where the learner's code runs; whatever it raises becomes AnswerRaised
    (one line, ``what`` says where), and a marker file tells the launcher this rank raised rather than died."""
    rank = int(os.environ.get("RANK", "0"))
    try:
        return fn(*args, **kwargs)
    except BaseException as err:  # noqa: BLE001 - SystemExit and KeyboardInterrupt from the answer are its own
        text = (str(err).strip().splitlines() or [""])[0][:200]
        _mark(shipped, text, f"raised.{rank}")
        raise AnswerRaised(f"your code raised {type(err).__name__}{': ' + text if text else ''} ({what}, rank "
                           f"{rank})") from None


def _mark(shipped: ShippedAnswer, what: str, name: str = "") -> None:
    with contextlib.suppress(OSError):          # a marker only sharpens the verdict's line
        (Path(shipped.folder) / (name or f"at.{os.environ.get('RANK', '0')}")).write_text(what)


def cases_worker(shipped: ShippedAnswer, run_case: str, kit_answers: dict[str, str], cases: list[dict]) -> dict:
    """Run inside ``launch``: every kit answer on every case first, then the learner's; per name, one output per
    case (``run_case(answer, **case)``, plain data)."""
    runner = resolve_target(*run_case.split(":"))
    out = {name: [runner(resolve_target(*target.split(":")), **copy.deepcopy(c)) for c in cases]
           for name, target in kit_answers.items()}
    _mark(shipped, "loading your function")
    answer = load_answer(shipped)
    out["answer"] = []
    for i, case in enumerate(cases):
        _mark(shipped, f"case {i + 1} of {len(cases)}")
        out["answer"].append(call_answer(shipped, f"case {i + 1}", runner, answer, **copy.deepcopy(case)))
    _mark(shipped, "done")
    return out


def failure_line(err: LaunchError, shipped: ShippedAnswer, world_size: int, timeout_s: float) -> str:
    """One line for a launch the learner's code broke: it hung (the timeout), raised, or ended its process."""
    folder = Path(shipped.folder)
    where = {r: (folder / f"at.{r}").read_text() for r in range(world_size) if (folder / f"at.{r}").exists()}
    if isinstance(err, LaunchTimeout):
        at = f" (stopped at {where[min(where)]})" if where else ""
        return (f"your code did not finish on the {world_size} ranks within {timeout_s:g} s, the launcher's "
                f"timeout{at}: it hangs or waits for a collective the other rank never joins; every rank was killed")
    if not (raised := [r for r in range(world_size) if (folder / f"raised.{r}").exists()]) and not where:
        raise err                                   # the kit's own answers failed: a defect of the check
    silent = [r for r in range(world_size) if r not in raised and where.get(r) != "done"]
    if isinstance(err, RankFailedError) and silent and where:
        return (f"rank {silent[0]}'s process ended while running your code, without an exception (os._exit, a "
                f"crash or a kill; {err.summary}); every rank was stopped")
    if isinstance(err, RankFailedError):
        lines = [ln.split("AnswerRaised: ", 1)[1] for ln in err.remote_traceback.splitlines() if "AnswerRaised: " in ln]
        return lines[-1] if lines else f"a rank failed: {err.summary}"
    return f"the ranks did not run: {str(err).splitlines()[0]}"


@dataclass(frozen=True)
class RankExercise:
    """One "write the distributed code" exercise, judged on ``world_size`` live ranks.

    ``run_case(answer, **case)`` is a module-level function that runs one answer in a rank (builds the model, wires
    the answer in, steps) and returns plain data; ``expected`` (the kit's answer the outputs must equal),
    ``reference`` (the model answer :meth:`ExerciseBook.reveal` prints) and each mistake's answer are module-level
    functions too, so the ranks import them by name. ``cases(seed=...)`` returns keyword dicts; ``measure``
    (optional) runs after a correct answer and returns (a line, the mistake it found or None).
    """

    key: str
    task: str
    reference: Callable[..., Any]
    expected: Callable[..., Any]
    run_case: Callable[..., Any]
    cases: Callable[..., list[dict]]
    mistakes: tuple[Mistake, ...]
    hint: str
    world_size: int = 2
    case_s: float = 10.0          # the time limit per case (every answer on it, on every rank)
    start_s: float = 30.0         # starting the ranks on a busy 2-core machine
    rel_tol: float = 1e-6
    measure: Callable[[ShippedAnswer], tuple[str, Mistake | None]] | None = None

    def __post_init__(self) -> None:
        if not self.key or not self.task.strip() or not self.hint.strip() or not self.mistakes:
            raise ValueError("a rank exercise needs a key, a task, a general hint and at least one typical mistake")
        for fn in (self.run_case, self.expected, self.reference, *(m.answer for m in self.mistakes)):
            target_name(fn)                         # each must be importable by name in the ranks

    def check(self, book: ExerciseBook, answer: Any, seed: int | None = None) -> None:
        """Judge ``answer`` on live ranks, print the verdict and record it in ``book`` (as ``book.check`` does)."""
        if self.key not in book.planned:
            book.planned.append(self.key)
        try:
            verdict = judge_on_ranks(self, answer, seed=seed)
        except Exception as err:  # noqa: BLE001 - a defect of the check itself: one line instead of a traceback
            verdict = Verdict(self.key, WRONG, f"[{self.key}] the check itself failed ({type(err).__name__}: {err}); "
                                               "please report it")
        book.verdicts[self.key] = verdict
        print(verdict.text)


def _name(fn: Callable[..., Any]) -> str:
    return ":".join(target_name(fn))            # 'module:qualname', resolved again in the ranks


def _wrong_line(exercise: RankExercise, cases: list[dict], shown: int, got: list, want: list) -> tuple[str, int]:
    """(the first wrong case's line, how many cases are wrong); outputs are per case, one item per rank."""
    tol = max(exercise.rel_tol, FLOAT32_REL_TOL)
    bad = [i for i, (g, w) in enumerate(zip(got, want)) if mismatch(g, w, tol) is not None]
    i = bad[0]
    same = all(mismatch(want[i][r], want[i][0], tol) is None for r in range(1, len(want[i])))   # ranks should agree
    split = [r for r in range(1, len(got[i])) if same and mismatch(got[i][r], got[i][0], tol) is not None]
    per_rank = [r for r in range(len(want[i])) if mismatch(got[i][r], want[i][r], tol) is not None]
    ranks = f"; your ranks disagree (rank {split[0]} differs from rank 0)" if split else ""
    fresh = "" if i < shown else " (a fresh case, drawn for this check)"
    reason = mismatch(got[i][per_rank[0]], want[i][per_rank[0]], tol)
    return (f"e.g. {show_args(cases[i])}{fresh}: rank {per_rank[0]} got {show(got[i][per_rank[0]])}"
            f"{f' ({reason})' if reason else ''}, the kit expects {show(want[i][per_rank[0]])}{ranks}", len(bad))


def judge_on_ranks(exercise: RankExercise, answer: Any, *, seed: int | None = None,
                   cases: list[dict] | None = None) -> Verdict:
    """Ship ``answer`` to ``world_size`` gloo ranks, run it on the shown and fresh cases beside the kit's answers,
    and return the verdict (``seed`` fixes the fresh cases, for tests)."""
    head = f"[{exercise.key}]"
    if unfilled(answer):
        return Verdict(exercise.key, NOT_ATTEMPTED, f"{head} not attempted yet: {exercise.task}")
    want_args = list(inspect.signature(exercise.reference).parameters)
    if isinstance(answer, types.FunctionType) and list(inspect.signature(answer).parameters) != want_args:
        return Verdict(exercise.key, WRONG, f"{head} wrong: keep the stub's arguments ({', '.join(want_args)})")
    seed = random.SystemRandom().randrange(2**31) if seed is None else seed
    shown = list(cases) if cases is not None else exercise.cases()
    every = shown + exercise.cases(seed=seed)
    kit = {"expected": _name(exercise.expected), **{m.name: _name(m.answer) for m in exercise.mistakes}}
    timeout_s = exercise.start_s + exercise.case_s * len(every)
    try:
        with ship_answer(answer) as shipped:
            try:
                ranks = launch(cases_worker, exercise.world_size, args=(shipped, _name(exercise.run_case), kit, every),
                               timeout_s=timeout_s, backend="gloo", show_output=False)
            except LaunchError as err:
                why = failure_line(err, shipped, exercise.world_size, timeout_s)
                return Verdict(exercise.key, WRONG, f"{head} wrong: {why}")
            out = {name: [[r[name][i] for r in ranks] for i in range(len(every))] for name in ranks[0]}
            tol = max(exercise.rel_tol, FLOAT32_REL_TOL)
            if any(mismatch(g, w, tol) is not None for g, w in zip(out["answer"], out["expected"])):
                line, n_bad = _wrong_line(exercise, every, len(shown), out["answer"], out["expected"])
                made = next((m for m in exercise.mistakes if all(mismatch(g, t, tol) is None for g, t in
                                                                 zip(out["answer"], out[m.name]))), None)
                return Verdict(exercise.key, WRONG, f"{head} wrong on {n_bad} of {len(every)} cases on "
                               f"{exercise.world_size} live ranks; {line}\n  hint: "
                               f"{made.hint if made else exercise.hint}", made.name if made else None)
            live, made = ("", None) if exercise.measure is None else exercise.measure(shipped)
    except AnswerNotShippable as err:
        return Verdict(exercise.key, WRONG, f"{head} cannot run on the ranks: {err}")
    text = (f"{head} {'wrong' if made else 'correct'}: right on all {len(every)} cases ({len(every) - len(shown)} "
            f"of them fresh) on {exercise.world_size} live ranks, e.g. {show_args(shown[0])}")
    text += f"\n  measured: {live}" if live else ""
    text += f"\n  hint: {made.hint}" if made else ""
    return Verdict(exercise.key, WRONG if made else CORRECT, text, made.name if made else None)
