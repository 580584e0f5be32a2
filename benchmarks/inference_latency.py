"""Batch-1 latency of exported models on TensorFlow, against the floor of an empty model.

A pruned model does a ninth of the dense model's multiply-adds, but at batch 1
a call also pays a fixed cost (argument handling, the runtime's dispatch,
copying the output) that pruning cannot reduce. This benchmark measures that
floor with an "empty" model and reports the speed-up both raw and above it.

Models (all take the 784 original features):

* ``empty``: ``Input(784) -> Identity()``, exported like the others;
* ``dense``: the 784-400-300-100-10 ReLU MLP of ``inference.py`` (thresholded
  at 1e-3), whose live structure is 763-68-40-70-10;
* ``pruned``: that model after ``keras_group_lasso.export_pruned`` (the
  SavedModel and the ``.tflite`` file it writes; the compiled call uses
  ``prune_model``).

Paths, each returning a numpy array:

* ``SavedModel``: the ``serving_default`` signature of ``tf.saved_model.load``
  (the dense and empty models written by ``model.export`` with the same input
  signature as ``export_pruned``), on a tensor made once;
* ``compiled``: ``tf.function(jit_compile=True)`` around ``model(x, training=False)``;
* ``TFLite``: ``tf.lite.Interpreter`` (``set_tensor``, ``invoke``, ``get_tensor``)
  on the flatbuffer converted from the SavedModel as ``export_pruned`` does,
  with 1 thread and with the interpreter's default.

Every call is timed on its own (``time.perf_counter``); all models and paths
run interleaved, a short unit of calls each in turn, the order rotating every
round. Reported: median and interquartile range (IQR) of the per-call wall
time, the process's CPU time per call (median over the units), and per path
the speed-up pruned vs dense, raw (``dense / pruned``) and above the floor
(``(dense - floor) / (pruned - floor)``).

Usage:
    python benchmarks/inference_latency.py           # -> benchmarks/results/inference_latency_tensorflow.md
    python benchmarks/inference_latency.py --quick   # 5 rounds of 20 calls -> benchmarks/out/

(The backend is always TensorFlow.)
"""

import os
import shutil
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import common  # noqa: E402

MODELS = ("empty", "dense", "pruned")
PATHS = ("SavedModel", "compiled", "TFLite, 1 thread", "TFLite, default threads")
SIGNATURE = "serving_default"


def build_models():
    """``{name: Keras model}``: the empty model, the dense MLP and its pruned copy."""
    import keras

    from benchmarks import inference
    from keras_group_lasso import prune_model

    empty = keras.Sequential([keras.Input((inference.SIZES[0],)), keras.layers.Identity()], name="empty")
    dense = inference.build_sparse_mlp()
    return {"empty": empty, "dense": dense, "pruned": prune_model(dense, threshold=1e-3)}


def export_all(models, workdir):
    """``{name: (saved_model_dir, tflite_file)}``; the pruned model through ``export_pruned``."""
    import tensorflow as tf

    from keras_group_lasso import export_pruned

    paths = {}
    for name in ("empty", "dense"):
        saved = os.path.join(workdir, name)
        models[name].export(saved, format="tf_saved_model", verbose=False,
                            input_signature=[tf.TensorSpec([None, 784], tf.float32, name="features")])
        tflite = os.path.join(workdir, f"{name}.tflite")
        with open(tflite, "wb") as f:
            f.write(tf.lite.TFLiteConverter.from_saved_model(saved, [SIGNATURE]).convert())
        paths[name] = (saved, tflite)
    result = export_pruned(models["dense"], os.path.join(workdir, "pruned"), formats=("saved_model", "tflite"))
    paths["pruned"] = (result.paths["saved_model"], result.paths["tflite"])
    return paths


def saved_model_call(path, x):
    import tensorflow as tf

    serve = tf.saved_model.load(path).signatures[SIGNATURE]
    tensor = tf.constant(x)
    return lambda: serve(features=tensor)["output_0"].numpy()


def compiled_call(model, x):
    import tensorflow as tf

    fn = tf.function(lambda t: model(t, training=False), jit_compile=True)
    tensor = tf.constant(x)
    return lambda: fn(tensor).numpy()


def tflite_call(path, x, threads):
    import tensorflow as tf

    interpreter = tf.lite.Interpreter(model_path=path, num_threads=threads)
    source = interpreter.get_input_details()[0]
    if tuple(source["shape"]) != x.shape:
        interpreter.resize_tensor_input(source["index"], x.shape)
    interpreter.allocate_tensors()
    source = interpreter.get_input_details()[0]["index"]
    target = interpreter.get_output_details()[0]["index"]

    def call():
        interpreter.set_tensor(source, x)
        interpreter.invoke()
        return interpreter.get_tensor(target)

    return call


def calls(models, exported, x):
    """``{(path, model): zero-argument call}`` for every path and model."""
    out = {}
    for name in MODELS:
        saved, tflite = exported[name]
        out[("SavedModel", name)] = saved_model_call(saved, x)
        out[("compiled", name)] = compiled_call(models[name], x)
        out[("TFLite, 1 thread", name)] = tflite_call(tflite, x, 1)
        out[("TFLite, default threads", name)] = tflite_call(tflite, x, None)
    return out


