"""What one convolution costs on this machine as its input and output channels change.

Times a single ``Conv2D(c_out, 3, padding="same", activation="relu")`` on a
batch of ``--batch`` maps of ``--size`` x ``--size`` x ``c_in`` for every pair
of ``--widths`` (compiled ``tf.function``, TensorFlow backend, ``--threads``
threads), best of ``--rounds`` interleaved rounds. The table gives the time
and the time per million multiply-adds relative to the widest pair: where a
pruned network's channel counts are cheap for their FLOPs and where they are
not. On a CPU with 16-float vector registers (AVX-512) the output channels go
in blocks of 16: 4 output channels cost about what 16 cost, which is why
``SparsityBudget(.., round_to=16)`` exists.

Usage::

    KERAS_BACKEND=tensorflow python benchmarks/conv_widths.py --output benchmarks/results/conv_widths.md
    KERAS_BACKEND=tensorflow python benchmarks/conv_widths.py --quick   # 3 widths, 1 short round -> benchmarks/out/
"""

import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import common  # noqa: E402

NAME = "conv_widths"
WIDTHS = (4, 8, 12, 16, 20, 24, 32)
QUICK = "widths 4 8 16, batch 32, 1 round of >= 0.01 s; -> benchmarks/out/"


def main(argv=None):
    parser = common.arguments(__doc__, quick=QUICK)
    parser.add_argument("--widths", type=common.positive_int, nargs="+", default=list(WIDTHS))
    parser.add_argument("--size", type=common.positive_int, default=28, help="map height and width (default 28)")
    parser.add_argument("--batch", type=common.positive_int, default=256)
    parser.add_argument("--rounds", type=common.positive_int, default=5)
    parser.add_argument("--min-time", type=float, default=0.1, help="seconds per round and shape (default 0.1)")
    parser.add_argument("--threads", type=common.positive_int, default=2)
    parser.add_argument("--output", default=None,
                        help="Markdown result, the JSON next to it (default benchmarks/results/<--out-name>.md; "
                        "benchmarks/out/ with --quick)")
    args = parser.parse_args(argv)
    if args.quick:
        args.widths, args.batch, args.rounds, args.min_time = [4, 8, 16], 32, 1, 0.01

    import keras
    import numpy as np

    if keras.backend.backend() != "tensorflow":
        parser.error(f"runs on the TensorFlow backend; KERAS_BACKEND is {keras.backend.backend()!r}")
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    run = common.Run(NAME, args, seeds=[0], output=args.output)
    calls = {}
    for c_in in args.widths:
        x = tf.constant(np.random.default_rng(0).normal(size=(args.batch, args.size, args.size, c_in)), tf.float32)
        for c_out in args.widths:
            layer = keras.layers.Conv2D(c_out, 3, padding="same", activation="relu")
            layer.build(x.shape)
            call = tf.function(layer.__call__)
            call(x)  # trace
            calls[(c_in, c_out)] = (call, x)
    best = {key: float("inf") for key in calls}
    for _ in range(args.rounds):
        for key, (call, x) in calls.items():
            n, start = 0, time.perf_counter()
            while time.perf_counter() - start < args.min_time:
                call(x).numpy()
                n += 1
            best[key] = min(best[key], (time.perf_counter() - start) / n)

    def macs(c_in, c_out):
        return 9 * c_in * c_out * args.size * args.size * args.batch / 1e6

    widest = (max(args.widths), max(args.widths))
    unit = best[widest] / macs(*widest)
    head = ["c_in \\ c_out", *map(str, args.widths)]
    times = [[str(c_in)] + [f"{1e3 * best[(c_in, c_out)]:.2f}" for c_out in args.widths] for c_in in args.widths]
    per_mac = [[str(c_in)] + [f"{best[(c_in, c_out)] / macs(c_in, c_out) / unit:.2f}" for c_out in args.widths]
               for c_in in args.widths]
    notes = [f"`Conv2D(c_out, 3, padding=\"same\", activation=\"relu\")` on {args.batch} maps of "
             f"{args.size}x{args.size}x`c_in`, compiled `tf.function`, {args.threads} threads; best of {args.rounds} "
             f"interleaved rounds of >= {args.min_time:g} s per shape."]
    body = "\n".join([
        "## Time per call [ms]",
        "",
        common.markdown_table(head, times),
        "",
        f"## Time per multiply-add, relative to {widest[0]} -> {widest[1]} channels (1.00: as efficient; 4.00: "
        "four times the time for the work)",
        "",
        common.markdown_table(head, per_mac),
    ])
    records = [{"c_in": a, "c_out": b, "seconds": t} for (a, b), t in best.items()]
    run.publish("One convolution's time by input and output channels", body, records, notes=notes, section=False,
                size=args.size, batch=args.batch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
