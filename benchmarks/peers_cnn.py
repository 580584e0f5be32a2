"""Peers on a VGG-style CNN or a MobileNetV2, Fashion-MNIST: ``SparsityBudget`` vs Torch-Pruning, same FLOPs.

The network is ``benchmarks/cnn_fashion.py``'s VGG with ``--convs-per-stage 2``:
per stage two ``Conv(3x3, same)-BN-ReLU`` then ``MaxPool(2)``, stages of
``--channels`` (default 16, 32 and 64 channels; 32 64 128 is the wider one),
then ``Flatten``, ``Dense(64)-ReLU``, ``Dense(10)`` logits (28 -> 14 -> 7 -> 3,
so the head reads 3 x 3 x the last stage's channels). For every seed, on the same training subset
(``--train`` images of Fashion-MNIST's training set, ``--test`` of the official
test images), ``--epochs`` E in total for every row, batch 128, Adam with
learning rate 1e-3 everywhere, the FLOP budget F = ``--flops`` (a fraction of
the dense network's multiply-adds):

1. **Keras dense**: the VGG trained E epochs (the backend ``KERAS_BACKEND``
   names).
2. **Keras budget**: ``add_group_sparsity(model)`` at its default strength,
   ``Proximal(Adam(1e-3))``, ``fit(.., epochs=E,
   callbacks=[SparsityBudget(max_flops=F)])`` (no other argument), then
   ``prune_model(model)``; no fine-tuning. The pruned model's logits are
   compared with the trained model's and with the trained model's after
   every Dense / Conv2D weight ``|w| <= 1e-3`` (``prune_model``'s default
   threshold) is set to 0 (both gaps are recorded), and the budget's
   per-epoch logs (``budget_*`` keys of ``History``) are kept.
3. **Keras budget + fine-tuning**: the same for E - T epochs, ``prune_model``,
   then T epochs (``--finetune-epochs``, default 2) of plain Adam(1e-3) on the
   pruned model, compiled afresh (the pruned model carries no penalties).
4. **Torch-Pruning L1**: the same VGG in PyTorch (same widths and head,
   BatchNorm with Keras's epsilon 1e-3 and momentum, Glorot-uniform kernels
   and zero biases as Keras initialises them, Adam with Keras's epsilon 1e-7),
   trained E - T epochs, then ``tp.pruner.MagnitudePruner`` with
   ``tp.importance.MagnitudeImportance(p=1)``, local (not global) ranking, the
   final ``Linear`` left out (``ignored_layers``), ``pruning_ratio=1.0`` over
   400 iterative steps, stepped until ``tp.utils.count_ops_and_params`` says
   the multiply-adds are at most F of the dense network's (Torch-Pruning's
   ``progressive_pruning`` of its benchmarks), and on while the shared count
   below is still above F (so that both frameworks meet one count); then T
   epochs of fine-tuning.
5. **Torch-Pruning group-norm sparse training** (DepGraph's ``group_sl``):
   ``tp.pruner.GroupNormPruner`` with ``GroupMagnitudeImportance(p=2,
   normalizer="max")`` (Torch-Pruning's CIFAR recipe) and ``reg=--tp-reg``
   (default 5e-4, its benchmarks' default), built before training;
   ``pruner.update_regularizer()`` at the start of every epoch and
   ``pruner.regularize(model)`` after every ``loss.backward()`` during the
   first E - T epochs; then pruned to F as in 4 and fine-tuned T epochs.

Rows 4 and 5 (and 6) run in a spawned worker process that imports torch and
torch_pruning but neither Keras nor TensorFlow: PyTorch's training crashes
with a segmentation fault in a process where TensorFlow has trained (torch
2.14 and TensorFlow 2.21 on CPU). PyTorch keeps its default thread count.

With ``--torch-dense`` a sixth row: the PyTorch VGG trained E epochs, no
pruning (whether the two frameworks train the network alike).

**Multiply-adds (MACs).** Every row reports one count, computed from the
widths the pruned network has (live channels of each convolution, units of
the hidden Dense / Linear), the same for Keras and PyTorch::

    MACs = sum_k  H_k * W_k * 3 * 3 * C_(k-1) * C_k        (convolutions; C_0 = 1, H_k x W_k the output map)
         + (H * W * C_last) * U + U * 10                   (Dense / Linear head)

per sample, biases, BatchNorm, ReLU and pooling not counted (what
``sparsity_report`` counts: the JSON keeps its ``flops_before`` /
``flops_after`` too, and the script checks that they match the formula for the
Keras rows). Torch-Pruning's own counter (which counts BatchNorm, ReLU,
pooling and biases as well) steers its pruning and is recorded beside it.

Table: test accuracy (mean ± std over seeds), accuracy right after pruning
(before fine-tuning), MAC reduction dense / after, widths of seed 0, the
largest ``budget_cut`` of a single epoch (groups the budget set to zero at
once, over seeds and epochs) and wall seconds (training, pruning and
fine-tuning; not evaluation).

**``--network mobilenetv2``**: the same rows and recipe on the MobileNetV2-style
network of ``benchmarks/modern_cnn.py`` (``modern_cnn.build("mobilenetv2", seed,
--width)``, ``--width`` 0.5 by default: inverted residual blocks with 3x3
depthwise convolutions, ReLU6, residual adds, BatchNormalization, global average
pooling, Dropout 0.2, Dense(10)) on 32x32x1 inputs (the 28x28 images padded with
2 zero pixels on each side, in every row); results ``peers_cnn_mobilenetv2_w05``
by default. The PyTorch rows train its twin (``torch_mobilenetv2``): the same
layers and widths, no convolution bias, BatchNorm, initialisation and Adam as
above. Keras's ``same`` padding of a stride-2 convolution pads the bottom and
right only, PyTorch's ``padding=1`` both sides: the same output sizes and
multiply-adds, and the twin is trained from scratch. Here the MACs are counted
from the (pruned) model itself rather than by the formula above: every
convolution ``H_out * W_out * k_h * k_w * C_in / groups * C_out`` (depthwise
included), every Dense / Linear ``in * out``, nothing for BatchNorm,
activations, pooling, adds or biases (Keras: its Conv2D, DepthwiseConv2D and
Dense layers; PyTorch: forward hooks on one 1x1x32x32 image); Torch-Pruning is
stepped to F of this count (and of its own), the Keras rows meet F on
``sparsity_report``'s count, the budget's (the same since ``sparsity_report``
counts the depthwise convolutions; the notes say where the two differ, and the
JSON keeps both). Keras trains with ``jit_compile=False`` (as for the VGG: XLA
trains depthwise convolutions far slower on a CPU).

Usage:
    KERAS_BACKEND=tensorflow python benchmarks/peers_cnn.py            # 3 seeds -> benchmarks/results/peers_cnn.{md,json}
    KERAS_BACKEND=tensorflow python benchmarks/peers_cnn.py --quick    # 1 seed, 2,000 images, 2 epochs -> benchmarks/out/
    KERAS_BACKEND=tensorflow python benchmarks/peers_cnn.py --seeds 1 --train 3000 --epochs 3 --output /tmp/peers
    KERAS_BACKEND=tensorflow python benchmarks/peers_cnn.py --network mobilenetv2  # -> peers_cnn_mobilenetv2_w05.md
    ... --results-md                                                   # also writes its section of benchmarks/RESULTS.md
"""

