"""The paper's Fig. 4 and Fig. 5 on DIGITS: L2, L1, group Lasso, SGL (and proximal SGL) for lambda = 1e-1 ... 1e-5.

64-40-20-10 ReLU MLP, softmax output, Adam (lr 1e-3), 200 epochs, batch 300;
the penalty on every kernel and bias; after training every weight with
|w| <= 1e-3 is set to 0 (``apply_threshold``) and the network is measured
(test accuracy after thresholding, sparsity of the connections, selected
features, live hidden neurons). Each seed draws its own 25 % test split, its
own initial weights and its own batch order, so a run is reproducible from
its seed.

Writes benchmarks/results/digits_sweep.png (four panels vs lambda),
benchmarks/results/digits_features.png (Fig. 5), digits_sweep.md,
digits_sweep.json (every run) and the "digits" section of benchmarks/RESULTS.md.

Usage:
    KERAS_BACKEND=jax python benchmarks/digits_sweep.py --seeds 3
    python benchmarks/digits_sweep.py --quick          # 1 seed, 3 lambdas, 30 epochs, no RESULTS.md
"""

import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import common  # noqa: E402

FACTORS = (1e-1, 1e-2, 1e-3, 1e-4, 1e-5)
HIDDEN = (40, 20)
THRESHOLD = 1e-3
FIG5_FACTOR = 1e-3


def run_one(data, method, factor, seed, epochs, batch_size=300):
    """Train one network and measure it after the paper's threshold; returns (record, model)."""
    from keras_group_lasso import apply_threshold, sparsity_report
    from keras_group_lasso.training import fit_epochs

    model = common.make_model(method, data.n_features, data.n_classes, HIDDEN, factor, seed)
    start = time.perf_counter()
    fit_epochs(model, data.x_train, data.y_train, epochs=epochs, batch_size=batch_size, seed=seed)
    seconds = time.perf_counter() - start
    apply_threshold(model, THRESHOLD)
    report = sparsity_report(model, threshold=THRESHOLD)
    record = {
        "method": method,
        "factor": factor,
        "seed": seed,
        "train_accuracy": common.accuracy(model, data.x_train, data.y_train),
        "test_accuracy": common.accuracy(model, data.x_test, data.y_test),
        "sparsity": report.sparsity,
        "features": report.n_selected_features,
        "neurons": report.live_neurons,
        "layer_sizes": list(report.layer_sizes),
        "params_before": report.params_before,
        "params_after": report.params_after,
        "seconds": seconds,
    }
    return record, model


def sweep(methods, factors, seeds, epochs, fig5_method="SGL"):
    """Every (method, lambda, seed); returns the records and the Fig. 5 strength images of the first seed."""
    from keras_group_lasso.datasets import load_dataset

    records, images = [], {}
    total = len(methods) * len(factors) * len(seeds)
    done = 0
    start = time.perf_counter()
    for seed in seeds:
        data = load_dataset("digits", seed=seed)
        for method in methods:
            for factor in factors:
                record, model = run_one(data, method, factor, seed, epochs)
                records.append(record)
                done += 1
                if seed == seeds[0] and factor == (FIG5_FACTOR if FIG5_FACTOR in factors else factors[0]):
                    images[method] = (common.feature_image(model, data.image_shape), record["features"])
                    if "example" not in images:
                        images["example"] = data.x_test[list(data.y_test).index(8)].reshape(data.image_shape)
                elapsed = time.perf_counter() - start
                common.say(
                    f"[{done}/{total}] seed {seed} {method:8s} lambda={factor:.0e}: "
                    f"test acc {record['test_accuracy']:.3f}, sparsity {100 * record['sparsity']:.1f}%, "
                    f"features {record['features']}, neurons {record['neurons']} "
                    f"({record['seconds']:.1f} s; eta {elapsed / done * (total - done) / 60:.1f} min)"
                )
    return records, images


def _group(records, method, factor, key):
    return [r[key] for r in records if r["method"] == method and r["factor"] == factor]


def table(records, methods, factors):
    """Markdown: mean ± std over seeds per (lambda, method)."""
    rows = []
    for factor in factors:
        for method in methods:
            g = lambda key: _group(records, method, factor, key)  # noqa: E731
            if not g("seed"):
                continue
            rows.append(
                [
                    f"{factor:.0e}",
                    method,
                    common.mean_std(g("test_accuracy"), 1, 100),
                    common.mean_std(g("sparsity"), 1, 100),
                    common.mean_std(g("features"), 1),
                    common.mean_std(g("neurons"), 1),
                    common.mean_std(g("params_after"), 0),
                ]
            )
    head = ["λ", "method", "test acc. [%]", "sparsity [%]", "features (of 64)", "hidden neurons (of 60)", "params after surgery"]
    return common.markdown_table(head, rows)


