"""Expert parallelism on 2 real gloo ranks: output and every gradient equal the one-process MoE, dropped copies
equal the capacity rule, bytes from the split sizes equal what the sockets carried (to headers), and a run past its
timeout leaves nothing behind."""
import os
import tempfile
from pathlib import Path

import psutil
import pytest
import torch

from labkit.comm.launch import RUN_DIR_PREFIX, LaunchTimeout
from labkit.parallel.experts import traffic
from labkit.parallel.experts.moe import MoE, MoEConfig
from labkit.parallel.experts.runs import group_inputs, is_close, local_names, one_step, run_expert_parallel

CONFIG = MoEConfig()
TOKENS = 64


@pytest.fixture(scope="module")
def ranks():
    return run_expert_parallel(CONFIG, 2, TOKENS, timeout_s=120)


def test_output_and_every_gradient_equal_one_process(ranks):
    for r in ranks:
        assert all(r["close"].values()), r["gaps"]
        assert {"out", "x_grad", "router.weight", "router.bias"} <= set(r["close"])
        assert len([n for n in r["close"] if n.startswith("experts.")]) == 4 * 4      # 4 experts x 4 tensors
        assert not all(r["unsynced_router_close"].values())          # the rival: a rank's router grad is partial


def test_dropped_copies_equal_the_rule_and_arrive_nowhere(ranks):
    for r in ranks:
        assert r["dropped"] == r["predicted_dropped"] == r["reference_dropped"]
        assert r["first"] == 4 * r["rank"]
        assert sum(r["kept"]) == TOKENS * CONFIG.top_k - r["dropped"]
    arrived = sum(sum(r["received_per_expert"]) for r in ranks)
    assert arrived == sum(sum(r["kept"]) for r in ranks) == sum(sum(r["send"]) for r in ranks)


def test_counted_bytes_match_the_sockets_and_the_formula_s_share(ranks):
    rows = traffic.traffic_rows({2: ranks}, CONFIG.hidden)
    for row in rows:
        assert row["counted_bytes"] <= row["wire_bytes"] <= 1.15 * row["counted_bytes"]   # gloo's headers, counts
        assert row["counted_bytes"] < row["every_copy_bytes"]
    mean_counted = sum(r["counted_bytes"] for r in rows) / 2
    mean_formula = sum(r["formula_bytes"] for r in rows) / 2
    tol = traffic.share_tolerance(sum(r["kept_copies"] for r in rows), 2)
    assert abs(mean_counted / mean_formula - 1) <= tol


def test_local_names_map_a_rank_s_experts_to_the_reference_s():
    assert local_names("experts.1.fc2.bias", 4) == "experts.5.fc2.bias"
    assert local_names("router.weight", 4) == "router.weight"
    assert is_close(torch.ones(3), torch.ones(3)) and not is_close(torch.ones(3), torch.zeros(3))


def test_one_step_in_one_process_gives_every_gradient():
    moe = MoE(CONFIG, 0)
    x, probe = group_inputs(CONFIG, 2, 16)
    run = one_step(moe, x, probe)
    assert set(run["grads"]) <= {n for n, _ in moe.named_parameters()} and "router.weight" in run["grads"]
    assert run["x_grad"].shape == x.shape


def test_a_run_past_its_timeout_is_killed_and_leaves_no_process_or_folder():
    before = set(Path(tempfile.gettempdir()).glob(f"{RUN_DIR_PREFIX}{os.getpid()}-*"))
    with pytest.raises(LaunchTimeout):
        run_expert_parallel(CONFIG, 2, TOKENS, timeout_s=0.3)
    assert psutil.Process().children(recursive=True) == []
    assert set(Path(tempfile.gettempdir()).glob(f"{RUN_DIR_PREFIX}{os.getpid()}-*")) == before
