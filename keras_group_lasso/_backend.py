"""What the running Keras backend is doing, for the few places that must know."""

import keras


def torch_compiling():
    """Whether ``torch.compile`` is tracing the current call (its tracer cannot read Python frames)."""
    if keras.backend.backend() != "torch":
        return False
    import torch

    return torch.compiler.is_compiling()


def value_outside_trace(variable):
    """The current value of ``variable``, read outside any ``tf.function`` being traced.

    TensorFlow lifts the creation of a variable out of a traced step only when
    its initial value does not read the graph; under XLA (``jit_compile=True``)
    a variable initialised from another variable's in-graph value cannot be
    created at all. Other backends read the value as it is.
    """
    if keras.backend.backend() != "tensorflow":
        return variable.value
    import tensorflow as tf

    with tf.init_scope():
        return tf.convert_to_tensor(variable.value)
