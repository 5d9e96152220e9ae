import matplotlib.pyplot as plt

from labkit.checkpoint.report import bytes_figure, save_rows, shard_mismatches, timeline_figure

from tests.checkpoint.conftest import CFG


def test_every_rank_holds_exactly_its_torch_chunk_of_the_saved_rows(runs):
    for world_size in (2, 3):
        assert shard_mismatches(runs["saved"], runs["resumed"][world_size]) == []


def test_a_wrong_shard_is_reported(runs):
    resumed = [dict(r, shards={k: v.clone() for k, v in r["shards"].items()}) for r in runs["resumed"][2]]
    name = next(iter(resumed[1]["shards"]))
    resumed[1]["shards"][name].view(-1)[0] += 1.0
    assert len(shard_mismatches(runs["saved"], resumed)) == 1


def test_figures_draw_from_the_runs(runs):
    fig = bytes_figure(save_rows(CFG, runs["root"], runs["saved"]))
    assert len(fig.axes[0].patches) == 8                      # 4 ranks x (torch.save, DCP)
    fig2 = timeline_figure(runs["async"])
    assert len(fig2.axes[0].patches) >= 8
    plt.close(fig)
    plt.close(fig2)
