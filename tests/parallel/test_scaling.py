"""Data-parallel scaling measured on real processes and compared with the performance model."""
import pytest

from labkit.parallel import scaling as sc


def test_compare_with_model_hand_numbers():
    device = "test"
    runs = [sc.StepTimes(1, 64, 4000, 0.010, 0.0, 0.010, 0.0, 0.0, device),
            sc.StepTimes(2, 64, 4000, 0.010, 0.002, 0.0125, 1e-3, 0.0, device)]
    alone, two = sc.compare_with_model(runs, cores=2)
    assert alone.predicted_speedup == alone.measured_speedup == 1.0
    # T_sync = 2(R-1) alpha = 2 ms -> predicted 2*10/(10+2) ; measured 2*10/12.5
    assert two.predicted_speedup == pytest.approx(20 / 12) and two.measured_speedup == pytest.approx(1.6)
    assert two.relative_error == pytest.approx((20 / 12 - 1.6) / 1.6)
    with pytest.raises(ValueError, match="world_size=1"):
        sc.compare_with_model(runs[1:], cores=2)


def test_real_measurement_structure():
    runs = sc.measure_scaling((1, 2), rounds=1, in_features=64, hidden=32, depth=1, batch=8, steps=3, warmup=1)
    assert [r.world_size for r in runs] == [1, 2]
    assert runs[0].grad_bytes == runs[1].grad_bytes > 0
    assert all(r.step_s > 0 and r.t_comp_s > 0 for r in runs)
    assert runs[1].t_sync_s > 0 and runs[0].alpha_s == 0.0
    assert all(0.0 < r.cpu_share <= 1.05 for r in runs)
    points = sc.compare_with_model(runs, cores=2)
    assert points[0].measured_speedup == 1.0 and points[1].predicted_speedup > 0


def test_timing_noise():
    assert sc.timing_noise([1.0] * 5) == pytest.approx(1.0)
    assert sc.timing_noise([1.0, 1.0, 1.0, 1.0, 10.0]) > 1.5     # one slow repeat of five: a busy machine


def test_verdict_agrees_only_when_both_sides_of_one():
    from labkit.parallel.scaling import Verdict

    assert Verdict("c", 2, 1, 1.0, 0.1, 1.8, 1.3).agrees
    assert Verdict("c", 2, 1, 1.0, 3.0, 0.4, 0.3).agrees
    assert not Verdict("c", 2, 1, 1.0, 0.9, 1.05, 0.8).agrees


@pytest.mark.parametrize("world_sizes", [(), (0, 2), (1, 2.0), (True,)])
def test_measure_scaling_rejects_bad_world_sizes(world_sizes):
    from labkit.parallel.scaling import measure_scaling

    with pytest.raises(ValueError, match=r"world_sizes (is empty; give integers >= 1|must be an integer >= 1, got)"):
        measure_scaling(world_sizes)


def test_pays_verdicts_real_processes_call_both_sized_cases():
    """Two real gloo ranks: the model calls the compute-bound job, the clock shows the other does not pay."""
    from labkit.parallel.scaling import pays_verdicts

    verdicts = pays_verdicts(world_size=2)
    assert [v.case.split(":")[0] for v in verdicts] == ["compute-bound", "communication-bound"]
    compute, comm = verdicts
    assert compute.grad_bytes < comm.grad_bytes / 20
    assert compute.agrees and compute.measured_speedup > 1, compute
    assert comm.measured_speedup < 1, comm            # a second replica slows a communication-bound job
    assert comm.predicted_speedup < compute.predicted_speedup


@pytest.mark.parametrize("backend, factor", [("gloo", 20), ("nccl", 20)])
def test_sized_cases_are_named_by_their_gradient_size_and_far_apart(backend, factor):
    """Each backend's two jobs: the names state the real gradient size, and the sizes sit far apart."""
    import re

    from labkit.core.models import mlp

    cases = sc.sized_cases(backend)
    assert cases is (sc.NCCL_SIZED_CASES if backend == "nccl" else sc.SIZED_CASES)
    sizes = []
    for name, kw in cases.items():
        model = mlp((kw["in_features"], *[kw["hidden"]] * kw["depth"], 10))      # what _time_steps builds
        params = sum(p.numel() for p in model.parameters())
        stated_mb = float(re.search(r"([\d.]+) MB of gradients", name).group(1))
        assert abs(params * 4 / 2**20 - stated_mb) / stated_mb < 0.1, (name, params * 4 / 2**20)
        sizes.append(params * 4)
    assert sizes[0] * factor < sizes[1]


@pytest.mark.parametrize("world_size", [1, 0, 2.0])
def test_pays_verdicts_needs_more_than_one_replica(world_size):
    with pytest.raises(ValueError, match=r"^world_size must be an integer >= 2, got .*; the verdict compares"):
        sc.pays_verdicts(world_size=world_size)
