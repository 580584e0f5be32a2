"""Channel counts and CPU inference: ``prune_model`` with and without ``round_to``.

The network (random weights, no training) gets a sparsity pattern set by
hand, the rows of every layer that reads a removed channel being zero:

* ``--network resnet``: the ResNet of ``resnet_fashion.py``; in each of its
  three stages the inner convolution keeps ``--inner`` channels and the
  residual stream ``--stream`` channels. The defaults, for widths 8 16 32,
  are the live channels of the λ = 1e-3 network of
  ``benchmarks/results/resnet_fashion.md``.
* ``--network cnn``: the CNN of ``cnn_fashion.py`` (16 and 32 channels, a
  Dense(64) head); ``--live`` channels of conv1 and conv2 and units of the
  Dense layer (default 15 10 22: the λ = 3e-4 Proximal network of
  ``benchmarks/results/cnn_fashion.md``, seed 0, rounded).

Surgery keeps exactly the live channels (``round_to=1``) or a multiple of 8
or 16 of them.

Measured on TensorFlow, in one process and interleaved round by round: the
throughput (samples/s) of a ``tf.function`` of the Keras model and of its
SavedModel (``export_pruned`` / ``model.export``), at batch 1 and 256, as
ratios to the dense network (best round, median round, per CPU second),
next to each variant's FLOP reduction. Every variant's outputs are checked
against the exactly pruned model's.

Usage::

    KERAS_BACKEND=tensorflow python benchmarks/round_to.py        # -> benchmarks/results/round_to.md
    KERAS_BACKEND=tensorflow python benchmarks/round_to.py --channels 16 32 64 --stream 10 26 58 --inner 8 20 26
    KERAS_BACKEND=tensorflow python benchmarks/round_to.py --network cnn --out-name round_to_cnn
    KERAS_BACKEND=tensorflow python benchmarks/round_to.py --quick   # 1 round of >= 0.05 s -> benchmarks/out/
"""

import os
import shutil
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from benchmarks import common  # noqa: E402

NAME = "round_to"
QUICK = "1 interleaved round of >= 0.05 s per variant; -> benchmarks/out/"
THRESHOLD = 1e-3
ROUNDINGS = (1, 8, 16)


def sparse_resnet(channels, stream, inner, seed=0):
    """The ResNet of ``resnet_fashion.py`` with ``stream[i]`` / ``inner[i]`` live channels in stage ``i``."""
    from benchmarks.resnet_fashion import build_resnet

    model = build_resnet(seed, tuple(channels))
    readers = {1: ("s1_a", "s2_a", "s2_proj"), 2: ("s3_a", "s3_proj"), 3: ("logits",)}
    for stage in (1, 2, 3):
        zero_rows(model.get_layer(f"s{stage}_b"), inner[stage - 1])  # the inner convolution's dead channels
        for name in readers[stage]:  # stream channels that no layer reads
            zero_rows(model.get_layer(name), stream[stage - 1])
    return model


def sparse_cnn(live, seed=0):
    """The CNN of ``cnn_fashion.py`` with ``live`` channels of conv1 and conv2 and units of its Dense layer."""
    from benchmarks.cnn_fashion import build_cnn

    model = build_cnn(seed)
    zero_rows(model.get_layer("conv2"), live[0])
    dense = model.get_layer("dense")
    weights = dense.get_weights()
    channels = model.get_layer("conv2").filters
    weights[0][np.arange(weights[0].shape[0]) % channels >= live[1], :] = 0.0  # Flatten: row r is channel r % C
    dense.set_weights(weights)
    zero_rows(model.get_layer("logits"), live[2])
    return model


def zero_rows(layer, keep):
    weights = layer.get_weights()
    weights[0][..., keep:, :] = 0.0
    layer.set_weights(weights)


