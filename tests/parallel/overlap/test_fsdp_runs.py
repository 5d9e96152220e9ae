"""torch's knobs on 2 gloo ranks: DDP's comm hook sees the buckets bucket_cap_mb makes, with the hand-written
sync's gradients; FSDP2's forward prefetch runs one all-gather ahead; reshard_after_forward=False keeps every
layer's parameters whole after forward and skips backward's re-gather."""
import pytest

from labkit.parallel.overlap import fsdp_runs
from labkit.parallel.overlap.runs import OverlapConfig

SMOKE = OverlapConfig(width=64, depth=3, batch=8, rounds=1)


@pytest.fixture(scope="module")
def ranks():
    return fsdp_runs.run_knobs(SMOKE, (0.01, 25.0), 2, timeout_s=150)


def test_ddp_buckets_follow_bucket_cap_mb_and_give_the_hand_written_gradients(ranks):
    for r in ranks:
        small, large = r["ddp"][0.01], r["ddp"][25.0]
        assert len(small["bucket_bytes"]) == 3 and large["bucket_bytes"] == [SMOKE.grad_bytes]
        assert small["gap"] < 1e-6 and large["gap"] < 1e-6


def test_forward_prefetch_issues_the_next_layer_s_all_gather_before_this_layer_runs(ranks):
    fsdp = ranks[0]["fsdp"]
    assert fsdp["default"]["gathers_at_layer_start"] == [1, 2, 3]
    assert fsdp["prefetch"]["gathers_at_layer_start"] == [2, 3, 3]


def test_keeping_parameters_unsharded_holds_them_all_and_gathers_once(ranks):
    fsdp = ranks[0]["fsdp"]
    assert fsdp["default"]["unsharded_after_forward_bytes"] == 0
    assert fsdp["keep_unsharded"]["unsharded_after_forward_bytes"] == SMOKE.grad_bytes
    assert fsdp["default"]["gathers_per_step"] == 2 * fsdp["keep_unsharded"]["gathers_per_step"] == 6


def test_every_variant_is_timed_every_round(ranks):
    for r in ranks:
        assert set(r["step_s"]) == set(fsdp_runs.FSDP_VARIANTS)
        assert all(len(v) == SMOKE.rounds and min(v) > 0 for v in r["step_s"].values())
    assert fsdp_runs.median_step_s(ranks, "default") > 0
