"""The README agrees with the tree: the notebook count, one table row per notebook, commands that name the venv."""
from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")
NOTEBOOKS = sorted(p.stem for p in (REPO / "notebooks").glob("*.ipynb"))


def test_every_notebook_count_in_the_readme_is_the_real_one():
    counts = [int(n) for n in re.findall(r"\bin (\d+) notebooks\b", README)]
    assert counts and set(counts) == {len(NOTEBOOKS)}


def test_the_notebook_table_has_one_row_per_notebook_with_memory_in_mib():
    rows = re.findall(r"^\| \w+ \| `(\w+)` \|.*\| ([\d,]+) MiB \(([\d,]+) MiB, ([\d,]+) MiB\) \|$", README, flags=re.M)
    assert [name for name, *_ in rows] == NOTEBOOKS
    assert "| time | peak memory: CPU wheel (PSS, anonymous) |" in README  # notebook_budget.py divides by 1024**2
    figures = [[int(x.replace(",", "")) for x in row[1:]] for row in rows]
    assert all(cpu_wheel <= pss and anon <= pss for cpu_wheel, pss, anon in figures)   # the columns are not swapped


def test_readme_commands_name_the_venv_programs():
    """A bare `python`/`pip`/... is the system's, without the lab's packages (python3 only creates the venv)."""
    bare = re.compile(r"(?:^|[;&|(]\s*)(python|pip|mpiexec|torchrun|tensorboard|jupyter|labkit) ")  # in command position
    blocks = re.findall(r"```bash\n(.*?)```", README, flags=re.S)
    inline = re.findall(r"`([^`\n]+)`", README)
    commands = [line for block in blocks for line in block.splitlines()] + inline
    offenders = [c for c in commands if bare.search(c.split("#")[0])]
    assert offenders == []