import json
import re
import statistics
import sys
import time
from functools import partial
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import cnn_fashion, common, modern_cnn

NAME = "peers_cnn"
QUICK = "1 seed, 2,000 training and 1,000 test images, 2 epochs; output under benchmarks/out/"
CHANNELS = (32, 64, 128)
CONVS = 2
UNITS = 64
N_CLASSES = 10
SIZE = 28
NETWORKS = ("vgg", "mobilenetv2")
NETWORK = "vgg"
WIDTH = 0.5  # of the MobileNetV2
BN_MOMENTUM = 0.99  # Keras's default
BATCH = 128
LR = 1e-3
GAP_IMAGES = 1000
TP_STEPS = 400  # Torch-Pruning's benchmarks: pruning_ratio 1.0 over 400 steps, stepped until the MACs are met
METHODS = {
    "keras_dense": "Keras dense",
    "keras_budget": "Keras `SparsityBudget(max_flops=F)`, no fine-tuning",
    "keras_budget_ft": "Keras `SparsityBudget`, E-T epochs + T fine-tuning",
    "tp_l1": "Torch-Pruning L1 (`MagnitudePruner`), E-T + T fine-tuning",
    "tp_group_sl": "Torch-Pruning group-norm sparse training (`GroupNormPruner`), E-T + T fine-tuning",
    "torch_dense": "PyTorch dense",
}


# ---------------------------------------------------------------------------------------------------------------------
# The network and the shared multiply-add count


def configure(network, width, channels=None, bn_momentum=0.99):
    """The network every function here builds: ``"vgg"`` (``channels`` per stage) or ``"mobilenetv2"`` (``width``),
    its BatchNormalization with ``bn_momentum`` (Keras's convention; PyTorch's ``momentum`` is ``1 - bn_momentum``)."""
    global NETWORK, WIDTH, CHANNELS, BN_MOMENTUM
    NETWORK, WIDTH, BN_MOMENTUM = network, width, bn_momentum
    CHANNELS = tuple(channels or CHANNELS)
    cnn_fashion.CHANNELS, cnn_fashion.CONVS, cnn_fashion.UNITS = CHANNELS, CONVS, UNITS


def side():
    """The input images' side: 28, or 32 for the MobileNetV2 (padded with 2 zero pixels each side)."""
    return SIZE if NETWORK == "vgg" else 32


def network_name():
    if NETWORK == "vgg":
        return f"{'-'.join(map(str, CHANNELS))} VGG"
    return f"MobileNetV2-style network at width {WIDTH:g}"


def filter_counts():
    return [c for c in CHANNELS for _ in range(CONVS)]


def macs(filters, units, convs=None, size=SIZE, in_channels=1, classes=N_CLASSES):
    """Multiply-adds per sample of the VGG with ``filters`` channels per convolution and ``units`` hidden Dense units.

    ``sum_k H_k W_k 9 C_(k-1) C_k`` over the 3x3 ``same`` convolutions (a 2x2 max pooling after every ``convs``-th
    halves the map, rounding down) plus the Dense kernels ``flat * U + U * classes``; no bias, BatchNorm, ReLU or pooling.
    """
    convs = convs or CONVS
    total, c_in, side = 0, in_channels, size
    for k, c in enumerate(filters, start=1):
        total += side * side * 9 * c_in * c
        c_in = c
        if k % convs == 0:
            side //= 2
    d_in = side * side * c_in
    for u in units:
        total += d_in * u
        d_in = u
    return total + d_in * classes


def keras_macs(model):
    """The shared count of a (pruned) Keras model: the VGG's formula from its widths, or, for the MobileNetV2, every
    Conv2D / DepthwiseConv2D ``H_out * W_out * kernel size`` and every Dense's kernel size."""
    import keras
    import numpy as np

    if NETWORK == "vgg":
        return macs(*keras_widths(model))
    total = 0
    for layer in model.layers:
        if isinstance(layer, (keras.layers.Conv2D, keras.layers.DepthwiseConv2D)):
            total += int(np.prod(layer.output.shape[1:3])) * int(np.prod(layer.kernel.shape))
        elif isinstance(layer, keras.layers.Dense):
            total += int(np.prod(layer.kernel.shape))
    return total


def torch_macs(model):
    """The same count of a PyTorch model: forward hooks on every Conv2d (``H_out * W_out * weight size``, the weight
    ``(C_out, C_in / groups, k_h, k_w)``) and Linear (its weight size), one image through the model in eval mode."""
    import torch

    if NETWORK == "vgg":
        return macs(*torch_widths(model))
    counts = []

    def hook(module, _, out):
        counts.append(module.weight.numel() * (out.shape[2] * out.shape[3] if out.dim() == 4 else 1))

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, (torch.nn.Conv2d,
                                                                                          torch.nn.Linear))]
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            model(example_input())
    finally:
        for handle in handles:
            handle.remove()
        model.train(training)
    return sum(counts)


