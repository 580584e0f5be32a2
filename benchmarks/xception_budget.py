"""A FLOP budget on keras.io's small Xception-style network, Fashion-MNIST: landing, largest cut, accuracy vs dense.

The network is the one of keras.io's "Image classification from scratch"
example, written with Keras layers, its widths scaled by ``--width`` (rounded,
at least 1): an entry ``Conv2D(128, 3, strides=2)-BN-ReLU``; then for each
block size (256, 512, 728 in keras.io)
``ReLU-SeparableConv2D(size)-BN-ReLU-SeparableConv2D(size)-BN-MaxPool(3, 2)``
added to a residual ``Conv2D(size, 1, strides=2)`` projection of the block's
input; then ``SeparableConv2D(1024)-BN-ReLU``, ``GlobalAveragePooling2D``,
``Dropout(0.25)``, ``Dense(10)`` logits. Inputs are 28 x 28 x 1 in [0, 1]
(no rescaling layer, no augmentation).

For every seed, on the same training subset (``--train`` images of
``cnn_fashion.load``'s training split, ``--test`` official test images),
E = ``--epochs`` epochs at batch 32, Adam(1e-3):

1. **dense**: the network trained E epochs.
2. for each budget F in ``--budgets`` (default 0.5 and 0.25):
   ``add_group_sparsity(model)`` at its default strength,
   ``Proximal(Adam(1e-3))``, ``fit(..., epochs=E,
   callbacks=[SparsityBudget(max_flops=F)])`` with no other argument, then
   ``prune_model(model)``; no fine-tuning.

Recorded: test accuracy (dense, budget-trained, pruned) and the largest
|logit| gap between the pruned and the trained model (1,000 test images); the
FLOP ratio ``flops_after / flops_before`` of ``sparsity_report``; the landing
``ratio / F``; ``budget.cuts`` (``(epochs elapsed, groups set to zero)`` per
check) with the number of cuts and the largest as a share of the prunable
groups, counted as the callback counts them (``SparsityBudget.prunable_groups``: the
input-channel groups, rows, of every penalised kernel, depthwise and pointwise
kernels apart; a channel read by two kernels counts twice; 1,021 at the
default width); wall seconds of training
(and pruning).

Usage:
    KERAS_BACKEND=tensorflow python benchmarks/xception_budget.py            # 1 seed -> benchmarks/results/xception_budget.{md,json}
    KERAS_BACKEND=tensorflow python benchmarks/xception_budget.py --quick    # 1,000 images, 1 epoch -> benchmarks/out/
    KERAS_BACKEND=tensorflow python benchmarks/xception_budget.py --seeds 2 --epochs 6 --budgets 0.5 0.25
    KERAS_BACKEND=tensorflow python benchmarks/xception_budget.py --first-seed 1 --output /tmp/xception_s1
"""

import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import cnn_fashion, common

NAME = "xception_budget"
QUICK = "1 seed, 1,000 training and 500 test images, 1 epoch; output under benchmarks/out/"
KERAS_IO = {"entry": 128, "blocks": (256, 512, 728), "exit": 1024}
N_CLASSES = 10
BATCH = 32
LR = 1e-3
DROPOUT = 0.25
GAP_IMAGES = 1000


def widths(factor):
    """The entry, block and exit widths of keras.io's network times ``factor``, rounded, at least 1."""
    def scale(n):
        return max(1, round(n * factor))

    return {"entry": scale(KERAS_IO["entry"]), "blocks": [scale(n) for n in KERAS_IO["blocks"]],
            "exit": scale(KERAS_IO["exit"])}


def widths_text(w):
    return f"entry {w['entry']}, blocks {'-'.join(map(str, w['blocks']))}, exit {w['exit']}"


