"""The paper's Table 3 (MNIST row) and Fig. 6, on Fashion-MNIST: L2, L1, SGL (and proximal SGL).

784-400-300-100-10 ReLU MLP, softmax output, Adam (lr 1e-3), batch 400, the
penalty on every kernel and bias, lambda = 1e-4 (the paper's) plus a small
grid for SGL; after training every |w| <= 1e-3 is set to 0 and the network is
measured: training/test accuracy, training time, sparsity per layer, neurons
per layer (input included, output excluded, as in the paper), and the
parameters left after surgery as a percentage of the L2 network's.

Fashion-MNIST (Debian package ``dataset-fashion-mnist``) stands in for MNIST:
same shape, harder. Official 60,000 / 10,000 split. The paper does not say how
many epochs it trained; on 2 shared CPU cores we use 25 by default.

Writes benchmarks/results/fashion_features.png (Fig. 6), fashion_table.md,
fashion_table.json and the "fashion" section of benchmarks/RESULTS.md.

Usage:
    KERAS_BACKEND=jax python benchmarks/fashion_table.py --seeds 1
    python benchmarks/fashion_table.py --quick      # 2 epochs on 6,000 images; results go to benchmarks/out/
"""

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import common  # noqa: E402

HIDDEN = (400, 300, 100)
THRESHOLD = 1e-3
BATCH = 400
# (method, lambda): the paper's lambda = 1e-4 for every penalty, plus stronger SGL settings.
RUNS = (
    ("L2", 1e-4),
    ("L1", 1e-4),
    ("SGL", 1e-4),
    ("SGL", 3e-4),
    ("SGL", 1e-3),
    ("SGL-prox", 1e-4),
    ("SGL-prox", 3e-4),
)
FIG6 = (("L1", 1e-4), ("SGL", 1e-4), ("SGL", 3e-4), ("SGL-prox", 1e-4))
QUICK_RUNS = (("L2", 1e-4), ("SGL", 1e-4), ("SGL-prox", 1e-4))


def prune_check(model, x):
    """Surgery (if ``prune_model`` exists): seconds, parameters and max output gap vs the thresholded model."""
    try:
        from keras_group_lasso import prune_model
    except ImportError:
        return None
    import numpy as np

    start = time.perf_counter()
    small = prune_model(model, threshold=THRESHOLD, inputs="selected")
    seconds = time.perf_counter() - start
    kept = list(small.kept_features)
    gap = float(np.max(np.abs(model.predict(x, verbose=0) - small.predict(x[:, kept], verbose=0))))
    return {"surgery_seconds": seconds, "surgery_params": int(small.count_params()), "surgery_max_gap": gap}


def run_one(data, method, factor, seed, epochs):
    from keras_group_lasso import apply_threshold, sparsity_report
    from keras_group_lasso.training import fit_epochs

    model = common.make_model(method, data.n_features, data.n_classes, HIDDEN, factor, seed)
    start = time.perf_counter()
    fit_epochs(model, data.x_train, data.y_train, epochs=epochs, batch_size=BATCH, seed=seed)
    seconds = time.perf_counter() - start
    apply_threshold(model, THRESHOLD)
    report = sparsity_report(model, threshold=THRESHOLD)
    record = {
        "method": method,
        "factor": factor,
        "seed": seed,
        "epochs": epochs,
        "train_accuracy": common.accuracy(model, data.x_train, data.y_train),
        "test_accuracy": common.accuracy(model, data.x_test, data.y_test),
        "seconds": seconds,
        "layer_sparsity": [layer.sparsity for layer in report.layers],
        "sparsity": report.sparsity,
        "layer_sizes": list(report.layer_sizes),
        "features": report.n_selected_features,
        "params_before": report.params_before,
        "params_after": report.params_after,
    }
    record.update(prune_check(model, data.x_test[:2000]) or {})
    return record, model


def _mean(records, key):
    import numpy as np

    return np.mean([r[key] for r in records], axis=0)


