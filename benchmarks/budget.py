"""SparsityBudget: ask for a size, get it. DIGITS feature budgets against the path; Fashion-MNIST at 10 % of L2.

DIGITS (scikit-learn's 8x8 digits, 64 pixels, 10 classes): for each seed, the
stratified 75/25 split of ``load_dataset("digits", seed=seed)``. For each
feature budget K in 50/40/30/20/10, a 64-40-20-10 ReLU MLP (softmax output)
with ``add_group_sparsity(model, 1e-4)`` (SGL) is trained on the whole training
part with ``SparsityBudget(max_features=K)`` for ``--epochs`` epochs, batch 200,
once with ``keras.optimizers.Adam()`` (subgradient training, threshold 1e-3)
and once with ``Proximal(keras.optimizers.Adam())``, both at their default
learning rate. Recorded: the features reached, whether the callback's finishing
cut fired (and how many groups), the test accuracy of the model, of its
thresholded copy and of ``prune_model(model, 1e-3)``, the largest output
difference between the pruned model and the thresholded copy, and the wall
time of the fit. In the same process and per seed, the scikit-learn
estimator's regularization path runs exactly as in ``benchmarks/sklearn_path.py``
(alpha 1e-4) and gives, per K, the test accuracy of its best validation point
with at most K features.

Fashion-MNIST, the paper's Table 3 claim: 784-400-300-100-10 ReLU MLP, softmax,
Adam (default lr), batch 400, the same number of epochs for (a) L2 1e-4 on every
kernel and bias and (b) ``add_group_sparsity(model, 1e-4)`` with
``SparsityBudget(max_params=P)``, P = 10 % of the L2 network's parameters
(``sparsity_report(l2_model).params_before``). Target: (b) within 1 point of
(a)'s test accuracy.

Usage:
    KERAS_BACKEND=jax python benchmarks/budget.py --seeds 3
    python benchmarks/budget.py --quick     # 1 seed, few epochs; writes to benchmarks/out/
"""

import argparse
import dataclasses
import json
import sys
import time
import types
import warnings
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import common  # noqa: E402

BUDGETS = (50, 40, 30, 20, 10)
ALPHA = 1e-4
THRESHOLD = 1e-3
OPTIMIZERS = ("Adam", "Proximal(Adam)")
FASHION_HIDDEN = (400, 300, 100)
FASHION_BATCH = 400


def _mlp(n_features, n_classes, hidden, l2=None):
    import keras

    def reg():
        return keras.regularizers.L2(l2) if l2 else None

    layers = [keras.Input((n_features,))]
    for units in hidden:
        layers.append(keras.layers.Dense(units, activation="relu", kernel_regularizer=reg(), bias_regularizer=reg()))
    layers.append(keras.layers.Dense(n_classes, activation="softmax", kernel_regularizer=reg(), bias_regularizer=reg()))
    return keras.Sequential(layers)


def _optimizer(name):
    import keras

    from keras_group_lasso import Proximal

    return Proximal(keras.optimizers.Adam()) if name == "Proximal(Adam)" else keras.optimizers.Adam()


def _budget_history(history):
    """The callback's per-epoch logs, as lists (the evidence for how the controller behaved)."""
    keys = [k for k in history.history if k.startswith("budget_")]
    return {k: [float(v) for v in history.history[k]] for k in keys}


