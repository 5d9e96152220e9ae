"""The rank-side pieces of the expert-parallel MoE that need no process group; the all-to-alls themselves run on
real ranks in test_runs.py."""
import torch

from labkit.parallel.experts.dispatch import ExpertParallelMoE, _source_to_expert_order
from labkit.parallel.experts.moe import MoE, MoEConfig


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
