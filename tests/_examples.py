"""How many random models a property test draws on this backend.

JAX runs these small models op by op (a random CNN or branching graph takes
1-3 s there against a fraction of a second on TensorFlow and PyTorch), so it
draws a third as many (at least 3); the three backends together still check
every property on dozens of random architectures, JAX on several of each.
"""

import keras


def examples(n):
    """``n`` on TensorFlow and PyTorch, a third of it (at least 3) on JAX."""
    return max(3, n // 3) if keras.backend.backend() == "jax" else n