# ---------------------------------------------------------------------------------------------------------------------
# Data


def load_data(n_train, n_test):
    """The same training subset for every seed (the split of ``cnn_fashion.load`` with seed 0), NHWC float32."""
    import numpy as np

    data = cnn_fashion.load(quick=False, seed=0)
    pad = (side() - SIZE) // 2  # the MobileNetV2's 32x32 (modern_cnn.load's padding)

    def images(x):
        return np.pad(x.astype("float32"), ((0, 0), (pad, pad), (pad, pad), (0, 0)))

    out = {
        "x_train": images(data["x_train"][:n_train]), "y_train": np.asarray(data["y_train"][:n_train]),
        "x_test": images(data["x_test"][:n_test]), "y_test": np.asarray(data["y_test"][:n_test]),
    }
    if len(out["x_train"]) < n_train or len(out["x_test"]) < n_test:
        common.say(f"note: only {len(out['x_train'])} training / {len(out['x_test'])} test images available")
    return out


# ---------------------------------------------------------------------------------------------------------------------
# Keras rows


def keras_model(seed):
    """The dense Keras network, seeded, its BatchNormalization layers with ``BN_MOMENTUM``."""
    import keras

    model = cnn_fashion.build_cnn(seed) if NETWORK == "vgg" else modern_cnn.build(NETWORK, seed, WIDTH)
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.momentum = BN_MOMENTUM
    return model


def keras_widths(pruned):
    """``(conv filters, hidden Dense units)`` of a (pruned) Keras network, in layer order (not the depthwise
    convolutions, as wide as their inputs); the output layer excluded."""
    import keras

    convs = [layer.filters for layer in pruned.layers if isinstance(layer, keras.layers.Conv2D)]
    dense = [layer.units for layer in pruned.layers if isinstance(layer, keras.layers.Dense)]
    return convs, dense[:-1]


def compile_plain(model, optimizer):
    import keras

    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], jit_compile=False)
    return model


def keras_fit(model, data, epochs, seed, callbacks=()):
    """``fit`` (batch 128, shuffled with a seed); returns (History.history, wall seconds, budget warnings)."""
    import keras

    keras.utils.set_random_seed(seed + 1000)  # the shuffling of each epoch
    return common.fit_recording_warnings(model, data, BATCH, epochs, callbacks)


def say_epochs(label, history):
    """One line per epoch, from History (no extra callback during ``fit``)."""
    n = len(history.get("loss", []))
    for e in range(n):
        budget = ", ".join(f"{k[len('budget_'):]} {history[k][e]:.4g}" for k in sorted(history)
                           if k.startswith("budget_") and e < len(history[k]))
        common.say(f"  {label} epoch {e + 1}: loss {history['loss'][e]:.4f} acc {history['accuracy'][e]:.4f}"
                   + (f" | {budget}" if budget else ""))


def logits(model, x):
    import keras
    import numpy as np

    return np.asarray(keras.ops.convert_to_numpy(model(x, training=False)), dtype=np.float64)


def thresholded(model, threshold=1e-3):
    """A copy of ``model`` with every Dense, Conv2D and DepthwiseConv2D kernel and bias weight ``|w| <= threshold``
    set to 0: what ``prune_model(model)`` (default threshold 1e-3) promises to compute."""
    import keras
    import numpy as np

    copy = keras.models.clone_model(model)
    copy.set_weights(model.get_weights())
    for layer in copy.layers:
        if isinstance(layer, (keras.layers.Dense, keras.layers.Conv2D, keras.layers.DepthwiseConv2D)):
            for weight in (layer.kernel, layer.bias):
                if weight is not None:
                    value = keras.ops.convert_to_numpy(weight)
                    weight.assign(np.where(np.abs(value) <= threshold, 0.0, value).astype(value.dtype))
    return copy


def keras_dense(seed, data, epochs):
    model = compile_plain(keras_model(seed), _adam())
    history, wall, _ = keras_fit(model, data, epochs, seed)
    say_epochs("keras dense", history)
    widths = keras_widths(model)
    return {"test_accuracy": cnn_fashion.accuracy(model, data["x_test"], data["y_test"]),
            "widths": {"conv": widths[0], "dense": widths[1]}, "macs_after": keras_macs(model),
            "wall_seconds": wall, "train_seconds": wall, "history": history}


def _adam():
    import keras

    return keras.optimizers.Adam(LR)


def keras_budget(seed, data, epochs, fraction, finetune=0):
    """Rows 2 (``finetune=0``) and 3: the budget with every default, ``prune_model(model)``, optional fine-tuning."""
    import keras
    import numpy as np

    import keras_group_lasso as kgl

    model = kgl.add_group_sparsity(keras_model(seed))
    compile_plain(model, kgl.Proximal(keras.optimizers.Adam(LR)))
    budget_epochs = epochs - finetune
    history, train_wall, budget_warnings = keras_fit(model, data, budget_epochs, seed,
                                                     callbacks=[kgl.SparsityBudget(max_flops=fraction)])
    say_epochs("keras budget" + (" (+ft)" if finetune else ""), history)

    report = kgl.sparsity_report(model)
    start = time.perf_counter()
    pruned = kgl.prune_model(model)
    prune_wall = time.perf_counter() - start
    x = data["x_test"][:GAP_IMAGES]
    want = logits(model, x)
    gap = float(np.max(np.abs(logits(pruned, x) - want)))
    gap_thresholded = float(np.max(np.abs(logits(pruned, x) - logits(thresholded(model), x))))
    conv_w, dense_w = keras_widths(pruned)
    record = {
        "budget_epochs": budget_epochs, "finetune_epochs": finetune,
        "flops_before": int(report.flops_before), "flops_after": int(report.flops_after),
        "widths": {"conv": conv_w, "dense": dense_w}, "macs_after": keras_macs(pruned),
        "max_gap": gap, "max_gap_vs_thresholded": gap_thresholded, "output_scale": float(np.max(np.abs(want))),
        "prune_seconds": prune_wall, "train_seconds": train_wall,
        "history": history, "budget_logs": {k: v for k, v in history.items() if k.startswith("budget_")},
        "budget_warnings": budget_warnings,
    }
    record["accuracy_after_pruning"] = cnn_fashion.accuracy(pruned, data["x_test"], data["y_test"])
    if record["macs_after"] != record["flops_after"]:
        common.say(f"  note: sparsity_report flops_after {record['flops_after']:,} != shared count "
                   f"{record['macs_after']:,} of the pruned model")
    if gap > 1e-4:
        common.say(f"  note: pruned vs trained model logits differ by up to {gap:.3g} (> 1e-4); vs the thresholded "
                   f"model {gap_thresholded:.3g}")
    ft_wall = 0.0
    if finetune:
        compile_plain(pruned, _adam())
        ft_history, ft_wall, _ = keras_fit(pruned, data, finetune, seed + 1)
        say_epochs("keras budget fine-tuning", ft_history)
        record["finetune_history"] = ft_history
    record["test_accuracy"] = (cnn_fashion.accuracy(pruned, data["x_test"], data["y_test"]) if finetune
                               else record["accuracy_after_pruning"])
    record["finetune_seconds"] = ft_wall
    record["wall_seconds"] = train_wall + prune_wall + ft_wall
    return record


