"""Does the latency table predict modern networks? Predicted vs measured speed-ups of pruned MobileNetV2 / EfficientNet.

The networks of ``benchmarks/modern_cnn.py`` (inverted residual blocks with
depthwise convolutions, residual streams, squeeze-excite gates in the
EfficientNet-style one) at 32x32x1, untrained (the time of a call does not
depend on the values of the weights). For each network, on the backend
``KERAS_BACKEND`` names:

1. ``LatencyTable.measure`` of the dense network at batch ``--batch`` (how long
   measuring takes is reported);
2. pruned structures: every set of layers that makes the same channels (a
   convolution's own channels, a residual stream, a squeeze-excite gate) keeps
   the same fraction of them (uniform rows), or a fraction drawn at random per
   set between ``--low`` and 1 (random rows); the channels to drop are the
   weakest by L1 norm, their readers' weights are set to zero and
   ``prune_model(.., 0)`` removes them (as ``modern_cnn.py``'s magnitude rows do);
3. per structure: the FLOP reduction, the table's predicted speed-up
   (``table.speedup(sparsity_report(..))``), and the measured one (dense time /
   pruned time, compiled inference, timed side by side by ``LatencyTable.time_models``, the median of
   ``--rounds`` rounds).

Reported: measured / predicted per structure and over all, next to measured /
(FLOP reduction): how far FLOPs alone would have been off.

With ``--train``, trained rows too, on Fashion-MNIST (``modern_cnn.load``): the
dense network (Adam, cosine decay) and the budget row of ``modern_cnn.py``
under ``SparsityBudget(max_latency=--latency)`` instead of ``max_flops``
(FLOP-weighted group penalties, ``Proximal(Adam)``, the table measured above),
``prune_model`` at the 1e-3 threshold, no fine-tuning: test accuracy of both,
the pruned model's predicted and measured speed-up. TensorFlow trains without
XLA (its CPU compiler runs these depthwise networks several times slower).

Usage:
    KERAS_BACKEND=tensorflow python benchmarks/latency_modern.py
    KERAS_BACKEND=tensorflow python benchmarks/latency_modern.py --networks mobilenetv2 --random 2 --rounds 3
    KERAS_BACKEND=tensorflow python benchmarks/latency_modern.py --networks mobilenetv2 --random 0 --train --latency 0.5
    KERAS_BACKEND=tensorflow python benchmarks/latency_modern.py --networks mobilenetv2 --quick   # -> benchmarks/out/
"""

import math
import statistics
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import common, modern_cnn  # noqa: E402

UNIFORM = (0.75, 0.5, 0.3)


def timed_speedup(dense, pruned, batch, rounds):
    """Median over ``rounds`` of dense time / pruned time, the two timed side by side (``LatencyTable.time_models``)."""
    from keras_group_lasso import LatencyTable

    ratios = []
    for _ in range(rounds):
        dense_time, pruned_time = LatencyTable.time_models([dense, pruned], batch, repeats=5)
        ratios.append(dense_time / pruned_time)
    return statistics.median(ratios)


def structures(groups, random_count, low, seed):
    """``[(label, keep fractions per group)]``: the uniform fractions, then ``random_count`` random ones."""
    import numpy as np

    rng = np.random.default_rng(seed)
    rows = [(f"uniform {f:g}", [f] * len(groups)) for f in UNIFORM]
    rows += [(f"random {k + 1}", rng.uniform(low, 1.0, len(groups)).tolist()) for k in range(random_count)]
    return rows


