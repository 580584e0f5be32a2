"""Fashion-MNIST ResNet: coupled channel groups (no fine-tuning) vs magnitude filter pruning + fine-tuning.

A small ResNet with BatchNormalization: a stem ``Conv(16)``, three stages of
one residual block each (16 channels at 28x28 with an identity shortcut, 32 at
14x14 and 64 at 7x7 with 1x1 projection shortcuts; ``--channels`` changes the
widths), global average pooling and a Dense output (logits). Rows:

* (a) dense: Adam with a cosine-decayed learning rate, the baseline.
* (b) group-sparse: ``add_group_sparsity(model, λ, penalty="group")`` -- every
  channel of a residual stream is one coupled group over all the layers that
  read it -- trained with ``Proximal(SGD(momentum))``, then ``prune_model``;
  no fine-tuning. One row per λ of the grid; with ``--budget-flops F`` each
  trains under ``SparsityBudget(max_flops=F)``, λ its starting strength.
* (c) peer: magnitude filter pruning of the dense network at the FLOPs of the
  best (b) row: in each block's inner convolution the filters with the
  smallest L1 norm go, and in each stream the channels whose filters (summed
  over the layers that make them) have the smallest L1 norm, the same fraction
  everywhere, as large as the budget allows; the weights reading the removed
  channels are set to 0 and ``prune_model(zeroed, 0)`` removes them; then the
  pruned model is fine-tuned with Adam.

λ is chosen on 5,000 held-out training images; test accuracy is reported.
Per row: accuracies, multiply-adds per sample (``sparsity_report``), live
channels of each stream, ``prune_model`` time, the largest difference between
the pruned model's logits and the thresholded original's; for the chosen λ,
inference of the pruned vs the dense model on TensorFlow (``tf.function`` and
the exported SavedModel, batch 1 and 256).

Usage:
    python benchmarks/resnet_fashion.py              # -> benchmarks/results/resnet_fashion.md and .json
    python benchmarks/resnet_fashion.py --quick      # 3,000 images, 1 epoch; -> benchmarks/out/
"""

import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import common  # noqa: E402

NAME = "resnet_fashion"
QUICK = "3,000 training images, 1 epoch (a smoke run); -> benchmarks/out/"
BATCH = 128
EPOCHS = 4
VALIDATION = 5000
ADAM_LR = 1e-3
SGD_LR = 0.05
MOMENTUM = 0.9
FINETUNE_LR = 3e-4
GRID = (1e-4, 3e-4)
THRESHOLD = 1e-3
TARGET_FLOPS = 5.0
TARGET_POINTS = 1.0
ROUND_TO = 8  # prune_model(..., round_to=8) in the inference table


def load(quick, seed=0):
    import numpy as np

    from keras_group_lasso.datasets import load_dataset

    data = load_dataset("fashion-mnist")
    x = data.x_train.reshape(-1, 28, 28, 1)
    order = np.random.default_rng(seed).permutation(len(x))
    n_val = 1000 if quick else VALIDATION
    val, train = order[:n_val], order[n_val:]
    x_test, y_test = data.x_test.reshape(-1, 28, 28, 1), data.y_test
    if quick:
        train = train[:3000]
        x_test, y_test = x_test[:2000], y_test[:2000]
    return {"x_train": x[train], "y_train": data.y_train[train], "x_val": x[val], "y_val": data.y_train[val],
            "x_test": x_test, "y_test": y_test}


CHANNELS = (16, 32, 64)


def build_resnet(seed, channels=CHANNELS):
    import keras
    from keras import layers as L

    keras.utils.set_random_seed(seed)

    def conv_bn(x, filters, stride=1, name=None):
        x = L.Conv2D(filters, 3, strides=stride, padding="same", use_bias=False, name=name)(x)
        return L.BatchNormalization(name=f"{name}_bn")(x)

    inputs = keras.Input((28, 28, 1), name="image")
    x = L.ReLU()(conv_bn(inputs, channels[0], name="stem"))
    for stage, (filters, stride) in enumerate(zip(channels, (1, 2, 2)), start=1):
        y = L.ReLU()(conv_bn(x, filters, stride, name=f"s{stage}_a"))
        y = conv_bn(y, filters, name=f"s{stage}_b")
        if stride == 1 and x.shape[-1] == filters:
            shortcut = x
        else:
            shortcut = L.Conv2D(filters, 1, strides=stride, use_bias=False, name=f"s{stage}_proj")(x)
            shortcut = L.BatchNormalization(name=f"s{stage}_proj_bn")(shortcut)
        x = L.ReLU(name=f"s{stage}_out")(L.Add(name=f"s{stage}_add")([shortcut, y]))
    x = L.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, L.Dense(10, name="logits")(x), name="resnet")


