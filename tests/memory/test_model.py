"""The memory model against exact saved-tensor bytes and hand-worked numbers."""
import pytest
import torch
from torch import nn

from labkit.core.models import MLP, SmallCNN
from labkit.memory.model import MemoryModel, build_memory_model, optimizer_kind, saved_activation_bytes


def test_mlp_saved_bytes_match_hand_count():
    # Flatten is a view of x; each Linear saves its input, each ReLU its output (the next Linear's input):
    # distinct storages = x (B*in) + two ReLU outputs (B*h each), float32
    torch.manual_seed(0)
    model = MLP(10, in_features=48, hidden=16)
    for b in (1, 3, 8):
        assert saved_activation_bytes(model, torch.randn(b, 3, 4, 4)) == b * (48 + 2 * 16) * 4


def test_parameters_are_not_counted_and_bf16_halves():
    model = nn.Sequential(nn.Linear(64, 64))
    x = torch.randn(5, 64)
    assert saved_activation_bytes(model, x) == 5 * 64 * 4     # only the input, not the weight
    bf = saved_activation_bytes(nn.Sequential(nn.Linear(64, 64), nn.ReLU()), x, precision="bf16")
    assert bf > 0


@pytest.mark.parametrize("batch", [1, 8, 32])
def test_linear_fit_predicts_exact_bytes_for_cnn(batch):
    torch.manual_seed(0)
    model = SmallCNN(10, width=8)
    mm = build_memory_model(model, (3, 16, 16), optimizer="sgd", momentum=0.0)
    exact = saved_activation_bytes(model, torch.randn(batch, 3, 16, 16))
    assert mm.predict(batch).activations_bytes == pytest.approx(exact, rel=1e-3)


def test_fixed_parts_by_optimizer():
    model = MLP(10, in_features=12, hidden=4)
    n = sum(p.numel() for p in model.parameters())
    for name, momentum, copies in (("sgd", 0.0, 0), ("sgd", 0.9, 1), ("adam", 0.0, 2)):
        bd = build_memory_model(model, (12,), optimizer=name, momentum=momentum).predict(4)
        assert bd.params_bytes == bd.grads_bytes == 4 * n
        assert bd.optimizer_bytes == copies * 4 * n
        parts = bd.params_bytes * (2 + copies) + bd.activations_bytes
        assert bd.total_bytes == parts + bd.peak_adjust_bytes


def test_peak_is_the_larger_of_backward_and_optimizer_step():
    """Adam at batch 1: the step (params + grads + 2 states + sqrt(v) temporary = 5 copies) is the peak."""
    model = MLP(10, in_features=12, hidden=64)
    pbytes = 4 * sum(p.numel() for p in model.parameters())
    bd = build_memory_model(model, (12,), optimizer="adam").predict(1)
    assert bd.total_bytes == 5 * pbytes


def test_dtype_rescaling_and_budget_search():
    mm = MemoryModel(param_bytes=400, param_elements=100, optimizer="sgd", activation_bytes_per_sample=1000,
                     activation_fixed_bytes=0)
    assert mm.predict(10, activation_dtype="bf16").activations_bytes == 5000
    assert mm.predict(10, param_dtype="bf16").params_bytes == 200
    # no layer timeline: sum of parts; fixed = 800 bytes (params + grads); usable = 0.9 * 11_000 = 9900 -> 9
    assert mm.largest_batch_within(11_000, safety_margin=0.1) == 9
    assert mm.predict(9).total_bytes <= 9900 < mm.predict(10).total_bytes
    assert mm.largest_batch_within(500) == 0


def test_bad_input():
    with pytest.raises(ValueError, match="optimizer"):
        optimizer_kind("rmsprop")
    with pytest.raises(ValueError, match="probe_batches"):
        build_memory_model(MLP(10, 12, 4), (12,), probe_batches=(4, 2))
    with pytest.raises(ValueError, match="batch_size"):
        MemoryModel(0, 0, "sgd", 1.0, 0.0).predict(0)


def test_saved_activation_bytes_leaves_no_reference_cycle_holding_the_activations():
    """Like memory.timeline's probe: the pack hook hands autograd a detached handle, so nothing outlives the call
    without a gc pass (returning the tensor itself let a saved output hold its own grad_fn)."""
    import gc
    import weakref

    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4), nn.Sigmoid())
    outputs: list[weakref.ref] = []
    handles = [m.register_forward_hook(lambda mod, args, out: outputs.append(weakref.ref(out))) for m in model]
    gc.disable()
    try:
        saved_activation_bytes(model, torch.randn(4, 8))
        alive = [r for r in outputs if r() is not None]
    finally:
        gc.enable()
        for h in handles:
            h.remove()
    assert outputs and not alive, f"{len(alive)} of {len(outputs)} activations outlived the probe"