def table(records, runs):
    """Paper layout: one column per (method, lambda), one row per measure; means over seeds."""
    l2 = [r for r in records if r["method"] == "L2"]
    l2_params = float(_mean(l2, "params_after")) if l2 else None
    columns = []
    for method, factor in runs:
        group = [r for r in records if r["method"] == method and r["factor"] == factor]
        if group:
            columns.append((f"{method} λ={factor:.0e}", group))
    rows = []

    def row(name, fn):
        rows.append([name] + [fn(g) for _, g in columns])

    row("training accuracy [%]", lambda g: common.mean_std([r["train_accuracy"] for r in g], 2, 100))
    row("test accuracy [%]", lambda g: common.mean_std([r["test_accuracy"] for r in g], 2, 100))
    row("training time [s]", lambda g: common.mean_std([r["seconds"] for r in g], 0))
    row("sparsity per layer [%]", lambda g: "[" + ", ".join(f"{100 * v:.0f}" for v in _mean(g, "layer_sparsity")) + "]")
    row("sparsity overall [%]", lambda g: f"{100 * float(_mean(g, 'sparsity')):.1f}")
    row("neurons (input included)", lambda g: "[" + ", ".join(f"{v:.0f}" for v in _mean(g, "layer_sizes")) + "]")
    row("params after surgery", lambda g: f"{float(_mean(g, 'params_after')):,.0f}")
    if l2_params:
        row("params vs L2 [%]", lambda g: f"{100 * float(_mean(g, 'params_after')) / l2_params:.1f}")
    if all("surgery_params" in r for r in records):
        row("surgery time [s]", lambda g: f"{float(_mean(g, 'surgery_seconds')):.2f}")
        row("pruned vs thresholded, max abs. output difference", lambda g: f"{max(r['surgery_max_gap'] for r in g):.1e}")
    return common.markdown_table(["measure"] + [name for name, _ in columns], rows)


def verdict(records):
    """The issue's claim: some lambda gives SGL within 1 point of L2 with <= 10 % of L2's parameters."""
    l2 = [r for r in records if r["method"] == "L2"]
    if not l2:
        return ""
    l2_acc, l2_params = float(_mean(l2, "test_accuracy")), float(_mean(l2, "params_after"))
    lines = [f"Check: SGL within 1 point of L2's test accuracy ({100 * l2_acc:.2f}%) with at most 10% of L2's parameters after surgery ({l2_params:,.0f}):", ""]
    for key in sorted({(r["method"], r["factor"]) for r in records if r["method"].startswith("SGL")}):
        g = [r for r in records if (r["method"], r["factor"]) == key]
        acc, params = float(_mean(g, "test_accuracy")), float(_mean(g, "params_after"))
        ok = l2_acc - acc <= 0.01 and params <= 0.1 * l2_params
        lines.append(
            f"- {'yes' if ok else 'no'}: {key[0]} λ={key[1]:g}: {100 * acc:.2f}% "
            f"({100 * (acc - l2_acc):+.2f} points), {100 * params / l2_params:.1f}% of L2's parameters"
        )
    return "\n".join(lines)


def _parse_run(text):
    method, _, factor = text.partition(":")
    if method not in common.METHODS or not factor:
        raise argparse.ArgumentTypeError(f"expected METHOD:LAMBDA with METHOD in {sorted(common.METHODS)}; got {text!r}")
    return method, float(factor)


def _earlier_runs(path, section):
    """Records of an earlier run and the command that made them (read from RESULTS.md's ``section``)."""
    import re

    records = json.loads(path.read_text()) if path.exists() else []
    if isinstance(records, dict):  # written by common.Run.publish (before it: the bare list of records)
        records = records["records"]
    text = common.RESULTS_MD.read_text() if common.RESULTS_MD.exists() else ""
    found = re.search(rf"<!-- BEGIN {re.escape(section)} -->.*?- Command: `([^`]*)`", text, re.S)
    return records, found.group(1) if found else None


NAME = "fashion_table"
QUICK = "smoke run: L2, SGL and proximal SGL at 1e-4, 2 epochs on 6,000 images; results go to benchmarks/out/"