def latencies(fns, rounds, per_unit, say=common.say):
    """Per-call wall seconds (all calls) and CPU seconds per call (one value per unit), interleaved."""
    for fn in fns.values():
        for _ in range(20):  # tracing, compilation, allocation
            fn()
    wall = {key: [] for key in fns}
    cpu = {key: [] for key in fns}
    keys = list(fns)
    for r in range(rounds):
        shift = (r * 5) % len(keys)
        for key in keys[shift:] + keys[:shift]:
            fn, times = fns[key], wall[key]
            start_cpu = time.process_time()
            for _ in range(per_unit):
                start = time.perf_counter()
                fn()
                times.append(time.perf_counter() - start)
            cpu[key].append((time.process_time() - start_cpu) / per_unit)
        if (r + 1) % max(1, rounds // 5) == 0:
            say(f"  round {r + 1}/{rounds}")
    return wall, cpu


def spread_us(values):
    median = statistics.median(values)
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return 1e6 * median, 1e6 * (q3 - q1)


def tables(wall, cpu):
    """``(latency table, speed-up table, {path: (floor, dense, pruned)})`` in µs."""
    rows, summary, medians = [], [], {}
    for path in PATHS:
        for name in MODELS:
            m, iqr = spread_us(wall[(path, name)])
            rows.append([path, name, f"{m:.1f}", f"{iqr:.1f}", f"{1e6 * statistics.median(cpu[(path, name)]):.1f}"])
        floor, dense, pruned = (spread_us(wall[(path, name)])[0] for name in MODELS)
        medians[path] = (floor, dense, pruned)
        above = f"{(dense - floor) / (pruned - floor):.2f}x" if pruned > floor else "n/a (pruned at the floor)"
        summary.append([path, f"{floor:.1f}", f"{dense:.1f}", f"{pruned:.1f}", f"{dense / pruned:.2f}x", above,
                        f"{100 * floor / pruned:.0f} %"])
    latency = common.markdown_table(["path", "model", "median µs/call", "IQR µs", "CPU µs/call"], rows)
    speedup = common.markdown_table(
        ["path", "floor (empty) µs", "dense µs", "pruned µs", "dense / pruned", "above the floor",
         "floor's share of pruned"], summary)
    return latency, speedup, medians


QUICK = "5 rounds of 20 calls; to benchmarks/out/"


def main(argv=None):
    parser = common.arguments(__doc__, quick=QUICK)
    parser.add_argument("--rounds", type=common.positive_int, default=40, help="interleaved rounds")
    parser.add_argument("--calls", type=common.positive_int, default=50, help="calls per unit (each timed)")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.calls = 5, 20
    os.environ["KERAS_BACKEND"] = "tensorflow"  # it measures TensorFlow's exports (Keras is imported below)

    run = common.Run("inference_latency_tensorflow", args)
    models = build_models()
    x = np.random.default_rng(1).random((1, 784), dtype=np.float32)
    workdir = tempfile.mkdtemp(prefix="latency-bench-")
    try:
        exported = export_all(models, workdir)
        fns = calls(models, exported, x)
        reference = fns[("SavedModel", "dense")]()
        for (path, name), fn in fns.items():  # every path computes what the model does
            if name != "empty":
                np.testing.assert_allclose(fn(), reference, atol=1e-4, err_msg=f"{path}, {name}")
        common.say(f"{len(fns)} calls, {args.rounds} rounds of {args.calls} calls each")
        wall, cpu = latencies(fns, args.rounds, args.calls)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    latency, speedup, medians = tables(wall, cpu)
    print(f"\n{latency}\n\n{speedup}\n", flush=True)

    best = min(PATHS, key=lambda p: medians[p][2])
    notes = [
        "Models: `empty` = Input(784) -> Identity; `dense` = 784-400-300-100-10 ReLU MLP (thresholded, "
        "464,600 multiply-adds); `pruned` = its `export_pruned` / `prune_model` copy, 763-68-40-70-10 "
        "(59,532 multiply-adds, 7.80x fewer), taking the 784 original features.",
        f"{args.rounds} interleaved rounds (order rotating) of {args.calls} calls per path and model, every "
        "call timed on its own; wall: median and IQR over all calls; CPU: median over the units of the "
        "process's CPU time per call. The machine was shared with other jobs; medians of many short calls "
        "are robust to that, single slow calls land in the IQR.",
    ]
    body = "\n".join([
        "## Latency per call", "", latency, "",
        "## Pruned vs dense, and the floor", "", speedup, "",
        f"Fastest path for the pruned model: {best} ({medians[best][2]:.1f} µs per call, of which the empty "
        f"model's floor is {medians[best][0]:.1f} µs).",
    ])
    records = [{"path": path, "model": name, **dict(zip(("median_us", "iqr_us"), spread_us(wall[(path, name)]))),
                "cpu_us_per_unit": [1e6 * v for v in cpu[(path, name)]]} for path in PATHS for name in MODELS]
    run.publish("Batch-1 latency of exported models (tensorflow)", body, records, notes=notes, section=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
