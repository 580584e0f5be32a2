"""The cross-validated classifier with its default arguments: does it find the informative columns?

``make_classification(n_samples=600, n_features=50, n_informative=12,
n_redundant=0, shuffle=False, random_state=seed)``: columns 0-11 are
informative, 12-49 are noise. Per seed: a stratified 75/25 split, standard
scaling fitted on the training part, then
``GroupSparseMLPClassifierCV(random_state=seed).fit`` with every other
argument at its default. Reported per seed: the selected columns, precision
(selected columns that are informative / selected), recall (informative
columns selected / 12), the chosen strength, test accuracy, and the wall time
of ``fit`` (the all-data path plus one path per fold).

Usage:
    python benchmarks/sklearn_cv.py --seeds 3
    python benchmarks/sklearn_cv.py --seeds 5 --set scoring=neg_log_loss --out-name sklearn_cv_log_loss
    python benchmarks/sklearn_cv.py --quick     # 1 seed, 200 samples; writes to benchmarks/out/
    python benchmarks/sklearn_cv.py --seeds 8 --samples 1500 --scaler minmax --out-name sklearn_cv_1500_minmax
"""

import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import common  # noqa: E402

N_FEATURES, N_INFORMATIVE = 50, 12
PRECISION, RECALL = 0.8, 0.9  # the target: every seed's selection at least this precise and complete


def run_seed(seed, args):
    import numpy as np
    from sklearn.datasets import make_classification
    from sklearn.model_selection import train_test_split
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.preprocessing import MinMaxScaler, StandardScaler

    from keras_group_lasso.sklearn import GroupSparseMLPClassifierCV

    x, y = make_classification(
        n_samples=args.samples,
        n_features=N_FEATURES,
        n_informative=N_INFORMATIVE,
        n_redundant=0,
        shuffle=False,
        random_state=seed,
    )
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=seed, stratify=y)
    scaler = (MinMaxScaler() if args.scaler == "minmax" else StandardScaler()).fit(x_train)
    x_train, x_test = scaler.transform(x_train), scaler.transform(x_test)

    clf = GroupSparseMLPClassifierCV(random_state=seed, **args.params)
    start = time.perf_counter()
    clf.fit(x_train, y_train)
    wall = time.perf_counter() - start

    selected = [int(j) for j in clf.get_support(indices=True)]
    hits = sum(j < N_INFORMATIVE for j in selected)
    means = clf.scores_path_.mean(axis=1)
    # What any rule choosing a point of this path could reach: the recovery of every point,
    # and where the informative columns rank by the strength at which they leave the path.
    recovery = []
    for point in clf.path_:
        found = sum(j < N_INFORMATIVE for j in point.selected_features)
        n = point.n_features
        recovery.append((n, found / n if n else float("nan"), found / N_INFORMATIVE))
    meets = [r for r in recovery if r[1] >= PRECISION and r[2] >= RECALL]
    closest = max(recovery, key=lambda r: (min(r[1] / PRECISION, r[2] / RECALL) if r[0] else 0.0, -r[0]))
    order = np.argsort(-clf.path_.feature_importances_, kind="stable")
    ranks = sorted(int(np.flatnonzero(order == j)[0]) + 1 for j in range(N_INFORMATIVE))
    # How hard the seed is, by a reference that does not share the network's biases: the ranks of the informative
    # columns by a random forest's impurity importances on the same training part.
    forest = RandomForestClassifier(n_estimators=500, random_state=seed).fit(x_train, y_train)
    order = np.argsort(-forest.feature_importances_, kind="stable")
    forest_ranks = sorted(int(np.flatnonzero(order == j)[0]) + 1 for j in range(N_INFORMATIVE))
    result = {
        "seed": seed,
        "selected": selected,
        "n_selected": len(selected),
        "precision": hits / len(selected) if selected else float("nan"),
        "recall": hits / N_INFORMATIVE,
        "alpha": float(clf.alpha_),
        "cv_score": float(means[clf.best_index_]),
        "best_cv_score": float(means.max()),
        "test": float(clf.score(x_test, y_test)),
        "points": len(clf.alphas_),
        "wall_s": wall,
        "curve": [[int(n), float(m)] for n, m in zip(clf.n_features_path_, means)],
        "points_meeting_target": len(meets),
        "closest_point": list(closest),
        "informative_exit_ranks": ranks,
        "forest_ranks": forest_ranks,
        # Enough to compare rules for the point offline, without training again.
        "alphas": [float(a) for a in clf.alphas_],
        "fold_scores": clf.scores_path_.tolist(),
        "point_selections": [[int(j) for j in point.selected_features] for point in clf.path_],
        "exit_strengths": [float(v) for v in clf.path_.feature_importances_],
    }
    common.say(
        f"seed {seed}: {len(selected)} features, precision {result['precision']:.2f}, recall {result['recall']:.2f}, "
        f"test accuracy {result['test']:.3f}, alpha {clf.alpha_:.4g} ({len(clf.alphas_)} points), {wall:.0f} s"
    )
    return result


def _parse_setting(item):
    import ast

    name, sep, text = item.partition("=")
    if not sep or not name:
        raise SystemExit(f"sklearn_cv.py: --set takes NAME=VALUE; received {item!r}")
    try:
        return name, ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return name, text


