"""The kit's one door to torch's private APIs: each behind one name here, with what the kit does without it.

A private torch name (a ``_`` in its path) has no deprecation cycle: any release may move or drop it. So no other
module of the kit touches one (``tests/test_layout.py`` keeps it so); each is wrapped below, and a torch that lacks
it costs one feature, said in one line, never an import error of the kit. Checked on torch 2.14.1 (CPU and CUDA
builds); "since" is the release the kit's earlier notes or torch's own docs date it to, where known.

==============================  ============================================================  =====================
name here                       torch API behind it (since)                                   when missing
==============================  ============================================================  =====================
dynamo_unsupported_reason()     ``torch._dynamo.is_dynamo_supported`` (2.0; imported lazily:  a reason string: the
                                heavy, and may fail to import)                                 ladder's compile rung
                                                                                               says "no compiler"
has_triton()                    ``torch.utils._triton.has_triton`` (lazily)                    False: "Triton is not
                                                                                               installed"
TorchDispatchMode               ``torch.utils._python_dispatch.TorchDispatchMode``             a stand-in that raises
                                                                                               one line when used
tensor_leaves(tree)             ``torch.utils._pytree.tree_flatten``                           a plain walk of
                                                                                               tuples, lists, dicts
record_memory_history(on)       ``torch.cuda.memory._record_memory_history`` (2.1 docs)        RuntimeError naming
dump_memory_snapshot(path)      ``torch.cuda.memory._dump_snapshot`` (2.1)                     the memory snapshot
cpu_has_native_bf16()           ``torch.ops.mkldnn._is_mkldnn_bf16_supported``                 False: no bf16 roof
flight_record_pickle(...)       ``torch._C._distributed_c10d._dump_nccl_trace`` (NCCL) and     None: the reader says
                                ``_dump_fr_trace`` (any backend, gloo included)                no dump was written
context_parallel_unshard()      ``torch.distributed.tensor.experimental._attention.``          None: torch's CP says
                                ``context_parallel_unshard`` (2.7, a prototype)                NOT CHECKED, and why
storage_identity(storage)       ``UntypedStorage._cdata`` (the StorageImpl's address)          RuntimeError naming
                                                                                               meta-storage counting
==============================  ============================================================  =====================
"""
from __future__ import annotations

import os
from typing import Any, Callable

import torch

try:
    from torch.utils._python_dispatch import TorchDispatchMode
except ImportError:            # a torch without it: the operator accounting says so when used, the kit still imports
    class TorchDispatchMode:  # type: ignore[no-redef]
        """Stand-in for torch's TorchDispatchMode where this torch has none: using it raises one line."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            raise RuntimeError(f"operator accounting needs torch.utils._python_dispatch.TorchDispatchMode, which "
                               f"torch {torch.__version__} does not have (checked on 2.14.1)")

try:
    from torch.utils._pytree import tree_flatten as _tree_flatten
except ImportError:
    _tree_flatten = None


def dynamo_unsupported_reason() -> str | None:
    """Why TorchDynamo (torch.compile's front end) cannot run here, or None when it can. Imports it lazily."""
    try:
        import torch._dynamo as dynamo

        if not dynamo.is_dynamo_supported():
            return "TorchDynamo does not support this Python/platform"
    except Exception as err:  # noqa: BLE001 - any import failure means "no compiler"
        return f"torch._dynamo unavailable ({type(err).__name__})"
    return None


def has_triton() -> bool:
    """Whether Triton (Inductor's GPU code generator) is usable here; False where torch cannot say."""
    try:
        from torch.utils._triton import has_triton as probe
    except ImportError:
        return False
    return bool(probe())


def _walk(tree: Any) -> list:
    """Leaves of nested tuples, lists and dicts: the fallback for torch's pytree."""
    if isinstance(tree, (list, tuple)):
        return [leaf for item in tree for leaf in _walk(item)]
    if isinstance(tree, dict):
        return [leaf for item in tree.values() for leaf in _walk(item)]
    return [tree]


def tensor_leaves(tree: Any) -> list[torch.Tensor]:
    """Every tensor in a nested structure of an operator's arguments or outputs, in order."""
    leaves = _tree_flatten(tree)[0] if _tree_flatten is not None else _walk(tree)
    return [t for t in leaves if isinstance(t, torch.Tensor)]


def _cuda_memory_api(name: str) -> Callable:
    api = getattr(torch.cuda.memory, name, None)
    if api is None:
        raise RuntimeError(f"the CUDA memory snapshot needs torch.cuda.memory.{name}, which torch "
                           f"{torch.__version__} does not have (checked on 2.14.1)")
    return api


def record_memory_history(on: bool, max_entries: int = 100_000) -> None:
    """Start (``on``) or stop recording the CUDA caching allocator's history, for :func:`dump_memory_snapshot`."""
    record = _cuda_memory_api("_record_memory_history")
    if on:
        record(max_entries=max_entries)
    else:
        record(enabled=None)


def dump_memory_snapshot(path: str | os.PathLike) -> None:
    """Write the recorded allocator history as a pickle (drag it onto https://pytorch.org/memory_viz)."""
    _cuda_memory_api("_dump_snapshot")(str(path))


def cpu_has_native_bf16() -> bool:
    """Whether oneDNN runs bf16 matmuls natively on this CPU (AVX512-BF16 or AMX); False where torch cannot say."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def flight_record_pickle(nccl: bool, stack_traces: bool = True) -> bytes | None:
    """This process's flight-recorder dump (NCCL's own recorder, or the generic one gloo fills) as pickle bytes,
    or None where this torch build has no such API."""
    try:  # private and build-dependent: absent in older builds and in builds without distributed
        if nccl:
            from torch._C._distributed_c10d import _dump_nccl_trace as dump  # lazy: private, build-dependent
        else:
            from torch._C._distributed_c10d import _dump_fr_trace as dump  # lazy: private, build-dependent
    except ImportError:
        return None
    return dump(True, stack_traces, False)      # (include collectives, include stack traces, only active)


def context_parallel_unshard() -> Callable | None:
    """torch's context_parallel_unshard (gathers a context-parallel output back), or None where torch lacks it."""
    try:
        from torch.distributed.tensor.experimental._attention import (  # lazy: a prototype API, guarded
            context_parallel_unshard as unshard)
    except ImportError:
        return None
    return unshard


def storage_identity(storage: torch.UntypedStorage) -> int:
    """A number naming one storage for as long as it lives, also on the meta device (where data_ptr() is 0)."""
    identity = getattr(storage, "_cdata", None)
    if identity is None:
        raise RuntimeError(f"counting meta-tensor storages needs UntypedStorage._cdata, which torch "
                           f"{torch.__version__} does not have (checked on 2.14.1)")
    return int(identity)
