"""Dense vs physically pruned inference, and the cost of the surgery itself.

The model is the paper's Fashion-MNIST MLP, 784-400-300-100-10 (ReLU), with
the sparsity pattern of a trained sparse-group-Lasso network set by hand: the
outgoing rows of 21 input features, 332 / 260 / 30 hidden units of the three
hidden layers are zero, so pruning keeps 763-68-40-70-10 (no training needed;
the weights are random otherwise). Measured, in one process and interleaved:

* surgery: ``prune_model`` (median of several runs) and ``export_pruned``;
* inference throughput (samples/s) at batch 1 and 1024 of the dense model and
  the pruned one through ``model.predict``, a compiled call (TensorFlow:
  ``tf.function(jit_compile=True)``; JAX: ``jax.jit`` of ``stateless_call``)
  and the exported SavedModel (``serving_default``, the dense model exported
  the same way with ``model.export``);

reported as pruned/dense throughput next to the parameter and FLOP ratios.
Target: at batch 1024 the exported pruned model is at least
0.6 x (FLOP-reduction factor) faster than the exported dense one.

Usage::

    KERAS_BACKEND=tensorflow python benchmarks/inference.py   # -> benchmarks/results/inference_tensorflow.md
    KERAS_BACKEND=jax python benchmarks/inference.py          # -> benchmarks/results/inference_jax.md
    python benchmarks/inference.py --quick                    # 3 short rounds -> benchmarks/out/
"""

import os
import shutil
import statistics
import sys
import tempfile
import time

import keras
import numpy as np

from keras_group_lasso import apply_threshold, export_pruned, prune_model

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import common  # noqa: E402

SIZES = (784, 400, 300, 100, 10)
KEPT = (763, 68, 40, 70)
RATES = ("best", "median", "best_per_cpu_second")  # what throughputs() gives per function, in samples/s


def build_sparse_mlp(seed=0):
    """784-400-300-100-10 whose live structure is 763-68-40-70-10."""
    keras.utils.set_random_seed(seed)
    rng = np.random.default_rng(seed)
    model = keras.Sequential(
        [keras.Input((SIZES[0],))]
        + [keras.layers.Dense(n, activation="relu", name=f"hidden_{i + 1}") for i, n in enumerate(SIZES[1:-1])]
        + [keras.layers.Dense(SIZES[-1], name="output")]
    )
    dense = [layer for layer in model.layers if isinstance(layer, keras.layers.Dense)]
    keep = [np.sort(rng.choice(n, k, replace=False)) for n, k in zip(SIZES[:-1], KEPT)]
    for i, layer in enumerate(dense):
        kernel, bias = layer.get_weights()
        rows = np.zeros(kernel.shape[0], bool)
        rows[keep[i]] = True
        kernel[~rows] = 0.0  # dead inputs of this layer: their outgoing rows are zero
        if i + 1 < len(dense):
            cols = np.zeros(kernel.shape[1], bool)
            cols[keep[i + 1]] = True
            kernel[:, ~cols] = 0.0  # and, as after training, so are the dead units' incoming weights
        layer.set_weights([kernel, bias])
    apply_threshold(model, 1e-3)  # the dense baseline is the thresholded model, as in the paper
    return model


def macs(model):
    """Multiply-adds per sample: the Dense kernels' sizes (what the model really computes)."""
    return sum(
        int(np.prod(layer.kernel.shape)) for layer in model.layers if isinstance(layer, keras.layers.Dense)
    )


