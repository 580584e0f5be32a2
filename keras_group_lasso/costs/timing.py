"""Timing what a structure costs: compiled inference calls of a model and of standalone copies of its layers, sampled
side by side on the running backend and device (:class:`.LatencyTable` holds what they measure).

The model is only read: each layer is timed as a copy built from its config and weights at each width, the narrow
rest as a copy pruned from values the model never holds.
"""

import math
import numbers
import os
import platform
import time
import warnings

import keras
import numpy as np

from keras_group_lasso import analysis
from keras_group_lasso._validation import Described, check_positive_int, fail
from keras_group_lasso.graph import Kind, registry
from keras_group_lasso.surgery.build import prune_as_if

__all__ = ["DEFAULT_GRID", "TINY", "measure_fields", "time_model", "time_models", "current_device", "check_batch_sizes",
           "check_grid", "input_shapes", "unit_shapes", "output_positions"]

_OWNER = "LatencyTable"
#: Widths measured per layer, as fractions of the dense width (each axis).
DEFAULT_GRID = (0.125, 0.5, 1.0)
TINY = 1e-9  # the least time a layer or a model takes
_SAMPLE_SECONDS = 2e-3  # a timing sample repeats a fast call until it lasts about this long
_HELD_BYTES = 1 << 30  # the inputs of the calls measure_fields compiles before sampling them together


def _compiled(obj, is_model):
    """``call(x)``: a compiled inference call of a layer or model on the running backend, returning when done.

    TensorFlow: ``tf.function`` (the graph a SavedModel serves); JAX: ``jax.jit`` of
    ``stateless_call``; PyTorch: an eager call under ``torch.no_grad()``.
    """
    backend = keras.backend.backend()
    kwargs = {"training": False} if is_model else {}
    if backend == "jax":
        import jax

        trainable = [v.value for v in obj.trainable_variables]
        non_trainable = [v.value for v in obj.non_trainable_variables]
        run = jax.jit(lambda t, n, x: obj.stateless_call(t, n, x, **kwargs)[0])
        return lambda x: jax.block_until_ready(run(trainable, non_trainable, x))
    if backend == "tensorflow":
        import tensorflow as tf

        run = tf.function(lambda x: obj(x, **kwargs), jit_compile=False)
        if not tf.config.list_logical_devices("GPU"):
            return run

        def call_and_wait(x):  # a GPU runs the kernels after the call returns: wait for them
            out = run(x)
            tf.test.experimental.sync_devices()
            return out

        return call_and_wait
    if backend == "torch":
        import torch

        accelerated = torch.cuda.is_available()

        def call(x):
            with torch.no_grad():
                out = obj(x, **kwargs)
            if accelerated:  # whatever the outputs' structure: the kernels run after the call returns
                torch.cuda.synchronize()
            return out

        return call
    return lambda x: obj(x, **kwargs)  # another backend: a plain call


class _Timer:
    """One compiled call, warmed up and ready to be sampled; ``best`` is the fastest sample so far.

    The fastest, not the median: on a shared machine other processes only ever slow a sample down (as
    ``timeit`` advises), and on a busy 2-core machine whole samples run tens of times slower.
    """

    def __init__(self, call, x):
        self.call, self.x = call, x
        call(x)  # the first call compiles
        start = time.perf_counter()
        call(x)  # a second warm-up (PyTorch and oneDNN settle in a call or two), timed for the sample's length
        once = time.perf_counter() - start
        self.calls = max(1, min(1000, int(_SAMPLE_SECONDS / max(once, 1e-7))))
        self.best = math.inf

    def sample(self):
        start = time.perf_counter()
        for _ in range(self.calls):
            self.call(self.x)
        self.best = min(self.best, (time.perf_counter() - start) / self.calls)

    def release(self):
        """Drop the compiled call and its input (the memory they hold); ``best`` stays."""
        self.call = self.x = None


