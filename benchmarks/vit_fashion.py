"""KerasHub's ViT on Fashion-MNIST under a FLOP budget: heads and MLP neurons pruned exactly, against magnitude pruning.

The model is KerasHub's ``ViTImageClassifier`` around a ``ViTBackbone`` built from its constructor (random initial
weights, no download): 28x28x1 images in patches of 4 (49 patches and a class token), ``HIDDEN`` channels, ``HEADS``
heads and ``MLP`` MLP neurons in each of ``LAYERS`` encoder blocks, a Dense head on the class token. Its patches,
class token and position table come from ``ViTPatchingAndEmbedding``, which is kept whole; each ``ViTEncoderBlock``
is traced, its heads and MLP neurons are groups.

For every seed, E = ``--epochs`` epochs at batch ``BATCH``, Adam(``LR``):

1. **dense**: the model trained E epochs.
2. **budget**: ``add_group_sparsity(model)`` (default strength), ``Proximal(Adam(LR))``,
   ``SparsityBudget(max_flops=BUDGET)`` with no other argument, E epochs; then ``prune_model``, no fine-tuning.
3. **magnitude**: the dense model of row 1, in every block the same share of its heads and of its MLP neurons
   removed (rounded per layer: a share of 0.54 takes 2 of 4 heads and 70 of 128 neurons), those whose outgoing
   weights have the smallest L2 norm (a head's rows of the attention output projection, a neuron's row of the
   second MLP Dense), the least share that meets the same FLOPs
   (``sparsity_report``); pruned with ``prune_model``; then fine-tuned ``FINETUNE`` more epochs (E + ``FINETUNE`` in
   all, more than the budget's E).

Recorded: test accuracy, FLOPs after / before (``sparsity_report``: the layers that make units, the attention's
products included; the kept-whole patch embedding is not counted), heads and MLP neurons per block, the largest
|output| gap between the budget's pruned model and its trained model after ``apply_threshold``, wall seconds.

Usage:
    KERAS_BACKEND=tensorflow python benchmarks/vit_fashion.py            # -> benchmarks/results/vit_fashion.{md,json}, RESULTS.md
    KERAS_BACKEND=tensorflow python benchmarks/vit_fashion.py --quick    # 2,000 images, 1 epoch, 1 seed -> benchmarks/out/
"""

import re
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import keras
import numpy as np

from benchmarks import common
from keras_group_lasso import (
    Proximal,
    SparsityBudget,
    add_group_sparsity,
    apply_threshold,
    prune_model,
    sparsity_report,
)
from keras_group_lasso.datasets import load_dataset

NAME = "vit_fashion"
HIDDEN, HEADS, MLP, LAYERS, PATCH = 64, 4, 128, 4, 4
TRAIN, TEST = 20000, 5000
BATCH, LR, EPOCHS, BUDGET, FINETUNE = 128, 1e-3, 8, 0.5, 2
T = 1e-3


def build(seed):
    import keras_hub

    keras.utils.set_random_seed(seed)
    backbone = keras_hub.models.ViTBackbone(image_shape=(28, 28, 1), patch_size=PATCH, num_layers=LAYERS,
                                            num_heads=HEADS, hidden_dim=HIDDEN, mlp_dim=MLP)
    return keras_hub.models.ViTImageClassifier(backbone=backbone, num_classes=10, preprocessor=None,
                                               activation=None)


def load(n_train, n_test):
    """``(n, 28, 28, 1)`` float32 images (``load_dataset``'s scaling: each pixel min-max scaled over the training
    images) and int labels."""
    data = load_dataset("fashion-mnist")

    def images(x):
        return np.asarray(x, dtype=np.float32).reshape(-1, 28, 28, 1)

    return {"x_train": images(data.x_train[:n_train]), "y_train": np.asarray(data.y_train[:n_train]),
            "x_test": images(data.x_test[:n_test]), "y_test": np.asarray(data.y_test[:n_test])}


def compiled(model, optimizer):
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def block_widths(model):
    """``[(heads, MLP neurons), ...]`` per encoder block, in order, counted from the kernels of any pruned model (its
    blocks rebuilt, ``transformer_block_1/mha/...``, or flattened into layers, ``..._transformer_block_1_mha/...``
    and a kept nested ``mlp_1/dense_1/...``)."""
    heads = [int(v.shape[0]) for v in model.weights if re.search(r"mha/attention_output/kernel$", v.path)]
    neurons = [int(v.shape[-1]) for v in model.weights if re.search(r"mlp(_\d+)?[/_]dense_1/kernel$", v.path)]
    return list(zip(heads, neurons, strict=True))


