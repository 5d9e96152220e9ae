"""A probe leaves the model as it found it: BatchNorm statistics, gradients, train mode, and no hooks left."""
import torch

from labkit.core.models import MLP, SmallCNN
from labkit.memory.probe import leaf_modules, preserved_state, probe_forward


def test_probe_restores_batchnorm_and_grads():
    model = SmallCNN(10, width=4)
    model.eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with preserved_state(model):
        model.train()
        model(torch.randn(4, 3, 8, 8)).sum().backward()
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(p.grad is None for p in model.parameters()) and not model.training


def test_probe_forward_removes_its_hooks_and_sees_every_leaf():
    model = MLP(10, in_features=12, hidden=4)
    seen = []
    handles = [m.register_forward_hook(lambda mod, args, out: seen.append(type(mod).__name__))
               for m in leaf_modules(model)]
    probe_forward(model, torch.randn(2, 12), handles)
    assert seen == ["Flatten", "Linear", "ReLU", "Linear", "ReLU", "Linear"]
    model(torch.randn(2, 12))
    assert len(seen) == 6                          # the hooks are gone
