"""Peers on DIGITS: global magnitude pruning (plain Keras) versus the sparse group Lasso plus surgery.

For each seed, on the same split and the same initial weights:

1. **SGL**: 64-40-20-10 with the sparse group Lasso (lambda = 1e-3, every
   kernel and bias), Adam, 200 epochs, batch 300, threshold 1e-3; its
   non-zero connections set the budget K.
2. **L2 dense**: the same network with Keras L2 (lambda = 1e-4), same training.
3. **Magnitude pruning**: the L2 network's K largest kernel weights (|w|,
   over all layers at once) are kept, the rest set to 0, then fine-tuned for
   50 epochs with the mask re-applied after every step (a Keras kernel
   constraint), so it has at most K connections, like SGL.

Both sparse networks are then measured the same way: test accuracy, non-zero
connections, selected features, live hidden neurons, and the parameters left
after surgery (removing dead inputs and units). Magnitude pruning zeroes
scattered weights, so few whole units die and its physical size barely drops.

Usage:
    KERAS_BACKEND=jax python benchmarks/peers_digits.py --seeds 3
    python benchmarks/peers_digits.py --quick     # 1 seed, 30 + 10 epochs; results go to benchmarks/out/
"""

import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import common  # noqa: E402

HIDDEN = (40, 20)
THRESHOLD = 1e-3
BATCH = 300
SGL_FACTOR = 1e-3
L2_FACTOR = 1e-4


def _mask_constraint():
    import keras

    class FixedMask(keras.constraints.Constraint):
        """Keep a pruned weight at zero: ``w <- w * mask`` after every optimizer step."""

        def __init__(self, mask):
            self.mask = keras.ops.convert_to_tensor(mask, dtype="float32")

        def __call__(self, w):
            return w * keras.ops.cast(self.mask, w.dtype)

    return FixedMask


def magnitude_prune(model, keep, data, seed, epochs):
    """Keep the ``keep`` largest |w| over all kernels, fine-tune with the mask fixed; returns a new model."""
    import keras
    import numpy as np

    from keras_group_lasso.training import fit_epochs

    dense = [layer for layer in model.layers if isinstance(layer, keras.layers.Dense)]
    kernels = [np.asarray(layer.kernel) for layer in dense]
    magnitudes = np.concatenate([np.abs(k).ravel() for k in kernels])
    cut = np.sort(magnitudes)[-keep] if keep > 0 else np.inf
    masks = [(np.abs(k) >= cut).astype("float32") for k in kernels]
    FixedMask = _mask_constraint()

    keras.utils.set_random_seed(seed)
    layers = [keras.Input((data.n_features,))]
    for layer, mask in zip(dense, masks):
        layers.append(
            keras.layers.Dense(
                layer.units,
                activation=layer.activation,
                kernel_regularizer=keras.regularizers.L2(L2_FACTOR),
                bias_regularizer=keras.regularizers.L2(L2_FACTOR),
                kernel_constraint=FixedMask(mask),
            )
        )
    pruned = keras.Sequential(layers)
    for new, old, mask, kernel in zip(pruned.layers, dense, masks, kernels):
        new.set_weights([kernel * mask, np.asarray(old.bias)])
    pruned.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy")
    before = common.accuracy(pruned, data.x_test, data.y_test)
    if epochs:
        fit_epochs(pruned, data.x_train, data.y_train, epochs=epochs, batch_size=BATCH, seed=seed)
    # The same weights in a model without the (unserializable, local) mask constraint, for surgery.
    plain = common.build_mlp(data.n_features, data.n_classes, HIDDEN, "l2", L2_FACTOR)
    plain.set_weights(pruned.get_weights())
    return plain, before


def measure(name, model, data, seconds, **extra):
    from keras_group_lasso import apply_threshold, sparsity_report

    apply_threshold(model, THRESHOLD)
    report = sparsity_report(model, threshold=THRESHOLD)
    record = {
        "name": name,
        "test_accuracy": common.accuracy(model, data.x_test, data.y_test),
        "connections": report.total_weights - report.zero_weights,
        "features": report.n_selected_features,
        "neurons": report.live_neurons,
        "layer_sizes": list(report.layer_sizes),
        "params_before": report.params_before,
        "params_after": report.params_after,
        "seconds": seconds,
    }
    try:
        from keras_group_lasso import prune_model

        record["surgery_params"] = int(prune_model(model, threshold=THRESHOLD, inputs="selected").count_params())
    except ImportError:
        pass
    record.update(extra)
    return record