def _sample(timers, repeats):
    """``repeats`` rounds, each taking one sample of every timer in turn (the order rotating every round).

    Interleaved rather than one timer's samples in a row: a slow spell of the machine (another process)
    then slows one sample of many timers, and each keeps a fast one from another round, where in a row it
    could slow every sample of the few timers it lands on. Rotating: no timer always runs right after the
    same one.
    """
    timers = list(timers)
    for r in range(repeats):
        shift = r % len(timers) if timers else 0
        for timer in timers[shift:] + timers[:shift]:
            timer.sample()


def _best_seconds(call, x, repeats):
    """The fastest of ``repeats`` samples of one call's wall time, after two warm-up calls (the first compiles)."""
    timer = _Timer(call, x)
    _sample([timer], repeats)
    return float(timer.best)


def _inputs(model, batch_size, owner):
    """Random inputs of ``batch_size`` for every input of ``model`` (a backend tensor, or a list of them)."""
    rng = np.random.default_rng(0)
    xs = []
    for tensor in model.inputs:
        shape = tuple(tensor.shape)[1:]
        if any(d is None for d in shape):
            fail(owner, "model", "a model whose inputs have a fixed size (a latency is measured on inputs of one "
                 "shape)", Described(f"a model with input shape {tuple(tensor.shape)}"))
        dtype = str(tensor.dtype)
        if "int" in dtype:
            value = np.zeros((batch_size,) + shape, dtype=dtype)
        else:
            value = rng.standard_normal((batch_size,) + shape).astype(dtype)
        xs.append(keras.ops.convert_to_tensor(value))
    return xs[0] if len(xs) == 1 else xs


def _processor():
    """The processor's model name where the system says it (Linux), else ``""``: two CPUs of as many cores are told
    apart, so that a table measured on one is measured again on the other."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            for line in info:
                if line.lower().startswith("model name"):
                    return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    return platform.processor() or ""


def current_device():
    """The device that runs the backend's calls, in words."""
    backend = keras.backend.backend()
    cpu = f"CPU ({_processor() or platform.machine() or 'unknown'}, {os.cpu_count()} cores)"
    try:
        if backend == "jax":
            import jax

            device = jax.devices()[0]
            return cpu if device.platform == "cpu" else f"{device.platform.upper()} ({device.device_kind})"
        if backend == "tensorflow":
            import tensorflow as tf

            gpus = tf.config.list_physical_devices("GPU")
            if not gpus:
                return cpu
            details = tf.config.experimental.get_device_details(gpus[0])
            return f"GPU ({details.get('device_name') or gpus[0].name})"
        if backend == "torch":
            import torch

            if torch.cuda.is_available():
                return f"GPU ({torch.cuda.get_device_name(0)})"
    except Exception:  # noqa: BLE001 - a device that cannot say its name is described as the CPU
        return cpu
    return cpu