def _surgery_check(model, x, y):
    """Test accuracy of the model, of a thresholded copy and of the pruned model; pruned vs thresholded gap."""
    import keras
    import numpy as np

    from keras_group_lasso import apply_threshold, prune_model

    copy = keras.models.clone_model(model)
    copy.set_weights(model.get_weights())
    apply_threshold(copy, THRESHOLD)
    thresholded_out = copy.predict(x, batch_size=2048, verbose=0)
    record = {
        "test": common.accuracy(model, x, y),
        "test_thresholded": float(np.mean(np.argmax(thresholded_out, axis=1) == y)),
    }
    start = time.perf_counter()
    try:
        pruned = prune_model(model, THRESHOLD)
    except ValueError as error:  # e.g. a layer left with no live weight: record it, keep the run
        return dict(record, test_pruned=float("nan"), surgery_max_gap=float("nan"), surgery_s=float("nan"),
                    pruned_params=0, surgery_error=str(error))
    surgery_s = time.perf_counter() - start
    pruned_out = pruned.predict(x, batch_size=2048, verbose=0)
    return {
        **record,
        "test_pruned": float(np.mean(np.argmax(pruned_out, axis=1) == y)),
        "surgery_max_gap": float(np.max(np.abs(thresholded_out - pruned_out))),
        "surgery_s": surgery_s,
        "pruned_params": int(pruned.count_params()),
    }


def budget_fit(data, budget, optimizer_name, seed, epochs, batch_size, schedule_power=3.0):
    """One ``fit`` with ``SparsityBudget(max_features=budget)``; what it reached and how."""
    import keras

    from keras_group_lasso import SparsityBudget, add_group_sparsity, sparsity_report

    keras.utils.set_random_seed(seed)
    model = add_group_sparsity(_mlp(data.n_features, data.n_classes, (40, 20)), ALPHA)
    model.compile(optimizer=_optimizer(optimizer_name), loss="sparse_categorical_crossentropy")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        start = time.perf_counter()
        history = model.fit(
            data.x_train,
            data.y_train,
            epochs=epochs,
            batch_size=batch_size,
            verbose=0,
            callbacks=[SparsityBudget(max_features=budget, threshold=THRESHOLD, schedule_power=schedule_power)],
        )
        wall = time.perf_counter() - start
    log = _budget_history(history)
    report = sparsity_report(model, threshold=THRESHOLD)
    within = [i for i, f in enumerate(log["budget_features"]) if f <= budget]
    record = {
        "seed": seed,
        "budget": budget,
        "optimizer": optimizer_name,
        "features": report.n_selected_features,
        "below_budget": budget - report.n_selected_features,
        "layer_sizes": list(report.layer_sizes),
        "cut_fired": any(p == 2 for p in log["budget_phase"]),
        "groups_cut": int(max(log["budget_cut"])),
        "cut_epochs": sum(c > 0 for c in log["budget_cut"]),
        "cut_warnings": [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)],
        "first_epoch_within": (within[0] + 1) if within else None,
        "final_multiplier_input": log["budget_multiplier_input"][-1],
        "max_multiplier_input": max(log["budget_multiplier_input"]),
        "wall_s": wall,
        "history": log,
    }
    record.update(_surgery_check(model, data.x_test, data.y_test))
    common.say(
        f"digits seed {seed} K={budget} {optimizer_name}: {record['features']} feat. "
        f"(first within at epoch {record['first_epoch_within']}), cut up to {record['groups_cut']} groups "
        f"in {record['cut_epochs']} epochs, "
        f"test {record['test']:.3f} / pruned {record['test_pruned']:.3f} (gap {record['surgery_max_gap']:.1e}), "
        f"max input multiplier {record['max_multiplier_input']:.2f}, {wall:.1f} s"
    )
    return record


def path_run(seed, args):
    """The regularization path of ``benchmarks/sklearn_path.py`` (alpha 1e-4), unchanged."""
    from benchmarks import sklearn_path

    path_args = types.SimpleNamespace(
        epochs=args.epochs,
        batch_size=args.batch_size,
        validation_fraction=0.2,
        multiplier=1.2,
        epochs_per_alpha=None,
    )
    run = sklearn_path.digits_run(seed, path_args, ALPHA)
    return run


def digits_part(args, seeds):
    from keras_group_lasso.datasets import load_dataset

    budget_rows, path_rows = [], []
    for seed in seeds:
        data = load_dataset("digits", seed=seed)
        for budget in BUDGETS:
            for name in OPTIMIZERS:
                budget_rows.append(budget_fit(data, budget, name, seed, args.epochs, args.batch_size,
                                              args.schedule_power))
        run = path_run(seed, args)
        path_rows.append({k: v for k, v in run.items() if k not in ("path", "data")})
    return budget_rows, path_rows


