"""The names the kit accepts for models, datasets, optimizers, backends and benchmark dtypes: one list each,
torch-free.

Configs validate against these, the builders dispatch on them, and the CLI offers them as choices; the CLI's
parser must not load torch (`labkit --help` stays instant), so the lists live here rather than beside the code
that builds the models.
"""
from __future__ import annotations

MODELS = ("resnet18", "small_cnn", "mlp")                     # labkit.core.models.build_model
DATASETS = ("auto", "cifar10", "digits", "synthetic")         # labkit.core.data.load_data ('auto': CIFAR-10 if cached)
OPTIMIZERS = ("sgd", "sgd_momentum", "adam")                  # what the memory model prices (labkit.memory.model)
TRAIN_OPTIMIZERS = ("sgd", "adam")           # what a run trains with (labkit.training.run_spec.RunSpec; momentum apart)
BACKENDS = ("auto", "gloo", "nccl")           # torch.distributed backends; 'auto': labkit.comm.backend.choose_backend
COMM_DTYPES = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int32": 4}   # benchmarks: bytes per element
