"""The backend's own autodiff, for tests that compare a closed form with it (TensorFlow, JAX, PyTorch)."""

import keras
import numpy as np


def gradient(fn, w):
    """d fn(w) / d w as float numpy, by the current backend's autodiff; zeros where ``w`` is not connected."""
    w = np.asarray(w)
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        x = tf.Variable(w)
        with tf.GradientTape() as tape:
            out = fn(x)
        grad = tape.gradient(out, x)
        return np.zeros_like(w) if grad is None else grad.numpy()
    if backend == "jax":
        import jax

        return np.asarray(jax.grad(lambda x: fn(x))(w))
    if backend == "torch":
        x = keras.ops.convert_to_tensor(w).detach().requires_grad_(True)
        out = fn(x)
        if not out.requires_grad:  # constant in w
            return np.zeros_like(w)
        out.backward()
        return np.zeros_like(w) if x.grad is None else x.grad.detach().cpu().numpy()
    raise NotImplementedError(f"no autodiff helper for the {backend!r} backend")


def model_gradients(model, total):
    """d total() / d model.trainable_variables as float numpy, by the backend's autodiff.

    ``total``: a function of no arguments that computes a scalar from
    ``model`` (its call, its ``losses``). Zeros where no gradient flows.
    """
    variables = list(model.trainable_variables)
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            out = total()
        grads = tape.gradient(out, [v.value for v in variables])
    elif backend == "jax":
        import jax

        def at(values):
            with keras.StatelessScope(state_mapping=list(zip(variables, values))):
                return total()

        grads = jax.grad(at)([v.value for v in variables])
    elif backend == "torch":
        import torch

        out = total()
        params = [v.value for v in variables]
        grads = torch.autograd.grad(out, params, allow_unused=True) if out.requires_grad else [None] * len(params)
    else:
        raise NotImplementedError(f"no autodiff helper for the {backend!r} backend")
    return [
        np.zeros(tuple(v.shape), np.float32) if g is None else np.asarray(keras.ops.convert_to_numpy(g))
        for g, v in zip(grads, variables)
    ]
