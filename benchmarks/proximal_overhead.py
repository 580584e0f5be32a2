"""Step overhead of Proximal: epoch time with ``Proximal(opt)`` + SGL penalties vs ``opt`` without any penalty.

784-400-300-100-10 ReLU MLP (softmax output), batch 400, random data of
MNIST's shape. Every variant is compiled once; then, in one process, the
variants run one Keras epoch each, in turn, for ``--rounds`` rounds (after one
warm-up epoch each), so machine noise hits them alike. The ratio of medians is
reported per optimizer and per ``jit_compile`` setting, for wall-clock time and
for the process's CPU time (user + system of all its threads: the work done,
less sensitive to other jobs on a shared machine than wall time).

Variants per optimizer (SGD momentum 0.9, Adam):
* ``plain``: the optimizer, no penalty (the reference, 1.00×);
* ``proximal``: ``Proximal(optimizer)``, ``SparseGroupLasso(1e-4)`` on every
  kernel and bias (the model's penalties stay loss terms; Proximal removes
  their gradient and takes their proximal step);
* ``subgradient``: the optimizer with the same penalties as loss terms (for
  reference).

Writes benchmarks/results/proximal_overhead_<backend>.md.

Usage:
    python benchmarks/proximal_overhead.py                    # TensorFlow: jit on and off
    KERAS_BACKEND=jax python benchmarks/proximal_overhead.py
    python benchmarks/proximal_overhead.py --quick            # 3 rounds, fewer rows, print only
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.common import machine_line  # noqa: E402

HERE = Path(__file__).resolve().parent
SIZES = (784, 400, 300, 100, 10)
KINDS = ("plain", "proximal", "subgradient")
BATCH = 400


def build(penalty, seed=0):
    import keras

    from keras_group_lasso import SparseGroupLasso

    keras.utils.set_random_seed(seed)

    def reg():
        return SparseGroupLasso(1e-4) if penalty else None

    layers = [keras.Input((SIZES[0],))]
    for units in SIZES[1:-1]:
        layers.append(keras.layers.Dense(units, activation="relu", kernel_regularizer=reg(), bias_regularizer=reg()))
    layers.append(keras.layers.Dense(SIZES[-1], activation="softmax", kernel_regularizer=reg(), bias_regularizer=reg()))
    return keras.Sequential(layers)


def optimizer(name):
    import keras

    return {"sgd-momentum": lambda: keras.optimizers.SGD(0.01, momentum=0.9), "adam": lambda: keras.optimizers.Adam(1e-3)}[name]()


def variants(jit_settings):
    from keras_group_lasso import Proximal

    out = {}
    for jit in jit_settings:
        for opt in ("sgd-momentum", "adam"):
            for kind in KINDS:
                model = build(penalty=kind != "plain")
                o = optimizer(opt)
                if kind == "proximal":
                    o = Proximal(o)
                model.compile(optimizer=o, loss="sparse_categorical_crossentropy", jit_compile=jit)
                out[(jit, opt, kind)] = model
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--rows", type=int, default=12000, help="training rows (rows / 400 steps an epoch)")
    parser.add_argument("--quick", action="store_true", help="3 rounds, 4000 rows, print only")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.rows = 3, 4000

    import keras

    backend = keras.backend.backend()
    jit_settings = (True, False) if backend == "tensorflow" else (True,)
    rng = np.random.default_rng(0)
    x = rng.random((args.rows, SIZES[0]), dtype=np.float32)
    y = rng.integers(0, SIZES[-1], size=args.rows)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    t0 = time.perf_counter()
    models = variants(jit_settings)
    times = {key: [] for key in models}
    cpu = {key: [] for key in models}
    for key, model in models.items():  # warm-up: tracing and compilation
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, shuffle=False)
    for r in range(args.rounds):
        for key, model in models.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, shuffle=False)
            times[key].append(time.perf_counter() - start)
            cpu[key].append(time.process_time() - start_cpu)
        print(f"round {r + 1}/{args.rounds} done", flush=True)

    head = ["jit_compile", "optimizer", "plain s/epoch", "Proximal s/epoch", "Proximal / plain (wall)",
            "Proximal / plain (CPU)", "subgradient / plain (wall, CPU)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for jit in jit_settings:
        for opt in ("sgd-momentum", "adam"):
            wall = {kind: statistics.median(times[(jit, opt, kind)]) for kind in KINDS}
            work = {kind: statistics.median(cpu[(jit, opt, kind)]) for kind in KINDS}

            def ratio(kind):
                return wall[kind] / wall["plain"], work[kind] / work["plain"]

            lines.append(
                f"| {jit} | {opt} | {wall['plain']:.3f} | {wall['proximal']:.3f} | "
                f"**{ratio('proximal')[0]:.3f}×** | **{ratio('proximal')[1]:.3f}×** | "
                "{:.3f}×, {:.3f}× |".format(*ratio("subgradient"))
            )
    text = "\n".join(lines)
    print(text)
    if args.quick:
        return 0
    steps = -(-args.rows // BATCH)
    command = f"KERAS_BACKEND={backend} python benchmarks/proximal_overhead.py " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    report = [
        f"# Proximal step overhead ({backend})",
        "",
        f"- Command: `{command.rstrip()}`",
        f"- Date: {started}; wall time {(time.perf_counter() - t0) / 60:.1f} min",
        f"- Machine: {machine_line()} (shared with other jobs while it ran)",
        f"- {'-'.join(map(str, SIZES))} MLP, batch {BATCH}, {args.rows} random rows ({steps} steps an epoch);"
        f" median of {args.rounds} interleaved epochs per variant, after one warm-up epoch each.",
        "- Penalty: SparseGroupLasso(1e-4) on every kernel and bias; `plain` has none;"
        " `subgradient`: the same penalties as loss terms, plain optimizer.",
        "",
        text,
        "",
        "Raw epoch times (s), in run order:",
        "",
    ]
    for key, values in times.items():
        report.append(f"- jit={key[0]} {key[1]} {key[2]}: wall " + ", ".join(f"{v:.3f}" for v in values)
                      + "; CPU " + ", ".join(f"{v:.3f}" for v in cpu[key]))
    out = HERE / "results" / f"proximal_overhead_{backend}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(report) + "\n")
    print("wrote", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
