"""Cost of the penalties per training epoch (784-400-300-100-10 MLP, batch 400).

Five identical models (no penalty, Keras L2, Keras L1, GroupLasso,
SparseGroupLasso on every kernel and bias) are trained in one process,
interleaved epoch by epoch so that machine noise hits all of them alike;
reports median epoch time and the ratio to L2. Data: Fashion-MNIST when the
Debian package is installed, else random data of the same shape.

Usage:
    KERAS_BACKEND=tensorflow python benchmarks/penalty_overhead.py --jit both
    KERAS_BACKEND=jax python benchmarks/penalty_overhead.py
"""

import argparse
import os
import platform
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np

from keras_group_lasso import GroupLasso, SparseGroupLasso

PENALTIES = {
    "none": lambda f: None,
    "L2": lambda f: keras.regularizers.L2(f),
    "L1": lambda f: keras.regularizers.L1(f),
    "GroupLasso": lambda f: GroupLasso(f),
    "SparseGroupLasso": lambda f: SparseGroupLasso(f),
}


def load(samples):
    try:
        from keras_group_lasso.datasets import load_dataset

        data = load_dataset("fashion-mnist")
        return data.x_train[:samples], data.y_train[:samples], "Fashion-MNIST"
    except Exception:  # the Debian package is optional for this benchmark
        rng = np.random.default_rng(0)
        return rng.random((samples, 784), dtype=np.float32), rng.integers(0, 10, samples), "random 784-d"


def build(penalty, factor, jit_compile):
    keras.utils.set_random_seed(0)
    reg = PENALTIES[penalty]
    layers = [keras.Input((784,))]
    for units in (400, 300, 100):
        layers.append(keras.layers.Dense(units, activation="relu", kernel_regularizer=reg(factor), bias_regularizer=reg(factor)))
    layers.append(keras.layers.Dense(10, activation="softmax", kernel_regularizer=reg(factor), bias_regularizer=reg(factor)))
    model = keras.Sequential(layers)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy", jit_compile=jit_compile)
    return model


def measure(x, y, jit_compile, rounds, factor):
    models = {name: build(name, factor, jit_compile) for name in PENALTIES}
    for model in models.values():  # compile and warm up
        model.fit(x, y, batch_size=400, epochs=1, verbose=0)
    times = {name: [] for name in models}
    cpu = {name: [] for name in models}
    for r in range(rounds):
        for name, model in models.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            model.fit(x, y, batch_size=400, epochs=1, verbose=0)
            times[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
        print(f"  round {r + 1}/{rounds}: " + ", ".join(f"{n} {t[-1]:.2f}s" for n, t in times.items()), file=sys.stderr)
    # CPU seconds of this process: on a shared machine, less sensitive to other jobs than wall time.
    return {name: (statistics.median(times[name]), min(times[name]), statistics.median(cpu[name])) for name in models}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=60000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--factor", type=float, default=1e-4)
    parser.add_argument("--jit", choices=["true", "false", "both"], default="both")
    args = parser.parse_args(argv)
    x, y, source = load(args.samples)
    backend = keras.backend.backend()
    modes = {"true": [True], "false": [False], "both": [True, False]}[args.jit]
    if backend == "jax":
        modes = [True]  # jit_compile=False on JAX runs op by op; nobody trains that way
    print(f"# Penalty overhead per epoch: 784-400-300-100-10, batch 400, {len(x)} x {source}")
    print(f"backend {backend}, Keras {keras.__version__}, {os.cpu_count()} cores, {platform.processor() or platform.machine()}, "
          f"{args.rounds} interleaved rounds, median epoch time\n")
    print("Cells: median (fastest) wall seconds per epoch, [median CPU seconds]. Ratios: wall medians "
          "(fastest epochs) [CPU medians].\n")
    print("| jit_compile | " + " | ".join(PENALTIES) + " | SGL / L2 | GroupLasso / L2 |")
    print("|---|" + "---|" * (len(PENALTIES) + 2))
    for jit in modes:
        t = measure(x, y, jit, args.rounds, args.factor)
        cells = " | ".join(f"{t[n][0]:.2f} ({t[n][1]:.2f}) [{t[n][2]:.2f}]" for n in PENALTIES)
        ratios = [
            f"{t[n][0] / t['L2'][0]:.3f} ({t[n][1] / t['L2'][1]:.3f}) [{t[n][2] / t['L2'][2]:.3f}]"
            for n in ("SparseGroupLasso", "GroupLasso")
        ]
        print(f"| {jit} | {cells} | {ratios[0]} | {ratios[1]} |", flush=True)


if __name__ == "__main__":
    main()
