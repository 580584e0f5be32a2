"""What each penalty and Proximal add to ONE compiled training step: XLA's cost analysis, HLO counts, step time.

Per-epoch timings on a shared 2-core machine spread by about 10 %, too much to
resolve a 2 % effect. This benchmark counts instead: on JAX every variant's
``model.train_step`` (the function Keras's JAX trainer compiles, with the
state donated as Keras does) is lowered and compiled once with ``jax.jit``,
and the optimized module is read:

* ``compiled.cost_analysis()``: flops, bytes accessed, transcendentals
  (XLA's own estimate of the work of the step; independent of the machine's
  load);
* the optimized HLO text (``compiled.as_text()``): instructions of the whole
  module (fused computations included), instructions of the entry
  computation (roughly the kernels the CPU runtime executes per step, less
  parameters and constants), its fusions, copies and dots;
* the matmul flops of the forward and backward pass computed from the layer
  shapes (``2 * batch * in * out`` per Dense layer and pass, ``2 * batch * H *
  W * k * k * C_in * C_out`` per convolution; no input gradient for the first
  layer), for scale;
* the wall and CPU time of one compiled step: every variant runs units of the
  same number of steps, interleaved, the order rotating each round; median and
  interquartile range (IQR) over the units. CPU time is that of the whole
  process (all XLA threads).

Models (the same as ``overhead.py``): the 784-400-300-100-10 ReLU MLP with
softmax (batch 400) and the CNN Conv(16)-BN-ReLU-MaxPool-Conv(32)-BN-ReLU-
MaxPool-Flatten-Dense(64)-Dense(10) on 28x28x1 (batch 128), sparse categorical
cross-entropy. Variants: no penalty, Keras L2, Keras L1, GroupLasso,
SparseGroupLasso (1e-4 on every kernel and bias of the MLP; on the CNN the
Keras penalties on the kernels and the group penalties from
``add_group_sparsity``, channel groups), all with Adam (reference: L2); and per
optimizer (SGD momentum 0.9, Adam) the plain optimizer without penalty
(reference), ``Proximal(optimizer)`` with SparseGroupLasso everywhere and the
same penalties by subgradient.

On TensorFlow the same train steps are compiled by ``tf.function(jit_compile=True)``
and only the HLO counts (``experimental_get_compiler_ir(...)(stage="optimized_hlo")``)
and step times are reported: XLA's cost analysis is not exposed there.

Usage:
    KERAS_BACKEND=jax python benchmarks/step_cost.py          # -> benchmarks/results/step_cost_jax.md
    KERAS_BACKEND=tensorflow python benchmarks/step_cost.py   # -> benchmarks/results/step_cost_tensorflow.md
    KERAS_BACKEND=jax python benchmarks/step_cost.py --quick  # MLP only, few rounds, to benchmarks/out/
"""

import collections
import math
import os
import re
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import common, overhead  # noqa: E402

MODELS = ("mlp", "cnn")
BATCH = {"mlp": 400, "cnn": 128}
# name -> (penalty, optimizer, proximal); the penalty names are overhead.penalty_of's.
VARIANTS = {
    "none (Adam)": ("none", "adam", False),
    "L2 (Adam)": ("L2", "adam", False),
    "L1 (Adam)": ("L1", "adam", False),
    "GroupLasso (Adam)": ("GroupLasso", "adam", False),
    "SparseGroupLasso (Adam)": ("SparseGroupLasso", "adam", False),
    "SGD plain": ("none", "sgd-momentum", False),
    "Proximal(SGD) SGL": ("SparseGroupLasso", "sgd-momentum", True),
    "SGD subgradient SGL": ("SparseGroupLasso", "sgd-momentum", False),
    "Proximal(Adam) SGL": ("SparseGroupLasso", "adam", True),
}
# Comparison tables: (title, reference, rows); "Adam plain" is "none (Adam)", "Adam subgradient" is "SGL (Adam)".
COMPARISONS = (
    ("Penalties (Adam), vs Keras L2", "L2 (Adam)",
     ("none (Adam)", "L2 (Adam)", "L1 (Adam)", "GroupLasso (Adam)", "SparseGroupLasso (Adam)")),
    ("SGD momentum 0.9: Proximal vs plain", "SGD plain", ("SGD plain", "Proximal(SGD) SGL", "SGD subgradient SGL")),
    ("Adam: Proximal vs plain", "none (Adam)", ("none (Adam)", "Proximal(Adam) SGL", "SparseGroupLasso (Adam)")),
)


