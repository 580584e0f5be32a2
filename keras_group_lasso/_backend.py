"""What the running Keras backend is doing, for the few places that must know."""

import keras


def torch_compiling():
    """Whether ``torch.compile`` is tracing the current call."""
    if keras.backend.backend() != "torch":
        return False
    import torch

    return torch.compiler.is_compiling()
