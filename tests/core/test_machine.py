"""Facts about this machine, read without torch."""
import subprocess
import sys

from labkit.core import machine


def test_machine_facts():
    assert machine.cpu_count() >= 1 and machine.total_ram_bytes() > 0
    assert machine.package_version("torch") and machine.package_version("surely-not-a-package-xyz") is None


def test_machine_facts_are_torch_free():
    """TensorFlow-only children size thread pools with cpu_count, so importing it must not load torch."""
    code = "import sys, labkit.core.machine as m; assert m.cpu_count() >= 1; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
