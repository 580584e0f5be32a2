"""Proximal(Adam) on recurrent layers: what the first steps keep, next to Adam's subgradient and the plain metric.

A keras.io-style text classifier on real text that needs no download: 48-character windows of the Python standard
library's own source lines, labelled comment (a line that starts with ``#``; the ``#`` and the indentation are cut
off) or code. Characters are tokens (printable ASCII, one id each). The model: ``Embedding(100, 16)``,
``Bidirectional(LSTM(16, return_sequences=True))``, ``Bidirectional(LSTM(16))``, ``Dense(2)``; the same initial
weights for every row of one seed.

Rows, each with ``add_group_sparsity(model, λ)``:

* ``adam``: plain Adam; the penalties' gradients are in the loss (subgradient); weights at or below the paper's
  threshold 1e-3 count as zero.
* ``prox-adam``: ``Proximal(Adam)``, the step in Adam's metric (the default, ``metric="auto"``).
* ``prox-adam-euclidean``: ``Proximal(Adam, metric="euclidean")``: thresholds ``lr·λ``.
* ``prox-adam-warmup`` (with ``--modes``): ``Proximal(Adam)`` whose penalty multiplier
  (``set_penalty_multiplier``) rises linearly from 0 to 1 over the first epoch's steps (the 10 single steps
  included), so that Adam's moments and the network settle before the penalty is whole.

Columns: the LSTM kernels' weights at or below 1e-3 and the LSTM units alive after the first step and after 10
steps, then after training: test accuracy and the same counts (``sparsity_report`` at 1e-3).

    python benchmarks/proximal_recurrent.py            # writes benchmarks/results/proximal_recurrent.md / .json
    python benchmarks/proximal_recurrent.py --quick    # a smoke run into benchmarks/out/
"""

import statistics
import sys
import sysconfig
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import common  # noqa: E402

WINDOW = 48
VOCAB = 100  # printable ASCII 32..126 -> 1..95, anything else -> 96; 0 pads
MODES = ("adam", "prox-adam", "prox-adam-euclidean")
ALL_MODES = (*MODES, "prox-adam-warmup")


def windows(n, seed):
    """``n`` comment windows and ``n`` code windows from the standard library's sources, shuffled: ``(x, y)``."""
    rng = np.random.default_rng(seed)
    found = {0: [], 1: []}
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        for line in path.read_text(errors="replace").splitlines():
            text = line.strip()
            if text.startswith("#"):
                text, label = text.lstrip("#").strip(), 1
            else:
                label = 0
            if len(text) >= 24:
                found[label].append(text[:WINDOW])
    picked = [(text, label) for label in (0, 1) for text in rng.choice(found[label], n, replace=False)]
    order = rng.permutation(len(picked))
    x = np.zeros((len(picked), WINDOW), "int32")
    for row, k in enumerate(order):
        codes = [ord(c) - 31 if 32 <= ord(c) < 127 else 96 for c in picked[k][0]]
        x[row, : len(codes)] = codes
    return x, np.array([picked[k][1] for k in order], "int32")


def build(seed):
    import keras

    keras.utils.set_random_seed(seed)
    tokens = keras.Input((WINDOW,), dtype="int32")
    h = keras.layers.Embedding(VOCAB, 16, name="embedding")(tokens)
    h = keras.layers.Bidirectional(keras.layers.LSTM(16, return_sequences=True), name="lstm1")(h)
    h = keras.layers.Bidirectional(keras.layers.LSTM(16), name="lstm2")(h)
    return keras.Model(tokens, keras.layers.Dense(2, name="logits")(h))


def recurrent_counts(model):
    """(% of the LSTM kernels' weights at or below 1e-3, LSTM units alive, LSTM units)."""
    from keras_group_lasso import sparsity_report

    layers = [layer for layer in sparsity_report(model, 1e-3).layers if layer.name.startswith("lstm")]
    zero = sum(layer.zero_weights for layer in layers) / sum(layer.weights for layer in layers)
    return 100.0 * zero, sum(layer.units_alive for layer in layers), sum(layer.units for layer in layers)


