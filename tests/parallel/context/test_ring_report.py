"""The ring's report on made-up rank results: the paired ratio, the ideal, and a verdict that can fail."""
from labkit.parallel.context.ring_report import overlap_summary, overlap_verdict


def _ranks(serial, overlapped, compute=0.06, comm=0.04, share=1.0):
    seconds = {"serial": serial, "overlapped": overlapped, "compute_only": [compute] * len(serial),
               "comm_only": [comm] * len(serial)}
    return [{"rank": r, "seconds": seconds, "cpu_share": share} for r in range(2)]


def test_perfect_overlap_is_checked_and_none_fails_on_a_quiet_machine():
    good = _ranks([0.10, 0.10, 0.10], [0.06, 0.061, 0.06])
    assert abs(overlap_summary(good)["ideal ratio"] - 0.10 / 0.06) < 1e-9
    assert overlap_verdict(good).state == "checked"
    assert overlap_verdict(_ranks([0.10] * 3, [0.10] * 3)).state == "failed"


def test_the_rival_no_overlap_is_named_rejected_when_overlap_hides_and_fails_the_claim_when_true():
    hides = overlap_verdict(_ranks([0.10, 0.10, 0.10], [0.06, 0.061, 0.06]))
    assert hides.rival.startswith("no overlap") and "rules out no overlap" in hides.detail, hides.detail
    none = overlap_verdict(_ranks([0.10, 0.101, 0.10], [0.10, 0.10, 0.101]))    # the rival true: serial = overlapped
    assert none.state == "failed" and none.rival.startswith("no overlap"), none.detail


def test_a_starved_run_is_inconclusive_with_its_reason():
    verdict = overlap_verdict(_ranks([0.10] * 3, [0.095] * 3, share=0.2))
    assert verdict.state == "INCONCLUSIVE" and "0.20 of a core" in verdict.detail


def test_the_memory_band_runs_from_the_unpacked_formula_to_the_packed_one():
    from labkit.parallel.context.ring_attention import INPUT_TERMS, PACKING_TERMS, ring_peak_bytes
    from labkit.parallel.context.ring_report import MEMORY_BAND, memory_rows
    from labkit.parallel.context.ring_runs import RingConfig

    cfg = RingConfig(memory_seq=2048)
    terms = ring_peak_bytes(cfg.batch, cfg.heads, cfg.memory_seq, cfg.head_dim, 2)
    whole = sum(v for k, v in terms.items() if k not in INPUT_TERMS)
    unpacked = whole - sum(terms[k] for k in PACKING_TERMS)
    outside = [int(unpacked / (1 + MEMORY_BAND)) - 1, int(whole * (1 + MEMORY_BAND)) + 1]
    rows = [row for pair in ([unpacked, whole], outside)
            for row in memory_rows([{"rank": i, "peak_bytes": p} for i, p in enumerate(pair)], cfg)]
    assert [r["in_band"] for r in rows] == [True, True, False, False]
    assert rows[1]["measured/formula"] == 1.0 and rows[0]["unpacked_MiB"] == unpacked / 2**20
    assert memory_rows([{"rank": 0, "peak_bytes": None}, {"rank": 1, "peak_bytes": None}], cfg) == []


def test_the_memory_band_rejects_the_all_gather_rival_at_both_scales():
    """Gathering every K/V block and attending the whole sequence at once builds (s/W) x s scores: the band around
    the ring's formula must not admit it, or the check could not tell the blockwise fold from it."""
    from labkit.parallel.context.ring_attention import all_gather_peak_bytes
    from labkit.parallel.context.ring_report import memory_rival
    from labkit.parallel.context.ring_runs import RingConfig

    terms = all_gather_peak_bytes(1, 2, 4096, 32, 4)
    assert terms["scores + weights (s/W x s)"] == 2 * 2 * 1024 * 4096 * 4 and terms["K/V blocks gathered"] == 3 * 2 * 2**18
    for cfg in (RingConfig(rounds=4), RingConfig(time_seq=4096, memory_seq=16384, rounds=7)):
        name, mib, rejected = memory_rival(cfg, 4)
        assert rejected and mib > 10 and "all-gather" in name
