"""A residual MLP on DIGITS: input features are selected through a shortcut, whole coupled units go.

The first block adds a learned correction to the raw pixels (``x + g(x)``),
so pixel ``j`` and output ``j`` of ``g`` are one unit of the residual stream:
it can only go when no layer reads it anywhere (neither ``g``'s first layer
nor the layer after the block) -- then ``g`` stops making it too, and the
pixel is not selected. A second, projected block carries a 48-wide stream
through another ``Add``. ``add_group_sparsity`` penalises each coupled unit
as one group (its outgoing weights in every layer that reads it, one norm),
``Proximal`` makes whole groups exact zeros, ``prune_model`` removes the
coupled units from every layer they live in; its outputs equal the
thresholded model's.

    python examples/residual_digits.py           # 150 epochs, under a minute on 2 CPU cores
    python examples/residual_digits.py --quick   # 3 epochs, a smoke run
"""

import argparse
import time

import keras
import numpy as np

from keras_group_lasso import Proximal, add_group_sparsity, apply_threshold, prune_model, sparsity_report
from keras_group_lasso.datasets import load_dataset


def build(n_features, n_classes):
    layers = keras.layers
    inputs = keras.Input((n_features,), name="pixels")
    g = layers.Dense(32, activation="relu", name="g_in")(inputs)
    g = layers.Dense(n_features, name="g_out")(g)
    x = layers.Add(name="shortcut")([inputs, g])                      # pixel j + g(x)_j: one unit
    h = layers.Dense(48, activation="relu", name="stem")(x)
    f = layers.Dense(48, activation="relu", name="f_in")(h)
    f = layers.BatchNormalization(name="f_norm")(layers.Dense(48, name="f_out")(f))
    h = layers.ReLU(name="block_relu")(layers.Add(name="residual")([h, f]))  # a 48-wide stream
    outputs = layers.Dense(n_classes, activation="softmax", name="classes")(h)
    return keras.Model(inputs, outputs, name="residual_mlp")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=150)
    parser.add_argument("--factor", type=float, default=1e-3, help="group strength lambda")
    parser.add_argument("--quick", action="store_true", help="3 epochs (a smoke run)")
    args = parser.parse_args(argv)
    epochs = 3 if args.quick else args.epochs

    keras.utils.set_random_seed(0)
    data = load_dataset("digits")
    model = add_group_sparsity(build(data.n_features, data.n_classes), args.factor)
    model.compile(optimizer=Proximal(keras.optimizers.Adam(3e-3)),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    start = time.perf_counter()
    model.fit(data.x_train, data.y_train, epochs=epochs, batch_size=100, verbose=0)
    print(f"trained {epochs} epochs in {time.perf_counter() - start:.1f} s")
    _, accuracy = model.evaluate(data.x_test, data.y_test, verbose=0)
    print(f"test accuracy: {accuracy:.4f}")

    print(sparsity_report(model, threshold=1e-3))
    start = time.perf_counter()
    small = prune_model(model, threshold=1e-3, inputs="selected")
    print(f"surgery: {1000 * (time.perf_counter() - start):.0f} ms")
    print(f"pixels read: {len(small.kept_features)} of {data.n_features}")
    print("units per Dense layer:", {layer.name: layer.units for layer in small.layers
                                     if isinstance(layer, keras.layers.Dense)})

    thresholded = keras.models.clone_model(model)
    thresholded.set_weights(model.get_weights())
    apply_threshold(thresholded, 1e-3)
    want = thresholded.predict(data.x_test, verbose=0)
    got = small.predict(data.x_test[:, list(small.kept_features)], verbose=0)
    print(f"largest output difference vs the thresholded model: {np.max(np.abs(got - want)):.1e}")
    pruned_accuracy = float(np.mean(np.argmax(got, axis=1) == data.y_test))
    print(f"pruned model: {small.count_params()} parameters (dense {model.count_params()}), "
          f"test accuracy {pruned_accuracy:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
