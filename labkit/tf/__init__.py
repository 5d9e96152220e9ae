"""The TensorFlow halves of the lessons: distribution strategies, tf.data, thread pools, the TF profiler, Keras,
mixed precision and pitfalls. Torch-free modules, run in fresh processes (notebooks 02-04, 08, 09).
"""
