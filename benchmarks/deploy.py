"""Deploying a pruned CNN: dense vs pruned, float vs int8, in ONNX Runtime and the TFLite interpreter.

``--network vgg`` (the default): the 32-64-128 VGG of ``benchmarks/cnn_fashion.py``
(two 3x3 Conv-BN-ReLU per stage, ``--channels 32 64 128 --convs-per-stage 2``)
on Fashion-MNIST, trained twice from the same seed on a subset of the training
images:

* dense: Adam;
* pruned: FLOP-weighted group penalties, ``Proximal(Adam)`` steered by
  ``SparsityBudget(max_flops=--budget-flops, settle=--settle)``.

``--network mobilenetv2`` or ``efficientnet``: the network of that name in
``benchmarks/modern_cnn.py`` (inverted residual blocks with depthwise
convolutions and residual adds, 32x32x1 inputs: the images padded by 2 pixels),
trained by its own ``train_dense`` and ``train_budget`` (batch 256, its cosine
learning rate, no XLA on TensorFlow) on the first ``--train`` training images;
the budget row is ``SparsityBudget(max_flops=--budget-flops)`` with the
library's defaults for everything else (``settle`` too unless given). Results
go to ``benchmarks/results/deploy_<network>.md`` (and ``.json``).

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
    KERAS_BACKEND=tensorflow python benchmarks/deploy.py --network mobilenetv2   # about 30 minutes on 2 cores

``--output PATH`` writes the result to PATH and its ``.json`` beside it
(``--out-name NAME``: ``NAME.md`` in the default folder).
"""

import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import cnn_fashion, common, modern_cnn

BATCHES = (1, 256)
CALLS = {1: 200, 256: 8}  # timed calls per round
NETWORKS = ("vgg",) + modern_cnn.NETWORKS
# --train and --epochs when not given: the VGG's, and the modern networks' (about 30 minutes on 2 cores)
DEFAULTS = {"vgg": (12000, 3), "modern": (10000, 6)}
VGG_SETTLE = 0.4


