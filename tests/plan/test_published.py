"""The planner against Korthikanti et al. 2022: their closed forms recomputed independently, their Section 5 savings."""
import pytest

from labkit.plan.published import SHAPES, closed_form_rows, eq5_first_stage_bytes, selective_saving_rows
from labkit.plan.specs import DeviceSpec, Layout

H100 = DeviceSpec.from_table("NVIDIA H100 SXM", 80)


def test_selective_recomputation_saves_what_section_5_reports():
    for row in selective_saving_rows():
        assert abs(row["difference (points)"]) < 1.0, row


@pytest.mark.parametrize("layout", [Layout(tp=8), Layout(dp=2, tp=8, pp=4, zero=1), Layout(tp=4, pp=2)])
def test_the_planner_s_term_sum_equals_eq5_and_eq6(layout):
    rows = closed_form_rows(H100, {"x": layout})
    for row in rows:
        assert row["planner activations GiB"] == pytest.approx(row["Eq. 5/6 GiB"], rel=1e-9), row


def test_eq5_by_hand():
    m = SHAPES["7B-class"]
    s, h, a, layers = m.seq_len, m.hidden, m.heads, m.layers
    assert eq5_first_stage_bytes(m, Layout(tp=8)) == s * h * layers / 8 * (34 + 5 * a * s / h)
