"""Fashion-MNIST, MobileNetV2- and EfficientNet-B0-style networks: a FLOP budget in one training vs magnitude pruning.

Two compact networks for 32x32x1 inputs (Fashion-MNIST's 28x28 images padded
with 2 zero pixels on each side), built from inverted residual blocks (a 1x1
expansion convolution, a depthwise convolution, a 1x1 projection, each with
BatchNormalization; a residual ``Add`` where the block keeps its width and
resolution), a 1x1 head convolution, global average pooling and a Dense(10)
(logits):

* ``mobilenetv2``: MobileNetV2-style, ReLU6, 3x3 depthwise kernels; stem 16,
  stages (expansion, channels, blocks, stride) (1, 8, 1, 1), (6, 16, 2, 2),
  (6, 24, 2, 2), (6, 48, 3, 2), (6, 64, 2, 1), head 256.
* ``efficientnet``: EfficientNet-B0-style, swish, 3x3 and 5x5 depthwise
  kernels and a squeeze-excite gate in every block (global average pooling
  with ``keepdims``, a 1x1 convolution to a quarter of the block's input
  channels with swish, a 1x1 convolution back with a sigmoid, ``Multiply``);
  stem 16, stages (1, 8, 1, 1, k3), (6, 16, 2, 2, k3), (6, 24, 2, 2, k5),
  (6, 40, 2, 2, k3), (6, 56, 2, 1, k5), head 256.

Rows, per network and seed (trained on the 60,000 training images, the
10,000 test images reported):

* dense: Adam with a cosine-decayed learning rate, the baseline.
* budget: ``add_group_sparsity(model, λ, penalty="group", input_factor=0,
  group_weight="flops")`` (every channel's group weighted by the
  multiply-adds of its unit; the stem reads one grey channel, which cannot
  go) trained with ``Proximal(Adam)`` (the same learning rate schedule) under
  ``SparsityBudget(max_flops=0.25)`` (a fraction of the dense network's
  multiply-adds per sample, λ its starting strength), then ``prune_model``;
  no fine-tuning.
* budget+ft (``--budget-finetune T``): the budget row trains ``EPOCHS - T``
  epochs instead, then its pruned model T epochs of Adam: the peers' recipe
  of a fine-tuning tail in the same total epochs as dense.
* scratch (``--scratch``): the budget's pruned network, its weights drawn
  afresh, trained dense as long as the dense row: whether the accuracy lost
  is the structure's capacity or the training that found it; with the
  magnitude rows, "uniform scratch": their uniformly narrowed network (the
  same fraction of every layer, the same FLOPs) trained the same way.
* magnitude: magnitude filter pruning (Li et al. 2017) of the dense network
  at the budget row's FLOPs: the filters of every convolution that makes
  channels are scored by their L1 norm (a channel that several layers make,
  a residual stream's or a squeeze-excite gate's, by the sum over them), and
  in every such layer (every set of layers making the same channels) the same
  fraction with the smallest scores goes, the smallest fraction whose FLOPs
  fit; the weights that read the removed channels are set to 0 and
  ``prune_model(.., 0)`` removes exactly them. Accuracy right after pruning
  (no fine-tuning) and after ``--finetune-epochs`` epochs of Adam.

Per row: test accuracy and its difference to dense in points, multiply-adds
per sample (``sparsity_report(..).flops_after``) and the reduction,
parameters of the pruned model, ``prune_model`` wall time (first call), and
the largest absolute difference between the pruned model's logits and the
thresholded model's (``apply_threshold`` on a copy) on 1,000 test images,
relative to the largest logit. The claim checked: the budget row has at least
4x fewer FLOPs and at most 1 point lower test accuracy than dense, no
fine-tuning, and its surgery is exact.

Nothing here imports TensorFlow or uses ``tf.data`` (the result says whether
TensorFlow was imported by the end of the first training: Keras probes for it
where it is installed; the results' machine line then imports it, where
installed, for its version).

Usage:
    KERAS_BACKEND=jax python benchmarks/modern_cnn.py                 # benchmarks/results/modern_cnn.json and .md
    KERAS_BACKEND=jax python benchmarks/modern_cnn.py --out DIR       # DIR/modern_cnn.json and .md (default $OUT)
    KERAS_BACKEND=jax python benchmarks/modern_cnn.py --quick --out DIR   # 1,024 images, 1 epoch (a CPU test)
    KERAS_BACKEND=jax python benchmarks/modern_cnn.py --data-dir DIR --networks efficientnet --seeds 2
    OUT=DIR DATA=DIR bash benchmarks/modern_cnn_seeds.sh   # --defaults, one process per network and seed
    python benchmarks/modern_cnn.py --merge DIR/*.json --out benchmarks/results --name NAME   # one table

``--data-dir`` is a folder holding the four Fashion-MNIST IDX files
(``train-images-idx3-ubyte.gz``, ...); without it the package's dataset
search is used.
"""

import contextlib
import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import common
from benchmarks.common import say

NAME = "modern_cnn"
TITLE = "MobileNetV2- and EfficientNet-B0-style networks on Fashion-MNIST: FLOP budget vs magnitude pruning"
NETWORKS = ("mobilenetv2", "efficientnet")
THRESHOLD = 1e-3
BATCH = 256
EPOCHS = 6
FINETUNE_EPOCHS = 2
LEARNING_RATE = 2e-3
FINETUNE_LR = 3e-4
LAMBDA = 3e-4
MAX_FLOPS = 0.25
GAP_IMAGES = 1000
TARGET_FLOPS = 4.0
TARGET_POINTS = 1.0

