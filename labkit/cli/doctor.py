"""`python -m labkit doctor`: the headless first look at this machine, and what the kit will do on it."""
from __future__ import annotations

import importlib.util
import platform
import sys
from dataclasses import asdict, dataclass, field

from labkit.core import data
from labkit.core import device, env, machine

FIX = "run `make lab` (or `pip install -r requirements.txt -e .`) in the repository root"
# (distribution name, import name, why the kit needs it)
REQUIRED = (
    ("torch", "torch", "every lab"), ("torchvision", "torchvision", "ResNet-18 and CIFAR-10"),
    ("numpy", "numpy", "every lab"), ("tqdm", "tqdm", "progress bars"), ("psutil", "psutil", "CPU/RAM readings"),
    ("matplotlib", "matplotlib", "plots"), ("ipywidgets", "ipywidgets", "dashboards"),
    ("jupyterlab", "jupyterlab", "the lab itself"), ("tensorflow-cpu", "tensorflow", "TensorFlow labs (03, 04, 08, 09)"),
)
OPTIONAL = (
    ("pandas", "pandas", "DataFrame tables"), ("nvidia-ml-py", "pynvml", "GPU utilization sampling"),
    ("mpi4py", "mpi4py", "the MPI lane (`pip install -e .[mpi]`)"),
    ("HolisticTraceAnalysis", "hta", "trace analysis on GPUs"),
)


@dataclass
class Report:
    """Everything the doctor found, as plain data (so `--json` and tests can use it)."""

    python: str
    platform: str
    packages: dict[str, str | None]
    missing_required: list[str]
    cpu_cores: int
    ram_bytes: int
    gpus: list[dict] = field(default_factory=list)
    nccl: bool = False
    mode: str = ""
    mode_reason: str = ""
    dataset: str = ""
    dataset_reason: str = ""
    cifar10_cached: bool = False
    extras: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.missing_required


def _version(dist: str, module: str) -> str | None:
    version = machine.package_version(dist)
    if version is None and dist == "tensorflow-cpu":
        version = machine.package_version("tensorflow")
    # torch/torchvision are imported for real (a mismatched pair fails only on import); the rest by spec
    if version is not None and module in ("torch", "torchvision") and not machine.module_importable(module):
        return None
    if version is not None and importlib.util.find_spec(module) is None:
        return None
    return version


def collect(check_network: bool = True) -> Report:
    """Gather the report; ``check_network=False`` skips the dataset download probe."""
    packages = {dist: _version(dist, mod) for dist, mod, _ in REQUIRED + OPTIONAL}
    missing = [f"{dist} (needed for {why})" for dist, _, why in REQUIRED if packages[dist] is None]
    mode = env.get_mode()
    if check_network:
        dataset, reason = data.resolve_dataset()
    else:
        dataset, reason = ("cifar10", "cached") if data.cifar10_cached() else ("digits", "network not checked")
    from labkit.comm.mpi import mpi_info

    return Report(
        extras={"MPI": str(mpi_info())},
        python=sys.version.split()[0], platform=platform.platform(), packages=packages, missing_required=missing,
        cpu_cores=machine.cpu_count(), ram_bytes=machine.total_ram_bytes(),
        gpus=[asdict(g) for g in device.gpu_info()], nccl=device.nccl_available(),
        mode=mode.name, mode_reason=mode.reason, dataset=dataset, dataset_reason=reason,
        cifar10_cached=data.cifar10_cached(),
    )


def format_report(report: Report) -> str:
    """The report as the readable text `doctor` prints."""
    gib = 1024 ** 3
    lines = ["Training Performance Lab — doctor", "", f"Python       {report.python} on {report.platform}"]
    for name, version in report.packages.items():
        lines.append(f"{name:<22} {version or 'missing'}")
    lines += ["", f"CPU          {report.cpu_cores} cores, {report.ram_bytes / gib:.1f} GiB RAM",
              f"GPUs         {len(report.gpus)}"]
    for g in report.gpus:
        cc = ".".join(map(str, g["compute_capability"]))
        lines.append(f"  cuda:{g['index']}      {g['name']}, {g['memory_bytes'] / gib:.1f} GiB, compute capability {cc}")
    lines.append(f"NCCL         {'available' if report.nccl else 'not available (gloo is used for torch.distributed)'}")
    for name, value in report.extras.items():
        lines.append(f"{name:<12} {value}")
    lines += ["", f"Mode         {report.mode} — {report.mode_reason}",
              f"             (set {env.MODE_ENV_VAR}=fast or {env.MODE_ENV_VAR}=full to force)",
              f"Dataset      {report.dataset} — {report.dataset_reason}",
              f"CIFAR-10     {'cached in data/' if report.cifar10_cached else 'not cached'}", ""]
    if report.ok:
        lines.append("All required pieces are present.")
    else:
        lines.append("MISSING: " + "; ".join(report.missing_required))
        lines.append(f"Fix: {FIX}")
    return "\n".join(lines)
