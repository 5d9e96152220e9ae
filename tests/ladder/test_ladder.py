"""The tuning ladder: rung logic (carry forward / leave out / not applicable), accuracy judged against rung 0,
the budget in optimizer steps, speedup arithmetic, the ceiling, reports, config checks and the command line.

Rung logic is checked exactly with a fake trainer whose throughput is a known function of the recipe; the
fake moves the model to the run's device, so these tests hold on a CPU and on a GPU alike. Branches on CUDA
(TF32, NCCL ranks) are tested with a mocked device. One test runs the real loop end to end, one the real DDP rung.
"""
import functools
import json
import math
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader

import labkit.ladder.rungs as rungs
from labkit.cli import main as cli
from labkit.training.batch_rules import scaled_lr
from labkit.core.data import make_loader, synthetic_data
from labkit.ladder.config import LadderConfig, budget_samples, run_ladder
from labkit.ladder.climb import LadderJob, measure_recipe, verdict
from labkit.ladder.measure import Measurement, fp32_math, math_mode, steps_for_budget, summarise_run
from labkit.ladder.report import LadderResult
from labkit.ladder.rungs import RUNG_KEYS, RUNGS, Capabilities, Recipe, ddp_plan, detect_capabilities, propose
from labkit.core.models import MLP

SHAPE = (3, 8, 8)
MEASURED = ("baseline", "faster", "slower", "no clear gain")


@pytest.fixture(scope="module")
def data():
    return synthetic_data(n_train=64, n_val=16, image_shape=SHAPE)


tiny_mlp = functools.partial(MLP, 10, 3 * 8 * 8, 16)   # picklable, so the DDP rung can send it to its ranks


def fake_rate(batch: int, cfg, workers: int, device_data: bool) -> float:
    """Known samples/s per recipe: batch helps up to 8, workers and bf16 hurt, device data +30%,
    no-sync +20%, channels_last +50%, compile +1% (under the 3% bar)."""
    rate = 10.0 * min(batch, 8)
    rate *= 0.5 if workers else 1.0
    rate *= 1.3 if device_data else 1.0
    rate *= 1.2 if not cfg.sync_every_step else 1.0
    rate *= 0.1 if cfg.amp_dtype else 1.0
    rate *= 1.5 if cfg.channels_last else 1.0
    rate *= 1.01 if cfg.compile else 1.0
    return rate


def fake_trainer(model, loader, cfg, val_loader=None):
    """Stands in for labkit.training.loop.train: puts the model on the run's device (as train does) and returns step
    records whose times give exactly fake_rate()."""
    model.to(cfg.device)
    batch = int(next(iter(loader))[0].shape[0])
    rate = fake_rate(batch, cfg, getattr(loader, "num_workers", 0), not isinstance(loader, DataLoader))
    step_s = batch / rate
    steps = [SimpleNamespace(samples=batch, step_time_s=step_s * (3.0 if i < cfg.warmup_steps else 1.0))
             for i in range(cfg.steps)]
    return SimpleNamespace(steps=steps, samples_per_s_median=rate, data_wait_fraction=0.25, peak_mem_bytes=1000,
                           flops_per_sample=None, samples_per_s_p10=rate)


def fake_ceiling(model, batch_size, config, *, image_shape, num_classes, sample_from):
    """Stands in for labkit.training.ceiling.measure_ceiling: 200 samples/s, and it checks what it was given."""
    assert batch_size == 8 and image_shape == SHAPE and num_classes == 10 and config.steps >= 4
    assert len(sample_from) >= batch_size                        # the job's own training samples, not noise
    return SimpleNamespace(samples_per_s_median=200.0)


def smoke(**overrides):
    return LadderConfig.smoke(**{"batch_candidates": (2, 8, 16), **overrides})


@pytest.fixture(scope="module")
def fake_result(data):
    return run_ladder(smoke(measure_ceiling=True), model_fn=tiny_mlp, data=data, trainer=fake_trainer,
                      ceiling_fn=fake_ceiling)


