"""The cost formulas against hand-worked numbers and the papers' own sums, and the saved-bytes recorder."""
import pytest
import torch

from labkit.parallel.tensor import megatron as tp
from labkit.parallel.tensor import cost as tp_cost


def test_tp_bytes_are_four_ring_all_reduces_of_the_activations():
    # b=4, s=128, h=64, fp32: 131072 B per all-reduce; a ring of 2 sends all of it, a ring of 4 sends 1.5x
    assert tp_cost.tp_bytes_per_layer(4, 128, 64, 2) == 4 * 131072
    assert tp_cost.tp_bytes_per_layer(4, 128, 64, 4) == 4 * 1.5 * 131072
    assert tp_cost.tp_bytes_per_layer(4, 128, 64, 1) == 0
    for t in (2, 4, 8):
        assert tp_cost.sp_bytes_per_layer(4, 128, 64, t) == tp_cost.tp_bytes_per_layer(4, 128, 64, t)
    with pytest.raises(ValueError):
        tp_cost.tp_bytes_per_layer(0, 128, 64, 2)


def test_korthikanti_terms_add_up_to_the_papers_equations():
    s, b, h, a = 2048, 1, 12288, 96            # GPT-3 175B's layer (Korthikanti et al. 2022, Table 3)
    sbh = s * b * h
    terms = tp_cost.korthikanti_terms(s, b, h, a)
    assert sum(terms.values()) == sbh * (34 + 5 * a * s / h)                             # Eq. 1
    assert sum(terms[k] for k in tp_cost.REPLICATED_TERMS) == 10 * sbh
    t = 8
    assert tp_cost.korthikanti_bytes(s, b, h, a, t) == pytest.approx(sbh * (10 + 24 / t + 5 * a * s / (h * t)))
    assert tp_cost.korthikanti_bytes(s, b, h, a, t, True) == pytest.approx(sbh / t * (34 + 5 * a * s / h))


def test_the_norm_region_of_the_kit_s_layer_is_four_activations_and_the_norm_statistics():
    assert tp_cost.norm_region_bytes(128, 4, 64) == 4 * (4 * 128 * 4 * 64) + 4 * (4 * 128 * 4)
    assert tp_cost.norm_region_bytes(128, 4, 64, 2, sequence_parallel=True) * 2 == tp_cost.norm_region_bytes(128, 4, 64)
    assert tp_cost.norm_region_bytes(128, 4, 64, 2) == tp_cost.norm_region_bytes(128, 4, 64)


def test_saved_bytes_of_the_unsplit_layer_match_the_norm_region_formula():
    shape = tp.LayerShape(seq_len=32, batch=2)
    block = tp.build_block(shape)
    recorder = tp_cost.SavedBytes(block, [block.ln1, block.ln2])
    with recorder.recording():
        block(torch.randn(2, 32, 64, requires_grad=True))
    totals = recorder.totals()
    assert totals["norm"] == tp_cost.norm_region_bytes(32, 2, 64)
    assert totals["split"] > totals["norm"]          # attention's q, k, v, output; GELU's input; fc2's input