def _fit_fashion(model, data, epochs, seed, callbacks=()):
    import keras

    keras.utils.set_random_seed(seed)
    start = time.perf_counter()
    history = model.fit(
        data.x_train, data.y_train, epochs=epochs, batch_size=FASHION_BATCH, verbose=0, callbacks=list(callbacks)
    )
    return history, time.perf_counter() - start


def fashion_part(args):
    """L2 1e-4 against SGL 1e-4 + SparsityBudget(max_params=10 % of L2's parameters), same epochs."""
    import keras

    from keras_group_lasso import SparsityBudget, add_group_sparsity, apply_threshold, sparsity_report
    from keras_group_lasso.datasets import load_dataset

    data = load_dataset("fashion-mnist")
    if args.quick:
        data = dataclasses.replace(data, x_train=data.x_train[:6000], y_train=data.y_train[:6000])
    seed = args.fashion_seed
    rows = {}

    keras.utils.set_random_seed(seed)
    l2 = _mlp(data.n_features, data.n_classes, FASHION_HIDDEN, l2=ALPHA)
    l2.compile(optimizer=keras.optimizers.Adam(), loss="sparse_categorical_crossentropy")
    _, wall = _fit_fashion(l2, data, args.fashion_epochs, seed)
    apply_threshold(l2, THRESHOLD)
    report = sparsity_report(l2, threshold=THRESHOLD)
    budget = int(0.1 * report.params_before)
    rows["L2"] = {
        "test": common.accuracy(l2, data.x_test, data.y_test),
        "params_before": report.params_before,
        "params_after": report.params_after,
        "layer_sizes": list(report.layer_sizes),
        "wall_s": wall,
    }
    common.say(f"fashion L2: test {rows['L2']['test']:.4f}, {report.params_after:,} params, {wall:.0f} s")

    keras.utils.set_random_seed(seed)
    model = add_group_sparsity(_mlp(data.n_features, data.n_classes, FASHION_HIDDEN), ALPHA,
                               group_weight=args.fashion_group_weight)
    model.compile(optimizer=_optimizer(args.fashion_optimizer), loss="sparse_categorical_crossentropy")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        history, wall = _fit_fashion(
            model, data, args.fashion_epochs, seed,
            [SparsityBudget(max_params=budget, threshold=THRESHOLD, settle=args.fashion_settle,
                            schedule_power=args.schedule_power)]
        )
    log = _budget_history(history)
    report = sparsity_report(model, threshold=THRESHOLD)
    check = _surgery_check(model, data.x_test, data.y_test)
    rows["budget"] = {
        "budget_params": budget,
        "test": check["test"],
        "test_thresholded": check["test_thresholded"],
        "test_pruned": check["test_pruned"],
        "surgery_max_gap": check["surgery_max_gap"],
        "pruned_params": check["pruned_params"],
        "params_after": report.params_after,
        "features": report.n_selected_features,
        "layer_sizes": list(report.layer_sizes),
        "cut_fired": any(p == 2 for p in log["budget_phase"]),
        "groups_cut": int(max(log["budget_cut"])),
        "cut_epochs": sum(c > 0 for c in log["budget_cut"]),
        "cut_warnings": [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)],
        "surgery_error": check.get("surgery_error"),
        "wall_s": wall,
        "history": log,
    }
    b = rows["budget"]
    common.say(
        f"fashion budget {budget:,}: test {b['test']:.4f} (pruned {b['test_pruned']:.4f}), "
        f"{b['params_after']:,} params, sizes {b['layer_sizes']}, cut {b['groups_cut']}, {wall:.0f} s"
    )
    # What a plain dense network of the budget's size reaches: 784-H-10 with the most units H that fit.
    hidden = (budget - data.n_classes) // (data.n_features + 1 + data.n_classes)
    keras.utils.set_random_seed(seed)
    small = _mlp(data.n_features, data.n_classes, (hidden,))
    small.compile(optimizer=keras.optimizers.Adam(), loss="sparse_categorical_crossentropy")
    _, wall = _fit_fashion(small, data, args.fashion_epochs, seed)
    rows["dense_small"] = {
        "test": common.accuracy(small, data.x_test, data.y_test),
        "params": int(small.count_params()),
        "layer_sizes": [data.n_features, int(hidden), data.n_classes],
        "wall_s": wall,
    }
    common.say(f"fashion dense {rows['dense_small']['layer_sizes']}: test {rows['dense_small']['test']:.4f}")
    return {"seed": seed, "epochs": args.fashion_epochs, "optimizer": args.fashion_optimizer,
            "group_weight": args.fashion_group_weight, "settle": args.fashion_settle,
            "schedule_power": args.schedule_power, "rows": rows}


