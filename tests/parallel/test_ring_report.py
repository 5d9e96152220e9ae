"""The ring's report on made-up rank results: the paired ratio, the ideal, and a verdict that can fail."""
from labkit.parallel.ring_report import overlap_summary, overlap_verdict


def _ranks(serial, overlapped, compute=0.06, comm=0.04, share=1.0):
    seconds = {"serial": serial, "overlapped": overlapped, "compute_only": [compute] * len(serial),
               "comm_only": [comm] * len(serial)}
    return [{"rank": r, "seconds": seconds, "cpu_share": share} for r in range(2)]


def test_perfect_overlap_is_checked_and_none_fails_on_a_quiet_machine():
    good = _ranks([0.10, 0.10, 0.10], [0.06, 0.061, 0.06])
    assert abs(overlap_summary(good)["ideal ratio"] - 0.10 / 0.06) < 1e-9
    assert overlap_verdict(good).state == "checked"
    assert overlap_verdict(_ranks([0.10] * 3, [0.10] * 3)).state == "failed"


def test_a_starved_run_is_inconclusive_with_its_reason():
    verdict = overlap_verdict(_ranks([0.10] * 3, [0.095] * 3, share=0.2))
    assert verdict.state == "INCONCLUSIVE" and "0.20 of a core" in verdict.detail
