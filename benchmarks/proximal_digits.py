"""Proximal training on DIGITS: exact zeros without a threshold, per optimizer, next to subgradient + threshold.

The paper's DIGITS setup: 64-40-20-10 ReLU MLP with softmax output, sparse
group Lasso (``SparseGroupLasso(λ)``, ``l1 = λ``) on every kernel and every
bias, 200 epochs, batch 300, inputs min-max scaled on the training split, a
stratified 25 % test split drawn per seed (``keras_group_lasso.datasets``).
All epochs run through one Keras ``fit`` epoch (``training.fit_epochs``).

* ``prox-*`` rows: ``Proximal(optimizer)``; **no threshold**: a weight counts
  as zero only if it is exactly ``0.0``.
* ``subgrad-*`` rows: the plain optimizer with the same penalty as a loss term,
  then the paper's threshold (|w| <= 1e-3 set to 0 in kernels and biases)
  before measuring; exact zeros before the threshold are reported too.

Columns: test accuracy, % of kernel weights equal to 0, input features kept
(nonzero rows of the first kernel), hidden units kept (nonzero outgoing rows
of the second and third kernels), mean ± std over seeds.

Writes benchmarks/results/proximal_digits.md, .png (accuracy vs exact zeros) and .json (every run).

Usage:
    python benchmarks/proximal_digits.py                 # full sweep, seeds 0..2
    python benchmarks/proximal_digits.py --quick         # seed 0, 3 configs, 60 epochs; to benchmarks/out/
    python benchmarks/proximal_digits.py --only prox-adam --seeds 1
"""

import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import common  # noqa: E402

HIDDEN = (40, 20)
THRESHOLD = 1e-3

# name -> (optimizer, proximal? ("euclidean": Proximal(metric="euclidean")), lambda grid)
CONFIGS = {
    "prox-sgd-momentum": ("sgd_momentum", True, (3e-4, 5e-4, 7e-4, 1e-3)),
    "prox-sgd-momentum-lr0.2": ("sgd_momentum_0.2", True, (4e-4, 5e-4, 6e-4)),
    "prox-sgd": ("sgd_plain", True, (3e-4, 1e-3)),
    "prox-sgd-momentum-euclidean": ("sgd_momentum", "euclidean", (3e-3, 1e-2)),
    "prox-adam": ("adam", True, (3e-4, 1e-3, 1.5e-3)),
    "prox-adam-lr3e-3": ("adam_3e-3", True, (1e-3, 1.5e-3, 2e-3)),
    "prox-adam-lr1e-2": ("adam_1e-2", True, (1e-3, 1.2e-3, 1.5e-3)),
    "prox-adamw-lr3e-3": ("adamw_3e-3", True, (1e-3, 1.5e-3)),
    "prox-rmsprop": ("rmsprop", True, (3e-4, 1e-3)),
    "prox-adam-euclidean": ("adam", "euclidean", (1e-1, 3e-1)),
    "subgrad-sgd-momentum": ("sgd_momentum", False, (1e-4, 3e-4, 1e-3)),
    "subgrad-adam": ("adam", False, (1e-4, 1e-3, 3e-3)),
}
QUICK_GRID = {
    "prox-sgd-momentum": (7e-4,),
    "prox-adam-lr1e-2": (1e-3,),
    "subgrad-adam": (1e-3,),
}


def make_optimizer(kind):
    import keras

    return {
        "sgd_momentum": lambda: keras.optimizers.SGD(0.1, momentum=0.9),
        "sgd_momentum_0.2": lambda: keras.optimizers.SGD(0.2, momentum=0.9),
        "sgd_plain": lambda: keras.optimizers.SGD(0.1),
        "adam": lambda: keras.optimizers.Adam(1e-3),
        "adam_3e-3": lambda: keras.optimizers.Adam(3e-3),
        "adam_1e-2": lambda: keras.optimizers.Adam(1e-2),
        "adamw_3e-3": lambda: keras.optimizers.AdamW(3e-3, weight_decay=1e-4),
        "rmsprop": lambda: keras.optimizers.RMSprop(1e-3),
    }[kind]()


def build_model(n_features, n_classes, factor, seed):
    import keras

    from keras_group_lasso import SparseGroupLasso

    keras.utils.set_random_seed(seed)
    layers = [keras.Input((n_features,))]
    for units in HIDDEN:
        layers.append(
            keras.layers.Dense(
                units,
                activation="relu",
                kernel_regularizer=SparseGroupLasso(factor),
                bias_regularizer=SparseGroupLasso(factor),
            )
        )
    layers.append(
        keras.layers.Dense(
            n_classes,
            activation="softmax",
            kernel_regularizer=SparseGroupLasso(factor),
            bias_regularizer=SparseGroupLasso(factor),
        )
    )
    return keras.Sequential(layers)


