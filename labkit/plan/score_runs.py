"""The planner's layouts run for real: a stack of the kit's tensor-parallel layer on 4 gloo ranks (or NCCL GPUs),
each (dp, tp, pp, cp, ZeRO, micro-batch, checkpointing) layout trained through the kit's one step
(:class:`labkit.parallel.compose.train.ComposedStep`: tp split, ring attention over cp, the hand GPipe over two
stages, FSDP2 as ZeRO-2 or ZeRO-3 on the dp sub-mesh), timed in interleaved rounds.

Per rank and layout: seconds per step each round (after a barrier), the model state it holds
(:func:`labkit.sharding.memory.count_rank_state_bytes`) and the activations autograd saved
(:func:`labkit.memory.model.saved_activation_bytes`). Per rank once: the link's alpha and beta fitted from all-reduce
timings (:func:`labkit.parallel.data.costmodel.fit_alpha_beta`), the unsplit stack's compute-only step at each share
(for the measured efficiency), and a bare matmul's rate (the "peak" of this device, measured). Layouts are
:class:`labkit.plan.specs.Layout`; what this runner can execute is :data:`RUNNABLE` (dp, tp, pp 1 or 2, cp 1 or 2,
ZeRO 0, 2 or 3, with or without checkpointing, one or two micro-batches) less the combinations
:func:`labkit.parallel.compose.train.runner_problem` refuses (no pp with cp; ZeRO on dp x tp only). Given no
layouts, the ranks measure this machine first and the planner picks what to run within RUNNABLE, every axis covered
(:mod:`labkit.plan.runnable`). A ZeRO layout's activations are counted on the same layers unsharded: FSDP2's
gathered weights, which autograd saves too, are parameters, not activations.
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
from torch import nn

from labkit.cluster.link_jobs import join_node_group
from labkit.cluster.nodes import EmulatedNodes, NodesConfig
from labkit.cluster.rankside import job_params, report
from labkit.cluster.run import run_job
from labkit.comm.launch import launch
from labkit.comm.mesh import AxisGroup, Mesh, my_group
from labkit.core.clock import now_s
from labkit.core.contention import ShareMeter
from labkit.core.step import TrainStep
from labkit.core.validation import positive_int
from labkit.memory.model import saved_activation_bytes
from labkit.parallel.data.costmodel import fit_alpha_beta
from labkit.parallel.compose.model import StackShape
from labkit.parallel.compose.steps import tp_layers
from labkit.parallel.compose.train import ComposedStep, build_model, runner_problem
from labkit.parallel.tensor.megatron import LayerShape, build_block
from labkit.parallel.tensor.runs import layer_inputs, probe_loss
from labkit.plan.planner import Space
from labkit.plan.runnable import cover_axes, pick_runs, rank_runnable
from labkit.plan.specs import Layout
from labkit.sharding.memory import count_rank_state_bytes
from labkit.training.flops import measured_matmul_flops_per_s

FIT_SIZES_BYTES = (4 * 1024, 64 * 1024, 512 * 1024)
RUNNABLE = Space(pp=(1, 2), cp=(1, 2), zero=(0, 2, 3), micro_batches=(1, 2), checkpointing=(False, True))  # tp: any


@dataclass(frozen=True)
class ScoreConfig:
    """The stack the layouts train: layers of the kit's layer, its shape, the global batch, rounds."""

    layers: int = 2
    d_model: int = 128
    heads: int = 4
    seq_len: int = 64
    global_batch: int = 8
    rounds: int = 4

    def __post_init__(self) -> None:
        for name in ("layers", "d_model", "heads", "seq_len", "global_batch", "rounds"):
            positive_int(getattr(self, name), name)
        self.shape()                                     # the layer's own rules (d_model by heads), said here

    def check_layout(self, layout: Layout, world_size: int) -> None:
        """One clear error, before any rank starts, unless ``layout`` runs on ``world_size`` ranks and the stack fits
        its mesh (heads by tp, layers by pp, sequence by tp and 2cp, the global batch by dp:
        :meth:`labkit.comm.mesh.Mesh.check_model`) and this runner executes it (:func:`runner_problem`)."""
        if layout.ranks != world_size or layout.ep != 1:
            raise ValueError(f"{layout.label()}: the scored runs take dp x tp x pp x cp = {world_size} ranks (no ep)")
        mesh = layout.mesh                          # its degrees were checked when the layout was made
        problem = runner_problem(mesh, layout.zero)
        if problem:
            raise ValueError(f"{layout.label()}: {problem}")
        mesh.check_model(heads=self.heads, layers=self.layers, seq_len=self.seq_len, batch=self.global_batch)
        if self.global_batch % (layout.dp * layout.micro_batch):
            raise ValueError(f"{layout.label()}: global batch={self.global_batch} is no multiple of dp x micro-batch "
                             f"= {layout.dp * layout.micro_batch}")

    def stack(self) -> StackShape:
        """The stack as the compositions describe it (the global batch as its batch)."""
        return StackShape(self.layers, self.d_model, self.heads, self.seq_len, self.global_batch)

    def shape(self, batch: int | None = None) -> LayerShape:
        """The layer's shape at ``batch`` sequences (the global batch by default)."""
        return LayerShape(self.d_model, self.heads, self.seq_len, batch or self.global_batch)


