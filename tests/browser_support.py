"""Helpers for the real-browser test: a throwaway JupyterLab server and headless Chromium via Playwright.

The server runs from this Python environment on 127.0.0.1 with a random token, on a free port, with its
config, runtime, settings and workspace folders in a temporary directory. Notebooks are copied into a
temporary root, so running them in the browser never writes outputs into the repository's notebooks.
`stop_lab` shuts kernels and the server down and kills anything left, whatever happened in the test.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import psutil

from labkit.comm.stop import wait_vanished

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage")
WIDGETS_EXTENSION = "@jupyter-widgets/jupyterlab-manager"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
# What a widget looks like when the widget manager failed to show it (ipywidgets 8 / jupyterlab_widgets 3).
FALLBACK_TEXTS = ("Loading widget...", "Error displaying widget", "model not found", "Failed to load model class",
                  "Could not create view", "Could not create a view")
# JupyterLab user settings for an unattended session: every cell in the DOM (no windowing), no autosave,
# no news or update pop-ups over the notebook.
LAB_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false",
                                                                         "checkForUpdates": False},
}
NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?")


def find_chromium() -> str | None:
    """Path of the system Chromium (Debian's `chromium` package), or None when it is not installed."""
    for path in CHROMIUM_CANDIDATES:
        if os.access(path, os.X_OK):
            return path
    return shutil.which("chromium")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_is_free(port: int) -> bool:
    """True when a server could bind `port` on 127.0.0.1 again (nothing listening, no lingering socket)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@dataclass
class LabServer:
    """A running JupyterLab server started by `start_lab`."""

    proc: subprocess.Popen
    port: int
    token: str
    root_dir: Path
    log_path: Path
    runtime_dir: str
    stopped: bool = False

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, path: str) -> str:
        """Absolute URL of `path` on this server, with the token."""
        sep = "&" if "?" in path else "?"
        return f"{self.base_url}/{path.lstrip('/')}{sep}token={self.token}"

    def api(self, path: str, method: str = "GET") -> object:
        """Call the server's REST API and return the decoded JSON (None for empty replies)."""
        req = urllib.request.Request(self.base_url + path, method=method,
                                     headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            body = resp.read()
        return json.loads(body) if body else None

    def log_tail(self, chars: int = 3000) -> str:
        """The end of the server's log (for failure messages)."""
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def _write_lab_settings(work_dir: Path) -> dict[str, str]:
    """Create private Jupyter folders under `work_dir`; return the environment variables that point at them."""
    dirs = {name: work_dir / name for name in ("config", "runtime", "settings", "workspaces", "ipython")}
    for path in dirs.values():
        path.mkdir(parents=True, exist_ok=True)
    for rel, values in LAB_SETTINGS.items():
        target = dirs["settings"] / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(values))
    return {"JUPYTER_CONFIG_DIR": str(dirs["config"]), "JUPYTER_RUNTIME_DIR": str(dirs["runtime"]),
            "JUPYTERLAB_SETTINGS_DIR": str(dirs["settings"]), "JUPYTERLAB_WORKSPACES_DIR": str(dirs["workspaces"]),
            "IPYTHONDIR": str(dirs["ipython"]), "JUPYTER_PLATFORM_DIRS": "1"}


def start_lab(root_dir: Path, work_dir: Path, *, env_extra: dict[str, str] | None = None,
              timeout_s: float = 90.0) -> LabServer:
    """Start JupyterLab on a free localhost port with a random token and wait until it answers."""
    port, token = free_port(), secrets.token_hex(24)
    env = {**os.environ, **_write_lab_settings(work_dir), **(env_extra or {})}
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root_dir}",
           "--LabApp.expose_app_in_browser=True", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
           "--ServerApp.terminals_enabled=False", "--LabApp.extension_manager=readonly"]
    if os.name == "posix" and os.geteuid() == 0:  # containers and CI runners often run as root
        cmd.append("--allow-root")
    log_path = work_dir / "jupyterlab.log"
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root_dir,
                            start_new_session=True)
    log.close()
    server = LabServer(proc, port, token, root_dir, log_path, env["JUPYTER_RUNTIME_DIR"])
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"JupyterLab exited with status {proc.returncode}:\n{server.log_tail()}")
        try:
            server.api("/api/status")
            return server
        except OSError:
            time.sleep(0.5)
    stop_lab(server)
    raise TimeoutError(f"JupyterLab did not answer on port {port} within {timeout_s:.0f} s:\n{server.log_tail()}")


