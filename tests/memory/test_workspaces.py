"""Per-layer GPU workspaces: the calls found from tiny passes, the measurement's arithmetic, the model's use of them.

The real measurement needs CUDA (tests/training/test_gpu_instruments.py); here a fake meter stands in for the
caching allocator, driven by a layer that says what it borrows and allocates.
"""
import pytest
import torch
from torch import nn

from labkit.core.models import build_model
from labkit.memory.model import build_memory_model
from labkit.memory.timeline import LayerWorkspace
from labkit.memory.workspaces import StepWorkspaces, TensorSpec, layer_calls, measure_call, measure_workspaces


def _calls_at(model, batch):
    """Leaf calls recorded directly from a forward pass at ``batch`` (what layer_calls must reproduce)."""
    seen = []
    leaves = [m for m in model.modules() if not list(m.children())]
    hooks = [m.register_forward_pre_hook(lambda mod, args: seen.append((mod, [tuple(a.shape) for a in args])))
             for m in leaves]
    model(torch.randn(batch, 3, 32, 32))
    for h in hooks:
        h.remove()
    return seen


@pytest.mark.parametrize("name", ["resnet18", "small_cnn"])
def test_layer_calls_at_a_large_batch_match_a_real_pass(name):
    torch.manual_seed(0)
    model = build_model(name)
    calls = layer_calls(model, (3, 32, 32), 48)
    direct = _calls_at(model, 48)
    assert [c.module for c in calls] == [m for m, _ in direct]
    assert [[a.shape for a in c.args] for c in calls] == [shapes for _, shapes in direct]
    assert calls[0].args[0].requires_grad is False            # the data: no input gradient in the real step
    assert calls[1].args[0].requires_grad is True


def test_layer_calls_leave_batchnorm_statistics_alone():
    model = build_model("small_cnn")
    before = [b.clone() for b in model.buffers()]
    layer_calls(model, (3, 32, 32), 8)
    assert all(torch.equal(a, b) for a, b in zip(before, model.buffers()))


def test_measuring_on_a_cpu_says_what_to_do():
    with pytest.raises(ValueError, match="measured on a CUDA device.*without workspaces="):
        measure_workspaces(build_model("small_cnn"), (3, 32, 32), 8)


class FakeMeter:
    """Bytes 'allocated' by BorrowingLayer only: what it borrows, keeps and returns."""

    def __init__(self):
        self.now = self.peak = 1_000

    def hold(self, n):
        self.now += n
        self.peak = max(self.peak, self.now)

    def start(self):
        self.peak = self.now
        return self.now

    def stop(self):
        return self.peak, self.now


class _Borrow(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, meter, fwd, bwd):
        ctx.meter, ctx.bwd = meter, bwd
        out = x * weight
        meter.hold(out.numel() * out.element_size())             # the output stays
        meter.hold(fwd)
        meter.hold(-fwd)                                         # scratch, given back when the call ends
        ctx.save_for_backward(x, weight)
        return out

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        gx = grad * weight if ctx.needs_input_grad[0] else None   # no input gradient for the data
        gw = (grad * x).sum(0)
        ctx.meter.hold(sum(g.numel() * g.element_size() for g in (gx, gw) if g is not None))  # the results stay
        ctx.meter.hold(ctx.bwd)
        ctx.meter.hold(-ctx.bwd)
        return gx, gw, None, None, None


class BorrowingLayer(nn.Module):
    def __init__(self, meter, fwd, bwd):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(16))
        self.meter, self.fwd, self.bwd = meter, fwd, bwd

    def forward(self, x):
        x.mul_(1.0)                                              # in place, as ReLU(inplace=True) does
        return _Borrow.apply(x, self.weight, self.meter, self.fwd, self.bwd)


