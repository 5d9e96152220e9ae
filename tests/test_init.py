import importlib
import subprocess
import sys

import pytest

import labkit


def test_every_public_name_resolves_to_its_module():
    for name in labkit.__all__:
        obj = getattr(labkit, name)
        module = labkit._MODULE_OF[name]
        assert obj is getattr(importlib.import_module(f"labkit.{module}"), name), name


def test_import_is_lazy():
    code = "import sys, labkit; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert out.strip() == "False"


def test_unknown_name_is_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        labkit.nope  # noqa: B018


def test_no_public_name_shadows_a_submodule():
    import pkgutil

    submodules = {m.name for m in pkgutil.iter_modules(labkit.__path__)}
    assert not submodules & set(labkit.__all__)


@pytest.mark.tensorflow
def test_tensorflow_then_torch_training_does_not_crash():
    """The segfault this guards against kills the process, so run it in a child."""
    code = ("import labkit, tensorflow, torch\n"
            "m = torch.nn.Linear(2, 2); o = torch.optim.SGD(m.parameters(), 0.1)\n"
            "m(torch.ones(1, 2)).sum().backward(); o.step(); print('trained')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0 and "trained" in proc.stdout, proc.stderr[-500:]