def compile_model(model, optimizer):
    import keras

    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], jit_compile=False)
    return model


def cosine(learning_rate, epochs, n_train):
    import keras

    return keras.optimizers.schedules.CosineDecay(learning_rate, decay_steps=epochs * -(-n_train // BATCH))


def fit(model, data, epochs, seed, label, callbacks=()):
    import keras

    def line(epoch, logs):
        common.say(f"  {label} epoch {epoch + 1}: loss {logs['loss']:.4f} acc {logs['accuracy']:.4f}")

    keras.utils.set_random_seed(seed + 1000)
    wall, cpu = time.perf_counter(), time.process_time()
    model.fit(data["x_train"], data["y_train"], batch_size=BATCH, epochs=epochs, shuffle=True, verbose=0,
              callbacks=[*callbacks, keras.callbacks.LambdaCallback(on_epoch_end=line)])
    return time.perf_counter() - wall, time.process_time() - cpu


def accuracy(model, x, y):
    import numpy as np

    return float(np.mean(np.argmax(model.predict(x, batch_size=1000, verbose=0), axis=1) == np.asarray(y)))


def thresholded(model, threshold):
    import keras

    from keras_group_lasso import apply_threshold

    copy = keras.models.clone_model(model)
    copy.set_weights(model.get_weights())
    apply_threshold(copy, threshold)
    return copy


def pruned_record(model, threshold, data, label):
    """Surgery and what it gives: FLOPs, parameters, streams, accuracy, exactness, surgery time."""
    import keras
    import numpy as np

    from keras_group_lasso import prune_model, sparsity_report

    report = sparsity_report(model, threshold)
    start = time.perf_counter()
    small = prune_model(model, threshold)
    surgery = time.perf_counter() - start
    x = data["x_test"][:1000]
    gap = float(np.max(np.abs(keras.ops.convert_to_numpy(small(x, training=False))
                              - keras.ops.convert_to_numpy(thresholded(model, threshold)(x, training=False)))))
    record = {
        "label": label,
        "val": accuracy(small, data["x_val"], data["y_val"]),
        "test": accuracy(small, data["x_test"], data["y_test"]),
        "flops_before": report.flops_before,
        "flops_after": report.flops_after,
        "params_after": int(small.count_params()),
        "streams": [(s.name, s.channels_alive, s.channels) for s in report.streams],
        "inner": [layer.units_alive for layer in report.layers if layer.name.endswith("_a")],
        "surgery_s": surgery,
        "gap": gap,
    }
    return record, small


def magnitude_prune(model, budget_flops):
    """Zero the reading weights of the smallest-L1 filters (coupled stream channels by their summed norm)."""
    import numpy as np

    from keras_group_lasso import coupled_groups, sparsity_report

    def filters_l1(layer):
        kernel = np.abs(layer.get_weights()[0])
        return kernel.reshape(-1, kernel.shape[-1]).sum(axis=0)

    groups = coupled_groups(model)  # stream channels and their readers
    inner = [layer for layer in model.layers if layer.name.endswith("_a")]

    def zeroed(fraction):
        copy = build_like(model)
        removed = {}  # layer name -> rows (input channels) to zero
        # inner channels: s*_a's filters, read by s*_b
        for layer in inner:
            scores = filters_l1(layer)
            k = int(np.floor(fraction * scores.size))
            removed.setdefault(layer.name.replace("_a", "_b"), []).extend(np.argsort(scores)[:k].tolist())
        # streams: one score per coupled unit, the L1 of the filters that make it (its readers' rows go)
        by_stream = {}
        for group in groups:
            readers = tuple(sorted({name for name, _ in group.readers}))
            by_stream.setdefault(readers, []).append(group)
        for readers, members in by_stream.items():
            scores = np.array([sum(np.abs(copy.get_layer(name).get_weights()[0][..., i, :]).sum()
                                   for name, i in g.readers) for g in members])
            k = int(np.floor(fraction * len(members)))
            for g in [members[j] for j in np.argsort(scores)[:k]]:
                for name, i in g.readers:
                    removed.setdefault(name, []).append(i)
        for name, rows in removed.items():
            weights = copy.get_layer(name).get_weights()
            weights[0][..., sorted(set(rows)), :] = 0.0
            copy.get_layer(name).set_weights(weights)
        return copy

    best = None
    for step in range(0, 20):
        fraction = step / 20
        candidate = zeroed(fraction)
        if sparsity_report(candidate, 0.0).flops_after <= budget_flops:
            return candidate, fraction
        best = candidate
    return best, 0.95


def build_like(model):
    import keras

    copy = keras.models.clone_model(model)
    copy.set_weights(model.get_weights())
    return copy


def inference(dense, sparse, x, repeats=7, min_time=0.2):
    """Pruned vs dense throughput on TensorFlow: a ``tf.function`` and the exported SavedModel, batch 1 and 256.

    Pruned twice: with the live channels only, and with ``round_to=ROUND_TO``.
    The pruned SavedModels are what ``export_pruned`` writes, the dense one
    ``model.export``. Returns ``{"rows": [{path, batch, dense, pruned, rounded}],
    "pruned_sizes", "rounded_sizes", "rounded_flops"}`` (``(best, median, per CPU
    second)`` samples/s each), or ``None`` on another backend.
    """
    import os
    import shutil
    import tempfile

    import keras
    import numpy as np

    if keras.backend.backend() != "tensorflow":
        return None
    import tensorflow as tf

    from benchmarks.inference import saved_model_call, throughputs
    from keras_group_lasso import export_pruned, prune_model

    small = prune_model(sparse, THRESHOLD)
    rounded = prune_model(sparse, THRESHOLD, round_to=ROUND_TO)
    workdir = tempfile.mkdtemp(prefix="resnet-inference-")
    try:
        export_pruned(sparse, os.path.join(workdir, "pruned"), threshold=THRESHOLD, formats=("saved_model",))
        export_pruned(sparse, os.path.join(workdir, "rounded"), threshold=THRESHOLD, formats=("saved_model",),
                      round_to=ROUND_TO)
        dense.export(os.path.join(workdir, "dense"), format="tf_saved_model", verbose=False,
                     input_signature=[tf.TensorSpec([None, 28, 28, 1], tf.float32, name="features")])
        paths = {
            "tf.function": {name: tf.function(lambda t, m=m: m(t, training=False))
                            for name, m in (("dense", dense), ("pruned", small), ("rounded", rounded))},
            "SavedModel": {name: saved_model_call(os.path.join(workdir, *parts)) for name, parts in
                           (("dense", ("dense",)), ("pruned", ("pruned", "saved_model")),
                            ("rounded", ("rounded", "saved_model")))},
        }
        want = keras.ops.convert_to_numpy(small(x[:256], training=False))
        for name in ("pruned", "rounded"):
            np.testing.assert_allclose(np.asarray(paths["SavedModel"][name](tf.constant(x[:256]))), want, atol=1e-4)
        rows = []
        for batch in (1, 256):
            batch_x = tf.constant(x[:batch])
            for name, fns in paths.items():
                rates = throughputs(fns, batch_x, repeats, min_time)
                rows.append(dict(rates, path=name, batch=batch))
                common.say(f"  inference {name} batch {batch}: "
                           + ", ".join(f"{k} {v[0]:,.0f}/s" for k, v in rates.items()))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return {"rows": rows, "pruned_sizes": list(small.pruning_plan.layer_sizes_after),
            "rounded_sizes": list(rounded.pruning_plan.layer_sizes_after),
            "rounded_flops": rounded.pruning_report.flops_after}


def main(argv=None):
    parser = common.arguments(__doc__, quick=QUICK)
    parser.add_argument("--epochs", type=common.positive_int, default=None, help=f"training epochs (default {EPOCHS})")
    parser.add_argument("--finetune-epochs", type=common.positive_int, default=2, help="peer fine-tuning epochs")
    parser.add_argument("--lambdas", type=float, nargs="+", default=list(GRID), help="group strengths λ")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--channels", type=common.positive_int, nargs=3, default=list(CHANNELS),
                        metavar=("C1", "C2", "C3"), help="channels of the three stages (default 16 32 64)")
    parser.add_argument("--group-weight", choices=("size", "flops"), default="size",
                        help="add_group_sparsity's group_weight: sqrt(|g|) (the paper's) or each unit's multiply-adds")
    parser.add_argument("--budget-flops", type=float, default=None, metavar="FRACTION",
                        help="train each λ under SparsityBudget(max_flops=FRACTION): λ is then the starting strength")
    parser.add_argument("--budget-schedule-power", type=float, default=1.0,
                        help="SparsityBudget's schedule_power (default 1)")
    args = parser.parse_args(argv)
    import keras

    from keras_group_lasso import Proximal, SparsityBudget, add_group_sparsity, sparsity_report

    epochs = args.epochs or (1 if args.quick else EPOCHS)
    run = common.Run(NAME, args, seeds=[args.seed])
    data = load(args.quick, args.seed)
    n_train = len(data["x_train"])

    common.say("dense")
    channels = tuple(args.channels)
    dense = compile_model(build_resnet(args.seed, channels),
                          keras.optimizers.Adam(cosine(ADAM_LR, epochs, n_train)))
    dense_time = fit(dense, data, epochs, args.seed, "dense")
    dense_val = accuracy(dense, data["x_val"], data["y_val"])
    dense_test = accuracy(dense, data["x_test"], data["y_test"])
    dense_record, _ = pruned_record(dense, 0.0, data, "dense")

    sparse, models, collapsed = [], {}, []
    for lam in args.lambdas:
        common.say(f"proximal λ={lam}")
        model = add_group_sparsity(build_resnet(args.seed, channels), lam, penalty="group",
                                   group_weight=args.group_weight)
        compile_model(model, Proximal(keras.optimizers.SGD(cosine(SGD_LR, epochs, n_train), momentum=MOMENTUM)))
        budget = [SparsityBudget(max_flops=args.budget_flops, threshold=THRESHOLD,
                                 schedule_power=args.budget_schedule_power)] if args.budget_flops else []
        seconds = fit(model, data, epochs, args.seed, f"λ={lam}", callbacks=budget)
        if not sparsity_report(model, THRESHOLD).flops_after:  # every kernel weight went: a constant output
            collapsed.append(lam)
            common.say(f"  λ={lam}: every kernel weight is 0, the output is a constant; no row")
            continue
        power = "" if args.budget_schedule_power == 1.0 else f", schedule_power={args.budget_schedule_power:g}"
        label = f"proximal λ={lam}" + (f" + SparsityBudget(max_flops={args.budget_flops:g}{power})" if budget else "")
        record, _ = pruned_record(model, THRESHOLD, data, label)
        if budget:
            record["budget_cut"] = [int(v) for v in model.history.history.get("budget_cut", [])]
        record.update(lam=lam, train_s=seconds)
        sparse.append(record)
        models[lam] = model
    if not sparse:
        raise SystemExit(f"resnet_fashion.py: every λ of {args.lambdas} zeroed the whole network; try smaller ones")
    # λ: the largest of the grid whose validation accuracy is within 1 point of the dense network's
    within = [r for r in sparse if r["val"] >= dense_val - 0.01]
    chosen = max(within, key=lambda r: r["lam"]) if within else min(sparse, key=lambda r: r["lam"])
    common.say(f"inference of the chosen row (λ={chosen['lam']}) against the dense network")
    speed = inference(dense, models[chosen["lam"]], data["x_test"])

    common.say("magnitude filter pruning at the chosen row's FLOPs")
    zeroed, fraction = magnitude_prune(dense, chosen["flops_after"])
    peer, peer_small = pruned_record(zeroed, 0.0, data, "magnitude, right after pruning")
    compile_model(peer_small, keras.optimizers.Adam(FINETUNE_LR))
    tune_time = fit(peer_small, data, args.finetune_epochs, args.seed, "fine-tune")
    peer_tuned = dict(peer, label=f"magnitude + {args.finetune_epochs} epochs fine-tuning",
                      val=accuracy(peer_small, data["x_val"], data["y_val"]),
                      test=accuracy(peer_small, data["x_test"], data["y_test"]), train_s=tune_time)

    rows = []
    for r in [dict(dense_record, val=dense_val, test=dense_test, train_s=dense_time)] + sparse + [peer, peer_tuned]:
        ratio = r["flops_before"] / max(r["flops_after"], 1)
        streams = ", ".join(f"{a}/{c}" for _, a, c in r["streams"])
        rows.append([
            r["label"], f"{100 * r['val']:.2f}", f"{100 * r['test']:.2f}", f"{100 * (r['test'] - dense_test):+.2f}",
            f"{r['flops_after']:,}", f"{ratio:.2f}x", f"{r['params_after']:,}", streams,
            "-".join(map(str, r["inner"])),
            f"{r['train_s'][0]:.0f} / {r['train_s'][1]:.0f}" if r.get("train_s") else "–",
            f"{1000 * r['surgery_s']:.0f}", f"{r['gap']:.1e}",
        ])
    table = common.markdown_table(
        ["row", "val. acc. [%]", "test acc. [%]", "Δ test vs dense [points]", "MACs/sample after",
         "FLOP reduction", "params after", "live channels per stream", "inner channels per block",
         "train [s] (wall / CPU)", "surgery [ms]", "max |pruned - thresholded|"], rows)
    ratio = chosen["flops_before"] / max(chosen["flops_after"], 1)
    met = ratio >= TARGET_FLOPS and dense_test - chosen["test"] <= TARGET_POINTS / 100
    notes = [
        f"Network: stem Conv({channels[0]})-BN-ReLU; blocks of {channels[0]} (identity shortcut), {channels[1]} "
        f"and {channels[2]} channels (stride 2, 1x1 projection + BN); GAP; Dense(10). "
        f"{dense_record['flops_before']:,} multiply-adds per sample.",
        f"Data: {n_train:,} training images, {len(data['x_val']):,} held out for λ, {len(data['y_test']):,} test "
        f"images; batch {BATCH}, {epochs} epochs, cosine learning rates; Adam {ADAM_LR} (dense), "
        f"Proximal(SGD({SGD_LR}, momentum {MOMENTUM})) (group-sparse), threshold {THRESHOLD}; "
        f"`group_weight=\"{args.group_weight}\"`."
        + (f" Each λ row trains under `SparsityBudget(max_flops={args.budget_flops:g}, threshold={THRESHOLD}, "
           f"schedule_power={args.budget_schedule_power:g})`: "
           "λ is the strength it starts from." if args.budget_flops else ""),
        f"Peer: {fraction:.0%} of the filters of every inner convolution and of the channels of every stream "
        f"(smallest L1), fine-tuned with Adam {FINETUNE_LR}.",
        "Inference (TensorFlow only): the chosen row's pruned model against the dense one, a `tf.function` and "
        "the SavedModel (`export_pruned` / `model.export`), at batch 1 and 256; 7 interleaved rounds of >= 0.2 s, "
        "samples per second of the best round, the median round and per CPU second.",
    ]
    verdict = (f"Target (at least {TARGET_FLOPS:.0f}x fewer FLOPs at most {TARGET_POINTS:.0f} point below the "
               f"dense test accuracy, no fine-tuning): chosen λ={chosen['lam']} gives {ratio:.2f}x at "
               f"{100 * (chosen['test'] - dense_test):+.2f} points: {'met' if met else 'NOT met'}.")
    text = table + "\n\n" + verdict + "\n"
    if collapsed:
        text += (f"\nNo row for λ = {', '.join(f'{lam:g}' for lam in collapsed)}: training set every kernel weight "
                 "to 0 (the output is a constant, there is nothing to prune to).\n")
    if speed:
        inference_rows = [
            [r["path"], str(r["batch"]), f"{r['dense'][0]:,.0f}"]
            + [cell for name in ("pruned", "rounded") for cell in (
                f"{r[name][0]:,.0f}", f"{r[name][0] / r['dense'][0]:.2f}x", f"{r[name][1] / r['dense'][1]:.2f}x",
                f"{r[name][2] / r['dense'][2]:.2f}x")]
            for r in speed["rows"]
        ]
        rounded_ratio = chosen["flops_before"] / max(speed["rounded_flops"], 1)
        text += (f"\n## Inference of the chosen row (λ={chosen['lam']}) against the dense network\n\n"
                 f"`pruned`: `prune_model` ({ratio:.2f}x fewer FLOPs, live channels "
                 f"{speed['pruned_sizes']}); `round_to={ROUND_TO}`: `prune_model(..., round_to={ROUND_TO})` "
                 f"({rounded_ratio:.2f}x fewer FLOPs, channels {speed['rounded_sizes']}). Ratios to dense: "
                 "best round, median round, per CPU second.\n\n" + common.markdown_table(
                     ["path", "batch", "dense [samples/s]", "pruned [samples/s]", "pruned / dense (best)",
                      "(median)", "(per CPU s)", f"round_to={ROUND_TO} [samples/s]", "/ dense (best)", "(median)",
                      "(per CPU s)"], inference_rows) + "\n")
    run.publish("Fashion-MNIST ResNet: coupled channel groups vs magnitude filter pruning", text, sparse, notes=notes,
                section=False, dense=dense_record, peer=[peer, peer_tuned], chosen=chosen["lam"],
                dense_test=dense_test, dense_val=dense_val, inference=speed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
