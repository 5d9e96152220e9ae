"""labkit.core.prose: what a learner reads as prose, split into sentences the way a reader would."""
from __future__ import annotations

import json

from labkit.core.prose import mean_sentence_words, reading_minutes, sentences


def test_code_tables_headings_and_abbreviations_do_not_split_or_count():
    cell = ("# A heading that is not prose\n"
            "Ranks send 2.5 MiB each, e.g. over gloo. Then `dist.all_reduce(t, op=SUM)` sums them.\n"
            "| a table | row |\n```python\nx = 1. + 2.\n```\nNarayanan et al. measured it! Done here.")
    assert sentences(cell) == ["Ranks send 25 MiB each, e.g over gloo.", "Then CODE sums them.",
                               "Narayanan et al measured it!"]           # 'Done here.' is a fragment: left out


def test_paragraphs_and_list_items_end_their_sentences():
    cell = "Three items follow\n- the first item here\n- the second one here\n\nA new paragraph starts"
    assert sentences(cell) == ["Three items follow", "the first item here", "the second one here",
                               "A new paragraph starts"]


def test_mean_length_and_reading_time_of_a_notebook(tmp_path):
    nb = {"cells": [{"cell_type": "markdown", "source": ["One two three four. Five six seven eight nine ten."]},
                    {"cell_type": "code", "source": ["print('not prose at all, however long the line is')"]}],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "n.ipynb"
    path.write_text(json.dumps(nb))
    assert mean_sentence_words(path) == 5.0
    assert reading_minutes(path) == 10 / 200