def _before_settling(history):
    """Features at the end of the searching part: the last epoch before the multipliers went to 0."""
    multipliers = history["budget_multiplier_input"]
    start = next((e for e, m in enumerate(multipliers) if m == 0.0 and e > 0), len(multipliers))
    return history["budget_features"][start - 1]


def _cuts(records):
    """``"groups x epochs"`` per run: the largest cut of one epoch, and in how many epochs the cut fired."""
    return ", ".join(f"{r['groups_cut']}×{r['cut_epochs']}" for r in records)


def _digits_lines(args, budget_rows, path_rows):
    ms = common.mean_std
    lines = [
        f"## DIGITS: feature budgets against the regularization path, schedule_power={getattr(args, 'schedule_power', 3.0):g}",
        "",
        f"64-40-20-10 ReLU MLP, `add_group_sparsity(model, {ALPHA:g})` (SGL), trained on the whole training part "
        f"(1,347 images) for {args.epochs} epochs, batch {args.batch_size}, with "
        f"`SparsityBudget(max_features=K)` (threshold {THRESHOLD:g}, settle 0.2, schedule_power "
        f"{getattr(args, 'schedule_power', 3.0):g}); `Adam()` is subgradient training, "
        "`Proximal(Adam)` proximal training, both at Keras's default learning rate (1e-3). \"test\" is the trained "
        "model's accuracy on the 450 test images; \"pruned\" is `prune_model(model, 1e-3)`'s. The path row is "
        "the test accuracy of the path's best validation point with at most K features "
        f"(`benchmarks/sklearn_path.py`, alpha {ALPHA:g}, refitted points), in the same process. "
        "Mean ± std over seeds. \"cut fired\": fits in which the callback's cut acted, and per fit the "
        "largest `budget_cut` of one epoch × the epochs it acted in (`budget_cut` counts the groups it sets to "
        "zero that were not zero; a cut group stays at zero for the rest of the fit, so the cut acts again "
        "only if other groups grow back over the budget). "
        "\"features before settling\": the features at the end of "
        "the searching part (the epoch before the multipliers go to 0: epoch 160 of 200 at the latest), what the "
        "steered penalty reached by itself. The path's models "
        "train on 80 % of the training part (the other 20 % choose the point); the budgeted fits train on all "
        "of it and choose nothing.",
        "",
    ]
    rows = []
    for budget in BUDGETS:
        for name in OPTIMIZERS:
            g = [r for r in budget_rows if r["budget"] == budget and r["optimizer"] == name]
            rows.append(
                [
                    str(budget),
                    f"budget, {name}",
                    ms([r["features"] for r in g], 1),
                    ms([r["test"] for r in g], 3),
                    ms([r["test_pruned"] for r in g], 3),
                    f"{sum(r['cut_fired'] for r in g)}/{len(g)} ({_cuts(g)})",
                    ms([_before_settling(r["history"]) for r in g], 1),
                    ms([r["first_epoch_within"] or float("nan") for r in g], 0),
                    ms([r["wall_s"] for r in g], 1),
                ]
            )
        rows.append(
            [
                str(budget),
                "path (best val. point ≤ K)",
                ms([p["budgets"][budget]["features"] for p in path_rows], 1),
                ms([p["budgets"][budget]["test"] for p in path_rows], 3),
                "",
                "",
                "",
                "",
                "",
            ]
        )
    header_row = ["≤ K", "method", "features", "test acc.", "pruned test acc.", "cut fired (groups × epochs)",
                  "features before settling", "first epoch within", "fit wall [s]"]
    lines += common.markdown_table(header_row, rows).splitlines()
    gap = max(r["surgery_max_gap"] for r in budget_rows)
    differ = sum(abs(r["test"] - r["test_pruned"]) > 0 for r in budget_rows)
    fit_walls = [r["wall_s"] for r in budget_rows]
    path_walls = [p["wall_s"] for p in path_rows]
    lines += [
        "",
        f"- All {len(budget_rows)} budgeted fits end with at most K features: "
        f"{'yes' if all(r['features'] <= r['budget'] for r in budget_rows) else 'NO'}; features below K: "
        f"{ms([r['below_budget'] for r in budget_rows], 1)} (max {max(r['below_budget'] for r in budget_rows)}).",
        f"- Pruned vs thresholded copy: largest absolute output difference {gap:.1e}; fits whose test accuracy "
        f"differs between the trained model and the pruned one: {differ} of {len(budget_rows)} (the trained "
        "model is not thresholded; the pruned one is).",
        f"- Wall time (same process, the machine shared with other jobs: noisy): one budgeted fit "
        f"{ms(fit_walls, 1)} s, one path {ms(path_walls, 1)} s "
        f"({', '.join(f'{w:.1f}' for w in path_walls)} s); a path costs "
        f"{sum(path_walls) / len(path_walls) / (sum(fit_walls) / len(fit_walls)):.1f} budgeted fits, and gives "
        "every K at once, where a budget gives one K per fit.",
        "- Reference, measured on this machine kind, earlier: the path 0.954 test accuracy at ≤ 30 features, "
        "0.926 at ≤ 20; LassoNet's path 0.931 at ≤ 30, 0.882 at ≤ 20.",
        "",
        "Per seed, test accuracy (features):",
        "",
        "| seed | method | " + " | ".join(f"≤{b}" for b in BUDGETS) + " |",
        "|---|---|" + "---|" * len(BUDGETS),
    ]
    for seed in dict.fromkeys(r["seed"] for r in budget_rows):
        for name in OPTIMIZERS:
            cells = []
            for b in BUDGETS:
                r = next(r for r in budget_rows if (r["seed"], r["budget"], r["optimizer"]) == (seed, b, name))
                cells.append(f"{r['test']:.3f} ({r['features']}{', cut' if r['cut_fired'] else ''})")
            lines.append(f"| {seed} | budget, {name} | " + " | ".join(cells) + " |")
        p = next(p for p in path_rows if p["seed"] == seed)
        cells = [f"{p['budgets'][b]['test']:.3f} ({p['budgets'][b]['features']})" for b in BUDGETS]
        lines.append(f"| {seed} | path | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Controller trajectory, seed 0: features at epochs 10, 25, 50, 100, 150, 159, 160, 200 (with 200 epochs "
        "the cut, if any, first acts at the end of epoch 160); largest and last input multiplier; epoch the "
        "features first reached K:",
        "",
    ]
    for r in budget_rows:
        if r["seed"] != 0:
            continue
        feats = r["history"]["budget_features"]
        marks = [e for e in (10, 25, 50, 100, 150, 159, 160, 200) if e <= len(feats)]
        lines.append(
            f"- K={r['budget']}, {r['optimizer']}: "
            + ", ".join(f"{int(feats[e - 1])}" for e in marks)
            + f"; multiplier max {r['max_multiplier_input']:.2f}, last {r['final_multiplier_input']:.2f}; "
            f"within from epoch {r['first_epoch_within']}; cut {_cuts([r])} (groups × epochs)"
        )
    return lines + [""]