# ---------------------------------------------------------------------------------------------------------------------
# PyTorch rows


def torch_vgg(seed):
    """The VGG in PyTorch: Keras's widths, BatchNorm (eps 1e-3, momentum ``1 - BN_MOMENTUM``) and initialisation."""
    import torch
    from torch import nn

    torch.manual_seed(seed)
    layers, c_in, side = [], 1, SIZE
    for k, c in enumerate(filter_counts(), start=1):
        layers += [nn.Conv2d(c_in, c, 3, padding=1), nn.BatchNorm2d(c, eps=1e-3, momentum=1 - BN_MOMENTUM), nn.ReLU()]
        c_in = c
        if k % CONVS == 0:
            layers.append(nn.MaxPool2d(2))
            side //= 2
    layers += [nn.Flatten(), nn.Linear(side * side * c_in, UNITS), nn.ReLU(), nn.Linear(UNITS, N_CLASSES)]
    return keras_init(nn.Sequential(*layers))


def keras_init(model):
    """Keras's initialisation: Glorot-uniform kernels (depthwise ones too: the same fan-in + fan-out), zero biases."""
    from torch import nn

    for m in model.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.xavier_uniform_(m.weight)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
    return model


def torch_mobilenetv2(seed):
    """The twin of ``modern_cnn.build("mobilenetv2", seed, WIDTH)``: stem Conv3x3-BN-ReLU6; per block an optional
    1x1 expansion-BN-ReLU6, a 3x3 depthwise convolution (the block's stride)-BN-ReLU6, a 1x1 projection-BN, the
    residual add at stride 1 and the same width; head 1x1-BN-ReLU6, global average pooling, Dropout(0.2),
    Linear(10). No convolution bias; BatchNorm and initialisation as ``torch_vgg``'s. ``padding=1`` pads both sides
    where Keras's ``same`` pads a stride-2 convolution's bottom and right only: the same output sizes."""
    import torch
    from torch import nn

    def unit(c_in, c_out, kernel=1, stride=1, groups=1, act=True):
        return [nn.Conv2d(c_in, c_out, kernel, stride, kernel // 2, groups=groups, bias=False),
                nn.BatchNorm2d(c_out, eps=1e-3, momentum=1 - BN_MOMENTUM)] + ([nn.ReLU6()] if act else [])

    class Block(nn.Module):
        def __init__(self, c_in, expansion, c_out, stride, kernel):
            super().__init__()
            mid = c_in * expansion
            self.body = nn.Sequential(*(unit(c_in, mid) if expansion != 1 else []),
                                      *unit(mid, mid, kernel, stride, groups=mid), *unit(mid, c_out, act=False))
            self.residual = stride == 1 and c_in == c_out

        def forward(self, x):
            return x + self.body(x) if self.residual else self.body(x)

    torch.manual_seed(seed)
    spec = modern_cnn.scaled(NETWORK, WIDTH)
    layers, c_in = unit(1, spec["stem"], 3), spec["stem"]
    for expansion, channels, blocks, stride, kernel in spec["stages"]:
        for i in range(blocks):
            layers.append(Block(c_in, expansion, channels, stride if i == 0 else 1, kernel))
            c_in = channels
    layers += [*unit(c_in, spec["head"]), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.2),
               nn.Linear(spec["head"], N_CLASSES)]
    return keras_init(nn.Sequential(*layers))


def torch_model(seed):
    return torch_vgg(seed) if NETWORK == "vgg" else torch_mobilenetv2(seed)


def example_input():
    import torch

    return torch.zeros(1, 1, side(), side())


def torch_widths(model):
    """Out-channels of every convolution but the depthwise ones, units of every Linear but the last."""
    from torch import nn

    convs = [m.out_channels for m in model.modules() if isinstance(m, nn.Conv2d) and m.groups == 1]
    linear = [m.out_features for m in model.modules() if isinstance(m, nn.Linear)]
    return convs, linear[:-1]


def torch_tensors(data):
    import numpy as np
    import torch

    return {
        "x_train": torch.from_numpy(np.ascontiguousarray(data["x_train"].transpose(0, 3, 1, 2))),
        "y_train": torch.from_numpy(data["y_train"].astype(np.int64)),
        "x_test": torch.from_numpy(np.ascontiguousarray(data["x_test"].transpose(0, 3, 1, 2))),
        "y_test": torch.from_numpy(data["y_test"].astype(np.int64)),
    }


