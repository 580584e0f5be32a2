"""A tabular model with several inputs: do the budget and the path drop the noise inputs whole?

Synthetic data, one draw per seed (``numpy.random.default_rng(seed)``):
20 numeric columns, each ``mean + scale * z`` with ``z ~ N(0, 1)`` and a
per-column mean in [-5, 5] and scale in [0.5, 10]; 6 categorical columns,
uniform over vocabularies of 8, 12, 5, 10, 15 and 20 categories. Six numeric
columns (num0-num5) and two categorical ones (cat0, cat1) are informative:

    f = z0 * z1 + 1.5 sin(1.5 z2) + 0.7 (z3^2 - 1) + 0.8 z4 + tanh(2 z5) + e0[cat0] + e1[cat1]

with category effects ``e0, e1 ~ N(0, 1)``; the binary target is
``f + N(0, 0.5^2) > median(f)`` with 5 % of the labels then flipped. The
other 14 numeric and 4 categorical columns are independent noise. 20,000
training rows (the last 4,000 of them are the validation rows of the path),
5,000 test rows.

Model (Keras functional, 7 inputs): ``numeric`` (20 floats) through a
``Normalization`` adapted on the training rows; one int32 input of shape (1,)
per categorical column through ``Embedding(vocab, 4)`` and ``Reshape((4,))``;
all concatenated (44 values), then Dense(64, relu), Dense(32, relu),
Dense(2, softmax). Batch 256, Adam (learning rate 1e-3), ``--epochs`` epochs.
Features in the sense of ``sparsity_report``: the 20 numeric columns and the 6
categorical inputs (a categorical input is one feature; it goes when every
dimension of its Embedding goes), 26 in all, 8 informative.

Methods, each on the same data and initial weights per seed:

* dense: the model with plain Adam (no penalty);
* budget, Proximal: ``add_group_sparsity(model, 1e-4)`` (sparse group Lasso),
  ``Proximal(Adam)`` and ``SparsityBudget(max_features=8)``: as many features
  as there are informative ones, so a kept noise column means a dropped
  informative one;
* budget, Adam: the same with plain Adam (subgradient training, weights with
  ``|w| <= 1e-3`` count as zero);
* path, Proximal: ``add_group_sparsity(model, lam)`` and ``Proximal(Adam)``
  for each ``lam`` of ``--lams`` (no budget), each trained from the same
  initial weights on the first 16,000 training rows; the row "path
  (validation)" is the sparsest point whose validation accuracy is within 0.5
  points of the best one, refitted on all 20,000 rows. Nothing in the choice
  knows how many columns are informative.

For each run: test accuracy; the kept numeric columns and categorical inputs
(``sparsity_report(model, 1e-3).inputs``); precision and recall of the kept
columns against the informative ones (numeric columns, categorical inputs,
and all 26 features together); the parameters of
``prune_model(model, 1e-3, inputs="selected")`` (``count_params``, Embedding
tables and Normalization statistics included) against the dense model's; and
the largest absolute difference between the pruned model's outputs (fed the
kept inputs, numeric columns sliced to the selected ones) and those of the
thresholded model (``apply_threshold`` on a copy, fed every input) on the
5,000 test rows, and against the unthresholded model too.

Usage:
    KERAS_BACKEND=jax python benchmarks/tabular.py --out
    python benchmarks/tabular.py --quick      # 1 seed, few epochs, 5,000 rows; to benchmarks/out/
    python benchmarks/tabular.py --render benchmarks/results/tabular.json   # only rewrite tabular.md
"""

import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import common  # noqa: E402

N_NUMERIC = 20
INFORMATIVE_NUMERIC = (0, 1, 2, 3, 4, 5)
VOCABULARIES = (8, 12, 5, 10, 15, 20)
INFORMATIVE_CATEGORICAL = (0, 1)
EMBEDDING_DIM = 4
HIDDEN = (64, 32)
BATCH = 256
THRESHOLD = 1e-3
BUDGET_FACTOR = 1e-4
LAMS = (1e-4, 2e-4, 3e-4, 5e-4, 7e-4, 1e-3)
VALIDATION_ROWS = 4000
TOLERANCE = 0.005  # the path's choice: the sparsest point within 0.5 points of the best validation accuracy