def _fashion_lines(fashion):
    rows = fashion["rows"]
    l2, b = rows["L2"], rows["budget"]
    optimizer = fashion.get("optimizer", "Adam")
    settle = _settings(fashion)
    weight = fashion.get("group_weight", "size")
    weighting = "" if weight == "size" else f', group_weight="{weight}"'
    # "10 % of L2's parameters": of the dense L2 network (what the budget was set from) and, stricter, of
    # the L2 network after thresholding (fashion_table.py's reference).
    ok_dense = l2["test"] - b["test"] <= 0.01 and b["params_after"] <= 0.1 * l2["params_before"]
    ok = l2["test"] - b["test"] <= 0.01 and b["params_after"] <= 0.1 * l2["params_after"]
    table = common.markdown_table(
        ["measure", "L2 λ=1e-4, Adam",
         f"SGL λ=1e-4{weighting} + SparsityBudget(max_params={b['budget_params']:,}), {optimizer}"],
        [
            ["test accuracy [%]", f"{100 * l2['test']:.2f}", f"{100 * b['test']:.2f}"],
            ["pruned model's test accuracy [%]", "", f"{100 * b['test_pruned']:.2f}"],
            ["params after surgery (report)", f"{l2['params_after']:,}", f"{b['params_after']:,}"],
            ["params of `prune_model(model, 1e-3)` (its first layer keeps a zero row per dropped input, as "
             "`inputs=\"original\"` does)", "", f"{b['pruned_params']:,}"],
            ["params vs dense L2 [%]", f"{100 * l2['params_after'] / l2['params_before']:.1f}",
             f"{100 * b['params_after'] / l2['params_before']:.1f}"],
            ["params vs thresholded L2 [%]", "100", f"{100 * b['params_after'] / l2['params_after']:.1f}"],
            ["layer sizes (input included)", str(l2["layer_sizes"]), str(b["layer_sizes"])],
            ["cut fired (largest cut × epochs with a cut)", "", f"{'yes' if b['cut_fired'] else 'no'} ({_cuts([b])})"],
            ["surgery", "", b["surgery_error"] or "ok"],
            ["training wall time [s]", f"{l2['wall_s']:.0f}", f"{b['wall_s']:.0f}"],
        ],
    )
    small = rows.get("dense_small")
    if small:
        table += (f"\n| plain dense {'-'.join(map(str, small['layer_sizes']))}, Adam, no penalty, "
                  f"{small['params']:,} params (the most units within the budget) | | "
                  f"{100 * small['test']:.2f} % test accuracy |")
    h = b["history"]
    return [
        f"## Fashion-MNIST, seed {fashion['seed']}, {fashion['epochs']} epochs{settle}, budget row {optimizer}: the "
        "paper's Table 3 claim with a parameter budget",
        "",
        f"784-400-300-100-10 ReLU MLP, softmax, Keras's default learning rate (1e-3) (budget row {optimizer}, "
        f"L2 row Adam), batch {FASHION_BATCH}, {fashion['epochs']} "
        f"epochs for both rows, one seed ({fashion['seed']}), official 60k/10k split. L2: `L2(1e-4)` on every "
        f"kernel and bias, thresholded at 1e-3 after training. Budget: "
        f"`add_group_sparsity(model, 1e-4{weighting})` and "
        f"`SparsityBudget(max_params={b['budget_params']:,}{settle})`, 10 % of the L2 network's "
        f"{l2['params_before']:,} parameters (`sparsity_report(l2_model).params_before`).",
        "",
    ] + table.splitlines() + [
        "",
        f"Target (within 1 point of L2 with at most 10 % of its parameters): {100 * (b['test'] - l2['test']):+.2f} "
        f"points; **{'met' if ok_dense else 'not met'}** against the dense L2 network's {l2['params_before']:,} "
        f"parameters ({100 * b['params_after'] / l2['params_before']:.1f} %), **{'met' if ok else 'not met'}** "
        f"against its {l2['params_after']:,} after thresholding at 1e-3 "
        f"({100 * b['params_after'] / l2['params_after']:.1f} %). Pruned vs thresholded copy: largest absolute "
        f"output difference {b['surgery_max_gap']:.1e}.",
        "",
        "Budget row, per epoch (`History`): parameters "
        + ", ".join(str(int(v)) for v in h["budget_params"])
        + "; multiplier (input = hidden groups here) "
        + ", ".join(f"{v:.2f}" for v in h["budget_multiplier_input"])
        + "; phase "
        + "".join(str(int(v)) for v in h["budget_phase"])
        + ".",
        "",
    ] + ([f"Warning: {w}" for w in b["cut_warnings"]] + [""] if b["cut_warnings"] else [])


