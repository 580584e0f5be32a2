"""What the running Keras backend is doing, for the few places that must know."""

import functools

import keras


def torch_compiling():
    """Whether ``torch.compile`` is tracing the current call."""
    if keras.backend.backend() != "torch":
        return False
    import torch

    return torch.compiler.is_compiling()


def tensorflow_on_cpu():
    """Whether the backend is TensorFlow and it has no GPU or TPU (its maths runs on the CPU)."""
    return keras.backend.backend() == "tensorflow" and _tensorflow_without_accelerator()


@functools.lru_cache(maxsize=None)
def _tensorflow_without_accelerator():
    import tensorflow as tf

    # Asked when a step is first traced, after TensorFlow has made its devices (a TPU system is initialized
    # before a model is built on it).
    return not (tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("TPU"))
