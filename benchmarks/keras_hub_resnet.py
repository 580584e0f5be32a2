"""A KerasHub ImageClassifier (ResNet backbone) on Fashion-MNIST under a FLOP budget, pruned exactly.

The model is KerasHub's own: ``keras_hub.models.ResNetBackbone`` (basic blocks, built from its constructor with
random weights, no download) inside ``keras_hub.models.ImageClassifier`` (logits). Rows:

* dense: Adam, the baseline.
* budget: ``add_group_sparsity`` on the classifier (the graph is read from the KerasHub model's own nodes, its
  Backbone opened), ``Proximal(Adam)`` and ``SparsityBudget(max_flops=F)`` for the same epochs, then
  ``prune_model``; no fine-tuning. The pruned model is a plain functional model of KerasHub's and Keras's layers.

Per row: test accuracy, multiply-adds per sample (``sparsity_report``), parameters, and for the budget row the
largest difference between the pruned model's logits and the thresholded classifier's.

Usage:
    python benchmarks/keras_hub_resnet.py              # -> benchmarks/results/keras_hub_resnet.md and .json
    python benchmarks/keras_hub_resnet.py --quick      # 2,000 images, 1 epoch; -> benchmarks/out/
"""

import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import common

NAME = "keras_hub_resnet"
QUICK = "2,000 images, 1 epoch, output to benchmarks/out/"
BATCH = 64
EPOCHS = 4
TRAIN = 20000
FACTOR = 1e-3
LEARNING_RATE = 1e-3
BUDGET_FLOPS = 0.5


def load(quick, seed=0):
    import numpy as np

    from keras_group_lasso.datasets import load_dataset

    data = load_dataset("fashion-mnist")
    order = np.random.default_rng(seed).permutation(len(data.x_train))[: 2000 if quick else TRAIN]
    x = data.x_train.reshape(-1, 28, 28, 1)[order].astype("float32")
    x_test = data.x_test.reshape(-1, 28, 28, 1).astype("float32")
    y_test = data.y_test
    if quick:
        x_test, y_test = x_test[:1000], y_test[:1000]
    return x, data.y_train[order], x_test, y_test


def build(seed):
    import keras
    import keras_hub

    keras.utils.set_random_seed(seed)
    backbone = keras_hub.models.ResNetBackbone(
        input_conv_filters=[64], input_conv_kernel_sizes=[3], stackwise_num_filters=[64, 128],
        stackwise_num_blocks=[2, 2], stackwise_num_strides=[1, 2], block_type="basic_block",
        use_pre_activation=False, image_shape=(28, 28, 1))
    return keras_hub.models.ImageClassifier(backbone=backbone, num_classes=10, activation=None)


def compiled(model, optimizer):
    import keras

    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], jit_compile=False)
    return model


def train_rows(args):
    import keras
    import numpy as np

    from keras_group_lasso import (
        Proximal,
        SparsityBudget,
        add_group_sparsity,
        apply_threshold,
        prune_model,
        sparsity_report,
    )

    x, y, x_test, y_test = load(args.quick)
    epochs = 1 if args.quick else args.epochs
    rows = []

    dense = compiled(build(args.seed), keras.optimizers.Adam(LEARNING_RATE))
    started = time.perf_counter()
    dense.fit(x, y, epochs=epochs, batch_size=BATCH, verbose=0)
    report = sparsity_report(dense, 0.0)
    rows.append({"row": "dense", "accuracy": float(dense.evaluate(x_test, y_test, verbose=0)[1]),
                 "flops": report.flops_before, "params": int(dense.count_params()),
                 "train_s": time.perf_counter() - started})
    common.say(f"dense: {rows[-1]}")

    sparse = add_group_sparsity(build(args.seed), FACTOR)
    compiled(sparse, Proximal(keras.optimizers.Adam(LEARNING_RATE)))
    started = time.perf_counter()
    sparse.fit(x, y, epochs=epochs, batch_size=BATCH, verbose=0,
               callbacks=[SparsityBudget(max_flops=args.budget)])
    train_s = time.perf_counter() - started
    started = time.perf_counter()
    small = prune_model(sparse)
    prune_s = time.perf_counter() - started
    report = small.pruning_report
    apply_threshold(sparse)
    probe = x_test[:256]
    difference = float(np.abs(keras.ops.convert_to_numpy(small(probe))
                              - keras.ops.convert_to_numpy(sparse(probe))).max())
    compiled(small, keras.optimizers.Adam(LEARNING_RATE))
    rows.append({"row": f"budget max_flops={args.budget}", "accuracy": float(small.evaluate(x_test, y_test,
                                                                                            verbose=0)[1]),
                 "flops": report.flops_after, "params": int(small.count_params()), "train_s": train_s,
                 "prune_s": prune_s, "max_logit_difference": difference,
                 "layer_sizes": list(report.layer_sizes)})
    common.say(f"budget: {rows[-1]}")
    return rows


def table(rows):
    dense = rows[0]
    return common.markdown_table(
        ["row", "test accuracy", "multiply-adds / sample", "FLOPs vs dense", "parameters", "max |logit diff|"],
        [[r["row"], f"{100 * r['accuracy']:.2f} %", f"{r['flops']:,}", f"{dense['flops'] / r['flops']:.2f}x fewer"
          if r is not dense else "1.00x", f"{r['params']:,}",
          f"{r['max_logit_difference']:.1e}" if "max_logit_difference" in r else "-"] for r in rows])


def main(argv=None):
    parser = common.arguments(__doc__, quick=QUICK)
    parser.add_argument("--epochs", type=common.positive_int, default=EPOCHS)
    parser.add_argument("--budget", type=float, default=BUDGET_FLOPS, help="max_flops of the budget (default 0.5)")
    parser.add_argument("--seed", type=common.non_negative_int, default=0)
    args = parser.parse_args(argv)
    run = common.Run(NAME, args, seeds=[args.seed])
    rows = train_rows(args)
    notes = [(f"{2000 if args.quick else TRAIN:,} training images, {'1,000' if args.quick else 'the 10,000'} test "
             f"images; {1 if args.quick else args.epochs} epochs of batch {BATCH} for both rows; λ {FACTOR}; "
             "no fine-tuning"),
             ("Model: keras_hub.models.ResNetBackbone (stem Conv 64, basic blocks 64-64 / 128-128) in "
             "keras_hub.models.ImageClassifier, 28x28x1 inputs, random initial weights")]
    run.publish("A KerasHub ImageClassifier (ResNet) under a FLOP budget", table(rows), rows, notes=notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