def torch_fit(model, tdata, epochs, seed, label, pruner=None):
    """Adam(1e-3, eps 1e-7), batch 128, shuffled with a seed; with ``pruner``, its group regularisation after every
    backward pass (``update_regularizer`` at the start of each epoch). Returns wall seconds."""
    import torch
    import torch.nn.functional as F

    optimizer = torch.optim.Adam(model.parameters(), lr=LR, eps=1e-7)
    generator = torch.Generator().manual_seed(seed + 1000)
    x, y = tdata["x_train"], tdata["y_train"]
    start = time.perf_counter()
    for epoch in range(epochs):
        model.train()
        if pruner is not None:
            pruner.update_regularizer()
        order = torch.randperm(len(x), generator=generator)
        total, correct, seen = 0.0, 0, 0
        for i in range(0, len(x), BATCH):
            idx = order[i:i + BATCH]
            optimizer.zero_grad()
            out = model(x[idx])
            loss = F.cross_entropy(out, y[idx])
            loss.backward()
            if pruner is not None:
                pruner.regularize(model)
            optimizer.step()
            total += float(loss.detach()) * len(idx)
            correct += int((out.argmax(1) == y[idx]).sum())
            seen += len(idx)
        common.say(f"  {label} epoch {epoch + 1}: loss {total / seen:.4f} acc {correct / seen:.4f}")
    return time.perf_counter() - start


def torch_accuracy(model, tdata):
    import torch

    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(tdata["x_test"]), 1000):
            correct += int((model(tdata["x_test"][i:i + 1000]).argmax(1) == tdata["y_test"][i:i + 1000]).sum())
    return correct / len(tdata["x_test"])


def tp_pruner(model, method, reg):
    import torch
    import torch_pruning as tp

    example = example_input()
    last = [m for m in model.modules() if isinstance(m, torch.nn.Linear)][-1]
    common_args = {"global_pruning": False, "pruning_ratio": 1.0, "max_pruning_ratio": 1.0,
                   "iterative_steps": TP_STEPS, "ignored_layers": [last]}
    if method == "tp_l1":
        return tp.pruner.MagnitudePruner(model, example, importance=tp.importance.MagnitudeImportance(p=1),
                                         **common_args)
    return tp.pruner.GroupNormPruner(model, example, importance=tp.importance.GroupMagnitudeImportance(
        p=2, normalizer="max"), reg=reg, **common_args)


def tp_prune_to(model, pruner, fraction):
    """Step ``pruner`` until Torch-Pruning's count and the shared count are both at most ``fraction`` of the dense."""
    import torch_pruning as tp

    example = example_input()
    model.eval()
    tp_dense, params_dense = tp.utils.count_ops_and_params(model, example)
    shared_dense = torch_macs(model)
    tp_now, shared_now, tp_steps_first = tp_dense, shared_dense, None
    while tp_now > fraction * tp_dense or shared_now > fraction * shared_dense:
        if pruner.current_step >= pruner.iterative_steps:
            common.say(f"  note: Torch-Pruning ran out of steps at {tp_now / tp_dense:.3f} of its MACs")
            break
        pruner.step()
        tp_now, params_now = tp.utils.count_ops_and_params(model, example)
        shared_now = torch_macs(model)
        if tp_steps_first is None and tp_now <= fraction * tp_dense:
            tp_steps_first = pruner.current_step
    _, params_now = tp.utils.count_ops_and_params(model, example)
    return {"tp_macs_before": int(tp_dense), "tp_macs_after": int(tp_now), "tp_ratio": tp_now / tp_dense,
            "params_before": int(params_dense), "params_after": int(params_now),
            "tp_steps": pruner.current_step, "tp_steps_at_tp_count": tp_steps_first,
            "shared_ratio": shared_now / shared_dense,
            "target_met": bool(tp_now <= fraction * tp_dense and shared_now <= fraction * shared_dense)}


def torch_pruned(seed, data, tdata, epochs, finetune, fraction, method, reg):
    """Rows 4 and 5: train E - T epochs (row 5 with the group regularisation), prune to F, fine-tune T."""
    model = torch_model(seed)
    pruner = tp_pruner(model, method, reg) if method == "tp_group_sl" else None
    train_wall = torch_fit(model, tdata, epochs - finetune, seed, method + " train", pruner=pruner)
    accuracy_trained = torch_accuracy(model, tdata)
    start = time.perf_counter()
    if pruner is None:
        pruner = tp_pruner(model, method, reg)
    steer = tp_prune_to(model, pruner, fraction)
    prune_wall = time.perf_counter() - start
    conv_w, dense_w = torch_widths(model)
    accuracy_pruned = torch_accuracy(model, tdata)
    common.say(f"  {method}: pruned in {steer['tp_steps']} steps to widths {conv_w} / {dense_w}, "
               f"TP MACs {steer['tp_ratio']:.3f}, shared {steer['shared_ratio']:.3f} of dense; accuracy "
               f"{accuracy_trained:.4f} -> {accuracy_pruned:.4f}")
    if not depthwise_consistent(model):
        common.say("  note: a pruned depthwise convolution is no longer depthwise, or a BatchNorm not its width")
    ft_wall = torch_fit(model, tdata, finetune, seed + 1, method + " fine-tuning")
    return {"budget_epochs": epochs - finetune, "finetune_epochs": finetune,
            "accuracy_before_pruning": accuracy_trained, "accuracy_after_pruning": accuracy_pruned,
            "test_accuracy": torch_accuracy(model, tdata),
            "widths": {"conv": conv_w, "dense": dense_w}, "macs_after": torch_macs(model), **steer,
            "depthwise_consistent": depthwise_consistent(model),
            "train_seconds": train_wall, "prune_seconds": prune_wall, "finetune_seconds": ft_wall,
            "wall_seconds": train_wall + prune_wall + ft_wall, "tp_reg": reg if method == "tp_group_sl" else None}


def depthwise_consistent(model):
    """Whether every grouped convolution of a (pruned) PyTorch model is still depthwise (groups = in = out channels)
    and every BatchNorm as wide as the convolution before it."""
    from torch import nn

    modules = list(model.modules())
    return all((m.groups == 1 or m.groups == m.in_channels == m.out_channels)
               and (not isinstance(after, nn.BatchNorm2d) or after.num_features == m.out_channels)
               for m, after in zip(modules, modules[1:] + [None]) if isinstance(m, nn.Conv2d))