TITLE = "SparsityBudget: feature and parameter budgets"


def render(payloads, rendered_by=None):
    """The Markdown results from one or more JSON payloads of this script (e.g. DIGITS and Fashion run apart)."""
    lines = [f"# {TITLE}", ""]
    if rendered_by:
        lines += [f"Written by `{rendered_by}` from the JSON results of these runs (one process each):", ""]
    for payload in payloads:
        info = payload["machine"]
        wall = payload["wall_seconds"] if "wall_seconds" in payload else payload["elapsed_s"]  # before common.Run
        lines += [
            f"- Command: `{payload['command']}`",
            f"- Date: {payload['date']}; wall time {wall / 60:.1f} min",
            f"- Machine: {info['cores']} cores, {info['cpu']}, {info['os']} (shared with other jobs while it ran: "
            "timings are noisy)",
            f"- Backend: {info['backend']}; {info['versions']}",
        ]
    lines.append("")
    return "\n".join(lines + _sections(payloads)) + "\n"


def _sections(payloads):
    """The DIGITS and Fashion sections of the payloads' runs, as lines."""
    lines = []
    for payload in payloads:
        args = argparse.Namespace(**payload["args"])
        budget_rows = payload["records"] if "records" in payload else payload.get("digits_budget")  # before common.Run
        if budget_rows:
            # JSON keeps the path's per-budget keys as strings.
            paths = [dict(p, budgets={int(k): v for k, v in p["budgets"].items()}) for p in payload["digits_path"]]
            lines += _digits_lines(args, budget_rows, paths)
    fashion = [payload["fashion"] for payload in payloads if payload.get("fashion")]
    def setting(run):
        return run["epochs"], run.get("settle", 0.2), run.get("schedule_power", 3.0)

    for key in sorted({setting(run) for run in fashion}):  # one table of seeds per length, settle and schedule
        runs = [run for run in fashion if setting(run) == key]
        if len(runs) > 1:
            lines += _fashion_seeds_lines(runs)
    for one in fashion:
        lines += _fashion_lines(one)
    return lines


