"""Sequences and attention on Fashion-MNIST: a small Transformer (heads, feed-forward neurons) and an LSTM.

Each image is a sequence of its 28 rows (28 pixels each).

* Transformer: every row token is its 28 pixels plus a one-hot of its row
  index (28 more input channels: the position, given as data), ``Dense(d)``,
  ``--blocks`` blocks of ``MultiHeadAttention(4 heads, key_dim d / 4)`` +
  ``Add`` + ``LayerNormalization`` + ``Dense(--ffn * d, gelu)`` + ``Dense(d)`` + ``Add``
  + ``LayerNormalization``, then global average pooling and ``Dense(10)``.
  Methods, from the same initial weights: *dense* (Adam); *budget*
  (``add_group_sparsity(model, lam)``, ``Proximal(Adam)``,
  ``SparsityBudget(max_flops=--flops)``): heads (their output-projection
  slices) and feed-forward neurons are the groups that can go; the residual
  stream's channels stay (LayerNormalization reads them all).
* LSTM: ``LSTM(--lstm-units)`` on the 28 pixel columns (input features) and
  ``Dense(10)``: *dense*; *budget* (``add_group_sparsity(model, lam)``,
  ``Proximal(Adam)``, ``SparsityBudget(max_flops=--lstm-flops)``): pixel
  columns and hidden units can go; *small dense*: an
  LSTM of the pruned width on the kept columns, trained from scratch the same
  number of epochs.

No fine-tuning after pruning: the accuracy of a sparse row is the accuracy of
the model ``prune_model`` builds (checked against the thresholded model:
``max |diff|``). Also: surgery time, and inference time of the pruned against
the dense model (``predict``, batch 256, the test set, median of 3 after a
warm-up), on this machine's CPU.

    python benchmarks/sequences.py --out          # writes benchmarks/results/sequences.md / .json (--out-name)
    python benchmarks/sequences.py                # the same run, its results to benchmarks/out/
    python benchmarks/sequences.py --quick        # a smoke run (few samples, 1 epoch) into benchmarks/out/
"""

import statistics
import sys
import time

import numpy as np

try:
    from benchmarks import common
except ImportError:  # run as a script
    import common

ROWS = 28


def load(args):
    from keras_group_lasso.datasets import load_dataset

    data = load_dataset("fashion-mnist")
    x_train = data.x_train[: args.n_train].reshape(-1, ROWS, ROWS)
    x_test = data.x_test[: args.n_test].reshape(-1, ROWS, ROWS)
    return x_train, data.y_train[: args.n_train], x_test, data.y_test[: args.n_test]


def with_positions(x):
    """Each row token gets a one-hot of its row index: ``(n, 28, 28 + 28)``."""
    eye = np.broadcast_to(np.eye(ROWS, dtype="float32"), (x.shape[0], ROWS, ROWS))
    return np.concatenate([x, eye], axis=-1)


