import matplotlib.pyplot as plt
import torch

from labkit.checkpoint.report import (bytes_figure, remainder_on_last_rows, rival_cut_differs, save_rows,
                                      shard_mismatches, timeline_figure)

from tests.checkpoint.conftest import CFG


def test_every_rank_holds_exactly_its_torch_chunk_of_the_saved_rows(runs):
    for world_size in (2, 3):
        assert shard_mismatches(runs["saved"], runs["resumed"][world_size]) == []


def test_a_wrong_shard_is_reported(runs):
    resumed = [dict(r, shards={k: v.clone() for k, v in r["shards"].items()}) for r in runs["resumed"][2]]
    name = next(iter(resumed[1]["shards"]))
    resumed[1]["shards"][name].view(-1)[0] += 1.0
    assert len(shard_mismatches(runs["saved"], resumed)) == 1


def _cut(full, world_size, rows_of):
    return [{"rank": rank, "shards": {name: t[slice(*rows_of(t.shape[0], world_size, rank))] for name, t in
                                      full.items()}} for rank in range(world_size)]


def test_shards_cut_the_rival_way_fail_and_the_run_can_tell_the_cuts_apart():
    # notebook 16's last layer: 8 rows on 3 ranks; torch.chunk gives 3, 3, 2, the rival 2, 2, 4
    full = {"w": torch.arange(16.0).view(8, 2), "b": torch.arange(6.0)}
    saved = [{"saved_state": {"model": full}}]
    rival = _cut(full, 3, remainder_on_last_rows)
    assert [tuple(r["shards"]["w"].shape) for r in rival] == [(2, 2), (2, 2), (4, 2)]
    assert len(shard_mismatches(saved, rival)) == 3             # every rank of w is off; b (6 rows) cuts alike
    assert rival_cut_differs(saved, rival) == ["w on rank 0 of 3: rows 0:2, not 0:3",
                                               "w on rank 1 of 3: rows 2:4, not 3:6",
                                               "w on rank 2 of 3: rows 4:8, not 6:8"]
    even = {"b": full["b"]}                                      # 6 rows on 3 ranks: the two cuts agree
    assert rival_cut_differs([{"saved_state": {"model": even}}], _cut(even, 3, remainder_on_last_rows)) == []


def test_figures_draw_from_the_runs(runs):
    fig = bytes_figure(save_rows(CFG, runs["root"], runs["saved"]))
    assert len(fig.axes[0].patches) == 8                      # 4 ranks x (torch.save, DCP)
    fig2 = timeline_figure(runs["async"])
    assert len(fig2.axes[0].patches) >= 8
    plt.close(fig)
    plt.close(fig2)