def network_rows(network, args):
    """Rows ``[label, FLOP reduction, predicted, measured, measured / predicted, measured / FLOP reduction]``."""
    from keras_group_lasso import LatencyTable, prune_model, sparsity_report

    dense = modern_cnn.build(network, args.seed)
    table = LatencyTable.measure(dense, batch_size=args.batch)
    common.say(f"{network}: table measured in {table.measure_seconds:.1f} s, dense "
               f"{1e3 * table.dense_seconds():.2f} ms per batch of {args.batch}")
    groups = modern_cnn.filter_groups(dense)
    flops = sparsity_report(dense).flops_before
    rows, errors, flop_errors = [], [], []
    for label, fractions in structures(groups, args.random, args.low, args.seed):
        zeroed = modern_cnn.zero_readers(dense, groups, fractions)
        report = sparsity_report(zeroed, 0.0)
        pruned = prune_model(zeroed, 0.0)
        predicted = table.speedup(report)
        measured = timed_speedup(dense, pruned, args.batch, args.rounds)
        reduction = flops / max(report.flops_after, 1)
        errors.append(math.log(measured / predicted))
        flop_errors.append(math.log(measured / reduction))
        rows.append([label, f"{reduction:.2f}x", f"{predicted:.2f}x", f"{measured:.2f}x",
                     f"{measured / predicted:.2f}", f"{measured / reduction:.2f}"])
        common.say(f"  {label}: FLOPs 1/{reduction:.2f}, predicted {predicted:.2f}x, measured {measured:.2f}x")
    if args.train:
        rows += trained_rows(network, dense, table, args)
    summary = {"table_seconds": table.measure_seconds, "dense_ms": 1e3 * table.dense_seconds(),
               "layers": len(table.layers),
               "table_error": math.exp(statistics.mean(abs(e) for e in errors)) - 1,
               "flop_error": math.exp(statistics.mean(abs(e) for e in flop_errors)) - 1,
               "worst": max(abs(math.exp(e) - 1) for e in errors)}
    return rows, summary, table


def trained_rows(network, untrained, table, args):
    """The dense and ``max_latency`` rows trained on Fashion-MNIST (see the module's docstring)."""
    import keras

    from keras_group_lasso import sparsity_report

    data = modern_cnn.load(None, False, args.train_size)
    jit = keras.backend.backend() != "tensorflow"
    cached = Path(args.dense_cache) / f"{network}_dense_{args.seed}.keras" if args.dense_cache else None
    if cached and cached.exists():
        dense = keras.models.load_model(cached)
        dense_record = {"test_accuracy": modern_cnn.accuracy(dense, data)}
        common.say(f"  dense network loaded from {cached}")
    else:
        dense, dense_record = modern_cnn.train_dense(network, args.seed, data, args.epochs, modern_cnn.LEARNING_RATE,
                                                     jit)
        if cached:
            cached.parent.mkdir(parents=True, exist_ok=True)
            dense.save(cached)
    model, small, record = modern_cnn.train_budget(
        network, args.seed, data, args.epochs, modern_cnn.LEARNING_RATE, args.factor, 1.0, args.settle, jit,
        max_latency=args.latency, latency_table=table, latency_check=False)
    report = sparsity_report(model, modern_cnn.THRESHOLD)
    predicted = table.speedup(report)
    measured = timed_speedup(dense, small, args.batch, args.rounds)
    flops = sparsity_report(untrained).flops_before / max(report.flops_after, 1)
    if args.save_dir:
        Path(args.save_dir).mkdir(parents=True, exist_ok=True)
        small.save(Path(args.save_dir) / f"{network}_latency_{args.latency:g}_pruned.keras")
    common.say(f"  trained: dense {100 * dense_record['test_accuracy']:.2f} %, max_latency={args.latency:g} "
               f"{100 * record['test_accuracy']:.2f} %, FLOPs 1/{flops:.2f}, predicted {predicted:.2f}x, "
               f"measured {measured:.2f}x; {record['warnings']}")
    points = 100 * (record["test_accuracy"] - dense_record["test_accuracy"])
    return [[f"trained dense: {100 * dense_record['test_accuracy']:.2f} % test accuracy", "1.00x", "1.00x", "1.00x",
             "-", "-"],
            [f"trained, `max_latency={args.latency:g}`, pruned: {100 * record['test_accuracy']:.2f} % "
             f"({points:+.2f} points)", f"{flops:.2f}x", f"{predicted:.2f}x", f"{measured:.2f}x",
             f"{measured / predicted:.2f}", f"{measured / flops:.2f}"]]


QUICK = "1 random structure, 1 timing round (with --train: 512 images, 1 epoch); to benchmarks/out/"


