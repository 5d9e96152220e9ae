"""The torch.distributed demos, run on real gloo processes and checked against the simulation."""
from __future__ import annotations

import numpy as np

from labkit.comm.collectives import allreduce, reference_allreduce
from labkit.comm.demos import collectives_demo, demo_values, send_recv
from labkit.comm.launch import launch


def test_send_recv_moves_rank_0_tensor_to_rank_1():
    out = launch(send_recv, 2, timeout_s=90, show_output=False)
    assert out[1]["before"] == [0.0] * 4
    assert out[1]["after"] == out[0]["before"] == demo_values(0, 4).tolist()


def test_collectives_on_three_ranks_match_the_simulation():
    world, length = 3, 7 * 3
    out = launch(collectives_demo, world, kwargs={"length": length}, timeout_s=120, show_output=False)
    starts = [demo_values(r, length) for r in range(world)]
    exact = reference_allreduce(starts, "sum")
    simulated = allreduce(starts, "ring", "sum").outputs
    for rank, res in enumerate(out):
        assert res["before"] == starts[rank].tolist()
        np.testing.assert_array_equal(res["all_reduce_sum"], exact)
        np.testing.assert_array_equal(res["all_reduce_sum"], simulated[rank])
        np.testing.assert_array_equal(res["ring_all_reduce_sum"], exact)  # hand-built ring over isend/irecv
        assert res["broadcast_from_0"] == starts[0].tolist()
        assert res["all_gather"] == [s.tolist() for s in starts]
        np.testing.assert_array_equal(res["reduce_scatter_sum"], np.split(exact, world)[rank])
