"""What the penalties, Proximal and SparsityMonitor add to a training epoch: one interleaved harness.

Every variant of a comparison is a compiled model (plus callbacks) trained in
this one process. After a compile epoch and one sizing epoch each, the timed
unit is the same number of epochs for every variant, enough that the fastest
variant's unit lasts at least ``--min-seconds`` (2 s by default: shorter
epochs are dominated by scheduler noise on a shared machine). The variants run
one unit each, in turn, for ``--rounds`` rounds, the order rotating every
round so that no variant always runs first or last. Reported per variant:
median seconds per epoch with the interquartile range (IQR), of the wall clock
and of the process's CPU time (user + system of all its threads: the work
done, less sensitive to other jobs than wall time), and the ratios of medians
to the comparison's reference. A ratio is flagged when the relative IQR of
either side is larger than the effect it measures (``|ratio - 1|``): that
difference is within the noise.

Comparisons (``kind``):

* ``penalty``: 784-400-300-100-10 MLP, Adam, batch 400; no penalty, Keras L2,
  Keras L1, GroupLasso, SparseGroupLasso (1e-4 on every kernel and bias);
  reference L2.
* ``proximal``: the same MLP; per optimizer (SGD momentum 0.9, Adam) the plain
  optimizer without penalty (reference), ``Proximal(optimizer)`` with the
  penalties of ``add_group_sparsity(model, 1e-4)`` (input, hidden and bias
  groups, declared by the model: they give the loss their value only, the
  proximal step applies them), ``Proximal(optimizer)`` with
  SparseGroupLasso(1e-4) set on every kernel and bias by hand (no model
  declares them: their gradient is computed and removed again each step), and
  the ``add_group_sparsity`` penalties by subgradient; for Adam also
  ``Proximal(Adam, metric="euclidean")`` (its step does not read Adam's
  second moments).
* ``sums``: the same MLP; per optimizer the plain one (reference),
  ``Proximal(optimizer)`` as in ``proximal``, and the same with its step
  traced as before the sums of the penalties became products with ones on
  TensorFlow on CPU (``keras_group_lasso.prox``): an A/B of that change in one
  process (it patches the package's private switch while that variant traces).
* ``monitor``: the same MLP with Adam and SGL; no callback (reference),
  ``SparsityMonitor()``, ``SparsityMonitor(log_dir=...)``.
* ``cnn``: Conv(16)-BN-ReLU-MaxPool-Conv(32)-BN-ReLU-MaxPool-Flatten-Dense(64)-Dense(10)
  on 28x28x1 images, batch 128; Keras L2 on the kernels (reference) vs
  ``add_group_sparsity`` channel groups (SGL), and SGD momentum without penalty
  (reference) vs ``Proximal(SGD)`` with the channel groups.

Data: Fashion-MNIST when the Debian package is installed, else random data of
the same shape (said in the results). On TensorFlow each comparison runs with
``jit_compile`` True and False (``--jit``), on JAX with True, on PyTorch eagerly
(Keras's default there; ``--jit true``: ``torch.compile``).

Usage:
    KERAS_BACKEND=tensorflow python benchmarks/overhead.py penalty --jit both
    KERAS_BACKEND=jax python benchmarks/overhead.py proximal
    python benchmarks/overhead.py monitor --quick      # 3 rounds, 0.5 s units, to benchmarks/out/

Writes benchmarks/results/overhead_<kind>_<backend>.md and .json (``--quick``: to benchmarks/out/).
"""

import math
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import common  # noqa: E402

KINDS = ("penalty", "proximal", "sums", "monitor", "cnn")
MLP = (784, 400, 300, 100, 10)
FACTOR = 1e-4


# ----------------------------------------------------------------------------- the harness