def build(seed, w):
    """keras.io's small Xception-style network (functional API), seeded, with widths ``w``."""
    import keras
    from keras import layers

    keras.utils.set_random_seed(seed)
    inputs = keras.Input((28, 28, 1))
    x = layers.Conv2D(w["entry"], 3, strides=2, padding="same", name="entry_conv")(inputs)
    x = layers.BatchNormalization(name="entry_bn")(x)
    x = layers.Activation("relu", name="entry_relu")(x)
    previous = x
    for k, size in enumerate(w["blocks"], start=1):
        x = layers.Activation("relu", name=f"b{k}_relu1")(x)
        x = layers.SeparableConv2D(size, 3, padding="same", name=f"b{k}_sep1")(x)
        x = layers.BatchNormalization(name=f"b{k}_bn1")(x)
        x = layers.Activation("relu", name=f"b{k}_relu2")(x)
        x = layers.SeparableConv2D(size, 3, padding="same", name=f"b{k}_sep2")(x)
        x = layers.BatchNormalization(name=f"b{k}_bn2")(x)
        x = layers.MaxPooling2D(3, strides=2, padding="same", name=f"b{k}_pool")(x)
        residual = layers.Conv2D(size, 1, strides=2, padding="same", name=f"b{k}_proj")(previous)
        x = layers.add([x, residual], name=f"b{k}_add")
        previous = x
    x = layers.SeparableConv2D(w["exit"], 3, padding="same", name="exit_sep")(x)
    x = layers.BatchNormalization(name="exit_bn")(x)
    x = layers.Activation("relu", name="exit_relu")(x)
    x = layers.GlobalAveragePooling2D(name="gap")(x)
    x = layers.Dropout(DROPOUT, name="dropout")(x)
    outputs = layers.Dense(N_CLASSES, name="logits")(x)
    return keras.Model(inputs, outputs, name="xception_small")


def compile_model(model, optimizer):
    import keras

    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def load_data(n_train, n_test):
    """The first ``n_train`` images of ``cnn_fashion.load``'s training split (seed 0) and ``n_test`` test images."""
    import numpy as np

    data = cnn_fashion.load(quick=False, seed=0)
    return {"x_train": data["x_train"][:n_train].astype("float32"), "y_train": np.asarray(data["y_train"][:n_train]),
            "x_test": data["x_test"][:n_test].astype("float32"), "y_test": np.asarray(data["y_test"][:n_test])}


def fit(model, data, epochs, seed, callbacks=()):
    """``fit`` (batch 32, shuffled with a seed); returns (History.history, wall seconds, budget warnings)."""
    import keras

    keras.utils.set_random_seed(seed + 1000)
    marks = [time.perf_counter()]

    def progress(epoch, logs):  # one line per epoch while it runs (benchmarks run under nohup)
        marks.append(time.perf_counter())
        common.say(f"    epoch {epoch + 1}: {marks[-1] - marks[-2]:.0f} s, loss {logs.get('loss', float('nan')):.4f}"
                   + (f", budget flops {logs['budget_flops']:.4g}" if "budget_flops" in logs else ""))

    callbacks = [*callbacks, keras.callbacks.LambdaCallback(on_epoch_end=progress)]
    return common.fit_recording_warnings(model, data, BATCH, epochs, callbacks)


def say_epochs(label, history):
    for e in range(len(history.get("loss", []))):
        budget = ", ".join(f"{k[len('budget_'):]} {history[k][e]:.4g}" for k in sorted(history)
                           if k.startswith("budget_") and e < len(history[k]))
        common.say(f"  {label} epoch {e + 1}: loss {history['loss'][e]:.4f} acc {history['accuracy'][e]:.4f}"
                   + (f" | {budget}" if budget else ""))


def logits(model, x):
    import keras
    import numpy as np

    return np.asarray(keras.ops.convert_to_numpy(model.predict(x, batch_size=500, verbose=0)), dtype=np.float64)


