"""Ask for milliseconds: ``SparsityBudget(max_latency=...)`` vs the FLOP budget on the 32-64-128 VGG, Fashion-MNIST.

In one process, on the backend ``KERAS_BACKEND`` names:

(a) the dense VGG (two 3x3 convolutions + BatchNorm + ReLU per stage, stages of
    32, 64 and 128 channels, max pooling, Flatten, Dense(units), Dense(10)),
    trained with Adam;
(b) the same network with group penalties, ``Proximal(SGD + momentum)`` steered
    by ``SparsityBudget(max_latency=L)`` (a fraction of the dense model's time at
    batch 256, measured on this machine by a :class:`~keras_group_lasso.LatencyTable`
    before training);
(c) the FLOP budget at the FLOPs row (b) reached: ``SparsityBudget(max_flops=F)``;
(d) the same FLOP budget with ``round_to=16`` (widths in whole blocks of 16);
with ``--scratch``, two more rows trained from scratch as (a) is (Adam, no
penalties): the latency row's structure, and every width of the dense network
scaled by one factor, the largest the table predicts within the latency budget:
what one budgeted training gives against training a small network chosen by
hand. ``--table FILE`` loads a saved latency table (or saves the one measured
there), so that runs comparing settings steer with the same table.

For each row: test accuracy of the pruned model (``prune_model``, no
fine-tuning; with ``--finetune-epochs T`` the budget rows train E - T of the
E epochs and their pruned models are fine-tuned T epochs, the peers' recipe:
prune, then a fine-tuning tail), multiply-adds per sample, live channels, the table's predicted
time and speed-up, and the measured speed-up of the pruned model vs the dense
one at batch 256 (``LatencyTable.time_model``: compiled inference, the fastest
of several samples; dense and pruned timed side by side (``LatencyTable.time_models``), several rounds, the
median of the rounds). Then at batch 1, where a deployment serves one request
at a time: the dense model and each pruned one written by ``export_pruned`` as
a SavedModel and a ``.tflite`` file (TensorFlow only), every call timed on its
own, all models and formats interleaved (``--batch1-rounds`` rounds of 20 calls
each), the median per call and the speed-up dense / pruned.

Usage:
    python benchmarks/latency_budget.py                         # 15 epochs, all images
    python benchmarks/latency_budget.py --epochs 3 --train 6000 --test 2000   # a reduced run
    python benchmarks/latency_budget.py --quick                 # a smoke run -> benchmarks/out/
"""

import shutil
import statistics
import sys
import warnings
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import cnn_fashion, common  # noqa: E402

BATCH_TIMED = 256


def timed_speedup(dense, pruned, rounds):
    """Medians over ``rounds`` of (dense time / pruned time, dense time, pruned time), timed side by side."""
    from keras_group_lasso import LatencyTable

    times = [LatencyTable.time_models([dense, pruned], BATCH_TIMED, repeats=5) for _ in range(rounds)]
    return (statistics.median(d / p for d, p in times), statistics.median(d for d, _ in times),
            statistics.median(p for _, p in times))