def torch_dense(seed, tdata, epochs):
    model = torch_model(seed)
    wall = torch_fit(model, tdata, epochs, seed, "torch dense")
    conv_w, dense_w = torch_widths(model)
    return {"test_accuracy": torch_accuracy(model, tdata), "widths": {"conv": conv_w, "dense": dense_w},
            "macs_after": torch_macs(model), "wall_seconds": wall, "train_seconds": wall}


# ---------------------------------------------------------------------------------------------------------------------
# The PyTorch rows run in a worker process: PyTorch's training crashes (segmentation fault) in a process where
# TensorFlow has run, so the worker imports no Keras or TensorFlow, only torch and torch_pruning.

_WORKER = {}


def _worker_init(data, network):
    configure(*network)
    _WORKER["data"] = data
    _WORKER["tdata"] = torch_tensors(data)


def _worker_dense_counts():
    """The dense twin's shared count and Torch-Pruning's ``count_ops_and_params`` (MACs, parameters)."""
    import torch_pruning as tp

    model = torch_model(0).eval()
    tp_macs, params = tp.utils.count_ops_and_params(model, example_input())
    return {"shared": torch_macs(model), "tp": int(tp_macs), "params": int(params)}


def _worker_info():
    from importlib import metadata

    import torch

    # The distribution's version (torch_pruning.__version__ of 1.6.1 still says 1.6.0).
    return {"torch": torch.__version__, "torch_pruning": metadata.version("torch-pruning"),
            "threads": torch.get_num_threads()}


def _worker_run(method, seed, args):
    """One PyTorch row in the worker (seeded there), as a record."""
    import numpy as np
    import torch

    np.random.seed(seed)
    torch.manual_seed(seed)
    data, tdata = _WORKER["data"], _WORKER["tdata"]
    if method == "torch_dense":
        return torch_dense(seed, tdata, args["epochs"])
    return torch_pruned(seed, data, tdata, args["epochs"], args["finetune"], args["flops"], method, args["tp_reg"])


def run_in_worker(worker, method, seed, args):
    return worker.submit(_worker_run, method, seed, args).result()


def torch_worker(data):
    """A one-process pool (spawned, so nothing of this process's TensorFlow comes along) holding the data and
    building this process's network."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_worker_init, initargs=(data, (NETWORK, WIDTH, CHANNELS, BN_MOMENTUM)))


# ---------------------------------------------------------------------------------------------------------------------
# Output


def widths_text(record):
    dense = record["widths"]["dense"]
    return "-".join(map(str, record["widths"]["conv"])) + (" / " + ",".join(map(str, dense)) if dense else "")


def table(records, dense_macs):
    rows = []
    for method, label in METHODS.items():
        group = [r for r in records if r["method"] == method]
        if not group:
            continue
        first = min(group, key=lambda r: r["seed"])
        before = [r["accuracy_after_pruning"] for r in group if "accuracy_after_pruning" in r]
        cuts = [c for r in group for c in r.get("budget_logs", {}).get("budget_cut", [])]
        has_budget = method.startswith("keras_budget")
        rows.append([
            label,
            common.mean_std([r["test_accuracy"] for r in group], 2, 100),
            common.mean_std(before, 2, 100) if before and method != "keras_budget" else "-",
            common.mean_std([dense_macs / max(r["macs_after"], 1) for r in group], 2) + "x",
            f"{statistics.fmean(r['macs_after'] for r in group):,.0f}",
            widths_text(first),
            (f"{max(cuts):.0f}" if cuts else "no `budget_cut` log") if has_budget else "-",
            common.mean_std([r["wall_seconds"] for r in group], 0),
        ])
    widths = ("widths, seed 0 (convs / Dense)" if NETWORK == "vgg" else
              "widths, seed 0 (stem, [expand-]project of each block, head)")
    head = ["method", "test acc. (%)", "acc. right after pruning (%)", "MACs reduction (dense / after)",
            "MACs after", widths, "largest single `budget_cut`", "wall (s)"]
    return common.markdown_table(head, rows)


_LOGGED = re.compile(r"seed (\d+) (\w+): test acc ([\d.]+), widths .*?, MACs ([\d,]+) ")


def read_records(paths):
    """The records of earlier runs: a run's ``.json``, or the result lines of its ``.log`` (a run stopped before it
    wrote its JSON)."""
    records = []
    for path in map(Path, paths):
        if path.suffix == ".json":
            records += json.loads(path.read_text())["records"]
        else:
            records += [{"method": m[2], "seed": int(m[1]), "test_accuracy": float(m[3]),
                         "macs_after": int(m[4].replace(",", ""))} for m in _LOGGED.finditer(path.read_text())]
    return records


def plot(records, dense_macs, path):
    """Test accuracy against the share of the dense multiply-adds: every seed (small) and the mean of each row
    (large, with the seeds' standard deviation)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    styles = {"keras_dense": ("dense (Keras)", "black", "o"),
              "keras_budget": ("SparsityBudget(max_flops=0.25), defaults", "tab:blue", "o"),
              "keras_budget_ft": ("SparsityBudget, then 2 epochs of fine-tuning", "tab:cyan", "s"),
              "tp_l1": ("Torch-Pruning L1 (magnitude), prune + 2 epochs", "tab:red", "v"),
              "tp_group_sl": ("Torch-Pruning group-norm sparse training, prune + 2", "tab:orange", "^")}
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for method, (label, color, marker) in styles.items():
        group = [r for r in records if r["method"] == method]
        if not group:
            continue
        share = [r["macs_after"] / dense_macs for r in group]
        acc = [100 * r["test_accuracy"] for r in group]
        ax.scatter(share, acc, color=color, marker=marker, s=18, alpha=0.45)
        spread = statistics.stdev(acc) if len(acc) > 1 else 0.0
        ax.errorbar([statistics.fmean(share)], [statistics.fmean(acc)], yerr=[spread], color=color, marker=marker,
                    markersize=9, capsize=4, label=f"{label} ({len(group)} seeds)")
    ax.set_xlabel("multiply-adds per image, share of the dense network")
    ax.set_ylabel("test accuracy (%)")
    network = (f"VGG-style CNN ({'-'.join(map(str, CHANNELS))})" if NETWORK == "vgg"
               else f"MobileNetV2-style (width {WIDTH:g})")
    ax.set_title(f"{network} on Fashion-MNIST, 8 epochs in every row")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def parse_args(argv=None):
    parser = common.arguments(__doc__, seeds=3, quick=QUICK)
    parser.add_argument("--first-seed", type=common.non_negative_int, default=0,
                        help="the first seed (default 0); with --seeds 1, one seed of a run split over processes")
    parser.add_argument("--train", type=common.positive_int, default=12000, help="training images (default 12000)")
    parser.add_argument("--test", type=common.positive_int, default=10000, help="test images (default 10000)")
    parser.add_argument("--epochs", type=common.positive_int, default=8, help="total epochs of every row (default 8)")
    parser.add_argument("--finetune-epochs", type=common.positive_int, default=2,
                        help="T: fine-tuning epochs of rows 3-5, out of --epochs (default 2; at most epochs - 1)")
    parser.add_argument("--network", choices=NETWORKS, default="vgg",
                        help="the VGG (default) or modern_cnn's MobileNetV2-style network")
    parser.add_argument("--channels", type=common.positive_int, nargs="+", default=None,
                        help="the VGG's channels of the three stages (default 16 32 64)")
    parser.add_argument("--width", type=float, default=None,
                        help="the MobileNetV2's width multiplier (modern_cnn.scaled; default 0.5)")
    parser.add_argument("--bn-momentum", type=float, default=0.99,
                        help="every BatchNormalization's momentum, Keras's convention (default 0.99, Keras's; "
                        "PyTorch's 0.1 is 0.9 here): the moving statistics of a short run lag behind at 0.99")
    parser.add_argument("--flops", type=float, default=0.25, help="F: fraction of the dense multiply-adds (default 0.25)")
    parser.add_argument("--tp-reg", type=float, default=5e-4,
                        help="GroupNormPruner's reg (default 5e-4, Torch-Pruning's benchmarks' --reg)")
    parser.add_argument("--torch-dense", action="store_true", help="also the PyTorch VGG trained E epochs, unpruned")
    parser.add_argument("--output", default=None,
                        help="path prefix of the .md and .json (default benchmarks/results/<--out-name>, "
                             "benchmarks/out/ with --quick)")
    parser.add_argument("--results-md", action="store_true",
                        help=f"also write the section {NAME} of benchmarks/RESULTS.md (not with --quick)")
    parser.add_argument("--plot", nargs="+", metavar="RESULT", default=None,
                        help="train nothing: draw the .json (or .log) results of earlier runs into --plot-output")
    parser.add_argument("--plot-output", default=None,
                        help="the picture --plot writes (default benchmarks/results/peers_cnn.png; "
                             "peers_cnn_mobilenetv2_w05.png there for that network)")
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.train, args.test, args.epochs = 1, 2000, 1000, 2
    if args.epochs < 2:
        parser.error("--epochs must be at least 2 (rows 3-5 train, prune, then fine-tune)")
    if not 0 < args.flops <= 1:
        parser.error("--flops must be in (0, 1]")
    if not 0 <= args.bn_momentum < 1:
        parser.error(f"--bn-momentum must be in [0, 1); received {args.bn_momentum}")
    if args.network == "vgg":
        if args.width is not None:
            parser.error("--width is the MobileNetV2's (--network mobilenetv2)")
        args.channels = args.channels or [16, 32, 64]
    elif args.channels is not None:
        parser.error("--channels is the VGG's")
    elif args.width is None:
        args.width = 0.5
    if args.width is not None and args.width <= 0:
        parser.error("--width must be positive")
    args.finetune = min(args.finetune_epochs, args.epochs - 1)
    return args


