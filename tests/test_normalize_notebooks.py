"""scripts/normalize_notebooks.py: the committed form equals what Jupyter writes, and --check catches drift."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("normalize_notebooks", REPO / "scripts" / "normalize_notebooks.py")
normalize = importlib.util.module_from_spec(spec)
spec.loader.exec_module(normalize)


def stripped_notebook(tmp_path: Path) -> Path:
    """A notebook as some helpers commit it: no language_info, an output, a missing and a duplicate cell id."""
    nb = {"cells": [{"cell_type": "markdown", "id": "aaaa1111", "metadata": {}, "source": "# Title\ntext"},
                    {"cell_type": "code", "metadata": {}, "execution_count": 3, "source": ["x = 1\n", "x"],
                     "outputs": [{"output_type": "execute_result", "data": {"text/plain": ["1"]}, "metadata": {},
                                  "execution_count": 3}]},
                    {"cell_type": "code", "id": "aaaa1111", "metadata": {}, "execution_count": None,
                     "source": [], "outputs": []}],
          "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                       "language_info": {"name": "python"}},
          "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "demo.ipynb"
    path.write_text(json.dumps(nb, indent=2))
    return path


def test_check_reports_then_normalize_fixes(tmp_path, capsys):
    path = stripped_notebook(tmp_path)
    assert normalize.main(["--check", str(path)]) == 1
    assert f"needs normalizing: {path}" in capsys.readouterr().out
    assert normalize.main([str(path)]) == 0
    assert normalize.main(["--check", str(path)]) == 0
    nb = json.loads(path.read_text())
    assert nb["metadata"]["language_info"]["version"] == sys.version.split()[0]
    assert nb["metadata"]["language_info"]["pygments_lexer"] == "ipython3"
    assert [c["id"] for c in nb["cells"]][0] == "aaaa1111"              # existing id kept
    assert len({c["id"] for c in nb["cells"]}) == 3                     # missing and duplicate ids filled in
    assert nb["cells"][1]["outputs"] == [] and nb["cells"][1]["execution_count"] is None
    assert nb["cells"][0]["source"] == ["# Title\n", "text"]


def test_output_is_byte_for_byte_what_jupyter_writes(tmp_path):
    path = stripped_notebook(tmp_path)
    normalize.main([str(path)])
    text = path.read_text()
    nb = nbformat.reads(text, as_version=4)
    nbformat.validate(nb)
    assert nbformat.writes(nb) + "\n" == text      # nbformat.write adds the final newline
    (tmp_path / "again").mkdir()
    again = stripped_notebook(tmp_path / "again")  # same name, same positions -> same generated ids
    normalize.main([str(again)])
    assert json.loads(again.read_text())["cells"][1]["id"] == json.loads(text)["cells"][1]["id"]


def test_missing_file_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        normalize.main(["--check", str(tmp_path / "nope.ipynb")])
    assert exit_.value.code == 2 and "no such notebook" in capsys.readouterr().err


NOTEBOOKS = sorted(p.name for p in (REPO / "notebooks").glob("*.ipynb"))


def test_the_notebooks_folder_is_found():
    assert len(NOTEBOOKS) >= 13  # guards the parametrisation below against an empty glob


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_every_notebook_is_normalized(name):
    """Committed as Jupyter writes it, so opening it does not mark it modified; fix: scripts/normalize_notebooks.py."""
    assert normalize.main(["--check", str(REPO / "notebooks" / name)]) == 0
