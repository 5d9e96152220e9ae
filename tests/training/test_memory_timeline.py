"""The backward-pass replay that gives the training step's memory peak."""
from labkit.training.memory_timeline import LayerMemory, backward_peak_bytes


def test_backward_peak_hand_worked():
    """Three layers; saved 100/50/10, grads 0/20/5, in+out 30/20/8 bytes."""
    layers = [LayerMemory(100, 0, 30), LayerMemory(50, 20, 20), LayerMemory(10, 5, 8)]
    # last layer: 160 + 0 + 8 + 5 = 173; middle: 150 + 5 + 20 + 20 = 195; first: 100 + 25 + 30 + 0 = 155
    assert backward_peak_bytes(layers) == 195
