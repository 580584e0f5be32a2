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
   pruned time, compiled inference, both timed in alternation, the median of
   ``--rounds`` rounds).

Reported: measured / predicted per structure and over all, next to measured /
(FLOP reduction): how far FLOPs alone would have been off.

Usage:
    KERAS_BACKEND=tensorflow python benchmarks/latency_modern.py
    KERAS_BACKEND=tensorflow python benchmarks/latency_modern.py --networks mobilenetv2 --random 2 --rounds 3
"""

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import common, modern_cnn  # noqa: E402

UNIFORM = (0.75, 0.5, 0.3)


def timed_speedup(dense, pruned, batch, rounds):
    """Median over ``rounds`` of dense time / pruned time, each round timing both (alternating which goes first)."""
    from keras_group_lasso import LatencyTable

    ratios = []
    for r in range(rounds):
        order = (dense, pruned) if r % 2 == 0 else (pruned, dense)
        times = {id(m): LatencyTable.time_model(m, batch, repeats=5) for m in order}
        ratios.append(times[id(dense)] / times[id(pruned)])
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
    summary = {"table_seconds": table.measure_seconds, "dense_ms": 1e3 * table.dense_seconds(),
               "layers": len(table.layers),
               "table_error": math.exp(statistics.mean(abs(e) for e in errors)) - 1,
               "flop_error": math.exp(statistics.mean(abs(e) for e in flop_errors)) - 1,
               "worst": max(abs(math.exp(e) - 1) for e in errors)}
    return rows, summary, table


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--networks", nargs="+", choices=modern_cnn.NETWORKS, default=list(modern_cnn.NETWORKS))
    parser.add_argument("--batch", type=common.positive_int, default=256)
    parser.add_argument("--random", type=common.non_negative_int, default=5, help="random structures per network")
    parser.add_argument("--low", type=float, default=0.15, help="the smallest random keep fraction")
    parser.add_argument("--rounds", type=common.positive_int, default=5, help="timing rounds per structure")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)

    started, clock = common.now(), time.perf_counter()
    sections, tables = [], []
    for network in args.networks:
        rows, summary, table = network_rows(network, args)
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
    elapsed = time.perf_counter() - clock
    text = "\n".join([
        "# Latency table on modern networks: predicted vs measured speed-ups of pruned structures", "",
        common.header(common.command_line(), [args.seed], started, elapsed, notes=[
            "Untrained networks (timing does not depend on weight values); channels dropped by the L1 norm of "
            "random initial weights, so random channels; every set of layers that makes the same channels keeps "
            f"one fraction: uniform {', '.join(f'{f:g}' for f in UNIFORM)}, or drawn per set in "
            f"[{args.low:g}, 1) ({args.random} random structures)",
            f"Speed-ups at batch {args.batch}: dense / pruned time, compiled inference (LatencyTable.time_model), "
            f"median of {args.rounds} alternating rounds",
        ]), "",
        *sections,
        "The tables:", "",
        *tables,
    ])
    output = common.write_text_atomically(
        args.output or common.RESULTS_DIR / f"latency_modern_{common.machine_info()['backend']}.md", text)
    common.say(f"wrote {output}\n{text}")


if __name__ == "__main__":
    main()
