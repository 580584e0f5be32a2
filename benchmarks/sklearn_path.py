"""The scikit-learn estimator's regularization path on DIGITS and on a synthetic selection problem.

DIGITS (scikit-learn's 8x8 digits, 64 pixels, 10 classes): for each seed, the
stratified 75/25 split of ``load_dataset("digits", seed=seed)``; the path runs on
the training part (which holds out ``--validation-fraction`` of it to score the
points), and for each feature budget K in 50/40/30/20/10 the point with the best
*validation* score among those with <= K features is evaluated once on the test
set. The path's wall time is measured around ``clf.path(...)``. Both the refitted
points (the default) and the penalized points (``refit=False``, the
``penalized_score`` of the same path: the selection step's own model) are reported.

Synthetic: ``make_classification`` with informative, redundant (linear
combinations of the informative ones) and pure-noise columns, ``shuffle=False``
so the column roles are known. The selected set of (a) the path point chosen by
validation score with a tolerance of one point of accuracy (the fewest features
within 0.01 of the best) and (b) a single ``fit`` with proximal training are
compared with the informative and the informative + redundant columns
(precision and recall).

Usage:
    KERAS_BACKEND=jax python benchmarks/sklearn_path.py --seeds 3
    python benchmarks/sklearn_path.py --quick     # 1 seed, short training; writes to benchmarks/out/
"""

import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import common  # noqa: E402

BUDGETS = (50, 40, 30, 20, 10)


def digits_run(seed, args, alpha):
    from keras_group_lasso.datasets import load_dataset
    from keras_group_lasso.sklearn import GroupSparseMLPClassifier

    data = load_dataset("digits", seed=seed)
    clf = GroupSparseMLPClassifier(
        hidden_layer_sizes=(40, 20),
        alpha=alpha,
        epochs=args.epochs,
        batch_size=args.batch_size,
        validation_fraction=args.validation_fraction,
        random_state=seed,
    )
    start = time.perf_counter()
    path = clf.path(
        data.x_train,
        data.y_train,
        path_multiplier=args.multiplier,
        epochs_per_alpha=args.epochs_per_alpha,
    )
    wall = time.perf_counter() - start
    rows = {}
    for budget in BUDGETS:
        point = path.best(max_features=budget)
        refit_test = path.estimator(point).score(data.x_test, data.y_test)
        # The same path without the refit: the selection step's own model at its best point.
        penalized = max(
            (p for p in path if p.n_features <= budget), key=lambda p: (p.penalized_score, -p.n_features)
        )
        rows[budget] = {
            "features": point.n_features,
            "alpha": point.alpha,
            "val": point.score,
            "test": refit_test,
            "penalized_features": penalized.n_features,
            "penalized_val": penalized.penalized_score,
        }
    common.say(
        f"digits alpha {alpha:g} seed {seed}: {len(path)} points in {wall:.1f} s; "
        + ", ".join(f"<={b}: {r['features']} feat. test {r['test']:.3f}" for b, r in rows.items())
    )
    return {"seed": seed, "alpha": alpha, "wall_s": wall, "points": len(path), "budgets": rows, "path": path, "data": data}


def fit_timing(args):
    """Wall time of ``fit`` on DIGITS (first = with compiling, then reusing it) and of a plain Keras loop."""
    import keras

    from keras_group_lasso.datasets import load_dataset
    from keras_group_lasso.sklearn import GroupSparseMLPClassifier

    data = load_dataset("digits", seed=0)
    fits = []
    for random_state in range(3):
        start = time.perf_counter()
        clf = GroupSparseMLPClassifier(epochs=args.epochs, batch_size=args.batch_size, random_state=random_state)
        clf.fit(data.x_train, data.y_train)
        fits.append({"seconds": time.perf_counter() - start, "test": clf.score(data.x_test, data.y_test)})
    # The same network and penalties trained the usual Keras way: `epochs` Keras epochs.
    model = keras.models.clone_model(clf.model_)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy")
    start = time.perf_counter()
    model.fit(data.x_train, data.y_train, epochs=args.epochs, batch_size=args.batch_size, verbose=0)
    plain = time.perf_counter() - start
    seconds = ", ".join("%.1f" % f["seconds"] for f in fits)
    common.say(f"fit timing: {seconds} s; plain Keras loop {plain:.1f} s")
    return {"fits": fits, "plain_keras_s": plain}