def train(mode, lam, seed, data, args):
    import keras

    from keras_group_lasso import Proximal, add_group_sparsity, set_penalty_multiplier

    x, y, x_test, y_test = data
    model = add_group_sparsity(build(seed), lam)
    adam = keras.optimizers.Adam(args.learning_rate)
    optimizer = adam if mode == "adam" else Proximal(adam, metric="euclidean" if "euclidean" in mode else "auto")
    model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    record = {"mode": mode, "lam": lam, "seed": seed}
    batch = args.batch_size
    warmup = 10 + -(-len(x) // batch) if mode == "prox-adam-warmup" else 0  # steps: the single ones and an epoch
    done = [0]

    def ramp():
        if warmup and done[0] <= warmup:
            set_penalty_multiplier(model, done[0] / warmup)
        done[0] += 1

    class Ramp(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            ramp()

    for step in range(10):
        ramp()
        model.train_on_batch(x[step * batch:(step + 1) * batch], y[step * batch:(step + 1) * batch])
        if step in (0, 9):
            record[f"step{step + 1}"] = recurrent_counts(model)
    model.fit(x, y, epochs=args.epochs, batch_size=batch, verbose=0, callbacks=[Ramp()] if warmup else [])
    record["end"] = recurrent_counts(model)
    record["accuracy"] = float(model.evaluate(x_test, y_test, batch_size=1024, verbose=0)[1])
    common.say(f"{mode} λ={lam:g} seed {seed}: acc {record['accuracy']:.4f}, after 1 step "
               f"{record['step1'][0]:.0f} % ≤1e-3, units {record['step1'][1]}; end {record['end']}")
    return record


def table(records, lams):
    rows = []
    for lam in lams:
        for mode in ALL_MODES:
            mine = [r for r in records if r["mode"] == mode and r["lam"] == lam]
            if not mine:
                continue

            def cell(key, index, digits=0):
                values = [r[key][index] for r in mine]
                return common.mean_std(values, digits) if len(values) > 1 else f"{values[0]:.{digits}f}"

            units = mine[0]["end"][2]
            rows.append([f"`{mode}`", f"{lam:g}", cell("step1", 0), f"{cell('step1', 1)} / {units}",
                         cell("step10", 0), f"{cell('step10', 1)} / {units}",
                         common.mean_std([100 * r["accuracy"] for r in mine], 1) if len(mine) > 1
                         else f"{100 * mine[0]['accuracy']:.1f}",
                         cell("end", 0), f"{cell('end', 1)} / {units}"])
    return common.markdown_table(
        ["optimizer", "λ", "≤1e-3 after 1 step [%]", "LSTM units alive", "≤1e-3 after 10 steps [%]",
         "LSTM units alive", "test acc. [%]", "≤1e-3 at the end [%]", "LSTM units alive"], rows)


def main():
    parser = common.arguments(__doc__, seeds=2)
    parser.add_argument("--epochs", type=common.positive_int, default=8)
    parser.add_argument("--windows", type=common.positive_int, default=4000, help="training windows of each label")
    parser.add_argument("--batch-size", type=common.positive_int, default=64)
    parser.add_argument("--learning-rate", type=float, default=1e-2)
    parser.add_argument("--lams", type=float, nargs="+", default=[1e-4, 3e-4, 1e-3])
    parser.add_argument("--modes", nargs="+", choices=ALL_MODES, default=list(MODES))
    args = parser.parse_args()
    if args.quick:
        args.epochs, args.windows, args.lams = 1, 500, [1e-3]
    run = common.Run("proximal_recurrent", args)
    records = []
    for seed in run.seeds:
        x, y = windows(args.windows + args.windows // 4, seed)
        split = 2 * args.windows
        data = (x[:split], y[:split], x[split:], y[split:])
        for lam in args.lams:
            for mode in args.modes:
                records.append(train(mode, lam, seed, data, args))
    accuracies = {mode: statistics.fmean(r["accuracy"] for r in records if r["mode"] == mode) * 100
                  for mode in args.modes}
    notes = [f"{2 * args.windows} training windows (half comments), {2 * (args.windows // 4)} test windows, "
             f"{args.epochs} epochs of batch {args.batch_size} after 10 single steps, Adam({args.learning_rate:g})",
             "Counts from `sparsity_report(model, 1e-3)` over both Bidirectional LSTMs (kernels: input and "
             "recurrent; units: both directions)"]
    title = "Proximal(Adam) on recurrent layers: the first steps" + (
        ", and the penalty warmed up over the first epoch" if "prox-adam-warmup" in args.modes else "")
    run.publish(title, table(records, args.lams), records,
                notes=notes, summary="Proximal(Adam) on a character BiLSTM (standard-library comments vs code), mean "
                "accuracy per optimizer: " + ", ".join(f"{mode} {value:.1f} %" for mode, value in accuracies.items()))


if __name__ == "__main__":
    main()
