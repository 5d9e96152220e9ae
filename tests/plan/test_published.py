"""The planner against Korthikanti et al. 2022: their closed forms recomputed independently, their Section 5 savings."""
import pytest

from labkit.plan.published import SHAPES, closed_form_rows, eq5_first_stage_bytes, selective_saving_rows
from labkit.plan.specs import DeviceSpec, Layout

H100 = DeviceSpec.from_table("NVIDIA H100 SXM", 80)


def test_selective_recomputation_saves_what_section_5_reports():
    for row in selective_saving_rows():
        assert abs(row["difference (points)"]) < 1.0, row


def test_the_softmax_only_rival_misses_section_5_by_far_and_would_fail_the_notebooks_one_point_band():
    for row in selective_saving_rows():
        assert abs(row["rival: softmax output only"] - row["published saving"]) > 0.3, row   # 28% and 26% vs 70%, 65%
    gpt3 = selective_saving_rows()[0]          # by hand: as/h = 96 * 2048 / 12288 = 16; 2 * 16 / (34 + 80) = 0.281
    assert gpt3["rival: softmax output only"] == pytest.approx(32 / 114)


@pytest.mark.parametrize("layout", [Layout(tp=8), Layout(dp=2, tp=8, pp=4, zero=1), Layout(tp=4, pp=2)])
def test_the_planner_s_term_sum_equals_eq5_and_eq6(layout):
    rows = closed_form_rows(H100, {"x": layout})
    for row in rows:
        assert row["planner activations GiB"] == pytest.approx(row["Eq. 5/6 GiB"], rel=1e-9), row


def test_eq5_by_hand():
    m = SHAPES["7B-class"]
    s, h, a, layers = m.seq_len, m.hidden, m.heads, m.layers
    assert eq5_first_stage_bytes(m, Layout(tp=8)) == s * h * layers / 8 * (34 + 5 * a * s / h)


# ---- today's shapes against published parameter counts; DeepSeek-V3's published MoE layout (issues 54, 55) ------
from labkit.plan.published import (PUBLISHED_COUNTS, TODAYS_SHAPES, deepseek_v3_setup, parameter_rows,  # noqa: E402
                                   published_run_rank)


@pytest.mark.parametrize("row", parameter_rows(), ids=lambda r: r["model"])
def test_parameter_counts_match_the_published_totals_to_their_printed_digits(row):
    assert abs(row["total off by"]) <= row["total rounding"], row
    if row["published active"]:
        assert abs(row["planner active"] - row["published active"]) <= row["active rounding"], row


def test_llama_3_counts_are_exact_and_mixtral_active_is_top_2_not_all_8():
    rows = {r["model"]: r for r in parameter_rows()}
    assert rows["Llama 3 8B"]["planner total"] == 8_030_261_248
    assert rows["Llama 3 70B"]["planner total"] == 70_553_706_496
    mixtral = TODAYS_SHAPES["Mixtral 8x7B"]
    assert mixtral.active_params < 0.3 * mixtral.num_params                 # rival: active = total (46.7B)


def test_deepseek_v3_needs_its_mla_correction_and_says_so():
    """The stand-in (MLA as plain 4h^2 attention) is off by more than the published rounding; MLA's own count closes
    it: the rest (experts, shared experts, dense layers, embeddings) is what the planner describes exactly."""
    row = next(r for r in parameter_rows() if r["model"] == "DeepSeek-V3")
    assert abs(row["planner total"] - row["published total"]) > row["total rounding"]
    assert abs(row["total off by"]) <= row["total rounding"]
    assert len(PUBLISHED_COUNTS) == len(parameter_rows())


@pytest.fixture(scope="module")
def deepseek_plan():
    from labkit.plan.planner import plan

    model, device, cluster = deepseek_v3_setup()
    return plan(model, device, cluster, uneven_stages=True)


def test_deepseek_v3_s_published_layout_fits_and_is_in_the_list(deepseek_plan):
    """2048 GPUs, pp 16, ep 64, ZeRO-1 (Section 3.2): its best variant fits 80 GiB and is listed; its rank is
    reported, not fitted. What the planner cannot model (DualPipe's overlap of the all-to-alls, FP8, MLA, the
    node-limited dispatch kernels) makes it rank below layouts that avoid the all-to-all."""
    r = published_run_rank(deepseek_plan)
    lay = r["published"].layout
    assert (lay.dp, lay.tp, lay.pp, lay.cp, lay.ep, lay.zero) == (128, 1, 16, 1, 64, 1)
    assert r["published"].fits and r["mesh rank"] is not None
    print(f"published layout {lay.label()}: rank {r['rank']} of {r['of']} ({r['mesh rank']} of "
          f"{r['meshes that fit']} meshes that fit), {r['slower by']:.2f}x the winner {r['winner'].layout.label()}")
    assert r["published"].time["EP all-to-alls"] > 0                         # rival: the all-to-all is free


def test_without_expert_parallelism_the_published_layout_would_not_fit(deepseek_plan):
    """Notebook 14's rival 'it fits without expert parallelism': the same layout with ep = 1 passes 80 GiB."""
    import dataclasses

    from labkit.plan.planner import predict

    model, device, cluster = deepseek_v3_setup()
    published = published_run_rank(deepseek_plan)["published"]
    no_ep = predict(model, device, cluster, dataclasses.replace(published.layout, ep=1))
    assert published.fits and not no_ep.fits and no_ep.memory_bytes > 2 * published.memory_bytes


# ---- Narayanan et al. SC21, Table 1: the planner held against practice (nothing fitted to it) -------------------
from labkit.plan.published import SC21_TABLE1, SPEED_BAND, sc21_rows, sc21_setup  # noqa: E402

