"""Oversubscription: settings sized from the free cores, verdicts from stand-in rounds, one real child process."""
import pytest

from labkit.core.procs import run_in_fresh_process
from labkit.input import oversubscription as ov


def _run(spin_step_s, spin_cpu_s, matched_step_s=(0.2, 0.25)):
    rounds = {"matched": [{"step_s": s, "cpu_s_per_step": 0.2, "cpu_share": 0.5} for s in matched_step_s],
              "oversubscribed, spinning": [{"step_s": s, "cpu_s_per_step": spin_cpu_s, "cpu_share": 0.4}
                                           for s in spin_step_s],
              "oversubscribed, sleeping": [{"step_s": 0.3, "cpu_s_per_step": 0.2, "cpu_share": 0.5}] * 2}
    return ov.OversubscriptionRun({"matched": 1, "oversubscribed, spinning": 2, "oversubscribed, sleeping": 2},
                                  rounds, busy_cores=1, cores=2)


def test_settings_match_the_free_cores_and_refuse_a_machine_with_none_free():
    assert ov.oversubscription_settings(2, 1) == {"matched": (1, "PASSIVE"), "oversubscribed, spinning": (2, "ACTIVE"),
                                                  "oversubscribed, sleeping": (2, "PASSIVE")}
    assert ov.oversubscription_settings(8, 2)["matched"] == (6, "PASSIVE")
    with pytest.raises(ValueError, match="leave none of 1 free"):
        ov.oversubscription_settings(1, 1)


def test_table_and_verdicts_from_stand_in_rounds():
    run = _run(spin_step_s=(2.0, 3.0), spin_cpu_s=0.6)
    rows = {r["setting"]: r for r in run.table()}
    assert rows["oversubscribed, spinning"]["x_matched"] == pytest.approx(11.0)   # median of 10x and 12x
    assert rows["matched"]["x_matched"] == 1.0 and rows["matched"]["cpu_ms_per_step"] == pytest.approx(200)
    assert [v.state for v in ov.judge_oversubscription(run)] == ["checked", "checked"]


def test_a_setting_that_does_not_hurt_fails_unless_the_rounds_disagree_enough_to_explain_it():
    steady = _run(spin_step_s=(0.18, 0.22), spin_cpu_s=0.2)        # no slower, no extra CPU, steady rounds
    assert [v.state for v in ov.judge_oversubscription(steady)] == ["failed", "failed"]
    noisy = _run(spin_step_s=(0.1, 0.25), spin_cpu_s=0.2, matched_step_s=(0.2, 0.2))
    assert ov.judge_oversubscription(noisy)[0].state == "INCONCLUSIVE"


def test_a_child_gets_the_threads_and_wait_policy_it_asked_for():
    out = run_in_fresh_process("labkit.input.oversubscription:time_steps_with_threads",
                               dict(thread_counts=[1, 2], wait_policy="PASSIVE", batch=2, steps=1, warmup=0),
                               timeout_s=240)
    assert [out[n]["threads_seen"] for n in ("1", "2")] == [1, 2]
    assert all(out[n]["step_s"] > 0 and 0 < out[n]["cpu_share"] <= 1 for n in ("1", "2"))
    with pytest.raises(ValueError, match="wait_policy must be one of"):
        ov.time_steps_with_threads([1], "SPIN")


def test_one_child_per_wait_policy_measures_each_of_its_settings(monkeypatch):
    """Matched and sleeping share a PASSIVE child, spinning has an ACTIVE one: two start-ups a round, not three."""
    calls = []

    def child(target, kwargs, timeout_s):
        calls.append((kwargs["wait_policy"], kwargs["thread_counts"]))
        return {str(n): {"step_s": 0.1 * n, "cpu_s_per_step": 0.1, "cpu_share": 0.5, "threads_seen": n}
                for n in kwargs["thread_counts"]}

    monkeypatch.setattr(ov, "run_in_fresh_process", child)
    monkeypatch.setattr(ov, "cpu_count", lambda: 2)
    monkeypatch.setattr(ov, "spinning_cores", lambda n: __import__("contextlib").nullcontext([]))
    run = ov.measure_oversubscription(1, rounds=2, batch=2, steps=1)
    assert sorted(calls) == [("ACTIVE", [2]), ("ACTIVE", [2]), ("PASSIVE", [1, 2]), ("PASSIVE", [1, 2])]
    assert [r["threads_seen"] for r in run.rounds["matched"]] == [1, 1]
    assert [r["threads_seen"] for r in run.rounds["oversubscribed, sleeping"]] == [2, 2]
    assert run.slowdown("oversubscribed, spinning") == pytest.approx(2.0)


def test_a_slowdown_or_cpu_cost_near_the_rival_no_difference_fails():
    """Steady rounds 1.1x slower and 1.1x the CPU: above 1.0 but not clear of the rival 'no difference' (1.0x)."""
    close = _run(spin_step_s=(0.22, 0.275), spin_cpu_s=0.22)
    verdicts = ov.judge_oversubscription(close)
    assert [v.state for v in verdicts] == ["failed", "failed"]
    assert [v.rival for v in verdicts] == ["oversubscription costs nothing (1.0x)",
                                           "spinning threads burn no extra CPU (1.0x)"]
    assert [v.state for v in ov.judge_oversubscription(close, min_slowdown=1.05, min_cpu_ratio=1.05)] == [
        "checked", "checked"]