# (expansion, output channels, blocks, first stride, depthwise kernel) per stage
SPECS = {
    "mobilenetv2": {"stem": 16, "act": "relu6", "se": 0.0, "head": 256,
                    "stages": ((1, 8, 1, 1, 3), (6, 16, 2, 2, 3), (6, 24, 2, 2, 3), (6, 48, 3, 2, 3),
                               (6, 64, 2, 1, 3))},
    "efficientnet": {"stem": 16, "act": "swish", "se": 0.25, "head": 256,
                     "stages": ((1, 8, 1, 1, 3), (6, 16, 2, 2, 3), (6, 24, 2, 2, 5), (6, 40, 2, 2, 3),
                                (6, 56, 2, 1, 5))},
}


# ----------------------------------------------------------------------------- data


def load(data_dir, quick, train_size=None):
    """``(n, 32, 32, 1)`` float32 images in [0, 1] (28x28 padded by 2 zero pixels) and int labels."""
    import numpy as np

    from keras_group_lasso.datasets import load_dataset

    data = load_dataset("fashion-mnist", path=data_dir)

    def images(x):
        x = np.asarray(x, dtype=np.float32).reshape(-1, 28, 28, 1)
        return np.pad(x, ((0, 0), (2, 2), (2, 2), (0, 0)))

    x_train, y_train, x_test, y_test = data.x_train, data.y_train, data.x_test, data.y_test
    if quick:
        order = np.random.default_rng(0).permutation(len(x_train))[:1024]
        x_train, y_train = x_train[order], y_train[order]
        x_test, y_test = x_test[:256], y_test[:256]
    elif train_size:
        x_train, y_train = x_train[:train_size], y_train[:train_size]
    return {"x_train": images(x_train), "y_train": np.asarray(y_train), "x_test": images(x_test),
            "y_test": np.asarray(y_test)}


# ----------------------------------------------------------------------------- networks


def _activation(x, kind, name):
    from keras import layers

    if kind == "relu6":
        return layers.ReLU(6.0, name=name)(x)
    return layers.Activation("swish", name=name)(x)


def _block(x, expansion, channels, stride, kernel, act, se, name):
    """Inverted residual block (MobileNetV2 / EfficientNet's MBConv), with a squeeze-excite gate when ``se`` > 0."""
    from keras import layers

    width = x.shape[-1]
    h = x
    if expansion != 1:
        h = layers.Conv2D(width * expansion, 1, use_bias=False, name=f"{name}_expand")(h)
        h = layers.BatchNormalization(name=f"{name}_expand_bn")(h)
        h = _activation(h, act, f"{name}_expand_act")
    h = layers.DepthwiseConv2D(kernel, strides=stride, padding="same", use_bias=False, name=f"{name}_dw")(h)
    h = layers.BatchNormalization(name=f"{name}_dw_bn")(h)
    h = _activation(h, act, f"{name}_dw_act")
    if se:
        s = layers.GlobalAveragePooling2D(keepdims=True, name=f"{name}_se_squeeze")(h)
        s = layers.Conv2D(max(1, int(width * se)), 1, activation="swish", name=f"{name}_se_reduce")(s)
        s = layers.Conv2D(h.shape[-1], 1, activation="sigmoid", name=f"{name}_se_expand")(s)
        h = layers.Multiply(name=f"{name}_se_excite")([h, s])
    h = layers.Conv2D(channels, 1, use_bias=False, name=f"{name}_project")(h)
    h = layers.BatchNormalization(name=f"{name}_project_bn")(h)
    if stride == 1 and width == channels:
        h = layers.Add(name=f"{name}_add")([x, h])
    return h


def scaled(network, width=1.0):
    """``SPECS[network]`` with the stem's, every stage's and the head's channels times ``width`` (MobileNet's width
    multiplier; at least 4 channels each)."""
    spec = dict(SPECS[network])
    if width != 1.0:
        def times(c):
            return max(4, round(c * width))

        spec.update(stem=times(spec["stem"]), head=times(spec["head"]),
                    stages=tuple((t, times(c), n, s, k) for t, c, n, s, k in spec["stages"]))
    return spec


def build(network, seed, width=1.0):
    """The dense network (a functional ``keras.Model``), seeded; ``width`` scales its channels (``scaled``)."""
    import keras
    from keras import layers

    spec = scaled(network, width)
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((32, 32, 1), name="image")
    x = layers.Conv2D(spec["stem"], 3, padding="same", use_bias=False, name="stem")(inputs)
    x = layers.BatchNormalization(name="stem_bn")(x)
    x = _activation(x, spec["act"], "stem_act")
    k = 0
    for expansion, channels, blocks, stride, kernel in spec["stages"]:
        for i in range(blocks):
            k += 1
            x = _block(x, expansion, channels, stride if i == 0 else 1, kernel, spec["act"], spec["se"], f"block{k}")
    x = layers.Conv2D(spec["head"], 1, use_bias=False, name="head")(x)
    x = layers.BatchNormalization(name="head_bn")(x)
    x = _activation(x, spec["act"], "head_act")
    x = layers.GlobalAveragePooling2D(name="pool")(x)
    x = layers.Dropout(0.2, name="dropout")(x)
    outputs = layers.Dense(10, name="logits")(x)
    return keras.Model(inputs, outputs, name=network)


