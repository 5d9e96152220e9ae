"""The public face: the subpackages are the API. ``import labkit`` loads no framework and holds no registry of
names; every name a notebook, the README or a docstring uses is imported from its one home."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import labkit

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


def test_import_is_lazy():
    code = "import sys, labkit; print('torch' in sys.modules or 'tensorflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO).stdout
    assert out.strip() == "False"


def test_the_api_is_the_subpackages_and_nothing_else():
    """No registry the import graph cannot see: only the subpackages, the version and the process set-up."""
    folders = {p.name for p in (REPO / "labkit").iterdir() if (p / "__init__.py").exists()}
    assert set(labkit.__all__) == folders
    assert not hasattr(labkit, "__getattr__")
    public = {n for n in vars(labkit) if not n.startswith("_")} - folders - {"annotations"}
    assert public == set(), f"top-level names outside the subpackages: {sorted(public)}"
    with pytest.raises(AttributeError):
        labkit.pick  # noqa: B018 - it lives in labkit.core.env


def _code_cells() -> list[tuple[str, str]]:
    return [(nb.name, "".join(c["source"])) for nb in NOTEBOOKS
            for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == "code"]


def test_notebooks_use_names_from_their_homes_not_from_the_top_level():
    subpackages = "|".join(labkit.__all__)
    top_level = re.compile(rf"\blabkit\.(?!(?:{subpackages}|__version__)\b)(\w+)|^from labkit import", re.M)
    found = [(name, m.group(0)) for name, src in _code_cells() for m in top_level.finditer(src)]
    assert not found, f"import these from their modules (labkit.core.env.pick, ...): {found}"


def test_every_labkit_import_in_every_notebook_resolves():
    """Each notebook's `from labkit... import ...` lines, run in one fresh process: a moved name fails here."""
    statements = set()
    for _, src in _code_cells():
        for stmt in re.findall(r"^(?:from labkit[\w.]* import (?:\([^)]*\)|[^\n]*)|import labkit[\w.]*(?: as \w+)?)",
                               src, re.M):
            statements.add(stmt)
    code = "\n".join(sorted(statements))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.tensorflow
def test_tensorflow_then_torch_training_does_not_crash():
    """The segfault this guards against kills the process, so run it in a child."""
    code = ("import labkit, tensorflow, torch\n"
            "m = torch.nn.Linear(2, 2); o = torch.optim.SGD(m.parameters(), 0.1)\n"
            "m(torch.ones(1, 2)).sum().backward(); o.step(); print('trained')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0 and "trained" in proc.stdout, proc.stderr[-500:]


def _notebook_modules() -> dict[str, set[str]]:
    """Package (``parallel``, ``parallel.tensor``) -> its modules or sub-packages the notebooks import (read from their
    code cells, as docs/api.md is)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("api_page", REPO / "scripts" / "api_page.py")
    api_page = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(api_page)
    out: dict[str, set[str]] = {}
    for module, name in api_page.notebook_names(NOTEBOOKS):
        dotted = module.split(".")[1:] + [name]
        for i in range(1, len(dotted)):
            folder, child = REPO / "labkit" / Path(*dotted[:i]), dotted[i]
            if (folder / "__init__.py").exists() and ((folder / f"{child}.py").exists()
                                                     or (folder / child / "__init__.py").exists()):
                out.setdefault(".".join(dotted[:i]), set()).add(child)
    return out


def _packages() -> list[str]:
    """The subpackages, and the folders inside them that are packages of their own (``parallel.tensor``)."""
    found = []
    for package in labkit.__all__:
        found.append(package)
        found += [f"{package}.{p.name}" for p in sorted((REPO / "labkit" / package).iterdir())
                  if (p / "__init__.py").exists()]
    return found


@pytest.mark.parametrize("package", _packages())
def test_each_subpackage_lists_what_a_learner_uses_with_a_first_line_each(package):
    """Its __all__ names modules that exist, every module a notebook imports among them, each with a docstring."""
    import ast
    import importlib

    sub = importlib.import_module(f"labkit.{package}")
    listed = set(getattr(sub, "__all__", ()))
    folder = REPO / "labkit" / Path(*package.split("."))

    def source(m: str) -> Path:
        return folder / f"{m}.py" if (folder / f"{m}.py").exists() else folder / m / "__init__.py"

    assert listed and all(source(m).exists() for m in listed), f"labkit.{package}.__all__: {sorted(listed)}"
    missing = _notebook_modules().get(package, set()) - listed
    assert not missing, f"notebooks import labkit.{package}.{sorted(missing)}: add them to its __all__"
    for m in listed:
        doc = ast.get_docstring(ast.parse(source(m).read_text()))
        assert doc and doc.strip().splitlines()[0], f"{source(m).relative_to(REPO)} has no docstring first line"
    assert sub.__doc__ and sub.__doc__.strip().splitlines()[0]
