"""Training Performance Lab: the reusable parts behind the notebooks.

Notebooks tell the story; this package holds the instruments they call. Names are imported lazily
(PEP 562), so ``import labkit`` is instant and a worker process that needs only ``labkit.comm.mpi_demos``
does not pay for torch and TensorFlow.
"""
from __future__ import annotations

import importlib
import importlib.util
import os as _os
import sys as _sys
import warnings as _warnings
from typing import Any

_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep TensorFlow's C++ start-up chatter out of the lessons


def _load_triton_before_tensorflow() -> None:
    """Import Triton now if TensorFlow may follow: in one process, Triton loaded *after* TensorFlow segfaults.

    torch's optimizers import Triton on their first step (CUDA builds), so a kernel that imported TensorFlow
    and then trains a torch model dies without a Python traceback. Loading Triton first costs ~7 MB and
    0.5 s, and only where both are installed (the CPU wheels Binder uses ship no Triton).
    """
    if "triton" in _sys.modules or importlib.util.find_spec("triton") is None \
            or importlib.util.find_spec("tensorflow") is None:
        return
    if "tensorflow" in _sys.modules:
        _warnings.warn("TensorFlow was imported before labkit: in this environment a torch optimizer step will "
                       "then crash the kernel (Triton cannot load after TensorFlow). Restart the kernel and "
                       "`import labkit` (or `import triton`) before TensorFlow.", RuntimeWarning, stacklevel=3)
        return
    import triton  # noqa: F401


_load_triton_before_tensorflow()

__version__ = "0.1.0"

