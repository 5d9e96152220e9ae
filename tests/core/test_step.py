"""The one training step equals a plain hand-written PyTorch step, option by option: same losses, same weights
after k steps (to 1e-6). GPU-only options run where CUDA is, and say why they skip elsewhere."""
import copy

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from labkit.core.step import PHASES, StepOptions, TrainStep, prepare_model

STEPS = 3
TOL = 1e-6


def _cnn(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                         nn.Linear(4 * 6 * 6, 5))


def _batches(n: int = STEPS, batch: int = 8) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(batch, 3, 6, 6, generator=g), torch.randint(0, 5, (batch,), generator=g)) for _ in range(n)]


def _sgd(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def _hand_written(model, opt, batches, precision=None, channels_last=False, micro=1, scaler=None):
    """The plain PyTorch step, written out: what every option must reduce to."""
    losses = []
    for x, y in batches:
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        total = 0.0
        for xi, yi in zip(x.chunk(micro), y.chunk(micro)):
            with torch.autocast("cpu", dtype=precision, enabled=precision is not None):
                loss = nn.functional.cross_entropy(model(xi), yi) / micro
            (scaler.scale(loss) if scaler else loss).backward()
            total += float(loss.detach())
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        opt.zero_grad()
        losses.append(total)
    return losses


def _with_the_step(model, opt, batches, options=StepOptions(), **kwargs):
    step = TrainStep(model, opt, options=options, **kwargs)
    return [float(step(x, y).loss) for x, y in batches]


def _assert_same(model_a, model_b, losses_a, losses_b):
    assert losses_a == pytest.approx(losses_b, abs=TOL)
    for (name, a), b in zip(model_a.state_dict().items(), model_b.state_dict().values()):
        assert float((a.double() - b.double()).abs().max()) <= TOL, name


@pytest.mark.parametrize("options, hand", [
    (StepOptions(), {}),
    (StepOptions(precision="bf16"), {"precision": torch.bfloat16}),
    (StepOptions(channels_last=True), {"channels_last": True}),
    (StepOptions(accumulation_steps=4), {"micro": 4}),
    (StepOptions(set_to_none=False), {}),
], ids=["fp32", "autocast-bf16", "channels_last", "accumulate-4", "set_to_none-False"])
def test_each_option_equals_the_hand_written_step(options, hand):
    plain, ours = _cnn(), _cnn()
    if options.channels_last:
        plain, ours = plain.to(memory_format=torch.channels_last), prepare_model(ours, options, torch.device("cpu"))
    batches = _batches()
    expected = _hand_written(plain, _sgd(plain), batches, **hand)
    _assert_same(plain, ours, expected, _with_the_step(ours, _sgd(ours), batches, options))


def test_set_to_none_is_what_it_says():
    for set_to_none, expect_none in ((True, True), (False, False)):
        model = _cnn()
        TrainStep(model, _sgd(model), options=StepOptions(set_to_none=set_to_none))(*_batches(1)[0])
        assert all((p.grad is None) == expect_none for p in model.parameters())


def test_accumulation_matches_one_big_batch_of_plain_sgd():
    """No BatchNorm here (its statistics see the micro-batch): then 4 micro-batches == the whole batch."""
    def mlp():
        torch.manual_seed(0)
        return nn.Sequential(nn.Flatten(), nn.Linear(108, 16), nn.Tanh(), nn.Linear(16, 5))
    big, acc = mlp(), mlp()
    batches = _batches()
    expected = _hand_written(big, _sgd(big), batches)
    _assert_same(big, acc, expected, _with_the_step(acc, _sgd(acc), batches, StepOptions(accumulation_steps=4)))


def test_compiled_model_equals_the_eager_step():
    """torch.compile through dynamo and AOT autograd (the 'aot_eager' backend: no C++ build on a test box)."""
    plain, ours = _cnn(), _cnn()
    batches = _batches()
    expected = _hand_written(plain, _sgd(plain), batches)
    compiled = torch.compile(ours, backend="aot_eager")
    _assert_same(plain, ours, expected, _with_the_step(compiled, _sgd(ours), batches))


def test_fp16_loss_scaling_equals_the_hand_written_grad_scaler():
    """The fp16 recipe's GradScaler path, run with CPU autocast (prepare_model refuses fp16 off CUDA, as the loop)."""
    plain, ours = _cnn(), _cnn()
    batches = _batches()
    expected = _hand_written(plain, _sgd(plain), batches, precision=torch.float16, scaler=torch.amp.GradScaler("cpu"))
    _assert_same(plain, ours, expected, _with_the_step(ours, _sgd(ours), batches, StepOptions(precision="fp16")))
    with pytest.raises(ValueError, match="needs a CUDA GPU"):
        prepare_model(_cnn(), StepOptions(precision="fp16"), torch.device("cpu"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="fp16 autocast with a CUDA GradScaler needs a CUDA GPU")
def test_fp16_on_cuda_runs_and_scales():
    model = prepare_model(_cnn(), StepOptions(precision="fp16"), torch.device("cuda"))
    step = TrainStep(model, _sgd(model), options=StepOptions(precision="fp16"))
    assert step.scaler is not None and torch.isfinite(step(*_batches(1)[0]).loss)


def test_a_ddp_wrapper_passed_in_equals_the_plain_step(world_of_one):
    """A DDP model is passed in as the model; with accumulation the step uses its no_sync between micro-batches."""
    plain, ours = _cnn(), _cnn()
    batches = _batches()
    expected = _hand_written(plain, _sgd(plain), batches, micro=2)
    wrapped = DDP(ours)
    _assert_same(plain, ours, expected,
                 _with_the_step(wrapped, _sgd(wrapped), batches, StepOptions(accumulation_steps=2)))


def test_a_zero_wrapper_passed_in_equals_plain_adam(world_of_one):
    """ZeRO-1 by hand (sharding.strategies.Zero1Optimizer) passed in as the optimizer, on a world of one."""
    from labkit.sharding.strategies import Zero1Optimizer

    plain, ours = _cnn(), _cnn()
    batches = _batches()
    adam = torch.optim.Adam(plain.parameters(), lr=1e-2)
    expected = _hand_written(plain, adam, batches)
    zero = Zero1Optimizer(ours, lr=1e-2, rank=0, world_size=1)
    _assert_same(plain, ours, expected, _with_the_step(ours, zero, batches))


def test_the_grad_hook_runs_between_backward_and_the_update():
    model = _cnn()
    seen = []
    step = TrainStep(model, _sgd(model), grad_hook=lambda m: seen.append(all(p.grad is not None for p in m.parameters())))
    order = []

    class Phase:
        def __init__(self, name):
            self.name = name

        def __enter__(self):
            order.append(self.name)

        def __exit__(self, *exc):
            return False

    step(*_batches(1)[0], phase=Phase)
    assert seen == [True] and order == list(PHASES)


def test_without_an_optimizer_the_step_is_forward_and_backward_only():
    model = _cnn()
    before = copy.deepcopy(model.state_dict())
    TrainStep(model, None, loss_fn=lambda out, _: out.square().mean())(*_batches(1)[0])
    changed = [k for k in before if "running" not in k and "num_batches" not in k
               and not torch.equal(before[k], model.state_dict()[k])]
    assert changed == [] and all(p.grad is None for p in model.parameters())


def test_bad_input_is_one_clear_line():
    with pytest.raises(ValueError, match="precision must be None or one of"):
        StepOptions(precision="fp8")
    with pytest.raises(ValueError, match="accumulation_steps must be an integer >= 1"):
        StepOptions(accumulation_steps=0)
    model = _cnn()
    with pytest.raises(ValueError, match="does not split into accumulation_steps=3"):
        TrainStep(model, _sgd(model), options=StepOptions(accumulation_steps=3))(*_batches(1)[0])
    with pytest.raises(ValueError, match="does not accept batches of shape"):
        TrainStep(model, _sgd(model))(torch.randn(2, 3, 9, 9), torch.zeros(2, dtype=torch.long))


def test_out_of_memory_on_the_first_call_stays_out_of_memory():
    """The batch-size finder tells 'too big' from a broken model by the error's type: OOM must pass through."""
    class OutOfMemory(nn.Module):
        def forward(self, x):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (mocked)")

    with pytest.raises(torch.cuda.OutOfMemoryError):
        TrainStep(OutOfMemory(), None)(torch.randn(2, 3), torch.zeros(2, dtype=torch.long))


@pytest.mark.parametrize("spelling, stored", [("bfloat16", "bf16"), (torch.bfloat16, "bf16"), ("half", "fp16"),
                                              ("fp32", None), (None, None)])
def test_step_options_take_every_spelling_of_the_one_precision_table(spelling, stored):
    assert StepOptions(precision=spelling).precision == stored


# ---- only a shape mismatch gets the image-shape hint (issue 53: a dtype mismatch and a tp that does not divide
# the heads were both reported as a wrong image shape)
class _ShardedHeads(nn.Module):
    """A column shard of a 16-wide attention over a tp that does not divide its 4 heads: 10 columns, head_dim 4."""

    def __init__(self) -> None:
        super().__init__()
        self.wq = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.wq(x.flatten(1))
        return q.reshape(x.shape[0], -1, 4).sum(-1)     # (b, local heads, head_dim) -> fails: 10 is no multiple of 4


def test_a_dtype_mismatch_is_reported_as_itself_not_as_a_shape():
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 9 * 9, 10)).double()
    with pytest.raises(RuntimeError, match="dtype") as info:
        TrainStep(model, _sgd(model))(torch.randn(2, 3, 9, 9), torch.zeros(2, dtype=torch.long))
    assert not isinstance(info.value, ValueError) and "image shape" not in str(info.value)


def test_heads_that_do_not_split_get_the_reshape_hint_not_the_image_shape_hint():
    model = _ShardedHeads()
    with pytest.raises(ValueError, match="a reshape inside the model failed") as info:
        TrainStep(model, _sgd(model))(torch.randn(2, 16), torch.zeros(2, dtype=torch.long))
    assert "image shape" not in str(info.value) and "heads that split evenly" in str(info.value)


def test_a_wrong_image_shape_still_gets_its_hint():
    model = _cnn()
    with pytest.raises(ValueError, match="Build the model for this data's image shape"):
        TrainStep(model, _sgd(model))(torch.randn(2, 4, 9, 9), torch.zeros(2, dtype=torch.long))
