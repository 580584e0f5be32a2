"""Train many small epochs in one Keras ``fit`` call.

On small data sets (DIGITS: 1347 training rows, 5 batches an epoch) Keras's
per-epoch work (callbacks, iterator set-up, logging) costs more than the
training itself. :class:`EpochBatches` serves every epoch's shuffled
mini-batches as one long Keras epoch, so 200 paper epochs run as one ``fit``
epoch with exactly the same batches a per-epoch loop would see.
"""

import math

import numpy as np

import keras

from keras_group_lasso._validation import check_positive_int, fail

__all__ = ["EpochBatches", "fit_epochs"]


class EpochBatches(keras.utils.PyDataset):
    """Mini-batches of ``epochs`` passes over ``(x, y)``, reshuffled each pass.

    Batch ``i`` belongs to pass ``i // batches_per_epoch``; each pass uses its
    own permutation drawn from ``seed``, and the last batch of a pass may be
    smaller, as in ``model.fit(x, y, shuffle=True)``.

    Args:
        x: features, array of shape ``(n, ...)``.
        y: targets, array of length ``n``.
        epochs: number of passes (>= 1).
        batch_size: rows per batch (>= 1).
        seed: seed of the permutations.

    Example:
        >>> x, y = np.arange(20.0).reshape(10, 2), np.arange(10)
        >>> data = EpochBatches(x, y, epochs=3, batch_size=4)
        >>> first_pass = [data[i] for i in range(data.batches_per_epoch)]
        >>> len(data), [len(batch_y) for _, batch_y in first_pass]
        (9, [4, 4, 2])
        >>> np.sort(np.concatenate([batch_y for _, batch_y in first_pass]))   # a pass sees every row once
        array([0, 1, 2, 3, 4, 5, 6, 7, 8, 9])

        ``model.fit(data, epochs=1)`` then trains the 3 passes as one Keras epoch
        (see :func:`fit_epochs`).
    """

    def __init__(self, x, y, epochs, batch_size, seed=0):
        super().__init__()
        owner = "EpochBatches"
        self.x = np.asarray(x)
        self.y = np.asarray(y)
        if len(self.x) != len(self.y) or len(self.x) == 0:
            fail(owner, "y", f"a non-empty array with as many rows as x ({len(self.x)})", self.y.shape)
        self.epochs = check_positive_int(owner, "epochs", epochs)
        self.batch_size = check_positive_int(owner, "batch_size", batch_size)
        self.batches_per_epoch = math.ceil(len(self.x) / self.batch_size)
        self._rng = np.random.default_rng(seed)
        self._orders = [self._rng.permutation(len(self.x)) for _ in range(self.epochs)]

    def __len__(self):
        return self.epochs * self.batches_per_epoch

    def __getitem__(self, index):
        epoch, batch = divmod(index, self.batches_per_epoch)
        rows = self._orders[epoch][batch * self.batch_size : (batch + 1) * self.batch_size]
        return self.x[rows], self.y[rows]


def fit_epochs(model, x, y, epochs, batch_size, seed=0, verbose=0, **fit_kwargs):
    """``model.fit`` for ``epochs`` reshuffled passes, run as one Keras epoch.

    Use it for small data sets where Keras's per-epoch overhead dominates.
    Per-epoch callbacks (``SparsityMonitor``, ``EarlyStopping``) then see a
    single epoch; use a plain ``fit`` when you need them every pass.

    Returns:
        The ``keras.callbacks.History`` of the single Keras epoch.

    Example:
        >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        >>> model.compile(optimizer="sgd", loss="mse")
        >>> x = np.random.default_rng(0).normal(size=(30, 2)).astype("float32")
        >>> history = fit_epochs(model, x, x @ np.array([1.0, -1.0], "float32"), epochs=20, batch_size=8)
        >>> len(history.history["loss"])   # 20 passes of 4 batches, one Keras epoch
        1
    """
    data = EpochBatches(x, y, epochs=epochs, batch_size=batch_size, seed=seed)
    return model.fit(data, epochs=1, verbose=verbose, shuffle=False, **fit_kwargs)
