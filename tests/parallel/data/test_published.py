"""The cited published scaling points: they load, verify and never beat linear scaling."""
from labkit.parallel.data import published as pub


def test_published_points_load_and_are_sublinear():
    df = pub.load_published_scaling()
    assert {"source", "reference", "workers", "baseline_workers", "speedup_vs_baseline", "efficiency"} <= set(df.columns)
    assert (df["speedup_vs_baseline"] <= df["workers"] / df["baseline_workers"] + 1e-9).all()
    assert df["source"].str.len().gt(0).all() and df["reference"].str.len().gt(0).all()
    eff = df["speedup_vs_baseline"] / (df["workers"] / df["baseline_workers"])
    assert (abs(eff - df["efficiency"]) < 1e-6).all()