@pytest.mark.parametrize("input_grad", [True, False])
def test_measure_call_separates_workspace_from_what_the_call_returns(input_grad):
    meter = FakeMeter()
    layer = BorrowingLayer(meter, fwd=3_000_000, bwd=5_000_000)
    call_args = (TensorSpec((8, 16), torch.float32, input_grad),)
    from labkit.memory.workspaces import LayerCall

    got = measure_call(LayerCall(layer, call_args), torch.device("cpu"), meter=meter)
    assert got == LayerWorkspace(3_000_000, 5_000_000)


def test_workspace_fitting_in_the_slack_costs_nothing_and_a_larger_one_raises_the_peak():
    torch.manual_seed(0)
    mm = build_memory_model(build_model("small_cnn"), (3, 32, 32), "sgd", 0.9)
    n = len(mm.backward_layers)
    plain = mm.predict(256)

    def with_first_forward(nbytes):
        layers = [LayerWorkspace(0, 0)] * n
        layers[0] = LayerWorkspace(nbytes, 0)
        return mm.predict(256, workspaces=StepWorkspaces(256, tuple(layers)))

    assert with_first_forward(0).total_bytes == plain.total_bytes
    assert with_first_forward(10_000_000).workspace_bytes == 0              # the first conv runs near empty
    big = with_first_forward(400_000_000)
    assert big.workspace_bytes > 0 and big.total_bytes > plain.total_bytes
    assert big.total_bytes - with_first_forward(300_000_000).total_bytes == 100_000_000   # past the slack: 1:1


def test_predict_refuses_workspaces_from_another_batch_or_model():
    mm = build_memory_model(build_model("small_cnn"), (3, 32, 32), "sgd", 0.9)
    n = len(mm.backward_layers)
    with pytest.raises(ValueError, match="measured at batch 32, not 64"):
        mm.predict(64, workspaces=StepWorkspaces(32, (LayerWorkspace(0, 0),) * n))
    with pytest.raises(ValueError, match="3 layer workspaces for a model of 9"):
        mm.predict(64, workspaces=StepWorkspaces(64, (LayerWorkspace(0, 0),) * 3))


def test_largest_workspace():
    ws = StepWorkspaces(8, (LayerWorkspace(5, 9), LayerWorkspace(12, 0)))
    assert ws.largest_bytes == 12 and StepWorkspaces(8, ()).largest_bytes == 0


def test_memory_benchmark_judges_the_prediction_with_its_workspace(monkeypatch):
    """benchmarks/memory_check.py's GPU rows, with the two CUDA measurements stood in for on a CPU."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import memory_check as bench
    from labkit.memory.checks import StepMemory

    def big_first_conv(model, shape, batch, amp):
        n = len(build_memory_model(model, shape).backward_layers)
        return StepWorkspaces(batch, (LayerWorkspace(200_000_000, 0),) + (LayerWorkspace(0, 0),) * (n - 1))

    measured = []

    def step(model, opt, x, y, amp):
        measured.append(build_memory_model(model, (3, 32, 32), "sgd", 0.9).predict(len(x)).total_bytes + 180_000_000)
        return StepMemory(0, measured[-1], measured[-1], measured[-1] + 10)

    monkeypatch.setattr(bench, "measure_workspaces", big_first_conv)
    monkeypatch.setattr(bench, "measure_step_memory", step)
    monkeypatch.setattr(bench, "MODELS", ("small_cnn",))
    monkeypatch.setattr(bench, "OPTIMIZERS", ("sgd",))
    monkeypatch.setattr(bench, "DTYPES", ("fp32",))
    monkeypatch.setattr(bench, "BATCHES", (16,))
    monkeypatch.setattr(bench.torch.cuda, "empty_cache", lambda: None)
    (row,) = bench.gpu_rows(torch.device("cpu"))
    # the first conv runs with almost nothing else alive: most of its 200 MB forward workspace is new peak
    assert 150_000_000 < row["workspace_bytes"] < 200_000_000
    assert row["predicted_bytes"] == row["predicted_without_workspace_bytes"] + row["workspace_bytes"]
    assert row["error_pct"] == round(100 * (row["predicted_bytes"] - measured[0]) / measured[0], 2)   # judged with it
