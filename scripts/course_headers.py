"""Write each notebook's header time line from the course map: the measured fast-mode run time (the README's budget
table) and the reading minutes counted from the prose, so no header types a figure that can go stale.

The line is ``**Time:** 31 s to run in fast mode, about 7 min to read.`` in the first markdown cell: an existing
``**Time:** ...`` sentence is replaced, else the line is added as the cell's last paragraph. ``--check`` exits 1
when a header is not what the map says now (a test runs it).

    python scripts/course_headers.py            # rewrite the headers
    python scripts/course_headers.py --check    # are they current?
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from labkit.core.course import course_rows, time_line  # noqa: E402  (the checkout's labkit, without installing it)

TIME = re.compile(r"\*\*Time:\*\*.*?(?=\s\*\*[A-Z][^*]*:\*\*|\n|$)")


def with_time_line(header: str, line: str) -> str:
    """The header with its time sentence replaced by ``line`` (or ``line`` added as its last paragraph)."""
    if TIME.search(header):
        return TIME.sub(lambda _: line, header, count=1)
    return header.rstrip("\n") + "\n\n" + line


def _lines(text: str) -> list[str]:
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def stale(folder: Path, write: bool) -> list[str]:
    """The notebooks whose header differs from the map (rewritten when ``write``); twice over, since the time line
    is prose too and its words count towards the reading minutes."""
    changed: list[str] = []
    for _ in range(3 if write else 1):
        changed_now = []
        for row in course_rows(folder):
            path = folder / row.file
            nb = json.loads(path.read_text(encoding="utf-8"))
            first = next(c for c in nb["cells"] if c["cell_type"] == "markdown")
            old = "".join(first["source"])
            new = with_time_line(old, time_line(row))
            if new != old:
                changed_now.append(row.file)
                if write:
                    first["source"] = _lines(new)
                    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        changed = changed or changed_now
        if not changed_now:
            break
    return changed


def main(argv: list[str] | None = None) -> int:
    """Rewrite the headers, or with --check say whether they are current -> exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a notebook's time line is out of date")
    parser.add_argument("--notebooks", type=Path, default=REPO / "notebooks", help="the notebooks folder")
    args = parser.parse_args(argv)
    changed = stale(args.notebooks, write=not args.check)
    if args.check:
        print("every header's time line is current" if not changed else
              f"out of date: {', '.join(changed)}: run python scripts/course_headers.py")
        return 1 if changed else 0
    print(f"rewrote {len(changed)} headers" + (f": {', '.join(changed)}" if changed else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
