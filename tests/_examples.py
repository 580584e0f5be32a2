"""How many random models a property test draws on this backend.

JAX runs these small models op by op (a random CNN or branching graph takes
1-3 s there against a fraction of a second on TensorFlow and PyTorch), so it
draws half as many; the three backends together still check every property
on dozens of random architectures.
"""

import keras


def examples(n):
    """``n`` on TensorFlow and PyTorch, half of it (at least 3) on JAX."""
    return max(3, n // 2) if keras.backend.backend() == "jax" else n