def timed_fit(model, x, y, epochs, batch, callbacks):
    """``(wall, cpu)`` seconds of ``model.fit`` for ``epochs`` epochs."""
    wall, cpu = time.perf_counter(), time.process_time()
    model.fit(x, y, batch_size=batch, epochs=epochs, verbose=0, shuffle=False, callbacks=callbacks)
    return time.perf_counter() - wall, time.process_time() - cpu


def interleave(variants, x, y, batch, rounds, min_seconds, say=common.say):
    """Time every variant, interleaved; returns ``({name: {"wall": [...], "cpu": [...]}}, epochs per unit)``.

    ``variants``: ``{name: (compiled model, callbacks)}``. The samples are
    seconds per epoch (a unit's time divided by its epochs).
    """
    sizing = {}
    for name, (model, callbacks) in variants.items():
        timed_fit(model, x, y, 1, batch, callbacks)  # tracing and compilation
        sizing[name] = timed_fit(model, x, y, 1, batch, callbacks)[0]
    epochs = max(1, math.ceil(min_seconds / max(min(sizing.values()), 1e-9)))
    samples = {name: {"wall": [], "cpu": []} for name in variants}
    names = list(variants)
    for r in range(rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            model, callbacks = variants[name]
            wall, cpu = timed_fit(model, x, y, epochs, batch, callbacks)
            samples[name]["wall"].append(wall / epochs)
            samples[name]["cpu"].append(cpu / epochs)
        say(f"  round {r + 1}/{rounds}: " + ", ".join(f"{n} {s['wall'][-1]:.3f}s" for n, s in samples.items()))
    return samples, epochs


def spread(values):
    """``(median, IQR)``; the IQR is 0 for fewer than two values."""
    median = statistics.median(values)
    if len(values) < 2:
        return median, 0.0
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return median, q3 - q1


def ratio_cell(samples, name, reference, clock):
    """``ratio`` of medians, flagged when the relative IQR of either side is at least ``|ratio - 1|``."""
    m, iqr = spread(samples[name][clock])
    m_ref, iqr_ref = spread(samples[reference][clock])
    ratio = m / m_ref
    noise = max(iqr / m, iqr_ref / m_ref)
    flag = f" (noise {100 * noise:.1f} % >= effect)" if name != reference and noise >= abs(ratio - 1) else ""
    return f"{ratio:.3f}x{flag}"


def paired_cell(samples, name, reference, clock):
    """The median of the per-round ratios ``name / reference`` ± their IQR, flagged as :func:`ratio_cell` does.

    Both ran in the same round, minutes apart at most: a machine that drifts between a fast and a slow state over
    the rounds widens each variant's IQR, not the spread of these ratios.
    """
    ratios = [a / b for a, b in zip(samples[name][clock], samples[reference][clock])]
    ratio, iqr = spread(ratios)
    flag = f" (noise {100 * iqr:.1f} % >= effect)" if name != reference and iqr >= abs(ratio - 1) else ""
    return f"{ratio:.3f}x ± {iqr:.3f}{flag}"


def table(samples, reference, groups=None):
    """Markdown: per variant, wall and CPU median ± IQR per epoch and the ratios to its reference."""
    head = ["variant", "wall s/epoch (median ± IQR)", "CPU s/epoch (median ± IQR)", "vs", "wall ratio", "CPU ratio",
            "CPU ratio per round (median ± IQR)"]
    rows = []
    for name in samples:
        ref = (groups or {}).get(name, reference)
        wall, wall_iqr = spread(samples[name]["wall"])
        cpu, cpu_iqr = spread(samples[name]["cpu"])
        rows.append([name, f"{wall:.3f} ± {wall_iqr:.3f}", f"{cpu:.3f} ± {cpu_iqr:.3f}", ref,
                     ratio_cell(samples, name, ref, "wall"), ratio_cell(samples, name, ref, "cpu"),
                     paired_cell(samples, name, ref, "cpu")])
    return common.markdown_table(head, rows)


# ----------------------------------------------------------------------------- models


def load(kind, samples):
    """``(x, y, description)``: Fashion-MNIST if installed, else random data of its shape."""
    try:
        from keras_group_lasso.datasets import load_dataset

        data = load_dataset("fashion-mnist")
        x, y, source = data.x_train[:samples], data.y_train[:samples], "Fashion-MNIST"
    except Exception as error:  # noqa: BLE001 - the Debian package is optional here
        rng = np.random.default_rng(0)
        x, y = rng.random((samples, 784), dtype=np.float32), rng.integers(0, 10, samples)
        source = f"random data of Fashion-MNIST's shape (Fashion-MNIST unavailable: {error})"
    if kind == "cnn":
        x = x.reshape(-1, 28, 28, 1)
    return x, y, f"{len(x)} x {source}"


def penalty_of(name):
    import keras

    from keras_group_lasso import GroupLasso, SparseGroupLasso

    return {
        "none": lambda: None,
        "L2": lambda: keras.regularizers.L2(FACTOR),
        "L1": lambda: keras.regularizers.L1(FACTOR),
        "GroupLasso": lambda: GroupLasso(FACTOR),
        "SparseGroupLasso": lambda: SparseGroupLasso(FACTOR),
    }[name]


def mlp(penalty):
    """The MLP with ``penalty`` on every kernel and bias (``"declared"``: ``add_group_sparsity``'s penalties)."""
    import keras

    if penalty == "declared":
        from keras_group_lasso import add_group_sparsity

        return add_group_sparsity(mlp("none"), FACTOR)
    keras.utils.set_random_seed(0)
    reg = penalty_of(penalty)
    layers = [keras.Input((MLP[0],))]
    for units in MLP[1:-1]:
        layers.append(keras.layers.Dense(units, activation="relu", kernel_regularizer=reg(), bias_regularizer=reg()))
    layers.append(keras.layers.Dense(MLP[-1], activation="softmax", kernel_regularizer=reg(), bias_regularizer=reg()))
    return keras.Sequential(layers)


def cnn(penalty):
    import keras
    from keras import layers

    from keras_group_lasso import add_group_sparsity

    keras.utils.set_random_seed(0)
    l2 = (lambda: keras.regularizers.L2(FACTOR)) if penalty == "L2" else (lambda: None)
    model = keras.Sequential([
        keras.Input((28, 28, 1)),
        layers.Conv2D(16, 3, padding="same", kernel_regularizer=l2()), layers.BatchNormalization(), layers.ReLU(),
        layers.MaxPooling2D(),
        layers.Conv2D(32, 3, padding="same", kernel_regularizer=l2()), layers.BatchNormalization(), layers.ReLU(),
        layers.MaxPooling2D(),
        layers.Flatten(), layers.Dense(64, activation="relu", kernel_regularizer=l2()),
        layers.Dense(10, activation="softmax", kernel_regularizer=l2()),
    ])
    return add_group_sparsity(model, FACTOR) if penalty == "SGL" else model


def optimizer(name, proximal=False, compile_step=False, metric="auto"):
    """The optimizer ``name``; ``proximal``: wrapped in ``Proximal`` (its step compiled alone on PyTorch with
    ``compile_step``, else eager: ``"auto"`` would switch half-way through the rounds)."""
    import keras

    from keras_group_lasso import Proximal

    inner = {"sgd-momentum": lambda: keras.optimizers.SGD(0.01, momentum=0.9),
             "adam": lambda: keras.optimizers.Adam(1e-3)}[name]()
    return Proximal(inner, metric=metric, jit_compile_step=compile_step) if proximal else inner


def _sums_as_reductions_callback():
    import keras

    from keras_group_lasso import prox

    class SumsAsReductions(keras.callbacks.Callback):
        """Its ``fit`` traces the step with the penalties' long sums as reductions (the code before they became
        products with ones; see ``keras_group_lasso.prox``): the variant keeps that step for every later unit."""

        def on_train_begin(self, logs=None):
            self._saved = prox._sums_as_products
            prox._sums_as_products = lambda: False

        def on_train_end(self, logs=None):
            prox._sums_as_products = self._saved

    return SumsAsReductions


def SumsAsReductions():  # noqa: N802 - a callback class built on first use (keras imported lazily)
    return _sums_as_reductions_callback()()


def variants(kind, jit, log_dir):
    """``({name: (compiled model, callbacks)}, reference, {name: its own reference})`` of a comparison."""
    import keras

    from keras_group_lasso import SparsityMonitor

    def compiled(model, opt):
        model.compile(optimizer=opt, loss="sparse_categorical_crossentropy", jit_compile=jit)
        return model

    if kind == "penalty":
        out = {name: (compiled(mlp(name), optimizer("adam")), []) for name in
               ("none", "L2", "L1", "GroupLasso", "SparseGroupLasso")}
        return out, "L2", {}
    if kind == "proximal":
        out, refs = {}, {}
        for opt in ("sgd-momentum", "adam"):
            out[f"{opt} plain"] = (compiled(mlp("none"), optimizer(opt)), [])
            out[f"{opt} Proximal"] = (compiled(mlp("declared"), optimizer(opt, proximal=True)), [])
            out[f"{opt} Proximal, penalties set by hand"] = (
                compiled(mlp("SparseGroupLasso"), optimizer(opt, proximal=True)), [])
            out[f"{opt} subgradient"] = (compiled(mlp("declared"), optimizer(opt)), [])
            refs.update({f"{opt} {k}": f"{opt} plain"
                         for k in ("plain", "Proximal", "Proximal, penalties set by hand", "subgradient")})
            if opt == "adam":  # the step in the Euclidean metric: no preconditioner read
                out["adam Proximal, metric='euclidean'"] = (
                    compiled(mlp("declared"), optimizer(opt, proximal=True, metric="euclidean")), [])
                refs["adam Proximal, metric='euclidean'"] = "adam plain"
            if keras.backend.backend() == "torch" and not jit:  # the proximal step compiled on its own
                out[f"{opt} Proximal, step compiled"] = (
                    compiled(mlp("declared"), optimizer(opt, proximal=True, compile_step=True)), [])
                refs[f"{opt} Proximal, step compiled"] = f"{opt} plain"
        return out, "sgd-momentum plain", refs
    if kind == "sums":
        if keras.backend.backend() != "tensorflow":
            raise SystemExit("overhead.py sums: the sums are products on TensorFlow only (run with "
                             "KERAS_BACKEND=tensorflow); elsewhere both variants are the same step")
        out, refs = {}, {}
        for opt in ("sgd-momentum", "adam"):
            out[f"{opt} plain"] = (compiled(mlp("none"), optimizer(opt)), [])
            out[f"{opt} Proximal"] = (compiled(mlp("SparseGroupLasso"), optimizer(opt, proximal=True)), [])
            out[f"{opt} Proximal, sums as reductions"] = (
                compiled(mlp("SparseGroupLasso"), optimizer(opt, proximal=True)), [SumsAsReductions()])
            refs.update({f"{opt} {k}": f"{opt} plain" for k in ("plain", "Proximal", "Proximal, sums as reductions")})
        return out, "sgd-momentum plain", refs
    if kind == "monitor":
        out = {
            "none": (compiled(mlp("SparseGroupLasso"), optimizer("adam")), []),
            "SparsityMonitor()": (compiled(mlp("SparseGroupLasso"), optimizer("adam")), [SparsityMonitor()]),
            "SparsityMonitor(log_dir)": (compiled(mlp("SparseGroupLasso"), optimizer("adam")),
                                         [SparsityMonitor(log_dir=log_dir)]),
        }
        return out, "none", {}
    out = {
        "Adam L2": (compiled(cnn("L2"), optimizer("adam")), []),
        "Adam SGL channel groups": (compiled(cnn("SGL"), optimizer("adam")), []),
        "SGD plain": (compiled(cnn("none"), optimizer("sgd-momentum")), []),
        "Proximal(SGD) channel groups": (compiled(cnn("SGL"), optimizer("sgd-momentum", proximal=True)), []),
    }
    refs = {"Adam L2": "Adam L2", "Adam SGL channel groups": "Adam L2", "SGD plain": "SGD plain",
            "Proximal(SGD) channel groups": "SGD plain"}
    return out, "Adam L2", refs


# ----------------------------------------------------------------------------- main


QUICK = "3 rounds, 0.5 s units, 4,000 rows; to benchmarks/out/"


def main(argv=None):
    parser = common.arguments(__doc__, quick=QUICK)
    parser.add_argument("kind", choices=KINDS)
    parser.add_argument("--rounds", type=common.positive_int, default=7)
    parser.add_argument("--samples", type=common.positive_int, default=None,
                        help="training rows (default 30,000; cnn 6,000)")
    parser.add_argument("--min-seconds", type=float, default=2.0, help="shortest timed unit (default 2 s)")
    parser.add_argument("--jit", choices=["true", "false", "both"], default="both",
                        help="TensorFlow (both by default) and PyTorch (eager unless true); JAX always compiles")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.min_seconds, args.samples = 3, 0.5, 4000
    samples_n = args.samples or (6000 if args.kind == "cnn" else 30000)
    batch = 128 if args.kind == "cnn" else 400

    import keras

    backend = keras.backend.backend()
    # JAX always compiles; PyTorch trains eagerly unless asked (jit_compile=True is torch.compile).
    jits = {"true": [True], "false": [False], "both": [True, False]}[args.jit]
    if backend == "jax":
        jits = [True]
    elif backend == "torch" and args.jit == "both":
        jits = [False]
    if backend == "torch" and True in jits:
        import torch

        # Every model compiles Keras's one train_step function, twice (before and after the
        # first gradient): past Dynamo's default limit of 8 the later models would run eagerly.
        torch._dynamo.config.recompile_limit = 64
    x, y, source = load(args.kind, samples_n)
    run = common.Run(f"overhead_{args.kind}_{backend}", args)
    records, lines = [], []
    with tempfile.TemporaryDirectory() as log_dir:
        for jit in jits:
            common.say(f"{args.kind}, jit_compile={jit}: {source}")
            models, reference, refs = variants(args.kind, jit, log_dir)
            samples, epochs = interleave(models, x, y, batch, args.rounds, args.min_seconds)
            text = table(samples, reference, refs)
            print(f"\njit_compile={jit} ({epochs} epochs per timed unit)\n{text}\n", flush=True)
            raw = [f"- {name}: wall " + ", ".join(f"{v:.3f}" for v in s["wall"]) + "; CPU "
                   + ", ".join(f"{v:.3f}" for v in s["cpu"]) for name, s in samples.items()]
            lines += [f"## jit_compile={jit} ({epochs} epochs per timed unit)", "", text, "", "Seconds per epoch, in "
                      "run order:", "", *raw, ""]
            records.append({"jit_compile": jit, "epochs_per_unit": epochs, "reference": reference,
                            "references": refs, "seconds_per_epoch": samples})
    notes = [f"Data: {source}; batch {batch}.",
             f"{args.rounds} interleaved rounds (order rotating); every timed unit the same number of epochs for all "
             f"variants, the fastest at least {args.min_seconds:g} s. Cells: median seconds per epoch ± interquartile "
             "range; ratios of medians to the reference named in `vs`; flagged where the relative IQR is at least the "
             "effect. The last column: the median of the ratios of the two in each round (paired, so a machine that "
             "drifts between rounds does not widen it)."]
    run.publish(f"Training overhead: {args.kind} ({backend})", "\n".join(lines), records, notes=notes, section=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