def plot(records, methods, factors, path):
    """The four panels of Fig. 4 (mean ± std over seeds vs lambda, log x axis)."""
    import numpy as np

    plt = common.pyplot()
    panels = [
        ("test_accuracy", "(a) test accuracy [%]", 100),
        ("sparsity", "(b) sparsity of connections [%]", 100),
        ("features", "(c) selected features", 1),
        ("neurons", "(d) neurons in hidden layers", 1),
    ]
    styles = {"L2": "o-", "L1": "s-", "GL": "^-", "SGL": "D--", "SGL-prox": "v:"}
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    for ax, (key, title, scale) in zip(axes.flat, panels):
        for method in methods:
            xs, means, stds = [], [], []
            for factor in factors:
                values = np.asarray(_group(records, method, factor, key), dtype=float) * scale
                if len(values):
                    xs.append(factor)
                    means.append(values.mean())
                    stds.append(values.std())
            ax.errorbar(xs, means, yerr=stds, fmt=styles.get(method, "o-"), capsize=3, label=method)
        ax.set_xscale("log")
        ax.invert_xaxis()
        ax.set_xlabel("λ")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0, 0].legend()
    fig.suptitle("DIGITS, 64-40-20-10, Adam, threshold 1e-3 (mean ± std over seeds)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def summary(records, methods, factor=1e-3):
    """The issue's claims at lambda = 1e-3, checked against the measured means."""
    import statistics

    def m(method, key):
        values = _group(records, method, factor, key)
        return statistics.fmean(values) if values else None

    if m("SGL", "sparsity") is None or m("L1", "sparsity") is None or m("L2", "test_accuracy") is None:
        return ""
    lines = [f"Checks at λ = {factor:g} (means over seeds):", ""]
    for name in [x for x in ("SGL", "SGL-prox") if x in methods]:
        checks = [
            (f"{name} sparsity ≥ L1 sparsity", m(name, "sparsity") >= m("L1", "sparsity"),
             f"{100 * m(name, 'sparsity'):.1f}% vs {100 * m('L1', 'sparsity'):.1f}%"),
            (f"{name} selects fewer features than L1", m(name, "features") < m("L1", "features"),
             f"{m(name, 'features'):.1f} vs {m('L1', 'features'):.1f}"),
            (f"{name} keeps fewer hidden neurons than L1", m(name, "neurons") < m("L1", "neurons"),
             f"{m(name, 'neurons'):.1f} vs {m('L1', 'neurons'):.1f}"),
            (f"{name} test accuracy within 1 point of L2", m("L2", "test_accuracy") - m(name, "test_accuracy") <= 0.01,
             f"{100 * m(name, 'test_accuracy'):.2f}% vs {100 * m('L2', 'test_accuracy'):.2f}%"),
        ]
        lines += [f"- {'yes' if ok else '**no**'}: {text} ({detail})" for text, ok, detail in checks]
    return "\n".join(lines)


NAME = "digits_sweep"
QUICK = "smoke run: 1 seed, lambda in {1e-2, 1e-3, 1e-4}, 30 epochs; results go to benchmarks/out/"


def main(argv=None):
    parser = common.arguments(__doc__, seeds=3, quick=QUICK)
    parser.add_argument("--epochs", type=common.positive_int, default=None, help="training epochs (default 200, --quick 30)")
    parser.add_argument("--methods", nargs="+", default=None, choices=sorted(common.METHODS),
                        help="penalties to compare (default all; SGL-prox only when Proximal exists)")
    parser.add_argument("--fig5-only", action="store_true",
                        help=f"only redraw results/digits_features.png (seed 0, lambda={FIG5_FACTOR:g}; same runs as the sweep's)")
    args = parser.parse_args(argv)

    methods = args.methods or [m for m in common.METHODS if m != "SGL-prox" or common.proximal_available()]
    run = common.Run(NAME, args)
    # RESULTS.md's section "digits" and the README link digits_features.png; a run under another name keeps apart.
    own = run.name == NAME
    features = run.file("digits_features.png" if own else f"{run.name}_features.png").name
    if args.fig5_only:
        _, images = sweep(methods, (FIG5_FACTOR,), [0], args.epochs or 200)
        example = images.pop("example")
        with run.staged() as stage:
            common.save_feature_figure(
                stage / features, example, [(m, *images[m]) for m in methods],
                f"DIGITS: strength of each pixel's outgoing weights (λ={FIG5_FACTOR:g}, seed 0; white = dropped)")
        common.say(f"wrote {run.out / features}")
        return 0
    factors = (1e-2, 1e-3, 1e-4) if args.quick else FACTORS
    epochs = args.epochs or (30 if args.quick else 200)

    common.say(f"DIGITS sweep: methods {methods}, lambdas {list(factors)}, seeds {run.seeds}, {epochs} epochs")
    records, images = sweep(methods, factors, run.seeds, epochs)

    example = images.pop("example")
    fig5 = [(m, images[m][0], images[m][1]) for m in methods if m in images]
    # The figures replace the earlier ones together, before the numbers are published.
    with run.staged() as stage:
        plot(records, methods, factors, stage / run.path(".png").name)
        common.save_feature_figure(stage / features, example, fig5,
                                   f"DIGITS: strength of each pixel's outgoing weights (λ={FIG5_FACTOR:g}, seed {run.seeds[0]}; white = dropped)")
    notes = [f"{epochs} epochs, batch 300, Adam lr 1e-3, threshold 1e-3; test accuracy measured after thresholding",
             "Hidden neurons and features are those left after removing dead units (what surgery keeps)."]
    body = "\n\n".join([
        table(records, methods, factors),
        summary(records, methods),
        f"![DIGITS sweep](results/{run.path('.png').name})\n\n![DIGITS selected features](results/{features})",
    ])
    run.publish("DIGITS λ sweep (paper Fig. 4 and Fig. 5)", body, records, notes=notes, section="digits" if own else True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