def describe(network, width=1.0):
    spec = scaled(network, width)
    stages = ", ".join(f"(t{t}, {c}, x{n}, s{s}, k{k})" for t, c, n, s, k in spec["stages"])
    se = f", squeeze-excite {spec['se']:g}" if spec["se"] else ""
    return f"stem {spec['stem']}, {spec['act']}{se}, stages (expansion, channels, blocks, stride, kernel) {stages}, head {spec['head']}"


# ----------------------------------------------------------------------------- training


def cosine(learning_rate, epochs, n_train):
    import keras

    steps = max(1, epochs * -(-n_train // BATCH))
    return keras.optimizers.schedules.CosineDecay(learning_rate, decay_steps=steps)


def compile_model(model, optimizer, jit=True):
    """Compiled with ``jit_compile=jit`` (TensorFlow's XLA on CPU trains these depthwise networks far slower)."""
    import keras

    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], jit_compile=jit)
    return model


def fit(model, data, epochs, seed, label, callbacks=()):
    """Train; returns (wall seconds, seconds of each epoch)."""
    import keras

    stamps = []

    def line(epoch, logs):
        stamps.append(time.perf_counter())
        logs = logs or {}
        budget = ""
        if "budget_phase" in logs:  # the budget writes its logs before this callback runs
            size = (f"latency {1e3 * logs['budget_latency']:.2f} ms" if "budget_latency" in logs
                    else f"flops {int(logs.get('budget_flops', -1)):,}")
            budget = (f", {size} over {logs['budget_over']:.2f} "
                      f"multiplier {logs['budget_multiplier_hidden']:.3g} phase {int(logs['budget_phase'])} "
                      f"cut {int(logs['budget_cut'])}")
        say(f"  {label} epoch {epoch + 1}: loss {logs.get('loss', float('nan')):.4f} "
            f"acc {logs.get('accuracy', float('nan')):.4f} ({stamps[-1] - (stamps[-2] if len(stamps) > 1 else start):.1f} s)"
            f"{budget}")

    keras.utils.set_random_seed(seed + 1000)  # the shuffling of each epoch
    start = time.perf_counter()
    model.fit(data["x_train"], data["y_train"], batch_size=BATCH, epochs=epochs, shuffle=True, verbose=0,
              callbacks=[*callbacks, keras.callbacks.LambdaCallback(on_epoch_end=line)])
    wall = time.perf_counter() - start
    return wall, [b - a for a, b in zip([start] + stamps[:-1], stamps)]


def logits(model, x):
    import keras
    import numpy as np

    return np.asarray(keras.ops.convert_to_numpy(model(x, training=False)), dtype=np.float64)


def accuracy(model, data):
    import numpy as np

    predictions = model.predict(data["x_test"], batch_size=1000, verbose=0)
    return float(np.mean(np.argmax(predictions, axis=1) == data["y_test"]))


def full_float32():
    """Full float32 matrix products and convolutions on JAX (GPUs default to TF32); nothing elsewhere."""

    import keras

    if keras.backend.backend() == "jax":
        import jax

        return jax.default_matmul_precision("float32")
    return contextlib.nullcontext()


def copy_of(model):
    import keras

    copy = keras.models.clone_model(model)
    copy.set_weights(model.get_weights())
    return copy


def surgery(model, threshold, data):
    """``prune_model`` and what it gives: the pruned model and a record (FLOPs, params, exactness, time)."""
    import numpy as np

    from keras_group_lasso import apply_threshold, prune_model, sparsity_report

    report = sparsity_report(model, threshold)
    start = time.perf_counter()
    small = prune_model(model, threshold)
    seconds = time.perf_counter() - start
    start = time.perf_counter()
    prune_model(model, threshold)
    second = time.perf_counter() - start
    reference = copy_of(model)
    apply_threshold(reference, threshold)
    x = data["x_test"][:GAP_IMAGES]
    with full_float32():
        want = logits(reference, x)
        gap = float(np.max(np.abs(logits(small, x) - want)))
    default_gap = float(np.max(np.abs(logits(small, x) - logits(reference, x))))
    scale = float(np.max(np.abs(want)))
    return small, {
        "flops_before": int(report.flops_before), "flops_after": int(report.flops_after),
        "flop_reduction": report.flops_before / max(report.flops_after, 1),
        "params_after": int(small.count_params()),
        "live_units": int(sum(layer.units_alive for layer in report.layers if not layer.is_output)),
        "units": int(sum(layer.units for layer in report.layers if not layer.is_output)),
        "streams": [[s.name, int(s.channels_alive), int(s.channels)] for s in report.streams],
        "surgery_seconds": seconds, "surgery_seconds_second": second,
        "max_abs_diff": gap, "output_scale": scale, "relative_diff": gap / max(scale, 1e-30),
        "relative_diff_default_precision": default_gap / max(scale, 1e-30),
    }


def train_dense(network, seed, data, epochs, lr, jit=True, width=1.0):
    import keras

    from keras_group_lasso import sparsity_report

    model = compile_model(build(network, seed, width), keras.optimizers.Adam(cosine(lr, epochs, len(data["x_train"]))), jit)
    wall, epoch_seconds = fit(model, data, epochs, seed, f"{network} dense seed {seed}")
    report = sparsity_report(model, THRESHOLD)
    return model, {
        "row": "dense", "network": network, "seed": seed, "epochs": epochs,
        "test_accuracy": accuracy(model, data),
        "flops_before": int(report.flops_before), "flops_after": int(report.flops_before), "flop_reduction": 1.0,
        "params": int(model.count_params()), "params_after": int(model.count_params()),
        "train_seconds": wall, "epoch_seconds": epoch_seconds,
    }


