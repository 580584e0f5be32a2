"""Inference of a channel-pruned CNN vs its dense network, with and without BatchNormalization folded.

The network is ``benchmarks/cnn_fashion.py``'s (``--channels``, ``--convs-per-stage``,
``--units``); the channels each convolution keeps (``--keep``) are those a
trained run reported, set by hand here as ``benchmarks/inference.py`` does for
the MLP: the weakest filters (L1 norm) of a seeded network and every weight
reading them are zeroed, and ``prune_model(.., 0)`` removes them. Speed does not
depend on the trained values, only on the shapes, so no training is needed.
BatchNormalization gets random statistics (so folding is not a no-op).

Measured in one process, interleaved, best of ``--rounds`` rounds (and the
median), at batch 1 and 256, on the TensorFlow backend:

* ``SavedModel``: the dense network (``model.export``) vs the pruned one;
* ``SavedModel, BN folded``: both with each BatchNormalization merged into the
  convolution or Dense layer before it (``prune_model(.., fold_batchnorm=True)``,
  what ``export_pruned(.., fold_batchnorm=True)`` writes; the dense one with
  nothing removed), so the ratio is the pruning's alone;
* ``pruned, folded vs dense``: what a user exporting the pruned network with
  ``fold_batchnorm=True`` gets against a plain export of the dense one;
* ``round_to=8, BN folded``: the pruned network with every layer's channel
  count rounded up to a multiple of 8 (``prune_model(.., round_to=8)``: more
  multiply-adds, but channel counts the convolution kernels are made for);
* ``tf.function``: the Keras models called in a compiled function;
* ``TFLite, BN folded``: the folded SavedModels converted with
  ``tf.lite.TFLiteConverter`` (as ``export_pruned`` writes ``.tflite``), run by
  ``tf.lite.Interpreter`` with ``--threads`` threads;
* ``floor``: the same network pruned to one channel per convolution (BN
  folded, SavedModel and TFLite): the fastest any channel pruning of this
  network can run here, so the largest speed-up pruning can give it.

Reported next to the FLOP reduction: the issue asks for a batch-256 speed-up of
at least 0.6 x the FLOP ratio.

Usage::

    KERAS_BACKEND=tensorflow python benchmarks/cnn_inference.py --channels 16 32 64 --convs-per-stage 2 \\
        --keep 7 4 6 6 30 35 --output benchmarks/results/cnn_inference_vgg.md
    KERAS_BACKEND=tensorflow python benchmarks/cnn_inference.py --keep 8 16 --quick   # -> benchmarks/out/
"""

import os
import shutil
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import cnn_fashion, common  # noqa: E402

NAME = "cnn_inference"
QUICK = "3 rounds of >= 0.05 s per function; to benchmarks/out/"
BATCHES = (1, 256)
TARGET = 0.6
FOLDED = ("dense, BN folded", "pruned, BN folded", "floor, BN folded")
FLOOR_ROWS = ("floor: one channel per convolution, SavedModel, BN folded (both)",
              "floor: one channel per convolution, TFLite, BN folded (both)")


def tflite_calls(saved_model_path, threads):
    """``{batch: call}``: the SavedModel converted to TFLite, one interpreter per batch size."""
    import numpy as np
    import tensorflow as tf

    content = tf.lite.TFLiteConverter.from_saved_model(saved_model_path).convert()
    calls = {}
    for batch in BATCHES:
        interpreter = tf.lite.Interpreter(model_content=content, num_threads=threads)
        source = interpreter.get_input_details()[0]["index"]
        interpreter.resize_tensor_input(source, [batch, 28, 28, 1])
        interpreter.allocate_tensors()
        target = interpreter.get_output_details()[0]["index"]

        def call(x, interpreter=interpreter, source=source, target=target):
            interpreter.set_tensor(source, np.asarray(x))
            interpreter.invoke()
            return interpreter.get_tensor(target)

        calls[batch] = call
    return calls


def with_statistics(model, seed):
    """Random BatchNormalization statistics, so that folding changes the kernels."""
    import numpy as np

    import keras

    rng = np.random.default_rng(seed)
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            gamma, beta, mean, variance = layer.get_weights()
            layer.set_weights([rng.uniform(0.5, 1.5, gamma.shape), rng.normal(0, 0.1, beta.shape),
                               rng.normal(0, 0.1, mean.shape), rng.uniform(0.5, 1.5, variance.shape)])
    return model


