"""Issue 52's reading rules, kept: every notebook's prose averages at most 22 words a sentence (labkit.core.prose
counts them as a reader would). The notebooks not edited yet are listed; the list may only shrink: a listed notebook
that already meets the rule fails here until it is taken off."""
from __future__ import annotations

from pathlib import Path

import pytest

from labkit.core.prose import mean_sentence_words

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
MAX_MEAN_WORDS = 22.0          # issue 52: "sentences of about 20 words on average", at most 22
NOT_EDITED_YET: set[str] = set()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_sentences_average_at_most_22_words(path):
    mean = mean_sentence_words(path)
    if path.stem in NOT_EDITED_YET:
        assert mean > MAX_MEAN_WORDS, f"{path.stem} averages {mean:.1f} words: take it off NOT_EDITED_YET"
    else:
        assert mean <= MAX_MEAN_WORDS, f"{path.stem} averages {mean:.1f} words a sentence (at most {MAX_MEAN_WORDS:g})"


def test_the_list_names_only_notebooks_that_exist():
    assert NOT_EDITED_YET <= {p.stem for p in NOTEBOOKS}