def check_prunable(w):
    """``prune_model`` on the random-weight network (penalised): the output must match."""
    import numpy as np

    import keras_group_lasso as kgl

    model = kgl.add_group_sparsity(build(0, w))
    x = np.random.default_rng(0).random((64, 28, 28, 1), dtype=np.float32)
    pruned = kgl.prune_model(model)
    gap = float(np.max(np.abs(logits(pruned, x) - logits(model, x))))
    report = kgl.sparsity_report(model)
    common.say(f"prune_model on the random-weight network: max logit gap {gap:.3g}; "
               f"{pruned.count_params():,} of {model.count_params():,} parameters; "
               f"flops_before {int(report.flops_before):,}")
    return {"random_weights_gap": gap, "flops_before": int(report.flops_before),
            "params": int(model.count_params())}


def run_dense(seed, data, epochs, w):
    model = compile_model(build(seed, w), _adam())
    history, wall, _ = fit(model, data, epochs, seed)
    say_epochs("dense", history)
    return {"test_accuracy": cnn_fashion.accuracy(model, data["x_test"], data["y_test"]), "train_seconds": wall,
            "wall_seconds": wall, "history": history}


def _adam():
    import keras

    return keras.optimizers.Adam(LR)


def run_budget(seed, data, epochs, w, fraction):
    import keras
    import numpy as np

    import keras_group_lasso as kgl

    model = kgl.add_group_sparsity(build(seed, w))
    compile_model(model, kgl.Proximal(keras.optimizers.Adam(LR)))
    budget = kgl.SparsityBudget(max_flops=fraction)
    history, train_wall, messages = fit(model, data, epochs, seed, callbacks=[budget])
    say_epochs(f"budget {fraction:g}", history)
    groups = budget.prunable_groups  # the input groups (rows) of every penalised kernel
    report = kgl.sparsity_report(model)
    start = time.perf_counter()
    pruned = kgl.prune_model(model)
    prune_wall = time.perf_counter() - start
    x = data["x_test"][:GAP_IMAGES]
    want = logits(model, x)
    got = logits(pruned, x)
    gap = float(np.max(np.abs(got - want)))
    try:  # what prune_model promises: the trained model after apply_threshold (|w| <= 1e-3 set to 0)
        copy = keras.models.clone_model(model)
        copy.set_weights(model.get_weights())
        kgl.apply_threshold(copy)
        gap_thresholded = float(np.max(np.abs(got - logits(copy, x))))
    except Exception as error:  # noqa: BLE001 - a diagnostic only
        common.say(f"  note: no thresholded comparison ({type(error).__name__}: {error})")
        gap_thresholded = None
    cuts = [(float(e), int(n)) for e, n in budget.cuts]
    largest = max((n for _, n in cuts), default=0)
    ratio = float(report.flops_after) / float(report.flops_before)
    record = {
        "budget": fraction,
        "trained_accuracy": cnn_fashion.accuracy(model, data["x_test"], data["y_test"]),
        "test_accuracy": cnn_fashion.accuracy(pruned, data["x_test"], data["y_test"]),
        "max_gap": gap, "max_gap_vs_thresholded": gap_thresholded, "output_scale": float(np.max(np.abs(want))),
        "flops_before": int(report.flops_before), "flops_after": int(report.flops_after),
        "flops_ratio": ratio, "landing": ratio / fraction,
        "cuts": cuts, "n_cuts": len(cuts), "cut_groups": sum(n for _, n in cuts),
        "prunable_groups": int(groups), "largest_cut": largest, "largest_cut_share": largest / groups,
        "pruned_widths": pruned_widths(pruned), "params_after": int(pruned.count_params()),
        "train_seconds": train_wall, "prune_seconds": prune_wall, "wall_seconds": train_wall + prune_wall,
        "history": history, "budget_warnings": messages,
    }
    common.say(f"  budget {fraction:g}: FLOPs {ratio:.3f} (landing {record['landing']:.3f}), {len(cuts)} cuts, "
               f"largest {largest} of {groups} groups ({100 * record['largest_cut_share']:.1f} %), "
               f"acc trained {record['trained_accuracy']:.4f} pruned {record['test_accuracy']:.4f}, gap {gap:.3g} "
               f"(vs thresholded {gap_thresholded}, logit scale {record['output_scale']:.3g}); "
               f"cuts {cuts}")
    return record