def run_seed(seed, data, epochs, finetune):
    dense = compiled(build(seed), keras.optimizers.Adam(LR))
    _, dense_s, _ = common.fit_recording_warnings(dense, data, BATCH, epochs)
    dense_acc = common.accuracy(dense, data["x_test"], data["y_test"])
    common.say(f"seed {seed} dense: {100 * dense_acc:.2f} % in {dense_s:.0f} s")

    sparse = compiled(add_group_sparsity(build(seed)), Proximal(keras.optimizers.Adam(LR)))
    _, budget_s, warned = common.fit_recording_warnings(sparse, data, BATCH, epochs,
                                                        [SparsityBudget(max_flops=BUDGET)])
    trained_acc = common.accuracy(sparse, data["x_test"], data["y_test"])
    report = sparsity_report(sparse, T)
    started = time.perf_counter()
    small = prune_model(sparse, T)
    prune_s = time.perf_counter() - started
    apply_threshold(sparse, T)
    probe = data["x_test"][:1000]
    gap = float(np.max(np.abs(keras.ops.convert_to_numpy(small(probe, training=False))
                              - keras.ops.convert_to_numpy(sparse(probe, training=False)))))
    pruned_acc = common.accuracy(small, data["x_test"], data["y_test"])
    common.say(f"seed {seed} budget: {100 * pruned_acc:.2f} % at {report.flops_after / report.flops_before:.3f} "
               f"of the FLOPs, widths {block_widths(small)}")

    # a head's outgoing weights: its (head_dim, hidden) slice of the output kernel; a neuron's: its row
    kernels = [v for v in dense.weights if v.path.endswith(("/mha/attention_output/kernel", "/mlp/dense_2/kernel"))]
    cut, share, cut_ratio = common.magnitude_pruned(dense, kernels, report.flops_after / report.flops_before)
    cut_acc = common.accuracy(cut, data["x_test"], data["y_test"])
    compiled(cut, keras.optimizers.Adam(LR))
    _, finetune_s, _ = common.fit_recording_warnings(cut, data, BATCH, finetune)
    tuned_acc = common.accuracy(cut, data["x_test"], data["y_test"])
    common.say(f"seed {seed} magnitude: share {share:.3f}, {cut_ratio:.3f} of the FLOPs, {100 * cut_acc:.2f} % "
               f"-> {100 * tuned_acc:.2f} % after {finetune} epoch(s)")
    return {"seed": seed, "dense_accuracy": dense_acc, "trained_accuracy": trained_acc,
            "pruned_accuracy": pruned_acc, "thresholded_accuracy": common.accuracy(sparse, data["x_test"],
                                                                                  data["y_test"]),
            "flops_before": report.flops_before, "flops_after": report.flops_after,
            "flops_ratio": report.flops_after / report.flops_before, "gap": gap,
            "widths_before": block_widths(dense), "widths_after": block_widths(small),
            "rebuilt_model": bool(getattr(small, "rebuilt_model", False)),
            "magnitude_share": share, "magnitude_flops_ratio": cut_ratio, "magnitude_widths": block_widths(cut),
            "magnitude_accuracy": cut_acc, "magnitude_finetuned_accuracy": tuned_acc,
            "dense_s": dense_s, "budget_s": budget_s, "prune_s": prune_s, "finetune_s": finetune_s,
            "warnings": warned}


def width_text(widths):
    return " ".join(f"{heads}/{mlp}" for heads, mlp in widths)


