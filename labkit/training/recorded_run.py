"""The figures of the one recorded H100 run, computed from its fixtures instead of typed into prose.

A notebook that makes a point with the November 2026 H100 run (``data/recorded_h100_reference.json`` and the
ladder it recorded, ``data/recorded_h100_ladder.json``, both listed in ``data/manifest.json``) calls :func:`recorded_h100_figures` and prints the
numbers with the label :attr:`RecordedH100Figures.label`, so a recorded figure is never mistaken for one measured now.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from labkit.core.data import verify_data_file
from labkit.training.flops import find_peak
from labkit.memory.checks import recorded_reference

RECORDED_LADDER_FILE = "recorded_h100_ladder.json"             # under data/, listed in data/manifest.json
RECORDED_LOOP_OVERHEAD_FILE = "recorded_h200_loop_overhead.json"
GPU_RESIDENT_LOADER = "GPU-resident tensors, index_select per batch"


@dataclass(frozen=True)
class RecordedH100Figures:
    """The recorded run's headline numbers: loaders, TF32's gain, the old ladder's MFU, data wait and accuracy."""

    device: str
    torch_version: str
    dataloader_samples_per_s: tuple[float, float]     # (slowest, fastest) DataLoader configuration
    gpu_resident_samples_per_s: float                 # index_select on tensors already on the GPU
    tf32_batch: int
    strict_fp32_samples_per_s: float                  # ResNet-18, GPU-resident data, TF32 off
    tf32_samples_per_s: float                         # the same with TF32 on
    fp32_rung_mfu_vs_fp32_peak: tuple[float, float]   # (min, max) of the old ladder's fp32 rungs, wrong peak
    fp32_rung_mfu_vs_tf32_peak: tuple[float, float]   # the same rungs against the peak of the math that ran
    loader_rung_data_wait: tuple[float, float]        # (min, max) data-wait fraction of the DataLoader rungs
    naive_val_accuracy: float                         # rung 0, batch 1
    batch_rung_val_accuracy: float                    # rung 1 (batch 512) after the old budget
    batch_rung_batch_size: int
    batch_rung_optimizer_steps: int                   # the old budget's steps at rung 1's batch (rounded up)
    best_rung_samples_per_s: float                    # the old ladder's fastest rung (DataLoader-fed)
    ceiling_samples_per_s: float                      # the same model on batches already on the GPU

    @property
    def tf32_speedup(self) -> float:
        """TF32 over strict fp32 on the same model and batch."""
        return self.tf32_samples_per_s / self.strict_fp32_samples_per_s

    @property
    def label(self) -> str:
        """Said next to every recorded figure: where and with what it was recorded."""
        return f"recorded on an {self.device}, torch {self.torch_version}, November 2026 (not measured now)"


def recorded_ladder(path: str | Path | None = None) -> dict:
    """The tuning ladder recorded on the H100 (rows as ``labkit.ladder`` writes them)."""
    if path is None:
        path = verify_data_file(RECORDED_LADDER_FILE)
    elif not Path(path).is_file():
        raise FileNotFoundError(f"no recorded ladder at {path}; leave path= out to read the kit's own "
                                f"(data/{RECORDED_LADDER_FILE})")
    return json.loads(Path(path).read_text())


def _span(values: list[float]) -> tuple[float, float]:
    """(min, max) of a non-empty list."""
    return (min(values), max(values))


def _tf32_pair(reference: dict) -> tuple[int, float, float]:
    """(batch, strict fp32, TF32) samples/s of the plain recipe at the largest batch recorded both ways."""
    plain = [r for r in reference["throughput_gpu_resident"] if not r["amp"] and not r["cl"] and not r.get("compiled")]
    by_key = {(r["batch"], r["tf32"]): r["samples_per_s"] for r in plain}
    both = sorted(b for b, tf32 in by_key if tf32 and (b, False) in by_key)
    batch = 512 if 512 in both else both[-1]
    return batch, by_key[(batch, False)], by_key[(batch, True)]


def _ladder_figures(ladder: dict, device: str) -> dict:
    """MFU of the fp32 rungs against both peaks, the DataLoader rungs' wait, rung 0's and rung 1's accuracy."""
    rows = {r["rung"]: r for r in ladder["rows"]}
    measured = [r for r in ladder["rows"] if r["samples_per_s"] is not None]
    fp32_rungs = [r for r in measured if r["math_mode"] == "tf32" and r["rung"] > 0]   # "fp32" rungs, cuDNN's TF32
    peaks = find_peak(device).peak_flops_per_s
    return dict(fp32_rung_mfu_vs_tf32_peak=_span([r["mfu"] for r in fp32_rungs]),
                fp32_rung_mfu_vs_fp32_peak=_span([r["mfu"] * peaks["tf32"] / peaks["fp32"] for r in fp32_rungs]),
                loader_rung_data_wait=_span([r["data_wait_fraction"] for r in measured if r["rung"] > 0]),
                naive_val_accuracy=rows[0]["val_accuracy"], batch_rung_val_accuracy=rows[1]["val_accuracy"],
                batch_rung_batch_size=rows[1]["batch_size"],
                batch_rung_optimizer_steps=-(-ladder["budget_samples"] // rows[1]["batch_size"]),
                best_rung_samples_per_s=max(r["samples_per_s"] for r in measured),
                ceiling_samples_per_s=ladder["ceiling_samples_per_s"])


def recorded_h100_figures(reference_path: str | Path | None = None,
                          ladder_path: str | Path | None = None) -> RecordedH100Figures:
    """The recorded H100 run's figures, computed from its two fixtures."""
    ref, ladder = recorded_reference(reference_path), recorded_ladder(ladder_path)
    loaders = {r["loader"]: r["samples_per_s"] for r in ref["loader"]}
    resident = loaders.pop(GPU_RESIDENT_LOADER)
    batch, fp32, tf32 = _tf32_pair(ref)
    return RecordedH100Figures(device=ref["device"], torch_version=ref["torch"],
                               dataloader_samples_per_s=_span(list(loaders.values())),
                               gpu_resident_samples_per_s=resident, tf32_batch=batch,
                               strict_fp32_samples_per_s=fp32, tf32_samples_per_s=tf32,
                               **_ladder_figures(ladder, ref["device"]))


_TIMED = {"phases": "per phase (data wait, copy, forward, backward, update)", "step": "whole steps only"}


def instrument_note(result: object) -> str:
    """Which instrument timed ``result`` (a :class:`labkit.training.loop.RunResult`) and what each costs over a bare
    loop on a GPU, from the recorded H200 run (``data/recorded_h200_loop_overhead.json``), labelled as
    recorded: a launch-bound step pays for every event the loop records."""
    timed = result.extra.get("timed", "phases")
    doc = json.loads(verify_data_file(RECORDED_LOOP_OVERHEAD_FILE).read_text())
    costs = "; ".join(f"{r['model']} at batch {r['batch_size']} ({1e3 * r['bare_step_s']:.1f} ms a step): per phase "
                      f"{r['ratio'] - 1:+.1%}, whole steps {r['step_timing_ratio'] - 1:+.1%}" for r in doc["rows"])
    return (f"this run was timed {_TIMED[timed]} ({result.extra.get('timing', '?')} clock). Recorded, not measured "
            f"now ({doc['device']}, 27 November 2026), over a bare loop: {costs}. On a CPU the marks are clock reads, "
            "nearly free; on a launch-bound GPU step pass TrainConfig(timing='step') to time whole steps only.")
