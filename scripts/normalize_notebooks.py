"""Give every notebook the metadata Jupyter itself writes, so opening one does not mark it modified.

JupyterLab fills in ``language_info`` (and cell ids) when it opens a notebook; a committed notebook without
them shows as changed the moment a learner opens it. This writes, for each notebook: the ``python3``
kernelspec, the ``language_info`` block ipykernel writes for the Python running this script, nbformat 4.5
with every existing cell id kept (a missing id gets a stable one derived from the notebook and position),
and no outputs (``outputs: []``, ``execution_count: null``). The JSON layout is Jupyter's (indent 1).

    .venv/bin/python scripts/normalize_notebooks.py notebooks/*.ipynb           # rewrite in place
    .venv/bin/python scripts/normalize_notebooks.py --check notebooks/*.ipynb   # exit 1, listing those to fix
"""
from __future__ import annotations

import argparse
import copy
import hashlib
import json
import sys
from pathlib import Path

KERNELSPEC = {"display_name": "Python 3", "language": "python", "name": "python3"}


def language_info() -> dict:
    """The block ipykernel reports for this Python (ipykernel/ipkernel.py ``language_info``)."""
    return {"codemirror_mode": {"name": "ipython", "version": sys.version_info[0]}, "file_extension": ".py",
            "mimetype": "text/x-python", "name": "python", "nbconvert_exporter": "python",
            "pygments_lexer": "ipython3", "version": sys.version.split()[0]}


def stable_cell_id(notebook_name: str, index: int) -> str:
    """An 8-hex-digit id that depends only on the notebook's file name and the cell's position."""
    return hashlib.sha1(f"{notebook_name}:{index}".encode()).hexdigest()[:8]


def normalized(nb: dict, notebook_name: str) -> dict:
    """A copy of the notebook dict in the committed form (the input is not changed)."""
    out = copy.deepcopy(nb)
    out["metadata"] = {**out.get("metadata", {}), "kernelspec": dict(KERNELSPEC), "language_info": language_info()}
    out["nbformat"], out["nbformat_minor"] = 4, max(5, int(out.get("nbformat_minor", 5)))
    seen: set[str] = set()
    for index, cell in enumerate(out["cells"]):
        if not cell.get("id") or cell["id"] in seen:
            cell["id"] = stable_cell_id(notebook_name, index)
        seen.add(cell["id"])
        if isinstance(cell.get("source"), str):
            cell["source"] = cell["source"].splitlines(keepends=True)
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
        else:
            cell.pop("outputs", None)
            cell.pop("execution_count", None)
    return out


def dumps(nb: dict) -> str:
    """JSON the way Jupyter writes a notebook: indent 1, sorted keys, unicode kept, newline at the end."""
    return json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def process(path: Path, check: bool) -> bool:
    """Normalize one file (or only compare, with ``check``); True when it was already normalized."""
    text = path.read_text(encoding="utf-8")
    want = dumps(normalized(json.loads(text), path.name))
    if text == want:
        return True
    if not check:
        path.write_text(want, encoding="utf-8")
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebooks", nargs="+", type=Path, help="the .ipynb files")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if any file needs normalizing")
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.notebooks if not p.is_file()]
    if missing:
        parser.error(f"no such notebook: {', '.join(missing)}")
    changed = [p for p in args.notebooks if not process(p, args.check)]
    for path in changed:
        print(f"{'needs normalizing' if args.check else 'normalized'}: {path}")
    if args.check and changed:
        print(f"run: .venv/bin/python scripts/normalize_notebooks.py {' '.join(map(str, changed))}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
