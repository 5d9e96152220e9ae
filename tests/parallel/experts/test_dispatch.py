"""The rank-side pieces of the expert-parallel MoE that need no process group (the all-to-alls themselves run on
real ranks in test_runs.py), and the experts split by columns and rows over 2 real ranks against one process."""
import torch

from labkit.comm.launch import launch
from labkit.comm.mesh import Mesh, process_groups
from labkit.parallel.experts.dispatch import ExpertParallelMoE, TensorParallelExperts, _source_to_expert_order
from labkit.parallel.experts.moe import MoE, MoEConfig
from labkit.parallel.experts.runs import group_inputs, is_close, one_step


def test_arrived_rows_regroup_by_expert_then_source():
    # 2 sources x 2 local experts; counts [[1, 2], [2, 1]]: rows e0s0 | e1s0 e1s0 | e0s1 e0s1 | e1s1
    order = _source_to_expert_order(torch.tensor([[1, 2], [2, 1]]))
    assert order.tolist() == [0, 3, 4, 1, 2, 5]


def test_a_rank_holds_the_whole_router_and_its_block_of_experts():
    reference = MoE(MoEConfig(), seed=0)
    part = ExpertParallelMoE(reference, rank=1, ep=4)
    assert part.first == 2 and len(part.experts) == 2
    assert torch.equal(part.experts[0].fc1.weight, reference.experts[2].fc1.weight)
    assert torch.equal(part.router.weight, reference.router.weight)
    assert part.router.weight is not reference.router.weight          # a copy: its gradient is the rank's own


def tensor_parallel_against_one_process(tokens: int) -> dict:
    """On a rank of 2: the experts split by columns/rows over both ranks against the one-process MoE."""

    config = MoEConfig(capacity_factor=1.0)                      # some copies dropped: both must drop the same
    ep = process_groups(Mesh(dp=2, ep=2))["ep"]
    x, probe = group_inputs(config, 2, tokens)
    reference = MoE(config, seed=0)
    ref = one_step(reference, x, probe)
    part = TensorParallelExperts(reference, ep.index, 2, group=ep.group)
    run = one_step(part, x[ep.index], probe[ep.index])
    width = config.ffn // 2
    cols = slice(ep.index * width, (ep.index + 1) * width)
    grads, want = run["grads"], ref["grads"]
    mine = ep.index
    close = {"out": is_close(run["out"], ref["out"][mine]), "x_grad": is_close(run["x_grad"], ref["x_grad"][mine]),
             "fc1": all(is_close(grads[f"experts.{e}.fc1.weight"], want[f"experts.{e}.fc1.weight"][cols])
                        for e in range(config.experts)),
             "fc2": all(is_close(grads[f"experts.{e}.fc2.weight"], want[f"experts.{e}.fc2.weight"][:, cols])
                        for e in range(config.experts))}
    router = run["grads"]["router.weight"].clone()
    torch.distributed.all_reduce(router, group=ep.group)         # each rank's router gradient is a partial sum
    close["router"] = is_close(router, ref["grads"]["router.weight"])
    close["rival_router"] = is_close(run["grads"]["router.weight"], ref["grads"]["router.weight"])
    close["dropped"] = reference.routings[0].dropped > 0
    return close


def test_experts_split_by_columns_and_rows_equal_the_one_process_moe():
    for close in launch(tensor_parallel_against_one_process, 2, args=(64,), timeout_s=90, show_output=False,
                        backend="gloo"):
        assert all(v for k, v in close.items() if k != "rival_router"), close
        assert not close["rival_router"], close                  # before the sum, a rank's router grad is partial


def test_the_tensor_parallel_part_holds_every_expert_s_columns():
    reference = MoE(MoEConfig(), seed=0)
    part = TensorParallelExperts(reference, index=1, tp=2)
    assert len(part.experts) == 8 and part.experts[3].fc1.weight.shape == (32, 32)
    assert torch.equal(part.experts[3].fc2.weight, reference.experts[3].fc2.weight[:, 32:])
    assert part.experts[3].fc2.bias is None                      # fc2's bias is added once, on index 0
