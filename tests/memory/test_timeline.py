"""The backward-pass replay that gives the training step's memory peak."""
import torch

from labkit.memory.timeline import LayerMemory, backward_peak_bytes


def test_backward_peak_hand_worked():
    """Three layers; saved 100/50/10, grads 0/20/5, in+out 30/20/8 bytes."""
    layers = [LayerMemory(100, 0, 30), LayerMemory(50, 20, 20), LayerMemory(10, 5, 8)]
    # last layer: 160 + 0 + 8 + 5 = 173; middle: 150 + 5 + 20 + 20 = 195; first: 100 + 25 + 30 + 0 = 155
    assert backward_peak_bytes(layers) == 195


def test_workspaces_join_the_replay_where_their_layer_runs():
    """Same three layers. Backward at the middle layer held 195; a 10-byte workspace there makes 205,
    one of 10 at the last layer (173 + 10) stays under it. Forward: 30, 100 + 20, 150 + 8 = 158 at most."""
    from labkit.memory.timeline import forward_peak_bytes
    from labkit.memory.timeline import LayerWorkspace

    layers = [LayerMemory(100, 0, 30), LayerMemory(50, 20, 20), LayerMemory(10, 5, 8)]
    none = [LayerWorkspace(0, 0)] * 3
    assert forward_peak_bytes(layers) == forward_peak_bytes(layers, none) == 158
    assert backward_peak_bytes(layers, none) == 195
    assert backward_peak_bytes(layers, [LayerWorkspace(0, 0), LayerWorkspace(0, 10), LayerWorkspace(0, 0)]) == 205
    assert backward_peak_bytes(layers, [LayerWorkspace(0, 0), LayerWorkspace(0, 0), LayerWorkspace(0, 10)]) == 195
    assert forward_peak_bytes(layers, [LayerWorkspace(500, 0), LayerWorkspace(0, 0), LayerWorkspace(0, 0)]) == 530


def test_layer_memory_leaves_no_reference_cycle_holding_the_activations():
    """The saved-tensor hook must not hand autograd the tensor itself: an output saved for backward would then
    hold its own grad_fn, a cycle through C++ that only a full gc pass frees (~52 MB per ResNet-18 probe)."""
    import gc
    import weakref

    from labkit.memory.timeline import layer_memory

    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4), torch.nn.Sigmoid())
    outputs: list[weakref.ref] = []
    handle = model.register_forward_hook(lambda mod, args, out: outputs.append(weakref.ref(out)))
    for m in model:
        m.register_forward_hook(lambda mod, args, out: outputs.append(weakref.ref(out)))
    gc.disable()
    try:
        layer_memory(model, torch.randn(4, 8))
        alive = [r for r in outputs if r() is not None]
    finally:
        gc.enable()
        handle.remove()
    assert outputs and not alive, f"{len(alive)} of {len(outputs)} activations outlived the probe"
