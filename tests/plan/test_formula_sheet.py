"""The formula sheet: every row is computed by the kit's own function, and docs/formulas.md is what it computes now."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from labkit.comm.collectives import allreduce_cost
from labkit.parallel.pipeline.schedule_sim import predicted_bubble
from labkit.plan import formula_sheet as sheet
from labkit.sharding.memory import zero_paper_bytes

REPO = Path(__file__).resolve().parents[2]


def test_docs_formulas_md_is_what_the_kit_computes_now():
    run = subprocess.run([sys.executable, str(REPO / "scripts" / "formula_sheet.py"), "--check"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr


def test_each_row_names_the_function_the_notebooks_call_and_a_source():
    where = {f.topic: f.where for f in sheet.FORMULAS}
    assert where["pipeline bubble"] == "labkit.parallel.pipeline.schedule_sim.predicted_bubble"
    assert where["ring all-reduce time"] == "labkit.comm.collectives.allreduce_cost"
    assert all(f.source and f.notebook for f in sheet.FORMULAS) and len(where) == len(sheet.FORMULAS)


def test_worked_values_are_the_functions_values_worked_by_hand():
    bubble = next(f for f in sheet.FORMULAS if f.topic == "pipeline bubble").worked()
    assert f"{7 / 39:.1%}" in bubble and predicted_bubble(8, 32) == 7 / 39
    zero = next(f for f in sheet.FORMULAS if f.topic == "ZeRO model state per rank").worked()
    psi = sheet.LLAMA_70B.num_params
    assert zero_paper_bytes(psi, "ddp", 64) == 16 * psi                   # 2 + 2 + 12 bytes per parameter
    assert f"{16 * psi / 2**30:.0f} GiB" in zero and f"{16 * psi / 64 / 2**30:.1f} GiB" in zero
    ring = next(f for f in sheet.FORMULAS if f.topic == "ring all-reduce time").worked()
    n = 2 * sheet.LLAMA_8B.num_params
    by_hand = 2 * 7 * (sheet.NODE.intra.alpha_s + n / 8 * sheet.NODE.intra.beta_s_per_byte)
    assert abs(allreduce_cost("ring", 8, n, sheet.NODE.intra.alpha_s, sheet.NODE.intra.beta_s_per_byte) - by_hand) < 1e-9
    assert f"{by_hand:.3f} s" in ring


def test_the_worked_problem_answers_fit_and_gather_time():
    text = sheet.sheet_markdown()
    assert "## Worked problem" in text and "fits in 80 GB" in text and "ms, twice a step" in text


def test_each_notebook_gets_the_rows_it_teaches_worked_at_real_scale():
    table = sheet.real_scale_markdown("13").splitlines()
    taught = [f for f in sheet.FORMULAS if "13" in f.notebook.split(", ")]
    assert len(table) == 2 + len(taught) == 4 and "tensor-parallel traffic" in table[2] and "GiB" in table[2]
    assert "pipeline bubble" in sheet.real_scale_markdown("05b")
    with pytest.raises(ValueError, match="no row taught in notebook '09'"):
        sheet.real_scale_markdown("09")


def test_the_worked_problem_gives_its_givens_and_hides_its_answer_until_revealed(capsys):
    sheet.WORKED_ZERO3.ask()
    asked = capsys.readouterr().out
    assert "70.6 B parameters" in asked and "80 layers" in asked and "GB/s" in asked
    assert "fits" not in asked and " ms" not in asked                      # the answer is not in the question
    answer = sheet.WORKED_ZERO3.reveal()
    assert "fits in 80 GB" in answer and answer in capsys.readouterr().out


def test_every_notebook_a_row_is_taught_in_works_it_at_real_scale_on_the_page():
    taught = {n for f in sheet.FORMULAS for n in f.notebook.split(", ")}
    for number in sorted(taught):
        path = next((REPO / "notebooks").glob(f"{number}_*.ipynb"))
        code = "".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code")
        assert f'real_scale_markdown("{number}")' in code, f"{path.name} does not work its rows at real scale"
    eleven = next((REPO / "notebooks").glob("11_*.ipynb")).read_text()
    assert "WORKED_ZERO3.ask()" in eleven and "# WORKED_ZERO3.reveal()" in eleven     # asked, answer on request