def main(argv=None):
    parser = common.arguments(__doc__, quick=QUICK)
    parser.add_argument("--channels", type=common.positive_int, nargs="+", default=list(cnn_fashion.CHANNELS))
    parser.add_argument("--convs-per-stage", type=common.positive_int, default=cnn_fashion.CONVS)
    parser.add_argument("--units", type=common.positive_int, default=cnn_fashion.UNITS)
    parser.add_argument("--keep", type=common.positive_int, nargs="+", required=True,
                        help="channels each convolution keeps, in order")
    parser.add_argument("--rounds", type=common.positive_int, default=9)
    parser.add_argument("--min-time", type=float, default=0.2, help="seconds per round and function (default 0.2)")
    parser.add_argument("--threads", type=common.positive_int, default=2)
    parser.add_argument("--output", default=None,
                        help="Markdown result, the .json next to it (default benchmarks/results/cnn_inference.md; "
                        "benchmarks/out/ with --quick)")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.min_time = 3, 0.05
    cnn_fashion.CHANNELS = tuple(args.channels)
    cnn_fashion.CONVS = args.convs_per_stage
    cnn_fashion.UNITS = args.units
    counts = cnn_fashion.filter_counts()
    if len(args.keep) != len(counts) or any(k > n for k, n in zip(args.keep, counts)):
        parser.error(f"--keep takes one count per convolution, at most its filters {counts}; received {args.keep}")

    import keras
    import numpy as np

    if keras.backend.backend() != "tensorflow":
        parser.error(f"runs on the TensorFlow backend (SavedModel); KERAS_BACKEND is {keras.backend.backend()!r}")
    import tensorflow as tf

    from benchmarks.inference import saved_model_call, throughputs
    from keras_group_lasso import prune_model, sparsity_report

    cnn_fashion.set_threads(args.threads)
    run = common.Run(NAME, args, output=args.output)
    dense = with_statistics(cnn_fashion.build_cnn(0), 0)
    zeroed = cnn_fashion.remove_filters(dense, args.keep)
    models = {
        "dense": dense,
        "pruned": prune_model(zeroed, 0.0),
        "dense, BN folded": prune_model(dense, 0.0, fold_batchnorm=True),
        "pruned, BN folded": prune_model(zeroed, 0.0, fold_batchnorm=True),
        "pruned, round_to=8, BN folded": prune_model(zeroed, 0.0, round_to=8, fold_batchnorm=True),
        "floor, BN folded": prune_model(cnn_fashion.remove_filters(dense, [1] * len(counts)), 0.0,
                                        fold_batchnorm=True),
    }
    flops = {"dense": sparsity_report(dense, 0.0).flops_after, "pruned": sparsity_report(zeroed, 0.0).flops_after,
             "floor": sparsity_report(models["floor, BN folded"], 0.0).flops_after}
    ratio = flops["dense"] / flops["pruned"]
    x_all = np.random.default_rng(1).uniform(size=(max(BATCHES), 28, 28, 1)).astype("float32")
    want = {k: cnn_fashion.outputs(m, x_all) for k, m in models.items()}
    np.testing.assert_allclose(want["pruned"], cnn_fashion.outputs(zeroed, x_all), atol=1e-4)
    np.testing.assert_allclose(want["dense, BN folded"], want["dense"], atol=1e-4)
    np.testing.assert_allclose(want["pruned, BN folded"], want["pruned"], atol=1e-4)
    np.testing.assert_allclose(want["pruned, round_to=8, BN folded"], want["pruned"], atol=1e-4)
    np.testing.assert_allclose(want["floor, BN folded"], cnn_fashion.outputs(models["floor, BN folded"], x_all))

    workdir = tempfile.mkdtemp(prefix="cnn-inference-")
    try:
        saved, compiled, lite = {}, {}, {}
        for name, model in models.items():
            path = os.path.join(workdir, name.replace(", ", "_").replace(" ", "_"))
            model.export(path, format="tf_saved_model", verbose=False,
                         input_signature=[tf.TensorSpec([None, 28, 28, 1], tf.float32, name="features")])
            saved[name] = saved_model_call(path)
            np.testing.assert_allclose(saved[name](tf.constant(x_all)), want[name], atol=1e-4, err_msg=name)
            if name in FOLDED:
                lite[name] = tflite_calls(path, args.threads)
                for batch in BATCHES:
                    np.testing.assert_allclose(lite[name][batch](x_all[:batch]), want[name][:batch], atol=1e-3,
                                               err_msg=f"TFLite {name}")
            if "folded" not in name:  # (the floor is only timed as exported)
                fn = tf.function(lambda x, model=model: model(x, training=False))
                compiled[name] = lambda x, fn=fn: fn(x).numpy()
        rows = []
        for batch in BATCHES:
            x = tf.constant(x_all[:batch])
            rates = throughputs({**{f"SavedModel {k}": f for k, f in saved.items()},
                                 **{f"tf.function {k}": f for k, f in compiled.items()}}, x, args.rounds, args.min_time)
            rates.update(throughputs({f"TFLite {k}": f[batch] for k, f in lite.items()}, x_all[:batch], args.rounds,
                                     args.min_time))
            for label, dense_key, pruned_key in (
                ("SavedModel", "SavedModel dense", "SavedModel pruned"),
                ("SavedModel, BN folded (both)", "SavedModel dense, BN folded", "SavedModel pruned, BN folded"),
                ("pruned with BN folded vs plain dense (SavedModel)", "SavedModel dense",
                 "SavedModel pruned, BN folded"),
                ("round_to=8, BN folded (both)", "SavedModel dense, BN folded",
                 "SavedModel pruned, round_to=8, BN folded"),
                ("tf.function", "tf.function dense", "tf.function pruned"),
                ("TFLite, BN folded (both)", "TFLite dense, BN folded", "TFLite pruned, BN folded"),
                (FLOOR_ROWS[0], "SavedModel dense, BN folded", "SavedModel floor, BN folded"),
                (FLOOR_ROWS[1], "TFLite dense, BN folded", "TFLite floor, BN folded"),
            ):
                d, p = rates[dense_key], rates[pruned_key]
                rows.append({"path": label, "batch": batch, "dense": d, "pruned": p,
                             "flop_ratio": flops["dense"] / flops["floor" if label in FLOOR_ROWS else "pruned"]})
                common.say(f"batch {batch} {label}: dense {d[0]:,.0f}/s pruned {p[0]:,.0f}/s ({p[0] / d[0]:.2f}x)")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    header = ["path", "batch", "dense [samples/s]", "pruned [samples/s]", "pruned / dense (best)", "(median)",
              "best / FLOP reduction"]
    table = common.markdown_table(header, [
        [r["path"], str(r["batch"]), f"{r['dense'][0]:,.0f}", f"{r['pruned'][0]:,.0f}",
         f"{r['pruned'][0] / r['dense'][0]:.2f}x", f"{r['pruned'][1] / r['dense'][1]:.2f}x",
         f"{r['pruned'][0] / r['dense'][0] / r['flop_ratio']:.2f}"] for r in rows])
    verdict = [
        f"- batch 256, {r['path']}: {r['pruned'][0] / r['dense'][0]:.2f}x for {ratio:.2f}x fewer FLOPs "
        f"({r['pruned'][0] / r['dense'][0] / ratio:.2f} of the FLOP ratio; target >= {TARGET}): "
        f"{'met' if r['pruned'][0] / r['dense'][0] >= TARGET * ratio else 'NOT met'}."
        for r in rows if r["batch"] == 256 and r["path"].startswith(("SavedModel", "pruned", "TFLite"))]
    floor = {r["path"]: r["pruned"][0] / r["dense"][0] for r in rows if r["batch"] == 256 and r["path"] in FLOOR_ROWS}
    verdict.append(
        f"- The floor (batch 256): pruned to one channel per convolution ({flops['dense'] / flops['floor']:.0f}x "
        f"fewer FLOPs) this network runs {floor[FLOOR_ROWS[0]]:.2f}x (SavedModel) and {floor[FLOOR_ROWS[1]]:.2f}x "
        f"(TFLite) faster than dense, both BN folded: no channel pruning can speed it up more here. The target "
        f"at {ratio:.2f}x fewer FLOPs asks for {TARGET * ratio:.2f}x"
        f"{' (above the floor: out of reach for this network on this machine)' if TARGET * ratio > max(floor.values()) else ''}.")
    notes = [
        f"Network: {cnn_fashion.network_text()}; channels kept per convolution {args.keep} of {counts} "
        f"(set by hand, random weights); {flops['dense']:,} -> {flops['pruned']:,} multiply-adds per sample "
        f"({ratio:.2f}x fewer); {models['dense'].count_params():,} -> {models['pruned'].count_params():,} "
        "parameters.",
        f"TensorFlow backend, {args.threads} intra-op threads; best (and median) of {args.rounds} interleaved "
        f"rounds of >= {args.min_time:g} s per function; every path checked against the Keras model first.",
    ]
    run.publish("Channel-pruned CNN vs dense: inference, with and without BatchNormalization folded",
                table + "\n\n" + "\n".join(verdict), rows, notes=notes, section=False, keep=args.keep, filters=counts,
                flops=flops)
    return 0


if __name__ == "__main__":
    sys.exit(main())