def make_data(seed, n_train, n_test):
    """Numeric and categorical columns, informative and noise; a binary target with label noise."""
    rng = np.random.default_rng(seed)
    n = n_train + n_test
    z = rng.normal(size=(n, N_NUMERIC))
    mean = rng.uniform(-5, 5, N_NUMERIC)
    scale = rng.uniform(0.5, 10, N_NUMERIC)
    numeric = (mean + scale * z).astype("float32")
    categorical = [rng.integers(0, size, n).astype("int32") for size in VOCABULARIES]
    effects = [rng.normal(size=VOCABULARIES[i]) for i in INFORMATIVE_CATEGORICAL]
    f = (z[:, 0] * z[:, 1] + 1.5 * np.sin(1.5 * z[:, 2]) + 0.7 * (z[:, 3] ** 2 - 1) + 0.8 * z[:, 4]
         + np.tanh(2 * z[:, 5]))
    for effect, i in zip(effects, INFORMATIVE_CATEGORICAL):
        f = f + effect[categorical[i]]
    f = f + rng.normal(scale=0.5, size=n)
    y = (f > np.median(f)).astype("int32")
    flip = rng.random(n) < 0.05
    y[flip] = 1 - y[flip]
    xs = [numeric] + [c[:, None] for c in categorical]
    train = [x[:n_train] for x in xs], y[:n_train]
    test = [x[n_train:] for x in xs], y[n_train:]
    return train, test


def build_model(seed, numeric_train):
    """Normalization + one Embedding per categorical column, concatenated, Dense(64)-Dense(32)-Dense(2)."""
    import keras

    L = keras.layers
    keras.utils.set_random_seed(seed)
    numeric = keras.Input((N_NUMERIC,), name="numeric")
    columns = [keras.Input((1,), dtype="int32", name=f"cat{i}") for i in range(len(VOCABULARIES))]
    norm = L.Normalization(name="scale")
    norm.adapt(numeric_train)
    parts = [norm(numeric)]
    for i, (column, size) in enumerate(zip(columns, VOCABULARIES)):
        embedded = L.Embedding(size, EMBEDDING_DIM, name=f"emb{i}")(column)
        parts.append(L.Reshape((EMBEDDING_DIM,), name=f"flat{i}")(embedded))
    x = L.Concatenate(name="columns")(parts)
    for j, width in enumerate(HIDDEN):
        x = L.Dense(width, activation="relu", name=f"h{j}")(x)
    return keras.Model([numeric] + columns, L.Dense(2, activation="softmax", name="out")(x))


def _fit(model, optimizer, xs, y, epochs, seed, callbacks=()):
    import keras

    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
    keras.utils.set_random_seed(seed)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        start = time.perf_counter()
        history = model.fit(xs, y, epochs=epochs, batch_size=BATCH, verbose=0, callbacks=list(callbacks))
        wall = time.perf_counter() - start
    return history, wall, [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]


def _scores(kept, informative, total):
    """Precision and recall of a kept set against the informative set (precision of nothing kept: nan)."""
    kept, informative = set(kept), set(informative)
    hit = len(kept & informative)
    return {
        "kept": len(kept),
        "precision": hit / len(kept) if kept else float("nan"),
        "recall": hit / len(informative),
        "noise_kept": len(kept - informative),
        "total": total,
    }


