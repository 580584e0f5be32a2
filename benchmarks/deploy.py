"""Deploying the pruned VGG: dense vs pruned, float vs int8, in ONNX Runtime and the TFLite interpreter.

The 32-64-128 VGG of ``benchmarks/cnn_fashion.py`` (two 3x3 Conv-BN-ReLU per
stage, ``--channels 32 64 128 --convs-per-stage 2``) on Fashion-MNIST, trained
twice from the same seed on a subset of the training images:

* dense: Adam;
* pruned: FLOP-weighted group penalties, ``Proximal(Adam)`` steered by
  ``SparsityBudget(max_flops=--budget-flops)``.

Then the BatchNormalization statistics of both are computed afresh on 2,000
training images (a few short epochs leave the moving averages behind).

Each is written by ``export_pruned(.., fold_batchnorm=True, formats=("onnx",
"tflite", "tflite-int8"), representative_data=<--representative training
images>)`` (the dense one with ``threshold=0``: nothing removed, the same
BatchNormalization folding, so the differences are the pruning's). In one
process, one thread per runtime, it then measures each file: test accuracy,
file size and the median latency of one call at batch 1 and 256 (best of
``--rounds`` interleaved rounds). The int8 model takes int8 inputs: the images
are quantized once, outside the timed calls.

Usage::

    KERAS_BACKEND=tensorflow python benchmarks/deploy.py                # about 15 minutes on 2 cores
    KERAS_BACKEND=tensorflow python benchmarks/deploy.py --quick        # a smoke run into benchmarks/out/
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import cnn_fashion, common

BATCHES = (1, 256)
CALLS = {1: 200, 256: 8}  # timed calls per round


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--channels", type=int, nargs="+", default=[32, 64, 128])
    p.add_argument("--convs-per-stage", type=int, default=2)
    p.add_argument("--train", type=common.positive_int, default=12000, help="training images (default 12000)")
    p.add_argument("--test", type=common.positive_int, default=2000, help="test images (default 2000)")
    p.add_argument("--epochs", type=common.positive_int, default=3)
    p.add_argument("--budget-flops", type=float, default=0.25, help="SparsityBudget(max_flops=...) (default 0.25)")
    p.add_argument("--budget-lambda", type=float, default=3e-4)
    p.add_argument("--settle", type=float, default=0.4, help="SparsityBudget settle (default 0.4)")
    p.add_argument("--representative", type=common.positive_int, default=200,
                   help="training images to calibrate int8 on (default 200)")
    p.add_argument("--rounds", type=common.positive_int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="a smoke run: 1 epoch on 2000 images, into benchmarks/out/")
    p.add_argument("--output", default=None, help="Markdown result (default benchmarks/results/deploy.md)")
    args = p.parse_args(argv)
    if args.quick:
        args.train, args.test, args.epochs, args.rounds = 2000, 500, 1, 1
    args.output = args.output or common.default_output("deploy", args.quick)
    return args


def train(data, args):
    import keras

    from keras_group_lasso import Proximal, SparsityBudget

    n = len(data["x_train"])
    dense = cnn_fashion.build_cnn(args.seed)
    cnn_fashion.compile_model(dense, keras.optimizers.Adam(cnn_fashion.cosine(1e-3, args.epochs, n)), "auto")
    dense_seconds, _ = cnn_fashion.fit(dense, data, args.epochs, args.seed, "dense")
    sparse = cnn_fashion.sparse_cnn(args.seed, args.budget_lambda, "group", "flops")
    optimizer = Proximal(keras.optimizers.Adam(cnn_fashion.cosine(1e-3, args.epochs, n)))
    cnn_fashion.compile_model(sparse, optimizer, "auto")
    # Settling from 60 % of the epochs: the BatchNormalization statistics are renewed after the budget's cut.
    budget = SparsityBudget(max_flops=args.budget_flops, threshold=cnn_fashion.THRESHOLD, settle=args.settle)
    sparse_seconds, _ = cnn_fashion.fit(sparse, data, args.epochs, args.seed, "budget", callbacks=[budget])
    for model in (dense, sparse):
        renew_batchnorm(model, data["x_train"][:2000])
    return dense, sparse, {"dense_train_seconds": dense_seconds, "pruned_train_seconds": sparse_seconds}


def renew_batchnorm(model, x):
    """Set every BatchNormalization's moving statistics to those of ``x``: a few short epochs leave the moving
    averages (momentum 0.99) behind the weights, and the network then fails at inference."""
    import keras

    norms = [layer for layer in model.layers if isinstance(layer, keras.layers.BatchNormalization)]
    momenta = [layer.momentum for layer in norms]
    for layer in norms:
        layer.momentum = 0.0
    model(x, training=True)
    for layer, momentum in zip(norms, momenta):
        layer.momentum = momentum


class OnnxRunner:
    def __init__(self, path):
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        self.session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])

    def prepare(self, x):
        return x

    def __call__(self, x):
        return self.session.run(["output_0"], {"features": x})[0]


class TfliteRunner:
    def __init__(self, path):
        import tensorflow as tf

        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"(?s).*tf.lite.Interpreter is deprecated")
            self.interpreter = tf.lite.Interpreter(model_path=path, num_threads=1)
        self.input = self.interpreter.get_input_details()[0]
        self.output = self.interpreter.get_output_details()[0]
        self.shape = None

    def prepare(self, x):
        """``x`` as the model takes it: int8 for an int8 model (quantized here, outside the timed calls)."""
        import numpy as np

        if self.input["dtype"] == np.int8:
            scale, zero_point = self.input["quantization"]
            return np.clip(np.round(x / scale) + zero_point, -128, 127).astype(np.int8)
        return x

    def __call__(self, x):
        if self.shape != x.shape:
            self.interpreter.resize_tensor_input(self.input["index"], list(x.shape))
            self.interpreter.allocate_tensors()
            self.shape = x.shape
        self.interpreter.set_tensor(self.input["index"], x)
        self.interpreter.invoke()
        out = self.interpreter.get_tensor(self.output["index"])
        if out.dtype.kind == "i":  # an int8 model's logits
            scale, zero_point = self.output["quantization"]
            return (out.astype("float32") - zero_point) * scale
        return out


def accuracy(runner, x, y):
    import numpy as np

    right = 0
    for start in range(0, len(x), 256):
        right += int(np.sum(np.argmax(runner(runner.prepare(x[start:start + 256])), 1) == y[start:start + 256]))
    return right / len(x)


def latency(runners, x, rounds):
    """Median seconds of one call, per runner and batch size: best of ``rounds`` interleaved rounds."""
    best = {}
    for _ in range(rounds):
        for name, runner in runners.items():
            for batch in BATCHES:
                inputs = runner.prepare(x[:batch])
                runner(inputs)  # warm up (and allocate for this batch size)
                times = []
                for _ in range(CALLS[batch]):
                    start = time.perf_counter()
                    runner(inputs)
                    times.append(time.perf_counter() - start)
                value = statistics.median(times)
                best[name, batch] = min(best.get((name, batch), value), value)
    return best


def main(argv=None):
    args = parse_args(argv)
    import keras

    from keras_group_lasso import export_pruned

    if keras.backend.backend() != "tensorflow":
        sys.exit("run this benchmark with KERAS_BACKEND=tensorflow (it trains with the TensorFlow backend)")
    cnn_fashion.CHANNELS, cnn_fashion.CONVS = tuple(args.channels), args.convs_per_stage
    cnn_fashion.set_threads(os.cpu_count())
    started, clock = common.now(), time.perf_counter()
    data = cnn_fashion.load(quick=False, seed=args.seed)
    data["x_train"], data["y_train"] = data["x_train"][:args.train], data["y_train"][:args.train]
    x_test, y_test = data["x_test"][:args.test].astype("float32"), data["y_test"][:args.test]
    dense, sparse, record = train(data, args)
    representative = data["x_train"][:args.representative].astype("float32")

    rows, runners, files = [], {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, model, threshold in (("dense", dense, 0.0), ("pruned", sparse, cnn_fashion.THRESHOLD)):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                result = export_pruned(model, os.path.join(tmp, name), threshold=threshold, fold_batchnorm=True,
                                       formats=("onnx", "tflite", "tflite-int8"), representative_data=representative)
            record[name] = {"manifest": result.manifest,
                            "warnings": [str(w.message) for w in caught if "export_pruned" in str(w.message)]}
            for fmt, runtime, kind, cls in (("onnx", "ONNX Runtime", "float", OnnxRunner),
                                            ("tflite", "TFLite", "float", TfliteRunner),
                                            ("tflite-int8", "TFLite", "int8", TfliteRunner)):
                key = (name, kind, runtime)
                runners[key] = cls(result.paths[fmt])
                files[key] = result.manifest["file_sizes"][os.path.basename(result.paths[fmt])]
        common.say("measuring accuracy and latency")
        accuracies = {key: accuracy(runner, x_test, y_test) for key, runner in runners.items()}
        times = latency(runners, x_test, args.rounds)
    elapsed = time.perf_counter() - clock

    measured = []
    for key in runners:
        name, kind, runtime = key
        manifest = record[name]["manifest"]
        entry = {"model": name, "weights": kind, "runtime": runtime, "accuracy": accuracies[key],
                 "bytes": files[key], "params": manifest["exported_model_params"],
                 "layer_sizes": manifest["layer_sizes_after"],
                 "ms_batch_1": times[key, 1] * 1e3, "ms_batch_256": times[key, 256] * 1e3}
        measured.append(entry)
        rows.append([name, kind, runtime, f"{100 * entry['accuracy']:.2f}", f"{entry['bytes']:,}",
                     f"{entry['params']:,}", f"{entry['ms_batch_1']:.3f}", f"{entry['ms_batch_256']:.1f}"])
    table = common.markdown_table(
        ["model", "weights", "runtime (1 thread)", f"test acc. [%] ({args.test} images)", "file [bytes]",
         "params", "batch 1 [ms]", "batch 256 [ms]"], rows)
    int8 = {name: record[name]["manifest"]["tflite_int8"]["error_on_representative_data"]
            for name in ("dense", "pruned")}
    notes = [f"`{name}`: int8 vs float on the {v['rows']} calibration images: mean |error| "
             f"{100 * v['mean_relative_error']:.2f} % of the logit scale, argmax agreement "
             f"{100 * v['argmax_agreement']:.1f} %" for name, v in int8.items()]
    text = "\n".join([
        "# Deploying the pruned VGG: ONNX Runtime and TFLite, float and int8", "",
        common.header(common.command_line(), [args.seed], started, elapsed,
                      notes=[(f"{args.train} training images, {args.epochs} epochs; "
                             f"SparsityBudget(max_flops={args.budget_flops:g}, settle={args.settle:g}), λ {args.budget_lambda:g}"),
                             "layer sizes: dense " + "-".join(map(str, record["dense"]["manifest"]["layer_sizes_after"]))
                             + ", pruned " + "-".join(map(str, record["pruned"]["manifest"]["layer_sizes_after"]))]
                      + notes),
        "", table, ""])
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(text)
    Path(args.output).with_suffix(".json").write_text(json.dumps(
        {"command": common.command_line(), "date": f"{started:%Y-%m-%d %H:%M} UTC", "machine": common.machine_line(),
         # the output path relative to the repository, so the record does not name this machine's folders
         "args": dict(vars(args), output=os.path.relpath(args.output, Path(__file__).resolve().parent.parent)),
         "rows": measured, "train": {k: v for k, v in record.items() if k.endswith("seconds")},
         "int8_error": int8, "warnings": {n: record[n]["warnings"] for n in ("dense", "pruned")}},
        indent=1, default=float))
    print(text)


if __name__ == "__main__":
    main()
