"""Tests for labkit.tf.pipelines: every experiment's result shape, exact counts, and bad input."""
from __future__ import annotations

import numpy as np
import pytest
import torch._dynamo  # noqa: F401  (load triton before TensorFlow: the reverse order segfaults later torch code)

from labkit.core.procs import tensorflow_missing_reason  # noqa: E402

pytestmark = pytest.mark.tensorflow
tf = pytest.importorskip("tensorflow", reason=tensorflow_missing_reason())

from labkit.tf import pipelines as tfp  # noqa: E402


def images(n=24):
    return np.random.default_rng(0).integers(0, 256, (n, 8, 8, 3), dtype=np.uint8)


def test_parse_is_batch_agnostic():
    x = images(4)
    one_by_one = np.stack([tfp.parse(tf.constant(img)).numpy() for img in x])
    np.testing.assert_allclose(tfp.parse(tf.constant(x)).numpy(), one_by_one, atol=1e-5)


def test_map_vs_batch_shape():
    comp = tfp.map_vs_batch(images(), batch_size=8, repeats=1, epochs=1)
    assert [r["variant"] for r in comp.rows] == ["map then batch", "batch then map (vectorised)"]
    assert all(r["samples_per_s"] > 0 for r in comp.rows)
    assert list(comp.to_dataframe().columns) == ["seconds", "samples_per_s"]
    with pytest.raises(KeyError, match="no variant"):
        comp["nope"]


def test_cache_and_shuffle_semantics():
    comp = tfp.cache_and_shuffle(images(16), decode_s=0.0)
    assert comp["decode, cache, then shuffle"]["epoch2_reshuffled"]
    assert not comp["decode, shuffle, then cache"]["epoch2_reshuffled"]      # cache froze the first order
    assert comp["no cache"]["cache_mb"] == 0
    assert comp["decode, cache, then shuffle"]["cache_mb"] == 4 * comp["cache raw, then decode"]["cache_mb"]


def test_prefetch_parallel_shapes():
    pf = tfp.prefetch_overlap(n=4, read_s=0.0, step_s=0.0, repeats=1)
    assert [r["variant"] for r in pf.rows] == ["no prefetch", "prefetch(AUTOTUNE)"]
    assert pf.extra["serial_s"] == 0.0
    par = tfp.parallel_map(n=4, decode_s=0.0, parallel=2, repeats=1)
    assert par.rows[1]["variant"] == "num_parallel_calls=2"


def test_interleave_reads_every_record(tmp_path):
    paths = tfp.write_shards(images(10), tmp_path, num_files=3)
    assert len(paths) == 3 and all(p.endswith(".tfrecord") for p in paths)
    comp = tfp.interleave_files(paths, record_s=0.0, cycle_length=2, repeats=1)
    assert [r["records"] for r in comp.rows] == [10, 10]
    with pytest.raises(ValueError, match="num_files"):
        tfp.write_shards(images(4), tmp_path, num_files=9)
    with pytest.raises(ValueError, match="paths is empty"):
        tfp.interleave_files([])


def test_shard_counts_are_exact():
    comp = tfp.shard_order(n=12, world_size=3, decode_s=0.0)
    assert comp["map then shard"]["decode_calls"] == 36 and comp["shard then map"]["decode_calls"] == 12
    assert comp["map then shard"]["samples"] == comp["shard then map"]["samples"] == 12
    with pytest.raises(ValueError, match="world_size must be an integer >= 2"):
        tfp.shard_order(world_size=1)


def test_bad_images():
    with pytest.raises(ValueError, match="uint8"):
        tfp.map_vs_batch(np.zeros((4, 8, 8, 3), dtype=np.float32))
    with pytest.raises(ValueError, match="epochs"):
        tfp.map_vs_batch(images(), epochs=0)


def test_cache_before_repeat_decodes_once_and_holds_one_epoch(tmp_path):
    c = tfp.cache_repeat_order(images(12), epochs=3, cache_dir=tmp_path)
    once, every = c["cache then repeat"], c["repeat then cache"]
    assert once["elements_seen"] == every["elements_seen"] == 36
    assert once["decode_calls"] == 12 and every["decode_calls"] == 36          # exact: work redone each epoch
    assert once["cache_bytes"] >= 12 * c.extra["element_bytes"]
    assert every["cache_bytes"] >= 3 * 12 * c.extra["element_bytes"] > 2.5 * once["cache_bytes"]
    assert not list(tmp_path.iterdir())                                        # the cache files are cleaned up
    with pytest.raises(ValueError, match="epochs must be an integer >= 2"):
        tfp.cache_repeat_order(images(4), epochs=1)


def _autograph_files(folder) -> list:
    return sorted(p.name for p in folder.glob("__autograph_generated_file*"))


def test_the_experiments_leave_no_autograph_file_for_a_killed_kernel_to_strand(tmp_path, monkeypatch):
    """AutoGraph writes each function it converts to a file that only a clean exit deletes; nbval kills kernels."""
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    x = images(8)
    tfp.map_vs_batch(x, batch_size=4, repeats=1, epochs=1)
    tfp.cache_and_shuffle(x, decode_s=0.0)
    tfp.prefetch_overlap(n=4, read_s=0.0, step_s=0.0, repeats=1)
    tfp.parallel_map(n=4, decode_s=0.0, repeats=1)
    tfp.interleave_files(tfp.write_shards(x, tmp_path / "shards", num_files=2), record_s=0.0, repeats=1)
    tfp.shard_order(n=4, decode_s=0.0)
    tfp.cache_repeat_order(x, epochs=2, cache_dir=tmp_path)
    assert _autograph_files(tmp_path) == []


def test_the_rival_a_plain_map_function_is_written_to_a_temp_file(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))

    def scale(v):
        return v * 2

    list(tf.data.Dataset.range(3).map(scale))
    assert _autograph_files(tmp_path) != []
