"""The ladder's last rung on real processes: DDP over two gloo ranks."""
from labkit.core.data import make_loader
from labkit.ladder.climb import LadderJob, measure_recipe
from labkit.ladder.rungs import Capabilities, Recipe

from tests.ladder.fakes import smoke, tiny_mlp


def test_ddp_rung_on_two_gloo_processes(data):
    """The DDP rung for real: two gloo processes, global batch and LR scaled, accuracy read on rank 0."""
    caps = Capabilities("cpu", 2, "bf16", False, "", 2, "", 1)
    job = LadderJob(smoke(device="cpu"), tiny_mlp, data, "cpu", caps, make_loader(data.val, 16), 64)
    m = measure_recipe(job, Recipe(batch_size=8, world_size=2))
    assert m.samples_trained == 64 and m.steps == 4 and m.samples_per_s > 0 and 0 <= m.val_accuracy <= 1
