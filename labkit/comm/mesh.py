"""The one grid of ranks: the parallel degrees checked once, every divisibility rule in one place, the groups built once.

The grid is picotron's ``arange(world).view(dp, pp, cp, tp)``: rank = ((dp_i * pp + pp_i) * cp + cp_i) * tp + tp_i.
tp is the fastest axis, so consecutive ranks share a tensor-parallel group. tp's traffic is the heaviest on the
critical path (four all-reduces of the activations per layer per micro-batch, none of them overlapped with compute:
Narayanan et al. 2021, SC21, arXiv:2104.04473, Section 3.3), so its groups belong inside a node, where the links are
fastest; dp, which talks once per step and overlaps backward, spans nodes.

Expert parallelism borrows ranks, as in torchtitan's ``ParallelDims``: the ``ep`` ranks of an expert group are
consecutive members of one data x context group (``("dp", "cp")``), which is also the group gradient reduction and
ZeRO/FSDP span (Megatron-LM, FSDP). So ``world_size = dp * pp * cp * tp`` and ep must divide dp * cp.

The grid itself needs no torch; :func:`process_groups` and :func:`device_mesh` run inside a launched rank.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Iterable, Sequence

from labkit.core.validation import positive_int

AXES = ("dp", "pp", "cp", "tp")            # slowest to fastest: picotron's view(dp, pp, cp, tp)
COMBINED = (("dp", "cp"),)                 # the flattened axes process_groups also builds: gradients, ZeRO/FSDP


def _axis_tuple(axis: str | Iterable[str]) -> tuple[str, ...]:
    names = (axis,) if isinstance(axis, str) else tuple(axis)
    unknown = [a for a in names if a not in AXES + ("ep",)]
    if unknown or not names:
        raise ValueError(f"axis must be one of {AXES + ('ep',)} or a tuple of them, got {axis!r}")
    if "ep" in names and len(names) > 1:
        raise ValueError("ep is carved out of ('dp', 'cp'): ask for 'ep' on its own")
    return names


def axis_key(axis: str | Iterable[str]) -> str:
    """The name a (possibly combined) axis goes by: 'tp', or 'dp_cp' for ('dp', 'cp') (torchtitan's flattened name)."""
    return "_".join(_axis_tuple(axis))


@dataclass(frozen=True)
class Mesh:
    """The degrees of each parallelism on one grid of ``dp * pp * cp * tp`` ranks (ep borrowed from dp x cp)."""

    dp: int = 1
    pp: int = 1
    cp: int = 1
    tp: int = 1
    ep: int = 1

    def __post_init__(self) -> None:
        for f in fields(self):
            positive_int(getattr(self, f.name), f.name, hint="a parallel degree: how many ranks share that axis")
        if (self.dp * self.cp) % self.ep:
            raise ValueError(f"ep={self.ep} must divide dp * cp = {self.dp * self.cp}: expert groups are carved out "
                             "of the data x context ranks (torchtitan's rule); pick ep among its divisors")

    @property
    def world_size(self) -> int:
        """How many ranks the grid holds: dp * pp * cp * tp."""
        return self.dp * self.pp * self.cp * self.tp

    @property
    def shape(self) -> tuple[int, ...]:
        """The grid's shape in axis order (dp, pp, cp, tp)."""
        return tuple(getattr(self, a) for a in AXES)

    def active_axes(self) -> tuple[str, ...]:
        """The axes with more than one rank, in grid order (what a DeviceMesh needs)."""
        return tuple(a for a in AXES if getattr(self, a) > 1)

    def label(self) -> str:
        """'dp2 x tp2'-style name of the axes in use ('single rank' for none)."""
        return " x ".join(f"{a}{getattr(self, a)}" for a in self.active_axes()) or "single rank"

    @classmethod
    def from_world(cls, world_size: int, **degrees: int) -> "Mesh":
        """The mesh of ``world_size`` ranks with the given degrees and dp filling the rest."""
        world_size = positive_int(world_size, "world_size")
        if "dp" in degrees:
            raise ValueError("from_world fills dp itself: give pp, cp, tp (and ep), or build Mesh(dp=...) directly")
        other = 1
        for name in ("pp", "cp", "tp"):
            other *= positive_int(degrees.get(name, 1), name)
        if world_size % other:
            raise ValueError(f"pp * cp * tp = {other} must divide world_size={world_size}: dp fills the rest")
        return cls(dp=world_size // other, **degrees)

    # ----------------------------------------------------------------------------------------- positions
    def coords(self, rank: int) -> dict[str, int]:
        """Where ``rank`` sits: its index along each axis (dp, pp, cp, tp)."""
        if not isinstance(rank, int) or not 0 <= rank < self.world_size:
            raise ValueError(f"rank must be an int in [0, {self.world_size}), got {rank!r}")
        out, rest = {}, rank
        for axis in reversed(AXES):                       # tp fastest: peel it off first
            out[axis] = rest % getattr(self, axis)
            rest //= getattr(self, axis)
        return {a: out[a] for a in AXES}

    def rank_of(self, **coords: int) -> int:
        """The rank at these coordinates (an axis left out counts as 0)."""
        bad = sorted(set(coords) - set(AXES))
        if bad:
            raise ValueError(f"unknown axes {bad}: coordinates are {AXES}")
        rank = 0
        for axis in AXES:
            i, size = coords.get(axis, 0), getattr(self, axis)
            if not isinstance(i, int) or not 0 <= i < size:
                raise ValueError(f"{axis}={i!r} is off the grid: {axis} runs 0..{size - 1}")
            rank = rank * size + i
        return rank

    def members(self, axis: str | Iterable[str]) -> list[list[int]]:
        """Every group of ``axis`` (or of a combined axis such as ``("dp", "cp")``) as ascending lists of ranks."""
        names = _axis_tuple(axis)
        if names == ("ep",):
            return [group[i:i + self.ep] for group in self.members(("dp", "cp")) for i in range(0, len(group), self.ep)]
        groups: dict[tuple[int, ...], list[int]] = {}
        for rank in range(self.world_size):
            c = self.coords(rank)
            groups.setdefault(tuple(c[a] for a in AXES if a not in names), []).append(rank)
        return list(groups.values())

    def group_of(self, rank: int, axis: str | Iterable[str]) -> list[int]:
        """The ranks in ``rank``'s group of ``axis`` (itself included)."""
        self.coords(rank)
        return next(g for g in self.members(axis) if rank in g)

    # ----------------------------------------------------------------------------------------- the rules
    def model_problems(self, *, heads: int | None = None, kv_heads: int | None = None, layers: int | None = None,
                       seq_len: int | None = None, batch: int | None = None, experts: int | None = None,
                       uneven_layers: bool = False) -> list[str]:
        """Every divisibility rule this mesh puts on a model, one line per violation (empty: the model fits)."""
        problems = []
        if self.tp > 1:
            for name, n in (("heads", heads), ("kv_heads", kv_heads)):
                if n is not None and n % self.tp:
                    problems.append(f"tp: {name}={n} must be divisible by tp={self.tp} (each tp rank holds whole "
                                    f"heads); fix: tp in {_divisors(n)}")
        if layers is not None and self.pp > 1:
            if layers < self.pp:
                problems.append(f"pp: layers={layers} < pp={self.pp}: every stage needs a layer; fix: pp <= {layers}")
            elif layers % self.pp and not uneven_layers:
                problems.append(f"pp: layers={layers} must be divisible by pp={self.pp} (equal stages); fix: pp in "
                                f"{_divisors(layers)}, or uneven_layers=True (stages differ by one layer)")
        divisor = seq_divisor(self.tp, self.cp)
        if seq_len is not None and seq_len % divisor:
            parts = ([f"tp={self.tp} (sequence parallelism)"] if self.tp > 1 else []) + \
                    ([f"2*cp={2 * self.cp} (zig-zag causal split)"] if self.cp > 1 else [])
            problems.append(f"seq: seq_len={seq_len} must be divisible by {' x '.join(parts)} = {divisor}; fix: "
                            f"seq_len={-(-seq_len // divisor) * divisor} (pad) or smaller tp/cp")
        if batch is not None and batch % self.dp:
            problems.append(f"dp: global batch={batch} must be divisible by dp={self.dp} (equal shares); fix: batch="
                            f"{-(-batch // self.dp) * self.dp} or dp in {_divisors(batch)}")
        if experts is not None and experts % self.ep:
            problems.append(f"ep: experts={experts} must be divisible by ep={self.ep} (equal experts per rank); fix: "
                            f"ep in {_divisors(experts)}")
        return problems

    def check_model(self, **sizes: Any) -> "Mesh":
        """Raise ValueError listing every rule the model breaks (see :meth:`model_problems`); the mesh if none."""
        problems = self.model_problems(**sizes)
        if problems:
            raise ValueError(f"the model does not fit the mesh {self.label()}:\n" + "\n".join(problems))
        return self


def seq_divisor(tp: int, cp: int) -> int:
    """What the sequence length must be a multiple of: tp (sequence parallelism) x 2cp (zig-zag), for axes > 1
    (torchtitan's ``seq_len_divisor``)."""
    return (tp if tp > 1 else 1) * (2 * cp if cp > 1 else 1)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


# --------------------------------------------------------------------------------------------- inside a rank
@dataclass(frozen=True)
class AxisGroup:
    """This rank's group along one axis: the process group, its global ranks, and this rank's index in it."""

    group: Any
    ranks: tuple[int, ...]
    index: int

    @property
    def size(self) -> int:
        """How many ranks the group holds."""
        return len(self.ranks)


def group_plan(mesh: Mesh) -> list[tuple[str, list[int]]]:
    """Every group :func:`process_groups` creates, in the order every rank creates them: (axis key, ranks)."""
    axes: list[str | tuple[str, ...]] = [*AXES, *COMBINED, "ep"]
    return [(axis_key(a), ranks) for a in axes for ranks in mesh.members(a)]


def new_groups(members: Sequence[Sequence[int]]) -> list[AxisGroup | None]:
    """One process group per list of ranks, created in the given order on every rank (as ``new_group`` requires);
    this rank's :class:`AxisGroup` for each list it is in, None for the others. The kit's one builder of groups of
    members: the mesh's axes, a node's ranks and the nodes' leaders, the first R ranks of a scaling sweep."""
    import torch.distributed as dist   # lazy: the grid above is torch-free (the planner uses it)
    rank, out = dist.get_rank(), []
    for ranks in members:
        ranks = [int(r) for r in ranks]
        group = dist.new_group(ranks)
        out.append(AxisGroup(group, tuple(ranks), ranks.index(rank)) if rank in ranks else None)
    return out


def my_group(members: Sequence[Sequence[int]]) -> AxisGroup:
    """Create every group of ``members`` (all ranks must, in the same order) and return this rank's."""
    mine = [g for g in new_groups(members) if g is not None]
    if len(mine) != 1:
        raise ValueError(f"this rank must be in exactly one of {list(map(list, members))}, found {len(mine)}")
    return mine[0]


def process_groups(mesh: Mesh) -> dict[str, AxisGroup]:
    """Create every group of every axis (same order on every rank, as ``new_group`` requires); this rank's per axis.

    Keys: 'dp', 'pp', 'cp', 'tp', 'dp_cp' (gradient reduction and ZeRO/FSDP span it) and 'ep'. Call after
    ``init_process_group`` on a world of ``mesh.world_size`` ranks."""
    import torch.distributed as dist   # lazy: the grid above is torch-free (the planner uses it)
    world = dist.get_world_size()
    if world != mesh.world_size:
        raise ValueError(f"the mesh {mesh.label()} holds {mesh.world_size} ranks but the process group has {world}")
    plan = group_plan(mesh)
    return {key: group for (key, _), group in zip(plan, new_groups([ranks for _, ranks in plan])) if group is not None}


def device_mesh(mesh: Mesh, device_type: str = "cpu") -> Any:
    """torch's DeviceMesh over the axes > 1, named as here (('dp',) of size 1 on a single rank), for DTensor/FSDP2."""
    from torch.distributed.device_mesh import init_device_mesh   # lazy: torch-free grid
    names = mesh.active_axes() or ("dp",)
    return init_device_mesh(device_type, tuple(getattr(mesh, a) for a in names), mesh_dim_names=names)