def train_budget(network, seed, data, epochs, lr, factor, schedule_power, settle, jit=True, defaults=False,
                 width=1.0, finetune_epochs=0, **limits):
    """The budget row: FLOP-weighted group penalties, ``Proximal(Adam)``, ``SparsityBudget(**limits)``, surgery.

    With ``defaults``: ``add_group_sparsity(model)`` and ``SparsityBudget(**limits)``, nothing else chosen
    (``factor``, ``schedule_power`` and ``settle`` unused). With ``finetune_epochs`` T: the budget trains
    ``epochs - T`` epochs, then the pruned model T epochs of Adam (a "budget+ft" record, returned last)."""
    finetune = finetune_epochs
    epochs = epochs - finetune
    import keras

    from keras_group_lasso import Proximal, SparsityBudget, add_group_sparsity

    if defaults:
        model = add_group_sparsity(build(network, seed, width))
        budget = SparsityBudget(threshold=THRESHOLD, **limits)
        factor = schedule_power = settle = None
    else:
        model = add_group_sparsity(build(network, seed, width), factor, penalty="group", input_factor=0.0,
                                   group_weight="flops")
        budget = SparsityBudget(threshold=THRESHOLD, schedule_power=schedule_power, settle=settle, **limits)
    compile_model(model, Proximal(keras.optimizers.Adam(cosine(lr, epochs, len(data["x_train"])))), jit)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        wall, epoch_seconds = fit(model, data, epochs, seed, f"{network} budget seed {seed}", callbacks=[budget])
    small, record = surgery(model, THRESHOLD, data)
    history = model.history.history
    record.update({
        "row": "budget", "network": network, "seed": seed, "epochs": epochs, "factor": factor,
        **{key: value for key, value in limits.items() if isinstance(value, (int, float))},
        "schedule_power": schedule_power, "settle": settle,
        "test_accuracy": accuracy(small, data), "params": int(model.count_params()),
        "train_seconds": wall, "epoch_seconds": epoch_seconds,
        "budget_cut_groups": [int(v) for v in history.get("budget_cut", [])],
        "budget_cuts": [[float(elapsed), int(groups)] for elapsed, groups in budget.cuts],
        "prunable_groups": int(budget.prunable_groups),
        "budget_history": {key: [float(v) for v in history[key]] for key in
                           ("budget_flops", "budget_latency", "budget_over", "budget_multiplier_hidden", "budget_phase") if key in history},
        "warnings": sorted({str(w.message)[:300] for w in caught if "SparsityBudget" in str(w.message)}),
    })
    if not finetune:
        return model, small, record
    compile_model(small, keras.optimizers.Adam(cosine(FINETUNE_LR, finetune, len(data["x_train"]))), jit)
    wall, epoch_seconds = fit(small, data, finetune, seed, f"{network} budget fine-tune seed {seed}")
    tuned = dict(record, row="budget+ft", finetune_epochs=finetune, test_accuracy=accuracy(small, data),
                 finetune_seconds=wall)
    return model, small, record, tuned


# ----------------------------------------------------------------------------- magnitude filter pruning


def filter_groups(model):
    """``[(makers, [(unit, score, [(reader, row), ...]), ...]), ...]``: the channels one set of layers makes.

    Every unit made by a convolution (not the output) with its L1 filter norm
    summed over the layers that make it, and where its weights are read
    (``(layer name, input index)``); grouped by the set of layers making it.
    """
    import numpy as np

    from keras_group_lasso.graph import model_graph

    graph = model_graph(model)
    kernels = {node.name: np.asarray(graph.layers[node.name].get_weights()[0]) for node in graph.units}
    makers, readers, scores = {}, {}, {}
    for node in graph.units:
        kernel = np.abs(kernels[node.name])
        norms = kernel.reshape(-1, kernel.shape[-1]).sum(axis=0)
        for i, unit in enumerate(node.in_ids.tolist()):
            readers.setdefault(unit, []).append((node.name, i))
        if node.is_output:
            continue
        for j, unit in enumerate(node.out_ids.tolist()):
            makers.setdefault(unit, set()).add(node.name)
            scores[unit] = scores.get(unit, 0.0) + float(norms[j])
    outputs = {int(u) for node in graph.units if node.is_output for u in node.out_ids.tolist()}
    groups = {}
    for unit, names in makers.items():
        if unit in outputs or unit not in readers:
            continue
        groups.setdefault(tuple(sorted(names)), []).append((unit, scores[unit], readers[unit]))
    return sorted(groups.items())


def zero_readers(model, groups, keep_fraction):
    """A copy of ``model`` in which each group's weakest channels are read by nothing (their rows set to 0).

    ``keep_fraction``: the fraction of every group's channels kept, or a list of one fraction per group.
    """
    copy = copy_of(model)
    rows = {}
    fractions = keep_fraction if isinstance(keep_fraction, (list, tuple)) else [keep_fraction] * len(groups)
    for (_, members), fraction in zip(groups, fractions):
        members = sorted(members, key=lambda m: m[1])
        keep = max(1, int(round(fraction * len(members))))
        for _, _, where in members[: len(members) - keep]:
            for name, row in where:
                rows.setdefault(name, []).append(row)
    for name, indices in rows.items():
        layer = copy.get_layer(name)
        weights = layer.get_weights()
        weights[0][..., sorted(set(indices)), :] = 0.0  # Conv2D (kh, kw, in, out) and Dense (in, out) alike
        layer.set_weights(weights)
    return copy


