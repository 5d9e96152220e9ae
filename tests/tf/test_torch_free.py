"""Every labkit.tf module is torch-free and TensorFlow-lazy at import time.

TensorFlow-only child processes import them (``labkit.core.procs.run_in_fresh_process``), and a PyTorch
notebook kernel imports them for their pure helpers without loading TensorFlow. New modules are covered too.
"""
import pkgutil
import subprocess
import sys

import pytest

import labkit.tf

TF_MODULES = sorted(m.name for m in pkgutil.iter_modules(labkit.tf.__path__))


def test_the_list_is_not_empty():
    assert {"distribute", "keras", "pipelines", "pitfalls", "profiler", "threads"} <= set(TF_MODULES)


@pytest.mark.parametrize("module", TF_MODULES)
def test_module_imports_neither_torch_nor_tensorflow(module):
    code = (f"import sys, labkit.tf.{module}; "
            "assert 'torch' not in sys.modules and 'tensorflow' not in sys.modules, "
            "sorted(m for m in ('torch', 'tensorflow') if m in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
