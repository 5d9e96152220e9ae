"""Notebook 16's "write the distributed code" exercise: save a model with ``dcp.save`` and load it with ``dcp.load``,
judged on 2 live gloo ranks (:mod:`labkit.comm.rank_answers`).

The learner writes ``save_and_load(model, fresh, folder)``: save ``model``'s state dict to ``folder`` with
``torch.distributed.checkpoint.save``, then load it into ``fresh`` (the same shape, other values) with
``torch.distributed.checkpoint.load``. In each rank :func:`save_load_case` builds both seeded models, gives every
answer on every case a folder of its own inside the launcher's run folder (removed with it, whatever the answer does),
and returns what the rank sees afterwards: the files in the folder and ``fresh``'s values. The kit's answer is
:func:`labkit.checkpoint.store.save_state` and ``load_state`` (the notebook's own save and resume). The model is
replicated, not ``fully_shard``-ed: FSDP2 took 0.16-0.24 s per save and load on 2 CPU ranks (3 s for the first),
too slow for four answers a case; DCP still writes one file per rank and a ``.metadata`` file.
"""
from __future__ import annotations

import os
import random
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn

from labkit.checkpoint.store import load_state, save_state
from labkit.comm.launch import RUN_DIR_PREFIX
from labkit.comm.rank_answers import RankExercise
from labkit.core.exercises import Mistake


def seeded_mlp(width: int, depth: int, seed: int) -> nn.Module:
    """``depth`` linear layers of ``width`` (ReLU between), then a head of 2; the same on every rank for a seed."""
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 2))


def _case_folder() -> str:
    """A new folder inside the launcher's run folder (a rank's first argument; ``launch`` removes it whatever
    happens); elsewhere a temporary one named like a run folder (a later launch removes it once its launcher has
    gone)."""
    given = Path(sys.argv[1]) if len(sys.argv) > 1 else None
    if given is not None and (given / "payload.pkl").is_file():
        return tempfile.mkdtemp(prefix="case-", dir=given)
    return tempfile.mkdtemp(prefix=f"{RUN_DIR_PREFIX}{os.environ.get('LABKIT_PARENT_PID', os.getpid())}-dcp-case-")


def save_load_case(answer: Callable[..., Any], width: int, depth: int, seed: int) -> dict:
    """In a rank: ``answer(model, fresh, folder)`` on seeded models and a new folder shared by the ranks; what that
    folder then holds (DCP's ``.metadata``, its per-rank files, others) and ``fresh``'s values, flattened. Rank 0
    removes the folder afterwards."""
    model, fresh = seeded_mlp(width, depth, seed), seeded_mlp(width, depth, seed + 1)
    where = [_case_folder() if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(where)
    try:
        answer(model, fresh, where[0])
        dist.barrier()                                          # every rank's files written before any is listed
        names = [p.name for p in Path(where[0]).iterdir()]
        files = {".metadata": ".metadata" in names, "rank files (.distcp)": sum(n.endswith(".distcp") for n in names),
                 "other files": sum(n != ".metadata" and not n.endswith(".distcp") for n in names)}
        values = torch.cat([t.detach().reshape(-1) for t in fresh.state_dict().values()]).tolist()
        dist.barrier()                                          # every rank has read before rank 0 removes
    finally:
        if dist.get_rank() == 0:
            shutil.rmtree(where[0], ignore_errors=True)
    return {"files": files, "values": values}


def save_load_cases(seed: int = 161) -> list[dict]:
    """Three seeded cases: small MLPs of another width, depth and seed each."""
    rng = random.Random(seed)
    return [{"width": rng.choice([3, 4, 6]), "depth": rng.choice([1, 2]), "seed": rng.randrange(1000)}
            for _ in range(3)]


def save_and_load(model: torch.nn.Module, fresh: torch.nn.Module, folder: str) -> None:
    """Save model's state dict to folder with DCP (each rank writes its own file), then load it into fresh."""
    import torch.distributed.checkpoint as dcp  # lazy: shipped to the ranks, the answer has only torch and dist
    dcp.save(model.state_dict(), checkpoint_id=folder)
    state = fresh.state_dict()                  # tensors that share fresh's storage: dcp.load fills them in place
    dcp.load(state, checkpoint_id=folder)
    fresh.load_state_dict(state)


def kit_save_and_load(model: nn.Module, fresh: nn.Module, folder: str) -> None:
    """The kit's save and resume (notebook 16, section 2), the optimizer's empty state beside the model's."""
    save_state(model, torch.optim.SGD(model.parameters(), lr=0.1), folder)
    load_state(fresh, torch.optim.SGD(fresh.parameters(), lr=0.1), folder, with_optimizer=False)


def _torch_save_on_rank_0(model: nn.Module, fresh: nn.Module, folder: str) -> None:
    """Mistake: one file written by rank 0 with torch.save, read by every rank."""
    if dist.get_rank() == 0:
        torch.save(model.state_dict(), f"{folder}/model.pt")
    dist.barrier()
    fresh.load_state_dict(torch.load(f"{folder}/model.pt", weights_only=True))   # tensors only: no pickled code


def _saved_not_loaded(model: nn.Module, fresh: nn.Module, folder: str) -> None:
    """Mistake: saved with DCP, never loaded into fresh."""
    dcp.save(model.state_dict(), checkpoint_id=folder)


SAVE_AND_LOAD = RankExercise(
    "dcp_save_and_load", "write save_and_load(model, fresh, folder): save model's state dict to folder with "
    "dcp.save(state_dict, checkpoint_id=folder), then load it into fresh (the same shape, other values) with dcp.load",
    save_and_load, kit_save_and_load, save_load_case, save_load_cases,
    (Mistake("torch_save_rank0", _torch_save_on_rank_0, "fresh has the right values, but the folder holds one "
             "torch.save file from rank 0, the rival 'gather to rank 0': dcp.save on every rank writes each rank's "
             "own file and a .metadata file, so no rank gathers the whole state"),
     Mistake("not_loaded", _saved_not_loaded, "fresh still holds its own values, the rival 'saved but never loaded': "
             "dcp.load(state, checkpoint_id=folder) fills the tensors of state = fresh.state_dict() in place")),
    "dcp.save(model.state_dict(), checkpoint_id=folder); state = fresh.state_dict(); dcp.load(state, "
    "checkpoint_id=folder); fresh.load_state_dict(state)", case_s=5.0)