# ----------------------------------------------------------------------------- models


def cnn(penalty):
    """overhead.py's CNN with ``penalty``: Keras ones on the kernels, group ones by ``add_group_sparsity``."""
    import keras

    from keras_group_lasso import add_group_sparsity

    if penalty in ("none", "L2", "SparseGroupLasso"):
        return overhead.cnn({"SparseGroupLasso": "SGL"}.get(penalty, penalty))
    if penalty == "GroupLasso":
        return add_group_sparsity(overhead.cnn("none"), overhead.FACTOR, penalty="group")
    model = overhead.cnn("none")
    for layer in model.layers:  # L1: the same kernels overhead.cnn gives L2
        if hasattr(layer, "kernel_regularizer") and not isinstance(layer, keras.layers.BatchNormalization):
            layer.kernel_regularizer = keras.regularizers.L1(overhead.FACTOR)
    return keras.models.clone_model(model)  # rebuilt so that the regularizers are part of the layers


def build(kind, variant, x, y):
    """A compiled Keras model of ``variant`` whose optimizer and metrics are built (one Keras train step)."""
    penalty, opt, proximal = VARIANTS[variant]
    model = overhead.mlp(penalty) if kind == "mlp" else cnn(penalty)
    model.compile(optimizer=overhead.optimizer(opt, proximal), loss="sparse_categorical_crossentropy",
                  jit_compile=True)
    model.train_on_batch(x, y)
    return model


def matmul_flops(kind, batch):
    """``(forward, backward)`` flops of the Dense and convolution products of one step, from the shapes."""
    if kind == "mlp":
        shapes = list(zip(overhead.MLP[:-1], overhead.MLP[1:]))
        products = [batch * n_in * n_out for n_in, n_out in shapes]
    else:
        products = [batch * 28 * 28 * 9 * 1 * 16, batch * 14 * 14 * 9 * 16 * 32, batch * 7 * 7 * 32 * 64,
                    batch * 64 * 10]
    forward = 2 * sum(products)
    backward = 2 * sum(products) + 2 * sum(products[1:])  # kernel gradients, then input gradients but the first
    return forward, backward


# ----------------------------------------------------------------------------- cost of the compiled step