def synthetic_run(seed, args):
    import numpy as np
    from sklearn.datasets import make_classification
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import MinMaxScaler

    from keras_group_lasso.sklearn import GroupSparseMLPClassifier

    n_inf, n_red, n_noise = 5, 5, 20
    x, y = make_classification(
        n_samples=args.synthetic_samples,
        n_features=n_inf + n_red + n_noise,
        n_informative=n_inf,
        n_redundant=n_red,
        n_repeated=0,
        n_classes=3,
        n_clusters_per_class=1,
        class_sep=1.0,
        shuffle=False,
        random_state=seed,
    )
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=seed, stratify=y)
    scaler = MinMaxScaler().fit(x_train)
    x_train, x_test = scaler.transform(x_train), scaler.transform(x_test)
    informative = set(range(n_inf))
    relevant = set(range(n_inf + n_red))

    def quality(selected):
        selected = set(int(j) for j in selected)
        hits = len(selected & relevant)
        return {
            "selected": sorted(selected),
            "n_selected": len(selected),
            "precision": hits / len(selected) if selected else float("nan"),
            "recall_informative": len(selected & informative) / len(informative),
            "recall_relevant": hits / len(relevant),
        }

    clf = GroupSparseMLPClassifier(
        hidden_layer_sizes=(40, 20),
        alpha=args.alpha[0],
        epochs=args.epochs,
        batch_size=args.batch_size,
        validation_fraction=args.validation_fraction,
        random_state=seed,
    )
    start = time.perf_counter()
    path = clf.path(x_train, y_train, path_multiplier=args.multiplier, epochs_per_alpha=args.epochs_per_alpha)
    wall = time.perf_counter() - start
    point = path.best(tolerance=0.01)
    path_quality = quality(point.selected_features)
    path_quality.update(
        alpha=point.alpha, val=point.score, test=path.estimator(point).score(x_test, y_test), wall_s=wall
    )
    importance = path.feature_importances_
    top = np.argsort(-importance, kind="stable")[: len(relevant)]
    ranking = quality(top)

    prox = GroupSparseMLPClassifier(
        hidden_layer_sizes=(40, 20),
        alpha=args.proximal_alpha,
        epochs=args.epochs,
        batch_size=args.batch_size,
        proximal=True,
        random_state=seed,
    ).fit(x_train, y_train)
    prox_quality = quality(np.flatnonzero(prox.support_))
    prox_quality.update(test=prox.score(x_test, y_test))
    common.say(
        f"synthetic seed {seed}: path point {path_quality['n_selected']} feat. precision "
        f"{path_quality['precision']:.2f} recall(inf.) {path_quality['recall_informative']:.2f} "
        f"recall(inf.+red.) {path_quality['recall_relevant']:.2f}; proximal fit {prox_quality['n_selected']} feat. "
        f"precision {prox_quality['precision']:.2f} recall(inf.+red.) {prox_quality['recall_relevant']:.2f}"
    )
    return {"seed": seed, "path": path_quality, "ranking": ranking, "proximal_fit": prox_quality}


