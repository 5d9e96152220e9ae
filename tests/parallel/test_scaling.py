"""The data-parallel performance model, its fit to measurements, and the published points."""
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.parallel import scaling as sc
from labkit.comm.collectives import allreduce_cost


def test_epoch_time_hand_numbers():
    assert sc.epoch_time_s(1000, 10, 0.5) == pytest.approx(50.0)                      # (N/B) T_comp
    assert sc.epoch_time_s(1000, 10, 0.5, 0.1, replicas=4) == pytest.approx(15.0)      # N/(RB) (T_comp+T_sync)


def test_break_even_is_exactly_one():
    assert sc.predicted_speedup(1.0, 3.0, 4) == pytest.approx(1.0)
    assert not sc.pays_off(1.0, 3.0, 4)
    assert sc.pays_off(1.0, 2.9, 4)


@settings(max_examples=50, deadline=None)
@given(t_comp=st.floats(1e-4, 1.0), t_sync=st.floats(0, 2.0), r=st.integers(2, 64))
def test_pays_off_iff_speedup_above_one(t_comp, t_sync, r):
    speedup = sc.predicted_speedup(t_comp, t_sync, r)
    if not math.isclose(speedup, 1.0, rel_tol=1e-9):
        assert sc.pays_off(t_comp, t_sync, r) == (speedup > 1.0)
    assert sc.epoch_time_s(10_000, 8, t_comp) / sc.epoch_time_s(10_000, 8, t_comp, t_sync, r) == pytest.approx(speedup)


def test_sync_time_is_the_ring_cost():
    assert sc.sync_time_s(4_000_000, 8, 5e-6, 1e10) == pytest.approx(allreduce_cost("ring", 8, 4_000_000, 5e-6, 1e-10))
    with pytest.raises(ValueError, match="bandwidth"):
        sc.sync_time_s(10, 2, 0.0, 0.0)


def test_core_sharing():
    assert sc.core_sharing_slowdown(2, 2) == 1.0
    assert sc.core_sharing_slowdown(4, 2) == 2.0
    with pytest.raises(ValueError, match="cores"):
        sc.core_sharing_slowdown(2, 0)


@pytest.mark.parametrize("workers", [2, 3, 4, 8])
def test_fit_alpha_beta_recovers_the_model(workers):
    sizes = [4, 4096, 1 << 20, 1 << 22]
    times = [allreduce_cost("ring", workers, n, 3e-5, 2e-9) for n in sizes]
    alpha, beta = sc.fit_alpha_beta(sizes, times, workers)
    assert alpha == pytest.approx(3e-5, rel=1e-6) and beta == pytest.approx(2e-9, rel=1e-6)


def test_compare_with_model_hand_numbers():
    device = "test"
    runs = [sc.StepTimes(1, 64, 4000, 0.010, 0.0, 0.010, 0.0, 0.0, device),
            sc.StepTimes(2, 64, 4000, 0.010, 0.002, 0.0125, 1e-3, 0.0, device)]
    alone, two = sc.compare_with_model(runs, cores=2)
    assert alone.predicted_speedup == alone.measured_speedup == 1.0
    # T_sync = 2(R-1) alpha = 2 ms -> predicted 2*10/(10+2) ; measured 2*10/12.5
    assert two.predicted_speedup == pytest.approx(20 / 12) and two.measured_speedup == pytest.approx(1.6)
    assert two.relative_error == pytest.approx((20 / 12 - 1.6) / 1.6)
    with pytest.raises(ValueError, match="replicas=1"):
        sc.compare_with_model(runs[1:], cores=2)


def test_published_points_load_and_are_sublinear():
    df = sc.load_published_scaling()
    assert {"source", "reference", "workers", "baseline_workers", "speedup_vs_baseline", "efficiency"} <= set(df.columns)
    assert (df["speedup_vs_baseline"] <= df["workers"] / df["baseline_workers"] + 1e-9).all()
    assert df["source"].str.len().gt(0).all() and df["reference"].str.len().gt(0).all()
    eff = df["speedup_vs_baseline"] / (df["workers"] / df["baseline_workers"])
    assert (abs(eff - df["efficiency"]) < 1e-6).all()


def test_real_measurement_structure():
    runs = sc.measure_scaling((1, 2), rounds=1, in_features=64, hidden=32, depth=1, batch=8, steps=3, warmup=1)
    assert [r.replicas for r in runs] == [1, 2]
    assert runs[0].grad_bytes == runs[1].grad_bytes > 0
    assert all(r.step_s > 0 and r.t_comp_s > 0 for r in runs)
    assert runs[1].t_sync_s > 0 and runs[0].alpha_s == 0.0
    assert all(0.0 < r.cpu_share <= 1.05 for r in runs)
    points = sc.compare_with_model(runs, cores=2)
    assert points[0].measured_speedup == 1.0 and points[1].predicted_speedup > 0


def test_timing_noise_and_quiet_gate():
    assert sc.timing_noise([1.0] * 5) == pytest.approx(1.0)
    assert sc.timing_noise([1.0, 1.0, 1.0, 1.0, 10.0]) > sc.QUIET_NOISE_MAX
    steady = sc.StepTimes(1, 8, 4, 0.01, 0.0, 0.01, 0.0, 0.0, "t", step_noise=1.1)
    busy = sc.StepTimes(1, 8, 4, 0.01, 0.0, 0.01, 0.0, 0.0, "t", step_noise=3.0)
    assert sc.machine_is_quiet([steady], cores=2) and not sc.machine_is_quiet([busy], cores=2)
    shared = sc.StepTimes(4, 8, 4, 0.01, 0.0, 0.01, 0.0, 0.0, "t", cpu_share=0.5)     # 4 ranks on 2 cores: expected
    starved = sc.StepTimes(2, 8, 4, 0.01, 0.0, 0.01, 0.0, 0.0, "t", cpu_share=0.4)    # 2 ranks on 2 cores: others ran
    assert sc.machine_is_quiet([steady, shared], cores=2)
    assert not sc.machine_is_quiet([steady, starved], cores=2)


def test_verdict_agrees_only_when_both_sides_of_one():
    from labkit.parallel.scaling import Verdict

    assert Verdict("c", 2, 1, 1.0, 0.1, 1.8, 1.3).agrees
    assert Verdict("c", 2, 1, 1.0, 3.0, 0.4, 0.3).agrees
    assert not Verdict("c", 2, 1, 1.0, 0.9, 1.05, 0.8).agrees


@pytest.mark.parametrize("counts", [(), (0, 2), (1, 2.0), (True,)])
def test_measure_scaling_rejects_bad_replica_counts(counts):
    from labkit.parallel.scaling import measure_scaling

    with pytest.raises(ValueError, match="replica_counts must be integers >= 1"):
        measure_scaling(counts)


def test_pays_verdicts_real_processes_call_both_sized_cases():
    """Two real gloo ranks: the model calls the compute-bound job, the clock shows the other does not pay."""
    from labkit.parallel.scaling import pays_verdicts

    verdicts = pays_verdicts(replicas=2)
    assert [v.case.split(":")[0] for v in verdicts] == ["compute-bound", "communication-bound"]
    compute, comm = verdicts
    assert compute.grad_bytes < comm.grad_bytes / 20
    assert compute.agrees and compute.measured_speedup > 1, compute
    assert comm.measured_speedup < 1, comm            # a second replica slows a communication-bound job
    assert comm.predicted_speedup < compute.predicted_speedup