def run_seed(seed, epochs, finetune):
    from keras_group_lasso.datasets import load_dataset
    from keras_group_lasso.training import fit_epochs

    data = load_dataset("digits", seed=seed)
    out = []

    t = time.perf_counter()
    sgl = common.make_model("SGL", data.n_features, data.n_classes, HIDDEN, SGL_FACTOR, seed)
    fit_epochs(sgl, data.x_train, data.y_train, epochs=epochs, batch_size=BATCH, seed=seed)
    out.append(measure(f"SGL λ={SGL_FACTOR:g} + surgery", sgl, data, time.perf_counter() - t))
    budget = out[-1]["connections"]

    t = time.perf_counter()
    l2 = common.make_model("L2", data.n_features, data.n_classes, HIDDEN, L2_FACTOR, seed)
    fit_epochs(l2, data.x_train, data.y_train, epochs=epochs, batch_size=BATCH, seed=seed)
    l2_seconds = time.perf_counter() - t
    pruned, before = magnitude_prune(l2, budget, data, seed, finetune)
    seconds = time.perf_counter() - t
    out.append(measure(f"L2 λ={L2_FACTOR:g}, dense", l2, data, l2_seconds))
    out.append(measure("magnitude pruning + fine-tune", pruned, data, seconds, accuracy_before_finetune=before))
    for r in out:
        r["seed"] = seed
    return out


def table(records):
    names = list(dict.fromkeys(r["name"] for r in records))
    rows = []
    for name in names:
        g = [r for r in records if r["name"] == name]
        rows.append(
            [
                name,
                common.mean_std([r["test_accuracy"] for r in g], 2, 100),
                common.mean_std([r["connections"] for r in g], 0),
                common.mean_std([r["features"] for r in g], 1),
                common.mean_std([r["neurons"] for r in g], 1),
                common.mean_std([r["params_after"] for r in g], 0),
                f"{100 * sum(r['params_after'] for r in g) / sum(r['params_before'] for r in g):.1f}",
            ]
        )
    head = ["network", "test acc. [%]", "non-zero connections", "features (of 64)", "hidden neurons (of 60)",
            "params after surgery", "params kept [%]"]
    return common.markdown_table(head, rows)


NAME = "peers_digits"
QUICK = "1 seed, 30 epochs + 10 fine-tuning; results go to benchmarks/out/"


def main(argv=None):
    parser = common.arguments(__doc__, seeds=3, quick=QUICK)
    args = parser.parse_args(argv)
    epochs, finetune = (30, 10) if args.quick else (200, 50)

    run = common.Run(NAME, args)
    common.say(f"peers on DIGITS: seeds {run.seeds}, {epochs} epochs, {finetune} fine-tuning epochs")
    records = []
    for seed in run.seeds:
        for r in run_seed(seed, epochs, finetune):
            records.append(r)
            common.say(
                f"seed {seed} {r['name']}: test acc {r['test_accuracy']:.3f}, connections {r['connections']}, "
                f"features {r['features']}, neurons {r['neurons']}, params {r['params_before']} -> {r['params_after']}"
            )
    notes = [
        f"64-40-20-10, Adam lr 1e-3, {epochs} epochs, batch 300, threshold 1e-3; magnitude pruning keeps as many "
        f"kernel weights as SGL has non-zero connections (per seed) and is fine-tuned for {finetune} epochs with a fixed mask",
        "Params after surgery: kernels and biases left once dead features and units are removed "
        "(`SparsityReport.params_after`, the size `prune_model` builds).",
    ]
    run.publish("Peers on DIGITS: magnitude pruning vs SGL + surgery", table(records), records, notes=notes,
                section="peers" if run.name == NAME else True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