def table(records, epochs, finetune):
    def cell(key, digits=2, scale=100.0):
        return common.mean_std([r[key] for r in records], digits, scale)

    def points(key):
        return common.mean_std([100 * (r[key] - r["dense_accuracy"]) for r in records], 2)

    rows = [
        ["dense", str(epochs), cell("dense_accuracy"), "-", "1.000", width_text(records[0]["widths_before"]), "-",
         common.mean_std([r["dense_s"] for r in records], 0)],
        [f"`SparsityBudget(max_flops={BUDGET})`, `prune_model`, no fine-tuning", str(epochs),
         cell("pruned_accuracy"), points("pruned_accuracy"), cell("flops_ratio", 3, 1.0),
         "; ".join(width_text(r["widths_after"]) for r in records), f"{max(r['gap'] for r in records):.1e}",
         common.mean_std([r["budget_s"] + r["prune_s"] for r in records], 0)],
        ["magnitude (same share per block), no fine-tuning", str(epochs), cell("magnitude_accuracy"),
         points("magnitude_accuracy"), cell("magnitude_flops_ratio", 3, 1.0),
         "; ".join(width_text(r["magnitude_widths"]) for r in records), "-", "-"],
        [f"magnitude + {finetune} epoch(s) of fine-tuning", f"{epochs} + {finetune}",
         cell("magnitude_finetuned_accuracy"), points("magnitude_finetuned_accuracy"),
         cell("magnitude_flops_ratio", 3, 1.0), "as above", "-",
         common.mean_std([r["finetune_s"] for r in records], 0)],
    ]
    return common.markdown_table(
        ["run", "epochs", "test accuracy (%)", "vs dense (points)", "FLOPs after / before",
         "heads/MLP neurons per block (per seed)", "max |output gap| vs thresholded", "wall (s)"], rows)


def summary(records, epochs, finetune):
    """The run in one line, for RESULTS.md's index."""
    def pct(key):
        return common.mean_std([r[key] for r in records], 2, 100.0)

    return (f"KerasHub's `ViTImageClassifier` ({LAYERS} blocks of {HEADS} heads and {MLP} MLP neurons) on Fashion-MNIST, "
            f"`SparsityBudget(max_flops={BUDGET})` with its defaults, {epochs} epochs, no fine-tuning: "
            f"{common.mean_std([r['flops_ratio'] for r in records], 3)} of the FLOPs, surgery "
            f"output gap {max(r['gap'] for r in records):.1e}, {pct('pruned_accuracy')} % vs dense {pct('dense_accuracy')} %; "
            f"magnitude pruning at the same FLOPs {pct('magnitude_accuracy')} %, {pct('magnitude_finetuned_accuracy')} % "
            f"after {finetune} epoch(s) of fine-tuning")


QUICK = "2,000 images, 1 epoch, 1 seed; to benchmarks/out/"


def main(argv=None):
    parser = common.arguments(__doc__, seeds=3, quick=QUICK)
    parser.add_argument("--epochs", type=common.positive_int, default=EPOCHS)
    parser.add_argument("--finetune", type=common.positive_int, default=FINETUNE)
    args = parser.parse_args(argv)
    n_train, n_test = (2000, 1000) if args.quick else (TRAIN, TEST)
    epochs = 1 if args.quick else args.epochs
    finetune = 1 if args.quick else args.finetune
    data = load(n_train, n_test)
    run = common.Run(NAME, args)
    records = [run_seed(seed, data, epochs, finetune) for seed in run.seeds]
    notes = [
        (f"Model: KerasHub's `ViTImageClassifier` around a `ViTBackbone` (28x28x1 images, patches of {PATCH}, "
         f"hidden {HIDDEN}, {LAYERS} blocks of {HEADS} heads and {MLP} MLP neurons), built from its constructor with "
         f"random initial weights; {records[0]['flops_before']:,} multiply-adds per image (`sparsity_report`: the "
         f"layers that make units and the attention's products; the kept-whole patch embedding is not counted)"),
        (f"Data: Fashion-MNIST (Debian package `dataset-fashion-mnist`), the first {n_train:,} training and "
         f"{n_test:,} test images, each pixel min-max scaled over the training images (`load_dataset`)"),
        (f"Batch {BATCH}, Adam lr {LR:g} (constant) in every run; budget run: `add_group_sparsity(model)` (default "
         f"strength), `Proximal(Adam({LR:g}))`, `SparsityBudget(max_flops={BUDGET})` with no other argument, "
         f"`prune_model(model)`; magnitude: the dense model, the same share of heads and of MLP neurons removed in "
         f"every block (smallest L2 norm of their outgoing weights), the least share that meets the budget's FLOPs, "
         f"`prune_model`, then fine-tuned with Adam({LR:g})"),
        ("Output gap: the budget's pruned model vs its trained model after `apply_threshold` (|w| <= 1e-3 set to "
         "0), logits on 1,000 test images, max over seeds; wall: training (+ pruning) on 2 shared cores"),
    ]
    title = "KerasHub's ViT on Fashion-MNIST under a FLOP budget"
    run.publish(title, table(records, epochs, finetune), records, notes=notes, summary=summary(records, epochs, finetune))
    return 0


if __name__ == "__main__":
    sys.exit(main())
