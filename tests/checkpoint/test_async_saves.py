from labkit.checkpoint.async_saves import ASYNC_SPEEDUP_FLOOR, MODES, RIVAL_SAME_COST, async_verdict, waits_by_round
from labkit.core.verdict import CHECKED, FAILED


def _fake(blocking, asynchronous, share=1.0):
    return [{"rank": r, "cpu_share": share, "waited_s": {"blocking": list(blocking), "async": list(asynchronous)}}
            for r in range(2)]


def test_the_verdict_rejects_the_rival_on_a_quiet_machine_and_passes_a_real_gap():
    same = async_verdict(_fake([0.1] * 4, [0.1] * 4))                         # the rival true: same cost, 1.0x
    assert same.state == FAILED and same.rival == RIVAL_SAME_COST, same.detail
    ok = async_verdict(_fake([0.1] * 4, [0.02] * 4))
    assert ok.state == CHECKED and ok.rival == RIVAL_SAME_COST and "rules out" in ok.detail, ok.detail
    assert waits_by_round(_fake([0.1, 0.2], [0.01, 0.02])) == [(0.1, 0.01), (0.2, 0.02)]


def test_async_rounds_ran_and_cleaned_their_folders(runs):
    results = runs["async"]
    assert all(len(r["waited_s"][m]) == 2 for r in results for m in MODES)
    assert all(r["staging_peak_bytes"] > 0 for r in results)
    assert not any(runs["root"].glob("timing_*"))
    verdict = async_verdict(results)
    assert verdict.state != FAILED, verdict.detail
    assert ASYNC_SPEEDUP_FLOOR > 1.0