def measure_fields(model, batch_sizes, grid, repeats):
    """The measured times of ``model`` (see :meth:`.LatencyTable.measure`), as :class:`.LatencyTable`'s arguments.

    For each layer that makes units (as :func:`~keras_group_lasso.graph.model_graph` finds them) a standalone copy
    is built at every grid point ``(in, out)`` (the widths ``ceil(f * dense)`` for ``f`` in ``grid``, one unit and
    the dense width, on each axis a pruning can narrow), with copies of the per-channel layers that read it alone
    (normalization, activation, pooling, dropout, up to the next branch or merge: :func:`_segments`), whose cost
    follows its width too. Each compiled inference call is warmed up twice and timed as the fastest of ``repeats``
    samples (a fast call repeated within a sample), less the fixed cost of one call (a call that only passes a
    small input on), which the whole model pays once. The calls are compiled first, as many as hold
    ``_HELD_BYTES`` of inputs, and sampled together in ``repeats`` rounds of one sample of each, the dense model's,
    the fixed call's and the narrow model's (every hidden layer at the grid's smallest fraction, built by
    :func:`~keras_group_lasso.surgery.build.prune_as_if`) too: a slow spell of the machine slows one sample of many
    calls, not every sample of a few. TensorFlow times a ``tf.function`` (what a SavedModel serves), JAX a
    ``jax.jit`` of the stateless call, PyTorch an eager call without gradients. The model itself is only read.

    Returns:
        ``{argument: value}`` for ``LatencyTable(**fields)`` less the time measuring took.
    """
    graph = analysis.analyze(model, threshold=0.0, owner=_OWNER).graph
    model_call = _compiled(model, is_model=True)
    positions = {node.name: output_positions(graph, node) for node in graph.units if not node.is_output}
    segments = _segments(graph)
    narrow, narrow_widths = _narrow_model(model, graph, grid[0])
    entries = {}
    for batch in batch_sizes:
        # The timed calls are compiled first and then sampled together in interleaved rounds (see
        # _sample), as many at a time as hold _HELD_BYTES of inputs (a large model's grid would not fit
        # in memory at once); the dense model, the fixed cost of a call and the narrow model in every round.
        x = _inputs(model, batch, _OWNER)
        fixed = [_Timer(model_call, x), _call_floor(batch)]
        dense, floor = fixed
        narrow_timer = None if narrow is None else _Timer(_compiled(narrow, is_model=True), x)
        fixed += [narrow_timer] if narrow_timer else []
        grids, waiting, held = {}, [], 0
        for node in graph.units:
            layer = graph.layers[node.name]
            rule = registry.units_rule(layer)
            shape = _layer_input_shape(graph, node, layer)
            fixed_in = node.reads_input and not graph.flat_features
            # A grouped convolution takes whole groups: its time follows its filters (multiples of a
            # group's), and its inputs go with them (one point on that axis).
            step = rule.width_step(layer)
            ins = _grid(node.in_units, grid, fixed_in or step is not None)
            outs = _grid(node.out_units, grid, node.is_output, step or 1)
            weights = rule.weights(layer)
            inputs = {}  # the points of one input width read the same input

            def grid_timers(after):
                return [[_layer_timer(layer, rule, weights, node, shape, width_in, width_out, batch, after,
                                      inputs) for width_out in outs] for width_in in ins]

            try:
                timers = grid_timers([graph.layers[name] for name in segments[node.name]])
            except Exception as error:  # noqa: BLE001 - a following layer that cannot be rebuilt at some
                if not segments[node.name] or _out_of_memory(error):  # width: the layer alone at every point
                    raise
                warnings.warn(f"{_OWNER}: layer {node.name!r} is timed alone: the layers after it "
                              f"({', '.join(segments[node.name])}) could not be rebuilt at every width "
                              f"({type(error).__name__}: {error}); their time counts in the rest.",
                              RuntimeWarning, stacklevel=3)
                segments[node.name] = ()
                inputs.clear()
                timers = grid_timers([])
            grids[node.name] = (ins, outs, timers)
            waiting += [t for row in timers for t in row]
            held += sum(_nbytes(value) for value in inputs.values())
            if held > _HELD_BYTES:
                _sample(fixed + waiting, repeats)
                for timer in waiting:
                    timer.release()
                waiting, held = [], 0
        if waiting or not grids:
            _sample(fixed + waiting, repeats)
        for timer in waiting + fixed:
            timer.release()
        layers = {}
        for name, (ins, outs, timers) in grids.items():
            seconds = np.array([[max(t.best - floor.best, TINY) for t in row] for row in timers])
            layers[name] = {"in": ins, "out": outs, "seconds": _monotone(seconds)}
        total = sum(float(entry["seconds"][-1, -1]) for entry in layers.values())
        # Standalone layers may add up to more than the compiled model (which fuses what they do apart):
        # their times then count in proportion, scaled to the model's.
        scale = min(1.0, dense.best / total) if total > 0 else 1.0
        entry = {"model": float(dense.best), "rest": max(0.0, dense.best - total), "scale": scale,
                 "call": float(floor.best), "layers": layers}
        if narrow_timer is not None:
            entry["narrow"] = float(narrow_timer.best)
        entries[batch] = entry
    return {"model_name": model.name, "layers": {node.name: (node.in_units, node.out_units) for node in graph.units},
            "entries": entries, "backend": keras.backend.backend(), "device": current_device(), "grid": grid,
            "positions": positions, "narrow_widths": narrow_widths, "segments": segments,
            "input_shapes": input_shapes(model),
            "layer_shapes": {node.name: unit_shapes(graph, node) for node in graph.units}}