def magnitude_prune(model, max_flops, steps=12):
    """The largest keep fraction (the same in every layer) whose FLOPs fit ``max_flops``; (zeroed copy, fraction)."""
    from keras_group_lasso import sparsity_report

    groups = filter_groups(model)
    low, high = 0.0, 1.0
    best = zero_readers(model, groups, 0.0), 0.0
    for _ in range(steps):
        middle = (low + high) / 2
        candidate = zero_readers(model, groups, middle)
        if sparsity_report(candidate, 0.0).flops_after <= max_flops:
            low, best = middle, (candidate, middle)
        else:
            high = middle
    return best


def scratch(network, seed, small, flops_dense, data, epochs, lr, jit=True):
    """The pruned network ``small`` with fresh weights (its layers' initializers), trained like the dense row;
    ``flops_dense``: the dense network's multiply-adds (for the reduction)."""
    import keras

    keras.utils.set_random_seed(seed)
    optimizer = keras.optimizers.Adam(cosine(lr, epochs, len(data["x_train"])))
    model = compile_model(keras.models.clone_model(small), optimizer, jit)
    wall, epoch_seconds = fit(model, data, epochs, seed, f"{network} scratch seed {seed}")
    from keras_group_lasso import sparsity_report

    report = sparsity_report(model, 0.0)
    return {"row": "scratch", "network": network, "seed": seed, "epochs": epochs,
            "test_accuracy": accuracy(model, data),
            "flops_after": int(report.flops_before), "flop_reduction": flops_dense / max(report.flops_before, 1),
            "params_after": int(model.count_params()),
            "train_seconds": wall, "epoch_seconds": epoch_seconds}


def uniform_only(run, setup, args, data):
    """``--uniform-only``: per network and seed, the uniformly narrowed network at ``--max-flops`` from scratch."""
    from keras_group_lasso import sparsity_report

    rows = []
    for network in args.networks:
        for seed in run.seeds:
            model = build(network, seed, args.width)
            flops = sparsity_report(model, 0.0).flops_before
            zeroed, fraction = magnitude_prune(model, args.max_flops * flops)
            small, _ = surgery(zeroed, 0.0, data)
            rows.append(dict(scratch(network, seed, small, flops, data, args.epochs, args.lr, args.jit),
                             row="uniform scratch", keep_fraction=fraction))
            say(f"{network} seed {seed} uniform ({fraction:.3f} of every layer, {rows[-1]['flop_reduction']:.2f}x "
                f"fewer FLOPs) from fresh weights: {100 * rows[-1]['test_accuracy']:.2f} %")
            save(run, setup, vars(args), rows)
    save(run, setup, vars(args), rows, quiet=False)


def magnitude(network, seed, dense, max_flops, data, finetune_epochs, jit=True, scratch_epochs=0, lr=LEARNING_RATE):
    """The magnitude rows; with ``scratch_epochs``, also the uniformly narrowed structure they prune to, trained from
    fresh weights that many epochs (a "uniform scratch" row, before the fine-tuning rows)."""
    import keras

    start = time.perf_counter()
    zeroed, fraction = magnitude_prune(dense, max_flops)
    select = time.perf_counter() - start
    small, record = surgery(zeroed, 0.0, data)
    record.update({"network": network, "seed": seed, "keep_fraction": fraction, "select_seconds": select,
                   "flop_target": int(max_flops), "params": int(dense.count_params())})
    rows = [dict(record, row="magnitude", finetune_epochs=0, test_accuracy=accuracy(small, data))]
    if scratch_epochs:
        rows.append(dict(scratch(network, seed, small, record["flops_before"], data, scratch_epochs, lr, jit),
                         row="uniform scratch"))
    if finetune_epochs:
        compile_model(small, keras.optimizers.Adam(cosine(FINETUNE_LR, finetune_epochs, len(data["x_train"]))), jit)
        wall, epoch_seconds = fit(small, data, finetune_epochs, seed, f"{network} magnitude fine-tune seed {seed}")
        rows.append(dict(record, row="magnitude+ft", finetune_epochs=finetune_epochs,
                         test_accuracy=accuracy(small, data), train_seconds=wall, epoch_seconds=epoch_seconds))
    return rows


# ----------------------------------------------------------------------------- results


def device():
    """The GPU (``nvidia-smi``) and the device Keras computes on."""
    import keras

    gpu = None
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30)
        gpu = done.stdout.strip() or None if done.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        pass
    compute = "cpu"
    if keras.backend.backend() == "jax":
        import jax

        d = jax.devices()[0]
        compute = f"{d.platform}: {d.device_kind}"
    elif keras.backend.backend() == "torch":
        import torch

        compute = f"cuda: {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else "cpu"
    return {"gpu": gpu or "cpu", "compute": compute}


def fmt_flops(n):
    return f"{n / 1e6:.2f} M"