def runs_here(cfg: ScoreConfig, layout: Layout, world_size: int) -> bool:
    """Whether this runner executes ``layout`` on ``world_size`` ranks (:meth:`ScoreConfig.check_layout` passes)."""
    try:
        cfg.check_layout(layout, world_size)
    except ValueError:
        return False
    return True


def mesh_groups(layout: Layout, world_size: int) -> tuple[list[list[int]], list[list[int]]]:
    """(TP groups, DP groups) as global ranks: tp fastest (consecutive ranks), dp across them."""
    if layout.ranks != world_size or layout.pp != 1 or layout.cp != 1:
        raise ValueError(f"{layout.label()}: the scored runs take dp x tp = {world_size} (pp = cp = 1)")
    return layout.mesh.members("tp"), layout.mesh.members("dp")


def build_stack(cfg: ScoreConfig, layout: Layout, tp: AxisGroup | None = None) -> nn.Module:
    """``layers`` of this rank's TP part of the kit's layer, each checkpointed if the layout says so (``tp``: this
    rank's tp group; none builds the whole layer, for a model that never runs a collective)."""
    return tp_layers([build_block(cfg.shape(), seed=i) for i in range(cfg.layers)], tp or AxisGroup(None, (0,), 0),
                     layout.checkpointing)


def _layout_step(cfg: ScoreConfig, layout: Layout, shared: dict) -> ComposedStep:
    """This rank's step of ``layout``: its part of the ``layers`` blocks and its share of the batch in micro-batches
    of ``layout.micro_batch``, Adam (:class:`ComposedStep`, groups from the layout's :class:`Mesh`, built once per
    mesh and kept in ``shared``)."""
    return ComposedStep(cfg.stack(), layout.mesh, layout.zero, layout.micro_batch, layout.checkpointing,
                        lambda params: torch.optim.Adam(params, lr=1e-4), shared)


def _activation_bytes(cfg: ScoreConfig, step: ComposedStep, layout: Layout) -> int:
    """Bytes autograd saves in what this rank forwards at once (:meth:`ComposedStep.activation_inputs`, as a tensor of
    its own: a slice would bill the whole feed's storage); a ZeRO layout's on the same layers unsharded."""
    model = build_model(cfg.stack(), step.mesh, step.groups, layout.checkpointing) if layout.zero else step.model
    return saved_activation_bytes(model, step.activation_inputs())


