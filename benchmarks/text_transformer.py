"""keras.io's text-classification Transformer under a FLOP budget, pruned exactly, on a token task with no download.

The model is keras.io's "Text classification with Transformer" as keras.io writes it: a subclassed
``TokenAndPositionEmbedding`` (positions from ``keras.ops.arange`` read by a position ``Embedding``), a subclassed
``TransformerBlock`` (``MultiHeadAttention``, a feed-forward ``Sequential`` of two Dense layers,
``LayerNormalization``, ``Dropout``), then ``GlobalAveragePooling1D``, ``Dropout``, ``Dense(20, relu)``,
``Dropout``, ``Dense(2, softmax)``; embed_dim 32, 2 heads, ff_dim 32 (keras.io's sizes).

Task (seeded, no download): sequences of ``MAXLEN`` tokens drawn uniformly from a vocabulary of ``VOCAB``; the first
``COUNTED`` tokens are split into class A and class B, the rest are neutral; the label says whether class B occurs
more often than class A among the first ``WINDOW`` positions (ties: A). Counting over the whole sequence would need
no position; counting over a window makes the model tie tokens to positions.

For every seed, E = ``--epochs`` epochs at batch ``BATCH``, Adam(``LR``):

1. **dense**: the model trained E epochs.
2. **budget**: ``add_group_sparsity(model)`` (default strength), ``Proximal(Adam(LR))``,
   ``SparsityBudget(max_flops=0.5)`` with no other argument, E epochs; then ``prune_model``, no fine-tuning.

Recorded: test accuracy (dense, budget-trained, pruned), FLOPs after / before (``sparsity_report``), the pruned
widths (heads, feed-forward neurons, embedding channels, Dense(20) neurons), the largest |output| gap between the
pruned model and the trained model after ``apply_threshold``, wall seconds.

``--model bert``: the same task and runs with KerasHub's ``BertTextClassifier`` around a ``BertBackbone`` (one
``TransformerEncoder`` of the same sizes, built from its constructor: random initial weights, no download), its
inputs the token ids, segment ids of 0 and a padding mask of ones; the encoder block is traced into the graph and
its heads and feed-forward neurons are pruned.

Usage:
    KERAS_BACKEND=tensorflow python benchmarks/text_transformer.py             # -> benchmarks/results/text_transformer.{md,json}, RESULTS.md
    KERAS_BACKEND=tensorflow python benchmarks/text_transformer.py --model bert  # -> benchmarks/results/text_transformer_bert.{md,json}, RESULTS.md
    KERAS_BACKEND=tensorflow python benchmarks/text_transformer.py --quick     # 2,000 sequences, 1 epoch, 1 seed -> benchmarks/out/
"""

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

NAME = "text_transformer"
L = keras.layers
ops = keras.ops
VOCAB, MAXLEN, COUNTED, WINDOW = 64, 32, 64, 16
EMBED, HEADS, FF = 32, 2, 32
TRAIN, TEST = 20000, 4000
BATCH, LR, EPOCHS, BUDGET = 64, 1e-3, 5, 0.5
T = 1e-3


class TokenAndPositionEmbedding(L.Layer):
    def __init__(self, maxlen, vocab_size, embed_dim):
        super().__init__()
        self.token_emb = L.Embedding(input_dim=vocab_size, output_dim=embed_dim)
        self.pos_emb = L.Embedding(input_dim=maxlen, output_dim=embed_dim)

    def call(self, x):
        maxlen = ops.shape(x)[-1]
        positions = ops.arange(start=0, stop=maxlen, step=1)
        positions = self.pos_emb(positions)
        x = self.token_emb(x)
        return x + positions


class TransformerBlock(L.Layer):
    def __init__(self, embed_dim, num_heads, ff_dim, rate=0.1):
        super().__init__()
        self.att = L.MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim)
        self.ffn = keras.Sequential([L.Dense(ff_dim, activation="relu"), L.Dense(embed_dim)])
        self.layernorm1 = L.LayerNormalization(epsilon=1e-6)
        self.layernorm2 = L.LayerNormalization(epsilon=1e-6)
        self.dropout1 = L.Dropout(rate)
        self.dropout2 = L.Dropout(rate)

    def call(self, inputs, training=None):
        attn_output = self.dropout1(self.att(inputs, inputs), training=training)
        out1 = self.layernorm1(inputs + attn_output)
        ffn_output = self.dropout2(self.ffn(out1), training=training)
        return self.layernorm2(out1 + ffn_output)


def keras_io_model(seed):
    keras.utils.set_random_seed(seed)
    inputs = L.Input(shape=(MAXLEN,))
    x = TokenAndPositionEmbedding(MAXLEN, VOCAB, EMBED)(inputs)
    x = TransformerBlock(EMBED, HEADS, FF)(x)
    x = L.GlobalAveragePooling1D()(x)
    x = L.Dropout(0.1)(x)
    x = L.Dense(20, activation="relu")(x)
    x = L.Dropout(0.1)(x)
    outputs = L.Dense(2, activation="softmax")(x)
    return keras.Model(inputs=inputs, outputs=outputs)


