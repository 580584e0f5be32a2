"""Quickstart: a group-sparse MLP on DIGITS that selects its own input pixels and prunes its own neurons.

Trains 64-40-20-10 with the sparse group Lasso (input groups on the first
kernel, hidden groups on the others, bias groups), sets |w| <= 1e-3 to zero,
prints what survived, then builds the physically smaller network.

    python examples/quickstart_digits.py           # 200 epochs, about a minute on 2 CPU cores
    python examples/quickstart_digits.py --quick   # 20 epochs, a smoke run
"""

import argparse

import keras
import numpy as np

from keras_group_lasso import (
    HiddenGroupLasso,
    InputGroupLasso,
    SparseGroupLasso,
    apply_threshold,
    prune_model,
    sparsity_report,
)
from keras_group_lasso.datasets import load_dataset
from keras_group_lasso.training import fit_epochs


def build(n_features, n_classes, factor):
    """The paper's penalty layout: every outgoing weight group of every unit, bias units included."""
    return keras.Sequential(
        [
            keras.Input((n_features,)),
            keras.layers.Dense(40, activation="relu",
                               kernel_regularizer=InputGroupLasso(factor, l1=factor),  # selects features
                               bias_regularizer=SparseGroupLasso(factor)),
            keras.layers.Dense(20, activation="relu",
                               kernel_regularizer=HiddenGroupLasso(factor, l1=factor),  # prunes neurons
                               bias_regularizer=SparseGroupLasso(factor)),
            keras.layers.Dense(n_classes, activation="softmax",
                               kernel_regularizer=HiddenGroupLasso(factor, l1=factor),
                               bias_regularizer=SparseGroupLasso(factor)),
        ]
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="20 epochs instead of 200")
    args = parser.parse_args()
    epochs = 20 if args.quick else 200

    data = load_dataset("digits", seed=0)  # 25 % test split, pixels scaled to [0, 1]
    keras.utils.set_random_seed(0)
    model = build(data.n_features, data.n_classes, factor=1e-3)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    # All epochs in one Keras epoch: on a data set this small, per-epoch overhead dominates.
    fit_epochs(model, data.x_train, data.y_train, epochs=epochs, batch_size=300, seed=0)

    apply_threshold(model, 1e-3)  # the paper's final step: |w| <= 1e-3 becomes exactly 0
    _, acc = model.evaluate(data.x_test, data.y_test, verbose=0)
    report = sparsity_report(model, threshold=1e-3)
    print(f"test accuracy after thresholding: {acc:.4f}")
    print(report)

    small = prune_model(model, threshold=1e-3, inputs="selected")
    x_small = data.x_test[:, list(small.kept_features)]
    gap = np.max(np.abs(model.predict(data.x_test, verbose=0) - small.predict(x_small, verbose=0)))
    print(f"pruned model: {model.count_params()} -> {small.count_params()} parameters, "
          f"reads {len(small.kept_features)} of {data.n_features} pixels, max output difference {gap:.1e}")


if __name__ == "__main__":
    main()