def _fit_link(group: object = None, size: int | None = None, repeats: int = 5) -> dict[str, float]:
    """alpha (s) and beta (s/byte) of a ring all-reduce over ``group`` (every rank by default), fitted live."""
    times = []
    for nbytes in FIT_SIZES_BYTES:
        buf, runs = torch.zeros(nbytes // 4), []
        for _ in range(repeats):
            dist.barrier()
            start = now_s()
            dist.all_reduce(buf, group=group)
            runs.append(now_s() - start)
        times.append(statistics.median(runs))
    alpha, beta = fit_alpha_beta(FIT_SIZES_BYTES, times, size or dist.get_world_size())
    return {"alpha_s": alpha, "beta_s_per_byte": beta}


def _fit_tiers(per_node: int) -> dict[str, dict[str, float]]:
    """One fit inside a node (its ranks) and one across nodes (the ranks of one local rank), all ranks at once."""
    nodes = Mesh(dp=dist.get_world_size() // per_node, tp=per_node)   # a node's ranks share a "tp" group
    inside, across = my_group(nodes.members("tp")), my_group(nodes.members("dp"))
    return {"intra": _fit_link(inside.group, inside.size), "inter": _fit_link(across.group, across.size)}


def _compute_only_s(cfg: ScoreConfig, dp: int, alone: AxisGroup, repeats: int = 3) -> float:
    """Median seconds of one unsplit step at the dp share, every rank computing at once (no communication: the
    layer's f and g run on ``alone``, this rank's group of one)."""
    model = build_stack(cfg, Layout(dp=1), alone)
    step = TrainStep(model, torch.optim.Adam(model.parameters(), lr=1e-4), loss_fn=probe_loss)
    feed = tuple(v.chunk(dp)[0].contiguous() for v in layer_inputs(cfg.shape()))
    step(*feed)
    runs = []
    for _ in range(repeats):
        dist.barrier()
        start = now_s()
        step(*feed)
        runs.append(now_s() - start)
    return statistics.median(runs)


def _calibrate(cfg: ScoreConfig, per_node: int | None) -> dict:
    """This rank's link fit (per tier when ``per_node`` ranks share a node), matmul rate and compute-only step at
    every dp share of the world."""
    link = _fit_tiers(per_node) if per_node else dict.fromkeys(("intra", "inter"), _fit_link())
    peak, _ = measured_matmul_flops_per_s("cpu", size=256)
    world = dist.get_world_size()
    alone = my_group(Mesh(dp=world).members("tp"))           # every rank a tp group of one
    compute = {str(d): _compute_only_s(cfg, d, alone) for d in range(1, world + 1) if world % d == 0}
    return {"link": link, "per_node": per_node or world, "matmul_flops_per_s": peak, "compute_only_s": compute}


def _planner_choice(cfg: ScoreConfig, mine: dict, space: Space) -> tuple[list[Layout], list[str]]:
    """Every rank's calibration gathered, the planner's ranking within ``space`` (of what this runner executes) and
    its picks, every axis covered (rank 0's, shared)."""
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    ranked = rank_runnable(every, cfg, space, runs=lambda lay: runs_here(cfg, lay, len(every)))
    choice = [[ranked[i].layout for i in cover_axes(ranked, pick_runs(ranked))], [p.layout.label() for p in ranked]]
    dist.broadcast_object_list(choice, src=0)
    return choice[0], choice[1]


def score_job(cfg_dict: dict, layout_dicts: list[dict], per_node: int | None = None, space: dict | None = None) -> dict:
    """One rank: calibration (:func:`_calibrate`); the layouts given, or the planner's picks within ``space``;
    then every layout's memory and timed rounds."""
    cfg, rank = ScoreConfig(**cfg_dict), dist.get_rank()
    out = _calibrate(cfg, per_node)
    ranking: list[str] = []
    if layout_dicts:
        layouts = [Layout(**d) for d in layout_dicts]
    else:
        layouts, ranking = _planner_choice(cfg, out, Space(**{k: v if v is None else tuple(v)
                                                               for k, v in (space or {}).items()}))
    shared: dict = {}
    steps = {lay.label(): _layout_step(cfg, lay, shared) for lay in layouts}
    layouts_by, memory = {lay.label(): lay for lay in layouts}, {}
    for name, step in steps.items():
        step()                                                  # warm-up, and Adam's state exists
        state = count_rank_state_bytes(step.model.parameters(), step.optimizer)
        memory[name] = {"params": step.held["params"], "grads": step.held["grads"], "optimizer": state["optimizer"],
                        "activations": _activation_bytes(cfg, step, layouts_by[name])}
    seconds: dict[str, list[float]] = {name: [] for name in steps}
    names = list(steps)
    with ShareMeter() as meter:
        for r in range(cfg.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                dist.barrier()
                start = now_s()
                steps[name]()
                seconds[name].append(now_s() - start)
    return {**out, "rank": rank, "layouts": [asdict(lay) for lay in layouts], "ranking": ranking,
            "memory": memory, "seconds": seconds, "cpu_share": meter.share}


def score_node_job() -> dict:
    """:func:`score_job` on emulated nodes: join the node launcher's group, read the job's parameters, report."""
    me = join_node_group()
    params = job_params()
    out = score_job(params["cfg"], params["layouts"], per_node=me.local_world_size, space=params.get("space"))
    return report({**out, "node": me.group_rank}, me.rank)


def run_layouts_on_nodes(cfg: ScoreConfig, layouts: list[Layout] | None = None, config: NodesConfig | None = None,
                         per_node: int = 2, timeout_s: float = 240.0, space: Space = RUNNABLE) -> list[dict]:
    """Build the emulated nodes (notebook 12's: namespaces and a shaped link), run :func:`score_node_job` on
    ``per_node`` ranks each (``layouts``, or the planner's picks within ``space``), tear the nodes down (always);
    every rank's report in rank order."""
    config = config or NodesConfig.fast()
    for layout in layouts or []:
        cfg.check_layout(layout, config.nodes * per_node)
    params = {"cfg": asdict(cfg), "layouts": [asdict(lay) for lay in layouts or []], "space": asdict(space)}
    with EmulatedNodes(config) as nodes:
        results = run_job(nodes, "labkit.plan.score_runs:score_node_job", nproc_per_node=per_node, params=params,
                          timeout_s=timeout_s).results
    return sorted(results, key=lambda r: r["rank"])


def run_layouts(cfg: ScoreConfig, layouts: list[Layout] | None = None, world_size: int = 4, timeout_s: float = 150.0,
                space: Space = RUNNABLE) -> list[dict]:
    """Run :func:`score_job` on ``world_size`` ranks under a timeout (``layouts``, or the planner's picks within
    ``space``); every rank's report, in rank order."""
    for layout in layouts or []:
        cfg.check_layout(layout, world_size)            # one clear error before any process starts
    return launch(score_job, world_size, args=(asdict(cfg), [asdict(lay) for lay in layouts or []]),
                  kwargs={"space": asdict(space)}, timeout_s=timeout_s, show_output=False)
