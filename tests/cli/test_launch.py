"""`python -m labkit launch`: help, a real 2-rank gloo run, one-line usage errors (exit 2), and the torchrun side."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from labkit.cli import main as cli
from labkit.comm.ports import free_port, reserved_port

TARGET = "labkit.comm.demos:all_reduce_sum"
LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID", "PMI_RANK",
                      "PMI_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_RANK", "PMIX_RANK")
ENV = {k: v for k, v in {**os.environ, "OMP_NUM_THREADS": "1"}.items() if k not in LAUNCHER_VARIABLES}


def labkit_launch(*args: str, timeout_s: float = 240) -> subprocess.CompletedProcess:
    """Run `python -m labkit launch ARGS` outside any launcher and return the finished process."""
    return subprocess.run([sys.executable, "-m", "labkit", "launch", *args], capture_output=True, text=True, env=ENV,
                          timeout=timeout_s)


@pytest.fixture
def no_launcher(monkeypatch):
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def test_help_has_examples_for_both_ways_to_start(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["launch", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "examples:" in out and "\n  labkit launch " in out
    assert "torchrun --nproc-per-node=2 -m labkit launch" in out
    for flag in ("--world-size", "--backend", "--timeout"):
        assert flag in out


def test_two_gloo_ranks_run_the_target_and_print_rank_by_rank():
    proc = labkit_launch("--world-size", "2", "--backend", "gloo", "--timeout", "120", TARGET)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "rank 0: {'rank': 0, 'before': [1.0, 2.0, 3.0, 4.0], 'after': [12.0, 14.0, 16.0, 18.0]}" in proc.stdout
    assert "rank 1: {'rank': 1, 'before': [11.0, 12.0, 13.0, 14.0], 'after': [12.0, 14.0, 16.0, 18.0]}" in proc.stdout


def test_bad_world_size_is_a_usage_error_in_a_real_run():
    proc = labkit_launch("--world-size", "0", TARGET)
    assert proc.returncode == 2 and "error: --world-size must be an integer >= 1, got 0" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_script_entry_gives_one_line_errors(capsys, no_launcher):
    assert cli.main(["launch", "labkit.comm.demos.no_colon"]) == 2
    assert cli.main(["launch", "--world-size", "0", "labkit.comm.demos:send_recv"]) == 2
    err = capsys.readouterr().err
    assert "error: a function given by name" in err and "error: --world-size must be" in err


def test_unimportable_target_and_bad_flags_exit_2(capsys, no_launcher):
    assert cli.main(["launch", "labkit.comm.demos:no_such_function"]) == 2
    assert "error: cannot import labkit.comm.demos:no_such_function" in capsys.readouterr().err
    for argv in (["launch", "--backend", "mpi", TARGET], ["launch", "--timeout", "0", TARGET],
                 ["launch", "--world-size", "two", TARGET], ["launch"]):
        with pytest.raises(SystemExit) as exit_:
            cli.main(argv)
        assert exit_.value.code == 2


def test_under_a_launcher_a_different_world_size_is_refused(capsys, no_launcher, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "test")
    assert cli.main(["launch", "--world-size", "3", TARGET]) == 2
    assert "--world-size 3 disagrees with the 2 ranks" in capsys.readouterr().err


def test_every_copy_under_mpiexec_is_one_rank_of_one_group():
    from labkit.comm.mpi import mpi_info, mpiexec_command

    info = mpi_info()
    if not info.available:
        pytest.skip(f"MPI lane not installed: {info.reason}")
    command = mpiexec_command(info, 2, oversubscribe=True) + [sys.executable, "-m", "labkit", "launch", TARGET]
    with reserved_port() as port:
        env = {**ENV, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for rank in range(2):
        assert f"[rank {rank}/2] {TARGET} -> {{'rank': {rank}," in proc.stdout
    assert proc.stdout.count("'after': [12.0, 14.0, 16.0, 18.0]") == 2


def test_stale_launcher_variables_are_explained_before_any_process_starts():
    """RANK/WORLD_SIZE/MASTER_* left in a shell: one line naming them, exit 2, at once (not a store traceback)."""
    stale = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511"}
    proc = subprocess.run([sys.executable, "-m", "labkit", "launch", TARGET], capture_output=True, text=True,
                          env={**ENV, **stale}, timeout=60)
    assert proc.returncode == 2 and proc.stdout == "" and len(proc.stderr.strip().splitlines()) == 1
    assert "RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 are set, but no launcher started" in proc.stderr


@pytest.mark.parametrize("rank", ["0", "1"])
def test_a_whole_torchrun_environment_left_over_is_one_line_naming_its_variables(rank):
    """TORCHELASTIC_RUN_ID copied along with RANK/MASTER_*: the rank waits for peers that never come; one line.
    Each case has a port of its own: run side by side on two test workers, ranks 0 and 1 on one port would meet
    and form the group (a CI run here did: both exited 0)."""
    with reserved_port() as reserved:
        port = str(reserved)
        stale = {"TORCHELASTIC_RUN_ID": "old", "RANK": rank, "LOCAL_RANK": rank, "WORLD_SIZE": "2",
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
        proc = subprocess.run([sys.executable, "-m", "labkit", "launch", "--timeout", "3", TARGET],
                              capture_output=True, text=True, env={**ENV, **stale}, timeout=120)
    assert proc.returncode == 1 and proc.stdout == "" and "Traceback" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]     # a client's c10d socket logs its own [E] lines before it
    assert last.startswith("error: ") and f"rank {rank} of 2 could not join the torchrun group at 127.0.0.1:{port}" in last
    assert "`unset TORCHELASTIC_RUN_ID RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT`" in last


def test_a_rank_killed_by_a_signal_is_named_and_a_late_timeout_is_no_failure():
    killed = labkit_launch("tests.launch_support:rank_one_is_killed")
    assert killed.returncode == 1 and "rank 1 was killed by SIGKILL" in killed.stderr
    lingering = labkit_launch("--timeout", "50", "tests.launch_support:returns_then_lingers")
    assert lingering.returncode == 0, lingering.stderr
    assert "rank 0: 0" in lingering.stdout and "rank 1: 1" in lingering.stdout


def test_the_ranks_that_returned_are_printed_on_a_timeout_and_on_a_real_sigint(tmp_path):
    """Rank 0 returns, rank 1 hangs: its own timeout and a real Ctrl-C both print rank 0's result and say 1 of 2."""
    import signal
    import time

    target = "tests.launch_support:rank_zero_returns_the_others_hang"
    # 15 s: rank 0 must start torch and return inside it while a neighbour (the other test worker) loads the CPU
    timed_out = labkit_launch("--timeout", "15", target)
    assert timed_out.returncode == 1 and "rank 0: 'rank 0 finished'" in timed_out.stdout, timed_out.stderr
    assert timed_out.stderr.strip().startswith("timed out after 1 of 2 ranks returned (") and "[1]" in timed_out.stderr
    proc = subprocess.Popen([sys.executable, "-m", "labkit", "launch", "--timeout", "120", target],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**ENV, "TMPDIR": str(tmp_path)})     # the launch folder lands where we can see it
    try:
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob("labkit-launch-*/0.result")) and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.0)                                # the launcher's next look hands rank 0's result over
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130 and "rank 0: 'rank 0 finished'" in out, err
    assert err.strip() == "interrupted (Ctrl-C) after 1 of 2 ranks returned"


