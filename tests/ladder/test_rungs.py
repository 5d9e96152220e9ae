"""The rung table and propose(): each rung switches one thing on top of the recipe so far, or says why it cannot."""
import dataclasses
import subprocess
import sys

import pytest

from labkit.ladder.rungs import RUNG_KEYS, RUNGS, Capabilities, Recipe, propose

CPU = Capabilities("cpu", 2, "bf16", False, "no C++ compiler found", 1, "only 2 CPU core(s)", 1)


def test_the_table_is_in_rung_order_with_one_key_each():
    assert tuple(r.key for r in RUNGS) == RUNG_KEYS and [r.index for r in RUNGS] == list(range(len(RUNGS)))
    assert all(r.explanation and r.notebook.endswith(".ipynb") for r in RUNGS)


def test_each_rung_changes_only_its_own_setting():
    base = Recipe(batch_size=8)
    changed = {"batch_size": {"batch_size"}, "input_pipeline": {"num_workers", "prefetch_factor", "persistent_workers"},
               "device_data": {"device_data"}, "no_sync": {"sync_every_step"}, "mixed_precision": {"precision"},
               "channels_last": {"channels_last"}}
    for key, fields in changed.items():
        recipe, what = propose(key, base, CPU, 16)
        diff = {f.name for f in dataclasses.fields(Recipe) if getattr(recipe, f.name) != getattr(base, f.name)}
        assert diff == fields, (key, diff) and what


def test_rungs_that_cannot_apply_say_why():
    assert propose("tf32", Recipe(), CPU, 8) == (None, CPU.tf32_reason)
    assert propose("compile", Recipe(), CPU, 8) == (None, "no C++ compiler found")
    assert propose("ddp", Recipe(), CPU, 8) == (None, "only 2 CPU core(s)")
    assert propose("naive", Recipe(batch_size=64, tf32=True), CPU, 8)[0] == Recipe()
    with pytest.raises(ValueError, match="unknown rung 'warp'"):
        propose("warp", Recipe(), CPU, 8)


def test_the_rung_table_is_torch_free():
    """The CLI's parser offers the rung names; building it must not load torch."""
    code = "import sys, labkit.ladder.rungs; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