# public name -> the module that defines it
_EXPORTS: dict[str, tuple[str, ...]] = {
    "core.env": ("MODE_ENV_VAR", "Mode", "get_mode", "pick", "seed_everything"),
    "core.machine": ("cpu_count",),
    "core.device": ("device_label", "get_device", "gpu_info", "nccl_available"),
    "core.choices": ("DATASETS",),
    "core.data": ("DataUnavailableError", "ImageData", "load_data", "make_device_loader", "make_loader",
             "max_num_workers", "synthetic_data",
             "validate_batch_size", "validate_num_workers", "verify_data_file"),
    "core.models": ("MLP", "SmallCNN", "build_model", "check_model_accepts", "count_parameters", "resnet18_cifar"),
    "core.clock": ("Deadline", "TimingResult", "interleaved", "now_s", "paired_median", "percentile", "timestamp_s"),
    "core.timing": ("PhaseClock", "Stopwatch", "synchronize", "time_fn"),
    "comm.launch": ("LaunchError", "LaunchTimeout", "RankFailedError", "launch", "torchrun_command"),
    "comm.worker": ("init_from_env",),
    "comm.collectives": ("ALGORITHMS", "OPS", "AllreduceResult", "Step", "allreduce", "allreduce_cost",
                    "reference_allreduce"),
    "comm.bench": ("BenchRow", "allreduce_benchmark", "fit_latency_bandwidth", "format_nccl_tests_table"),
    "comm.bench_report": ("plot_busbw",),
    # the ring_view() widget itself: from labkit.ui.ring_view import ring_view
    "ui.ring_view": ("chunk_contributions", "draw_step"),
    "comm.launch_env": ("LaunchEnv", "LaunchEnvError", "detect_launcher_env"),
    "comm.mpi": ("DemoRun", "MpiError", "MpiInfo", "MpiRankError", "MpiTimeout", "MpiUnavailableError",
            "mpi_allreduce_benchmark", "mpi_info", "run_demo"),
    # batch-size lab
    "training.loop": ("RunResult", "StepRecord", "TrainConfig", "evaluate_accuracy", "make_optimizer", "train"),
    "training.window": ("TrainProgress",),
    "training.ceiling": ("ResidentBatches", "measure_ceiling"),
    "core.device_loader": ("DeviceLoader",),
    "training.sampling": ("UtilizationSampler", "UtilizationSummary", "nvml_device_utilization"),
    "training.dtypes": ("MATH_MODES",),
    "training.flops": ("PeakSpec", "active_math_mode", "checked_mfu", "count_training_flops", "find_peak",
              "flops_per_sample", "mfu", "peak_flops_per_s"),
    "training.memory_check": ("CpuCheck", "StepMemory", "check_on_cpu", "compare_with_reference", "cuda_baseline_bytes",
                              "graph_saved_bytes", "measure_run_memory", "measure_step_memory",
                              "predict_run_memory", "recorded_reference"),
    "training.device_memory": ("baseline_bytes", "optimizer_state_bytes", "peak_since", "tensor_bytes",
                               "work_bytes_on"),
    "training.memory_timeline": ("LayerLine", "LayerMemory", "backward_peak_bytes", "forward_peak_bytes",
                                 "layer_memory"),
    "training.workspace": ("LayerWorkspace", "StepWorkspaces", "layer_calls", "measure_workspaces"),
    "training.memory": ("MemoryBreakdown", "MemoryModel", "build_memory_model", "optimizer_settings",
               "preserved_state", "release_cpu_memory", "saved_activation_bytes"),
    "training.finder": ("FinderResult", "Trial", "find_max_batch", "search_from_hint", "search_largest"),
    "training.batch_size": ("SweepResult", "SweepRow", "batch_size_sweep", "knee_batch"),
    "training.batch_rules": ("per_replica_batch", "per_replica_batch_size", "scaled_lr"),
    "ui.dashboard": ("BatchSizeDashboard", "DashboardRun"),
    # profiling and input pipelines
    "profile.schedule": ("ProfileSchedule",),
    "profile.summary": ("ProfileSummary", "changed_ops", "compare_runs"),
    "profile.profiler": ("profile_training",),
    "profile.traces": ("TraceStats", "load_trace", "step_numbers", "summarize_trace"),
    "tf.profiler": ("TFProfileResult", "profile_keras_fit", "profile_keras_in_subprocess", "xplane_files"),
    "input.loaders": ("ConsumerCeiling", "ExpensiveTransform", "LoaderConfig", "LoaderResult", "LoaderSweep",
                      "TransformedDataset", "benchmark_loader", "default_grid", "measure_consumer_ceiling",
                      "plot_overlap", "simulated_step", "sweep_loaders"),
    "tf.pipelines": ("Comparison", "cache_and_shuffle", "images_from", "interleave_files", "map_vs_batch",
                     "parallel_map", "prefetch_overlap", "shard_order", "write_shards"),
    "input.threads": ("default_thread_counts", "sweep_torch_threads"),
    "tf.threads": ("ThreadSweep", "sweep_tf_threads"),
    # data parallelism, scaling, model parallelism
    "parallel.sync_sgd": ("gradient_of_sum_error", "run_sync_sgd_comparison", "sync_gradients", "sync_initial_weights",
                 "train_replica", "train_single_process"),
    "parallel.costmodel": ("epoch_time_s", "pays_off", "predicted_bubble", "predicted_speedup", "sync_time_s"),
    "parallel.scaling": ("ScalingPoint", "StepTimes", "compare_with_model", "measure_scaling"),
    "parallel.published": ("load_published_scaling", "plot_published_scaling"),
    "parallel.speedup": ("ExplorerResult", "ExplorerSettings", "explore", "speedup_curve"),
    "ui.explorer": ("SpeedupExplorer",),
    "parallel.model_parallel": ("SplitConfig", "SplitModel", "memory_per_stage", "recommend_parallelism"),
    "parallel.pipeline": ("bubble_fraction", "measure_pipeline", "simulate_gpipe"),
    # TensorFlow, mixed precision, pitfalls
    "core.procs": ("run_in_fresh_process", "tensorflow_lessons_can_run", "tensorflow_missing_reason"),
    "tf.keras": ("keras_batch_throughput", "keras_small_cnn"),
    "core.rundirs": ("check_writable_dir", "run_path", "run_root"),
    "core.lessons": ("LessonLog", "summarize_lesson_log"),
    "core.validation": ("checked_int", "positive_int"),
    "core.progress": ("progress_bar", "progress_enabled"),
    "tf.distribute": ("DevicesAlreadyInitializedError", "configure_logical_cpus", "cross_device_ops", "make_strategy"),
    "tf.pitfalls": ("BatchNormNanEvidence", "device_counting_side_effects", "uneven_last_batch_bn"),
    "parallel.data_pitfalls": ("lr_scaling_run", "padded_eval_accuracy", "shard_coverage", "torch_uneven_last_batch"),
    "parallel.rank_pitfalls": ("rank0_extra_work", "save_wrapped_model"),
    "training.precision": ("AutocastResult", "autocast_step", "compare_autocast", "fp16_underflow"),
    "tf.precision": ("keras_mixed_precision",),
    # many machines on one box (notebook 12)
    "cluster.nodes": ("EmulatedNodes", "NodesConfig", "NodesUnavailable", "namespace_support"),
    "cluster.run": ("JobFailed", "JobResult", "run_job"),
    "cluster.lab": ("LabConfig", "run_link_lab"),
    "cluster.linkfit": ("LinkFit", "fit_alpha_beta", "fit_links"),
    "cluster.failover": ("FailureConfig", "recovery_summary", "run_with_failure"),
    "cluster.slurm": ("ClusterJob", "slurm_script", "two_host_recipe"),
    "comm.two_tier": ("Link", "hierarchical_allreduce", "inter_node_bytes", "predicted_times_s"),
    "comm.launch_nodes": ("NodeLaunch", "torchrun_nodes_command"),
    # the capstone
    "ladder.config": ("LadderConfig",),
    "ladder.climb": ("run_ladder",),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
assert len(_MODULE_OF) == sum(map(len, _EXPORTS.values())), "a public name is exported twice"

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    """Import the defining module on first use of a public name."""
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'labkit' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"labkit.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