def default_name(args):
    """``peers_cnn`` for the VGG, ``peers_cnn_mobilenetv2_w05`` for the MobileNetV2 at width 0.5."""
    return NAME if args.network == "vgg" else f"{NAME}_{args.network}_w{args.width:g}".replace(".", "")


def network_notes(dense_macs, check, twin):
    """The notes that describe the network and the MAC count (the others are the same for both networks)."""
    if NETWORK == "vgg":
        return [(f"Network: {cnn_fashion.network_text()}; dense MACs {dense_macs:,} per sample "
                 f"(`sparsity_report` flops_before {check:,})")], [
            ("MACs: the shared count from the widths, sum of 3x3 conv H*W*9*C_in*C_out and Dense in*out per sample "
             "(no biases, BN, ReLU, pooling); `sparsity_report`'s and Torch-Pruning's counts are in the JSON")]
    return [
        (f"Network: `modern_cnn.build(\"{NETWORK}\", seed, {WIDTH:g})`, MobileNetV2-style: "
         f"{modern_cnn.describe(NETWORK, WIDTH)}; inverted residual blocks (1x1 expansion, 3x3 depthwise, 1x1 "
         "projection, each with BatchNormalization; residual add at stride 1 and the same width), global average "
         "pooling, Dropout 0.2, Dense(10) logits; 32x32x1 inputs (the 28x28 images padded with 2 zero pixels each "
         "side, in every row)"),
        (f"BatchNormalization momentum {BN_MOMENTUM:g} (Keras's convention) in both frameworks"),
        ("PyTorch twin (the PyTorch rows): the same layers and widths (no convolution bias; BatchNorm eps 1e-3, "
         f"momentum {1 - BN_MOMENTUM:.2g} in PyTorch's convention; Glorot-uniform kernels, zero biases); Keras's `same` padding of a stride-2 convolution pads "
         "the bottom and right only, PyTorch's `padding=1` both sides: the same output sizes and MACs, the twin is "
         f"trained from scratch; Torch-Pruning counts the dense twin at {twin['tp']:,} MACs"),
        "Keras trains with `jit_compile=False` (XLA trains the depthwise convolutions far slower on a CPU)",
    ], [
        ("MACs: the shared count, from each (pruned) model itself: every convolution "
         "H_out*W_out*k_h*k_w*C_in/groups*C_out (depthwise included), every Dense / Linear in*out per sample, "
         "nothing for biases, BN, activations, pooling, adds (Keras: its Conv2D, DepthwiseConv2D and Dense "
         "layers; PyTorch: forward hooks on one 1x1x32x32 image); dense: "
         f"{dense_macs:,} in Keras, {twin['shared']:,} in PyTorch, "
         + ("the same as `sparsity_report`'s flops_before" if check == dense_macs else
            f"`sparsity_report` {check:,} (flops_before; {dense_macs - check:+,} by the shared count): the budget "
            "meets F on its count, so the Keras rows' shared count may differ from F")
         + "; Torch-Pruning is stepped to F of the shared count and of its own. `sparsity_report`'s and "
         "Torch-Pruning's counts are in the JSON"),
    ]


