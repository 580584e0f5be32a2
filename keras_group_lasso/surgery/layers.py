"""A layer that older versions of surgery inserted; kept so that the files they saved still load.

Surgery now selects the kept features with a frozen built-in Dense layer (see
:func:`keras_group_lasso.prune_model`), so what it returns loads with plain Keras.
"""

import keras
import numpy as np

from keras_group_lasso._validation import fail

__all__ = ["SelectFeatures"]


@keras.saving.register_keras_serializable(package="keras_group_lasso", name="SelectFeatures")
class SelectFeatures(keras.layers.Layer):
    """Keep the input features ``indices``, in that order: ``y = x[..., indices]``.

    Older versions of :func:`~keras_group_lasso.prune_model` put it first in a
    model pruned with ``inputs="original"``; it is no longer inserted (a
    ``.keras`` file containing it needs this package to load). A gather on the
    last axis (``keras.ops.take``): exact, no weights. Registered, so such a
    file loads without ``custom_objects`` once ``keras_group_lasso`` is imported.

    Args:
        indices: non-empty sequence of distinct ints >= 0.

    Example:
        >>> ops.convert_to_numpy(SelectFeatures([0, 2])(np.array([[1.0, 2.0, 3.0]], dtype="float32")))
        array([[1., 3.]], dtype=float32)
    """

    def __init__(self, indices, **kwargs):
        super().__init__(**kwargs)
        try:
            values = [int(i) for i in indices]
            ok = bool(values) and len(set(values)) == len(values) and min(values) >= 0
            ok = ok and all(int(i) == i and not isinstance(i, bool) for i in indices)
        except (TypeError, ValueError):
            ok = False
        if not ok:
            fail("SelectFeatures", "indices", "a non-empty sequence of distinct integers >= 0", indices)
        self.indices = tuple(values)
        self._gather = np.asarray(values, dtype="int32")

    def call(self, inputs):
        return keras.ops.take(inputs, self._gather, axis=-1)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (len(self.indices),)

    def get_config(self):
        config = super().get_config()
        config["indices"] = list(self.indices)
        return config