def pruned_widths(model):
    """Output channels / units of each convolution and Dense layer of the pruned model, by name."""
    import keras

    out = {}
    for layer in model.layers:
        if isinstance(layer, (keras.layers.Conv2D, keras.layers.SeparableConv2D)):
            out[layer.name] = int(layer.filters)
        elif isinstance(layer, keras.layers.Dense):
            out[layer.name] = int(layer.units)
    return out


def thresholded_gap(group):
    """The largest gap to the thresholded model over the seeds that measured it (``-`` if none did)."""
    gaps = [r["max_gap_vs_thresholded"] for r in group if r.get("max_gap_vs_thresholded") is not None]
    if not gaps:
        return "-"
    return f"{max(gaps):.2g}" + ("" if len(gaps) == len(group) else f" ({len(gaps)} of {len(group)} seeds)")


def table(records, fractions):
    import statistics

    dense = {r["seed"]: r["test_accuracy"] for r in records if r["method"] == "dense"}
    rows = []
    group = [r for r in records if r["method"] == "dense"]
    rows.append(["dense", common.mean_std([r["test_accuracy"] for r in group], 2, 100), "-", "-", "-", "-", "1.000",
                 "-", "-", "-", "-", common.mean_std([r["wall_seconds"] for r in group], 0)])
    for f in fractions:
        group = [r for r in records if r["method"] == "budget" and r["budget"] == f]
        if not group:
            continue
        rows.append([
            f"`SparsityBudget(max_flops={f:g})`",
            common.mean_std([r["trained_accuracy"] for r in group], 2, 100),
            common.mean_std([r["test_accuracy"] for r in group], 2, 100),
            common.mean_std([100 * (r["test_accuracy"] - dense[r["seed"]]) for r in group], 2),
            f"{max(r['max_gap'] for r in group):.2g}",
            thresholded_gap(group),
            common.mean_std([r["flops_ratio"] for r in group], 3),
            common.mean_std([r["landing"] for r in group], 3),
            (f"{max(r['largest_cut_share'] for r in group) * 100:.1f} % "
             f"({max(r['largest_cut'] for r in group)} of {group[0]['prunable_groups']})"),
            common.mean_std([r["n_cuts"] for r in group], 1),
            f"{statistics.fmean(r['cut_groups'] for r in group):.0f}",
            common.mean_std([r["wall_seconds"] for r in group], 0),
        ])
    head = ["run", "test acc. trained (%)", "test acc. pruned (%)", "pruned vs dense (points)",
            "max logit gap vs trained", "max logit gap vs trained + `apply_threshold`",
            "FLOPs after / before", "landing (ratio / F)", "largest single cut (share of groups)", "cuts",
            "groups cut", "wall (s)"]
    return common.markdown_table(head, rows)


def parse_args(argv=None):
    parser = common.arguments(__doc__, seeds=1, quick=QUICK)
    parser.add_argument("--first-seed", type=common.non_negative_int, default=0,
                        help="the first seed (default 0): seeds first..first+N-1")
    parser.add_argument("--train", type=common.positive_int, default=12000, help="training images (default 12000)")
    parser.add_argument("--test", type=common.positive_int, default=10000, help="test images (default 10000)")
    parser.add_argument("--epochs", type=common.positive_int, default=6, help="E, epochs of every run (default 6)")
    parser.add_argument("--budgets", type=float, nargs="+", default=[0.5, 0.25],
                        help="FLOP budgets F, fractions of the dense multiply-adds (default 0.5 0.25)")
    parser.add_argument("--width", type=float, default=0.125,
                        help="factor on keras.io's widths 128 / 256-512-728 / 1024 (default 0.125)")
    parser.add_argument("--output", default=None,
                        help="path prefix of the .md and .json (default benchmarks/results/<--out-name>, "
                             "benchmarks/out/ with --quick)")
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.train, args.test, args.epochs = 1, 1000, 500, 1
    if any(not 0 < f <= 1 for f in args.budgets):
        parser.error("--budgets must be fractions in (0, 1]")
    if args.width <= 0:
        parser.error("--width must be > 0")
    return args


