"""The README's main job: the paper's DIGITS experiment, end to end, in about a minute.

Trains a 64-40-20-10 ReLU network with the sparse group Lasso (Adam, batch
300, as in the paper), applies the paper's 1e-3 threshold, prints the
sparsity report, then cuts the network down with :func:`prune_model` and
checks that the smaller model predicts exactly what the thresholded one does.
"""

import logging
import sys
import time

import numpy as np

from keras_group_lasso._validation import check_non_negative, check_positive_int, fail

logger = logging.getLogger(__name__)


def _say(message, stream):
    stream.write(message + "\n")
    stream.flush()


def build_model(n_features, n_classes, factor, hidden=(40, 20)):
    """A ReLU MLP with the paper's penalties: input groups, hidden groups, bias groups (SGL).

    A plain Keras model given its penalties by :func:`~keras_group_lasso.add_group_sparsity`,
    which tells the input layer from the hidden ones by the same graph as the report.
    """
    import keras

    from keras_group_lasso import add_group_sparsity

    layers = [keras.Input((n_features,))]
    layers += [keras.layers.Dense(units, activation="relu") for units in hidden]
    layers.append(keras.layers.Dense(n_classes, activation="softmax"))
    return add_group_sparsity(keras.Sequential(layers), factor)


_SEED_MAX = 2**32 - 1  # numpy's and scikit-learn's largest seed


def check_arguments(epochs, factor, threshold, seed, owner="demo", prefix=""):
    """Validate :func:`run`'s arguments before anything is loaded or trained.

    ``owner`` and ``prefix`` shape the message (the command line names its
    options ``--epochs``, ...).

    Raises:
        InvalidParameterError: in the package's one message form, for the first bad argument.
    """
    check_positive_int(owner, prefix + "epochs", epochs)
    check_non_negative(owner, prefix + "factor", factor)
    check_non_negative(owner, prefix + "threshold", threshold)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= _SEED_MAX:
        fail(owner, prefix + "seed", f"an integer in [0, {_SEED_MAX}]", seed)


def run(epochs=200, factor=1e-3, threshold=1e-3, seed=0, stream=None):
    """Train, report, prune and verify on DIGITS; write progress to ``stream`` (stdout).

    Returns:
        0 when the pruned model reproduces the thresholded model's outputs, 1 otherwise.

    Raises:
        InvalidParameterError: a bad argument (see :func:`check_arguments`), before any work.
    """
    check_arguments(epochs, factor, threshold, seed)
    stream = stream or sys.stdout
    import keras

    from keras_group_lasso import apply_threshold, prune_model, sparsity_report
    from keras_group_lasso.datasets import load_dataset
    from keras_group_lasso.training import fit_epochs

    _say(f"keras-group-lasso demo (Keras {keras.__version__}, backend {keras.backend.backend()})", stream)
    data = load_dataset("digits", seed=seed)
    _say(
        f"DIGITS: {len(data.x_train)} training and {len(data.x_test)} test images, "
        f"{data.n_features} pixel features, {data.n_classes} classes",
        stream,
    )
    keras.utils.set_random_seed(seed)
    model = build_model(data.n_features, data.n_classes, factor)
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy", metrics=["accuracy"]
    )
    _say(f"training 64-40-20-10 with sparse group Lasso (lambda={factor:g}) for {epochs} epochs ...", stream)
    start = time.perf_counter()
    fit_epochs(model, data.x_train, data.y_train, epochs=epochs, batch_size=300, seed=seed)
    _say(f"trained in {time.perf_counter() - start:.1f} s", stream)

    zeroed = apply_threshold(model, threshold)
    accuracy = model.evaluate(data.x_test, data.y_test, verbose=0)[1]
    report = sparsity_report(model, threshold=threshold)
    _say(f"\nthreshold {threshold:g}: {zeroed} weights set to 0; test accuracy {accuracy:.4f}\n", stream)
    _say(str(report), stream)
    _say(
        f"\nselected features ({len(report.selected_features)} of {report.n_features}): "
        f"{list(report.selected_features)}",
        stream,
    )
    _say(_feature_picture(report.selected_features, data.image_shape), stream)

    dense_out = model.predict(data.x_test, verbose=0)
    # The compact model reads only the selected features; the drop-in one reads all of them.
    small = prune_model(model, threshold=threshold, inputs="selected")
    drop_in = prune_model(model, threshold=threshold)
    gaps = [
        float(np.max(np.abs(dense_out - small.predict(data.x_test[:, list(small.kept_features)], verbose=0)))),
        float(np.max(np.abs(dense_out - drop_in.predict(data.x_test, verbose=0)))),
    ]
    _say(
        f"pruned model: layer sizes {list(report.original_layer_sizes)} -> {list(report.layer_sizes)}, "
        f"{report.params_before} -> {report.params_after} parameters ({100.0 * report.compression:.1f}%)"
        + _keras_count(model.count_params(), small.count_params(), report),
        stream,
    )
    same = max(gaps) <= 1e-5
    _say(
        f"largest output difference vs the thresholded model: {gaps[0]:.2e} (selected-feature input), "
        f"{gaps[1]:.2e} (drop-in, all {data.n_features} features) -> {'same' if same else 'DIFFERENT'}",
        stream,
    )
    return 0 if same else 1


def _keras_count(before, after, report):
    """Keras's ``count_params()`` where it differs from the report's count (kernels and biases only)."""
    if (before, after) == (report.params_before, report.params_after):
        return ""
    return (f"; Keras's count_params(): {before} -> {after} (it also counts weights that are not kernels "
            "or biases, such as the penalties' strength multipliers)")


def _feature_picture(selected, image_shape):
    """The kept pixels as a small text picture (# kept, . dropped): the paper's Fig. 5."""
    if image_shape is None or len(image_shape) != 2:
        return ""
    rows, cols = image_shape
    keep = np.zeros(rows * cols, dtype=bool)
    keep[list(selected)] = True
    lines = ["kept pixels (# kept, . dropped):"]
    for r in range(rows):
        lines.append("  " + " ".join("#" if k else "." for k in keep[r * cols : (r + 1) * cols]))
    return "\n".join(lines)
