"""The TensorFlow halves of the lessons: distribution strategies, tf.data, thread pools, the TF profiler, Keras,
mixed precision and pitfalls. Torch-free modules, run in fresh processes (notebooks 02-04, 08, 09).
"""

# the modules a learner uses (what the notebooks import; docs/api.md lists their names, one line each)
__all__ = ["distribute", "exercises", "keras", "pipelines", "pitfalls", "precision", "profiler", "threads"]