def evaluate(model, dense_params, test):
    """Accuracy, kept inputs, precision/recall, pruned parameters and the surgery's exactness on the test rows."""
    from keras_group_lasso import apply_threshold, prune_model, sparsity_report

    xs, y = test
    out = model.predict(xs, batch_size=4096, verbose=0)
    report = sparsity_report(model, THRESHOLD)
    by_name = {found.name: found for found in report.inputs}
    numeric = list(by_name["numeric"].selected_features)
    categorical = [i for i in range(len(VOCABULARIES)) if by_name[f"cat{i}"].kept]
    informative_all = list(INFORMATIVE_NUMERIC) + [N_NUMERIC + i for i in INFORMATIVE_CATEGORICAL]
    record = {
        "test": float(np.mean(np.argmax(out, axis=1) == y)),
        "kept_numeric": numeric,
        "kept_categorical": categorical,
        "features": report.n_selected_features,
        "layer_sizes": list(report.layer_sizes),
        "numeric": _scores(numeric, INFORMATIVE_NUMERIC, N_NUMERIC),
        "categorical": _scores(categorical, INFORMATIVE_CATEGORICAL, len(VOCABULARIES)),
        "all": _scores(numeric + [N_NUMERIC + i for i in categorical], informative_all, N_NUMERIC + len(VOCABULARIES)),
        "dense_params": dense_params,
    }
    start = time.perf_counter()
    small = prune_model(model, THRESHOLD, inputs="selected")
    surgery_s = time.perf_counter() - start
    feed = []
    for found, x in zip(report.inputs, xs):
        if found.kept:
            feed.append(x[:, list(found.selected_features)] if found.name == "numeric" else x)
    pruned = small.predict(feed if len(feed) > 1 else feed[0], batch_size=4096, verbose=0)
    # The model is not used after this: threshold it in place (a clone_model + set_weights copy would not do:
    # Keras's Normalization keeps the statistics it computes from its variables when it is built or adapted).
    apply_threshold(model, THRESHOLD)
    thresholded = model.predict(xs, batch_size=4096, verbose=0)
    record.update({
        "kept_inputs": list(small.kept_inputs),
        "pruned_params": int(small.count_params()),
        "test_pruned": float(np.mean(np.argmax(pruned, axis=1) == y)),
        "gap_thresholded": float(np.max(np.abs(pruned - thresholded))),
        "gap_model": float(np.max(np.abs(pruned - out))),
        "surgery_s": surgery_s,
    })
    return record


def _describe(record):
    return (f"test {record['test']:.4f} (pruned {record['test_pruned']:.4f}), numeric {record['kept_numeric']}, "
            f"categorical {record['kept_categorical']}, P/R all {record['all']['precision']:.2f}/"
            f"{record['all']['recall']:.2f}, params {record['dense_params']:,} -> {record['pruned_params']:,}, "
            f"gap {record['gap_thresholded']:.1e} (vs model {record['gap_model']:.1e})")


def run_seed(seed, args):
    import keras

    from keras_group_lasso import Proximal, SparsityBudget, add_group_sparsity

    train, test = make_data(seed, args.n_train, args.n_test)
    xs, y = train
    rows = []

    def base():
        return build_model(seed, xs[0])

    dense_model = base()
    dense_params = int(dense_model.count_params())
    history, wall, _ = _fit(dense_model, keras.optimizers.Adam(1e-3), xs, y, args.epochs, seed)
    record = dict(method="dense", seed=seed, wall_s=wall, **evaluate(dense_model, dense_params, test))
    common.say(f"seed {seed} dense: {_describe(record)}, {wall:.1f} s")
    rows.append(record)

    budget_k = len(INFORMATIVE_NUMERIC) + len(INFORMATIVE_CATEGORICAL)
    for name in ("Proximal", "Adam"):
        model = add_group_sparsity(base(), BUDGET_FACTOR)
        optimizer = keras.optimizers.Adam(1e-3)
        if name == "Proximal":
            optimizer = Proximal(optimizer)
        budget = SparsityBudget(max_features=budget_k, threshold=THRESHOLD)
        history, wall, caught = _fit(model, optimizer, xs, y, args.epochs, seed, [budget])
        log = {k: [float(v) for v in history.history[k]] for k in history.history if k.startswith("budget_")}
        record = dict(method=f"budget, {name}", seed=seed, wall_s=wall, budget=budget_k,
                      cut_groups=int(sum(log.get("budget_cut", [0]))), cut_warnings=caught,
                      features_per_epoch=log.get("budget_features"),
                      multiplier_per_epoch=log.get("budget_multiplier_input"),
                      **evaluate(model, dense_params, test))
        common.say(f"seed {seed} budget {name} (K={budget_k}): {_describe(record)}, cut {record['cut_groups']}, "
                   f"{wall:.1f} s")
        rows.append(record)

    # The path: one fit per lambda on the first rows, validation accuracy on the last ones.
    fit_rows = args.n_train - args.validation_rows
    fit_xs, fit_y = [x[:fit_rows] for x in xs], y[:fit_rows]
    val_xs, val_y = [x[fit_rows:] for x in xs], y[fit_rows:]
    points = []
    for lam in args.lams:
        model = add_group_sparsity(base(), lam)
        history, wall, _ = _fit(model, Proximal(keras.optimizers.Adam(1e-3)), fit_xs, fit_y, args.epochs, seed)
        val = common.accuracy(model, val_xs, val_y)
        record = dict(method=f"path, lambda {lam:g}", seed=seed, lam=lam, wall_s=wall, validation=val,
                      **evaluate(model, dense_params, test))
        common.say(f"seed {seed} path lambda {lam:g}: validation {val:.4f}, {_describe(record)}, {wall:.1f} s")
        points.append(record)
    rows += points
    best = max(p["validation"] for p in points)
    chosen = min((p for p in points if p["validation"] >= best - TOLERANCE), key=lambda p: (p["features"], -p["lam"]))
    model = add_group_sparsity(base(), chosen["lam"])
    history, wall, _ = _fit(model, Proximal(keras.optimizers.Adam(1e-3)), xs, y, args.epochs, seed)
    record = dict(method="path (validation)", seed=seed, lam=chosen["lam"], wall_s=wall,
                  **evaluate(model, dense_params, test))
    common.say(f"seed {seed} path (validation, lambda {chosen['lam']:g}, refit): {_describe(record)}, {wall:.1f} s")
    rows.append(record)
    return rows