def _digits_tables(args, digits):
    lines = [
        "## DIGITS (64 features)",
        "",
        "Per budget K: the path point with the best validation accuracy among those with at most K features, "
        "evaluated once on the 450 test images (mean ± std over seeds). \"Penalized\" is the best validation "
        "accuracy of the same path's selection-step models (before the refit), for comparison.",
        "",
    ]
    for alpha in args.alpha:
        runs = [r for r in digits if r["alpha"] == alpha]
        rows = []
        for budget in BUDGETS:
            rows.append(
                [
                    str(budget),
                    common.mean_std([r["budgets"][budget]["features"] for r in runs], digits=1),
                    common.mean_std([r["budgets"][budget]["test"] for r in runs], digits=3),
                    common.mean_std([r["budgets"][budget]["val"] for r in runs], digits=3),
                    common.mean_std([r["budgets"][budget]["penalized_val"] for r in runs], digits=3),
                ]
            )
        walls = [r["wall_s"] for r in runs]
        header_row = ["≤ K features", "features used", "test accuracy", "validation accuracy", "penalized val. acc."]
        lines += [f"### alpha = {alpha:g}", ""] + common.markdown_table(header_row, rows).splitlines()
        lines += [
            "",
            f"Path wall time: {common.mean_std(walls, digits=1)} s per path "
            f"({', '.join(f'{w:.1f}' for w in walls)} s; {', '.join(str(r['points']) for r in runs)} points), "
            "measured around `clf.path(...)` while other jobs shared the machine; it includes compiling the "
            "training step (once per path).",
            "",
            "Per seed, test accuracy (features used):",
            "",
            "| seed | " + " | ".join(f"≤{b}" for b in BUDGETS) + " |",
            "|" + "---|" * (len(BUDGETS) + 1),
        ]
        for r in runs:
            cells = [f"{r['budgets'][b]['test']:.3f} ({r['budgets'][b]['features']})" for b in BUDGETS]
            lines.append(f"| {r['seed']} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += [
        "Reference (from the issue, LassoNet on this machine, hidden 40/20, default path): 0.931 test accuracy "
        "with ≤ 30 features, 0.882 with ≤ 20, about 55 s for its path.",
        "",
    ]
    return lines


def _mean_std_defined(values, digits):
    """``common.mean_std`` over the defined (non-NaN) values, saying how many were undefined."""
    import math

    defined = [v for v in values if not math.isnan(v)]
    if not defined:
        return "n/a"
    text = common.mean_std(defined, digits=digits)
    missing = len(values) - len(defined)
    return text + (f" ({missing} seed(s) selected nothing)" if missing else "")


def _synthetic_table(args, synthetic):
    lines = [
        "## Synthetic selection problem",
        "",
        f"`make_classification(n_samples={args.synthetic_samples}, n_features=30, n_informative=5, "
        "n_redundant=5, n_classes=3, n_clusters_per_class=1, class_sep=1.0, shuffle=False)`: columns 0-4 "
        "informative, 5-9 redundant (linear combinations of 0-4), 10-29 noise; 75/25 split, min-max scaled; "
        f"path with alpha={args.alpha[0]:g}. Precision = selected columns that are informative or redundant / "
        "selected; recall against the 5 informative and against all 10 relevant columns.",
        "",
    ]
    rows = []
    for key, label in (
        ("path", "path point: fewest features within 0.01 of the best validation accuracy"),
        ("ranking", "path ranking: the 10 largest `feature_importances_`"),
        ("proximal_fit", f"one `fit(proximal=True, alpha={args.proximal_alpha:g})`"),
    ):
        has_test = "test" in synthetic[0][key]
        rows.append(
            [
                label,
                common.mean_std([s[key]["n_selected"] for s in synthetic], digits=1),
                _mean_std_defined([s[key]["precision"] for s in synthetic], digits=2),
                common.mean_std([s[key]["recall_informative"] for s in synthetic], digits=2),
                common.mean_std([s[key]["recall_relevant"] for s in synthetic], digits=2),
                common.mean_std([s[key]["test"] for s in synthetic], digits=3) if has_test else "",
            ]
        )
    header_row = ["selection", "features", "precision", "recall (informative)", "recall (inf. + red.)", "test acc."]
    lines += common.markdown_table(header_row, rows).splitlines()
    lines += ["", "Selected columns per seed:", ""]
    for s in synthetic:
        lines.append(
            f"- seed {s['seed']}: path point {s['path']['selected']}; ranking {s['ranking']['selected']}; "
            f"proximal fit {s['proximal_fit']['selected']}"
        )
    return lines + [""]


NAME = "sklearn_path"
QUICK = "1 seed, 40 epochs, results to benchmarks/out/"