def _settings(run):
    """``", settle=.., schedule_power=.."`` for the budget's arguments that are not the defaults (runs before
    ``--schedule-power`` existed used 3)."""
    settle, power = run.get("settle", 0.2), run.get("schedule_power", 3.0)
    return ("" if settle == 0.2 else f", settle={settle:g}") + ("" if power == 1.0 else f", schedule_power={power:g}")


def _fashion_seeds_lines(runs):
    """One row per Fashion run (seed), then the mean and standard deviation of each column."""
    def row(run):
        r = run["rows"]
        small = r.get("dense_small", {}).get("test", float("nan"))
        return [r["L2"]["test"], r["budget"]["test"], r["budget"]["test"] - r["L2"]["test"], small,
                r["budget"]["params_after"]]

    values = np.array([row(run) for run in runs], dtype=float)
    body = [
        [str(run["seed"]), run.get("optimizer", "Adam"), f"{100 * v[0]:.2f}", f"{100 * v[1]:.2f}",
         f"{100 * v[2]:+.2f}", f"{100 * v[3]:.2f}", f"{int(v[4]):,}", str(run["rows"]["budget"]["layer_sizes"])]
        for run, v in zip(runs, values)
    ]
    mean, std = np.nanmean(values, axis=0), np.nanstd(values, axis=0)
    body.append(["mean ± std", "", f"{100 * mean[0]:.2f} ± {100 * std[0]:.2f}",
                 f"{100 * mean[1]:.2f} ± {100 * std[1]:.2f}", f"{100 * mean[2]:+.2f} ± {100 * std[2]:.2f}",
                 f"{100 * mean[3]:.2f} ± {100 * std[3]:.2f}", f"{mean[4]:,.0f}", ""])
    table = common.markdown_table(
        ["seed", "budget row", "L2 test [%]", "budget test [%]", "budget - L2 [points]",
         "plain dense at the budget's size [%]", "budget params", "budget layer sizes"], body)
    title = f"## Fashion-MNIST over {len(runs)} seeds, {runs[0]['epochs']} epochs{_settings(runs[0])}"
    return [title, ""] + table.splitlines() + [""]


