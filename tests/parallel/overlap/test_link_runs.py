"""The shaped-link run: its config survives the JSON trip to the nodes, and (where network namespaces can be
built) two emulated nodes time every variant and are torn down afterwards."""
import math

import psutil
import pytest

from labkit.cluster.nodes import namespace_support
from labkit.parallel.overlap import link_runs
from labkit.parallel.overlap.runs import OverlapConfig


def test_the_link_model_has_megabytes_of_gradients_and_one_bucket_last():
    cfg = link_runs.link_config()
    assert cfg.grad_bytes == 8 * 4 * (256 * 256 + 256)
    assert math.isinf(cfg.caps_bytes[-1]) and cfg.caps_bytes[0] == 0


def test_the_config_survives_json():
    cfg = link_runs.link_config()
    back = link_runs._config_from_json({**cfg.__dict__, "caps_bytes": [0, 65536, float("inf")]})
    assert OverlapConfig(**back).caps_bytes == (0.0, 65536.0, math.inf)


@pytest.mark.skipif(namespace_support()[0] is None, reason=namespace_support()[1])
def test_two_emulated_nodes_time_every_variant_and_leave_nothing():
    cfg = OverlapConfig(width=64, depth=2, batch=8, caps_bytes=(0, math.inf), rounds=1)
    results = link_runs.measure_on_link(cfg, rate_mbit_s=400.0, timeout_s=90)
    assert [r["rank"] for r in results] == [0, 1]
    assert set(results[0]["rounds"]) == {"none", "naive", "cap=0", "cap=inf"}
    assert psutil.Process().children(recursive=True) == []
