"""Stand-ins for the ladder's trainer and ceiling whose numbers are known functions of the recipe, so rung logic
is checked exactly; the fake trainer moves the model to the run's device, so the tests hold on a CPU and a GPU alike.
"""
import functools
from types import SimpleNamespace

from torch.utils.data import DataLoader

from labkit.core.models import MLP
from labkit.ladder.config import LadderConfig

SHAPE = (3, 8, 8)
MEASURED = ("baseline", "faster", "slower", "no clear gain")



tiny_mlp = functools.partial(MLP, 10, 3 * 8 * 8, 16)   # picklable, so the DDP rung can send it to its ranks


def fake_rate(batch: int, cfg, workers: int, device_data: bool) -> float:
    """Known samples/s per recipe: batch helps up to 8, workers and bf16 hurt, device data +30%,
    no-sync +20%, channels_last +50%, compile +1% (under the 3% bar)."""
    rate = 10.0 * min(batch, 8)
    rate *= 0.5 if workers else 1.0
    rate *= 1.3 if device_data else 1.0
    rate *= 1.2 if not cfg.sync_every_step else 1.0
    rate *= 0.1 if cfg.spec.precision else 1.0
    rate *= 1.5 if cfg.spec.channels_last else 1.0
    rate *= 1.01 if cfg.spec.compile else 1.0
    return rate


def fake_trainer(model, loader, cfg, val_loader=None, callback=None):
    """Stands in for labkit.training.loop.train: puts the model on the run's device (as train does) and returns step
    records whose times give exactly fake_rate(); ``callback`` runs every ``cfg.log_every`` steps, True stops."""
    model.to(cfg.device)
    batch = int(next(iter(loader))[0].shape[0])
    rate = fake_rate(batch, cfg, getattr(loader, "num_workers", 0), not isinstance(loader, DataLoader))
    step_s = batch / rate
    steps, stopped = [], False
    for i in range(cfg.steps):
        time_s = step_s * (3.0 if i < cfg.warmup_steps else 1.0)
        steps.append(SimpleNamespace(samples=batch, step_time_s=time_s, samples_per_s=batch / time_s))
        if callback is not None and (i + 1) % cfg.log_every == 0 and callback(steps[-1], SimpleNamespace(records=steps)):
            stopped = True
            break
    return SimpleNamespace(steps=steps, samples_per_s_median=rate, data_wait_fraction=0.25, peak_mem_bytes=1000,
                           flops_per_sample=None, samples_per_s_p10=rate, stopped_early=stopped)


def fake_ceiling(model, batch_size, config, *, image_shape, num_classes, sample_from):
    """Stands in for labkit.training.ceiling.measure_ceiling: 200 samples/s, and it checks what it was given."""
    assert batch_size == 8 and image_shape == SHAPE and num_classes == 10 and config.steps >= 4
    assert len(sample_from) >= batch_size                        # the job's own training samples, not noise
    return SimpleNamespace(samples_per_s_median=200.0)


def smoke(**overrides):
    return LadderConfig.smoke(**{"batch_candidates": (2, 8, 16), **overrides})