def transformer(width, blocks, heads=4, ffn=2):
    import keras

    L = keras.layers
    inp = keras.Input((ROWS, 2 * ROWS))
    x = L.Dense(width, name="embed")(inp)
    for b in range(blocks):
        a = L.MultiHeadAttention(heads, width // heads, name=f"attention{b}")(x, x)
        x = L.LayerNormalization(name=f"norm{b}a")(L.Add()([x, a]))
        f = L.Dense(ffn * width, activation="gelu", name=f"ffn{b}_in")(x)
        f = L.Dense(width, name=f"ffn{b}_out")(f)
        x = L.LayerNormalization(name=f"norm{b}b")(L.Add()([x, f]))
    out = L.Dense(10, activation="softmax", name="head")(L.GlobalAveragePooling1D()(x))
    return keras.Model(inp, out, name="transformer")


def lstm(units, features=ROWS):
    import keras

    inp = keras.Input((ROWS, features))
    x = keras.layers.LSTM(units, name="lstm")(inp)
    return keras.Model(inp, keras.layers.Dense(10, activation="softmax", name="head")(x), name="lstm_model")


def fit(model, optimizer, x, y, args, callbacks=()):
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
    start = time.perf_counter()
    model.fit(x, y, epochs=args.epochs, batch_size=args.batch_size, verbose=0, callbacks=list(callbacks))
    return time.perf_counter() - start


def predict_time(model, x):
    model.predict(x[:256], batch_size=256, verbose=0)
    times = []
    for _ in range(3):
        start = time.perf_counter()
        model.predict(x, batch_size=256, verbose=0)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def pruned_row(name, sparse, x_test, y_test, small_x_test, wall):
    import keras

    from keras_group_lasso import apply_threshold, prune_model, sparsity_report

    report = sparsity_report(sparse, 1e-3)
    start = time.perf_counter()
    small = prune_model(sparse, 1e-3, inputs="selected")
    surgery = time.perf_counter() - start
    reference = keras.models.clone_model(sparse)
    reference.set_weights(sparse.get_weights())
    apply_threshold(reference, 1e-3)
    kept = list(small.kept_features)
    diff = float(np.max(np.abs(small.predict(small_x_test(kept)[:512], verbose=0)
                               - reference.predict(x_test[:512], verbose=0))))
    return small, kept, {
        "method": name,
        "test": common.accuracy(small, small_x_test(kept), y_test),
        "flops_ratio": report.flops_ratio,
        "params": small.count_params(),
        "features": len(kept),
        "heads": {f"{row.name} heads": f"{row.heads_alive}/{row.heads}" for row in report.layers if row.heads},
        "units": {row.name: f"{row.units_alive}/{row.units}" for row in report.layers
                  if not row.is_output and not row.heads and row.units_alive < row.units or row.name == "lstm"},
        "max_diff": diff,
        "surgery_s": surgery,
        "train_s": wall,
    }


def run_transformer(args, data):
    import keras

    from keras_group_lasso import Proximal, SparsityBudget, add_group_sparsity, sparsity_report

    x_train, y_train, x_test, y_test = data
    xt, xs = with_positions(x_train), with_positions(x_test)
    rows = []
    keras.utils.set_random_seed(args.seed)
    dense = transformer(args.width, args.blocks, ffn=args.ffn)
    initial = dense.get_weights()
    wall = fit(dense, keras.optimizers.Adam(1e-3), xt, y_train, args)
    report = sparsity_report(dense, 1e-3)
    dense_time = predict_time(dense, xs)
    rows.append({"method": "dense", "test": common.accuracy(dense, xs, y_test), "flops_ratio": 1.0,
                 "params": dense.count_params(), "features": 2 * ROWS, "heads": {}, "units": {},
                 "max_diff": 0.0, "surgery_s": 0.0, "train_s": wall, "predict_s": dense_time, "speedup": 1.0,
                 "flops": report.flops_before})
    common.say(f"transformer dense: {rows[-1]['test']:.4f} ({wall:.0f} s)")

    keras.utils.set_random_seed(args.seed)
    model = transformer(args.width, args.blocks, ffn=args.ffn)
    model.set_weights(initial)
    sparse = add_group_sparsity(model, args.lam)
    budget = SparsityBudget(max_flops=args.flops)
    wall = fit(sparse, Proximal(keras.optimizers.Adam(1e-3)), xt, y_train, args, [budget])
    small, _, row = pruned_row(f"budget, max_flops={args.flops}", sparse, xs, y_test,
                               lambda kept: xs[..., kept], wall)
    row["predict_s"] = predict_time(small, xs[..., list(small.kept_features)])
    row["speedup"] = dense_time / row["predict_s"]
    rows.append(row)
    common.say(f"transformer budget: {row['test']:.4f}, FLOPs x{row['flops_ratio']:.3f}, heads {row['heads']}")
    return rows


def run_lstm(args, data):
    import keras

    from keras_group_lasso import Proximal, SparsityBudget, add_group_sparsity

    x_train, y_train, x_test, y_test = data
    rows = []
    keras.utils.set_random_seed(args.seed)
    dense = lstm(args.lstm_units)
    initial = dense.get_weights()
    wall = fit(dense, keras.optimizers.Adam(1e-3), x_train, y_train, args)
    dense_time = predict_time(dense, x_test)
    rows.append({"method": "dense", "test": common.accuracy(dense, x_test, y_test), "flops_ratio": 1.0,
                 "params": dense.count_params(), "features": ROWS, "heads": {}, "units": {}, "max_diff": 0.0,
                 "surgery_s": 0.0, "train_s": wall, "predict_s": dense_time, "speedup": 1.0})
    common.say(f"lstm dense: {rows[-1]['test']:.4f} ({wall:.0f} s)")

    keras.utils.set_random_seed(args.seed)
    model = lstm(args.lstm_units)
    model.set_weights(initial)
    sparse = add_group_sparsity(model, args.lstm_lam)
    callbacks = [SparsityBudget(max_flops=args.lstm_flops)] if args.lstm_flops else []
    wall = fit(sparse, Proximal(keras.optimizers.Adam(1e-3)), x_train, y_train, args, callbacks)
    name = f"budget, max_flops={args.lstm_flops}" if args.lstm_flops else f"sparse, lambda={args.lstm_lam:g}"
    small, kept, row = pruned_row(name, sparse, x_test, y_test, lambda kept: x_test[..., kept], wall)
    row["predict_s"] = predict_time(small, x_test[..., kept])
    row["speedup"] = dense_time / row["predict_s"]
    rows.append(row)
    common.say(f"lstm sparse: {row['test']:.4f}, {len(kept)} columns, units {row['units']}")

    width = small.get_layer("lstm").units
    keras.utils.set_random_seed(args.seed)
    scratch = lstm(width, len(kept))
    wall = fit(scratch, keras.optimizers.Adam(1e-3), x_train[..., kept], y_train, args)
    rows.append({"method": f"small dense ({len(kept)} columns, {width} units), from scratch",
                 "test": common.accuracy(scratch, x_test[..., kept], y_test), "flops_ratio": row["flops_ratio"],
                 "params": scratch.count_params(), "features": len(kept), "heads": {}, "units": {},
                 "max_diff": 0.0, "surgery_s": 0.0, "train_s": wall,
                 "predict_s": predict_time(scratch, x_test[..., kept]), "speedup": 0.0})
    rows[-1]["speedup"] = dense_time / rows[-1]["predict_s"]
    common.say(f"lstm small from scratch: {rows[-1]['test']:.4f}")
    return rows


def table(rows):
    header = ("method", "test accuracy", "FLOPs (of dense)", "params", "features", "kept heads / units",
              "max abs diff", "surgery s", "predict speed-up", "train s")
    body = []
    for r in rows:
        kept = ", ".join(f"{k} {v}" for k, v in {**r["heads"], **r["units"]}.items()) or "-"
        body.append((r["method"], f"{100 * r['test']:.2f} %", f"{r['flops_ratio']:.3f}", f"{r['params']:,}",
                     str(r["features"]), kept, f"{r['max_diff']:.1e}", f"{r['surgery_s']:.2f}",
                     f"{r['speedup']:.2f}x", f"{r['train_s']:.0f}"))
    return common.markdown_table(header, body)


NAME = "sequences"
TITLE = "Sequences and attention on Fashion-MNIST"
QUICK = "2,000 images, 1 epoch; results to benchmarks/out/"


def body(args, records):
    """A table per model that ran, then what their columns mean."""
    lines = []
    headings = {"transformer": f"Transformer ({args.blocks} blocks, width {args.width}, 4 heads, feed-forward "
                               f"{args.ffn * args.width})",
                "lstm": f"LSTM ({args.lstm_units} units)"}
    for model, heading in headings.items():
        rows = [r for r in records if r["model"] == model]
        if rows:
            lines += [f"## {heading}", "", table(rows), ""]
    lines.append("Accuracy of a sparse row is the pruned model's (no fine-tuning); max abs diff compares it with the "
                 "thresholded model on 512 test images. Predict speed-up: dense `predict` time over the pruned "
                 "model's (batch 256, the test set, median of 3).")
    return "\n".join(lines) + "\n"


def summary(args, records):
    """The run in one line, for RESULTS.md's index."""
    parts = []
    transformer = [r for r in records if r["model"] == "transformer"]
    if transformer:
        dense, budget = transformer
        parts.append(
            f"A Transformer ({args.blocks} blocks, width {args.width}, 4 heads, feed-forward {args.ffn * args.width}; "
            f"rows of Fashion-MNIST as tokens) with `SparsityBudget(max_flops={args.flops:g})`: "
            f"{100 * budget['test']:.2f} % vs dense {100 * dense['test']:.2f} % at {budget['flops_ratio']:.3f} of the "
            f"FLOPs (heads {', '.join(budget['heads'].values())}), surgery gap {budget['max_diff']:.1e}, predict "
            f"{budget['speedup']:.2f}x faster")
    lstm_rows = [r for r in records if r["model"] == "lstm"]
    if lstm_rows:
        dense, sparse, scratch = lstm_rows
        parts.append(
            f"An LSTM({args.lstm_units}), {sparse['method']}: {100 * sparse['test']:.2f} % vs dense "
            f"{100 * dense['test']:.2f} % ({sparse['features']} of {ROWS} columns, {sparse['units']['lstm']} units); "
            f"an LSTM of that size trained from scratch {100 * scratch['test']:.2f} %")
    return ". ".join(parts) + f". Seed {args.seed}, {args.epochs} epochs, no fine-tuning"


def main(argv=None):
    parser = common.arguments(__doc__, quick=QUICK)
    parser.add_argument("--epochs", type=common.positive_int, default=15)
    parser.add_argument("--n-train", type=common.positive_int, default=60000)
    parser.add_argument("--n-test", type=common.positive_int, default=10000)
    parser.add_argument("--batch-size", type=common.positive_int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--width", type=common.positive_int, default=64)
    parser.add_argument("--blocks", type=common.positive_int, default=2)
    parser.add_argument("--ffn", type=common.positive_int, default=2, help="feed-forward width, times --width")
    parser.add_argument("--lam", type=float, default=1e-4)
    parser.add_argument("--flops", type=float, default=0.5, help="the Transformer budget's max_flops (a fraction)")
    parser.add_argument("--lstm-units", type=common.positive_int, default=64)
    parser.add_argument("--lstm-lam", type=float, default=1e-4)
    parser.add_argument("--lstm-flops", type=float, default=0.5,
                        help="the LSTM budget's max_flops (a fraction); 0: no budget, lambda alone")
    parser.add_argument("--only", choices=("transformer", "lstm"))
    parser.add_argument("--out", action="store_true",
                        help="results to benchmarks/results/<name>.md and .json (without it: benchmarks/out/)")
    args = parser.parse_args(argv)
    if args.quick:
        args.n_train, args.n_test, args.epochs = 2000, 1000, 1
    data = load(args)
    run = common.Run(NAME, args, seeds=[args.seed])
    if not args.out:  # only --out writes over the committed results
        run.out = common.HERE / "out"
    records = [] if args.only == "lstm" else [{"model": "transformer", **r} for r in run_transformer(args, data)]
    if args.only != "transformer":
        records += [{"model": "lstm", **r} for r in run_lstm(args, data)]
    notes = [(f"{args.n_train:,} training and {args.n_test:,} test images; {args.epochs} epochs, batch "
              f"{args.batch_size}, seed {args.seed} (one run).")]
    run.publish(TITLE, body(args, records), records, notes=notes, section=False, summary=summary(args, records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