def notes(setup, args):
    """The lines after the header: the device, the package, the data, the training, what the surgery diff is.

    ``setup``: the run's ``device``, ``package``, ``n_train``, ``n_test`` and ``tensorflow_imported``; ``args``: its
    arguments (a dict)."""
    budget = (f"`add_group_sparsity(model)`, `Proximal(Adam)`, `SparsityBudget(max_flops={args['max_flops']:g})` "
              "(the defaults, nothing else chosen)" if args["defaults"] else
              f"`add_group_sparsity(model, {args['lam']:g}, penalty=\"group\", input_factor=0, "
              f"group_weight=\"flops\")`, `Proximal(Adam)`, `SparsityBudget(max_flops={args['max_flops']:g}, "
              f"schedule_power={args['schedule_power']:g}, settle={args['settle']:g})`")
    return [
        (f"Device: {setup['device']['gpu']} (Keras computes on {setup['device']['compute']}); TensorFlow imported "
         f"by the end of the first training: {'yes' if setup['tensorflow_imported'] else 'no'}"),
        f"Package: {setup['package'] or 'unknown revision'}",
        (f"Data: {setup['n_train']:,} training / {setup['n_test']:,} test images, 28x28 padded to 32x32x1"
         + (" (--quick subset)" if args["quick"] else "")),
        (f"Training: batch {BATCH}, {args['epochs']} epochs, cosine-decayed learning rate {args['lr']:g}, "
         f"`jit_compile={args.get('jit', True)}`; dense: Adam; budget: {budget}, threshold {THRESHOLD:g}, "
         + (f"{args['epochs'] - args['budget_finetune']} epochs, then the pruned model {args['budget_finetune']} "
            f"of Adam ({FINETUNE_LR:g}, cosine)" if args.get("budget_finetune") else "no fine-tuning")
         + "; magnitude: L1 "
         f"filter pruning of the dense network at the budget row's FLOPs, the same fraction in every layer, "
         f"fine-tuned {args['finetune_epochs']} epochs with Adam ({FINETUNE_LR:g}, cosine)"),
        (f"Surgery diff: the largest |pruned - thresholded| logit on {min(GAP_IMAGES, setup['n_test'])} test images, "
         "over the largest |logit|, in full float32 (the backend's default precision in the JSON); surgery time is "
         "the first `prune_model` call"),
    ]


def tables(networks, args, rows):
    """Per network: its description, a table of its rows, the claim checked for each budget row."""
    lines = []
    for network in networks:
        lines += [f"## {network}", "", describe(network, args.get("width", 1.0)), ""]
        header = ["seed", "row", "test [%]", "Δ vs dense [points]", "FLOPs", "FLOP reduction", "params",
                  "surgery rel. diff", "surgery [s]", "train [s]"]
        table = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        order = {"dense": 0, "budget": 1, "budget+ft": 2, "scratch": 3, "uniform scratch": 4, "magnitude": 5,
                 "magnitude+ft": 6}
        for row in sorted(rows, key=lambda r: (r["seed"], order[r["row"]])):
            if row["network"] != network:
                continue
            dense = next((r for r in rows if r["network"] == network and r["seed"] == row["seed"]
                          and r["row"] == "dense"), None)
            delta = "–" if dense is None or row["row"] == "dense" else \
                f"{100 * (row['test_accuracy'] - dense['test_accuracy']):+.2f}"
            label = {"dense": "dense (Adam)", "budget": f"budget (max_flops={args['max_flops']:g}), no fine-tuning"
                     + (f" ({row['epochs']} epochs)" if row["row"] == "budget" and row["epochs"] != args["epochs"]
                        else ""),
                     "budget+ft": f"budget ({row['epochs']} epochs) + {row.get('finetune_epochs')} of fine-tuning",
                     "scratch": f"the budget's pruned network from fresh weights, {row['epochs']} epochs dense",
                     "uniform scratch": f"the magnitude rows' uniformly narrowed network from fresh weights, "
                                        f"{row['epochs']} epochs dense",
                     "magnitude": "magnitude filter pruning, no fine-tuning",
                     "magnitude+ft": f"magnitude filter pruning + {row.get('finetune_epochs')} epochs"}[row["row"]]
            rel = f"{row['relative_diff']:.1e}" if "relative_diff" in row else "–"
            surg = f"{row['surgery_seconds']:.2f}" if "surgery_seconds" in row else "–"
            train = f"{row['train_seconds']:.0f}" if "train_seconds" in row else "–"
            table.append("| " + " | ".join([
                str(row["seed"]), label, f"{100 * row['test_accuracy']:.2f}", delta, fmt_flops(row["flops_after"]),
                f"{row['flop_reduction']:.2f}x", f"{row['params_after']:,}", rel, surg, train]) + " |")
        lines += table + [""]
        for row in rows:
            if row["network"] != network or row["row"] != ("budget+ft" if args.get("budget_finetune") else "budget"):
                continue
            dense = next((r for r in rows if r["network"] == network and r["seed"] == row["seed"]
                          and r["row"] == "dense"), None)
            if dense is None:
                continue
            points = 100 * (row["test_accuracy"] - dense["test_accuracy"])
            checks = [
                (row["flop_reduction"] >= TARGET_FLOPS, f"at least {TARGET_FLOPS:g}x fewer FLOPs ({row['flop_reduction']:.2f}x)"),
                (points >= -TARGET_POINTS, f"at most {TARGET_POINTS:g} point below dense ({points:+.2f})"),
                (row["relative_diff"] <= 1e-4, f"surgery exact (relative diff {row['relative_diff']:.1e} <= 1e-4)"),
            ]
            largest = max((groups for _, groups in row.get("budget_cuts", [])), default=0)
            lines.append(f"Seed {row['seed']} ({row['row']}): " + "; ".join(("yes: " if ok else "**no**: ") + text for ok, text in checks)
                         + f". Groups cut per epoch: {row['budget_cut_groups']}; the largest single cut "
                         f"{largest} of {row.get('prunable_groups', '?')} groups.")
            for warning in row.get("warnings", []):
                lines.append(f"  - warning: {warning}")
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def package_revision():
    root = str(Path(__file__).resolve().parent.parent)
    try:
        commit = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                check=True, timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--", "keras_group_lasso"],
                               capture_output=True, text=True, check=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + (" + local changes" if dirty else "")


