"""Write docs/formulas.md: the course's one-page formula sheet, each worked value computed by the kit's own function.

The rows live in :mod:`labkit.plan.formula_sheet`; this script only writes them. ``--check`` exits 1 when
docs/formulas.md is not what the kit computes now (the test runs it).

    python scripts/formula_sheet.py            # write docs/formulas.md
    python scripts/formula_sheet.py --check    # is docs/formulas.md current?
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "formulas.md"
sys.path.insert(0, str(REPO))
from labkit.plan.formula_sheet import sheet_markdown  # noqa: E402  (the checkout's labkit, without installing it)


def main(argv: list[str] | None = None) -> int:
    """Write the page, or with --check say whether it is current -> exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/formulas.md is out of date")
    args = parser.parse_args(argv)
    text = sheet_markdown()
    if args.check:
        current = PAGE.exists() and PAGE.read_text() == text
        print("docs/formulas.md is current" if current else
              "docs/formulas.md is out of date: run python scripts/formula_sheet.py")
        return 0 if current else 1
    PAGE.write_text(text)
    print(f"wrote {PAGE.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
