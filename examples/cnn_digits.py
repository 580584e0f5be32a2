"""A group-sparse CNN on DIGITS: whole channels go to exactly zero while it trains, then surgery removes them.

A VGG-style network (two Conv-BatchNorm-ReLU-MaxPool blocks, Flatten, a Dense
head) gets channel groups from ``add_group_sparsity`` (the Dense layer after
Flatten gets one group per channel of the map, all its positions together) and
trains with ``Proximal``, so dead channels are exact zeros. ``prune_model``
rebuilds it with fewer channels; its outputs equal the thresholded model's.

    python examples/cnn_digits.py           # 60 epochs, under a minute on 2 CPU cores
    python examples/cnn_digits.py --quick   # 3 epochs, a smoke run
"""

import argparse
import time

import keras
import numpy as np

from keras_group_lasso import Proximal, add_group_sparsity, apply_threshold, prune_model, sparsity_report
from keras_group_lasso.datasets import load_dataset


def build(n_classes):
    layers = keras.layers
    return keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            layers.Conv2D(16, 3, padding="same"), layers.BatchNormalization(), layers.ReLU(), layers.MaxPooling2D(),
            layers.Conv2D(32, 3, padding="same"), layers.BatchNormalization(), layers.ReLU(), layers.MaxPooling2D(),
            layers.Flatten(),
            layers.Dense(64, activation="relu"),
            layers.Dense(n_classes, activation="softmax"),
        ]
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--factor", type=float, default=3e-4, help="group strength lambda")
    parser.add_argument("--quick", action="store_true", help="3 epochs (a smoke run)")
    args = parser.parse_args(argv)
    epochs = 3 if args.quick else args.epochs

    keras.utils.set_random_seed(0)
    data = load_dataset("digits")
    x_train = data.x_train.reshape(-1, 8, 8, 1) / 16.0
    x_test = data.x_test.reshape(-1, 8, 8, 1) / 16.0
    model = add_group_sparsity(build(data.n_classes), args.factor)
    model.compile(optimizer=Proximal(keras.optimizers.SGD(0.05, momentum=0.9)),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    start = time.perf_counter()
    model.fit(x_train, data.y_train, epochs=epochs, batch_size=64, verbose=0)
    print(f"trained {epochs} epochs in {time.perf_counter() - start:.1f} s")
    _, accuracy = model.evaluate(x_test, data.y_test, verbose=0)
    print(f"test accuracy: {accuracy:.4f}")

    report = sparsity_report(model, threshold=1e-3)
    print(report)
    start = time.perf_counter()
    small = prune_model(model, threshold=1e-3)
    print(f"surgery: {1000 * (time.perf_counter() - start):.0f} ms")
    print("filters per convolution:", [layer.filters for layer in small.layers if hasattr(layer, "filters")])

    thresholded = keras.models.clone_model(model)
    thresholded.set_weights(model.get_weights())
    apply_threshold(thresholded, 1e-3)
    want = thresholded.predict(x_test, verbose=0)
    got = small.predict(x_test, verbose=0)
    print(f"largest output difference vs the thresholded model: {np.max(np.abs(got - want)):.1e}")
    pruned_accuracy = float(np.mean(np.argmax(got, axis=1) == data.y_test))
    print(f"pruned model: {small.count_params()} parameters (dense {model.count_params()}), "
          f"test accuracy {pruned_accuracy:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
