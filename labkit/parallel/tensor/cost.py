"""What tensor and sequence parallelism cost and save, as formulas, and the saved activations counted by region.

Bytes: Narayanan et al. 2021 (SC21, arXiv:2104.04473): with tensor parallelism each layer does two
all-reduces in the forward pass and two in the backward pass, each over the b*s*h activations; a ring all-reduce
sends 2(t-1)/t of its buffer per rank (Patarasuk & Yuan 2009). Sequence parallelism swaps each all-reduce for a
reduce-scatter plus an all-gather, (t-1)/t each: the same ideal volume (Korthikanti et al. 2022, Section 4.2.2).

Activations: Korthikanti et al. 2022 (arXiv:2205.05198, Section 4.1, Eq. 1-3 and Table 2) count one layer's
activations in 16-bit with 1-byte dropout masks as sbh(34 + 5as/h) bytes: attention 11sbh + 5as^2b, MLP 19sbh,
the two layer norms 4sbh. Tensor parallelism divides all but 10sbh of it by t (the norms' inputs, the inputs of
the QKV and first MLP linears, and two dropout masks); sequence parallelism divides those 10sbh too.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import nn

from labkit.core.validation import positive_int
from labkit.memory.saved import storage_bytes, storage_key, storage_keys, watch_saved
from labkit.sharding.comm_volume import ring_bytes_sent

ALL_REDUCES_PER_LAYER = 4          # two per block kind (attention, MLP): one forward, one backward


def tp_bytes_per_layer(batch: int, seq_len: int, hidden: int, world_size: int, bytes_per_element: int = 4) -> float:
    """Bytes one rank sends per layer (forward + backward) under tensor parallelism with ring all-reduces."""
    activation_bytes = positive_int(batch, "batch") * positive_int(seq_len, "seq_len") * \
        positive_int(hidden, "hidden") * positive_int(bytes_per_element, "bytes_per_element")
    return ALL_REDUCES_PER_LAYER * ring_bytes_sent("all_reduce", activation_bytes, world_size)


def sp_bytes_per_layer(batch: int, seq_len: int, hidden: int, world_size: int, bytes_per_element: int = 4) -> float:
    """The same with sequence parallelism: a reduce-scatter + an all-gather where TP all-reduces (equal volume)."""
    activation_bytes = batch * seq_len * hidden * bytes_per_element
    pair = ring_bytes_sent("reduce_scatter", activation_bytes, world_size) + \
        ring_bytes_sent("all_gather", activation_bytes, world_size)
    return ALL_REDUCES_PER_LAYER * pair


def korthikanti_terms(seq_len: int, batch: int, hidden: int, heads: int) -> dict[str, float]:
    """Each named term of one layer's activation bytes (16-bit values, 1-byte dropout masks), unsplit."""
    sbh, as2b = seq_len * batch * hidden, heads * seq_len * seq_len * batch
    return {"attention: QKV input": 2 * sbh, "attention: Q and K": 4 * sbh, "attention: softmax output": 2 * as2b,
            "attention: softmax dropout mask": as2b, "attention: dropout output (V's weights)": 2 * as2b,
            "attention: V": 2 * sbh, "attention: output-projection input": 2 * sbh,
            "attention: output dropout mask": sbh, "MLP: fc1 input": 2 * sbh, "MLP: GELU input": 8 * sbh,
            "MLP: fc2 input": 8 * sbh, "MLP: dropout mask": sbh, "layer norms: two inputs": 4 * sbh}


# the terms tensor parallelism does not split (Korthikanti et al. 2022, Section 4.2.1): 10sbh
REPLICATED_TERMS = ("attention: QKV input", "attention: output dropout mask", "MLP: fc1 input", "MLP: dropout mask",
                    "layer norms: two inputs")


def korthikanti_bytes(seq_len: int, batch: int, hidden: int, heads: int, world_size: int = 1,
                      sequence_parallel: bool = False) -> float:
    """Per-rank activation bytes of one layer: Eq. 1 (t=1), Eq. 2 (TP), Eq. 3 (TP + SP) of Korthikanti et al."""
    t = positive_int(world_size, "world_size")
    terms = korthikanti_terms(seq_len, batch, hidden, heads)
    replicated = sum(terms[k] for k in REPLICATED_TERMS)
    split = sum(terms.values()) - replicated
    return (replicated + split) / t if sequence_parallel else replicated + split / t


def norm_region_bytes(seq_len: int, batch: int, hidden: int, world_size: int = 1, sequence_parallel: bool = False,
                      bytes_per_element: int = 4) -> int:
    """What the kit's layer (no dropout) keeps outside the split blocks: each norm's input, mean and 1/std, and its
    output (the input of the QKV / fc1 linears); sequence parallelism keeps 1/t of the sequence of each."""
    t = positive_int(world_size, "world_size") if sequence_parallel else 1
    tokens = seq_len * batch // t
    return 2 * (2 * tokens * hidden + 2 * tokens) * bytes_per_element


class SavedBytes:
    """Bytes autograd keeps for backward, by region: 'norm' for what the norm modules save and for their outputs
    (which the next linears save), 'split' for the rest; each storage once, parameters left out."""

    def __init__(self, model: nn.Module, norm_modules: list[nn.Module]) -> None:
        self.model, self.norm_modules = model, norm_modules
        self.by_region: dict[str, dict[int, int]] = {"norm": {}, "split": {}}
        self._region = "split"
        self._params = storage_keys(p.to_local() if hasattr(p, "to_local") else p
                                    for p in model.parameters())   # a DTensor's storage is its local shard
        self._norm_outputs: set[int] = set()

    def _on_save(self, t: torch.Tensor) -> None:
        if isinstance(t, nn.Parameter):            # FSDP2's gathered weights are Parameters too
            return
        key = storage_key(t)
        if key not in self._params and not any(key in r for r in self.by_region.values()):
            region = "norm" if key in self._norm_outputs else self._region
            self.by_region[region][key] = storage_bytes(t)

    def _enter(self, *_: object) -> None:
        self._region = "norm"

    def _leave(self, _module: nn.Module, _inputs: object, output: torch.Tensor) -> None:
        self._region = "split"
        self._norm_outputs.add(storage_key(output))

    @contextlib.contextmanager
    def recording(self) -> Iterator["SavedBytes"]:
        """Record during one forward pass (no backward may follow: the saved tensors are detached copies)."""
        handles = [h for m in self.norm_modules
                   for h in (m.register_forward_pre_hook(self._enter), m.register_forward_hook(self._leave))]
        try:
            with watch_saved(self._on_save):
                yield self
        finally:
            for h in handles:
                h.remove()

    def totals(self) -> dict[str, int]:
        """{'norm': bytes, 'split': bytes}."""
        return {k: sum(v.values()) for k, v in self.by_region.items()}
