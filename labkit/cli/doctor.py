"""`labkit doctor`: the headless first look at this machine, and what the kit will do on it.

The torch-using parts of the kit (mode, devices, dataset, MPI) are imported inside :func:`collect`: every
subcommand module is imported to build the parser, and `labkit --help` must not load torch.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import sys
from dataclasses import asdict, dataclass, field

from labkit.cli.common import subparser
from labkit.core import machine

MODE_ENV_VAR = "LABKIT_MODE"    # labkit.core.env.MODE_ENV_VAR, named here without importing torch

FIX = "run `make lab` (or `pip install -r requirements.txt -e .`) in the repository root"
# (distribution name, import name, why the kit needs it)
REQUIRED = (
    ("torch", "torch", "every lab"), ("torchvision", "torchvision", "ResNet-18 and CIFAR-10"),
    ("numpy", "numpy", "every lab"), ("tqdm", "tqdm", "progress bars"), ("psutil", "psutil", "CPU/RAM readings"),
    ("matplotlib", "matplotlib", "plots"), ("ipywidgets", "ipywidgets", "dashboards"),
    ("jupyterlab", "jupyterlab", "the lab itself"),
)
# without these the kit still runs: the lessons that need one print NOT CHECKED with the reason
OPTIONAL = (
    ("tensorflow-cpu", "tensorflow", "the TensorFlow halves of 02, 03, 04, 08 and 09"),
    ("pandas", "pandas", "DataFrame tables"), ("nvidia-ml-py", "pynvml", "GPU utilization sampling"),
    ("mpi4py", "mpi4py", "the MPI lane (`pip install -e .[mpi]`)"),
    ("traceinsight", "hta", "Holistic Trace Analysis of GPU traces (successor of HolisticTraceAnalysis)"),
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
    data_dir: str = ""
    data_problem: str = ""   # labkit.core.data's own message (what is wrong; what to do), "" when the data is usable
    extras: dict[str, str] = field(default_factory=dict)
    env_problems: list[str] = field(default_factory=list)   # labkit.core.envcheck's findings, one line each
    run_dir: str = ""
    run_dir_problem: str = ""  # why `sweep`, `profile` and `ladder` could not save there, "" when writable
    terminal_encoding: str = ""

    @property
    def ok(self) -> bool:
        return not self.missing_required and not self.data_problem and not self.env_problems \
            and not self.run_dir_problem


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


def data_problem() -> str:
    """"" when the data folder holds the manifest and the shipped digits with their checksum, else what to do."""
    from labkit.core import data

    try:
        data.verify_data_file(data.DIGITS_FILE)   # checks the folder (check_data_dir), then the file's SHA-256
    except data.DataUnavailableError as err:
        return str(err)
    return ""


def run_dir_problem() -> tuple[str, str]:
    """(the run folder, "" or why the commands that save traces and reports cannot write there), proven by writing."""
    from labkit.core.envcheck import RUN_DIR_VAR, writable_place_problem
    from labkit.core.rundirs import run_root

    root = run_root()
    why = writable_place_problem(root)
    return str(root), (f"the run folder {root} {why}; `sweep`, `profile` and `ladder` save there; "
                       f"export {RUN_DIR_VAR}=/a/folder/you/can/write" if why else "")


def collect(check_network: bool = True) -> Report:
    """Gather the report; ``check_network=False`` skips the dataset download probe."""
    from labkit.comm.mpi import mpi_info
    from labkit.core import data, device, env
    from labkit.core.envcheck import environment_problems

    env_problems = environment_problems()
    run_dir, run_problem = run_dir_problem()
    packages = {dist: _version(dist, mod) for dist, mod, _ in REQUIRED + OPTIONAL}
    missing = [f"{dist} (needed for {why})" for dist, _, why in REQUIRED if packages[dist] is None]
    try:
        mode = env.get_mode()
    except ValueError:      # listed in env_problems; the kit would refuse to run, so say which mode it falls back to
        mode = env.get_mode({})
    if check_network:
        dataset, reason = data.resolve_dataset()
    else:
        dataset, reason = ("cifar10", "cached") if data.cifar10_cached() else ("digits", "network not checked")
    return Report(
        extras={"MPI": str(mpi_info())},
        python=sys.version.split()[0], platform=platform.platform(), packages=packages, missing_required=missing,
        cpu_cores=machine.cpu_count(), ram_bytes=machine.total_ram_bytes(),
        gpus=[asdict(g) for g in device.gpu_info()], nccl=device.nccl_available(),
        mode=mode.name, mode_reason=mode.reason, dataset=dataset, dataset_reason=reason,
        cifar10_cached=data.cifar10_cached(), data_dir=str(data.DATA_DIR), data_problem=data_problem(),
        env_problems=env_problems, run_dir=run_dir, run_dir_problem=run_problem,
        terminal_encoding=getattr(sys.stdout, "encoding", None) or "unknown",
    )


def format_report(report: Report) -> str:
    """The report as the readable text `doctor` prints."""
    gib = 1024 ** 3
    lines = ["Training Performance Lab — doctor", "", f"Python       {report.python} on {report.platform}"]
    optional_why = {dist: why for dist, _, why in OPTIONAL}
    for name, version in report.packages.items():
        absent = f"missing (optional: {optional_why[name]})" if name in optional_why else "missing"
        lines.append(f"{name:<22} {version or absent}")
    lines += ["", f"CPU          {report.cpu_cores} cores, {report.ram_bytes / gib:.1f} GiB RAM",
              f"GPUs         {len(report.gpus)}"]
    for g in report.gpus:
        cc = ".".join(map(str, g["compute_capability"]))
        lines.append(f"  cuda:{g['index']}      {g['name']}, {g['memory_bytes'] / gib:.1f} GiB, "
                     f"compute capability {cc}")
    lines.append(f"NCCL         {'available' if report.nccl else 'not available (gloo is used for torch.distributed)'}")
    for name, value in report.extras.items():
        lines.append(f"{name:<12} {value}")
    lines += ["", f"Mode         {report.mode} — {report.mode_reason}",
              f"             (set {MODE_ENV_VAR}=fast or {MODE_ENV_VAR}=full to force)",
              f"Dataset      {report.dataset} — {report.dataset_reason}",
              f"CIFAR-10     {'cached in data/' if report.cifar10_cached else 'not cached'}",
              f"Data folder  {report.data_dir} — {'a problem (below)' if report.data_problem else 'verified'}",
              f"Run folder   {report.run_dir} — {'a problem (below)' if report.run_dir_problem else 'writable'}",
              f"Terminal     {report.terminal_encoding}{_encoding_note(report.terminal_encoding)}", ""]
    if report.ok:
        lines.append("All required pieces are present.")
    if report.missing_required:
        lines.append("MISSING: " + "; ".join(report.missing_required))
        lines.append(f"Fix: {FIX}")
    lines += [f"ENVIRONMENT PROBLEM: {problem}" for problem in report.env_problems]
    if report.data_problem:  # data's messages read "what is wrong; what to do"
        problem, _, fix = report.data_problem.partition("; ")
        lines.append(f"DATA PROBLEM: {problem}")
        lines += [f"Fix: {fix}"] if fix else []
    if report.run_dir_problem:
        problem, _, fix = report.run_dir_problem.partition("; export ")
        lines += [f"RUN FOLDER PROBLEM: {problem}", f"Fix: export {fix}"]
    return "\n".join(lines)


def _encoding_note(encoding: str) -> str:
    """'' for a UTF-8 terminal, else what the commands do about it (labkit.cli.main replaces what it cannot show)."""
    if encoding.lower().replace("-", "").replace("_", "") in ("utf8", "utf8sig"):
        return ""
    return (" (not UTF-8: the characters it cannot show print as '?'; for the real ones "
            "`export PYTHONIOENCODING=utf-8` or use a UTF-8 locale)")


def run(args: argparse.Namespace) -> int:
    """Print the doctor report (or JSON); exit 1 when a required package is missing or the data folder is unusable, 2 when a variable is wrong."""
    report = collect(check_network=not args.no_network)
    if args.json:
        print(json.dumps({**asdict(report), "ok": report.ok}, indent=2))
    else:
        print(format_report(report))
    for problem in report.env_problems:   # as every other subcommand refuses it: named on stderr, exit 2
        print(f"error: {problem}", file=sys.stderr)
    return 2 if report.env_problems else 0 if report.ok else 1


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `doctor`."""
    p = subparser(sub, "doctor", help="report versions, devices, mode and dataset",
                  description="Report versions, devices, the kit's mode and the dataset it will use.",
                  examples=["labkit doctor", "labkit doctor --json"])
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--no-network", action="store_true", help="do not probe whether CIFAR-10 can be downloaded")
    p.set_defaults(func=run)
