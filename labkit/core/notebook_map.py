"""The notebooks folder, read: every numbered notebook there gets a row (its number, file, title and ``labkit``
home), so a notebook added later is seen without anyone editing a list. :mod:`labkit.core.course` joins these rows
with the course's data (part, prerequisites, needs, skill) and prints the map of notebook 00. Torch-free."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

_TITLE = re.compile(r"^#\s+(\w+)\s+·\s+(.+)$", re.M)
_HOME = re.compile(r"from labkit\.([\w.]+) import exercises")


@dataclass(frozen=True)
class MapRow:
    """One notebook: its number (``03b``), file name, title and the labkit folder its exercises come from."""

    number: str
    file: str
    title: str
    home: str


def notebooks_folder(start: str | Path | None = None) -> Path:
    """``start`` when given; else the working directory when it holds notebooks (a kernel runs in notebooks/),
    else the repository's notebooks folder."""
    if start is not None:
        return Path(start)
    if any(Path.cwd().glob("[0-9]*.ipynb")):
        return Path.cwd()
    return Path(__file__).resolve().parents[2] / "notebooks"


def _row(path: Path) -> MapRow:
    nb = json.loads(path.read_text(encoding="utf-8"))
    cells = ["".join(c.get("source", "")) for c in nb.get("cells", [])]
    title = next((m for m in (_TITLE.search(c) for c in cells if c.lstrip().startswith("#")) if m), None)
    home = next((m.group(1) for m in (_HOME.search(c) for c in cells) if m), "")
    number = path.stem.split("_")[0]
    return MapRow(number, path.name, title.group(2).strip() if title else path.stem, home)


def notebook_map(folder: str | Path | None = None) -> list[MapRow]:
    """A row per numbered notebook in the folder, in file-name order (00, 01, 02, 03, 03b, ...)."""
    paths = sorted(notebooks_folder(folder).glob("[0-9]*.ipynb"))
    if not paths:
        raise FileNotFoundError(f"no numbered notebooks in {notebooks_folder(folder)}")
    return [_row(p) for p in paths]