def time_model(model, batch_size=256, repeats=5):
    """The time in seconds of one compiled inference call of ``model`` on a batch of ``batch_size``.

    Two warm-up calls, then the fastest of ``repeats`` samples in a row (:meth:`measure` takes its samples
    in rounds interleaved with the other calls of the table).
    """
    batch_size = check_positive_int(_OWNER, "batch_size", batch_size)
    repeats = check_positive_int(_OWNER, "repeats", repeats)
    if not isinstance(model, keras.Model):
        fail(_OWNER, "model", "a keras.Model", model)
    return _best_seconds(_compiled(model, is_model=True), _inputs(model, batch_size, _OWNER), repeats)


def time_models(models, batch_size=256, repeats=5):
    """The times in seconds of one compiled inference call of each of ``models``, measured side by side.

    Each is warmed up, then ``repeats`` rounds take one sample of every model in turn (the order rotating),
    and each keeps its fastest: a slow spell of the machine slows one sample of each, not every sample of one.
    What a comparison of a pruned model with its dense one should use.

    Example:
        >>> dense = keras.Sequential([keras.Input((32,)), keras.layers.Dense(256), keras.layers.Dense(10)])
        >>> small = keras.Sequential([keras.Input((32,)), keras.layers.Dense(8), keras.layers.Dense(10)])
        >>> len(time_models([dense, small], batch_size=64, repeats=2))
        2
    """
    batch_size = check_positive_int(_OWNER, "batch_size", batch_size)
    repeats = check_positive_int(_OWNER, "repeats", repeats)
    models = list(models) if isinstance(models, (list, tuple)) else models
    if not isinstance(models, list) or not models or not all(isinstance(m, keras.Model) for m in models):
        fail(_OWNER, "models", "a non-empty list of keras.Model", models)
    timers = [_Timer(_compiled(m, is_model=True), _inputs(m, batch_size, _OWNER)) for m in models]
    _sample(timers, repeats)
    return [float(t.best) for t in timers]


def check_batch_sizes(owner, name, value):
    values = value if isinstance(value, (tuple, list)) else (value,)
    if not values:
        fail(owner, name, "an integer >= 1 or a tuple of them", value)
    for v in values:
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
            fail(owner, name, "an integer >= 1 or a tuple of them", value)
    return tuple(sorted({int(v) for v in values}))


def check_grid(grid):
    constraint = "a non-empty sequence of fractions in (0, 1]"
    if isinstance(grid, (str, bytes)):
        fail(_OWNER, "grid", constraint, grid)
    try:
        items = tuple(grid)
    except TypeError:
        fail(_OWNER, "grid", constraint, grid)
    # numbers only: float() would also read the strings "0.5" and "inf"
    if not items or any(isinstance(f, (bool, np.bool_)) or not isinstance(f, numbers.Real) for f in items):
        fail(_OWNER, "grid", constraint, grid)
    values = tuple(float(f) for f in items)
    if not all(0.0 < f <= 1.0 for f in values):
        fail(_OWNER, "grid", constraint, grid)
    return tuple(sorted(set(values) | {1.0}))


def _grid(dense, fractions, fixed, step=1):
    """The widths timed: ``ceil(f * dense)`` for each fraction, rounded up to a multiple of ``step``, the smallest
    width a pruning can leave (``step``: one unit, or one group of a grouped convolution's) and ``dense``.

    The smallest width is timed because a time below the smallest measured point is that point's: a layer the
    budget cuts to a few units would otherwise be predicted as slow as at ``min(fractions)`` of its width (a
    MobileNetV2 at 1/50 of every width ran 5.8x faster than dense where 1/8 predicted 3.0x).
    """
    if fixed:
        return [int(dense)]
    return sorted({max(step, int(math.ceil(f * dense / step)) * step) for f in fractions}
                  | {min(int(step), int(dense)), int(dense)})