def main(argv=None):
    parser = common.arguments(__doc__, quick=QUICK)
    parser.add_argument("--networks", nargs="+", choices=modern_cnn.NETWORKS, default=list(modern_cnn.NETWORKS))
    parser.add_argument("--batch", type=common.positive_int, default=256)
    parser.add_argument("--random", type=common.non_negative_int, default=5, help="random structures per network")
    parser.add_argument("--low", type=float, default=0.15, help="the smallest random keep fraction")
    parser.add_argument("--rounds", type=common.positive_int, default=5, help="timing rounds per structure")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train", action="store_true", help="trained dense and max_latency rows (Fashion-MNIST)")
    parser.add_argument("--latency", type=float, default=0.5, help="max_latency of the trained row")
    parser.add_argument("--epochs", type=common.positive_int, default=modern_cnn.EPOCHS)
    parser.add_argument("--train-size", type=common.positive_int, default=None, help="the first N training images")
    parser.add_argument("--factor", type=float, default=modern_cnn.LAMBDA, help="the budget's starting strength")
    parser.add_argument("--settle", type=float, default=0.2)
    parser.add_argument("--save-dir", default=None, help="a folder for the trained pruned models (.keras)")
    parser.add_argument("--dense-cache", default=None,
                        help="a folder for the trained dense networks: loaded when there (same network, seed, data "
                             "and epochs are the caller's to keep), else trained and saved")
    parser.add_argument("--output", default=None,
                        help="Markdown result, the .json next to it (default benchmarks/results/"
                        "latency_modern_BACKEND.md; benchmarks/out/ with --quick)")
    args = parser.parse_args(argv)
    if args.quick:
        args.random, args.rounds, args.train_size, args.epochs = 1, 1, 512, 1

    import keras

    run = common.Run(f"latency_modern_{keras.backend.backend()}", args, seeds=[args.seed], output=args.output)
    sections, tables, records = [], [], []
    for network in args.networks:
        rows, summary, table = network_rows(network, args)
        records.append({"network": network, "rows": rows, **summary})
        sections += [
            f"## {network}", "",
            f"{modern_cnn.describe(network)}. Latency table: {summary['layers']} layers that make units, measured in "
            f"{summary['table_seconds']:.1f} s; dense {summary['dense_ms']:.2f} ms per batch of {args.batch}.", "",
            common.markdown_table(["structure", "FLOP reduction", "predicted speed-up", "measured speed-up",
                                   "measured / predicted", "measured / FLOP reduction"], rows), "",
            f"Mean error of the table's prediction: {100 * summary['table_error']:.1f} % (worst "
            f"{100 * summary['worst']:.1f} %); of the FLOP reduction taken as the speed-up: "
            f"{100 * summary['flop_error']:.1f} % (geometric mean of |measured / predicted|).", "",
        ]
        tables += ["```", table.to_text(), "```", ""]
    notes = [
        "Untrained networks (timing does not depend on weight values); channels dropped by the L1 norm of "
        "random initial weights, so random channels; every set of layers that makes the same channels keeps "
        f"one fraction: uniform {', '.join(f'{f:g}' for f in UNIFORM)}, or drawn per set in "
        f"[{args.low:g}, 1) ({args.random} random structures)",
        f"Speed-ups at batch {args.batch}: dense / pruned time, compiled inference (LatencyTable.time_models: 5 "
        f"interleaved samples of each, the fastest counts), median of {args.rounds} such rounds",
        *([f"Trained rows: Fashion-MNIST, {args.train_size or 60000:,} training images, the 10,000 test images, "
           f"{args.epochs} epochs, batch {modern_cnn.BATCH}, Adam with a cosine-decayed learning rate "
           f"{modern_cnn.LEARNING_RATE:g}, jit_compile {keras.backend.backend() != 'tensorflow'}; budget: "
           f"add_group_sparsity(factor {args.factor:g}, penalty='group', input_factor=0, group_weight='flops'), "
           f"Proximal(Adam), SparsityBudget(max_latency={args.latency:g}, settle={args.settle:g}) with the "
           f"table below, prune_model at threshold {modern_cnn.THRESHOLD:g}, no fine-tuning"] if args.train else []),
    ]
    run.publish("Latency table on modern networks: predicted vs measured speed-ups of pruned structures",
                "\n".join([*sections, "The tables:", "", *tables]), records, notes=notes, section=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
