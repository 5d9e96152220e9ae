"""labkit.parallel.pipeline.schedule_trace in one process: the activation meter against the kit's memory model, and the
tracer on a stand-in stage (the real PipelineStage is exercised on real ranks in test_pipeline_schedules)."""
from types import SimpleNamespace

import torch
from torch import nn

from labkit.memory.model import saved_activation_bytes
from labkit.parallel.pipeline.schedule_trace import ActivationMeter, StageTracer


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 8))


def test_the_meter_counts_what_the_memory_model_counts_for_one_forward():
    model, x = mlp(), torch.randn(4, 16)
    meter = ActivationMeter(list(model.parameters()))
    with meter.hooks():
        out = model(x)
    assert meter.peak_bytes == saved_activation_bytes(model, x) > 0
    out.sum().backward()
    del out
    assert meter.live_bytes == 0 and meter.peak_bytes > 0     # backward freed what the forward saved


def test_two_micro_batches_held_at_once_count_twice_and_their_input_batch_not_at_all():
    model, x = mlp(), torch.randn(8, 16)
    meter = ActivationMeter(list(model.parameters()))
    with meter.hooks(inputs=[x[:4]]):                        # a view of the batch: the batch existed before
        a = model(x[:4])
    one = meter.live_bytes
    with meter.hooks(inputs=[x[4:]]):
        b = model(x[4:])
    assert one == 4 * 32 * 4                                  # Tanh's output (Linear(32, 8) saves the same storage)
    assert meter.peak_bytes == 2 * one
    (a.sum() + b.sum()).backward()
    del a, b
    assert meter.live_bytes == 0


def test_a_saved_view_counts_its_whole_storage_once_the_rival_counting_views_would_not():
    model, x = mlp(), torch.randn(8, 16)
    meter = ActivationMeter(list(model.parameters()))
    with meter.hooks():
        a = model(x[:4])                                      # Linear(16, 32) saves a 4-row view of 8 rows
        b = model(x)                                          # ... and the whole of them: one allocation
    whole, tanh_out = 8 * 16 * 4, (4 + 8) * 32 * 4
    assert meter.peak_bytes == whole + tanh_out               # the rival (a key per view) says 4 rows more
    del a, b
    assert meter.live_bytes == 0                              # dropping the outputs frees what they saved


class FakeStage:
    """The methods a schedule calls on a PipelineStage, doing tiny real work."""

    stage_index = 1

    def forward_one_chunk(self, chunk, *args, **kwargs):
        return chunk

    def backward_one_chunk(self, chunk, loss=None, full_backward=True, last_backward=False):
        return None

    def backward_weight_one_chunk(self, chunk, last_backward=False):
        return None

    def get_fwd_send_ops(self, chunk):
        return [SimpleNamespace(tensor=torch.zeros(4, 8))]

    def get_bwd_send_ops(self, chunk):
        return []

    def get_fwd_recv_ops(self, chunk):
        return [SimpleNamespace(tensor=torch.zeros(4, 8))]

    def get_bwd_recv_ops(self, chunk):
        return []


def test_the_tracer_times_each_action_and_counts_messages():
    tracer = StageTracer(rank=3, device=torch.device("cpu"), meter=ActivationMeter([]))
    stage = FakeStage()
    tracer.attach(stage)
    stage.get_fwd_recv_ops(0)
    stage.forward_one_chunk(0, (), {})
    stage.get_fwd_send_ops(0)
    stage.backward_one_chunk(0, loss=None, full_backward=False)
    stage.backward_weight_one_chunk(0)
    stage.backward_one_chunk(1)
    assert [(s.rank, s.stage, s.label) for s in tracer.spans] == [(3, 1, "F0"), (3, 1, "I0"), (3, 1, "W0"),
                                                                    (3, 1, "B1")]
    assert all(s.end_s >= s.start_s for s in tracer.spans)
    assert (tracer.messages, tracer.message_bytes) == (1, 4 * 8 * 4)
    assert [(p.what, p.stage, p.micro_batch, p.nbytes) for p in tracer.posts] == [("recv F", 1, 0, 128),
                                                                                  ("send F", 1, 0, 128)]
    assert tracer.posts[1].time_s >= tracer.spans[0].end_s
    assert tracer.where() == "after B1 of stage 1, waiting on the activation for stage 1, micro-batch 0"
    assert 0 < tracer.cpu_share() <= 1
    tracer.reset()
    assert tracer.spans == tracer.posts == [] and tracer.messages == 0 and "nothing yet" in tracer.where()
