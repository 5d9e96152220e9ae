"""Data-parallel scaling measured on real processes and compared with the performance model."""
import pytest

from labkit.parallel.data import scaling as sc
from tests.timing_support import decide


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
    from labkit.parallel.data.scaling import Verdict

    assert Verdict("c", 2, 1, 1.0, 0.1, 1.8, 1.3).agrees
    assert Verdict("c", 2, 1, 1.0, 3.0, 0.4, 0.3).agrees
    assert not Verdict("c", 2, 1, 1.0, 0.9, 1.05, 0.8).agrees


@pytest.mark.parametrize("world_sizes", [(), (0, 2), (1, 2.0), (True,)])
def test_measure_scaling_rejects_bad_world_sizes(world_sizes):
    from labkit.parallel.data.scaling import measure_scaling

    with pytest.raises(ValueError, match=r"world_sizes (is empty; give integers >= 1|must be an integer >= 1, got)"):
        measure_scaling(world_sizes)


def test_pays_verdicts_real_processes_call_both_sized_cases():
    """Two real gloo ranks: the model calls the compute-bound job, the clock shows the other does not pay."""
    from labkit.parallel.data.scaling import pays_verdicts

    verdicts = pays_verdicts(world_size=2)
    assert [v.case.split(":")[0] for v in verdicts] == ["compute-bound", "communication-bound"]
    compute, comm = verdicts
    assert compute.grad_bytes < comm.grad_bytes / 20
    assert comm.predicted_speedup < compute.predicted_speedup
    assert all(0 < share <= 1.0 for v in verdicts for share in v.cpu_shares), verdicts   # clamped at one core
    decide(compute.judge_pays("the model says the compute-bound job pays, and the clock agrees"),
           comm.judge_slows("a second replica slows the communication-bound job down"),
           compute.judge_ranks_above(comm, "the model ranks the two jobs as the clock does"))


def test_pays_verdict_is_inconclusive_only_when_the_measured_load_explains_it():
    """Stand-in shares: the issue's busy-machine run (1.75x predicted, 0.75x measured) with each rank on a
    shared core is INCONCLUSIVE; the same numbers on a quiet machine, or a model that is far off, fail."""
    from labkit.parallel.data.scaling import Verdict

    busy = Verdict("compute-bound", 2, 1, 0.01, 0.001, 1.75, 0.75, cpu_shares=(0.98, 0.6), step_noise=1.1)
    assert busy.judge_pays("pays").state == "INCONCLUSIVE"
    assert "the worst of 2 ranks got 0.60 of a core" in busy.judge_pays("pays").detail
    quiet = Verdict("compute-bound", 2, 1, 0.01, 0.001, 1.75, 0.75, cpu_shares=(0.99, 0.97), step_noise=1.1)
    assert quiet.judge_pays("pays").state == "failed"
    far_off = Verdict("compute-bound", 2, 1, 0.01, 0.001, 1.75, 0.3, cpu_shares=(0.98, 0.6), step_noise=1.1)
    assert far_off.judge_pays("pays").state == "failed"
    model_says_no = Verdict("c", 2, 1, 0.01, 0.1, 0.9, 1.3)
    assert model_says_no.judge_pays("pays").state == "failed"
    assert Verdict("c", 2, 1, 0.01, 0.1, 0.5, 0.4).judge_slows("slows").state == "checked"


def test_each_pays_verdict_fails_on_a_quiet_run_where_its_rival_is_true():
    """The rivals (issue 51): a second replica that gains nothing, costs nothing, or scales both jobs alike (1.0x)
    fails on a quiet machine; the passing verdicts name the rival they ruled out."""
    from labkit.parallel.data.scaling import PAYS_MARGIN, Verdict

    quiet = dict(cpu_shares=(0.99, 0.97), step_noise=1.05)
    no_gain = Verdict("compute-bound", 2, 1, 0.01, 0.001, 1.9, 1.0, **quiet)
    assert no_gain.judge_pays("pays").state == "failed"
    assert Verdict("c", 2, 1, 0.01, 0.001, 1.9, 1.0 / PAYS_MARGIN * 1.01, **quiet).judge_slows("slows").state == \
        "failed"                                                        # just short of the margin: no clear slow-down
    assert Verdict("c", 2, 1, 0.01, 0.001, 1.15, 1.9, **quiet).judge_pays("pays").state == "failed"  # model: no gain
    alike = Verdict("communication-bound", 2, 1, 0.04, 0.02, 1.3, 1.0, **quiet)
    assert no_gain.judge_ranks_above(alike, "ranks").state == "failed"          # the clock: both 1.0x
    assert alike.judge_ranks_above(no_gain, "ranks").state == "failed"          # the model ranks them the other way
    pays = Verdict("compute-bound", 2, 1, 0.01, 0.001, 1.9, 1.8, **quiet)
    slows = Verdict("communication-bound", 2, 1, 0.04, 0.02, 1.3, 0.5, **quiet)
    for verdict, rival in ((pays.judge_pays("pays"), "a second replica gains nothing"),
                           (slows.judge_slows("slows"), "a second replica costs nothing"),
                           (pays.judge_ranks_above(slows, "ranks"), "both jobs scale alike")):
        assert verdict.state == "checked" and verdict.rival == rival and "rules out" in verdict.detail


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


def test_runs_load_discounts_the_core_sharing_the_lesson_itself_causes():
    device = "test"
    runs = [sc.StepTimes(1, 64, 4000, 0.01, 0.0, 0.01, 0.0, 0.0, device, step_noise=1.1, cpu_share=0.99),
            sc.StepTimes(3, 64, 4000, 0.01, 0.002, 0.02, 0.0, 0.0, device, step_noise=1.2, cpu_share=0.66)]
    load = sc.runs_load(runs, cores=2)
    assert not load.busy and load.spread == pytest.approx(0.2)      # 3 ranks on 2 cores get 2/3 each by design
    busy = sc.runs_load(runs[:1] + [sc.StepTimes(3, 64, 4000, 0.01, 0.002, 0.02, 0.0, 0.0, device, cpu_share=0.33)],
                        cores=2)
    assert busy.busy and busy.worst_share == pytest.approx(0.33 / (2 / 3))
