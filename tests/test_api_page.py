"""docs/api.md lists every labkit name the notebooks use, one line each, and is current."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("api_page", REPO / "scripts" / "api_page.py")
api_page = importlib.util.module_from_spec(spec)
spec.loader.exec_module(api_page)


def test_the_page_is_current_and_every_name_is_found():
    assert api_page.main(["--check"]) == 0, "run: python scripts/api_page.py"
    text = api_page.PAGE.read_text()
    assert "(not found)" not in text, "a notebook uses a labkit name the page cannot find in labkit"


def test_both_ways_a_notebook_names_labkit_are_read(tmp_path):
    cell = {"cell_type": "code", "source": ["%matplotlib inline\n", "import labkit\n",
                                            "from labkit.core.env import pick\n", "labkit.core.clock.now_s()\n"]}
    nb = tmp_path / "99_x.ipynb"
    nb.write_text(json.dumps({"cells": [cell]}))
    assert api_page.notebook_names([nb]) == {("labkit.core.env", "pick"): {"99"}, ("labkit.core.clock", "now_s"): {"99"}}
    assert api_page.first_doc_line("labkit.core.env", "pick")
