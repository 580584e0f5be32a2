"""What a SparsityBudget adds to the time of a training: the same network and epochs with and without it.

The network is ``modern_cnn.py``'s MobileNetV2- or EfficientNet-style CNN on
the first ``--train`` Fashion-MNIST training images (32x32x1). Both variants
are ``add_group_sparsity(model)`` trained with ``Proximal(Adam(1e-3))`` for
``--epochs`` epochs of batch ``--batch``, ``jit_compile=True``; the budget
variant adds ``SparsityBudget(max_flops=0.25)`` with its defaults (the
gradual pace: eight checks an epoch, groups cut along the schedule). Every fit
builds and compiles a fresh model, so each includes its first compile. The
two variants alternate for ``--rounds`` rounds (the order swapping every
round). Reported per variant: the median wall and CPU seconds of the whole
``fit`` (CPU: user + system of every thread of the process), the times
``fit`` traced the train step again because a callback asked for it
(``make_train_function(force=True)``), and the budget's landing.

Usage:
    KERAS_BACKEND=jax python benchmarks/budget_cost.py                  # benchmarks/results/budget_cost_jax.md
    KERAS_BACKEND=tensorflow python benchmarks/budget_cost.py --quick   # 512 images, 2 epochs, 1 round -> benchmarks/out/
"""

import os
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks import common, modern_cnn  # noqa: E402


def one_fit(network, data, epochs, batch, budget):
    """``{wall, cpu, forced, flops}`` of one fit of a fresh model (``budget``: with a SparsityBudget)."""
    import keras

    from keras_group_lasso import Proximal, SparsityBudget, add_group_sparsity, sparsity_report

    model = add_group_sparsity(modern_cnn.build(network, 0))
    model.compile(Proximal(keras.optimizers.Adam(1e-3)),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=True)
    forced = []
    make = model.make_train_function

    def counting(force=False):
        forced.append(bool(force))
        return make(force=force)

    model.make_train_function = counting
    callbacks = [SparsityBudget(max_flops=0.25)] if budget else []
    keras.utils.set_random_seed(1)
    wall, cpu = time.perf_counter(), time.process_time()
    model.fit(data["x_train"], data["y_train"], batch_size=batch, epochs=epochs, verbose=0, callbacks=callbacks)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    report = sparsity_report(model)
    return {"wall": wall, "cpu": cpu, "forced": sum(forced), "flops": report.flops_after / report.flops_before}


QUICK = "512 images, 2 epochs, 1 round; to benchmarks/out/"


def main(argv=None):
    parser = common.arguments(__doc__, quick=QUICK)
    parser.add_argument("--network", choices=modern_cnn.NETWORKS, default="mobilenetv2")
    parser.add_argument("--train", type=common.positive_int, default=4096, help="training images (default 4096)")
    parser.add_argument("--epochs", type=common.positive_int, default=6)
    parser.add_argument("--batch", type=common.positive_int, default=128)
    parser.add_argument("--rounds", type=common.positive_int, default=2)
    args = parser.parse_args(argv)
    if args.quick:
        args.train, args.epochs, args.rounds = 512, 2, 1

    import keras

    backend = keras.backend.backend()
    run = common.Run(f"budget_cost_{backend}", args)
    data = modern_cnn.load(None, False, args.train)
    runs = {"Proximal": [], "Proximal + SparsityBudget(max_flops=0.25)": []}
    names = list(runs)
    for round_ in range(args.rounds):
        for name in names if round_ % 2 == 0 else names[::-1]:
            fit = one_fit(args.network, data, args.epochs, args.batch, budget=name != names[0])
            runs[name].append(fit)
            common.say(f"round {round_ + 1} {name}: wall {fit['wall']:.1f} s, cpu {fit['cpu']:.1f} s, "
                       f"forced traces {fit['forced']}, flops {fit['flops']:.3f}")
    reference = {clock_: statistics.median(r[clock_] for r in runs[names[0]]) for clock_ in ("wall", "cpu")}
    rows = []
    for name, found in runs.items():
        cells = [name]
        for clock_ in ("wall", "cpu"):
            median = statistics.median(r[clock_] for r in found)
            cells += [f"{median:.1f}", f"{median / reference[clock_]:.2f}x"]
        cells += [str(found[0]["forced"]), f"{statistics.median(r['flops'] for r in found):.3f}"]
        rows.append(cells)
    table = common.markdown_table(["variant", "fit wall [s]", "vs Proximal", "fit CPU [s]", "vs Proximal",
                                   "forced traces", "FLOPs after / before"], rows)
    notes = [
        f"Network: `modern_cnn.py`'s {args.network} ({modern_cnn.describe(args.network)}); the first {args.train:,} "
        f"Fashion-MNIST training images; {args.epochs} epochs of batch {args.batch}; medians of {args.rounds} "
        "alternating fits per variant, each a fresh model with its first compile"]
    run.publish(f"What a SparsityBudget adds to the time of a training ({backend})", table,
                [{"variant": name, **fit} for name, fits in runs.items() for fit in fits], notes=notes, section=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
