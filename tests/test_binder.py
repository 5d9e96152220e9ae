"""Binder stays in step with the lab: its requirements are generated from the root file, its JupyterLab is quiet."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "binder_requirements.py"


def load_script():
    spec = importlib.util.spec_from_file_location("binder_requirements", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_binder_requirements_match_the_root_file():
    """Fails when someone edits requirements.txt (or binder/requirements.txt) without regenerating."""
    proc = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_generation_rules_cpu_wheels_no_test_block_mpi_extra():
    script = load_script()
    root = ("# comment\ntorch==2.14.1\ntorchvision==0.29.1\ntensorflow-cpu==2.21.*\nnumpy>=1.26\n"
            "# testing\npytest>=8\nnbval>=0.11\n")
    lines = script.binder_lines(root, ["mpi4py>=4", "mpich"])
    body = [ln for ln in lines if not ln.startswith("#")]
    assert body == [f"--extra-index-url {script.CPU_INDEX}", "torch==2.14.1+cpu", "torchvision==0.29.1+cpu",
                    "tensorflow-cpu==2.21.*", "numpy>=1.26", "mpi4py>=4", "mpich"]
    with pytest.raises(ValueError, match="must pin torch exactly"):
        script.binder_lines("torch>=2.4\n", [])


def test_drift_is_reported_with_a_diff(tmp_path, monkeypatch):
    script = load_script()
    (tmp_path / "binder").mkdir()
    (tmp_path / "requirements.txt").write_text("torch==2.14.1\nnumpy\n")
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    (tmp_path / "binder" / "requirements.txt").write_text("torch==2.14.1+cpu\n")
    monkeypatch.setattr(script, "REPO", tmp_path)
    assert script.main(["--check"]) == 1
    assert script.main([]) == 0 and script.main(["--check"]) == 0
    assert "numpy" in (tmp_path / "binder" / "requirements.txt").read_text()


def test_binder_turns_off_the_jupyterlab_news_popup():
    overrides = json.loads((REPO / "binder" / "overrides.json").read_text())
    notification = overrides["@jupyterlab/apputils-extension:notification"]
    assert notification == {"fetchNews": "false", "checkForUpdates": False}
    post_build = (REPO / "binder" / "postBuild").read_text()
    assert "share/jupyter/lab/settings" in post_build and "overrides.json" in post_build
    schema = next(Path(sys.prefix, "share", "jupyter", "lab", "schemas", "@jupyterlab", "apputils-extension")
                  .glob("notification.json"), None)
    if schema is None:
        pytest.skip("JupyterLab's schemas are not installed here; cannot check the setting names against them")
    props = json.loads(schema.read_text())["properties"]
    assert {c["const"] for c in props["fetchNews"]["oneOf"]} >= {"false"} and props["checkForUpdates"]["type"] == "boolean"