def bert_model(seed):
    import keras_hub

    keras.utils.set_random_seed(seed)
    backbone = keras_hub.models.BertBackbone(vocabulary_size=VOCAB, num_layers=1, num_heads=HEADS, hidden_dim=EMBED,
                                             intermediate_dim=FF, max_sequence_length=MAXLEN, dropout=0.1)
    return keras_hub.models.BertTextClassifier(backbone, num_classes=2, preprocessor=None, activation="softmax")


MODELS = {"keras_io": keras_io_model, "bert": bert_model}


def bert_inputs(x):
    tokens = x.astype("int32")
    return {"token_ids": tokens, "segment_ids": np.zeros_like(tokens), "padding_mask": np.ones_like(tokens)}


def make_data(n_train, n_test, seed=0):
    """Uniform tokens; label 1 when class B (tokens COUNTED/2..COUNTED-1) outnumbers class A (0..COUNTED/2-1) among
    the first WINDOW positions."""
    x = np.random.default_rng(seed).integers(0, VOCAB, size=(n_train + n_test, MAXLEN))
    window = x[:, :WINDOW]
    a = np.sum(window < COUNTED // 2, axis=1)
    b = np.sum((window >= COUNTED // 2) & (window < COUNTED), axis=1)
    y = (b > a).astype("int32")
    x = x.astype("float32")
    return {"x_train": x[:n_train], "y_train": y[:n_train], "x_test": x[n_train:], "y_test": y[n_train:]}


def compiled(model, optimizer):
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def widths(model):
    """Heads, embedding channels and Dense widths of the (pruned, flat) model."""
    layers = list(model._flatten_layers(include_self=False))
    return {"heads": [layer.num_heads for layer in layers if isinstance(layer, L.MultiHeadAttention)],
            "embedding": sorted(layer.output_dim for layer in layers if isinstance(layer, L.Embedding)),
            "dense": [layer.units for layer in layers if isinstance(layer, L.Dense)]}


def run_seed(seed, data, epochs, build=keras_io_model):
    dense = compiled(build(seed), keras.optimizers.Adam(LR))
    _, dense_s, _ = common.fit_recording_warnings(dense, data, BATCH, epochs)
    dense_acc = common.accuracy(dense, data["x_test"], data["y_test"])
    common.say(f"seed {seed} dense: {100 * dense_acc:.2f} % in {dense_s:.0f} s")

    sparse = compiled(add_group_sparsity(build(seed)), Proximal(keras.optimizers.Adam(LR)))
    # BERT takes sequences of any length: its multiply-adds are counted per position, so its budget is in parameters
    limit = {"max_params": BUDGET} if build is bert_model else {"max_flops": BUDGET}
    _, budget_s, warned = common.fit_recording_warnings(sparse, data, BATCH, epochs, [SparsityBudget(**limit)])
    trained_acc = common.accuracy(sparse, data["x_test"], data["y_test"])
    report = sparsity_report(sparse, T)
    started = time.perf_counter()
    small = prune_model(sparse, T)
    prune_s = time.perf_counter() - started
    apply_threshold(sparse, T)
    probe = keras.tree.map_structure(lambda v: v[:1000], data["x_test"])
    gap = float(np.max(np.abs(ops.convert_to_numpy(small(probe, training=False))
                              - ops.convert_to_numpy(sparse(probe, training=False)))))
    record = {"seed": seed, "dense_accuracy": dense_acc, "trained_accuracy": trained_acc,
              "pruned_accuracy": common.accuracy(small, data["x_test"], data["y_test"]),
              "thresholded_accuracy": common.accuracy(sparse, data["x_test"], data["y_test"]),
              "flops_before": report.flops_before, "flops_after": report.flops_after,
              "flops_ratio": report.flops_after / report.flops_before, "gap": gap,
              "params_ratio": report.params_after / report.params_before,
              "uninterpreted_layers": [str(name) for name in report.uninterpreted_layers],
              "params_before": int(sparse.count_params()), "params_after": int(small.count_params()),
              "widths_before": widths(build(seed)), "widths_after": widths(small),
              "dense_s": dense_s, "budget_s": budget_s, "prune_s": prune_s, "warnings": warned}
    common.say(f"seed {seed} budget: {record}")
    return record


def width_text(w):
    """Heads / feed-forward neurons / embedding channels / Dense(20) neurons (BERT: pooler neurons)."""
    return f"{w['heads'][0]} / {w['dense'][0]} / {w['embedding'][0]} / {w['dense'][2]}"


def table(records, bert=False):
    def cell(key, digits=2, scale=100.0):
        return common.mean_std([r[key] for r in records], digits, scale)

    points = [100 * (r["pruned_accuracy"] - r["dense_accuracy"]) for r in records]
    w = records[0]["widths_before"]
    rows = [["dense", cell("dense_accuracy"), "-", "-", "1.000", width_text(w), f"{records[0]['params_before']:,}",
             "-", common.mean_std([r["dense_s"] for r in records], 0)]]
    kind = "max_params" if bert else "max_flops"
    rows.append([f"`SparsityBudget({kind}={BUDGET})`, `prune_model`, no fine-tuning",
                 cell("trained_accuracy"), cell("pruned_accuracy"), common.mean_std(points, 2),
                 common.mean_std([r["params_ratio" if bert else "flops_ratio"] for r in records], 3),
                 ", ".join(width_text(r["widths_after"]) for r in records),
                 ", ".join(f"{r['params_after']:,}" for r in records), f"{max(r['gap'] for r in records):.1e}",
                 common.mean_std([r["budget_s"] + r["prune_s"] for r in records], 0)])
    return common.markdown_table(
        ["run", "test acc. trained (%)", "test acc. pruned (%)", "pruned vs dense (points)",
         "parameters of the units layers after / before" if bert else "FLOPs after / before",
         "heads / FF neurons / embedding channels / " + ("pooler" if bert else "Dense(20)") + " (per seed)",
         "parameters (per seed)",
         "max |output gap| vs thresholded", "wall (s)"], rows)


QUICK = "2,000 sequences, 1 epoch, 1 seed; to benchmarks/out/"


def main(argv=None):
    parser = common.arguments(__doc__, seeds=3, quick=QUICK)
    parser.add_argument("--epochs", type=common.positive_int, default=EPOCHS)
    parser.add_argument("--model", choices=sorted(MODELS), default="keras_io",
                        help="keras.io's Transformer (default) or KerasHub's BertTextClassifier")
    args = parser.parse_args(argv)
    bert = args.model == "bert"
    name = f"{NAME}_bert" if bert else NAME
    n_train, n_test = (2000, 1000) if args.quick else (TRAIN, TEST)
    epochs = 1 if args.quick else args.epochs
    data = make_data(n_train, n_test)
    if bert:
        data = dict(data, x_train=bert_inputs(data["x_train"]), x_test=bert_inputs(data["x_test"]))
    run = common.Run(name, args)
    records = [run_seed(seed, data, epochs, MODELS[args.model]) for seed in run.seeds]
    flops = records[0]["flops_before"]
    model_note = (
        f"Model: KerasHub's `BertTextClassifier` around a `BertBackbone` (one `TransformerEncoder`, hidden {EMBED}, "
        f"{HEADS} heads, intermediate {FF}, dropout 0.1, token + position + segment embeddings, pooler on the first "
        f"token; inputs: the token ids, segment ids 0, padding mask 1), built from its constructor with random "
        f"initial weights; {flops:,} multiply-adds per sample (`sparsity_report`)" if bert else
        f"Model: keras.io's text-classification Transformer as keras.io writes it (subclassed "
        f"`TokenAndPositionEmbedding` with `keras.ops.arange` positions, subclassed `TransformerBlock`), embed_dim "
        f"{EMBED}, {HEADS} heads, ff_dim {FF}; {flops:,} multiply-adds per sample (`sparsity_report`)")
    notes = [
        model_note,
        (f"Data (seeded, no download): {n_train:,} / {n_test:,} sequences of {MAXLEN} tokens uniform over {VOCAB}; "
         f"label: tokens {COUNTED // 2}-{COUNTED - 1} outnumber tokens 0-{COUNTED // 2 - 1} among the first {WINDOW} "
         f"positions (ties: no); {100 * np.mean(data['y_test']):.1f} % of test labels are 1"),
        (f"E = {epochs} epoch(s) in both runs, batch {BATCH}, Adam lr {LR:g}; budget run: `add_group_sparsity(model)` "
         f"(default strength), `Proximal(Adam({LR:g}))`, `SparsityBudget({'max_params' if bert else 'max_flops'}="
         f"{BUDGET})` with no other argument, `prune_model(model)`, no fine-tuning"
         + (" (BERT takes sequences of any length, so its multiply-adds are counted per position and the budget "
            "is in parameters)" if bert else "")),
        ("Output gap: pruned model vs the budget-trained model after `apply_threshold` (|w| <= 1e-3 set to 0), "
         "softmax outputs on 1,000 test sequences, max over seeds; wall: training (+ pruning) on 2 shared cores"),
    ]
    title = ("KerasHub's BERT classifier under a FLOP budget" if bert else
             "keras.io's text Transformer under a FLOP budget")
    what = (f"{title}: `SparsityBudget({'max_params' if bert else 'max_flops'}={BUDGET})` with its defaults, "
            f"{epochs} epoch(s), no fine-tuning: pruned "
            f"{common.mean_std([100 * r['pruned_accuracy'] for r in records], 2)} % vs dense "
            f"{common.mean_std([100 * r['dense_accuracy'] for r in records], 2)} %, at "
            f"{common.mean_std([r['params_ratio' if bert else 'flops_ratio'] for r in records], 3)} of the "
            f"{'parameters' if bert else 'FLOPs'}, {max(r['gap'] for r in records):.1e} output gap")
    run.publish(title, table(records, bert), records, notes=notes, summary=what)
    return 0


if __name__ == "__main__":
    sys.exit(main())