def main(argv=None):
    parser = common.arguments(__doc__, seeds=3, quick=QUICK)
    parser.add_argument("--epochs", type=int, default=200, help="passes of the first (dense) fit")
    parser.add_argument("--epochs-per-alpha", type=int, default=None, help="passes per point (default epochs // 4)")
    parser.add_argument("--multiplier", type=float, default=1.2, help="path_multiplier")
    parser.add_argument(
        "--alpha",
        type=float,
        nargs="+",
        default=[1e-4, 1e-3],
        help="estimator alpha (hidden groups and biases; the path varies the input groups): one DIGITS table "
        "each; the synthetic problem uses the first",
    )
    parser.add_argument("--proximal-alpha", type=float, default=3e-3, help="alpha of the proximal single fit")
    parser.add_argument("--batch-size", type=int, default=200)
    parser.add_argument("--validation-fraction", type=float, default=0.2)
    parser.add_argument("--synthetic-samples", type=int, default=2000)
    parser.add_argument("--skip-synthetic", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.epochs, args.synthetic_samples = 40, 600

    run = common.Run(NAME, args)
    digits = [digits_run(seed, args, alpha) for alpha in args.alpha for seed in run.seeds]
    synthetic = [] if args.skip_synthetic else [synthetic_run(seed, args) for seed in run.seeds]
    timing = fit_timing(args)

    notes = [
        f"`GroupSparseMLPClassifier(hidden_layer_sizes=(40, 20), alpha=..., epochs={args.epochs}, "
        f"batch_size={args.batch_size}, validation_fraction={args.validation_fraction}, random_state=seed)` "
        "(SGL, Adam lr 1e-3, threshold 1e-3), "
        f"`path(path_multiplier={args.multiplier}, epochs_per_alpha={args.epochs_per_alpha or max(1, args.epochs // 4)})`: "
        "automatic grid from a dense fit until no feature is left. The path varies the strength of the input "
        "groups; `alpha` stays on the hidden groups and biases (and is the penalty of each point's refit).",
    ]
    lines = _digits_tables(args, digits)
    seconds = ", ".join("%.1f" % f["seconds"] for f in timing["fits"])
    accuracies = ", ".join("%.3f" % f["test"] for f in timing["fits"])
    lines += [
        "### One `fit` on DIGITS",
        "",
        f"`GroupSparseMLPClassifier(epochs={args.epochs}, batch_size={args.batch_size}, random_state=r).fit(...)` on the "
        f"1,347 training images, r = 0, 1, 2: {seconds} s (the first fit "
        "compiles the training step, the next ones reuse it), test accuracy "
        f"{accuracies}. The same network and penalties trained the usual way, "
        f"`model.fit(x, y, epochs={args.epochs}, batch_size={args.batch_size})`: {timing['plain_keras_s']:.1f} s "
        "(including compiling its step once).",
        "",
    ]
    try:
        plt = common.pyplot()
        fig, ax = plt.subplots(figsize=(6, 4))
        for r in digits:
            r["path"].plot(ax=ax, label=f"alpha {r['alpha']:g}, seed {r['seed']}", markersize=2, linewidth=1)
        ax.set_title("DIGITS: validation accuracy along the path")
        ax.legend(fontsize=7)
        figure = run.path("_digits.png")
        figure.parent.mkdir(parents=True, exist_ok=True)
        fig.tight_layout()
        fig.savefig(figure, dpi=120)
        lines += [f"![DIGITS path]({figure.name})", ""]
    except ImportError as error:  # a missing matplotlib must not lose the numbers
        common.say(f"no figure: {error!r}")
    if synthetic:
        lines += _synthetic_table(args, synthetic)

    paths = [
        {
            "alpha": r["alpha"],
            "seed": r["seed"],
            "points": [
                {"alpha": p.alpha, "score": p.score, "penalized_score": p.penalized_score, "features": p.n_features}
                for p in r["path"]
            ],
        }
        for r in digits
    ]
    records = [{k: v for k, v in r.items() if k not in ("path", "data")} for r in digits]
    run.publish("scikit-learn estimator: the regularization path", "\n".join(lines), records, notes=notes,
                section=False, digits_paths=paths, synthetic=synthetic, fit_timing=timing)
    return 0


if __name__ == "__main__":
    sys.exit(main())