def _monotone(seconds):
    """Times that do not decrease with width along either axis: each point at most any wider point.

    Noise on a busy machine mostly slows a sample down, so a narrow point slower than a wider one is capped
    by the wider one (rather than the wider raised to it).
    """
    seconds = np.maximum(np.asarray(seconds, dtype=np.float64), TINY)
    seconds = np.minimum.accumulate(seconds[::-1], axis=0)[::-1]
    return np.minimum.accumulate(seconds[:, ::-1], axis=1)[:, ::-1].copy()


def input_shapes(model):
    """The shape of each input of ``model`` without the batch axis (``None`` when the model does not say)."""
    inputs = getattr(model, "inputs", None)
    if not inputs:
        return None
    return tuple(tuple(None if d is None else int(d) for d in tuple(tensor.shape)[1:]) for tensor in inputs)


def unit_shapes(graph, node):
    """``(input shape, output shape)`` of the units node ``node`` without the batch axis."""
    found = (_layer_input_shape(graph, node, graph.layers[node.name]), graph.output_shape(node.name, node.out_units))
    return tuple(tuple(None if d is None else int(d) for d in tuple(shape)[1:]) for shape in found)


def _layer_input_shape(graph, node, layer):
    """The input shape (batch axis included) of the call ``node`` of ``layer``."""
    shapes = graph.call_shapes.get(node.name)
    if shapes and len(shapes) == 1:
        return tuple(shapes[0])
    try:
        return tuple(layer.input.shape)
    except Exception:  # noqa: BLE001 - a layer inside a model the graph cannot see into
        kernel_in = int(layer.kernel.shape[-2]) if hasattr(layer, "kernel") else node.in_units
        return (None, kernel_in)


def _segments(graph):
    """``{units layer name: names of the per-channel layers after it}``: each units layer is timed together with the
    chain of layers that read it alone, one channel at a time (normalization, activation, pooling, dropout), up to
    the next layer that reads or is read by more than one (a merge, a branch) or makes units.

    Timed apart, a layer misses what its channel count costs the layers after it (a normalization or pooling of
    an odd channel count is not the cost of the same layer at a neighbouring count), so the chain counts with it.
    """
    consumers = {}
    for found in graph.nodes:
        for name in found.inputs:
            consumers.setdefault(name, []).append(found.name)
    segments = {}
    for node in graph.units:
        chain, current = [], node.name
        while current not in graph.outputs and len(consumers.get(current, ())) == 1:
            following = graph.tensor(consumers[current][0])
            if following.kind != Kind.PER_UNIT or tuple(following.inputs) != (current,):
                break
            chain.append(following.name)
            current = following.name
        segments[node.name] = tuple(chain)
    return segments


def _layer_timer(layer, rule, weights, node, shape, width_in, width_out, batch, after=(), inputs=None):
    """A :class:`_Timer` of a standalone copy of ``layer`` reading ``width_in`` units and making ``width_out``,
    followed by copies of the per-channel layers ``after`` it (see :func:`_segments`).

    ``inputs``: a dict of the inputs already made, by shape, shared with the other points of the layer.
    """
    if any(d is None for d in shape[1:]):
        fail(_OWNER, "model", "a model whose layers have inputs of a fixed size",
             Described(f"layer {node.name!r} with input shape {shape}"))
    config, values, width_in = rule.slice_widths(layer, weights, node.in_units, width_in, width_out)
    stem = f"latency_{node.name.replace('/', '_').replace('#', '_')}"
    copy = type(layer).from_config(_inference_config(config, stem))
    per_unit = int(shape[-1]) // max(node.in_units, 1)  # a Dense after Flatten reads positions * in
    in_shape = (batch,) + tuple(int(d) for d in shape[1:-1]) + (per_unit * width_in,)
    copy.build(in_shape)
    copy.set_weights(values)
    # A model even with nothing after the layer: timed as the fixed cost of a call is (see _call_floor). The
    # per-channel layers take their initial weights at this width (their values do not change the time).
    symbolic = keras.Input(batch_shape=in_shape, dtype=layer.compute_dtype)
    outputs = copy(symbolic)
    for k, following in enumerate(after):
        outputs = type(following).from_config(_inference_config(following.get_config(), f"{stem}_{k}"))(outputs)
    timed = keras.Model(symbolic, outputs, name=stem)
    inputs = {} if inputs is None else inputs
    if in_shape not in inputs:
        rng = np.random.default_rng(1)
        inputs[in_shape] = keras.ops.convert_to_tensor(rng.standard_normal(in_shape).astype(
            keras.backend.standardize_dtype(layer.compute_dtype)))
    return _Timer(_compiled(timed, is_model=True), inputs[in_shape])