_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s+=\s+(?:\([^=]*?\)|[^\s(]+)\s+([a-z][\w\-]*)\(")


def hlo_counts(text):
    """Opcode counts of an optimized HLO module: ``(all instructions, entry computation's)`` as Counters."""
    everything, entry, in_entry = collections.Counter(), collections.Counter(), False
    for line in text.splitlines():
        if line.startswith("ENTRY"):
            in_entry = True
            continue
        if line.startswith("}"):
            in_entry = False
        match = _INSTRUCTION.match(line)
        if match:
            everything[match.group(1)] += 1
            if in_entry:
                entry[match.group(1)] += 1
    return everything, entry


def cost_dict(compiled):
    """``compiled.cost_analysis()`` as one dict of the module's totals (older JAX returns a list of dicts)."""
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else {}
    return {k: float(v) for k, v in (cost or {}).items() if not re.search(r"\d", k)}


def compile_step(model, x, y):
    """``(jitted step, its state, data, compiled)``: ``model.train_step`` as the JAX trainer jits it."""
    import jax
    import jax.numpy as jnp

    groups = (model.trainable_variables, model.non_trainable_variables, model.optimizer.variables,
              model.metrics_variables)
    # Own copies: the step donates its state, which must not delete the model's buffers.
    state = tuple([jnp.array(v.value, copy=True) for v in variables] for variables in groups)
    data = (jnp.asarray(x), jnp.asarray(y))
    step = jax.jit(model.train_step, donate_argnums=0)
    compiled = step.lower(state, data).compile()
    return compiled, state, data


def penalty_part(model):
    """The compiled value and gradient of the model's weight penalties alone (None without penalties)."""
    import jax
    import jax.numpy as jnp

    index = {id(v): i for i, v in enumerate(model.trainable_variables)}
    terms = []
    for layer in model.layers:
        for attr in ("kernel", "bias", "depthwise_kernel", "pointwise_kernel"):
            penalty = getattr(layer, f"{attr}_regularizer", None)
            variable = getattr(layer, attr, None)
            if penalty is not None and variable is not None and id(variable) in index:
                terms.append((index[id(variable)], penalty))
    if not terms:
        return None

    def total(values):
        return sum(penalty(values[i]) for i, penalty in terms)

    values = [jnp.array(v.value, copy=True) for v in model.trainable_variables]
    return jax.jit(jax.value_and_grad(total)).lower(values).compile(), (values,)


def optimizer_part(model):
    """The compiled ``optimizer.stateless_apply`` alone (the update of one step, from given gradients)."""
    import jax
    import jax.numpy as jnp

    values = [jnp.array(v.value, copy=True) for v in model.trainable_variables]
    slots = [jnp.array(v.value, copy=True) for v in model.optimizer.variables]
    grads = [jnp.full(v.shape, 1e-3, v.dtype) for v in values]
    step = jax.jit(lambda s, g, v: model.optimizer.stateless_apply(s, g, v))
    return step.lower(slots, grads, values).compile(), (slots, grads, values)


def part_row(part):
    compiled = part[0]
    everything, entry = hlo_counts(compiled.as_text())
    return {"cost": cost_dict(compiled), "instructions": sum(everything.values()),
            "entry_ops": sum(v for k, v in entry.items() if k not in _NOT_RUN), "fusions": entry.get("fusion", 0)}


_NOT_RUN = ("parameter", "constant", "tuple", "get-tuple-element", "bitcast")


def tf_step(model, x, y):
    """``(optimized HLO text, runner)`` of ``model.train_step`` under ``tf.function(jit_compile=True)``."""
    import tensorflow as tf

    data = (tf.constant(x), tf.constant(y))
    step = tf.function(model.train_step, jit_compile=True)
    text = step.experimental_get_compiler_ir(data)(stage="optimized_hlo")
    return text, TFSteps(step, data)


def measure(kind, variant, x, y):
    """``(row of counts, timing runner, {part: compiled part or None})`` of one variant."""
    import keras

    start = time.perf_counter()
    model = build(kind, variant, x, y)
    if keras.backend.backend() == "tensorflow":  # XLA's cost analysis is not exposed here: counts only
        text, runner = tf_step(model, x, y)
        cost, parts = {}, {}
    else:
        compiled, state, data = compile_step(model, x, y)
        text, runner, cost = compiled.as_text(), Steps(compiled, state, data), cost_dict(compiled)
        parts = {"penalty": penalty_part(model), "optimizer": optimizer_part(model)}
    everything, entry = hlo_counts(text)
    executed = {k: v for k, v in entry.items() if k not in _NOT_RUN}
    row = {
        "cost": cost,
        "instructions": sum(everything.values()),
        "entry_ops": sum(executed.values()),
        "fusions": entry.get("fusion", 0),
        "copies": entry.get("copy", 0),
        "dots": entry.get("dot", 0) + entry.get("convolution", 0),
        "entry_opcodes": dict(entry.most_common()),
        "compile_s": time.perf_counter() - start,
    }
    row["parts"] = {name: part_row(part) if part else None for name, part in parts.items()}
    return row, runner, parts


# ----------------------------------------------------------------------------- time of the compiled step


class Steps:
    """Runs of a compiled train step whose donated state is carried from call to call."""

    def __init__(self, compiled, state, data):
        self.compiled, self.state, self.data = compiled, state, data

    def __call__(self, n):
        """``(wall, cpu)`` seconds of ``n`` steps."""
        import jax

        wall, cpu = time.perf_counter(), time.process_time()
        state = self.state
        for _ in range(n):
            _, state = self.compiled(state, self.data)
        jax.block_until_ready(state)
        self.state = state
        return time.perf_counter() - wall, time.process_time() - cpu


class TFSteps:
    """Runs of a ``tf.function`` train step (the variables are updated in place)."""

    def __init__(self, step, data):
        self.step, self.data = step, data

    def __call__(self, n):
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(n):
            logs = self.step(self.data)
        next(iter(logs.values())).numpy()  # wait for the last step
        return time.perf_counter() - wall, time.process_time() - cpu


class Calls:
    """Runs of a compiled function on fixed arguments (nothing donated), each call waited for."""

    def __init__(self, compiled, args):
        self.compiled, self.args = compiled, args

    def __call__(self, n):
        import jax

        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(n):
            jax.block_until_ready(self.compiled(*self.args))
        return time.perf_counter() - wall, time.process_time() - cpu


def interleave(steps, rounds, unit_seconds, say=common.say):
    """Seconds per call of every runner in ``steps`` (:class:`Steps`, :class:`Calls`), interleaved.

    Returns ``({name: {"wall": [...], "cpu": [...]}}, calls per unit)``.
    """
    sizing = {}
    for name, run in steps.items():
        run(3)  # warm-up
        sizing[name] = run(5)[0] / 5
    per_unit = max(1, math.ceil(unit_seconds / max(min(sizing.values()), 1e-9)))
    samples = {name: {"wall": [], "cpu": []} for name in steps}
    names = list(steps)
    for r in range(rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            wall, cpu = steps[name](per_unit)
            samples[name]["wall"].append(wall / per_unit)
            samples[name]["cpu"].append(cpu / per_unit)
        if (r + 1) % max(1, rounds // 5) == 0:
            say(f"  round {r + 1}/{rounds}")
    return samples, per_unit


# ----------------------------------------------------------------------------- tables


def ms(values):
    median, iqr = overhead.spread(values)
    return f"{1e3 * median:.2f} ± {1e3 * iqr:.2f}"


def cost_table(rows, samples, reference, names):
    """Markdown: cost numbers, HLO counts and step times of ``names``, ratios to ``reference``."""
    head = ["variant", "GFLOP", "ratio", "MB accessed", "ratio", "transcend.", "HLO instr.", "entry ops",
            "fusions", "copies", "ratio entry ops", "wall ms/step", "CPU ms/step", "wall ratio", "CPU ratio"]
    ref = rows[reference]
    out = []
    for name in names:
        row, cost = rows[name], rows[name]["cost"]
        if cost:
            cells = [name, f"{cost['flops'] / 1e9:.4f}", f"{cost['flops'] / ref['cost']['flops']:.3f}x",
                     f"{cost['bytes accessed'] / 1e6:.2f}", f"{cost['bytes accessed'] / ref['cost']['bytes accessed']:.3f}x",
                     f"{cost.get('transcendentals', 0):,.0f}"]
        else:
            cells = [name] + ["-"] * 5
        cells += [str(row["instructions"]), str(row["entry_ops"]),
                 str(row["fusions"]), str(row["copies"]), f"{row['entry_ops'] / ref['entry_ops']:.2f}x"]
        if samples:
            cells += [ms(samples[name]["wall"]), ms(samples[name]["cpu"]),
                      overhead.ratio_cell(samples, name, reference, "wall"),
                      overhead.ratio_cell(samples, name, reference, "cpu")]
        else:
            cells += ["-"] * 4
        out.append(cells)
    return common.markdown_table(head, out)


def parts_table(rows, samples):
    """Markdown: per variant, cost and time of its penalty term alone and of its optimizer update alone."""
    head = ["variant", "penalty MFLOP", "penalty MB", "penalty entry ops", "penalty wall µs", "update MFLOP",
            "update MB", "update entry ops", "update wall µs"]
    out = []
    for name, row in rows.items():
        cells = [name]
        for part in ("penalty", "optimizer"):
            got = row["parts"][part]
            key = f"{name}: {part}"
            if got is None:
                cells += ["-"] * 4
                continue
            wall, iqr = overhead.spread(samples[key]["wall"])
            cells += [f"{got['cost'].get('flops', 0) / 1e6:.2f}", f"{got['cost'].get('bytes accessed', 0) / 1e6:.2f}",
                      str(got["entry_ops"]), f"{1e6 * wall:.0f} ± {1e6 * iqr:.0f}"]
        out.append(cells)
    return common.markdown_table(head, out)


def bytes_fit(rows, samples, clock):
    """One line: least-squares fit of the median step time on the bytes accessed, over all variants.

    Only where the bytes differ by at least 10 % between variants; below that
    the timing noise hides the slope.
    """
    names = list(rows)
    mb = np.array([rows[n]["cost"].get("bytes accessed", 0) / 1e6 for n in names])
    if mb.max() - mb.min() < 0.1 * mb.mean():
        return (f"{clock}: no fit, the bytes accessed differ by only {100 * (mb.max() - mb.min()) / mb.mean():.1f} % "
                "between variants")
    step_ms = np.array([1e3 * overhead.spread(samples[n][clock])[0] for n in names])
    slope, intercept = np.polyfit(mb, step_ms, 1)
    r2 = 1 - np.sum((step_ms - (slope * mb + intercept)) ** 2) / max(np.sum((step_ms - step_ms.mean()) ** 2), 1e-30)
    return (f"{clock} ms/step = {intercept:.2f} + {slope:.4f} x MB accessed (r² {r2:.2f}; "
            f"{1 / slope if slope > 0 else float('inf'):.1f} GB/s of extra traffic per extra ms)")


QUICK = "MLP only, 5 rounds; to benchmarks/out/"


def main(argv=None):
    parser = common.arguments(__doc__, quick=QUICK)
    parser.add_argument("--models", nargs="+", choices=MODELS, default=None,
                        help="default: both on JAX, the MLP on TensorFlow (its CNN step does not compile with XLA "
                        "here: the optimizer's variables are created inside the compiled function)")
    parser.add_argument("--rounds", type=common.positive_int, default=60, help="interleaved timing rounds")
    parser.add_argument("--unit-seconds", type=float, default=0.05, help="shortest timed unit (default 0.05 s)")
    args = parser.parse_args(argv)
    if args.quick:
        args.models, args.rounds = ["mlp"], 5
    os.environ.setdefault("KERAS_BACKEND", "jax")  # before Keras is first imported

    import keras

    backend = keras.backend.backend()
    if backend not in ("jax", "tensorflow"):
        raise SystemExit(f"step_cost.py compiles the JAX or TensorFlow train step (KERAS_BACKEND={backend})")
    if args.models is None:
        args.models = list(MODELS) if backend == "jax" else ["mlp"]
    run = common.Run(f"step_cost_{backend}", args)
    records, lines = [], []
    for kind in args.models:
        batch = BATCH[kind]
        x, y, source = overhead.load(kind, batch)
        common.say(f"{kind}: compiling {len(VARIANTS)} train steps ({source})")
        rows, steps, part_runs = {}, {}, {}
        for name in VARIANTS:
            rows[name], steps[name], parts = measure(kind, name, x, y)
            for part, built in parts.items():
                if built is not None:
                    part_runs[f"{name}: {part}"] = Calls(*built)
            cost = rows[name]["cost"]
            common.say(f"  {name}: {cost.get('flops', 0) / 1e9:.4f} GFLOP, {cost.get('bytes accessed', 0) / 1e6:.2f} "
                       f"MB, {rows[name]['instructions']} instructions, {rows[name]['entry_ops']} entry ops, "
                       f"{rows[name]['fusions']} fusions "
                       f"({rows[name]['compile_s']:.1f} s)")
        common.say(f"{kind}: timing the steps, {args.rounds} rounds")
        samples, per_unit = interleave(steps, args.rounds, args.unit_seconds)
        forward, backward = matmul_flops(kind, batch)
        tables = [(title, cost_table(rows, samples, reference, names)) for title, reference, names in COMPARISONS]
        part_samples = {}
        if part_runs:
            common.say(f"{kind}: timing the parts (penalty alone, optimizer update alone), {args.rounds} rounds")
            part_samples, _ = interleave(part_runs, args.rounds, args.unit_seconds / 5)
            tables.append(("The parts alone: the penalties' value and gradient, the optimizer's update",
                           parts_table(rows, part_samples)))
        for title, text in tables:
            print(f"\n{kind}: {title}\n{text}\n", flush=True)
        fits = [bytes_fit(rows, samples, clock) for clock in ("wall", "cpu")] if backend == "jax" else []
        print("\n".join(fits), flush=True)
        lines += [f"## {kind.upper()}, batch {batch}", "",
                  f"Data: one batch of {source.split(' x ', 1)[1]}; {per_unit} steps per timed unit. Matmul/conv "
                  f"flops from the layer shapes: forward {forward / 1e9:.4f} GFLOP, backward {backward / 1e9:.4f} "
                  f"GFLOP, step {(forward + backward) / 1e9:.4f} GFLOP.", ""]
        for title, text in tables:
            lines += [f"### {title}", "", text, ""]
        if fits:
            lines += ["Step time against bytes accessed, all variants:", ""]
            lines += [f"- {fit}" for fit in fits] + [""]
        lines += ["Entry-computation opcodes per variant:", ""]
        lines += [f"- {name}: " + ", ".join(f"{k} {v}" for k, v in row["entry_opcodes"].items())
                  for name, row in rows.items()]
        lines += [""]
        records.append({"model": kind, "batch": batch, "data": source, "steps_per_unit": per_unit,
                        "matmul_flops": {"forward": forward, "backward": backward}, "variants": rows,
                        "seconds_per_step": samples, "seconds_per_part_call": part_samples, "bytes_fits": fits})
        del steps, part_runs
    notes = [
        ("Cost columns: XLA's `cost_analysis()` of the compiled `model.train_step` (state donated, as the "
         "Keras JAX trainer does) and counts of the optimized HLO module: "
         if backend == "jax" else
         "Counts of the optimized HLO module of `tf.function(model.train_step, jit_compile=True)` "
         "(`experimental_get_compiler_ir`; XLA's cost analysis is not exposed on TensorFlow): ") +
        "`HLO instr.` all instructions "
        "(fused computations included), `entry ops` the entry computation's instructions less parameters, "
        "constants, tuples and bitcasts (about the kernels run per step), `fusions` and `copies` among "
        "them. These do not depend on the machine's load.",
        f"Timing columns: median ± IQR over {args.rounds} interleaved rounds (order rotating) of units of "
        "the same number of steps for every variant, the fastest unit at least "
        f"{args.unit_seconds:g} s; CPU time of the whole process. The machine was shared with other jobs: "
        "timings spread by several %, so only the cost columns resolve a 2 % effect; a ratio is flagged "
        "where the relative IQR of either side is at least the effect.",
    ]
    run.publish(f"Cost of one compiled training step ({backend})", "\n".join(lines), records, notes=notes,
                section=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
