"""Prune a trained group-sparse network, export it as a SavedModel, load it back and predict.

Trains a small SGL network on DIGITS, then ``export_pruned`` removes the dead
input pixels and hidden units and writes ``saved_model/``, ``model.keras`` and
``manifest.json`` (kept features, sizes before/after). The SavedModel is then
served with plain TensorFlow (no Keras, no keras_group_lasso needed to load it)
and checked against the thresholded original.

    python examples/prune_and_export.py --out export/digits_sgl
    python examples/prune_and_export.py --quick --out /tmp/digits_sgl

Writing a SavedModel needs TensorFlow; run with KERAS_BACKEND=tensorflow (the
default). On another backend the example exports ``model.keras`` only.
"""

import argparse
import json

import keras
import numpy as np

from keras_group_lasso import add_group_sparsity, apply_threshold, export_pruned
from keras_group_lasso.datasets import load_dataset
from keras_group_lasso.training import fit_epochs


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="export/digits_sgl", help="export directory (replaced if it exists)")
    parser.add_argument("--quick", action="store_true", help="60 epochs instead of 200")
    args = parser.parse_args()

    data = load_dataset("digits", seed=0)
    keras.utils.set_random_seed(0)
    plain = keras.Sequential([keras.Input((64,)), keras.layers.Dense(40, activation="relu"),
                              keras.layers.Dense(20, activation="relu"), keras.layers.Dense(10, activation="softmax")])
    model = add_group_sparsity(plain, 1e-3)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy")
    fit_epochs(model, data.x_train, data.y_train, epochs=60 if args.quick else 200, batch_size=300, seed=0)

    with_tf = keras.backend.backend() == "tensorflow"
    formats = ("saved_model", "keras") if with_tf else ("keras",)
    result = export_pruned(model, args.out, threshold=1e-3, formats=formats, overwrite=True)
    manifest = result.manifest
    print(result.report)
    print(json.dumps({k: manifest[k] for k in ("layer_sizes_before", "layer_sizes_after",
                                               "params_before", "params_after")}))
    print("wrote", ", ".join(result.paths.values()))

    apply_threshold(model, 1e-3)  # the reference: the original network with |w| <= 1e-3 set to 0
    expected = model.predict(data.x_test, verbose=0)
    if with_tf:
        import tensorflow as tf

        served = tf.saved_model.load(result.paths["saved_model"]).signatures["serving_default"]
        outputs = served(features=tf.constant(data.x_test))  # the full 64-pixel vector (inputs="original")
        got = next(iter(outputs.values())).numpy()
    else:
        got = keras.saving.load_model(result.paths["keras"]).predict(data.x_test, verbose=0)
    accuracy = np.mean(np.argmax(got, axis=1) == data.y_test)
    print(f"loaded model: test accuracy {accuracy:.4f}, max difference to the thresholded original "
          f"{np.max(np.abs(got - expected)):.1e}")


if __name__ == "__main__":
    main()