def main(argv=None):
    args = parse_args(argv)
    configure(args.network, args.width, args.channels, args.bn_momentum)
    if args.plot:
        dense = macs(filter_counts(), [UNITS]) if NETWORK == "vgg" else keras_macs(keras_model(0))
        output = args.plot_output or str(common.RESULTS_DIR / f"{default_name(args)}.png")
        common.say(f"wrote {plot(read_records(args.plot), dense, output)}")
        return
    import keras
    import numpy as np

    from keras_group_lasso import sparsity_report

    run = common.Run(default_name(args), args, seeds=range(args.first_seed, args.first_seed + args.seeds),
                     output=args.output)
    seeds = run.seeds
    data = load_data(args.train, args.test)
    worker = torch_worker(data)
    lib = {"keras": keras.__version__, **worker.submit(_worker_info).result()}
    dense_macs = keras_macs(keras_model(0))
    check = int(sparsity_report(keras_model(0)).flops_before)
    twin = worker.submit(_worker_dense_counts).result()
    common.say(f"{len(data['x_train'])} training / {len(data['x_test'])} test images, {args.epochs} epochs "
               f"(T = {args.finetune}), F = {args.flops}, seeds {seeds}; dense MACs {dense_macs:,} "
               f"(sparsity_report: {check:,}); backend {keras.backend.backend()}, torch {lib['torch']} "
               f"({lib['threads']} threads, in a worker process), torch_pruning {lib['torch_pruning']}")
    common.say(f"{network_name()}: the PyTorch twin's dense MACs {twin['shared']:,} by the shared count, "
               f"{twin['tp']:,} by Torch-Pruning's count_ops_and_params ({twin['params']:,} parameters)")
    if twin["shared"] != dense_macs:
        common.say(f"  note: the Keras and PyTorch dense networks count differently ({dense_macs:,} vs "
                   f"{twin['shared']:,})")

    records = []
    for seed in seeds:
        torch_args = {"epochs": args.epochs, "finetune": args.finetune, "flops": args.flops, "tp_reg": args.tp_reg}
        runs = [("keras_dense", partial(keras_dense, seed, data, args.epochs)),
                ("keras_budget", partial(keras_budget, seed, data, args.epochs, args.flops)),
                ("keras_budget_ft", partial(keras_budget, seed, data, args.epochs, args.flops, args.finetune))]
        torch_methods = ["tp_l1", "tp_group_sl"] + (["torch_dense"] if args.torch_dense else [])
        runs += [(m, partial(run_in_worker, worker, m, seed, torch_args)) for m in torch_methods]
        for method, train in runs:
            keras.utils.set_random_seed(seed)
            np.random.seed(seed)
            common.say(f"seed {seed}: {METHODS[method]}")
            record = {"method": method, "seed": seed, **train()}
            record["macs_reduction"] = dense_macs / max(record["macs_after"], 1)
            records.append(record)
            common.say(f"seed {seed} {method}: test acc {record['test_accuracy']:.4f}, widths {widths_text(record)}, "
                       f"MACs {record['macs_after']:,} ({record['macs_reduction']:.2f}x), "
                       f"wall {record['wall_seconds']:.0f} s")

    worker.shutdown()
    network, counting = network_notes(dense_macs, check, twin)
    notes = network + [
        (f"Data: the first {len(data['x_train']):,} images of `cnn_fashion.load`'s training split (the same for every "
         f"seed), {len(data['x_test']):,} official test images"),
        (f"E = {args.epochs} epochs in every row, T = {args.finetune} of them fine-tuning in rows 3-5; batch {BATCH}, "
         f"Adam lr {LR:g}; F = {args.flops:g} of the dense MACs"),
        ("Keras budget rows: `add_group_sparsity(model)` (default strength), `Proximal(Adam(1e-3))`, "
         "`SparsityBudget(max_flops=F)` with no other argument, `prune_model(model)`"),
        (f"Torch-Pruning {lib['torch_pruning']} on torch {lib['torch']} (CPU, {lib['threads']} threads, a "
         "worker process: PyTorch training crashes in a process where TensorFlow has run): "
         f"local ranking, final Linear ignored, pruning_ratio 1.0 over {TP_STEPS} steps, stepped until "
         "`count_ops_and_params` and the shared count are both <= F; group-norm row: "
         f"`GroupMagnitudeImportance(p=2, normalizer='max')`, reg {args.tp_reg:g}"),
        *counting,
        ("`acc. right after pruning`: rows 3-5 before their fine-tuning (row 2 has none: its accuracy is the pruned "
         "model's)"),
        "Times: wall seconds of training + pruning + fine-tuning on a 2-core machine shared with other jobs",
    ]
    vgg = NETWORK == "vgg"
    run.publish(f"Peers on the {network_name()}, Fashion-MNIST: SparsityBudget vs Torch-Pruning",
                table(records, dense_macs), records, notes=notes,
                section=(NAME if vgg else run.name) if args.results_md else False,
                versions=lib, dense_macs=dense_macs, dense_flops_sparsity_report=check,
                dense_macs_torch=twin["shared"], dense_macs_torch_pruning=twin["tp"],
                macs_formula=("sum_k H_k*W_k*9*C_(k-1)*C_k + (H*W*C_last)*U + U*10" if vgg else
                              "sum over convolutions H_out*W_out*k_h*k_w*C_in/groups*C_out + sum over Dense in*out"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
