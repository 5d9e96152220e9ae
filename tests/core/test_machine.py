"""Facts about this machine, read without torch."""
import os
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


def test_cpu_count_is_the_affinity_capped_by_the_cgroup_quota(tmp_path):
    assert machine.cpu_count(affinity=8, quota=1.5) == 2       # a Binder-like quota on a big host
    assert machine.cpu_count(affinity=2, quota=16.0) == 2      # the affinity mask is the tighter limit
    assert machine.cpu_count(affinity=4, quota=0.2) == 1
    assert machine.cpu_count() <= machine.affinity_cpu_count()
    cpu_max, quota_us, period_us = tmp_path / "cpu.max", tmp_path / "quota", tmp_path / "period"
    cpu_max.write_text("150000 100000\n")
    assert machine.cgroup_cpu_limit(cpu_max, (quota_us, period_us)) == 1.5
    cpu_max.write_text("max 100000\n")
    assert machine.cgroup_cpu_limit(cpu_max, (quota_us, period_us)) is None
    missing = tmp_path / "absent"
    quota_us.write_text("200000\n"), period_us.write_text("100000\n")
    assert machine.cgroup_cpu_limit(missing, (quota_us, period_us)) == 2.0
    quota_us.write_text("-1\n")
    assert machine.cgroup_cpu_limit(missing, (quota_us, period_us)) is None


def test_thread_settings_are_set_unless_the_user_chose_them():
    env = {"OMP_NUM_THREADS": "1"}
    chosen = machine.fit_threads_to_machine(env)
    assert chosen == {"OMP_WAIT_POLICY": "PASSIVE"} and env["OMP_NUM_THREADS"] == "1"
    env = {}
    assert machine.fit_threads_to_machine(env)["OMP_NUM_THREADS"] == str(machine.cpu_count())


def test_import_labkit_before_torch_fits_its_threads_and_after_torch_warns():
    code = ("import os, labkit, torch; assert os.environ['OMP_WAIT_POLICY'] == 'PASSIVE'; "
            "print(torch.get_num_threads())")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMP_")}
    out = subprocess.run([sys.executable, "-c", code], check=True, timeout=120, env=env, capture_output=True, text=True)
    assert int(out.stdout.strip()) == machine.cpu_count()
    late = subprocess.run([sys.executable, "-W", "always", "-c", "import torch, labkit"], timeout=120, env=env,
                          capture_output=True, text=True)
    assert late.returncode == 0 and "import labkit` first" in late.stderr


def test_idle_cpus_counts_only_the_allowed_cpus(monkeypatch):
    monkeypatch.setattr(machine.psutil, "cpu_percent", lambda interval, percpu: [100.0, 0.0, 50.0, 0.0])
    monkeypatch.setattr(machine.os, "sched_getaffinity", lambda pid: {0, 1, 2})
    assert machine.idle_cpus(0.0) == 1.5      # CPU 3 is idle but not ours