ORDER = ["dense", "budget, Proximal", "budget, Adam"]


def _method_order(rows):
    names = []
    for row in rows:
        if row["method"] not in names:
            names.append(row["method"])
    return sorted(names, key=lambda m: (ORDER.index(m) if m in ORDER else len(ORDER), m.startswith("path (") , m))


def _mean(values, digits=2, scale=1.0):
    values = [v for v in values if v == v]  # nan: nothing kept
    return common.mean_std(values, digits, scale) if values else "–"


def table(rows):
    """One line per method: means ± std over the seeds."""
    body = []
    for method in _method_order(rows):
        runs = [r for r in rows if r["method"] == method]
        body.append([
            method,
            _mean([r["test"] for r in runs], 2, 100),
            _mean([r["numeric"]["kept"] for r in runs], 1) + " / " + _mean([r["categorical"]["kept"] for r in runs], 1),
            _mean([r["numeric"]["precision"] for r in runs]) + " / " + _mean([r["numeric"]["recall"] for r in runs]),
            _mean([r["categorical"]["precision"] for r in runs]) + " / "
            + _mean([r["categorical"]["recall"] for r in runs]),
            _mean([r["all"]["precision"] for r in runs]) + " / " + _mean([r["all"]["recall"] for r in runs]),
            _mean([r["pruned_params"] for r in runs], 0) + f" / {runs[0]['dense_params']:,}",
            f"{max(r['gap_thresholded'] for r in runs):.1e} ({max(r['gap_model'] for r in runs):.1e})",
        ])
    return common.markdown_table(
        ["method", "test accuracy [%]", "kept numeric / categorical", "numeric P / R", "categorical P / R",
         "all 26 P / R", "params pruned / dense", "surgery max diff (vs unthresholded)"], body)


def per_seed(rows):
    """Which columns every run kept (noise columns in bold)."""
    body = []
    for row in rows:
        numeric = ", ".join(f"{i}" if i in INFORMATIVE_NUMERIC else f"**{i}**" for i in row["kept_numeric"])
        categorical = ", ".join(f"{i}" if i in INFORMATIVE_CATEGORICAL else f"**{i}**" for i in row["kept_categorical"])
        body.append([str(row["seed"]), row["method"], f"{100 * row['test']:.2f}", numeric or "–", categorical or "–",
                     f"{row['pruned_params']:,}", f"{row['gap_thresholded']:.1e}"])
    return common.markdown_table(
        ["seed", "method", "test [%]", "kept numeric columns", "kept categorical inputs", "params pruned",
         "surgery max diff"], body)


