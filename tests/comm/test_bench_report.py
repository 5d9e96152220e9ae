"""The benchmark's rows as a DataFrame and as a busbw plot (one line per world size and backend)."""
from __future__ import annotations

from labkit.comm.bench import BenchRow, bandwidths_gb_s
from labkit.comm.bench_report import plot_busbw, rows_to_dataframe


def _rows(world_size: int, backend: str) -> list[BenchRow]:
    rows = []
    for size, time_s in ((64, 50e-6), (65536, 400e-6)):
        algbw, busbw = bandwidths_gb_s(size, time_s, world_size)
        rows.append(BenchRow(size, size // 4, "float32", world_size, backend, time_s, algbw, busbw, 0, "CPU"))
    return rows


def test_dataframe_and_plot_of_one_run():
    rows = _rows(2, "gloo")
    assert list(rows_to_dataframe(rows).columns)[:3] == ["size_bytes", "count", "dtype"]
    ax = plot_busbw(rows)
    assert len(ax.lines) == 1 and ax.get_xscale() == "log"


def test_one_line_per_world_size_and_backend():
    ax = plot_busbw(_rows(2, "gloo") + _rows(3, "gloo") + _rows(2, "MPI (MPICH)"))
    assert sorted(line.get_label() for line in ax.lines) == ["2 ranks, MPI (MPICH)", "2 ranks, gloo", "3 ranks, gloo"]
