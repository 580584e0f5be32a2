"""Small networks of one CNN family trained from scratch: what a structure at a FLOP budget reaches on its own.

``benchmarks/cnn_fashion.py``'s network (``--channels``, ``--convs-per-stage``,
``--units``) is the dense baseline; every ``--structure`` (one filter count per
convolution, then the Dense units) is the same network built narrower and
trained exactly as the dense one is (Adam, cosine decay, the same epochs, data
split and seed, no penalties). Each row gives its multiply-adds per sample, the
FLOP reduction and the test accuracy against the dense network's.

It answers whether a gap at a FLOP budget is the search's or the size's: a
budgeted network (row (e) of ``cnn_fashion.py``) is compared here with the
structures one could have chosen by hand at the same FLOPs, for example every
layer at ``1/sqrt(8)`` of its width (8x fewer multiply-adds).

Usage::

    KERAS_BACKEND=tensorflow python benchmarks/cnn_scratch.py --seed 1 --epochs 15 --channels 32 64 128 \\
        --convs-per-stage 2 --structure 16,16,16,16,32,32:64 11,11,22,22,45,45:64 \\
        --dense-cache benchmarks/out/dense --output benchmarks/results/cnn_scratch_vgg_wide_s1.md
    KERAS_BACKEND=tensorflow python benchmarks/cnn_scratch.py --quick --structure 8,16:32   # 3,000 images, 1 epoch
"""

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import cnn_fashion, common  # noqa: E402

NAME = "cnn_scratch"
QUICK = "3,000 training images, 1 epoch; -> benchmarks/out/"


def structure(text):
    """``"C1,C2,...:U"``: filters of each convolution and the hidden Dense units."""
    try:
        convs, units = text.split(":")
        filters = [int(c) for c in convs.split(",")]
        units = int(units)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a structure is 'C1,C2,...:UNITS' (positive integers); received {text!r}")
    if min(filters + [units]) < 1:
        raise argparse.ArgumentTypeError(f"a structure is 'C1,C2,...:UNITS' (positive integers); received {text!r}")
    return filters, units


def main(argv=None):
    parser = common.arguments(__doc__, quick=QUICK)
    parser.add_argument("--structure", type=structure, nargs="+", required=True, metavar="C1,C2,...:UNITS",
                        help="the narrower networks to train, one filter count per convolution and the Dense units")
    parser.add_argument("--seed", type=int, default=0, help="the seed of the data split, weights and shuffling")
    parser.add_argument("--epochs", type=common.positive_int, default=None,
                        help=f"training epochs (default {cnn_fashion.EPOCHS}; 1 with --quick)")
    parser.add_argument("--channels", type=common.positive_int, nargs="+", default=None, metavar="C",
                        help="the dense network's filters per stage (as cnn_fashion.py)")
    parser.add_argument("--convs-per-stage", type=common.positive_int, default=cnn_fashion.CONVS)
    parser.add_argument("--units", type=common.positive_int, default=None, help="the dense network's Dense units")
    parser.add_argument("--dense-cache", default=None, metavar="DIR",
                        help="as cnn_fashion.py: load the dense network an earlier run saved there")
    parser.add_argument("--threads", type=common.positive_int, default=2, help="TensorFlow intra-op threads")
    parser.add_argument("--output", default=None,
                        help="Markdown result, the JSON next to it (default benchmarks/results/<--out-name>.md; "
                        "benchmarks/out/ with --quick)")
    args = parser.parse_args(argv)
    cnn_fashion.CHANNELS = tuple(args.channels or cnn_fashion.CHANNELS)
    cnn_fashion.CONVS = args.convs_per_stage
    cnn_fashion.UNITS = args.units or cnn_fashion.UNITS
    counts = cnn_fashion.filter_counts()
    for filters, _ in args.structure:
        if len(filters) != len(counts):
            parser.error(f"--structure takes one filter count per convolution ({len(counts)}); received {filters}")

    import keras

    cnn_fashion.set_threads(args.threads)
    jit_compile = keras.backend.backend() != "tensorflow"
    epochs = args.epochs or (1 if args.quick else cnn_fashion.EPOCHS)
    run = common.Run(NAME, args, seeds=[args.seed], output=args.output)
    data = cnn_fashion.load(args.quick, args.seed)
    _, record = cnn_fashion.train_dense(args.seed, data, epochs, jit_compile, args.dense_cache)
    dense_flops = record["flops_before"]
    rows = [{"structure": "dense", "channels": counts, "units": cnn_fashion.UNITS, "flops": dense_flops,
             "test_accuracy": record["test_accuracy"], "val_accuracy": record["val_accuracy"],
             "train_seconds": record["train_seconds"], "loaded": "dense_from" in record}]
    for filters, units in args.structure:
        alone = cnn_fashion.train_scratch({"seed": args.seed, "channels": filters, "dense_units": [units],
                                           "flops_before": dense_flops, "params_before": record["params_before"]},
                                          data, epochs, jit_compile)
        rows.append({"structure": "scratch", "channels": filters, "units": units, "flops": alone["flops_after"],
                     "test_accuracy": alone["test_accuracy"], "val_accuracy": alone["val_accuracy"],
                     "train_seconds": alone["train_seconds"]})
        common.say(f"{rows[-1]} (elapsed {run.elapsed / 60:.1f} min)")

    dense_test = rows[0]["test_accuracy"]
    table = common.markdown_table(
        ["network", "channels per convolution - Dense units", "MACs/sample", "FLOP reduction", "test acc. [%]",
         "Δ vs dense [points]", "val acc. [%]", "train wall [s]"],
        [["dense" + (" (from the cache)" if r.get("loaded") else "") if r["structure"] == "dense" else "from scratch",
          "-".join(map(str, r["channels"])) + f"-{r['units']}", f"{r['flops']:,}", f"{dense_flops / r['flops']:.2f}x",
          f"{100 * r['test_accuracy']:.2f}", f"{100 * (r['test_accuracy'] - dense_test):+.2f}",
          f"{100 * r['val_accuracy']:.2f}", f"{r['train_seconds']:.0f}"] for r in rows])
    notes = [f"Network: {cnn_fashion.network_text()}; every row trained with Adam lr {cnn_fashion.ADAM_LR:g} "
             f"(cosine decay to 0), batch {cnn_fashion.BATCH}, {epochs} epoch{'s' if epochs > 1 else ''}, "
             f"seed {args.seed} "
             f"(data split, weights, shuffling); {len(data['x_train']):,} training, "
             f"{len(data['x_test']):,} test images.",
             f"TensorFlow intra-op threads {args.threads}; jit_compile={jit_compile}."]
    run.publish("A CNN family's small networks trained from scratch", table, rows, notes=notes, section=False,
                seed=args.seed, epochs=epochs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