def main(argv=None):
    parser = common.arguments(__doc__, quick=QUICK)
    parser.add_argument("--network", choices=("resnet", "cnn"), default="resnet")
    parser.add_argument("--live", type=common.positive_int, nargs=3, default=[15, 10, 22],
                        metavar=("CONV1", "CONV2", "DENSE"), help="cnn: live channels and Dense units")
    parser.add_argument("--channels", type=common.positive_int, nargs=3, default=[8, 16, 32], metavar=("C1", "C2", "C3"))
    parser.add_argument("--stream", type=common.positive_int, nargs=3, default=[5, 13, 29],
                        help="live channels of each stage's residual stream")
    parser.add_argument("--inner", type=common.positive_int, nargs=3, default=[4, 10, 13],
                        help="live channels of each stage's inner convolution")
    parser.add_argument("--repeats", type=common.positive_int, default=9, help="interleaved rounds")
    parser.add_argument("--min-time", type=float, default=0.3, help="seconds per round and variant")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats, args.min_time = 1, 0.05
    for name in ("stream", "inner"):
        if any(k > c for k, c in zip(getattr(args, name), args.channels)):
            parser.error(f"--{name} {getattr(args, name)}: more channels than --channels {args.channels}")
    if any(k > c for k, c in zip(args.live, (16, 32, 64))):
        parser.error(f"--live {args.live}: the CNN has 16 and 32 channels and 64 Dense units")

    import keras

    if keras.backend.backend() != "tensorflow":
        raise SystemExit("round_to.py measures TensorFlow inference: run it with KERAS_BACKEND=tensorflow")
    import tensorflow as tf

    from benchmarks.inference import saved_model_call, throughputs
    from keras_group_lasso import export_pruned, prune_model

    run = common.Run(NAME, args, seeds=[0])
    if args.network == "resnet":
        from benchmarks.resnet_fashion import build_resnet

        dense, full = sparse_resnet(args.channels, args.stream, args.inner), build_resnet(0, tuple(args.channels))
        pattern = (f"the ResNet of `resnet_fashion.py`, widths {' '.join(map(str, args.channels))}, random weights; "
                   f"live channels per stage: stream {' '.join(map(str, args.stream))}, inner "
                   f"{' '.join(map(str, args.inner))}.")
    else:
        from benchmarks.cnn_fashion import build_cnn

        dense, full = sparse_cnn(args.live), build_cnn(0)
        pattern = (f"the CNN of `cnn_fashion.py` (conv 16, conv 32, Dense 64), random weights; live: "
                   f"{' '.join(map(str, args.live))}.")
    x = np.random.default_rng(0).normal(size=(256, 28, 28, 1)).astype("float32")
    # name -> (model pruned, threshold, round_to, fold_batchnorm); "dense": the model itself, all its weights
    variants = {"dense, fold_batchnorm": {"source": full, "threshold": 0.0, "round_to": 1, "fold": True}}
    sizes_seen = []
    for r in ROUNDINGS:
        small = prune_model(dense, THRESHOLD, round_to=r)
        if small.pruning_plan.layer_sizes_after in sizes_seen:
            continue  # the same network as a smaller rounding
        sizes_seen.append(small.pruning_plan.layer_sizes_after)
        for fold in (False, True):
            variants[f"round_to={r}" + (", fold_batchnorm" if fold else "")] = {
                "source": dense, "threshold": THRESHOLD, "round_to": r, "fold": fold}
    for v in variants.values():
        v["model"] = prune_model(v["source"], v["threshold"], round_to=v["round_to"], fold_batchnorm=v["fold"])
        v["sizes"] = v["model"].pruning_plan.layer_sizes_after
        v["flops"] = v["model"].pruning_report.flops_after
    flops_before = variants["round_to=1"]["model"].pruning_report.flops_before
    want = {id(m): keras.ops.convert_to_numpy(m(x, training=False)) for m in (dense, full)}
    want[id(dense)] = keras.ops.convert_to_numpy(variants["round_to=1"]["model"](x, training=False))

    workdir = tempfile.mkdtemp(prefix="round-to-")
    rows = []
    try:
        dense.export(os.path.join(workdir, "dense"), format="tf_saved_model", verbose=False,
                     input_signature=[tf.TensorSpec([None, 28, 28, 1], tf.float32, name="features")])
        paths = {"tf.function": {"dense": tf.function(lambda t: dense(t, training=False))},
                 "SavedModel": {"dense": saved_model_call(os.path.join(workdir, "dense"))}}
        for k, (name, v) in enumerate(variants.items()):
            folder = os.path.join(workdir, f"v{k}")
            export_pruned(v["source"], folder, threshold=v["threshold"], formats=("saved_model",),
                          round_to=v["round_to"], fold_batchnorm=v["fold"])
            paths["tf.function"][name] = tf.function(lambda t, m=v["model"]: m(t, training=False))
            paths["SavedModel"][name] = saved_model_call(os.path.join(folder, "saved_model"))
            reference = want[id(v["source"])]
            for fn in (paths["tf.function"][name], paths["SavedModel"][name]):
                got = np.asarray(fn(tf.constant(x)))
                np.testing.assert_allclose(got, reference, rtol=0, atol=1e-4 * max(1.0, float(np.abs(reference).max())))
        for batch in (1, 256):
            batch_x = tf.constant(x[:batch])
            for path, fns in paths.items():
                rates = throughputs(fns, batch_x, args.repeats, args.min_time)
                rows.append({"path": path, "batch": batch, "rates": rates})
                common.say(f"{path} batch {batch}: " + ", ".join(f"{k} {v[0]:,.0f}/s" for k, v in rates.items()))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    names = ["dense"] + list(variants)
    flops = dict({"dense": flops_before}, **{n: v["flops"] for n, v in variants.items()})
    columns = [(r["path"], r["batch"]) for r in rows]
    table = common.markdown_table(
        ["variant", "FLOP reduction"] + [f"{path} batch {batch}" for path, batch in columns],
        [[n, f"{flops_before / flops[n]:.2f}x"]
         + [(f"{r['rates'][n][0]:,.0f}/s" if n == "dense" else
             " / ".join(f"{r['rates'][n][k] / r['rates']['dense'][k]:.2f}x" for k in range(3))) for r in rows]
         for n in names])
    sizes = common.markdown_table(
        ["variant", "layer sizes (`pruning_plan.layer_sizes_after`)", "MACs/sample", "FLOP reduction"],
        [["dense", "–", f"{flops_before:,}", "1.00x"]]
        + [[n, ", ".join(map(str, v["sizes"])), f"{v['flops']:,}", f"{flops_before / v['flops']:.2f}x"]
           for n, v in variants.items() if "fold" not in n])
    notes = [
        f"Network: {pattern}",
        f"Throughput: {args.repeats} interleaved rounds of >= {args.min_time} s per variant; TensorFlow, "
        "`tf.function` without XLA and the SavedModel's `serving_default`. The dense row gives samples/s of the "
        "best round; the others their ratio to it: best round / median round / per CPU second. "
        "`fold_batchnorm`: `prune_model(..., fold_batchnorm=True)` (each BatchNormalization merged into the "
        "convolution before it); `dense, fold_batchnorm`: the same on the network with all its channels.",
    ]
    run.publish("Channel counts and CPU inference: `prune_model(..., round_to=N)`", sizes + "\n\n" + table, rows,
                notes=notes, section=False, flops_before=flops_before,
                variants={n: {"sizes": list(v["sizes"]), "flops": v["flops"], "round_to": v["round_to"],
                              "fold_batchnorm": v["fold"]} for n, v in variants.items()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