NAME = "sklearn_cv"
QUICK = "1 seed, 200 samples, results to benchmarks/out/"


def main(argv=None):
    parser = common.arguments(__doc__, seeds=3, quick=QUICK)
    parser.add_argument("--samples", type=common.positive_int, default=600)
    parser.add_argument("--scaler", choices=("standard", "minmax"), default="standard",
                        help="scaling fitted on the training part (default standard)")
    parser.add_argument(
        "--set",
        metavar="NAME=VALUE",
        nargs="+",
        default=[],
        help="estimator arguments other than the defaults (a Python literal or a string), e.g. scoring=neg_log_loss",
    )
    args = parser.parse_args(argv)
    args.params = dict(_parse_setting(item) for item in args.set)
    if args.quick:
        args.samples = 200

    from keras_group_lasso.sklearn import GroupSparseMLPClassifierCV

    run = common.Run(NAME, args)
    runs = [run_seed(seed, args) for seed in run.seeds]
    defaults = GroupSparseMLPClassifierCV(**args.params).get_params()

    rows = [
        [
            str(r["seed"]),
            str(r["n_selected"]),
            f"{r['precision']:.2f}",
            f"{r['recall']:.2f}",
            f"{r['alpha']:.4g}",
            f"{r['cv_score']:.3f} ({r['best_cv_score']:.3f})",
            f"{r['test']:.3f}",
            f"{r['points']}",
            f"{r['points_meeting_target']} ({r['closest_point'][0]}: {r['closest_point'][1]:.2f} / "
            f"{r['closest_point'][2]:.2f})",
            f"{r['wall_s']:.0f}",
        ]
        for r in runs
    ]
    rows.append(
        [
            "mean ± std",
            common.mean_std([r["n_selected"] for r in runs], digits=1),
            common.mean_std([r["precision"] for r in runs], digits=2),
            common.mean_std([r["recall"] for r in runs], digits=2),
            "",
            "",
            common.mean_std([r["test"] for r in runs], digits=3),
            "",
            f"{sum(r['points_meeting_target'] > 0 for r in runs)} of {len(runs)} seeds",
            common.mean_std([r["wall_s"] for r in runs], digits=0),
        ]
    )
    header_row = [
        "seed",
        "features kept",
        "precision",
        "recall",
        "alpha_",
        "CV score (best on the path)",
        "test accuracy",
        "points",
        "points meeting the target (closest: features: precision / recall)",
        "fit wall time (s)",
    ]
    shown = ", ".join(f"{k}={v!r}" for k, v in defaults.items() if k != "random_state")
    lines = [
        f"`make_classification(n_samples={args.samples}, n_features={N_FEATURES}, n_informative={N_INFORMATIVE}, "
        "n_redundant=0, shuffle=False, random_state=seed)`: columns 0-11 informative, 12-49 noise. Stratified "
        f"75/25 split, `{'MinMaxScaler' if args.scaler == 'minmax' else 'StandardScaler'}` fitted on the training part, then "
        f"`GroupSparseMLPClassifierCV(random_state=seed{''.join(', ' + k + '=' + repr(v) for k, v in args.params.items())})"
        ".fit(x_train, y_train)`, all arguments "
        f"({shown}). Precision = informative selected / selected; recall = informative selected / 12. "
        "The CV score is the mean held-out score (accuracy unless `scoring` is set) of the folds at the chosen point (in brackets: the best "
        "on the path; the one-standard-error rule may pick fewer features with a lower mean). The wall time "
        "is measured around `fit` (the all-data path plus one path per fold, compiling included) while other "
        "jobs shared the machine.",
        "",
        f"The target is precision >= {PRECISION} and recall >= {RECALL} on every seed. \"Points meeting the "
        "target\" counts the points of the all-data path (`path_`) whose selection meets it, whatever rule "
        "chooses among them; the closest point is the one nearest to meeting both (the smallest of precision / "
        f"{PRECISION} and recall / {RECALL} is largest). A seed with no such point cannot meet the target by a "
        "better choice of point, only by a better path.",
        "",
        common.markdown_table(header_row, rows),
        "",
        "Selected columns per seed:",
        "",
    ]
    lines += [f"- seed {r['seed']}: {r['selected']}" for r in runs]
    lines += [
        "",
        "Ranks of the 12 informative columns among the 50 by the strength at which they leave the all-data path "
        "(`path_.feature_importances_`, 1 = leaves last; a perfect ranking is 1-12):",
        "",
    ]
    lines += [f"- seed {r['seed']}: {r['informative_exit_ranks']}" for r in runs]
    lines += [
        "",
        "For reference, the ranks of the informative columns by the impurity importances of a random forest "
        "(`RandomForestClassifier(n_estimators=500, random_state=seed)`) fitted on the same training part: how "
        "far the data itself sets the weakest informative columns apart from the noise.",
        "",
    ]
    lines += [f"- seed {r['seed']}: {r['forest_ranks']}" for r in runs]
    title = ("Cross-validated classifier: recovering the informative columns"
             + (" with the default arguments" if not args.params else f" ({', '.join(args.set)})"))
    run.publish(title, "\n".join(lines), runs, section=False, defaults={k: repr(v) for k, v in defaults.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