def main(argv=None):
    args = parse_args(argv)
    import keras
    import numpy as np

    w = widths(args.width)
    run = common.Run(NAME, args, seeds=range(args.first_seed, args.first_seed + args.seeds), output=args.output)
    seeds = run.seeds
    data = load_data(args.train, args.test)
    check = check_prunable(w)
    common.say(f"{len(data['x_train'])} training / {len(data['x_test'])} test images, {args.epochs} epochs, "
               f"batch {BATCH}, budgets {args.budgets}, seeds {seeds}; widths {widths_text(w)} "
               f"(x{args.width:g}); backend {keras.backend.backend()}")
    records = []
    for seed in seeds:
        runs = [("dense", None)] + [("budget", f) for f in args.budgets]
        for method, fraction in runs:
            keras.utils.set_random_seed(seed)
            np.random.seed(seed)
            common.say(f"seed {seed}: {method}" + (f" F = {fraction:g}" if fraction else ""))
            if method == "dense":
                record = run_dense(seed, data, args.epochs, w)
            else:
                record = run_budget(seed, data, args.epochs, w, fraction)
            records.append({"method": method, "seed": seed, **record})
            common.say(f"seed {seed} {method}: test acc {record['test_accuracy']:.4f}, "
                       f"wall {record['wall_seconds']:.0f} s")
    notes = [
        (f"Network: keras.io's small Xception-style network (\"Image classification from scratch\") with widths "
         f"x{args.width:g}: {widths_text(w)}; 28x28x1 inputs; dense multiply-adds {check['flops_before']:,} per "
         f"sample (`sparsity_report`), {check['params']:,} parameters; `prune_model` on the random-weight "
         f"penalised network: max logit gap {check['random_weights_gap']:.2g}"),
        (f"Data: the first {len(data['x_train']):,} images of `cnn_fashion.load`'s training split (the same for "
         f"every seed), {len(data['x_test']):,} official test images"),
        (f"E = {args.epochs} epochs in every run, batch {BATCH}, Adam lr {LR:g}; budget runs: "
         "`add_group_sparsity(model)` (default strength), `Proximal(Adam(1e-3))`, `SparsityBudget(max_flops=F)` "
         "with no other argument, `prune_model(model)`, no fine-tuning"),
        ("Largest single cut: the most groups one check of `budget.cuts` set to zero, as a share of the "
         "prunable groups counted as the callback counts them (`SparsityBudget.prunable_groups`: the input-channel "
         "groups of every penalised kernel, depthwise and pointwise apart, so a channel read by two kernels "
         "counts twice); "
         "landing: (flops_after / flops_before of `sparsity_report`) / F; max logit gap: pruned vs trained "
         f"model on {GAP_IMAGES} test images (max over seeds), and vs the trained model after "
         "`apply_threshold` (every weight |w| <= 1e-3 set to 0, what `prune_model` promises to compute)"),
        "Times: wall seconds of training + pruning on a 2-core CPU shared with other jobs",
    ]
    # RESULTS.md's section xception_budget is written by hand from the runs of several seeds: none here
    run.publish("SparsityBudget on keras.io's small Xception, Fashion-MNIST", table(records, args.budgets), records,
                notes=notes, section=False, widths=w, check=check)
    return 0


if __name__ == "__main__":
    sys.exit(main())
