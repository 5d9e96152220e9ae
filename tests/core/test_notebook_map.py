"""The notebooks folder is read, not listed: every notebook is a row (03b and 12 included), a new one appears by itself."""
import json

import pytest

from labkit.core.notebook_map import MapRow, notebook_map, notebooks_folder


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
    assert notebook_map(tmp_path) == [MapRow("00", "00_a.ipynb", "Start", "parallel.debug"),
                                      MapRow("09b", "09b_new.ipynb", "A new lesson", "parallel.debug")]


def test_the_default_folder_is_the_repositorys_and_an_empty_one_says_so(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert notebooks_folder().name == "notebooks" and notebook_map()
    with pytest.raises(FileNotFoundError):
        notebook_map(tmp_path / "nothing")
