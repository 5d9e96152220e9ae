"""labkit.core.torch_compat: each private torch API works through its one name here, and a torch without it
costs one feature in one line (the missing case is played by removing the attribute)."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode as TorchsMode

from labkit.core import torch_compat as tc


def test_importing_it_leaves_the_compiler_probes_unloaded():
    code = ("import sys, labkit.core.torch_compat\n"
            "heavy = [m for m in ('torch._dynamo', 'torch.utils._triton') if m in sys.modules]\n"
            "assert not heavy, heavy\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_the_compiler_probes_answer_here():
    reason = tc.dynamo_unsupported_reason()
    assert reason is None or reason.startswith(("TorchDynamo", "torch._dynamo unavailable"))
    assert isinstance(tc.has_triton(), bool)


def test_the_dispatch_mode_is_torchs_own_on_this_torch():
    assert tc.TorchDispatchMode is TorchsMode


def test_tensor_leaves_finds_every_tensor_with_torchs_pytree_and_without_it(monkeypatch):
    a, b, c = torch.zeros(1), torch.ones(2), torch.full((3,), 2.0)
    tree = ((a, 3, [b, None]), {"out": c, "n": "x"})
    assert [t is u for t, u in zip(tc.tensor_leaves(tree), (a, b, c))] == [True] * 3
    monkeypatch.setattr(tc, "_tree_flatten", None)                 # a torch without _pytree: the plain walk
    assert [t is u for t, u in zip(tc.tensor_leaves(tree), (a, b, c))] == [True] * 3
    assert len(tc.tensor_leaves(tree)) == 3


def test_the_cpu_bf16_probe_is_a_bool_and_false_where_torch_cannot_say(monkeypatch):
    assert isinstance(tc.cpu_has_native_bf16(), bool)
    monkeypatch.setattr(torch.ops, "mkldnn", object())              # no such op: the probe says no
    assert tc.cpu_has_native_bf16() is False


def test_a_missing_memory_snapshot_api_is_one_line_naming_it(monkeypatch, tmp_path):
    monkeypatch.delattr(torch.cuda.memory, "_record_memory_history")
    with pytest.raises(RuntimeError, match=r"^the CUDA memory snapshot needs torch\.cuda\.memory\._record_memory"):
        tc.record_memory_history(True)
    monkeypatch.delattr(torch.cuda.memory, "_dump_snapshot")
    with pytest.raises(RuntimeError, match=r"_dump_snapshot, which torch .* does not have \(checked on 2\.14\.1\)$"):
        tc.dump_memory_snapshot(tmp_path / "snap.pickle")


def test_the_flight_recorder_dump_is_a_pickle_here_or_none():
    blob = tc.flight_record_pickle(nccl=False, stack_traces=False)
    assert blob is None or (isinstance(blob, bytes) and blob[:1] == b"\x80")     # pickle protocol marker


def test_context_parallel_unshard_is_found_on_this_torch():
    unshard = tc.context_parallel_unshard()
    assert unshard is None or callable(unshard)
    if torch.__version__.startswith("2.14"):
        assert callable(unshard)


def test_storage_identity_names_one_meta_storage_and_tells_two_apart():
    with torch.device("meta"):
        a, b = torch.empty(3), torch.empty(3)
    assert tc.storage_identity(a.untyped_storage()) == tc.storage_identity(a[1:].untyped_storage())
    assert tc.storage_identity(a.untyped_storage()) != tc.storage_identity(b.untyped_storage())


def test_a_storage_without_an_identity_is_one_line_naming_the_feature():
    with pytest.raises(RuntimeError, match=r"^counting meta-tensor storages needs UntypedStorage\._cdata"):
        tc.storage_identity(object())            # type: ignore[arg-type]
