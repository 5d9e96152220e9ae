"""The all-reduce benchmark: nccl-tests' formulas, the table layout, bad input, and one tiny real run."""
from __future__ import annotations

import pytest

from labkit.comm.bench import (BenchRow, allreduce_benchmark, bandwidths_gb_s, busbw_factor, fit_latency_bandwidth,
                               format_nccl_tests_table)


def test_busbw_factors_are_the_nccl_tests_ones():
    assert busbw_factor(2) == 1.0
    assert busbw_factor(4) == 1.5
    assert busbw_factor(8, "all_gather") == 7 / 8
    assert busbw_factor(8, "broadcast") == 1.0
    with pytest.raises(ValueError, match="collective must be one of"):
        busbw_factor(4, "alltoallv")


def test_bandwidths_by_hand():
    algbw, busbw = bandwidths_gb_s(1_000_000_000, 0.5, 4)  # 1 GB in 0.5 s on 4 ranks
    assert algbw == pytest.approx(2.0) and busbw == pytest.approx(3.0)


def test_fit_recovers_a_known_line():
    rows = [BenchRow(s, s // 4, "float32", 2, "gloo", 1e-4 + s * 2e-9, 0.0, 0.0, 0, "CPU") for s in (16, 1024, 2**20)]
    a, b = fit_latency_bandwidth(rows)
    assert a == pytest.approx(1e-4) and b == pytest.approx(2e-9)
    with pytest.raises(ValueError, match="at least two"):
        fit_latency_bandwidth(rows[:1])


def test_table_layout():
    row = BenchRow(1024, 256, "float32", 2, "gloo", 125e-6, 0.008192, 0.008192, 0, "CPU")
    table = format_nccl_tests_table([row]).splitlines()
    assert table[1].split() == ["#", "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong"]
    assert table[3].split() == ["1024", "256", "float", "sum", "-1", "125.0", "0.008", "0.008", "0"]


@pytest.mark.parametrize("kwargs,match", [({"sizes_bytes": [6]}, "multiple of the element size"),
                                          ({"sizes_bytes": []}, "sizes_bytes is empty"),
                                          ({"dtype": "complex64"}, "dtype must be one of"),
                                          ({"iters": 0}, "iters must be an integer >= 1"),
                                          ({"repeats": 0}, "repeats must be an integer >= 1"),
                                          ({"warmup": -1}, "warmup must be an integer >= 0")])
def test_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        allreduce_benchmark(2, **kwargs)


def test_real_gloo_run_is_correct_and_consistent():
    rows = allreduce_benchmark(2, sizes_bytes=[64, 65536], iters=3, warmup=1, repeats=2, timeout_s=120)
    assert [r.size_bytes for r in rows] == [64, 65536]
    for r in rows:
        assert r.wrong == 0 and r.backend == "gloo" and r.world_size == 2 and r.time_s > 0
        assert r.algbw_gb_s == pytest.approx(r.size_bytes / r.time_s / 1e9)
        assert r.busbw_gb_s == pytest.approx(r.algbw_gb_s * 2 * (2 - 1) / 2)


# ---- sizes x ranks x buffers checked against memory before any process starts
def test_memory_check_message_for_gloo_and_nccl():
    from labkit.comm.bench import check_memory

    with pytest.raises(ValueError) as info:
        check_memory(2, 64 << 30, "gloo", available_bytes=23 << 30)
    assert str(info.value) == ("the largest message (64.0 GiB) x 2 buffers x 2 ranks needs about 256.8 GiB, more than "
                               "the 23.0 GiB of RAM available; lower --max-bytes/-e or --world-size")
    with pytest.raises(ValueError, match=r"x 2 buffers per rank needs about 128.4 GiB, more than the 80.0 GiB of "
                                         r"memory of one GPU"):
        check_memory(8, 64 << 30, "nccl", available_bytes=80 << 30)
    check_memory(8, 16 << 30, "nccl", available_bytes=80 << 30)   # 16 GiB messages fit an 80 GB GPU
    check_memory(2, 16 << 20, "gloo", available_bytes=2 << 30)     # the default 16M fits a 2 GB Binder box


def test_allreduce_bench_64g_on_this_machine_exits_2_with_one_line(capsys, monkeypatch):
    import psutil

    from labkit.cli import main as cli

    monkeypatch.setattr(psutil, "virtual_memory", lambda: type("vm", (), {"available": 23 << 30})())
    assert cli.main(["allreduce-bench", "-e", "64G", "--backend", "gloo"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("error: the largest message (64.0 GiB) x 2 buffers x 2 ranks needs about 256.8 GiB, more than the "
                   "23.0 GiB of RAM available; lower --max-bytes/-e or --world-size")


def _rows(times_s, share=1.0):
    sizes = [16 * 4 ** k for k in range(len(times_s))]
    return [BenchRow(s, s // 4, "float32", 2, "gloo", t, 0.0, 0.0, 0, "CPU", share) for s, t in zip(sizes, times_s)]


def test_a_fit_that_would_slope_down_stays_on_the_physical_bound():
    """A CI run under load fitted b < 0 (its small sizes were slowed by a burst); constrained, b is 0."""
    rows = _rows([8e-4, 7e-4, 6e-4, 5e-4, 6e-4])
    a, b = fit_latency_bandwidth(rows)
    assert a > 0 and b == 0.0


def test_the_link_fit_is_checked_failed_or_inconclusive_with_the_measured_load():
    from labkit.comm.bench import judge_link_fit
    good = judge_link_fit("both terms matter", _rows([1e-4 + s * 1e-7 for s in (16, 64, 256, 1024, 4096)]))
    assert good.state == "checked" and "rules out one term alone" in good.detail
    assert judge_link_fit("both terms matter", _rows([8e-4, 7e-4, 6e-4, 5e-4, 6e-4])).state == "failed"   # quiet
    busy = judge_link_fit("both terms matter", _rows([8e-4, 7e-4, 6e-4, 5e-4, 6e-4], share=0.3))
    assert busy.state == "INCONCLUSIVE" and busy.kind == "load" and "0.30 of a core" in busy.detail


def test_a_fit_whose_bytes_term_never_matters_fails_its_rival_one_term_alone():
    """b > 0 but b*S below a even at the largest size: the rival 'latency alone' is true, so the claim fails."""
    from labkit.comm.bench import judge_link_fit
    flat = judge_link_fit("both terms matter", _rows([1e-4 + s * 1e-12 for s in (16, 64, 256, 1024, 4096)]))
    assert flat.state == "failed" and "cannot tell the fit from one term alone" in flat.detail
    busy = judge_link_fit("both terms matter", _rows([1e-4 + s * 1e-12 for s in (16, 64, 256, 1024, 4096)],
                                                     share=0.3))
    assert busy.state == "INCONCLUSIVE" and busy.rival.startswith("one term alone")