def run_budget(label, data, args, seed, group_weight=None, weight_table=None, **budget_args):
    """Train the penalised VGG under one ``SparsityBudget``; returns (model, budget, record).

    ``group_weight``: the penalties' group weights (default ``args.group_weight``); ``weight_table``: the latency
    table of ``group_weight="latency"``.
    """
    from keras_group_lasso import SparsityBudget, add_group_sparsity

    from keras_group_lasso import Proximal

    epochs = args.epochs - args.finetune_epochs  # the fine-tuning tail, if any, follows the pruning
    if args.optimizer == "adam":  # the dense row's Adam and learning-rate schedule, with the proximal step
        optimizer = Proximal(cnn_fashion.optimizer_for("adam", epochs, len(data["x_train"])))
    else:
        optimizer = cnn_fashion.optimizer_for("proximal", epochs, len(data["x_train"]))
    if args.defaults:  # nothing chosen but the budget: add_group_sparsity's and SparsityBudget's defaults
        network = add_group_sparsity(cnn_fashion.build_cnn(seed))
        min_width = "auto" if args.min_width == "auto" else float(args.min_width)
        budget = SparsityBudget(threshold=cnn_fashion.THRESHOLD, min_width=min_width, **budget_args)
    else:
        network = cnn_fashion.sparse_cnn(seed, args.factor, "group", group_weight or args.group_weight,
                                         latency_table=weight_table)
        update_freq = int(args.update_freq) if args.update_freq.isdigit() else args.update_freq
        budget = SparsityBudget(threshold=cnn_fashion.THRESHOLD, settle=args.settle, schedule_power=args.power,
                                update_freq=update_freq, **budget_args)
    model = cnn_fashion.compile_model(network, optimizer, False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        wall, _ = cnn_fashion.fit(model, data, epochs, seed, label, callbacks=[budget])
    return model, budget, {"label": label, "train_seconds": wall,
                           "warnings": [str(w.message) for w in caught if "SparsityBudget" in str(w.message)]}


def layer_widths(filters, head):
    """``{layer: (input units, output units)}`` of the VGG with ``filters`` channels per convolution and ``head``
    units in its Dense layer (what :meth:`LatencyTable.predict` reads)."""
    names = [f"conv{k}" for k in range(1, len(filters) + 1)] + ["dense", "logits"]
    outs = [*filters, head, cnn_fashion.N_CLASSES]
    return {name: (([1] + outs)[k], outs[k]) for k, name in enumerate(names)}


def uniform_widths(table, fraction):
    """``(filters, head)``: every width of the dense VGG times the largest factor (steps of 1/256) whose predicted
    time is within ``fraction`` of the dense time."""
    dense = table.predict(None)
    best = None
    for step in range(1, 257):
        scale = step / 256
        filters = [max(1, round(scale * c)) for c in cnn_fashion.filter_counts()]
        head = max(1, round(scale * cnn_fashion.UNITS))
        if table.predict(layer_widths(filters, head)) <= fraction * dense:
            best = (filters, head)
    if best is None:
        raise SystemExit(f"no uniform width is predicted within {fraction} of the dense time")
    return best


def batch_one(dense, pruned, x, rounds):
    """Rows ``[label, SavedModel us, speed-up, TFLite us, speed-up]`` at batch 1 for ``dense`` and each pruned model."""
    import tempfile

    workdir = tempfile.mkdtemp(prefix="latency_budget_")
    try:
        return _batch_one_rows(dense, pruned, x, rounds, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _batch_one_rows(dense, pruned, x, rounds, workdir):
    from benchmarks import inference_latency
    from keras_group_lasso import export_pruned

    exported = {}
    for label, model in [("dense", dense), *pruned.items()]:
        # The dense model through the same exporter at threshold 0: no weight is zero, nothing is removed.
        threshold = 0.0 if label == "dense" else cnn_fashion.THRESHOLD
        result = export_pruned(model, Path(workdir) / label.replace(", ", "_").replace("=", ""),
                               threshold=threshold, formats=("saved_model", "tflite"))
        exported[label] = (result.paths["saved_model"], result.paths["tflite"])
    fns = {}
    for label, (saved, tflite) in exported.items():
        fns[("SavedModel", label)] = inference_latency.saved_model_call(saved, x)
        fns[("TFLite", label)] = inference_latency.tflite_call(tflite, x, 1)
    wall, _ = inference_latency.latencies(fns, rounds, 20)
    median = {key: statistics.median(values) for key, values in wall.items()}
    rows = []
    for label in exported:
        cells = [label]
        for fmt in ("SavedModel", "TFLite"):
            cells += [f"{1e6 * median[(fmt, label)]:.0f}",
                      f"{median[(fmt, 'dense')] / median[(fmt, label)]:.2f}x"]
        rows.append(cells)
    return rows


QUICK = "1 epoch, 2,000 training and 1,000 test images, 1 timing round, 1 batch-1 round; to benchmarks/out/"


def main(argv=None):
    parser = common.arguments(__doc__, quick=QUICK)
    parser.add_argument("--epochs", type=common.positive_int, default=15)
    parser.add_argument("--train", type=common.positive_int, default=None, help="training images (default: all)")
    parser.add_argument("--test", type=common.positive_int, default=None, help="test images (default: all)")
    parser.add_argument("--finetune-epochs", type=common.non_negative_int, default=0,
                        help="T: the budget rows train epochs - T epochs, then their pruned models T epochs of Adam "
                        "(cosine-decayed from the dense row's rate; the peers' recipe); default 0: no fine-tuning")
    parser.add_argument("--latency", type=float, default=0.2, help="max_latency, a fraction of the dense time")
    parser.add_argument("--factor", type=float, default=3e-4, help="penalty strength the budget starts from")
    parser.add_argument("--group-weight", choices=("size", "flops"), default="flops")
    parser.add_argument("--latency-group-weight", choices=("same", "latency"), default="same",
                        help="group weights of the latency row: those of --group-weight, or each group's measured "
                             "marginal time (group_weight='latency', from the table)")
    parser.add_argument("--units", type=common.positive_int, default=64)
    parser.add_argument("--settle", type=float, default=0.2)
    parser.add_argument("--power", type=float, default=1.0, help="schedule_power of every budget")
    parser.add_argument("--update-freq", default="epoch",
                        help="update_freq of every budget: 'epoch', 'batch' or a number of batches between checks")
    parser.add_argument("--defaults", action="store_true",
                        help="budget rows with the defaults: add_group_sparsity(model), SparsityBudget(max_...) only "
                             "(--factor, --group-weight, --settle, --power and --update-freq unused)")
    parser.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd",
                        help="the budget rows' optimizer: Proximal(SGD with momentum) (default) or Proximal(Adam) "
                             "with the dense row's learning rate and cosine decay")
    parser.add_argument("--latency-only", action="store_true",
                        help="no FLOP-budget rows: the dense and latency rows (and --scratch's), a full-data run in "
                             "half the time")
    parser.add_argument("--scratch", action="store_true",
                        help="two more rows trained from scratch as the dense one is (Adam, no penalties): the "
                             "latency row's structure, and every width scaled by one factor to the latency budget")
    parser.add_argument("--rounds", type=common.positive_int, default=5, help="timing rounds per row")
    parser.add_argument("--batch1-rounds", type=common.non_negative_int, default=10,
                        help="rounds of the batch-1 SavedModel / TFLite timing (0: skip it; TensorFlow only)")
    parser.add_argument("--table", default=None,
                        help="a latency table file (LatencyTable.save): loaded when it exists, else measured and "
                             "saved there (runs that compare settings then share one measurement)")
    parser.add_argument("--min-width", default="auto",
                        help="with --defaults: SparsityBudget's min_width ('auto', its default, or a fraction)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--note", action="append", default=[], help="a line added to the result's header")
    parser.add_argument("--output", default=None,
                        help="Markdown result, the .json next to it (default benchmarks/results/latency_budget_DATE.md; "
                        "benchmarks/out/ with --quick)")
    args = parser.parse_args(argv)
    if args.quick:
        args.finetune_epochs = min(args.finetune_epochs, 1)
        args.epochs, args.train, args.test = 1 + args.finetune_epochs, 2000, 1000
        args.rounds, args.batch1_rounds = 1, 1
    if args.finetune_epochs >= args.epochs:
        parser.error(f"--finetune-epochs must be less than --epochs ({args.epochs}); received {args.finetune_epochs}")

    import keras

    from keras_group_lasso import LatencyTable, prune_model, sparsity_report
    from keras_group_lasso.costs import current_device

    cnn_fashion.CHANNELS, cnn_fashion.CONVS, cnn_fashion.UNITS = (32, 64, 128), 2, args.units
    run = common.Run(f"latency_budget_{common.now():%Y-%m-%d}", args, seeds=[args.seed], output=args.output)
    data = cnn_fashion.load(quick=False, seed=args.seed)
    if args.train:
        data["x_train"], data["y_train"] = data["x_train"][:args.train], data["y_train"][:args.train]
    if args.test:
        data["x_test"], data["y_test"] = data["x_test"][:args.test], data["y_test"][:args.test]
    common.say(f"{len(data['x_train'])} training images, {len(data['x_test'])} test images, {args.epochs} epochs")

    dense = cnn_fashion.compile_model(cnn_fashion.build_cnn(args.seed),
                                      cnn_fashion.optimizer_for("adam", args.epochs, len(data["x_train"])), False)
    cnn_fashion.fit(dense, data, args.epochs, args.seed, "dense")
    dense_accuracy = cnn_fashion.accuracy(dense, data["x_test"], data["y_test"])
    dense_flops = sparsity_report(dense).flops_before

    # The table: measured once, on the penalised network's layers (the same shapes as the dense one).
    template = cnn_fashion.sparse_cnn(args.seed, args.factor, "group", args.group_weight)
    loaded = bool(args.table) and Path(args.table).exists()
    if loaded:
        table = LatencyTable.load(args.table, model=template)
        here = (keras.backend.backend(), current_device())
        if (table.backend, table.device) != here:
            raise SystemExit(f"--table {args.table}: measured on {table.backend}, {table.device}; this run is on "
                             f"{here[0]}, {here[1]} (its predictions would not be this machine's)")
        common.say(f"latency table loaded from {args.table}\n{table.to_text()}")
    else:
        table = LatencyTable.measure(template, batch_size=BATCH_TIMED)
        common.say(f"latency table measured in {table.measure_seconds:.1f} s\n{table.to_text()}")
        if args.table:
            table.save(args.table)

    rows = []
    weighted = args.latency_group_weight == "latency"
    model, budget, record = run_budget("latency", data, args, args.seed, max_latency=args.latency,
                                       latency_table=table, latency_check=False,
                                       group_weight="latency" if weighted else None,
                                       weight_table=table if weighted else None)
    models = {"latency": model}
    rows.append(record)
    flops = sparsity_report(model, cnn_fashion.THRESHOLD).flops_after
    for round_to in (1, 16)[:0 if args.latency_only else 2]:
        label = f"flops, round_to={round_to}"
        model, _, record = run_budget(label, data, args, args.seed, max_flops=int(flops), round_to=round_to)
        models[label] = model
        rows.append(record)

    if args.scratch:
        channels, units = cnn_fashion.structure(sparsity_report(models["latency"], cnn_fashion.THRESHOLD))
        uniform = uniform_widths(table, args.latency)
        for label, (filters, head) in (("latency structure, from scratch", (channels, units[0])),
                                       ("uniform width, from scratch", uniform)):
            model = cnn_fashion.compile_model(cnn_fashion.build_cnn(args.seed, filters, head),
                                              cnn_fashion.optimizer_for("adam", args.epochs, len(data["x_train"])),
                                              False)
            wall, _ = cnn_fashion.fit(model, data, args.epochs, args.seed, label)
            models[label] = model
            rows.append({"label": label, "train_seconds": wall, "warnings": [], "scratch": (list(filters), head)})

    table_rows = [["(a) dense", f"{100 * dense_accuracy:.2f}", f"{dense_flops:,}", "1.00x",
                   ", ".join(str(c) for c in cnn_fashion.filter_counts()) + f" / {args.units}",
                   "1.00x (table)", "1.00x", "-"]]
    details, records = {}, []
    for letter, record in zip("bcdef", rows):
        model = models[record["label"]]
        report = sparsity_report(model, cnn_fashion.THRESHOLD)
        pruned = model if record.get("scratch") else prune_model(model, cnn_fashion.THRESHOLD)
        accuracy = cnn_fashion.accuracy(pruned, data["x_test"], data["y_test"])
        if args.finetune_epochs and not record.get("scratch"):
            record["accuracy_after_pruning"] = accuracy
            cnn_fashion.compile_model(pruned, cnn_fashion.optimizer_for("adam", args.finetune_epochs,
                                                                          len(data["x_train"])), False)
            record["finetune_seconds"], _ = cnn_fashion.fit(pruned, data, args.finetune_epochs, args.seed + 1,
                                                            f"{record['label']} fine-tuning")
            accuracy = cnn_fashion.accuracy(pruned, data["x_test"], data["y_test"])
            common.say(f"{record['label']}: accuracy {record['accuracy_after_pruning']:.4f} after pruning, "
                       f"{accuracy:.4f} after {args.finetune_epochs} epochs of fine-tuning")
        if record.get("scratch"):  # a small network of its own: its widths as built, nothing under the threshold
            filters, head = record["scratch"]
            flops_after = sparsity_report(model).flops_before
            predicted = table.speedup(layer_widths(filters, head))
            channels, units = filters, [head]
        else:
            flops_after = report.flops_after
            predicted = table.speedup(report)
            channels, units = cnn_fashion.structure(report)
        measured, dense_time, pruned_time = timed_speedup(dense, pruned, args.rounds)
        table_rows.append([
            f"({letter}) {record['label']}", f"{100 * accuracy:.2f}", f"{flops_after:,}",
            f"{dense_flops / max(flops_after, 1):.2f}x",
            ", ".join(map(str, channels)) + f" / {', '.join(map(str, units))}",
            f"{predicted:.2f}x", f"{measured:.2f}x", f"{measured / predicted:.2f}"])
        details[record["label"]] = (dense_time, pruned_time, record)
        records.append({**record, "test_accuracy": accuracy, "flops": flops_after, "channels": list(channels),
                        "units": list(units), "predicted": predicted, "measured": measured,
                        "dense_seconds": dense_time, "pruned_seconds": pruned_time})
        common.say(f"{record['label']}: accuracy {accuracy:.4f}, predicted {predicted:.2f}x, measured {measured:.2f}x")

    batch1 = []
    if args.batch1_rounds and common.machine_info()["backend"] == "tensorflow":
        batch1 = batch_one(dense, {label: models[label] for label, (_, _, r) in details.items()
                                      if not r.get("scratch")}, data["x_test"][:1], args.batch1_rounds)

    optimizer_text = (f"Proximal(Adam {cnn_fashion.ADAM_LR:g})" if args.optimizer == "adam" else
                      f"Proximal(SGD {cnn_fashion.SGD_LR}, momentum {cnn_fashion.MOMENTUM})")
    notes = [
        *args.note,
        f"Network: {cnn_fashion.network_text()}",
        f"{len(data['x_train'])} training images, {len(data['x_test'])} test images, {args.epochs} epochs; "
        + (f"penalties and budgets with their defaults (`add_group_sparsity(model)`, `SparsityBudget(max_...)` "
           f"only); {optimizer_text}, cosine decay"
           if args.defaults else
           f"penalties: group Lasso, factor {args.factor:g}, group weight {args.group_weight}"
           f"{' (the latency row: latency, from the table)' if weighted else ''}; "
           f"{optimizer_text}, cosine decay, settle {args.settle}, "
           f"schedule power {args.power:g}, update_freq {args.update_freq}"),
        f"Budgets: (b) max_latency={args.latency} of the dense time at batch {BATCH_TIMED}"
        + ("" if args.latency_only else "; (c), (d) max_flops = the multiply-adds (b) reached"),
        f"Latency table: {table.backend}, {table.device}, measured in {table.measure_seconds:.1f} s "
        f"{'(loaded from a file) ' if loaded else ''}"
        f"(grid {list(table.grid)} of each width, and one unit); dense model {1e3 * table.dense_seconds():.2f} ms per batch "
        f"of {BATCH_TIMED}",
        f"Speed-ups at batch {BATCH_TIMED}: dense / pruned time, compiled inference "
        f"(LatencyTable.time_models: 5 interleaved samples of each, the fastest counts), median of {args.rounds} "
        f"such rounds; "
        + (f"the budget rows trained {args.epochs - args.finetune_epochs} epochs, then their pruned models "
           f"{args.finetune_epochs} of Adam (cosine from {cnn_fashion.ADAM_LR:g}); accuracy after pruning, before "
           "it: " + ", ".join(f"{r['label']} {100 * r['accuracy_after_pruning']:.2f} %" for r in records
                              if "accuracy_after_pruning" in r)
           if args.finetune_epochs else "no fine-tuning"),
    ]
    lines = [
        common.markdown_table(["row", "test acc. (%)", "multiply-adds", "FLOP reduction", "channels / units",
                               "predicted speed-up", "measured speed-up", "measured / predicted"], table_rows),
        "",
        *(["At batch 1 (exported by `export_pruned`; median per call of " f"{args.batch1_rounds} interleaved rounds "
            "of 20 calls; speed-up = dense / pruned):", "",
            common.markdown_table(["row", "SavedModel (us)", "speed-up", "TFLite, 1 thread (us)", "speed-up"], batch1),
            ""] if batch1 else []),
        "Times per batch (median of the rounds): " + "; ".join(
            f"{label}: dense {1e3 * d:.2f} ms, pruned {1e3 * p:.2f} ms" for label, (d, p, _) in details.items()),
        "",
        "Training wall time: " + "; ".join(f"{label} {r['train_seconds']:.0f} s" for label, (_, _, r) in
                                          details.items()),
        "",
        "Budget warnings: " + ("; ".join(f"{label}: {w}" for label, (_, _, r) in details.items()
                                          for w in r["warnings"]) or "none"),
        "",
        "```",
        table.to_text(),
        "```",
    ]
    run.publish("Latency budget vs FLOP budget, 32-64-128 VGG on Fashion-MNIST", "\n".join(lines), records,
                notes=notes, section=False, dense={"test_accuracy": dense_accuracy, "flops": dense_flops},
                batch1=batch1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