NAME = "budget"
QUICK = "1 seed, 20 epochs, 2 Fashion epochs on 6,000 images; results to benchmarks/out/"


def main(argv=None):
    parser = common.arguments(__doc__, seeds=3, quick=QUICK)
    parser.add_argument("--epochs", type=common.positive_int, default=200, help="DIGITS epochs (fit and path)")
    parser.add_argument("--batch-size", type=common.positive_int, default=200)
    parser.add_argument("--fashion-epochs", type=common.positive_int, default=30)
    parser.add_argument("--fashion-optimizer", choices=OPTIMIZERS, default="Adam",
                        help="optimizer of the Fashion budget row (the L2 row uses Adam)")
    parser.add_argument("--fashion-group-weight", choices=("size", "flops"), default="size",
                        help="add_group_sparsity's group_weight in the Fashion budget row")
    parser.add_argument("--fashion-seed", type=int, default=0)
    parser.add_argument("--fashion-settle", type=float, default=0.2,
                        help="SparsityBudget's settle in the Fashion budget row (default 0.2)")
    parser.add_argument("--schedule-power", type=float, default=1.0,
                        help="SparsityBudget's schedule_power in every budgeted fit (default 1, its default)")
    parser.add_argument("--skip-digits", action="store_true")
    parser.add_argument("--skip-fashion", action="store_true")
    parser.add_argument("--render", nargs="+", metavar="JSON", help="only write <out-name>.md from these JSON "
                        "results of earlier runs (DIGITS and Fashion run as two processes)")
    args = parser.parse_args(argv)
    if args.quick:
        args.epochs, args.fashion_epochs = 20, 2
    run = common.Run(NAME, args, seeds=[args.fashion_seed] if args.skip_digits else None)
    if args.render:
        payloads = [json.loads(Path(p).read_text()) for p in args.render]
        md = common.write_text_atomically(run.path(".md"), render(payloads, common.command_line()))
        common.say(f"wrote {md}")
        return 0

    budget_rows, extra = [], {}
    if not args.skip_digits:
        budget_rows, extra["digits_path"] = digits_part(args, run.seeds)
    checkpoint = run.out / f".{run.name}.partial.json"
    if not args.skip_fashion:
        if budget_rows:  # the DIGITS numbers first, so a long Fashion run that fails cannot lose them
            common.write_text_atomically(checkpoint, json.dumps({"records": budget_rows, **extra}, default=float))
        extra["fashion"] = fashion_part(args)
    body = _sections([{"args": vars(args), "records": budget_rows, **extra}])
    run.publish(TITLE, "\n".join(body), budget_rows, section=False, **extra)
    checkpoint.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
