"""The recorded H100 run's figures come from the kit's data (data/recorded_*.json), worked by hand here from the
same files."""
import json
from pathlib import Path

import pytest

from labkit.core.data import DataUnavailableError
from labkit.training.recorded_run import recorded_h100_figures, recorded_ladder

DATA = Path(__file__).resolve().parents[2] / "data"
RECORDED_H100 = DATA / "recorded_h100_reference.json"
RECORDED_LADDER = DATA / "recorded_h100_ladder.json"


def test_figures_match_the_fixtures_by_hand():
    ref = json.loads(RECORDED_H100.read_text())
    fig = recorded_h100_figures()
    assert fig.device == ref["device"] == "NVIDIA H100 80GB HBM3"
    loaders = sorted(r["samples_per_s"] for r in ref["loader"] if "DataLoader" in r["loader"])
    assert fig.dataloader_samples_per_s == (loaders[0], loaders[-1])
    assert round(fig.dataloader_samples_per_s[0], -3) == 63_000 and round(fig.gpu_resident_samples_per_s, -3) == 768_000
    assert fig.tf32_batch == 512
    assert round(fig.strict_fp32_samples_per_s, -2) == 7300 and round(fig.tf32_samples_per_s, -2) == 19700
    assert fig.tf32_speedup == pytest.approx(2.71, abs=0.01)


def test_old_mfu_against_the_wrong_peak_is_the_impossible_looking_one():
    fig = recorded_h100_figures()
    lo, hi = fig.fp32_rung_mfu_vs_fp32_peak
    assert round(lo, 2) == 0.55 and round(hi, 2) == 0.93            # H100 SXM: TF32 494.5 / FP32 67 TFLOP/s
    assert fig.fp32_rung_mfu_vs_tf32_peak[1] < 0.15 < lo
    assert fig.loader_rung_data_wait == (0.22, 0.56)
    assert (fig.naive_val_accuracy, fig.batch_rung_val_accuracy, fig.batch_rung_batch_size) == (0.972, 0.084, 512)
    assert fig.batch_rung_optimizer_steps == 6                      # 2,876 samples at batch 512, the last step partial
    assert round(fig.best_rung_samples_per_s, -2) == 31_600 and round(fig.ceiling_samples_per_s, -2) == 59_800
    assert "recorded" in fig.label and "H100" in fig.label


def test_a_missing_fixture_is_one_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="data/recorded_h100_ladder.json"):
        recorded_ladder(tmp_path / "nope.json")
    assert recorded_ladder() == json.loads(RECORDED_LADDER.read_text())


def test_the_recorded_runs_are_read_from_the_kits_data_with_their_checksums_not_from_tests(tmp_path, monkeypatch):
    """An installed kit has no tests/: the recorded figures ship in data/ and are checked against its manifest, so a
    changed file is refused, not silently used."""
    copy = tmp_path / "data"
    copy.mkdir()
    for name in ("manifest.json", "recorded_h100_ladder.json"):
        (copy / name).write_bytes((DATA / name).read_bytes())
    (copy / "recorded_h100_ladder.json").write_text("{}")
    monkeypatch.setenv("LABKIT_DATA_DIR", str(copy))
    import labkit.core.data as data
    monkeypatch.setattr(data, "DATA_DIR", copy)
    with pytest.raises(DataUnavailableError, match="fails its checksum"):
        recorded_ladder()


def test_the_instrument_note_names_the_mode_and_reads_the_recorded_h200_costs():
    from types import SimpleNamespace

    from labkit.training.recorded_run import instrument_note

    note = instrument_note(SimpleNamespace(extra={"timed": "step", "timing": "events"}))
    assert note.startswith("this run was timed whole steps only (events clock)")
    assert "Recorded, not measured now (NVIDIA H200 (cuda:0)" in note
    assert "resnet18 at batch 128 (7.9 ms a step): per phase +1.0%, whole steps +1.3%" in note
    assert "small_cnn at batch 256 (1.9 ms a step): per phase +13.4%, whole steps +5.3%" in note