def measure(model, data):
    kernels = [layer.kernel.numpy() for layer in model.layers]
    weights = [w.numpy() for w in model.trainable_weights]
    predictions = model.predict(data.x_test, batch_size=2048, verbose=0)
    return {
        "test_accuracy": float(np.mean(np.argmax(predictions, axis=1) == data.y_test)),
        "kernel_zeros": float(sum((k == 0).sum() for k in kernels) / sum(k.size for k in kernels)),
        "features": int(np.any(kernels[0] != 0, axis=1).sum()),
        "units": [int(np.any(k != 0, axis=1).sum()) for k in kernels[1:]],
        "any_nan": bool(any(np.isnan(w).any() for w in weights)),
    }


def run_one(data, name, factor, seed, epochs, batch_size=300, jit_compile=True):
    from keras_group_lasso import Proximal
    from keras_group_lasso.training import fit_epochs

    kind, proximal, _ = CONFIGS[name]
    model = build_model(data.n_features, data.n_classes, factor, seed)
    optimizer = make_optimizer(kind)
    if proximal:
        optimizer = Proximal(optimizer, metric="euclidean" if proximal == "euclidean" else "auto")
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy", jit_compile=jit_compile)
    start = time.perf_counter()
    fit_epochs(model, data.x_train, data.y_train, epochs=epochs, batch_size=batch_size, seed=seed)
    record = {"config": name, "factor": factor, "seed": seed, "seconds": time.perf_counter() - start}
    if proximal:
        record.update(measure(model, data))
    else:
        record["exact_zeros_before_threshold"] = measure(model, data)["kernel_zeros"]
        for w in model.trainable_weights:
            value = w.numpy()
            w.assign(np.where(np.abs(value) <= THRESHOLD, 0.0, value).astype(value.dtype))
        record.update(measure(model, data))
    return record


def summarize(records):
    groups = {}
    for r in records:
        groups.setdefault((r["config"], r["factor"]), []).append(r)

    def ms(values, scale=1.0, digits=1):
        values = [scale * v for v in values]
        if len(values) == 1:
            return f"{values[0]:.{digits}f}"
        return f"{statistics.fmean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"

    rows = []
    for (config, factor), runs in groups.items():
        rows.append(
            {
                "config": config,
                "factor": factor,
                "n": len(runs),
                "acc": statistics.fmean(r["test_accuracy"] for r in runs),
                "zeros": statistics.fmean(r["kernel_zeros"] for r in runs),
                "cells": [
                    config,
                    f"{factor:g}",
                    ms([r["test_accuracy"] for r in runs], 100),
                    ms([r["kernel_zeros"] for r in runs], 100),
                    ms([r["features"] for r in runs], digits=1),
                    " + ".join(ms([r["units"][i] for r in runs], digits=1) for i in range(len(HIDDEN))),
                    ms([r.get("exact_zeros_before_threshold", r["kernel_zeros"]) for r in runs], 100),
                    "yes" if any(r["any_nan"] for r in runs) else "no",
                    ms([r["seconds"] for r in runs], digits=1),
                ],
            }
        )
    return rows