def test_rungs_are_cumulative_and_unhelpful_ones_are_not_carried(fake_result):
    rows = {r.key: r for r in fake_result.rows}
    assert [r.rung for r in fake_result.rows] == list(range(len(RUNGS))) and tuple(rows) == RUNG_KEYS
    assert rows["naive"].status == "baseline" and rows["naive"].batch_size == 1
    assert rows["batch_size"].status == "faster" and rows["batch_size"].batch_size == 8   # fastest probe wins
    assert rows["input_pipeline"].status == "slower" and not rows["input_pipeline"].kept
    assert rows["device_data"].status == "faster" and rows["device_data"].compared_to == 1  # workers left out
    assert rows["no_sync"].compared_to == 3 and rows["no_sync"].kept
    assert rows["mixed_precision"].status == "slower" and not rows["mixed_precision"].kept
    assert rows["channels_last"].status == "faster"
    # channels_last was measured on device data, without bf16 and without workers: 80 * 1.3 * 1.2 * 1.5
    assert rows["channels_last"].samples_per_s == pytest.approx(10 * 8 * 1.3 * 1.2 * 1.5)
    assert rows["compile"].status == "skipped" and rows["ddp"].status == "skipped"
    assert fake_result.best.key == "channels_last"
    assert fake_result.batch_probe == pytest.approx({2: 20.0, 8: 80.0, 16: 80.0})


def test_tf32_is_reported_not_dropped(fake_result):
    row = fake_result.rung(5)
    assert row.key == "tf32"
    caps = detect_capabilities(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    if caps.tf32_ok:
        assert row.status in MEASURED and row.math_mode == "tf32"
    else:
        assert row.status == "not applicable here" and row.reason == caps.tf32_reason and row.samples_per_s is None
    assert all(r.math_mode == "fp32" for r in fake_result.rows[:5] if r.measured)   # strict fp32 before TF32


def test_speedups_and_ceiling_are_the_measured_ratios(fake_result):
    base = fake_result.rows[0].samples_per_s
    assert base == pytest.approx(10.0)
    for r in fake_result.rows:
        if r.measured:
            assert r.speedup_cumulative == pytest.approx(r.samples_per_s / base)
            ref = fake_result.rung(r.compared_to).samples_per_s if r.compared_to is not None else base
            assert r.speedup_rung == pytest.approx(r.samples_per_s / ref)
            assert r.fraction_of_ceiling == pytest.approx(r.samples_per_s / 200.0)
    assert fake_result.rung(7).speedup_rung == pytest.approx(1.5)
    assert fake_result.rung(6).speedup_rung == pytest.approx(0.1)
    assert fake_result.ceiling_samples_per_s == 200.0 and "rung 7's recipe" in fake_result.ceiling_note


def test_fixed_budget_and_startup_cost(fake_result, data):
    for r in fake_result.rows:
        if r.measured:
            assert r.samples_trained == len(data.train)             # budget: 1 epoch of 64 samples
            assert r.startup_s == pytest.approx(2.0 * r.step_time_s)   # one warm-up step at 3x the steady time
            assert 0.0 <= r.val_accuracy <= 1.0 and r.peak_mem_bytes == 1000
    assert fake_result.rung(1).lr == pytest.approx(scaled_lr(0.05, 8, 32))


def test_budget_gives_the_largest_batch_enough_optimizer_steps():
    """The H100 run gave batch 512 six steps (chance accuracy): the budget now guarantees min_optimizer_steps."""
    cfg = LadderConfig.full()
    assert budget_samples(cfg, 1438) == 30 * 512                    # digits: raised from 2 epochs (2876)
    assert budget_samples(cfg, 10_000) == 20_000                    # CIFAR-10 subset: 2 epochs already give 39
    assert budget_samples(LadderConfig.fast(), 1438) == 5 * 1438
    assert budget_samples(cfg, 100) == 30 * 64                      # only candidates the data allows count


def test_lr_warm_up_only_when_the_lr_was_scaled_up(data):
    from labkit.ladder.climb import lr_warmup_steps

    job = SimpleNamespace(config=LadderConfig.full())
    assert lr_warmup_steps(job, Recipe(batch_size=512), 30) == 6
    assert lr_warmup_steps(job, Recipe(batch_size=1), 30) == 0


def test_not_applicable_and_failing_rungs_are_reported(data, monkeypatch):
    monkeypatch.setattr(rungs.shutil, "which", lambda name: None)
    monkeypatch.setattr(rungs, "compiler_status", lambda device_type: (False, "no C++ compiler found"))
    res = run_ladder(smoke(skip=("ddp",), device="cpu"), model_fn=tiny_mlp, data=data, trainer=fake_trainer)
    assert res.rung(8).status == "not applicable here" and "C++ compiler" in res.rung(8).reason
    monkeypatch.undo()

    def broken_compile(model, loader, cfg, val_loader=None):
        if cfg.compile:
            raise RuntimeError("inductor exploded\nlong traceback")
        return fake_trainer(model, loader, cfg)

    monkeypatch.setattr(rungs, "compiler_status", lambda device_type: (True, "mocked"))
    res = run_ladder(smoke(skip=("ddp",)), model_fn=tiny_mlp, data=data, trainer=broken_compile)
    row = res.rung(8)
    assert row.status == "unsupported here" and row.reason == "RuntimeError: inductor exploded"
    assert row.samples_per_s is None and not row.kept


def test_ddp_plan_one_rank_per_gpu_with_mocked_devices(monkeypatch):
    assert ddp_plan(torch.device("cpu"), None, 2) == (2, "2 processes")
    assert "at least 2 processes" in ddp_plan(torch.device("cpu"), 1, 2)[1]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    world, why = ddp_plan(torch.device("cuda"), None, 16)
    assert world == 1 and "only 1 GPU(s)" in why
    world, why = ddp_plan(torch.device("cuda"), 2, 16)
    assert world == 1 and "not run on these GPUs" in why and "NCCL needs one GPU per rank" in why  # no CPU ranks
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert ddp_plan(torch.device("cuda"), None, 16) == (4, "4 processes")
    caps = Capabilities("cuda", 16, "bf16", True, "", 4, "", 4, True, "")
    recipe, why = propose("ddp", Recipe(batch_size=8), caps, 8)
    assert recipe.world_size == 4 and recipe.global_batch == 32 and "global batch 32" in why


def test_tf32_status_with_mocked_gpus(monkeypatch):
    assert rungs.tf32_status(torch.device("cpu"))[0] is False
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert rungs.tf32_status(torch.device("cuda")) == (True, "compute capability 9.0")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 0))
    ok, why = rungs.tf32_status(torch.device("cuda"))
    assert not ok and "Ampere" in why and "7.0" in why
    caps = Capabilities("cuda", 16, "bf16", True, "", 1, "", 4, True, "")
    assert propose("tf32", Recipe(batch_size=8), caps, 8)[0].tf32 is True


