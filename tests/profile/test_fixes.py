"""Tests for labkit.profile.fixes: the chain is GELU's tanh form, its bytes are counted, fixes refuse where they
cannot run, and the comparisons are paired."""
from __future__ import annotations

from unittest import mock

import pytest
import torch
import torch.nn.functional as F

from labkit.profile import fixes
from labkit.profile.fixes import (FixResult, compare, counted_bytes, cuda_graph_fix, fusion_fix, roof_raise,
                                  tanh_gelu_chain)
from labkit.profile.roofline import RoofMeasurement, Roofs

ROOFS = Roofs("test", {"fp32": RoofMeasurement("matmul fp32", "FLOP/s", (100e9,), 1),
                       "bf16": RoofMeasurement("matmul bf16", "FLOP/s", (800e9,), 1)},
              {"triad": RoofMeasurement("triad", "B/s", (10e9,), 1)})


def test_the_chain_is_gelu_tanh_approximation():
    x = torch.randn(1000)
    torch.testing.assert_close(tanh_gelu_chain(x), F.gelu(x, approximate="tanh"))


def test_eager_chain_bytes_are_counted_operator_by_operator():
    x = torch.randn(1000)
    nbytes, flops, ops = counted_bytes(tanh_gelu_chain, x)
    assert ops == 9 and flops == 9 * 1000
    # ((0.044715*x)*x)*x: 8 + 12 + 12 kB; x + ...: 12; 0.798*...: 8; tanh: 8; 1.0 + ...: 8; 0.5*x: 8; the product: 12
    assert nbytes == (8 + 12 + 12 + 12 + 8 + 8 + 8 + 8 + 12) * 1000


def test_compare_pairs_rounds():
    times = iter([2.0, 1.0, 4.0, 1.0, 2.0, 2.0])
    with mock.patch.object(fixes, "time_fn", side_effect=lambda *a, **k: mock.Mock(median_s=next(times))):
        speedup, before, after = compare(lambda: None, lambda: None, rounds=3, repeats=1, device=torch.device("cpu"))
    assert before == [2.0, 4.0, 2.0] and after == [1.0, 1.0, 2.0] and speedup == 2.0


def test_fusion_on_a_small_tensor_counts_bytes_saved_and_predicts_the_gain():
    result = fusion_fix(torch.randn(4096), ROOFS, rounds=1, repeats=1)
    assert result.bytes_after == 2 * 4096 * 4 and result.bytes_before > 4 * result.bytes_after
    assert result.wall == "memory"
    assert result.predicted_speedup == pytest.approx(result.bytes_before / result.bytes_after)
    assert result.speedup > 0
    assert result.speedup_by_round == pytest.approx((result.before_rounds_s[0] / result.after_rounds_s[0],))


def test_each_rounds_speedup_pairs_that_rounds_before_and_after():
    result = FixResult("f", "memory", 2.0, 3.0, before_rounds_s=(2.0, 4.0, 3.0), after_rounds_s=(1.0, 1.0, 3.0))
    assert result.speedup_by_round == (2.0, 4.0, 1.0)


def test_cuda_graphs_refuse_a_cpu_tensor_with_one_clear_line():
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA GPU"):
        cuda_graph_fix(torch.nn.Linear(2, 2), torch.randn(1, 2), torch.zeros(1, dtype=torch.long))


def test_roof_raise():
    assert roof_raise(ROOFS, "bf16") == pytest.approx(8.0)
    assert roof_raise(ROOFS, "tf32") is None


def test_cuda_graphs_graph_a_copy_so_the_eager_side_stays_eager():
    """make_graphed_callables (mocked: no GPU here) must not see the model the eager side runs."""
    model = torch.nn.Linear(2, 2)
    x, y = torch.randn(1, 2), torch.zeros(1, dtype=torch.long)
    seen = []
    with mock.patch("torch.cuda.is_available", return_value=True), \
            mock.patch.object(torch.Tensor, "device", new_callable=mock.PropertyMock,
                              return_value=torch.device("cuda", 0)), \
            mock.patch("torch.cuda.make_graphed_callables", side_effect=lambda m, args: seen.append(m) or m), \
            mock.patch.object(fixes, "compare", return_value=(1.5, [2.0], [1.0])), \
            mock.patch.object(torch.nn.Module, "to", lambda self, *a, **k: self):
        result = fixes.cuda_graph_fix(model, x, y)
    assert seen and seen[0] is not model and result.speedup == 1.5 and result.wall == "overhead"
