"""The map in notebook 00 is read from the notebooks folder, so every notebook is on it (03b and 12 included)."""
import json

import pytest

from labkit.core.notebook_map import map_markdown, notebook_map, notebooks_folder


def test_every_shipped_notebook_is_on_the_map_in_order():
    rows = notebook_map()
    files = sorted(p.name for p in notebooks_folder().glob("[0-9]*.ipynb"))
    assert [r.file for r in rows] == files and {"03b", "12"} <= {r.number for r in rows}
    assert all(r.title and "·" not in r.title for r in rows)
    assert {r.home for r in rows if r.number == "03b"} == {"profile"}


def test_a_new_notebook_appears_without_editing_anything(tmp_path):
    for name, title in (("00_a.ipynb", "# 00 · Start"), ("09b_new.ipynb", "# 09b · A new lesson")):
        cells = [{"cell_type": "markdown", "source": [title + "\n", "text"]},
                 {"cell_type": "code", "source": ["from labkit.parallel.debug import exercises as ex"]}]
        (tmp_path / name).write_text(json.dumps({"cells": cells}))
    text = map_markdown(notebook_map(tmp_path))
    assert "| 09b | [A new lesson](09b_new.ipynb) | `parallel.debug` |" in text and "| 00 | [Start](00_a.ipynb)" in text


def test_the_default_folder_is_the_repositorys_and_an_empty_one_says_so(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert notebooks_folder().name == "notebooks" and notebook_map()
    with pytest.raises(FileNotFoundError):
        notebook_map(tmp_path / "nothing")
