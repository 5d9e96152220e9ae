"""Progress bars for long loops: a widget in Jupyter, a live bar in a terminal, silence in logs.

``tqdm`` writes a fresh line per refresh when stderr is not a terminal (CI logs, ``| tee``), which buries the
result under hundreds of repeated lines; inside a Jupyter kernel stderr is not a terminal either, yet the
widget bar is what the learner wants. One rule here, so the loop, the ladder and the CLI agree.
"""
from __future__ import annotations

import sys
from typing import Any, Iterable

from tqdm.auto import tqdm


def progress_enabled(requested: bool = True) -> bool:
    """Show a bar only if asked and someone can watch it: a Jupyter kernel or an interactive terminal."""
    if not requested:
        return False
    if "ipykernel" in sys.modules:
        return True
    return bool(getattr(sys.stderr, "isatty", lambda: False)())


def progress_bar(iterable: Iterable | None = None, *, total: int | None = None, desc: str = "", unit: str = "it",
                 enabled: bool = True, **kwargs: Any) -> tqdm:
    """A ``tqdm.auto`` bar (``leave=False``) that is disabled where nobody can watch it."""
    kwargs.setdefault("leave", False)
    return tqdm(iterable, total=total, desc=desc, unit=unit, disable=not progress_enabled(enabled),
                file=sys.stderr, **kwargs)
