"""Model vs data parallelism: split models and pipelines, synchronous SGD, when replicas pay, the classic
multi-GPU pitfalls on the PyTorch side, and the split inside a layer (notebooks 05, 05b, 07, 09, 13).

costmodel (the formulas: T_comp vs T_sync, the GPipe bubble) < model_parallel (split by layers, memory per
stage, the recommendation) < pipeline (the bubble simulated and measured); schedule_sim (bubbles, formulas, the
replay) < schedule_trace (actions timed on a rank) < pipeline_schedules (torch's schedules on real ranks) <
schedule_report (05b's tables); sync_sgd (from scratch, = DDP) <
scaling (measured on real processes, compared with the model) < speedup (the explorer's maths); published
(cited scaling points); plots (charts of the measurements, kept out of what ranks import); sync_sgd_mpi (sync
SGD under mpiexec); data_pitfalls and rank_pitfalls. Inside the layer (13): tensor_parallel (Megatron's split and
sequence parallelism by hand) < tp_dtensor (the same with parallelize_module) < tp_runs (on real ranks) <
tp_report, tp_compare (against DP and ZeRO-3); tp_cost (the formulas). Along the sequence (14): ring_attention
(the block maths, the zig-zag split) < ring_runs (on real ranks) < ring_report; ring_torch_cp (torch's
context_parallel on GPUs against the ring). A rank's device is
labkit.comm.worker.rank_device.
"""

# the modules a learner uses (what the notebooks import; docs/api.md lists their names, one line each)
__all__ = ["costmodel", "data_pitfalls", "diagnose", "drift", "exercises", "hang_exercises", "hangs",
           "model_parallel", "pipeline", "pipeline_schedules", "plots", "published", "rank_pitfalls",
           "ring_attention", "ring_report", "ring_runs", "ring_torch_cp", "scaling", "schedule_report",
           "schedule_sim", "speedup", "sync_sgd", "tensor_parallel", "tp_compare", "tp_cost", "tp_dtensor", "tp_report", "tp_runs"]