def test_fp32_math_sets_strict_or_tf32_and_restores():
    before = (torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision)
    with fp32_math(False):
        assert torch.backends.cudnn.conv.fp32_precision == "ieee" == torch.backends.cuda.matmul.fp32_precision
    with fp32_math(True):
        assert torch.backends.cudnn.conv.fp32_precision == "tf32" == torch.backends.cuda.matmul.fp32_precision
    assert (torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision) == before
    assert math_mode(Recipe(tf32=True), "cuda") == "tf32" and math_mode(Recipe(tf32=True), "cpu") == "fp32"
    assert math_mode(Recipe(tf32=True, amp_dtype="bf16"), "cuda") == "bf16"


def test_mfu_uses_the_peak_of_the_math_mode_run(monkeypatch):
    """The H100 showed 93% 'MFU' on fp32 rungs: the fp32 peak against TF32 math. Each mode has its own peak."""
    from labkit.ladder.measure import mfu_of

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    flops = 1e9
    assert mfu_of(flops, 67_000, "cuda", "fp32") == pytest.approx(1e9 * 67_000 / 67e12)
    assert mfu_of(flops, 67_000, "cuda", "tf32") == pytest.approx(1e9 * 67_000 / 494.5e12)
    assert mfu_of(flops, 67_000, "cpu", "fp32") is None


def test_verdict_judges_accuracy_against_rung_0():
    job = SimpleNamespace(config=LadderConfig.smoke())
    m = lambda sps, acc=0.9: Measurement(sps, 1.0, 0.0, None, None, acc, 0.0, 10, 100)  # noqa: E731
    assert verdict(job, m(110.0), 100.0, 1, 0.9)[::2] == ("faster", True)
    assert verdict(job, m(102.0), 100.0, 1, 0.9)[::2] == ("no clear gain", False)
    assert verdict(job, m(90.0), 100.0, 1, 0.9)[::2] == ("slower", False)
    status, reason, kept = verdict(job, m(150.0, acc=0.084), 100.0, 0, 0.972)     # the H100's rung 1
    assert status == "faster" and not kept and "below rung 0's 97.2%" in reason
    assert verdict(job, m(150.0, acc=0.885), 100.0, 1, 0.9)[2] is True          # within 2 points


def test_a_rung_that_loses_accuracy_is_not_carried(data):
    """Rung 1 learns nothing (chance) -> not carried; later rungs build on rung 0's batch 1."""
    def chance_at_large_batch(model, loader, cfg, val_loader=None):
        result = fake_trainer(model, loader, cfg)
        if int(next(iter(loader))[0].shape[0]) > 1:
            torch.nn.init.zeros_(model.net[-1].weight)
            torch.nn.init.zeros_(model.net[-1].bias)
        return result

    res = run_ladder(smoke(device="cpu"), model_fn=tiny_mlp, data=data, trainer=chance_at_large_batch)
    r0, r1 = res.rung(0), res.rung(1)
    if r1.val_accuracy < r0.val_accuracy - 0.02:
        assert not r1.kept and r1.accuracy_ok is False and res.rung(3).compared_to == 0
        assert res.best.rung != 1