def median_time(fn, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def compiled_call(model):
    """(prepare, call): a jit-compiled forward pass on a backend tensor."""
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        fn = tf.function(lambda x: model(x, training=False), jit_compile=True)
        return tf.constant, lambda x: fn(x).numpy()
    if keras.backend.backend() == "jax":
        import jax
        import jax.numpy as jnp

        # Own copies: predict() may donate (and delete) the variables' buffers.
        trainable = [jnp.array(keras.ops.convert_to_numpy(v)) for v in model.trainable_variables]
        non_trainable = [jnp.array(keras.ops.convert_to_numpy(v)) for v in model.non_trainable_variables]
        fn = jax.jit(lambda t, n, x: model.stateless_call(t, n, x, training=False)[0])
        return jnp.asarray, lambda x: np.asarray(fn(trainable, non_trainable, x))
    raise SystemExit(f"no compiled path for backend {keras.backend.backend()}")


def saved_model_call(path):
    import tensorflow as tf

    serve = tf.saved_model.load(path).signatures["serving_default"]
    return lambda x: serve(features=x)["output_0"].numpy()


def throughputs(fns, x, repeats, min_time):
    """Samples/s of each function in ``fns`` on ``x``, interleaved round by round.

    Returns ``{name: (best, median, best per CPU second)}`` over the rounds; on a
    shared machine the best round is the least disturbed one (as ``timeit``
    recommends), and samples per second of this process's CPU time are less
    sensitive to other processes than wall time.
    """
    n_samples = int(x.shape[0])
    calls = {}
    for name, fn in fns.items():
        fn(x)
        fn(x)  # warm-up: tracing, compilation, caches
        n, elapsed = 1, 0.0
        while elapsed < min_time:  # enough calls per round to be measurable
            n *= 2
            start = time.perf_counter()
            for _ in range(n):
                fn(x)
            elapsed = time.perf_counter() - start
        calls[name] = n
    rates = {name: [] for name in fns}
    cpu = {name: [] for name in fns}
    names = list(fns)
    for r in range(repeats):
        for name in names if r % 2 == 0 else reversed(names):
            n = calls[name]
            start, start_cpu = time.perf_counter(), time.process_time()
            for _ in range(n):
                fns[name](x)
            rates[name].append(n * n_samples / (time.perf_counter() - start))
            cpu[name].append(n * n_samples / max(time.process_time() - start_cpu, 1e-9))
    return {name: (max(v), statistics.median(v), max(cpu[name])) for name, v in rates.items()}


QUICK = "3 short rounds; to benchmarks/out/"


def main(argv=None):
    parser = common.arguments(__doc__, quick=QUICK)
    parser.add_argument("--repeats", type=int, default=15, help="interleaved rounds per measurement")
    parser.add_argument("--min-time", type=float, default=0.05, help="seconds per round and variant")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats, args.min_time = 3, 0.02
    backend = keras.backend.backend()
    run = common.Run(f"inference_{backend}", args)

    model = build_sparse_mlp()
    small = prune_model(model, threshold=1e-3)
    surgery_s = median_time(lambda: prune_model(model, threshold=1e-3), args.repeats)
    after = tuple(small.pruning_report.layer_sizes) + (SIZES[-1],)
    if after != KEPT + (SIZES[-1],):
        raise SystemExit(f"unexpected pruned sizes {after}")

    workdir = tempfile.mkdtemp(prefix="inference-bench-")
    try:
        start = time.perf_counter()
        export_pruned(model, os.path.join(workdir, "pruned"), formats=("saved_model",))
        export_s = time.perf_counter() - start
        import tensorflow as tf

        model.export(
            os.path.join(workdir, "dense"),
            format="tf_saved_model",
            verbose=False,
            input_signature=[tf.TensorSpec([None, SIZES[0]], tf.float32, name="features")],
        )

        rng = np.random.default_rng(1)
        x_big = rng.random((1024, SIZES[0]), dtype=np.float32)
        identity = lambda x: x  # noqa: E731
        prepare_compiled, dense_compiled = compiled_call(model)
        _, pruned_compiled = compiled_call(small)
        dense_saved = saved_model_call(os.path.join(workdir, "dense"))
        pruned_saved = saved_model_call(os.path.join(workdir, "pruned", "saved_model"))
        # name: (prepare the input once, dense call, pruned call)
        paths = {
            "predict (numpy in)": (
                identity,
                lambda x: model.predict(x, batch_size=len(x), verbose=0),
                lambda x: small.predict(x, batch_size=len(x), verbose=0),
            ),
            "compiled (tensor in)": (prepare_compiled, dense_compiled, pruned_compiled),
            "SavedModel (tensor in)": (tf.constant, dense_saved, pruned_saved),
            "SavedModel (numpy in)": (
                identity,
                lambda x: dense_saved(tf.constant(x)),
                lambda x: pruned_saved(tf.constant(x)),
            ),
        }
        # The pruned model computes what the dense one does.
        for name, (prepare, dense_fn, pruned_fn) in paths.items():
            x = prepare(x_big)
            np.testing.assert_allclose(pruned_fn(x), dense_fn(x), atol=1e-4, err_msg=name)

        results = []
        for batch in (1, 1024):
            for name, (prepare, dense_fn, pruned_fn) in paths.items():
                x = prepare(x_big[:batch])
                rates = throughputs({"dense": dense_fn, "pruned": pruned_fn}, x, args.repeats, args.min_time)
                results.append((name, batch, rates["dense"], rates["pruned"]))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    flop_ratio = macs(model) / macs(small)
    param_ratio = model.count_params() / small.count_params()
    exported_1024 = [r for r in results if r[0] == "SavedModel (tensor in)" and r[1] == 1024][0]
    speedup = exported_1024[3][0] / exported_1024[2][0]
    speedup_cpu = exported_1024[3][2] / exported_1024[2][2]
    notes = [
        "model: " + "-".join(map(str, SIZES)) + " ReLU MLP whose live structure is "
        + "-".join(map(str, after)) + " (hand-set zero rows/columns, threshold 1e-3)",
        f"parameters of the two Keras models {model.count_params():,} -> {small.count_params():,} "
        f"({param_ratio:.2f}x fewer); multiply-adds per sample {macs(model):,} -> {macs(small):,} "
        f"(FLOP-reduction factor {flop_ratio:.2f}x)",
        "pruned model's layers: "
        + ", ".join(
            f"{type(layer).__name__} {tuple(layer.kernel.shape)}"
            if isinstance(layer, keras.layers.Dense)
            else type(layer).__name__
            for layer in small.layers
        ),
    ]
    lines = [
        "## Surgery",
        "",
        f"- `prune_model` on the 784-400-300-100-10 MLP: {1e3 * surgery_s:.0f} ms "
        f"(median of {args.repeats}; target well under 1 s)",
        f"- `export_pruned(..., formats=(\"saved_model\",))` including pruning: {export_s:.2f} s",
        "",
        f"## Throughput (samples/s, best of {args.repeats} interleaved rounds of >= {args.min_time} s)",
        "",
        "| path | batch | dense | pruned | pruned / dense (best) | (median) | (CPU time) | best / FLOP factor |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, batch, (dense_best, dense_median, dense_cpu), (pruned_best, pruned_median, pruned_cpu) in results:
        ratio = pruned_best / dense_best
        lines.append(
            f"| {name} | {batch} | {dense_best:,.0f} | {pruned_best:,.0f} | {ratio:.2f}x | "
            f"{pruned_median / dense_median:.2f}x | {pruned_cpu / dense_cpu:.2f}x | {ratio / flop_ratio:.2f} |"
        )
    verdict = "met" if speedup >= 0.6 * flop_ratio else "NOT met"
    lines += [
        "",
        f"Target (exported SavedModel, batch 1024, pruned >= 0.6 x {flop_ratio:.2f} = "
        f"{0.6 * flop_ratio:.2f}x faster): measured {speedup:.2f}x (tensor in, best rounds), {verdict}; "
        f"per CPU second {speedup_cpu:.2f}x.",
        "",
        "`compiled` is "
        + (
            "`tf.function(jit_compile=True)` around `model(x, training=False)`"
            if backend == "tensorflow"
            else "`jax.jit` of `model.stateless_call`"
        )
        + "; `SavedModel` calls the `serving_default` signature of `tf.saved_model.load` "
        "(the dense model exported with `model.export`, the pruned one with `export_pruned`). "
        "`tensor in`: the batch is converted to a backend tensor once, outside the timed calls; "
        "`numpy in`: each call converts the numpy batch (a fixed cost of copying the input that "
        "pruning cannot reduce). Every call returns a numpy array.",
    ]
    records = [{"path": name, "batch": batch, "dense": dict(zip(RATES, dense)), "pruned": dict(zip(RATES, pruned))}
               for name, batch, dense, pruned in results]
    run.publish("Inference: dense vs physically pruned", "\n".join(lines), records, notes=notes, section=False,
                surgery_seconds=surgery_s, export_seconds=export_s, flop_ratio=flop_ratio, param_ratio=param_ratio,
                speedup=speedup, speedup_cpu=speedup_cpu)
    return 0


if __name__ == "__main__":
    sys.exit(main())