def summary(setup, args, rows):
    """The run in one line, for RESULTS.md's index: per network, each row's test accuracy (over seeds)."""
    def pct(network, kind):
        values = [100 * r["test_accuracy"] for r in rows if r["network"] == network and r["row"] == kind]
        return common.mean_std(values, 2) if values else None

    budget_call = f"`SparsityBudget(max_flops={args['max_flops']:g})`" + (" (defaults)" if args["defaults"] else "")
    parts = []
    for network in setup["networks"]:
        if pct(network, "dense") is None and pct(network, "uniform scratch") is None:
            continue
        text = f"{network}: dense {pct(network, 'dense')} %" if pct(network, "dense") else f"{network}: "
        budget = [r for r in rows if r["network"] == network and r["row"] == "budget"]
        if budget:
            fewer = common.mean_std([r["flop_reduction"] for r in budget], 2)
            text += (f", {budget_call} {pct(network, 'budget')} % at {fewer}x fewer FLOPs, no fine-tuning (surgery "
                     f"rel. diff {max(r['relative_diff'] for r in budget):.1e})")
        if pct(network, "budget+ft") is not None:
            text += (f"; {args['epochs'] - args['budget_finetune']} budget epochs + {args['budget_finetune']} of "
                     f"fine-tuning {pct(network, 'budget+ft')} %")
        if pct(network, "scratch") is not None:
            text += f"; the budget's pruned network trained from fresh weights {pct(network, 'scratch')} %"
        if pct(network, "uniform scratch") is not None:
            text += f"; the uniformly narrowed network from fresh weights {pct(network, 'uniform scratch')} %"
        if pct(network, "magnitude") is not None:
            text += f", magnitude filter pruning {pct(network, 'magnitude')} %"
        if pct(network, "magnitude+ft") is not None:
            text += f" ({pct(network, 'magnitude+ft')} % after {args['finetune_epochs']} fine-tuning epochs)"
        parts.append(text)
    return f"{TITLE} on {setup['device']['compute']}, {args['epochs']} epochs: " + "; ".join(parts)


def save(run, setup, args, rows, quiet=True, merged=()):
    """Publish the rows so far (a run cut short keeps them); ``quiet``: without printing the text, a checkpoint.

    ``args``: the arguments of the run (a dict); ``merged``: the result files the rows come from (``--merge``)."""
    setup.setdefault("tensorflow_imported", "tensorflow" in sys.modules)  # before the harness looks for its version
    sources = ["Rows of " + "; ".join(f"`{part['command']}` ({part['date']}, {part['wall_seconds'] / 60:.1f} min)"
                                      for part in merged)] if merged else []
    return run.publish(TITLE, tables(setup["networks"], args, rows), rows, notes=sources + notes(setup, args),
                       section=False, summary=summary(setup, args, rows), quiet=quiet, setup=setup,
                       **({"merged": list(merged)} if merged else {}))


def merge(run, paths):
    """No training: the rows of several result files (``modern_cnn_seeds.sh``: one per network and seed) in one."""
    parts = [json.loads(Path(path).read_text()) for path in paths]
    rows = [row for part in parts for row in part["records"]]
    setup = dict(parts[0]["setup"], networks=[n for n in NETWORKS if any(n in p["setup"]["networks"] for p in parts)],
                 tensorflow_imported=any(part["setup"]["tensorflow_imported"] for part in parts))
    run.seeds = sorted({row["seed"] for row in rows})
    merged = [{key: part[key] for key in ("command", "date", "wall_seconds")} for part in parts]
    save(run, setup, parts[0]["args"], rows, quiet=False, merged=merged)


QUICK = "1,024 training and 256 test images, 1 epoch; results to benchmarks/out/ (a CPU test)"