def parse_args(argv=None):
    p = common.arguments(__doc__, quick="a smoke run: 1 epoch on 2000 images, into benchmarks/out/")
    p.add_argument("--network", choices=NETWORKS, default="vgg",
                   help="vgg (default) or a network of benchmarks/modern_cnn.py")
    p.add_argument("--channels", type=int, nargs="+", default=[32, 64, 128], help="the VGG's widths")
    p.add_argument("--convs-per-stage", type=int, default=2, help="the VGG's convolutions per stage")
    p.add_argument("--train", type=common.positive_int, default=None,
                   help=f"training images (default {DEFAULTS['vgg'][0]}; {DEFAULTS['modern'][0]} for a modern network)")
    p.add_argument("--test", type=common.positive_int, default=2000, help="test images (default 2000)")
    p.add_argument("--epochs", type=common.positive_int, default=None,
                   help=f"default {DEFAULTS['vgg'][1]}; {DEFAULTS['modern'][1]} for a modern network")
    p.add_argument("--budget-flops", type=float, default=0.25, help="SparsityBudget(max_flops=...) (default 0.25)")
    p.add_argument("--budget-lambda", type=float, default=3e-4)
    p.add_argument("--settle", type=float, default=None,
                   help=f"SparsityBudget settle (default {VGG_SETTLE:g} for vgg, the library's default otherwise)")
    p.add_argument("--representative", type=common.positive_int, default=200,
                   help="training images to calibrate int8 on (default 200)")
    p.add_argument("--rounds", type=common.positive_int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output", default=None, help="Markdown result, its .json beside it (default "
                   "benchmarks/results/deploy.md, deploy_<network>.md for a modern network; --quick: benchmarks/out/)")
    args = p.parse_args(argv)
    train, epochs = DEFAULTS["vgg" if args.network == "vgg" else "modern"]
    args.train, args.epochs = args.train or train, args.epochs or epochs
    if args.settle is None and args.network == "vgg":
        args.settle = VGG_SETTLE
    if args.quick:
        args.train, args.test, args.epochs, args.rounds = 2000, 500, 1, 1
    name = args.out_name or ("deploy" if args.network == "vgg" else f"deploy_{args.network}")
    args.output = args.output or common.default_output(name, args.quick)
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


def train_modern(data, args):
    """The dense and budget networks of ``modern_cnn`` (its training, without XLA on TensorFlow's CPU)."""
    import keras

    jit = keras.backend.backend() != "tensorflow"
    dense, dense_record = modern_cnn.train_dense(args.network, args.seed, data, args.epochs,
                                                 modern_cnn.LEARNING_RATE, jit)
    defaults = budget_defaults()
    sparse, _, budget = modern_cnn.train_budget(
        args.network, args.seed, data, args.epochs, modern_cnn.LEARNING_RATE, args.budget_lambda,
        defaults["schedule_power"], defaults["settle"] if args.settle is None else args.settle, jit,
        max_flops=args.budget_flops)
    for model in (dense, sparse):
        renew_batchnorm(model, data["x_train"][:2000])
    keep = ("flops_before", "flops_after", "flop_reduction", "budget_cut_groups", "budget_history", "warnings",
            "settle", "schedule_power")
    return dense, sparse, {"dense_train_seconds": dense_record["train_seconds"],
                           "pruned_train_seconds": budget["train_seconds"],
                           "budget": {key: budget[key] for key in keep if key in budget}}


def budget_defaults():
    """``SparsityBudget``'s own defaults (``modern_cnn.train_budget`` passes ``settle`` and ``schedule_power``)."""
    import inspect

    from keras_group_lasso import SparsityBudget

    parameters = inspect.signature(SparsityBudget).parameters
    return {name: parameters[name].default for name in ("settle", "schedule_power", "pace")}


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


def summary(title, args, measured):
    """The run in one line, for RESULTS.md's index: pruned vs dense in each runtime."""
    found = {(m["model"], m["weights"], m["runtime"]): m for m in measured}
    cells = []
    for weights, runtime in (("float", "ONNX Runtime"), ("float", "TFLite"), ("int8", "TFLite")):
        dense, pruned = found["dense", weights, runtime], found["pruned", weights, runtime]
        cells.append(f"{runtime} {weights}: {100 * pruned['accuracy']:.2f} % vs dense {100 * dense['accuracy']:.2f} %, "
                     f"file {dense['bytes'] / pruned['bytes']:.2f}x smaller, batch 1 "
                     f"{dense['ms_batch_1'] / pruned['ms_batch_1']:.2f}x and batch 256 "
                     f"{dense['ms_batch_256'] / pruned['ms_batch_256']:.2f}x faster")
    return (f"Deploying {title} ({args.train} training images, {args.epochs} epochs, "
            f"`SparsityBudget(max_flops={args.budget_flops:g})`), one thread: " + "; ".join(cells))


def main(argv=None):
    args = parse_args(argv)
    import keras

    from keras_group_lasso import export_pruned

    if keras.backend.backend() != "tensorflow":
        sys.exit("run this benchmark with KERAS_BACKEND=tensorflow (it trains with the TensorFlow backend)")
    cnn_fashion.CHANNELS, cnn_fashion.CONVS = tuple(args.channels), args.convs_per_stage
    cnn_fashion.set_threads(os.cpu_count())
    run = common.Run("deploy", args, seeds=[args.seed], output=args.output)
    # the output path relative to the repository, so the record does not name this machine's folders
    args.output = os.path.relpath(args.output, common.HERE.parent)
    if args.network == "vgg":
        data = cnn_fashion.load(quick=False, seed=args.seed)
        data["x_train"], data["y_train"] = data["x_train"][:args.train], data["y_train"][:args.train]
    else:  # 32x32: the images padded by 2 pixels
        data = modern_cnn.load(None, quick=False, train_size=args.train)
        data["x_test"], data["y_test"] = data["x_test"][:args.test], data["y_test"][:args.test]
    x_test, y_test = data["x_test"][:args.test].astype("float32"), data["y_test"][:args.test]
    dense, sparse, record = (train if args.network == "vgg" else train_modern)(data, args)
    representative = data["x_train"][:args.representative].astype("float32")

    rows, runners, files = [], {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, model, threshold in (("dense", dense, 0.0), ("pruned", sparse, modern_cnn.THRESHOLD
                                                                   if args.network != "vgg" else cnn_fashion.THRESHOLD)):
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
    sizes = ("layer sizes: dense " + "-".join(map(str, record["dense"]["manifest"]["layer_sizes_after"]))
             + ", pruned " + "-".join(map(str, record["pruned"]["manifest"]["layer_sizes_after"])))
    if args.network == "vgg":
        title = "the pruned VGG"
        setup = [(f"{args.train} training images, {args.epochs} epochs; "
                  f"SparsityBudget(max_flops={args.budget_flops:g}, settle={args.settle:g}), λ {args.budget_lambda:g}"),
                 sizes]
    else:
        title = f"the pruned {args.network} network (benchmarks/modern_cnn.py)"
        budget = record["budget"]
        folded = {name: len(record[name]["manifest"]["folded_batchnorms"]) for name in ("dense", "pruned")}
        norms = sum(isinstance(layer, keras.layers.BatchNormalization) for layer in dense.layers)
        setup = [f"{args.network}: {modern_cnn.describe(args.network)}",
                 (f"{args.train} training images (32x32), {args.epochs} epochs, batch {modern_cnn.BATCH}, "
                  f"Adam, cosine-decayed learning rate {modern_cnn.LEARNING_RATE:g}; pruned: "
                  f"SparsityBudget(max_flops={args.budget_flops:g}) with the library's defaults (settle "
                  f"{budget['settle']:.3g}, schedule_power {budget['schedule_power']:g}, pace "
                  f"{budget_defaults()['pace']}), λ {args.budget_lambda:g}"),
                 (f"multiply-adds per image: dense {budget['flops_before'] / 1e6:.2f} M, pruned "
                  f"{budget['flops_after'] / 1e6:.2f} M ({budget['flop_reduction']:.2f}x fewer); groups the budget "
                  f"cut per epoch: {budget['budget_cut_groups']}"),
                 sizes,
                 (f"BatchNormalization layers folded by fold_batchnorm: dense {folded['dense']}, pruned "
                  f"{folded['pruned']} of {norms}")]
        setup += [f"budget warning: {w}" for w in budget["warnings"]]
    run.publish(f"Deploying {title}: ONNX Runtime and TFLite, float and int8", table, measured, notes=setup + notes,
                section=False, summary=summary(title, args, measured),
                train={k: v for k, v in record.items() if k.endswith("seconds")},
                **({"budget": record["budget"]} if "budget" in record else {}), int8_error=int8,
                warnings={n: record[n]["warnings"] for n in ("dense", "pruned")})


if __name__ == "__main__":
    main()