def table(rows):
    head = ["config", "λ", "test acc %", "kernel zeros %", "features /64", "hidden units /40 + /20",
            "exact zeros % (no threshold)", "NaN", "train s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(r["cells"]) + " |" for r in rows]
    return "\n".join(lines)


def best(rows, configs, min_acc):
    fits = [r for r in rows if r["config"] in configs and r["acc"] >= min_acc]
    return max(fits, key=lambda r: r["zeros"]) if fits else None


def plot(rows, path):
    """Accuracy vs % zero kernel weights, one line per configuration (mean over seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.5))
    configs = list(dict.fromkeys(r["config"] for r in rows))
    colors = plt.cm.tab20(np.linspace(0, 1, max(len(configs), 2)))
    for color, config in zip(colors, configs):
        pts = sorted((r["zeros"] * 100, r["acc"] * 100, r["factor"]) for r in rows if r["config"] == config)
        style = "--" if config.startswith("subgrad") else "-"
        marker = "s" if config.startswith("subgrad") else "o"
        ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker=marker, color=color, label=config)
        for zx, acc, factor in pts:
            ax.annotate(f"{factor:g}", (zx, acc), fontsize=6, xytext=(2, 2), textcoords="offset points")
    ax.set_xlabel("kernel weights equal to 0 (%)  [subgrad: after |w| <= 1e-3 -> 0]")
    ax.set_ylabel("test accuracy (%)")
    ax.set_ylim(85, 100)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title("DIGITS 64-40-20-10, SGL, 200 epochs (mean over seeds; labels: λ)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


NAME = "proximal_digits"
QUICK = "seed 0, three configs, 60 epochs; results go to benchmarks/out/"


def main(argv=None):
    parser = common.arguments(__doc__, seeds=3, quick=QUICK)
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--only", nargs="+", choices=sorted(CONFIGS), help="run only these configs")
    parser.add_argument("--factors", type=float, nargs="+", help="override the lambda grid")
    parser.add_argument("--replot", action="store_true", help="redraw the figure from results/proximal_digits.json")
    args = parser.parse_args(argv)
    run = common.Run(NAME, args)
    if args.replot:
        records = json.loads(run.path(".json").read_text())
        if isinstance(records, dict):  # written by common.Run.publish (before it: the bare list of records)
            records = records["records"]
        plot(summarize(records), run.path(".png"))
        return 0

    from keras_group_lasso.datasets import load_dataset

    grid = {name: spec[2] for name, spec in CONFIGS.items()}
    epochs = args.epochs
    if args.quick:
        grid, epochs = dict(QUICK_GRID), 60
    if args.only:
        grid = {name: grid.get(name, CONFIGS[name][2]) for name in args.only}
    if args.factors:
        grid = {name: tuple(args.factors) for name in grid}

    records = []
    for seed in run.seeds:
        data = load_dataset("digits", seed=seed)
        for name, factors in grid.items():
            for factor in factors:
                r = run_one(data, name, factor, seed, epochs)
                records.append(r)
                common.say(
                    f"{name:22s} λ={factor:<7g} seed={seed} acc={100 * r['test_accuracy']:.1f}% "
                    f"zeros={100 * r['kernel_zeros']:.1f}% features={r['features']} units={r['units']} "
                    f"nan={r['any_nan']} {r['seconds']:.1f}s"
                )
    rows = summarize(records)
    notes = [
        f"{epochs} epochs, batch 300, jit_compile=True",
        "Setup: 64-40-20-10 ReLU MLP, SparseGroupLasso(λ) (l1 = λ) on every kernel and bias;"
        " SGD lr 0.1 unless named (momentum 0.9 where named), Adam and RMSprop lr 1e-3 unless named,"
        " AdamW lr 3e-3 with weight_decay 1e-4.",
        "`prox-*`: `Proximal(optimizer)` (metric \"auto\": thresholds lr·λ/(1 - momentum) for SGD,"
        " the optimizer's preconditioner for Adam/AdamW/RMSprop), zeros are exact 0.0 (no threshold);"
        " `*-euclidean`: `Proximal(optimizer, metric=\"euclidean\")` (thresholds lr·λ);"
        " `subgrad-*`: penalty as a loss term, then |w| <= 1e-3 set to 0 before measuring.",
    ]
    lines = [table(rows), "", "## Targets", ""]
    proximal = [name for name in CONFIGS if name.startswith("prox-")]
    for label, configs, min_acc, min_zeros in (
        ("best proximal", proximal, 0.96, 0.80),
        ("proximal Adam", ["prox-adam", "prox-adam-lr3e-3", "prox-adam-lr1e-2"], 0.955, 0.60),
    ):
        b = best(rows, configs, min_acc)
        if b is None:
            lines.append(f"- {label}: no configuration reaches {100 * min_acc:.1f}% mean accuracy — MISSED")
        else:
            verdict = "met" if b["zeros"] >= min_zeros else "MISSED"
            lines.append(
                f"- {label} (target >= {100 * min_zeros:.0f}% zeros at >= {100 * min_acc:.1f}%): "
                f"{b['config']} λ={b['factor']:g}: {100 * b['acc']:.1f}% accuracy, "
                f"{100 * b['zeros']:.1f}% exact zeros — {verdict}"
            )
    with run.staged() as stage:
        plot(rows, stage / run.path(".png").name)
    lines += ["", f"![accuracy vs exact zeros]({run.path('.png').name})"]
    run.publish("Proximal training on DIGITS (no threshold)", "\n".join(lines), records, notes=notes, section=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