def main(argv=None):
    parser = common.arguments(__doc__, seeds=1, quick=QUICK)
    parser.add_argument("--epochs", type=common.positive_int, default=None, help="training epochs (default 25, --quick 2)")
    parser.add_argument("--runs", nargs="+", type=_parse_run, default=None, metavar="METHOD:LAMBDA",
                        help="train only these, e.g. SGL:3e-5 SGL-prox:3e-5 (default: the built-in grid)")
    parser.add_argument("--append", action="store_true",
                        help="merge with the runs already in results/fashion_table.json (same settings), keep the figure")
    args = parser.parse_args(argv)

    from keras_group_lasso.datasets import load_dataset

    runs = args.runs or (QUICK_RUNS if args.quick else RUNS)
    runs = [r for r in runs if r[0] != "SGL-prox" or common.proximal_available()]
    epochs = args.epochs or (2 if args.quick else 25)

    data = load_dataset("fashion-mnist")
    if args.quick:
        data = dataclasses.replace(data, x_train=data.x_train[:6000], y_train=data.y_train[:6000])
    run = common.Run(NAME, args)
    # RESULTS.md's section "fashion" and its link to fashion_features.png; a run under another name keeps apart.
    own = run.name == NAME
    section, features = ("fashion", "fashion_features.png") if own else (run.name, f"{run.name}_features.png")
    run.file(features)  # listed in the index row
    # Every finished run is saved here, so a long run that stops early loses nothing; the
    # results themselves (JSON and figure) are written only once every run is done.
    checkpoint = run.out / f".{run.name}.partial.json"
    append = args.append and not args.quick
    if append:
        earlier, previous_command = _earlier_runs(run.path(".json"), section)
    common.say(f"Fashion-MNIST: {len(data.x_train)} training images, runs {runs}, seeds {run.seeds}, {epochs} epochs")
    records, panels = [], []
    total = len(runs) * len(run.seeds)
    for seed in run.seeds:
        for method, factor in runs:
            record, model = run_one(data, method, factor, seed, epochs)
            records.append(record)
            if seed == run.seeds[0] and (method, factor) in FIG6:
                panels.append((f"{method} λ={factor:g}", common.feature_image(model, data.image_shape), record["features"]))
            done = len(records)
            common.say(
                f"[{done}/{total}] seed {seed} {method} lambda={factor:.0e}: train {record['train_accuracy']:.4f} "
                f"test {record['test_accuracy']:.4f}, {record['seconds']:.0f} s, sizes {record['layer_sizes']}, "
                f"params {record['params_after']:,} (eta {run.elapsed / done * (total - done) / 60:.1f} min)"
            )
            common.write_text_atomically(checkpoint, json.dumps((earlier if append else []) + records, indent=1))

    notes = []
    if append:
        new = {(r["method"], r["factor"], r["seed"]) for r in records}
        records = [r for r in earlier if (r["method"], r["factor"], r["seed"]) not in new] + records
        keys = list(dict.fromkeys([(r["method"], r["factor"]) for r in records]))
        runs = [r for r in RUNS if r in keys] + [r for r in keys if r not in RUNS]
        if previous_command:
            notes.append(f"Merged with the earlier runs of `{previous_command}` (same settings; every run is in "
                         f"results/{run.path('.json').name}); date and wall time above are those of the added runs only.")
    if not append:
        with run.staged() as stage:
            example = data.x_test[list(data.y_test).index(0)].reshape(data.image_shape)
            common.save_feature_figure(stage / features, example, panels,
                                       f"Fashion-MNIST: strength of each pixel's outgoing weights (seed {run.seeds[0]}; white = dropped)")
    notes += [
        f"784-400-300-100-10, {epochs} epochs (the paper does not state its count; chosen for 2 CPU cores), batch {BATCH}, "
        "Adam lr 1e-3, threshold 1e-3; accuracies measured after thresholding; official 60k/10k split",
        "Training time is the wall time of `fit_epochs` on a machine shared with other jobs: compare within the table only.",
        "Neurons: input features, then hidden layers (output excluded), after removing dead units.",
    ]
    body = "\n\n".join([table(records, runs), verdict(records), f"![Fashion-MNIST selected pixels](results/{features})"])
    run.publish("Fashion-MNIST, paper Table 3 (MNIST row) and Fig. 6", body, records, notes=notes, section=section)
    checkpoint.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
