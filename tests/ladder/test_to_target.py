"""The ladder judged by time to the target: every timed rung gets an olympic mean over its seeds, a rung faster per
sample that misses the target does not win, a multi-process rung says why it was not timed."""
import dataclasses
import functools
import math

from labkit.core.data import load_data
from labkit.core.models import build_model
from labkit.ladder.config import LadderConfig
from labkit.ladder.report import LadderResult, LadderRow
from labkit.ladder.rungs import Recipe
from labkit.ladder.to_target import AIRBENCH_94_S, fastest_per_sample, rungs_to_target, time_table, winner


def _row(rung, batch, lr, samples_per_s, world_size=1):
    recipe = Recipe(batch_size=batch, sync_every_step=False, world_size=world_size)
    return LadderRow(rung, f"r{rung}", f"rung {rung}", "", "", "10", "baseline" if rung == 0 else "faster", "",
                     True, None, batch_size=batch, world_size=world_size, lr=lr, samples_per_s=samples_per_s,
                     recipe=dataclasses.asdict(recipe))


def test_a_faster_rung_that_misses_the_target_does_not_win():
    data = load_data("digits", image_size=8, train_limit=256, val_limit=100)
    config = LadderConfig.smoke(model="mlp", budget_epochs=1)
    rows = [_row(0, 16, 0.1, 100.0), _row(1, 32, 1e-6, 900.0), _row(2, 16, 0.1, 800.0, world_size=2)]
    result = LadderResult(rows, "CPU", "fast", "mlp", "digits", 256)
    model_fn = functools.partial(build_model, "mlp", data.num_classes, tuple(data.image_shape))
    times = rungs_to_target(result, config, data, target=0.6, seeds=[0, 1, 2], max_epochs=4, model_fn=model_fn)
    by_rung = {t.rung: t for t in times}
    assert by_rung[0].time.reached and math.isfinite(by_rung[0].time.olympic_mean_s)
    assert not by_rung[1].time.reached                              # LR too small: never gets there
    assert by_rung[2].time is None and "multi-process" in by_rung[2].reason
    assert fastest_per_sample(times).rung == 1 and winner(times).rung == 0
    table = time_table(times)
    assert list(table["rung"]) == [0, 1, 2] and "cannot win" in table.loc[1, "note"]
    assert AIRBENCH_94_S == 2.59