def test_budget_arithmetic_and_summary():
    assert steps_for_budget(1000, 32, 4) == 31 and steps_for_budget(10, 32, 4) == 4
    recs = [SimpleNamespace(samples=4, step_time_s=t) for t in (1.0, 0.1, 0.2, 0.1)]
    res = SimpleNamespace(steps=recs, samples_per_s_median=99.0)
    sps, step_s, startup_s = summarise_run(res, warmup_steps=1, sync_every_step=True)
    assert sps == pytest.approx(12 / 0.4) and step_s == pytest.approx(0.4 / 3)
    assert startup_s == pytest.approx(1.0 - 0.4 / 3)
    assert summarise_run(res, 1, sync_every_step=False)[0] == 99.0                 # the loop's window rate


def test_reports_and_round_trip(fake_result, tmp_path):
    md = fake_result.to_markdown()
    assert md.startswith("Device: ") and "Mode:" in md and "(02_batch_size.ipynb)" in md and "Ceiling: 200.0" in md
    assert md.count("\n| ") == 1 + len(RUNGS)                                      # header + one line per rung
    assert "not carried forward" in md and "skipped" in md
    doc = json.loads(fake_result.to_json())
    assert [r["rung"] for r in doc["rows"]] == list(range(len(RUNGS)))
    assert doc["rows"][8]["samples_per_s"] is None and doc["ceiling_samples_per_s"] == 200.0
    json_path, md_path = fake_result.save(tmp_path / "out")
    back = LadderResult.from_dict(json.loads(json_path.read_text()))
    assert back.to_markdown() == fake_result.to_markdown() and "notebooks/" in md_path.read_text()
    import matplotlib.pyplot as plt

    fig = fake_result.plot()
    assert len(fig.axes) == 2
    plt.close(fig)
    assert list(fake_result.to_dataframe().index) == list(range(len(RUNGS)))


@pytest.mark.parametrize("kwargs, match", [
    ({"model": "vgg"}, "model must be one of"),
    ({"budget_epochs": 0}, "budget_epochs must be an integer >= 1, got 0"),
    ({"min_optimizer_steps": 0}, "min_optimizer_steps must be an integer >= 1"),
    ({"batch_candidates": ()}, "batch_candidates"),
    ({"batch_candidates": (8, 0)}, "batch_candidates"),
    ({"skip": ("naive",)}, "rung 0 is the baseline"),
    ({"skip": ("warp_drive",)}, "skip may name"),
    ({"lr": -1.0}, "lr must be > 0"),
    ({"min_gain": 1.5}, "min_gain"),
    ({"num_workers": -1}, "num_workers must be an integer >= 0"),
    ({"ddp_world_size": 0}, "ddp_world_size must be an integer >= 1"),
])
def test_config_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LadderConfig(**kwargs)


def test_bad_candidates_give_one_clear_error(data):
    with pytest.raises(ValueError, match="no batch in batch_candidates"):
        run_ladder(smoke(batch_candidates=(1000,)), model_fn=tiny_mlp, data=data, trainer=fake_trainer)


def test_real_loop_end_to_end(data):
    """The real instrumented loop (and the real device-resident loader) on a tiny MLP."""
    res = run_ladder(smoke(skip=("compile", "ddp", "input_pipeline"), measure_ceiling=True), model_fn=tiny_mlp,
                     data=data)
    for r in res.rows:
        if r.measured:
            assert r.samples_per_s > 0 and math.isfinite(r.step_time_s) and 0 <= r.val_accuracy <= 1
            assert r.speedup_cumulative == pytest.approx(r.samples_per_s / res.rung(0).samples_per_s)
    assert res.rung(1).batch_size in (2, 8, 16) and res.rung(3).status in MEASURED
    assert res.ceiling_samples_per_s > 0


def test_ddp_rung_on_two_gloo_processes(data):
    """The DDP rung for real: two gloo processes, global batch and LR scaled, accuracy read on rank 0."""
    caps = Capabilities("cpu", 2, "bf16", False, "", 2, "", 1)
    job = LadderJob(smoke(device="cpu"), tiny_mlp, data, "cpu", caps, make_loader(data.val, 16), 64)
    m = measure_recipe(job, Recipe(batch_size=8, world_size=2))
    assert m.samples_trained == 64 and m.steps == 4 and m.samples_per_s > 0 and 0 <= m.val_accuracy <= 1


