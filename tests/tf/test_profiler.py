"""Tests for labkit.tf.profiler: the .xplane.pb is written, bad input is refused clearly."""
from __future__ import annotations

import numpy as np
import pytest
import torch._dynamo  # noqa: F401  (load triton before TensorFlow: the reverse order segfaults later torch code)

from labkit.core.procs import tensorflow_missing_reason  # noqa: E402

pytestmark = pytest.mark.tensorflow
tf = pytest.importorskip("tensorflow", reason=tensorflow_missing_reason())

from labkit.tf.profiler import (TFProfileResult, profile_keras_fit, profile_keras_in_subprocess,  # noqa: E402
                                 xplane_files)


def tiny_model():
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input(shape=(4,)), tf.keras.layers.Dense(3)])
    model.compile("sgd", loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def data(n=40):
    rng = np.random.default_rng(0)
    return rng.random((n, 4), dtype=np.float32), rng.integers(0, 3, n)


_PROGRAMMATIC = """
import sys, json
sys.path.insert(0, {tests!r})
from test_profiler import data, tiny_model
from labkit.tf.profiler import TFProfileResult, profile_keras_fit, xplane_files
x, y = data()
res = profile_keras_fit(tiny_model(), x, y, run_dir={run!r}, batch_size=8, profile_batch=(2, 3))
again = profile_keras_fit(tiny_model(), x, y, run_dir={run!r}, batch_size=8, profile_batch=(2, 3))
print(json.dumps(dict(kind=type(res).__name__, batches=list(res.profiled_batches), files=res.xplane_files,
                      listed=xplane_files({run!r}), text=str(res), again=again.xplane_files)))
"""


def test_programmatic_profile_writes_xplane(tmp_path):
    """Runs in a fresh process so that the TF profiler starts from a clean state."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    run = str(tmp_path / "tfrun")
    code = _PROGRAMMATIC.format(tests=str(Path(__file__).parent), run=run)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["kind"] == "TFProfileResult" and res["batches"] == [2, 3]
    assert len(res["files"]) == 1 and res["files"][0] in res["listed"]
    assert res["files"][0].endswith(".xplane.pb") and "plugins/profile" in res["files"][0]
    assert "Profile tab" in res["text"]
    assert len(res["again"]) == 1   # only the new session's file, even when TF reuses the folder name


@pytest.mark.parametrize("batches, match", [((0, 2), "1 <= first <= last"), ((3, 2), "1 <= first <= last"),
                                            ((2, 99), "only 5 batches"), ((1,), "pair of integers")])
def test_bad_profile_batch(tmp_path, batches, match):
    x, y = data()
    with pytest.raises(ValueError, match=match):
        profile_keras_fit(tiny_model(), x, y, run_dir=tmp_path, batch_size=8, profile_batch=batches)


def test_bad_method_and_dir(tmp_path):
    x, y = data()
    with pytest.raises(ValueError, match="method must be one of"):
        profile_keras_fit(tiny_model(), x, y, run_dir=tmp_path, method="tensorboard-plugin")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(PermissionError, match="not a writable directory"):
        profile_keras_fit(tiny_model(), x, y, run_dir=blocker / "sub", batch_size=8)


def test_callback_method_needs_tensorboard_or_works(tmp_path):
    x, y = data()
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="pip install tensorboard"):
            profile_keras_fit(tiny_model(), x, y, run_dir=tmp_path, batch_size=8, method="callback")
    else:
        res = profile_keras_fit(tiny_model(), x, y, run_dir=tmp_path, batch_size=8, method="callback")
        assert res.xplane_files


def test_subprocess_checks_method_and_tensorboard_before_starting_a_child(tmp_path):
    import importlib.util

    with pytest.raises(ValueError, match="method must be one of"):
        profile_keras_in_subprocess(tmp_path, method="tensorboard-plugin")
    if importlib.util.find_spec("tensorboard") is None:   # a missing package comes back as ImportError, not a crash
        with pytest.raises(ImportError, match="pip install tensorboard"):
            profile_keras_in_subprocess(tmp_path, method="callback")


def test_subprocess_profile(tmp_path):
    res = profile_keras_in_subprocess(tmp_path / "child", samples=64, batch_size=16, profile_batch=(2, 3))
    assert res.profiled_batches == (2, 3) and len(res.xplane_files) == 1
    with pytest.raises(ValueError, match="only 4 batches"):
        profile_keras_in_subprocess(tmp_path, samples=64, batch_size=16, profile_batch=(2, 5))