def _nbytes(tensor):
    return math.prod(int(d) for d in tensor.shape) * np.dtype(keras.backend.standardize_dtype(tensor.dtype)).itemsize


def _out_of_memory(error):
    """Whether ``error`` says that memory ran out (TensorFlow, XLA, PyTorch, Python): never a layer to drop."""
    name = type(error).__name__
    return isinstance(error, MemoryError) or "ResourceExhausted" in name or "OutOfMemory" in name or (
        "RESOURCE_EXHAUSTED" in str(error)[:200])


def _call_floor(batch):
    """A :class:`_Timer` of the fixed cost of one compiled call: a model that only passes a ``(batch, 1)`` input on.

    Every standalone layer pays it once and the whole model pays it once, so it is taken off each layer's time
    (and stays in the rest).
    """
    model = keras.Sequential([keras.Input((1,)), keras.layers.Identity()], name="latency_call")
    return _Timer(_compiled(model, is_model=True), keras.ops.zeros((batch, 1)))


def _inference_config(config, name):
    """``config`` for a timing copy: no regularizer or constraint, zero initializers (the weights are set after, and
    a random initializer compiles for each shape on JAX), and ``name``."""
    config = dict(config)
    for key in list(config):
        if key.endswith("_regularizer") or key.endswith("_constraint"):
            config[key] = None  # not part of inference
        elif key.endswith("_initializer") and config[key] is not None:
            config[key] = "zeros"
    config["name"] = name
    return config


def output_positions(graph, node):
    """Output positions of a units node (its activations per sample are ``positions * out_units``)."""
    shape = graph.output_shape(node.name, node.out_units)
    return int(np.prod([int(d) for d in shape[1:-1] if d is not None])) if len(shape) > 2 else 1


def _narrow_model(model, graph, fraction):
    """``(pruned model, widths)``: ``model`` with each hidden layer at ``ceil(fraction * units)`` units.

    Built by :func:`~keras_group_lasso.surgery.build.prune_as_if` from kernels of one small value each (not the
    model's own weights, whose zero groups would cut more: a trained or pruned model) whose columns beyond that
    width are zero. ``(None, None)`` with a warning when the model cannot be pruned.
    """
    values = {}
    for node in graph.units:
        layer = graph.layers[node.name]
        kernel = getattr(layer, "kernel", None)
        if "#" in node.name or kernel is None or not hasattr(kernel, "path"):
            continue
        shape = tuple(kernel.shape)
        value = np.full(shape, 1.0 / math.sqrt(max(1, int(np.prod(shape[:-1])))), dtype="float32")
        if not node.is_output and registry.units_rule(layer).rounds:
            value[..., max(1, int(math.ceil(fraction * node.out_units))):] = 0.0
        values[kernel.path] = value
    try:
        masks = analysis.analyze(model, threshold=0.0, owner=_OWNER, values=values).masks
        widths = {node.name: (int(masks.inputs[node.name].sum()), int(masks.units[node.name].sum()))
                  for node in graph.units}
        return prune_as_if(model, values, owner=_OWNER), widths
    except Exception as error:  # noqa: BLE001 - a model surgery cannot shrink: its rest counts as fixed
        warnings.warn(f"{_OWNER}: the rest of model {model.name!r} (the layers between the units layers) counts "
                      f"as a fixed time: a narrow copy of it could not be built ({type(error).__name__}: {error}).",
                      RuntimeWarning, stacklevel=3)
        return None, None