def test_best_ignores_rungs_that_lost_accuracy(fake_result):
    from dataclasses import replace

    rows = list(fake_result.rows)
    rows[9] = replace(rows[7], rung=9, key="ddp", samples_per_s=1e6, accuracy_ok=False)
    assert LadderResult(rows, "cpu", "fast", "mlp", "synthetic", 64).best.key == "channels_last"
    rows[9] = replace(rows[9], accuracy_ok=True)
    assert LadderResult(rows, "cpu", "fast", "mlp", "synthetic", 64).best.rung == 9


# ------------------------------------------------------------------ the command line: every bad input up front
def cli_error(argv, capsys, monkeypatch) -> tuple[int, str]:
    """Run `python -m labkit ARGV` in-process with the ladder itself forbidden; (exit code, stderr)."""
    import labkit.ladder.config

    monkeypatch.setattr(labkit.ladder.config, "run_ladder", lambda *a, **k: pytest.fail("the ladder ran before the check"))
    try:
        code = cli.main(argv)
    except SystemExit as exit_:
        code = exit_.code
    return code, capsys.readouterr().err


def test_cli_out_is_checked_before_the_run(tmp_path, capsys, monkeypatch):
    a_file = tmp_path / "ladder.json"
    a_file.write_text("{}")
    assert cli_error(["ladder", "--out", str(a_file)], capsys, monkeypatch) == (
        2, f"error: --out {a_file} is a file, not a directory; give a directory for ladder.json and ladder.md, "
           "e.g. --out runs/ladder\n")
    bad = a_file / "sub"
    assert cli_error(["ladder", "--out", str(bad)], capsys, monkeypatch) == (
        2, f"error: --out {bad} is not a writable directory (Not a directory); give a directory you can write to, "
           "e.g. --out runs/ladder\n")


def test_cli_ddp_world_size_is_checked_before_the_run(capsys, monkeypatch, tmp_path):
    import labkit.core.env

    monkeypatch.setattr(labkit.core.env, "cpu_count", lambda: 2)
    assert cli_error(["ladder", "--device", "cpu", "--ddp-world-size", "100000", "--out", str(tmp_path)],
                     capsys, monkeypatch) == (
        2, "error: --ddp-world-size must be an integer between 1 and 8, got 100000; gloo runs at most 4 processes "
           "per CPU core and this machine has 2 core(s)\n")
    monkeypatch.setattr(labkit.core.env, "get_device", lambda device=None: torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    code, err = cli_error(["ladder", "--ddp-world-size", "2", "--out", str(tmp_path)], capsys, monkeypatch)
    assert (code, err) == (2, "error: --ddp-world-size must be an integer between 1 and 1, got 2; NCCL runs one "
                              "process per GPU and this machine has 1\n")


def test_cli_batch_sizes_take_commas_like_sweep(capsys, monkeypatch):
    code, err = cli_error(["ladder", "--batch-sizes", "16 32"], capsys, monkeypatch)
    assert code == 2 and err.strip().endswith("argument --batch-sizes: expected a positive integer (1, 2, 3, ...), "
                                              "got '16 32'")
    from labkit.cli.ladder import config_from_args

    args = cli.build_parser().parse_args(["ladder", "--model", "mlp", "--batch-sizes", "4,8", "--skip", "compile",
                                          "ddp", "--budget-epochs", "2"])
    cfg = config_from_args(args)
    assert (cfg.model, cfg.batch_candidates, cfg.skip, cfg.budget_epochs) == ("mlp", (4, 8), ("compile", "ddp"), 2)


def test_cli_writes_json_and_markdown(tmp_path, capsys):
    code = cli.main(["ladder", "--out", str(tmp_path), "--model", "mlp", "--dataset", "digits", "--train-limit", "32",
                     "--budget-epochs", "1", "--batch-sizes", "4,8", "--device", "cpu", "--no-progress", "--skip",
                     "input_pipeline", "device_data", "no_sync", "mixed_precision", "channels_last", "compile", "ddp"])
    assert code == 0
    doc = json.loads((tmp_path / "ladder.json").read_text())
    assert doc["rows"][1]["status"] in MEASURED and doc["dataset"] == "digits"
    assert (tmp_path / "ladder.md").read_text().startswith("Device:")
    assert "wrote" in capsys.readouterr().out