def _all_descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _kernel_processes(server: LabServer) -> list[psutil.Process]:
    """Kernels run in sessions of their own; find them by the connection files in this server's runtime dir."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        if any(arg.startswith(server.runtime_dir) for arg in cmdline):
            found.append(proc)
    return found


def leftover_processes(server: LabServer) -> list[str]:
    """Server or kernel processes of `server` still alive (should be none after `stop_lab`)."""
    alive = [p for p in _kernel_processes(server) if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    if server.proc.poll() is None:
        alive.append(psutil.Process(server.proc.pid))
    return [f"{p.pid}: {' '.join(p.cmdline()[:4])}" for p in alive]


def stop_lab(server: LabServer, timeout_s: float = 15.0) -> None:
    """Shut kernels and the server down, kill whatever is left, and wait until the port is free again."""
    if server.stopped:
        return
    server.stopped = True
    leftovers = _all_descendants(server.proc.pid) + _kernel_processes(server)
    try:
        for kernel in server.api("/api/kernels") or []:
            server.api(f"/api/kernels/{kernel['id']}", method="DELETE")
        server.api("/api/shutdown", method="POST")
        server.proc.wait(timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired, ValueError):
        pass
    if server.proc.poll() is None:
        try:
            os.killpg(server.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        server.proc.wait(timeout=timeout_s)
    for proc in leftovers:
        try:
            proc.kill()
        except psutil.Error:
            pass
    wait_vanished(leftovers, timeout_s)              # a zombie left to init counts as gone
    deadline = time.monotonic() + timeout_s
    while not port_is_free(server.port) and time.monotonic() < deadline:
        time.sleep(0.2)


def lab_page_config(server: LabServer) -> dict:
    """The page config JupyterLab embeds in /lab (lists the federated extensions it will load)."""
    with urllib.request.urlopen(server.url("lab"), timeout=15) as resp:
        html = resp.read().decode()
    match = re.search(r'<script id="jupyter-config-data" type="application/json">(.*?)</script>', html, re.S)
    if not match:
        raise AssertionError("JupyterLab's /lab page has no jupyter-config-data block")
    return json.loads(match.group(1))


def active_extensions(server: LabServer) -> set[str]:
    """Names of the prebuilt (federated) extensions this server serves and has not disabled."""
    config = lab_page_config(server)
    disabled = config.get("disabledExtensions") or []
    names = {ext["name"] for ext in config.get("federated_extensions", [])}
    return {name for name in names if name not in disabled}


def stage_notebooks(repo_root: Path, names: list[str], lab_root: Path) -> None:
    """Copy notebooks into `lab_root/notebooks` so the browser run never writes into the repository."""
    target = lab_root / "notebooks"
    target.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copy2(repo_root / "notebooks" / name, target / name)


def parse_numbers(text: str) -> list[float]:
    """Every number in a readout's text, in order (thousands separators allowed)."""
    return [float(m.replace(",", "")) for m in NUMBER.findall(text)]


def cells_to_run(notebook: Path, needles: tuple[str, ...]) -> list[int]:
    """Indices (in notebook order) of the first code cell containing each needle: the cells a dashboard needs."""
    cells = json.loads(Path(notebook).read_text())["cells"]
    found = []
    for needle in needles:
        hits = [i for i, c in enumerate(cells) if c["cell_type"] == "code" and needle in "".join(c["source"])]
        if not hits:
            raise AssertionError(f"{Path(notebook).name} has no code cell containing {needle!r}")
        found.append(hits[0])
    return sorted(set(found))