NAME = "tabular"
TITLE = "Tabular model with several inputs: which inputs the budget and the path keep"
QUICK = "1 seed, 5 epochs, 5,000 training rows; results to benchmarks/out/"


def notes(args):
    """The header's line on the data and the training (``args``: the run's arguments, as a dict)."""
    return [f"{args['n_train']:,} training rows, {args['n_test']:,} test rows, {args['epochs']} epochs, batch {BATCH}"]


def body(rows):
    """Everything below the header: the table over seeds, the budget's features, the columns of every run."""
    lines = [
        f"Informative: numeric columns {list(INFORMATIVE_NUMERIC)} of {N_NUMERIC}, categorical inputs "
        f"{list(INFORMATIVE_CATEGORICAL)} of {len(VOCABULARIES)} (vocabularies {list(VOCABULARIES)}). "
        "P / R: precision and recall of the kept columns against the informative ones (mean ± std over the seeds). "
        "Surgery: largest absolute difference of `prune_model(model, 1e-3, inputs=\"selected\")`, fed the kept "
        "inputs, against the thresholded model on the test rows (in brackets: against the model itself).",
        "",
        table(rows),
        "",
    ]
    budget_rows = [r for r in rows if r["method"].startswith("budget")]
    if budget_rows:
        lines += [
            f"Budget (`max_features={budget_rows[0]['budget']}`): features at the end of `fit`, per run: "
            + ", ".join(f"seed {r['seed']} {r['method'][len('budget, '):]} {r['features']}" for r in budget_rows)
            + ".",
            "",
        ]
        warned = sorted({w for r in budget_rows for w in r["cut_warnings"]})
        lines += [f"Warning from `fit`: {w}" for w in warned[:1]] + ([""] if warned else [])
    lines += [
        "Per run (noise columns in bold):",
        "",
        per_seed(rows),
        "",
    ]
    return "\n".join(lines)


def render(payload):
    """The Markdown of a JSON result, its header from the command, date and machine that made it."""
    info = payload["machine"]
    rows = payload["records"] if "records" in payload else payload["rows"]  # "rows", "elapsed_s": before common.Run
    wall = payload["wall_seconds"] if "wall_seconds" in payload else payload["elapsed_s"]
    lines = [
        f"# {TITLE}",
        "",
        f"- Command: `{payload['command']}`",
        f"- Date: {payload['date']}; wall time {wall / 60:.1f} min",
        f"- Machine: {info['cores']} cores, {info['cpu']}, {info['os']} (shared with other jobs while it ran)",
        f"- Backend: {info['backend']}; {info['versions']}",
        f"- Seeds: {', '.join(str(s) for s in dict.fromkeys(r['seed'] for r in rows))}",
    ]
    lines += [f"- {note}" for note in notes(payload["args"])]
    return "\n".join(lines) + "\n\n" + body(rows)


def main(argv=None):
    parser = common.arguments(__doc__, seeds=3, quick=QUICK)
    parser.add_argument("--epochs", type=common.positive_int, default=30)
    parser.add_argument("--n-train", type=common.positive_int, default=20000)
    parser.add_argument("--n-test", type=common.positive_int, default=5000)
    parser.add_argument("--lams", type=float, nargs="+", default=list(LAMS), help="the path's lambdas")
    parser.add_argument("--out", action="store_true",
                        help="write benchmarks/results/tabular.json and tabular.md (without it a full run only prints)")
    parser.add_argument("--render", metavar="JSON", help="only write benchmarks/results/tabular.md from this JSON")
    args = parser.parse_args(argv)
    run = common.Run(NAME, args)
    if args.render:
        md = common.write_text_atomically(run.path(".md"), render(json.loads(Path(args.render).read_text())))
        common.say(f"wrote {md}")
        return 0
    if args.quick:
        args.epochs, args.n_train, args.n_test = 5, 5000, 2000
    args.validation_rows = min(VALIDATION_ROWS, args.n_train // 5)

    rows = []
    for seed in run.seeds:
        rows += run_seed(seed, args)
    if args.out or args.quick:
        run.publish(TITLE, body(rows), rows, notes=notes(vars(args)), section=False)
    else:
        print(f"# {TITLE}\n\n{run.header(notes(vars(args)))}\n\n{body(rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