# What holds today, asserted so that any change shows: with a large GEMM at the CUDA 11 stack's traced rate (the
# paper's era), the links at what NCCL achieves on them and the output layer on the last pipeline stage (where
# Megatron-LM builds it), every speed is within the 25 % band and every published mesh is in its top group. At the
# links' line rate 39.1B and 76.1B are over-predicted by 26-27 %, out of the band: what the network is worth.
KNOWN_GROUP_MISSES: set[str] = set()
KNOWN_SPEED_MISSES: set[str] = set()


@pytest.fixture(scope="module")
def sc21():
    return sc21_rows()


@pytest.mark.parametrize("row", SC21_TABLE1, ids=lambda r: f"{r[0]}B")
def test_the_sc21_shapes_have_the_published_parameter_counts(row):
    model = sc21_setup(row)[0]
    assert model.num_params / 1e9 == pytest.approx(row[0], abs=0.06 + 0.001 * row[0])   # the table's 1 decimal


def test_every_sc21_layout_fits_and_is_near_the_top(sc21):
    assert all(r["fits"] and r["GiB"] < 80 for r in sc21), [(r["model"], r["GiB"]) for r in sc21]
    misses = {r["model"] for r in sc21 if not r["in top group"]}
    assert misses == KNOWN_GROUP_MISSES, misses
    slower = {r["model"]: r["published mesh slower by"] for r in sc21}
    assert max(slower.values()) < 1.09, slower          # as they stand (18.4B the nearest the 10 % tie): a change shows
    assert all(r["in top group at line rate"] for r in sc21)


def test_the_output_layer_on_the_last_stage_is_what_keeps_deep_pipelines_honest(sc21):
    """Rival: the logits' work spread evenly over the stages (this planner until now). Then 7.5B and 18.4B fall out
    of their groups, over 10 % behind interleaved 4-stage pipelines that, on a real Megatron-LM, carry the output
    layer (two thirds to one layer's FLOPs at these widths) on their last stage."""
    import dataclasses

    from labkit.plan.planner import bubble_ratio, plan, predict
    from labkit.plan.published import sc21_space
    for row in SC21_TABLE1[2:4]:                        # 7.5B and 18.4B
        model, device, cluster, _ = sc21_setup(row)
        winner = plan(model, device, cluster, micro_batches=(1, 2, 4, 8), selective=False, space=sc21_space())[0]
        flat = predict(dataclasses.replace(model, embedding=False), device, cluster, winner.layout, selective=False)
        logits_s = winner.time["compute"] - flat.time["compute"]
        layer_s = flat.time["compute"] / winner.layout.stage_layers(model)
        # FLOPs of the logits over a layer's, 2hV / (24h^2 + 4sh): 0.96 (7.5B) and 0.66 (18.4B); a layer also pays
        # element-wise work. Spread over 4 stages the busiest would carry a quarter of that (the rival: < 0.25)
        assert winner.layout.pp == 4 and 0.5 < logits_s / layer_s < 1.0, (model.name, logits_s / layer_s)
        # the rival's step for this winner: 1/pp of the logits on its busiest stage, the bubble shrunk alike
        bubble = bubble_ratio(winner.layout, winner.layout.micro_batches(model))
        spread = winner.step_s - logits_s * (1 - 1 / winner.layout.pp) * (1 + bubble)
        slower = next(r["published mesh slower by"] for r in sc21 if r["model"] == model.name)
        assert slower * winner.step_s / spread > 1.10, model.name       # out of the 10 % tie: the rival's miss


def test_the_sc21_speeds_are_over_predicted_and_say_by_how_much(sc21):
    """Rival: the planner under-predicts (a cost counted twice). It over-predicts every row, each within the
    issue's 25 % band; the misses (none) are asserted as they stand so a modelling change shows here."""
    ratios = {r["model"]: r["ratio"] for r in sc21}
    assert all(1.0 < x < 1.35 for x in ratios.values()), ratios
    assert {m for m, x in ratios.items() if abs(x - 1) > SPEED_BAND} == KNOWN_SPEED_MISSES, ratios


def test_the_kernel_stack_is_what_the_planner_cannot_know_and_it_is_priced(sc21):
    """Rival: the stack does not matter. At today's cited GEMM rate (torch 2.6, CUDA 12.6) every row predicts faster
    still, by about the ratio of the two rates (0.87 / 0.74 of peak: 1.18x) where GEMMs dominate."""
    from labkit.plan.published import A100_CUDA11_MATMUL_FLOPS
    from labkit.plan.rates import MAMF
    gain = dict((k, m / p) for k, m, p in MAMF)["A100 SXM"] / (A100_CUDA11_MATMUL_FLOPS / 312e12)
    for r in sc21:
        assert 1.0 < r["ratio at today's GEMM rate"] / r["ratio"] <= gain * 1.001, r


def test_the_network_is_what_the_planner_cannot_know_and_it_is_priced(sc21):
    """Rival: the link rate does not matter. At the links' line rate (300 and 25 GB/s) every row predicts faster,
    by at most the larger ratio of line rate to NCCL's achieved rate (300 / 230), reached only if all of a step
    were NVLink traffic; and at line rate the 39.1B and 76.1B rows leave the band (27-28 %)."""
    from labkit.plan.published import SC21_LINE_RATES, SC21_LINKS
    most = max(SC21_LINE_RATES[k] / SC21_LINKS[k] for k in SC21_LINKS)
    for r in sc21:
        assert 1.0 < r["ratio at the links' line rate"] / r["ratio"] < most, r
    outside = {r["model"] for r in sc21 if abs(r["ratio at the links' line rate"] - 1) > SPEED_BAND}
    assert outside == {"GPT 39.1B (SC21)", "GPT 76.1B (SC21)"}, outside
