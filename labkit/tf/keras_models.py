"""The Keras twin of ``labkit.core.models.SmallCNN``, in a module that never imports PyTorch, so TensorFlow-only
child processes (profiling, mixed precision, tf.distribute) can build it cheaply."""
from __future__ import annotations


def keras_small_cnn(num_classes: int = 10, image_shape: tuple[int, int, int] = (32, 32, 3), width: int = 32,
                    float32_logits: bool = False):
    """Two conv blocks and a linear head (channels-last input, as Keras expects).

    ``float32_logits=True`` ends in a float32 activation, as mixed-precision policies want for a stable loss.
    """
    import tensorflow as tf

    L = tf.keras.layers
    layers = [
        tf.keras.Input(shape=image_shape),
        L.Conv2D(width, 3, padding="same"), L.BatchNormalization(), L.ReLU(), L.MaxPooling2D(2),
        L.Conv2D(2 * width, 3, padding="same"), L.BatchNormalization(), L.ReLU(),
        L.GlobalAveragePooling2D(), L.Dense(num_classes),
    ]
    if float32_logits:
        layers.append(L.Activation("linear", dtype="float32"))
    return tf.keras.Sequential(layers)
