"""Memory model vs a measured training step: on CUDA real second-step peaks, on CPU independent counts.

    .venv/bin/python benchmarks/memory_check.py --json runs/memory_check.json

On a GPU: ResNet-18 and the small CNN, batch 16-1024, fp32 and bf16 autocast, SGD (momentum) and Adam;
each row's ``error_pct`` is (predicted - measured) / measured with measured = the second step's peak
allocated minus what other code held (:func:`labkit.memory.checks.measure_step_memory`) and
predicted = the model plus each layer's cuDNN workspace, measured layer by layer at that batch
(:func:`labkit.memory.workspaces.measure_workspaces`; ``workspace_bytes`` is what it adds to the peak,
``predicted_without_workspace_bytes`` the model alone). On a CPU it
checks activations and optimizer state against counts made without the model's hook, and the recorded
H100 rows (data/recorded_h100_reference.json).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import labkit  # noqa: F401  (before torch: sizes its threads to the CPUs this process may use)
import torch

from labkit.core.models import build_model
from labkit.memory.checks import check_on_cpu, compare_with_reference, measure_step_memory, recorded_reference
from labkit.memory.host import release_cpu_memory
from labkit.memory.model import build_memory_model
from labkit.memory.workspaces import measure_workspaces

MODELS, BATCHES, DTYPES, OPTIMIZERS = ("resnet18", "small_cnn"), (16, 64, 256, 1024), ("fp32", "bf16"), ("sgd", "adam")


def _optimizer(model, name: str):
    return torch.optim.Adam(model.parameters()) if name == "adam" else torch.optim.SGD(model.parameters(), lr=0.01,
                                                                                      momentum=0.9)


def gpu_rows(device: torch.device) -> list[dict]:
    """One real measurement per model x optimizer x dtype x batch."""
    rows = []
    for name in MODELS:
        for opt_name in OPTIMIZERS:
            for dtype in DTYPES:
                amp = "bf16" if dtype == "bf16" else None
                mm = build_memory_model(build_model(name), (3, 32, 32), opt_name, 0.9, amp)
                for bs in BATCHES:
                    model = build_model(name).to(device)
                    opt = _optimizer(model, opt_name)
                    x = torch.randn(bs, 3, 32, 32, device=device)
                    y = torch.randint(0, 10, (bs,), device=device)
                    pred = mm.predict(bs, workspaces=measure_workspaces(model, (3, 32, 32), bs, amp))
                    got = measure_step_memory(model, opt, x, y, amp)
                    predicted = pred.total_bytes
                    rows.append(dict(model=name, batch_size=bs, dtype=dtype, optimizer=opt_name,
                                     predicted_bytes=int(predicted), measured_bytes=got.step_peak_bytes,
                                     workspace_bytes=pred.workspace_bytes,
                                     predicted_without_workspace_bytes=int(predicted - pred.workspace_bytes),
                                     reserved_bytes=got.peak_reserved_bytes,
                                     error_pct=round(100 * (predicted - got.step_peak_bytes) / got.step_peak_bytes, 2)))
                    del model, opt, x, y
                    torch.cuda.empty_cache()
    return rows


def cpu_rows() -> list[dict]:
    """Activations and optimizer state at an unseen batch (24) against hook-free counts."""
    rows = []
    for name in MODELS:
        for opt_name in OPTIMIZERS:
            torch.manual_seed(0)
            model = build_model(name)
            mm = build_memory_model(model, (3, 32, 32), opt_name, 0.9)
            check = check_on_cpu(model, mm, _optimizer(model, opt_name), (3, 32, 32), batch_size=24)
            rows.append(dict(model=name, batch_size=24, dtype="fp32", optimizer=opt_name,
                             predicted_bytes=check.predicted_activation_bytes + check.predicted_optimizer_bytes,
                             measured_bytes=check.counted_activation_bytes + check.counted_optimizer_bytes,
                             reserved_bytes=None,
                             error_pct=round(max(check.activation_error_pct, check.optimizer_error_pct, key=abs), 4)))
            del model
            release_cpu_memory()
    return rows


def recorded_rows() -> list[dict]:
    """Today's model (built on this CPU; shapes are the same) against the recorded H100 peaks, batch 16-1024."""
    return [r for r in compare_with_reference(recorded_reference()["memory"]) if r["batch_size"] in BATCHES]


def _print_rows(rows: list[dict]) -> None:
    for r in rows:
        print(f"{r['model']:>9} b{r['batch_size']:<5} {r['dtype']} {r['optimizer']:<4} predicted "
              f"{r['predicted_bytes'] / 1e6:9.1f} MB  measured {r['measured_bytes'] / 1e6:9.1f} MB  "
              f"{r['error_pct']:+.2f}%" + (f"  (cuDNN workspace +{r['workspace_bytes'] / 1e6:.1f} MB)"
                                           if r.get("workspace_bytes") else ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args(argv)
    if torch.cuda.is_available():
        device = torch.device("cuda")
        report = {"device": torch.cuda.get_device_name(device), "rows": gpu_rows(device)}
    else:
        report = {"device": "cpu (independent counts; GPU rows below are the recorded H100 reference)",
                  "rows": cpu_rows(), "recorded_h100_rows": recorded_rows()}
    report["max_abs_error_pct"] = max(abs(r["error_pct"]) for r in report["rows"])
    _print_rows(report["rows"])
    print(f"device: {report['device']}; max |error| {report['max_abs_error_pct']:.2f}%")
    if "recorded_h100_rows" in report:
        recorded = report["recorded_h100_rows"]
        report["recorded_max_abs_error_pct"] = max(abs(r["error_pct"]) for r in recorded)
        print("\nrecorded H100 peaks (baseline subtracted) vs this model:")
        _print_rows(recorded)
        within = sum(abs(r["error_pct"]) <= 5 for r in recorded)
        print(f"recorded H100 rows: {within} of {len(recorded)} within 5%; max |error| "
              f"{report['recorded_max_abs_error_pct']:.2f}% (the misses are fp32 rows whose cuDNN convolution "
              "workspace no shape shows; on a GPU this script measures it per layer and adds it)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
