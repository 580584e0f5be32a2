"""What SparsityMonitor adds to a training epoch (target: under 2 %).

The paper's Fashion-MNIST-sized MLP, 784-400-300-100-10, trained with Adam at
batch 400 on 60,000 patterns (Fashion-MNIST when the Debian package is
installed, otherwise random data of that shape). In one process, epochs with
and without the monitor are interleaved (order alternating each round) so that
machine noise hits every variant alike:

* ``none``: no callback;
* ``logs``: ``SparsityMonitor()`` (adds the values to the epoch's logs);
* ``tensorboard``: ``SparsityMonitor(log_dir=...)`` (also writes scalars,
  histograms and the feature-strength image).

It also times the callback's own ``on_epoch_end`` in isolation (many calls),
which is less noisy than a difference of two epoch times.

Usage::

    KERAS_BACKEND=tensorflow python benchmarks/monitor_overhead.py   # -> benchmarks/results/monitor_overhead_tensorflow.md
    KERAS_BACKEND=jax python benchmarks/monitor_overhead.py          # -> benchmarks/results/monitor_overhead_jax.md
"""

import argparse
import datetime
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

import keras
import numpy as np

from keras_group_lasso import SparsityMonitor

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.common import cpu_model, default_output  # noqa: E402

N, D, CLASSES, BATCH = 60_000, 784, 10, 400


def load_data(seed=0):
    try:
        from keras_group_lasso.datasets import load_dataset

        data = load_dataset("fashion-mnist")
        return data.x_train, data.y_train, "Fashion-MNIST (train split, 60,000 x 784)"
    except Exception as error:  # noqa: BLE001 - any failure: fall back to data of the same shape
        rng = np.random.default_rng(seed)
        x = rng.random((N, D), dtype=np.float32)
        y = rng.integers(0, CLASSES, N)
        return x, y, f"random uniform data of shape 60,000 x 784 (Fashion-MNIST unavailable: {error})"


def build_model(jit_compile):
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((D,))]
        + [keras.layers.Dense(n, activation="relu") for n in (400, 300, 100)]
        + [keras.layers.Dense(CLASSES)]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=jit_compile,
    )
    return model


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="timed epochs per variant")
    parser.add_argument("--jit-compile", choices=("auto", "true", "false"), default="auto")
    parser.add_argument("--quick", action="store_true", help="1 round, written to benchmarks/out/")
    parser.add_argument(
        "--output",
        default=None,
        help="markdown result (default benchmarks/results/monitor_overhead_<backend>.md, "
        "benchmarks/out/ with --quick)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds = 1
    output = args.output or default_output(f"monitor_overhead_{keras.backend.backend()}", args.quick)
    jit = {"auto": "auto", "true": True, "false": False}[args.jit_compile]

    x, y, data_name = load_data()
    model = build_model(jit)
    log_root = tempfile.mkdtemp(prefix="monitor-overhead-")
    variants = {
        "none": lambda: [],
        "logs": lambda: [SparsityMonitor(threshold=1e-3)],
        "tensorboard": lambda: [
            SparsityMonitor(threshold=1e-3, log_dir=os.path.join(log_root, "tb"))
        ],
    }

    def epoch(callbacks):
        start = time.perf_counter()
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=callbacks, shuffle=True)
        return time.perf_counter() - start

    epoch(variants["tensorboard"]())  # warm-up: compilation, first TensorBoard import
    times = {name: [] for name in variants}
    names = list(variants)
    for r in range(args.rounds):
        for name in names if r % 2 == 0 else reversed(names):
            times[name].append(epoch(variants[name]()))

    # The callback alone, on the trained model, many times.
    isolated = {}
    for name in ("logs", "tensorboard"):
        monitor = variants[name]()[0]
        monitor.set_model(model)
        monitor.on_train_begin()
        calls = []
        for i in range(20):
            start = time.perf_counter()
            monitor.on_epoch_end(i, logs={})
            calls.append(time.perf_counter() - start)
        monitor.on_train_end()
        isolated[name] = statistics.median(calls)

    base = statistics.median(times["none"])
    # The least disturbed epoch of any variant: a conservative denominator.
    fastest = min(t for ts in times.values() for t in ts)
    resolved_jit = getattr(model, "jit_compile", jit)
    lines = [
        "# SparsityMonitor overhead per epoch",
        "",
        f"- command: `KERAS_BACKEND={keras.backend.backend()} python benchmarks/monitor_overhead.py"
        + "".join(" " + a for a in (argv if argv is not None else sys.argv[1:]))
        + "`",
        f"- date: {datetime.datetime.now().isoformat(timespec='seconds')}",
        f"- machine: {cpu_model()}, {os.cpu_count()} cores (shared with other jobs), "
        f"{platform.system()} {platform.release()}, Python "
        f"{platform.python_version()}, Keras {keras.__version__}, backend "
        f"{keras.backend.backend()}, jit_compile={resolved_jit}",
        f"- model: 784-400-300-100-10 ReLU MLP, Adam, batch {BATCH}; data: {data_name}",
        f"- {args.rounds} timed epochs per variant, interleaved (order alternating each round), "
        "after one warm-up epoch",
        "",
        "| variant | median epoch (s) | epochs (s) | vs none | callback alone (ms/epoch) | callback / epoch |",
        "|---|---|---|---|---|---|",
    ]
    for name in names:
        med = statistics.median(times[name])
        alone = isolated.get(name)
        lines.append(
            f"| {name} | {med:.3f} | {', '.join(f'{t:.3f}' for t in times[name])} | "
            f"{100 * (med / base - 1):+.1f} % | "
            + ("-" if alone is None else f"{1e3 * alone:.1f}")
            + " | "
            + ("-" if alone is None else f"{100 * alone / fastest:.2f} %")
            + " |"
        )
    lines += [
        "",
        "`vs none` is a difference of noisy epoch times (the machine is shared); "
        "`callback / epoch` is the median time of the callback's own `on_epoch_end` "
        "(20 calls on the trained model) over the fastest epoch measured in any variant "
        f"({fastest:.3f} s): a conservative estimate of the share it adds.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    with open(output, "w", encoding="utf-8") as f:
        f.write(text)
    shutil.rmtree(log_root, ignore_errors=True)


if __name__ == "__main__":
    main()
