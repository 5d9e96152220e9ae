"""A notebook's prose, measured: its sentences, their mean length and its reading time (issue 52).

Only what a learner reads as prose counts: markdown cells without their code blocks, tables and headings; inline
code and maths count as one word each; abbreviations ('e.g.', 'et al.') and decimals do not end a sentence. A
sentence ends at '.', '!' or '?' before a capital letter, a digit or an opening bracket, and at the end of a
paragraph or a list item. Torch-free.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

WORDS_PER_MINUTE = 200            # a technical text read with care (the usual 200-250 wpm, its low end)
_ABBREVIATIONS = re.compile(r"\b(e\.g|i\.e|et al|vs|Fig|Sec|cf|etc|Eq|approx|resp)\.")
_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z*(\[\d_`])")


def prose_blocks(markdown: str) -> list[str]:
    """The prose of one markdown cell, one string per paragraph or list item (each ends its sentence): no fenced
    code, tables or headings; inline code, maths and links flattened."""
    blocks: list[list[str]] = [[]]
    fenced = False
    for line in markdown.splitlines():
        stripped = line.strip()
        if stripped.startswith("```"):
            fenced = not fenced
            continue
        if fenced or stripped.startswith(("|", "#", "<")):
            continue
        if not stripped or re.match(r"([-*+]|\d+[.)])\s", stripped):
            blocks.append([])                               # a blank line or a list item starts a new block
            stripped = re.sub(r"^([-*+]|\d+[.)])\s+", "", stripped)
        blocks[-1].append(stripped)
    return [_flatten(" ".join(b).strip()) for b in blocks if " ".join(b).strip()]


def _flatten(text: str) -> str:
    text = re.sub(r"`[^`]*`", "CODE", text)
    text = re.sub(r"\$[^$]*\$", "MATH", text)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = _ABBREVIATIONS.sub(lambda m: m.group(1), text)
    return re.sub(r"(\d)\.(\d)", r"\1\2", text)


def sentences(markdown: str) -> list[str]:
    """The sentences of one markdown cell (fragments under three words, such as list labels, left out)."""
    return [s for block in prose_blocks(markdown) for s in _END.split(block) if len(s.split()) >= 3]


def notebook_sentences(path: str | Path) -> list[str]:
    """Every prose sentence of a notebook's markdown cells, in order."""
    nb = json.loads(Path(path).read_text(encoding="utf-8"))
    return [s for c in nb.get("cells", []) if c.get("cell_type") == "markdown"
            for s in sentences("".join(c.get("source", "")))]


def mean_sentence_words(path: str | Path) -> float:
    """Mean words per sentence of a notebook's prose (0.0 for a notebook without any)."""
    found = notebook_sentences(path)
    return sum(len(s.split()) for s in found) / len(found) if found else 0.0


def reading_minutes(path: str | Path) -> float:
    """Minutes to read a notebook's prose at :data:`WORDS_PER_MINUTE`."""
    return sum(len(s.split()) for s in notebook_sentences(path)) / WORDS_PER_MINUTE