def main(argv=None):
    parser = common.arguments(__doc__, seeds=1, quick=QUICK)
    parser.add_argument("--name", dest="out_name", metavar="NAME", help="the same as --out-name")
    parser.add_argument("--out", default=os.environ.get("OUT"),
                        help="folder for NAME.json and NAME.md (default $OUT, else benchmarks/results; --quick: "
                             "benchmarks/out)")
    parser.add_argument("--data-dir", default=None, help="folder with the Fashion-MNIST IDX .gz files")
    parser.add_argument("--networks", nargs="+", choices=NETWORKS, default=list(NETWORKS))
    parser.add_argument("--first-seed", type=common.non_negative_int, default=0,
                        help="the first seed: seeds F..F+N-1 (default 0)")
    parser.add_argument("--epochs", type=common.positive_int, default=EPOCHS,
                        help=f"epochs of the dense and budget runs ({EPOCHS})")
    parser.add_argument("--finetune-epochs", type=common.non_negative_int, default=FINETUNE_EPOCHS,
                        help=f"fine-tuning epochs of the magnitude-pruned network ({FINETUNE_EPOCHS}; 0: none)")
    parser.add_argument("--budget-finetune", type=common.non_negative_int, default=0, metavar="T",
                        help="the budget row trains EPOCHS - T epochs, then its pruned model T epochs of Adam "
                             f"({FINETUNE_LR:g}, cosine): a 'budget+ft' row (default 0: none)")
    parser.add_argument("--scratch", action="store_true",
                        help="a 'scratch' row: the budget's pruned network with fresh weights, trained dense EPOCHS "
                             "(and, with the magnitude rows, a 'uniform scratch' row: their network the same way)")
    parser.add_argument("--lr", type=float, default=LEARNING_RATE, help=f"Adam's peak learning rate ({LEARNING_RATE:g})")
    parser.add_argument("--lam", type=float, default=LAMBDA, help=f"the budget's starting group strength ({LAMBDA:g})")
    parser.add_argument("--max-flops", type=float, default=MAX_FLOPS,
                        help=f"SparsityBudget(max_flops=...), a fraction of the dense FLOPs ({MAX_FLOPS:g})")
    parser.add_argument("--schedule-power", type=float, default=1.0)
    parser.add_argument("--settle", type=float, default=0.2)
    parser.add_argument("--train-size", type=common.positive_int, default=None, help="the first N training images only")
    parser.add_argument("--defaults", action="store_true",
                        help="budget row with the defaults: add_group_sparsity(model), SparsityBudget(max_flops=...)")
    parser.add_argument("--skip-magnitude", action="store_true", help="no magnitude-pruning rows")
    parser.add_argument("--width", type=float, default=1.0,
                        help="every layer's channels times WIDTH (0.5 trains in minutes per epoch on 2 cores)")
    parser.add_argument("--no-jit", dest="jit", action="store_false",
                        help="jit_compile=False (TensorFlow on a CPU trains these networks faster without XLA)")
    parser.add_argument("--uniform-only", action="store_true",
                        help="no dense or budget row: only a 'uniform scratch' row, the untrained network narrowed by "
                             "the same fraction in every layer to MAX_FLOPS of its multiply-adds (which channels go "
                             "does not matter from fresh weights), trained EPOCHS from fresh weights")
    parser.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                        help="no training: merge the rows of these result files into OUT/NAME.json and .md")
    args = parser.parse_args(argv)
    if args.quick:
        args.epochs, args.finetune_epochs = 1, min(args.finetune_epochs, 1)
        args.budget_finetune = min(args.budget_finetune, 1)
        args.epochs += args.budget_finetune
    if args.budget_finetune >= args.epochs:
        parser.error(f"--budget-finetune must be less than --epochs ({args.epochs}); received {args.budget_finetune}")
    run = common.Run(NAME, args, seeds=range(args.first_seed, args.first_seed + args.seeds))
    if args.out:
        run.out = Path(args.out)
    if args.merge:
        return merge(run, args.merge)

    data = load(args.data_dir, args.quick, args.train_size)
    setup = {"device": device(), "package": package_revision(), "n_train": len(data["x_train"]),
             "n_test": len(data["x_test"]), "networks": args.networks}
    say(f"{setup['device']['gpu']} / {setup['device']['compute']}; {setup['n_train']} training images; "
        f"out {run.out}")
    rows, dense_models = [], {}
    if args.uniform_only:
        return uniform_only(run, setup, args, data)
    # The claim first (dense and budget of every network), then the magnitude peers: a run cut short keeps the claim.
    for network in args.networks:
        for seed in run.seeds:
            dense, record = train_dense(network, seed, data, args.epochs, args.lr, args.jit, args.width)
            dense_models[network, seed] = dense
            rows.append(record)
            say(f"{network} seed {seed} dense: {100 * record['test_accuracy']:.2f} %, "
                f"{fmt_flops(record['flops_before'])} multiply-adds, {record['params']:,} params")
            save(run, setup, vars(args), rows)
            _, small, budget, *tuned = train_budget(network, seed, data, args.epochs, args.lr, args.lam,
                                                args.schedule_power, args.settle, args.jit, defaults=args.defaults,
                                                width=args.width, finetune_epochs=args.budget_finetune,
                                                max_flops=args.max_flops)
            rows += [budget, *tuned]
            for row in tuned:
                say(f"{network} seed {seed} budget + {row['finetune_epochs']} fine-tuning epochs: "
                    f"{100 * row['test_accuracy']:.2f} %")
            if args.scratch:
                rows.append(scratch(network, seed, small, budget["flops_before"], data, args.epochs, args.lr, args.jit))
                say(f"{network} seed {seed} the pruned network from fresh weights: "
                    f"{100 * rows[-1]['test_accuracy']:.2f} %")
            say(f"{network} seed {seed} budget: {100 * budget['test_accuracy']:.2f} %, "
                f"{budget['flop_reduction']:.2f}x fewer FLOPs, surgery {budget['surgery_seconds']:.2f} s, "
                f"relative diff {budget['relative_diff']:.1e}")
            save(run, setup, vars(args), rows)
    for network in args.networks if not args.skip_magnitude else ():
        for seed in run.seeds:
            budget = next(r for r in rows if r["network"] == network and r["seed"] == seed and r["row"] == "budget")
            for row in magnitude(network, seed, dense_models[network, seed], budget["flops_after"], data,
                                 args.finetune_epochs, args.jit, args.epochs if args.scratch else 0, args.lr):
                rows.append(row)
                say(f"{network} seed {seed} {row['row']}: {100 * row['test_accuracy']:.2f} %, "
                    f"{row['flop_reduction']:.2f}x, keep {row['keep_fraction']:.3f}")
            save(run, setup, vars(args), rows)
    save(run, setup, vars(args), rows, quiet=False)


if __name__ == "__main__":
    main()
