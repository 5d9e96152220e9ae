"""The backward-pass replay that gives the training step's memory peak."""
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
