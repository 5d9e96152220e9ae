"""Training Performance Lab: the reusable parts behind the notebooks.

Notebooks tell the story; this package holds the instruments they call.
"""
import os as _os

_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep TensorFlow's C++ start-up chatter out of the lessons

from labkit.data import (DATASETS, DataUnavailableError, ImageData, load_data, make_loader, synthetic_data,
                         validate_batch_size, validate_num_workers, verify_data_file)
from labkit.env import (MODE_ENV_VAR, Mode, cpu_count, device_label, get_device, get_mode, gpu_info, pick,
                        seed_everything)
from labkit.models import MLP, SmallCNN, build_model, check_model_accepts, count_parameters, keras_small_cnn, resnet18_cifar
from labkit.timing import Stopwatch, TimingResult, synchronize, time_fn

__version__ = "0.1.0"

__all__ = [
    # env
    "MODE_ENV_VAR", "Mode", "cpu_count", "device_label", "get_device", "get_mode", "gpu_info", "pick",
    "seed_everything",
    # data
    "DATASETS", "DataUnavailableError", "ImageData", "load_data", "make_loader", "synthetic_data",
    "validate_batch_size", "validate_num_workers", "verify_data_file",
    # models
    "MLP", "SmallCNN", "build_model", "check_model_accepts", "count_parameters", "keras_small_cnn", "resnet18_cifar",
    # timing
    "Stopwatch", "TimingResult", "synchronize", "time_fn",
]
