"""Shared test set-up: import labkit first, so Triton loads before any test module imports TensorFlow
(Triton loaded after TensorFlow segfaults the process; see labkit/__init__.py)."""
import labkit  # noqa: F401
