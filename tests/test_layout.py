"""The package's shape, checked: one home per lesson, layers that only import downwards, imports at the top,
one clock, torch-free modules that stay torch-free, modules of one job and a readable size, tests that mirror.

These are the rules of issue 12 and `shared/STYLE.md`; a change that breaks one fails here with the file and line.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "labkit"
# A module may import from its own layer and the layers below it, never above.
LAYERS = {"core": 0, "memory": 1, "comm": 1, "training": 2, "profile": 3, "input": 3, "parallel": 3, "sharding": 3,
          "ladder": 3, "tf": 3, "cluster": 3, "checkpoint": 3, "plan": 4, "ui": 4, "cli": 5}
# Modules that run in TensorFlow-only children or set up a kernel before a framework loads.
TORCH_FREE = ("core.clock", "core.course", "core.notebook_map", "core.open_questions", "core.prose", "core.validation",
              "core.machine", "core.procs", "core.rundirs", "core.progress", "core.results", "core.envcheck",
              "core.manifest",
              "core.lessons", "core.contention", "core.verdict", "core.claims", "training.batch_rules", "cluster.nodes",
              "cluster.rankside", "cluster.slurm", "comm.launch_nodes", "comm.stop")
MAX_MODULE_LINES = 320          # STYLE.md: "under ~300 lines"; a little slack for docstrings
CLOCK_CALLS = {("time", "perf_counter"), ("time", "time"), ("time", "monotonic"), ("time", "perf_counter_ns"),
               ("time", "process_time")}
# Imports allowed inside functions: frameworks a lesson must not load early, optional packages, and the CLI's
# parser modules (every subcommand module is imported to build `labkit --help`, which must not load torch).
LAZY_OK = {"tensorflow", "keras", "pynvml", "mpi4py", "hta", "tensorboard", "tensorboard_plugin_profile",
           "IPython", "playwright", "triton"}
LAZY_OK_MODULES = ("torch._dynamo", "torch.utils._triton")   # compiler probes: heavy, and may fail to import
LAZY_MARK = "# lazy:"           # any other import inside a function says why on its own line


def modules() -> list[tuple[str, Path]]:
    """(dotted name without 'labkit.', path) of every module in a lesson folder or one of its sub-folders
    (``parallel.tensor.runs``)."""
    out = []
    for path in sorted(PACKAGE.glob("*/**/*.py")):
        if path.name != "__init__.py" and "__pycache__" not in path.parts:
            out.append((".".join(path.relative_to(PACKAGE).with_suffix("").parts), path))
    return out


def top_level_ids(tree: ast.Module) -> set[int]:
    """ids of the module's top-level statements, counting those in a top-level ``if TYPE_CHECKING:`` block
    (imports for type hints only: never run, so they load nothing) and in a top-level ``try:`` (a guarded import,
    as ``core.torch_compat`` makes of a private torch name: it runs at import time like any other)."""
    top = {id(n) for n in tree.body}
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            top |= {id(n) for n in node.body}
        if isinstance(node, ast.Try):
            top |= {id(n) for n in node.body}
    return top


def labkit_imports(tree: ast.Module) -> list[tuple[ast.AST, str, bool]]:
    """(node, imported 'pkg.module' or 'pkg', at_top_level) for every import of labkit."""
    top = top_level_ids(tree)
    found = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("labkit"):
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.startswith("labkit")]
        for name in names:
            parts = name.split(".")[1:]
            if parts and parts[0] in LAYERS:
                found.append((node, ".".join(parts[:2]), id(node) in top))
    return found


def test_every_lesson_folder_holds_modules_and_the_top_level_only_the_api():
    assert {p.name for p in PACKAGE.glob("*.py")} == {"__init__.py", "__main__.py"}
    assert {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"} == set(LAYERS)


@pytest.mark.parametrize("name, path", modules(), ids=[m for m, _ in modules()])
def test_module_imports_only_its_layer_or_below(name, path):
    layer = LAYERS[name.split(".")[0]]
    tree = ast.parse(path.read_text())
    upward = [f"line {n.lineno}: {target}" for n, target, _ in labkit_imports(tree)
              if LAYERS[target.split(".")[0]] > layer]
    assert not upward, f"{name} imports from a higher layer: {upward}"


@pytest.mark.parametrize("name, path", modules(), ids=[m for m, _ in modules()])
def test_labkit_imports_are_at_the_top(name, path):
    """Imports between labkit modules sit at the top, so the layering can be read off each file."""
    if name.startswith("cli."):
        return          # the CLI's parser modules import the lessons in `run` (see LAZY_OK)
    text = path.read_text()
    tree, lines = ast.parse(text), text.splitlines()
    inner = [f"line {n.lineno}: {t}" for n, t, top in labkit_imports(tree)
             if not top and LAZY_MARK not in lines[n.lineno - 1]]
    assert not inner, f"{name} imports labkit modules inside functions: {inner}"


@pytest.mark.parametrize("name, path", modules(), ids=[m for m, _ in modules()])
def test_third_party_imports_are_at_the_top_unless_optional_or_a_framework(name, path):
    if name.startswith("cli."):
        return
    text = path.read_text()
    tree, lines = ast.parse(text), text.splitlines()
    top = top_level_ids(tree)
    lazy = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in top:
            if LAZY_MARK in lines[node.lineno - 1]:
                continue
            modules = ([a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""])
            for module in modules:
                root = module.split(".")[0]
                if root == "labkit" or root in LAZY_OK or module.startswith(LAZY_OK_MODULES):
                    continue
                lazy.append(f"line {node.lineno}: {module}")
    assert not lazy, f"{name} imports inside functions (move to the top): {lazy}"


@pytest.mark.parametrize("name, path", modules(), ids=[m for m, _ in modules()])
def test_only_the_clock_module_reads_a_clock(name, path):
    if name == "core.clock":
        return
    tree = ast.parse(path.read_text())
    reads = [f"line {n.lineno}: time.{n.attr}" for n in ast.walk(tree)
             if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and (n.value.id, n.attr) in CLOCK_CALLS]
    assert not reads, f"{name} reads a clock itself; use labkit.core.clock: {reads}"


@pytest.mark.parametrize("name, path", modules(), ids=[m for m, _ in modules()])
def test_modules_stay_small(name, path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_MODULE_LINES, f"{name} has {lines} lines: split it by job (STYLE.md: under ~300)"


def test_torch_free_modules_and_every_tf_module_import_without_torch_or_tensorflow():
    names = [*TORCH_FREE, *(m for m, _ in modules() if m.startswith("tf."))]
    code = ("import importlib, sys\n"
            f"for name in {names!r}:\n"
            "    importlib.import_module('labkit.' + name)\n"
            "    heavy = [m for m in ('torch', 'tensorflow') if m in sys.modules]\n"
            "    assert not heavy, (name, heavy)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_importing_labkit_is_instant_and_loads_no_framework():
    code = "import sys, labkit; assert not {'torch', 'tensorflow'} & set(sys.modules), 'framework loaded'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, cwd=REPO)


def test_tests_mirror_the_package():
    """Every lesson module has tests/<package>/test_<module>.py (a module's tests may cover a sibling)."""
    covered_elsewhere = {"core.device_loader": "core/test_data.py", "training.window": "training/test_loop.py",
                         "training.stepper": "training/test_loop.py", "cli.common": "cli/test_main.py"}
    missing = []
    for name, _ in modules():
        *folders, mod = name.split(".")
        mirror = Path("tests", *folders, f"test_{mod}.py")
        if not (REPO / mirror).exists() and name not in covered_elsewhere:
            missing.append(str(mirror))
    assert not missing, f"modules without a mirrored test file: {missing}"


PARALLEL = PACKAGE / "parallel"
MAX_MODULES_PER_PARALLELISM = 8     # issue 50: a newcomer reads a parallelism's folder at a glance


def test_each_parallelism_has_a_folder_of_at_most_eight_modules_and_nothing_else():
    """labkit/parallel/ holds only folders, one per kind of parallelism; each folder is a package of at most eight
    modules, and its tests sit in the mirrored folder (tests/parallel/<kind>/, a package too)."""
    assert [p.name for p in PARALLEL.glob("*.py")] == ["__init__.py"]
    folders = sorted(p for p in PARALLEL.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert {"data", "pipeline", "tensor", "context", "debug"} <= {p.name for p in folders}
    for folder in folders:
        mods = [p for p in folder.glob("*.py") if p.name != "__init__.py"]
        assert (folder / "__init__.py").exists(), f"{folder.name} needs an __init__.py with its map"
        assert len(mods) <= MAX_MODULES_PER_PARALLELISM, f"parallel/{folder.name} holds {len(mods)} modules"
        assert (REPO / "tests" / "parallel" / folder.name / "__init__.py").exists(), \
            f"tests/parallel/{folder.name}/ must be a package (test files of one name in two folders)"


def _is_property(fn: ast.FunctionDef) -> bool:
    return any(getattr(d, "id", "") == "property" for d in fn.decorator_list)


def _hints_complete(fn: ast.FunctionDef) -> bool:
    """A return annotation, and one on every parameter but self/cls (``*args`` and ``**kwargs`` included)."""
    args = [a for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs if a.arg not in ("self", "cls")]
    args += [a for a in (fn.args.vararg, fn.args.kwarg) if a is not None]
    return fn.returns is not None and all(a.annotation is not None for a in args)


def undocumented_or_unhinted(tree: ast.Module) -> list[str]:
    """Public module-level functions, public classes and their public methods missing a docstring or a hint."""
    gaps = []
    for node in tree.body:
        fns = [node] if isinstance(node, ast.FunctionDef) and not node.name.startswith("_") else []
        if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            if not ast.get_docstring(node):
                gaps.append(f"line {node.lineno}: class {node.name} has no docstring")
            fns += [n for n in node.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")]
        for fn in fns:
            if not ast.get_docstring(fn) and not _is_property(fn):
                gaps.append(f"line {fn.lineno}: {fn.name} has no docstring")
            if not _hints_complete(fn):
                gaps.append(f"line {fn.lineno}: {fn.name} has incomplete type hints")
    return gaps


ALL_MODULES = sorted(PACKAGE.rglob("*.py"))          # the lesson folders, their __init__s and the top level


@pytest.mark.parametrize("path", ALL_MODULES, ids=[str(p.relative_to(PACKAGE)) for p in ALL_MODULES])
def test_public_functions_have_a_docstring_and_type_hints(path):
    """STYLE.md rule 4: every public function, class and method says what it does and has full type hints
    (a property needs its return hint; its docstring is optional)."""
    gaps = undocumented_or_unhinted(ast.parse(path.read_text()))
    assert not gaps, f"{path.relative_to(REPO)}: {gaps}"


def import_graph() -> dict[str, set[str]]:
    """module -> the labkit modules it imports, every import counted: top level, ``TYPE_CHECKING`` blocks and
    imports inside functions alike (a loop through a type hint or a lazy import is still a loop in meaning)."""
    names = {m for m, _ in modules()}
    graph: dict[str, set[str]] = {}
    for name, path in modules():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("labkit"):
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            edges |= {t.removeprefix("labkit.") for t in targets if t.removeprefix("labkit.") in names}
        graph[name] = edges - {name}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan 1972): each is at least one import loop."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_the_cycle_finder_finds_a_loop_through_a_type_hint():
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles_between_labkit_modules():
    """Issue 23: loop <-> stepper and memory -> memory_timeline -> workspace -> memory were loops; none may return,
    through a ``TYPE_CHECKING`` import or a lazy one either."""
    cycles = import_cycles(import_graph())
    assert not cycles, f"import cycles between labkit modules: {cycles}"


# Issue 23: one training step (labkit.core.step.TrainStep). These alone may call backward or an optimizer's step
# themselves, each for a reason the lesson needs; anything else goes through the one step.
OWN_STEP_ALLOWED = {
    "core.step.TrainStep._one": "the one step's backward",
    "core.step.TrainStep._update": "the one step's update",
    "parallel.pipeline.stage_exercise.one_f_one_b_step.backward": "1F1B by hand (05b's exercise): each stage's "
                                                                  "backward on the gradient its neighbour sent",
    "parallel.pipeline.stage_exercise._step_in_order": "05b's exercise: the unsplit model's micro-batches stepped in a "
                                                       "given order (the kit's expected answer and its rivals)",
    "parallel.data.sync_sgd.micro_batch_gradients": "the derivation: each replica's gradient kept, no update, compared "
                                               "with the combined batch's",
    "parallel.pipeline.gpipe._run_pipeline": "GPipe by hand: each stage's backward on the gradient its neighbour sent",
    "sharding.strategies.Zero1Optimizer.step": "ZeRO-1 by hand is an optimizer: its step calls Adam on the shard",
    "parallel.debug.drift._train": "drift by hand: each bug sits between the backward, the gradient all-reduce and the "
                             "update of one rank",
    "parallel.debug.hangs._ddp_step": "a provoked hang: DDP's backward on a rank that left a head out of its loss",
    "checkpoint.replicas.replica_main": "torchft's loop: zero_grad starts the step's quorum before the forward; the "
                                        "kit's step ends with zero_grad, so a group killed between steps would "
                                        "already be in the next quorum, where torchft 0.2's DDP hook asserts",
}
_OPTIMIZER_NAMES = ("opt", "scaler", "adam")


def own_step_calls(tree: ast.Module) -> list[tuple[str, int, str]]:
    """(enclosing function's qualified name, line, call) for every ``.backward(`` and every optimizer ``.step(``."""
    found = []

    def walk(node: ast.AST, qual: list[str]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                walk(child, qual + [child.name])
                continue
            if isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute):
                receiver = ast.unparse(child.func.value).lower()
                if child.func.attr == "backward" or (child.func.attr == "step"
                                                     and any(n in receiver for n in _OPTIMIZER_NAMES)):
                    found.append((".".join(qual), child.lineno, ast.unparse(child.func)))
            walk(child, qual)

    walk(tree, [])
    return found


def test_the_step_finder_sees_backward_and_optimizer_steps_but_not_profiler_steps():
    tree = ast.parse("def f(model, opt, prof):\n    loss.backward()\n    opt.step()\n    prof.step()\n")
    assert [(q, c) for q, _, c in own_step_calls(tree)] == [("f", "loss.backward"), ("f", "opt.step")]


def test_one_training_step_every_other_sequence_is_a_named_lesson():
    """Every forward/backward/update in labkit runs through labkit.core.step.TrainStep, but the lessons above."""
    own = []
    for name, path in modules():
        for qual, line, call in own_step_calls(ast.parse(path.read_text())):
            if f"{name}.{qual}" not in OWN_STEP_ALLOWED:
                own.append(f"{name}.{qual} line {line}: {call}()")
    assert not own, f"a training step outside labkit.core.step (use TrainStep, or name the lesson here): {own}"


# One home per mechanism (issue 35): source text that may appear in one module only (plus named exceptions).
SINGLE_HOMES = {
    "def positive_int(": ("core.validation",),                      # the CLI's argparse types call checked_int
    "precision must be": ("core.dtypes",),                          # the amp spelling table validates itself
    ".fp32_precision": ("training.flops",),                         # the one TF32 switch and math-mode rule
    "set_float32_matmul_precision": ("training.flops",),
    "saved_tensors_hooks(": ("memory.saved",),                     # issue 50: the one saved-tensor hook (its
                                                                    # on_free lets the pipeline meter see frees)
    "from torch.utils.checkpoint import": ("sharding.checkpointing",),  # issue 50: one checkpoint wrapper
    "use_reentrant=": ("sharding.checkpointing",),                  # (Checkpointed), the non-reentrant form
    "def predicted_bubble(": ("parallel.pipeline.schedule_sim",),   # issue 50: the bubble formula once (and see
                                                                    # test_the_bubble_formula_is_written_once)
    ".untyped_storage()": ("memory.saved",),                        # storage keys and bytes counted one way
    "os.killpg(": ("comm.stop",),                                   # one way to stop a launched process group
    "children(recursive=True)": ("comm.stop",                       # ... and all it started
                                 "core.gpu_neighbours"),            # (which reads this kernel's family, kills none)
    "def run_torchrun(": ("comm.launch_nodes",),                    # one torchrun runner, for a cell and the CLI
    'with_name("torchrun")': ("comm.launch_nodes",),                # one torchrun command builder
    'environ["LOCAL_RANK"]': (),                                    # comm.launch_env reads the launcher's variables
    'environ["WORLD_SIZE"]': (),
    "new_group(": ("comm.mesh",                                     # issue 50: one builder of groups of ranks ...
                   "parallel.debug.hangs",                          # ... beside whole-world side groups with a
                   "parallel.debug.rank_pitfalls",                  # timeout of their own (a watchdog, a patient
                   "checkpoint.async_saves"),                       # barrier) or the background writer's
    "def build_optimizer(": ("training.run_spec",),                 # a run's optimizer is made from its RunSpec
    "momentum must be a number": ("training.run_spec",),            # a run's facts are checked where it is made
    "must be one of {TRAIN_OPTIMIZERS}": ("training.run_spec",),
}


def test_a_run_is_described_once_the_loops_config_holds_it_and_repeats_none_of_its_facts():
    """TrainConfig adds how long and what to measure around one RunSpec; a field in both would be checked twice."""
    from dataclasses import fields

    from labkit.training.config import TrainConfig
    from labkit.training.run_spec import RunSpec

    shared = {f.name for f in fields(TrainConfig)} & {f.name for f in fields(RunSpec)}
    assert not shared, f"TrainConfig repeats the run's {sorted(shared)}: read them from config.spec instead"
    assert {f.name: f.type for f in fields(TrainConfig)}["run"] == "RunSpec | None"


@pytest.mark.parametrize("text", sorted(SINGLE_HOMES))
def test_each_mechanism_has_one_home(text):
    homes = {name for name, path in modules() if text in path.read_text()}
    assert homes <= set(SINGLE_HOMES[text]), (f"{text!r} is written outside its home {SINGLE_HOMES[text]}: "
                                              f"{sorted(homes - set(SINGLE_HOMES[text]))}; call the home instead")
    assert homes or not SINGLE_HOMES[text], f"{text!r} is in none of {SINGLE_HOMES[text]}: update SINGLE_HOMES"


def test_the_package_never_reads_the_tests_folder():
    """Issue 50: an installed kit has no tests/, so no module builds a path into it (recorded figures ship in data/,
    listed in data/manifest.json). A docstring may still point at a test file."""
    reads = []
    for path in ALL_MODULES:
        tree = ast.parse(path.read_text())
        docs = {id(owner.body[0].value) for owner in ast.walk(tree)
                if isinstance(owner, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and owner.body and isinstance(owner.body[0], ast.Expr)}
        reads += [f"{path.relative_to(REPO)}:{node.lineno}: {node.value[:60]!r}" for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
                  and (node.value == "tests" or "tests/" in node.value)]
    assert not reads, f"labkit reads tests/ at run time: {reads}"


def test_no_private_name_is_imported_from_another_module():
    """Issue 50: a name that starts with '_' is its module's own; another module that needs it needs a public name."""
    found = []
    for name, path in modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("labkit"):
                found += [f"{name} line {node.lineno}: {node.module}.{a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
    assert not found, f"private names imported across modules: {found}"


# Issue 50: private torch APIs (a '_' in the path) only behind labkit.core.torch_compat, which names the versions each
# was checked on and what the kit does without it.
TORCH_COMPAT = "core.torch_compat"
PRIVATE_TORCH_ATTRS = ("_cdata",)        # private attributes of torch objects themselves (a storage's identity)


def _private(part: str) -> bool:
    return part.startswith("_") and not part.startswith("__")


def _torch_roots(tree: ast.Module) -> set[str]:
    """Local names bound to torch or to something imported from it (``dist``, ``nn``, ``F``, ``TorchDispatchMode``)."""
    roots = {"torch"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {a.asname or a.name.split(".")[0] for a in node.names if a.name.split(".")[0] == "torch"}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
            roots |= {a.asname or a.name for a in node.names}
    return roots


def _chain(node: ast.AST) -> tuple[str | None, list[str]]:
    """(root name, attribute names) of ``a.b._c``: ('a', ['b', '_c']); root None when not a plain dotted name."""
    attrs = []
    while isinstance(node, ast.Attribute):
        attrs.insert(0, node.attr)
        node = node.value
    return (node.id if isinstance(node, ast.Name) else None), attrs


def private_torch_uses(tree: ast.Module) -> list[str]:
    """'line N: what' for every private torch name a module touches: ``from torch.x._y import z``, ``from torch.x
    import _z``, ``import torch._y``, ``torch.x._y`` or ``alias._y`` (an alias of torch or of a torch import),
    ``getattr(torch..., "_y")``, and the private attributes of torch objects in PRIVATE_TORCH_ATTRS."""
    roots, found = _torch_roots(tree), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
            if any(map(_private, node.module.split("."))) or any(_private(a.name) for a in node.names):
                found.add(f"line {node.lineno}: from {node.module} import {', '.join(a.name for a in node.names)}")
        elif isinstance(node, ast.Import):
            found |= {f"line {node.lineno}: import {a.name}" for a in node.names
                      if a.name.split(".")[0] == "torch" and any(map(_private, a.name.split(".")))}
        elif isinstance(node, ast.Attribute):
            root, attrs = _chain(node)
            if node.attr in PRIVATE_TORCH_ATTRS or (root in roots and any(map(_private, attrs))):
                found.add(f"line {node.lineno}: {ast.unparse(node)}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
              and _private(node.args[1].value)
              and (node.args[1].value in PRIVATE_TORCH_ATTRS or _chain(node.args[0])[0] in roots)):
            found.add(f"line {node.lineno}: {ast.unparse(node)}")
    return sorted(found)


def test_the_private_torch_finder_sees_imports_aliases_attributes_and_getattr():
    code = ("import torch\nimport torch.distributed as dist\nimport torch._dynamo\n"
            "from torch.utils._pytree import tree_flatten\nfrom torch._C._distributed_c10d import _dump_fr_trace\n"
            "from torch.distributed import distributed_c10d as c10d\n"
            "a = torch.cuda.memory._dump_snapshot\nb = dist.distributed_c10d._get_default_group()\n"
            "c = c10d._world\nd = storage._cdata\ne = getattr(torch.ops.mkldnn, '_is_mkldnn_bf16_supported')\n"
            "ok = (torch.cuda.is_available(), dist.get_rank(), self._x, os._exit, parser._actions, t.__class__)\n")
    hits = [h.split(":")[0] for h in private_torch_uses(ast.parse(code))]
    assert hits == [f"line {n}" for n in (10, 11, 3, 4, 5, 7, 8, 9)]      # sorted as text; line 12 is clean


def test_private_torch_apis_live_only_in_the_compat_module():
    """A private torch name may move or vanish in any release: the kit calls each through labkit.core.torch_compat."""
    outside = [f"{name} {hit}" for name, path in modules() if name != TORCH_COMPAT
               for hit in private_torch_uses(ast.parse(path.read_text()))]
    assert not outside, f"private torch APIs outside {TORCH_COMPAT} (wrap them there): {outside}"
    compat = ast.parse((PACKAGE / "core" / "torch_compat.py").read_text())
    assert private_torch_uses(compat), "the compat module wraps nothing: update TORCH_COMPAT"


def bubble_formulas(tree: ast.Module) -> list[int]:
    """Lines that compute GPipe's bubble (p-1)/(m+p-1) in code, whatever the names: a ``(x - 1) / (...)`` whose
    denominator holds x and a ``- 1`` (docstrings and comments may still quote it)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and isinstance(node.left, ast.BinOp) \
                and isinstance(node.left.op, ast.Sub) and isinstance(node.left.right, ast.Constant) \
                and node.left.right.value == 1:
            x, below = ast.unparse(node.left.left), ast.unparse(node.right)
            if x in below and "- 1" in below:
                lines.append(node.lineno)
    return lines


def test_the_bubble_finder_sees_any_spelling_of_the_formula_but_not_its_rivals():
    code = ("a = (p - 1) / (m + p - 1)\nb = (stages - 1) / (micro_batches + stages - 1)\n"
            "c = (p - 1) / m\nd = (stages - 1) / (micro_batches + stages)\n")
    assert bubble_formulas(ast.parse(code)) == [1, 2]


def test_the_bubble_formula_is_written_once():
    """Issue 50: the GPipe bubble was written four ways; now schedule_sim.predicted_bubble, and callers call it."""
    homes = {name for name, path in modules() if bubble_formulas(ast.parse(path.read_text()))}
    assert homes == {"parallel.pipeline.schedule_sim"}, f"the bubble formula is computed in {sorted(homes)}"