def test_a_rank_killed_after_another_returned_prints_the_one_that_returned():
    proc = labkit_launch("tests.launch_support:rank_zero_returns_then_rank_one_is_killed")
    assert proc.returncode == 1 and "rank 0: 'rank 0 finished'" in proc.stdout, proc.stderr
    assert proc.stderr.startswith("stopped by a failure after 1 of 2 ranks returned: rank 1 of 2 failed running ")
    assert "rank 1 was killed by SIGKILL" in proc.stderr


def test_nodes_flags_are_in_the_help_and_incomplete_ones_are_one_line_exit_2(capsys):
    with pytest.raises(SystemExit):
        cli.main(["launch", "--help"])
    out = capsys.readouterr().out
    for flag in ("--nnodes", "--node-rank", "--nproc-per-node", "--rdzv-endpoint", "--max-restarts"):
        assert flag in out
    for args, match in ((["--nnodes", "2"], "--nnodes needs --node-rank"),
                        (["--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "h:1"], "numbered 0..1"),
                        (["--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "nohost"], "HOST:PORT")):
        assert cli.main(["launch", *args, TARGET]) == 2
        err = capsys.readouterr().err.strip()
        assert match in err and len(err.splitlines()) == 1, err


def _fork_workers_job(tmp_path, nnodes: int, target: str, timeout_s: float) -> tuple[subprocess.Popen, str]:
    """`launch --nnodes ... --fork-workers` on this machine, its temporary folder ``tmp_path``; (process, endpoint)."""
    endpoint = f"127.0.0.1:{free_port()}"
    argv = [sys.executable, "-m", "labkit", "launch", "--nnodes", str(nnodes), "--node-rank", "0",
            "--nproc-per-node", "2", "--rdzv-endpoint", endpoint, "--timeout", f"{timeout_s:g}", "--fork-workers",
            target]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**ENV, "TMPDIR": str(tmp_path), "PYTHONPATH": os.getcwd()}), endpoint


def test_fork_workers_keep_the_timeout_with_a_node_missing(tmp_path):
    """The probe: --timeout 5 and a missing node ran 92 s with --fork-workers (the plain path stops)."""
    from labkit.core.clock import now_s

    started_s = now_s()
    proc, _ = _fork_workers_job(tmp_path, 2, TARGET, 3)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 1 and "did not finish within --timeout 3 s" in err, err[-2000:]
    assert now_s() - started_s < 60                # torch's import (under 20 s here) + 3 s + the agent's stop
    assert not list(tmp_path.glob("labkit-torchrun-*"))


def test_a_sigtermed_fork_workers_launch_leaves_no_worker_and_no_temporary_folder(tmp_path):
    """The probe: a SIGTERM'd fork-workers launch left torchinductor_root in its temporary folder (a torch module
    imported after the folder went recreated it); while its workers run, torch's agent turns SIGTERM into its own
    SignalException, which must still end as the kit's one line and 143."""
    import signal
    import time

    from labkit.core.clock import now_s

    proc, endpoint = _fork_workers_job(tmp_path, 1, "tests.launch_support:sleep_forever", 120)

    def processes() -> int:         # the agent and its forked workers keep the command line, endpoint included
        return len(subprocess.run(["pgrep", "-f", endpoint], capture_output=True, text=True).stdout.split())

    deadline = now_s() + 90
    while processes() < 3 and now_s() < deadline and proc.poll() is None:     # both workers forked: torch's
        time.sleep(0.3)                                                       # agent holds SIGTERM from here
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143 and err.strip().splitlines()[-1] == "terminated (SIGTERM)", err[-2000:]
    assert not list(tmp_path.glob("labkit-torchrun-*"))
    leftover = subprocess.run(["pgrep", "-f", endpoint], capture_output=True, text=True).stdout   # forks keep argv
    assert not leftover, leftover
