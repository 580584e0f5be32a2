"""What a structure costs in measured time: a latency table of the prunable layers, measured on the running backend.

A :class:`LatencyTable` holds, for one model, batch size, backend and device,
the measured inference time of every layer that makes units (Dense,
convolutions, ...) at a small grid of ``(input units, output units)``, and the
time of the rest of the model (pooling, normalization, activations, the call
itself) at full width and at the narrowest widths. Between grid points a
layer's time is interpolated bilinearly; a structure's predicted time is the
rest plus the sum of its layers::

    predict(widths) = rest(widths) + sum_layer  t_layer(in_layer, out_layer)

so that the dense widths predict the measured dense model. The table is
measured once, before training; :class:`~keras_group_lasso.SparsityBudget`
steers with it (``max_latency``), and it can be saved as JSON and measured on
the deployment target instead of the training machine.
"""

import dataclasses
import json
import math
import numbers
import os
import platform
import secrets
import stat
import time
import warnings

import keras
import numpy as np

from keras_group_lasso import analysis
from keras_group_lasso._validation import Described, check_non_negative, check_positive_int, fail
from keras_group_lasso.graph import Kind, model_graph, registry
from keras_group_lasso.surgery.build import prune_as_if

__all__ = ["LatencyTable", "DEFAULT_GRID", "current_device"]

_OWNER = "LatencyTable"
FORMAT = "keras_group_lasso.LatencyTable/1"
#: Widths measured per layer, as fractions of the dense width (each axis).
DEFAULT_GRID = (0.125, 0.5, 1.0)
_OPTIONAL = ("narrow", "rest_narrow", "call")  # entry values that older tables or unprunable models lack
_SAMPLE_SECONDS = 2e-3  # a timing sample repeats a fast call until it lasts about this long
_HELD_BYTES = 1 << 30  # the inputs of the calls LatencyTable.measure compiles before sampling them together
_TINY = 1e-9


# ----------------------------------------------------------------------------- timing


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

        return tf.function(lambda x: obj(x, **kwargs), jit_compile=False)
    if backend == "torch":
        import torch

        def call(x):
            with torch.no_grad():
                out = obj(x, **kwargs)
            if getattr(getattr(out, "device", None), "type", "cpu") == "cuda":
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


def current_device():
    """The device that runs the backend's calls, in words."""
    backend = keras.backend.backend()
    cpu = f"CPU ({platform.machine() or 'unknown'}, {os.cpu_count()} cores)"
    try:
        if backend == "jax":
            import jax

            device = jax.devices()[0]
            return cpu if device.platform == "cpu" else f"{device.platform.upper()} ({device.device_kind})"
        if backend == "tensorflow":
            import tensorflow as tf

            gpus = tf.config.list_logical_devices("GPU")
            return f"GPU ({gpus[0].name})" if gpus else cpu
        if backend == "torch":
            import torch

            if torch.cuda.is_available():
                return f"GPU ({torch.cuda.get_device_name(0)})"
    except Exception:  # noqa: BLE001 - a device that cannot say its name is described as the CPU
        return cpu
    return cpu


# ----------------------------------------------------------------------------- the table


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


def _interpolate(points, value):
    """``(lower index, upper index, weight of upper)`` of ``value`` in the sorted ``points`` (clamped at the ends)."""
    if value <= points[0]:
        return 0, 0, 0.0
    if value >= points[-1]:
        last = len(points) - 1
        return last, last, 0.0
    upper = int(np.searchsorted(points, value))
    lower = upper - 1
    return lower, upper, (value - points[lower]) / (points[upper] - points[lower])


def _monotone(seconds):
    """Times that do not decrease with width along either axis: each point at most any wider point.

    Noise on a busy machine mostly slows a sample down, so a narrow point slower than a wider one is capped
    by the wider one (rather than the wider raised to it).
    """
    seconds = np.maximum(np.asarray(seconds, dtype=np.float64), _TINY)
    seconds = np.minimum.accumulate(seconds[::-1], axis=0)[::-1]
    return np.minimum.accumulate(seconds[:, ::-1], axis=1)[:, ::-1].copy()


class LatencyTable:
    """Measured inference time of a model's prunable layers at a grid of widths, and of the rest of the model.

    Measure it with :meth:`measure` (on the machine and backend that will run
    the pruned model), then :meth:`predict` the time of a structure, for
    example the live units of a :func:`~keras_group_lasso.sparsity_report`.
    For each layer that makes units (as :func:`~keras_group_lasso.graph.model_graph`
    finds them) a standalone copy of the layer is built at every grid point
    ``(in, out)`` (the widths ``ceil(f * dense)`` for ``f`` in ``grid``, one unit
    and the dense width, on each axis that a pruning can narrow), together with copies of the per-channel
    layers that read it alone (normalization, activation, pooling, dropout, up
    to the next branch or merge: :attr:`segments`), whose cost follows its
    width too; its compiled inference call is timed (two warm-up calls, then
    the fastest of ``repeats`` samples; a fast call is repeated within a
    sample; the calls are compiled first, as many as hold 1 GiB of inputs,
    and sampled together in ``repeats`` rounds of one sample of each, the
    dense model's too, so that a slow spell of the machine slows one sample
    of many calls, not every sample of a few), less the fixed cost of one call (a call that only passes a small
    input on), which the whole model pays once. Between grid points the time is bilinear in the
    widths (at 0 units it is one unit's), and it never decreases with width
    along either axis. The rest of
    the model is the measured dense model minus its layers at full width; it
    is measured a second time on the model at the smallest fraction of the grid of each
    hidden layer (built by :func:`~keras_group_lasso.prune_model`), and in
    between it counts in proportion to the activations the hidden layers make
    (``sum positions * out_units``: what BatchNormalization, ReLU and pooling
    read, which a compiled model does not always fuse)::

        predict(widths) = rest(widths) + sum_layer  t_layer(in_layer, out_layer)

    so the dense widths predict the dense model's measured time exactly. When
    the standalone layers add up to more than the model (a compiled model fuses
    what they do apart), each layer's time counts scaled by ``dense model /
    sum of the layers`` and the rest is 0.

    TensorFlow times a ``tf.function`` (what a SavedModel serves), JAX a
    ``jax.jit`` of the stateless call, PyTorch an eager call without gradients.

    A layer's time follows the positions it computes as much as its widths, so
    the table records the shapes it was measured at (the model's inputs, each
    units layer's input and output) and :meth:`check_model` refuses a model
    that runs at other shapes. A table is checked whole when it is made or
    read: every time finite and >= 0, each layer's grid of increasing widths
    with a time at every point; a table made by hand may leave the shapes out
    (``None``: only the layers and their widths are checked).

    Attributes:
        model_name: the name of the model it was measured for.
        layers: ``{layer name: (input units, output units)}`` of the dense model, in the graph's order.
        batch_sizes: the batch sizes it holds.
        backend: the Keras backend it was measured on.
        device: the device, in words.
        grid: the fractions of the dense widths measured on each axis.
        measure_seconds: how long measuring took (``None`` when unknown).
        positions: ``{hidden layer name: output positions}`` (the rest's activations are their sum times the units).
        narrow_widths: the widths of the narrow model the rest was timed on (``None``: the rest is fixed).
        segments: ``{layer name: names of the layers timed with it}``.
        input_shapes: the shape of each model input without the batch axis, a tuple of tuples (``None``:
            not recorded, as in a table saved before the shapes were).
        layer_shapes: ``{layer name: (input shape, output shape)}`` of each units layer without the batch
            axis (``None``: not recorded; an older table's :attr:`positions` then stand for them).

    Example:
        >>> model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu", name="hidden"),
        ...                           keras.layers.Dense(2, name="out")])
        >>> table = LatencyTable.measure(model, batch_size=64, repeats=2)
        >>> dense = table.predict()
        >>> table.predict({"hidden": (16, 4), "out": (4, 2)}) <= dense
        True
        >>> table.layers
        {'hidden': (16, 32), 'out': (32, 2)}
    """

    def __init__(self, model_name, layers, entries, backend, device, grid=DEFAULT_GRID, measure_seconds=None,
                 positions=None, narrow_widths=None, segments=None, input_shapes=None, layer_shapes=None):
        try:
            fields = _read_fields({"model": model_name, "layers": layers, "batches": entries, "backend": backend,
                                   "device": device, "grid": grid, "measure_seconds": measure_seconds,
                                   "positions": positions, "narrow_widths": narrow_widths, "segments": segments,
                                   "input_shapes": input_shapes, "layer_shapes": layer_shapes})
        except _Malformed as bad:
            bad.fail_argument()
        self._set(fields)

    def _set(self, fields):
        self.model_name = fields["model"]
        self.layers = fields["layers"]
        self._entries = fields["batches"]
        self.backend = fields["backend"]
        self.device = fields["device"]
        self.grid = fields["grid"]
        self.measure_seconds = fields["measure_seconds"]
        self.positions = fields["positions"]
        self.narrow_widths = fields["narrow_widths"]
        self.segments = fields["segments"]
        self.input_shapes = fields["input_shapes"]
        self.layer_shapes = fields["layer_shapes"]

    # ------------------------------------------------------------------ measuring

    @classmethod
    def measure(cls, model, batch_size=256, grid=DEFAULT_GRID, repeats=5):
        """Measure ``model`` on the running backend and device.

        Args:
            model: a built Keras model whose inputs have a fixed size.
            batch_size: an integer >= 1, or a tuple of them (one table for each).
            grid: fractions in (0, 1] of each dense width to time (one unit and the dense width are always
                added).
            repeats: timing samples per point (the fastest counts), an integer >= 1.

        Returns:
            A :class:`LatencyTable`.

        Raises:
            InvalidParameterError: a bad argument, a model without a layer that makes units, or a model
                whose inputs have axes of unknown size.
        """
        started = time.perf_counter()
        batch_sizes = _check_batch_sizes(_OWNER, "batch_size", batch_size)
        grid = _check_grid(grid)
        repeats = check_positive_int(_OWNER, "repeats", repeats)
        found = analysis.analyze(model, threshold=0.0, owner=_OWNER)
        graph = found.graph
        model_call = _compiled(model, is_model=True)
        positions = {node.name: _positions(graph, node) for node in graph.units if not node.is_output}
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
                                  RuntimeWarning, stacklevel=2)
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
                seconds = np.array([[max(t.best - floor.best, _TINY) for t in row] for row in timers])
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
        widths = {node.name: (node.in_units, node.out_units) for node in graph.units}
        table = cls(model.name, widths, entries, keras.backend.backend(), current_device(), grid,
                    time.perf_counter() - started, positions=positions, narrow_widths=narrow_widths,
                    segments=segments, input_shapes=_input_shapes(model),
                    layer_shapes={node.name: _unit_shapes(graph, node) for node in graph.units})
        for batch, entry in table._entries.items():
            if "narrow" in entry:  # what the rest takes at the narrow structure (its layers' part taken out)
                layers_part = sum(table.layer_seconds(name, *w, batch) for name, w in narrow_widths.items())
                entry["rest_narrow"] = float(min(max(entry["narrow"] - layers_part, 0.0), entry["rest"]))
        return table

    @staticmethod
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

    @staticmethod
    def time_models(models, batch_size=256, repeats=5):
        """The times in seconds of one compiled inference call of each of ``models``, measured side by side.

        Each is warmed up, then ``repeats`` rounds take one sample of every model in turn (the order rotating),
        and each keeps its fastest: a slow spell of the machine slows one sample of each, not every sample of one.
        What a comparison of a pruned model with its dense one should use.

        Example:
            >>> dense = keras.Sequential([keras.Input((32,)), keras.layers.Dense(256), keras.layers.Dense(10)])
            >>> small = keras.Sequential([keras.Input((32,)), keras.layers.Dense(8), keras.layers.Dense(10)])
            >>> len(LatencyTable.time_models([dense, small], batch_size=64, repeats=2))
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

    # ------------------------------------------------------------------ predicting

    @property
    def batch_sizes(self):
        return tuple(sorted(self._entries))

    def _entry(self, batch_size, owner, name):
        if batch_size is None:
            if len(self._entries) == 1:
                return next(iter(self._entries.values()))
            fail(owner, name, f"one of the table's batch sizes {list(self.batch_sizes)} (it holds several)",
                 batch_size)
        if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) \
                or int(batch_size) not in self._entries:
            fail(owner, name, f"a batch size the latency table was measured at ({', '.join(map(str, self.batch_sizes))})",
                 batch_size)
        return self._entries[int(batch_size)]

    def dense_seconds(self, batch_size=None):
        """The measured time of the dense model (what :meth:`predict` gives for the dense widths)."""
        return self._entry(batch_size, _OWNER, "batch_size")["model"]

    def rest_seconds(self, batch_size=None):
        """The time of the model minus its prunable layers at full width."""
        return self._entry(batch_size, _OWNER, "batch_size")["rest"]

    def layer_seconds(self, name, in_units, out_units, batch_size=None):
        """The interpolated time of layer ``name`` reading ``in_units`` and making ``out_units``.

        Args:
            name: one of :attr:`layers`.
            in_units: the units it reads, a number >= 0 (between grid points the time is interpolated, also at a
                fraction of a unit; beyond the grid it is the nearest end's).
            out_units: the units it makes, likewise.
            batch_size: one of :attr:`batch_sizes` (``None``: the table's only one).

        Raises:
            InvalidParameterError: a layer the table does not know, a width that is not a finite number >= 0,
                or a batch size the table lacks.
        """
        if not isinstance(name, str) or name not in self.layers:
            fail(_OWNER, "name", f"a layer of the table ({', '.join(self.layers)})", name)
        in_units = check_non_negative(_OWNER, "in_units", in_units)
        out_units = check_non_negative(_OWNER, "out_units", out_units)
        entry = self._entry(batch_size, _OWNER, "batch_size")["layers"][name]
        ins, outs, seconds = entry["in"], entry["out"], entry["seconds"]
        a0, a1, wa = _interpolate(ins, in_units)
        b0, b1, wb = _interpolate(outs, out_units)
        low = seconds[a0, b0] + wb * (seconds[a0, b1] - seconds[a0, b0])  # equal ends give exactly their value
        high = seconds[a1, b0] + wb * (seconds[a1, b1] - seconds[a1, b0])
        return float(self._entry(batch_size, _OWNER, "batch_size")["scale"] * (low + wa * (high - low)))

    def widths_of(self, structure):
        """``{layer name: (input units, output units)}`` of ``structure`` (see :meth:`predict`).

        Raises:
            InvalidParameterError: a report of another model, or a dict with a layer the table does not know or
                widths that are not whole numbers (a float with a fraction, a bool; ``3.0`` and numpy integers
                are whole).
        """
        if structure is None:
            return dict(self.layers)
        if isinstance(structure, analysis.Analysis):
            masks = structure.masks
            return {name: (int(masks.inputs[name].sum()), int(masks.units[name].sum()))
                    for name in self.layers if name in masks.units}
        if isinstance(structure, analysis.SparsityReport):
            rows = {row.name: row for row in structure.layers}
            missing = [name for name in self.layers if name not in rows and "#" not in name]
            if missing or len(rows) > len(self.layers):
                fail(_OWNER, "structure", f"the report of model {self.model_name!r} (layers "
                     f"{', '.join(self.layers)})", Described(f"a report of layers {', '.join(rows)}"))
            widths = {}
            for name, (dense_in, dense_out) in self.layers.items():
                row = rows.get(name.split("#")[0])
                widths[name] = (dense_in, dense_out) if row is None else (
                    min(dense_in, row.groups_alive), row.units_alive)
            return widths
        if isinstance(structure, dict):
            widths = {}
            for name, value in structure.items():
                if name not in self.layers:
                    fail(_OWNER, "structure", f"widths of the layers of model {self.model_name!r} "
                         f"({', '.join(self.layers)})", Described(f"a layer named {name!r}"))
                pair = _whole_pair(value)
                if pair is None:  # int() would cut a fraction off: 2.7 units are not 2
                    fail(_OWNER, "structure", "(input units, output units) pairs of integers", value)
                widths[name] = pair
            return widths
        fail(_OWNER, "structure", "None (the dense model), a SparsityReport, or a dict {layer name: (input units, "
             "output units)}", structure)

    def annotate(self, found, batch_size=None):
        """The report of ``found`` (an :class:`~keras_group_lasso.analysis.Analysis` of this table's model) with the
        predicted time of the dense model and of ``found``'s live units at ``batch_size`` (``None``: the table's
        first batch size); look-ups only."""
        batch = self.batch_sizes[0] if batch_size is None else batch_size
        return dataclasses.replace(found.report, latency_before=self.predict(None, batch),
                                   latency_after=self.predict(found, batch), latency_batch_size=batch)

    def predict(self, structure=None, batch_size=None):
        """The predicted time in seconds of one inference call on a batch, for a structure of live units.

        Args:
            structure: ``None`` (the dense widths), a ``{layer name: (input units, output units)}`` dict
                (layers left out keep their dense widths), or a
                :class:`~keras_group_lasso.SparsityReport` (each layer at its live groups and units).
            batch_size: one of :attr:`batch_sizes` (``None``: the table's only one).

        Returns:
            ``rest + sum over layers of the layer's interpolated time`` (a float).

        Raises:
            InvalidParameterError: a batch size the table lacks, a layer it does not know, widths that are not
                whole numbers (``2.7`` units; ``3.0`` and numpy integers are whole), or widths outside
                ``0 .. dense``.
        """
        entry = self._entry(batch_size, _OWNER, "batch_size")
        batch = next(b for b, e in self._entries.items() if e is entry)
        widths = dict(self.layers)
        for name, (width_in, width_out) in self.widths_of(structure).items():
            dense_in, dense_out = self.layers[name]
            if not (0 <= width_in <= dense_in and 0 <= width_out <= dense_out):
                fail(_OWNER, "structure", f"widths of layer {name!r} within (0..{dense_in}, 0..{dense_out})",
                     (width_in, width_out))
            widths[name] = (width_in, width_out)
        total = self._rest(entry, widths) + sum(self.layer_seconds(name, w[0], w[1], batch)
                                                for name, w in widths.items())
        return float(max(total, _TINY))

    def _activations(self, widths):
        return sum(count * widths[name][1] for name, count in self.positions.items())

    def _rest(self, entry, widths):
        """The rest at ``widths``: between its time at the narrow structure and at full width, in proportion to
        the activations the hidden layers make (what the normalization, activation and pooling layers read)."""
        if "rest_narrow" not in entry or not self.positions:
            return entry["rest"]
        dense, narrow = self._activations(self.layers), self._activations(self.narrow_widths)
        if dense <= narrow:
            return entry["rest"]
        share = min(1.0, max(0.0, (self._activations(widths) - narrow) / (dense - narrow)))
        return entry["rest_narrow"] + share * (entry["rest"] - entry["rest_narrow"])

    def speedup(self, structure, batch_size=None):
        """``predict(None) / predict(structure)``: how many times faster the structure is predicted to run."""
        return self.predict(None, batch_size) / self.predict(structure, batch_size)

    def marginal_seconds(self, batch_size=None):
        """What one unit of each layer costs at the dense widths: the slope of :meth:`predict` along each width.

        For layer ``l`` at dense widths ``(in, out)``, with ``in_min`` and ``out_min`` its smallest grid widths::

            per_in  = (t_l(in, out) - t_l(in_min, out)) / (in - in_min)
            per_out = (t_l(in, out) - t_l(in, out_min)) / (out - out_min) + positions_l * d rest / d activations

        A secant over the whole measured grid rather than ``t(w) - t(w - 1)``: it spans the largest measured
        difference, so the noise of one grid point weighs least (and the interpolation is linear between grid
        points, so the last unit's step is only the top interval's slope). An axis measured at one width only (the
        model's input channels, the output layer's units) counts the layer's mean, ``t_l / width``. A hidden
        layer's output unit also carries its share of the rest (the activations that normalization, activation
        and pooling layers read; 0 when the rest is fixed).

        Args:
            batch_size: one of :attr:`batch_sizes` (``None``: the table's only one).

        Returns:
            ``{layer name: (seconds per input unit, seconds per output unit)}``, each >= 0.

        Example:
            >>> model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, name="hidden"),
            ...                           keras.layers.Dense(2, name="out")])
            >>> per_unit = LatencyTable.measure(model, batch_size=64, repeats=1).marginal_seconds()
            >>> sorted(per_unit), all(v >= 0 for pair in per_unit.values() for v in pair)
            (['hidden', 'out'], True)
        """
        entry = self._entry(batch_size, _OWNER, "batch_size")
        batch = next(b for b, e in self._entries.items() if e is entry)
        rest_slope = 0.0
        if "rest_narrow" in entry and self.positions:
            dense, narrow = self._activations(self.layers), self._activations(self.narrow_widths)
            if dense > narrow:
                rest_slope = (entry["rest"] - entry["rest_narrow"]) / (dense - narrow)
        marginal = {}
        for name, (dense_in, dense_out) in self.layers.items():
            grid = entry["layers"][name]
            full = self.layer_seconds(name, dense_in, dense_out, batch)
            slopes = []
            for smallest, dense_width, narrow in ((grid["in"][0], dense_in, (grid["in"][0], dense_out)),
                                                  (grid["out"][0], dense_out, (dense_in, grid["out"][0]))):
                if smallest < dense_width:
                    slopes.append((full - self.layer_seconds(name, *narrow, batch)) / (dense_width - smallest))
                else:
                    slopes.append(full / max(dense_width, 1))
            per_in, per_out = slopes
            per_out += rest_slope * self.positions.get(name, 0)
            marginal[name] = (max(per_in, 0.0), max(per_out, 0.0))
        return marginal

    # ------------------------------------------------------------------ checking, saving

    def check_model(self, model, owner=_OWNER, name="latency_table"):
        """Raise unless ``model`` has the layers, dense widths and shapes the table was measured for.

        The shapes are the model's input shapes and each units layer's input and output shapes (a table
        without them, saved before they were recorded: the output positions of its hidden layers); an axis of
        unknown size in ``model`` matches any size (a model that takes inputs of any size, with a table
        measured at the size it will run at).

        Returns:
            The table.

        Raises:
            InvalidParameterError: ``owner: argument `name` must be a latency table measured for this model
                ...``, naming the layers and widths, or the shape that differs.
        """
        graph = model_graph(model)
        widths = {node.name: (node.in_units, node.out_units) for node in graph.units}
        if widths != self.layers:
            fail(owner, name, f"a latency table measured for this model (layers {_widths_text(widths)})", self)
        difference = self._shape_difference(model, graph)
        if difference is not None:
            fail(owner, name, "a latency table measured for this model at its shapes (a layer's time grows with "
                 "the positions it computes)", Described(f"{self!r} measured {difference}"))
        return self

    def _shape_difference(self, model, graph):
        """How the shapes the table was measured at differ from ``model``'s, in words (``None``: they do not)."""
        if self.input_shapes is not None:
            shapes = _input_shapes(model)
            if shapes is not None and not _same_shapes(self.input_shapes, shapes):
                return (f"for inputs of shape {_shapes_text(self.input_shapes)}, the model's are "
                        f"{_shapes_text(shapes)}")
        if self.layer_shapes is not None:
            for node in graph.units:
                if node.name not in self.layer_shapes:
                    continue
                (was_in, was_out), (now_in, now_out) = self.layer_shapes[node.name], _unit_shapes(graph, node)
                if not _same_shapes((was_in,), (now_in,)):
                    return (f"with layer {node.name!r} reading inputs of shape {was_in}, the model's reads "
                            f"{now_in}")
                if not _same_shapes((was_out,), (now_out,)):
                    return (f"with layer {node.name!r} making outputs of shape {was_out}, the model's makes "
                            f"{now_out}")
            return None
        for node in graph.units:  # an older table: the output positions of its hidden layers
            shape = graph.output_shape(node.name, node.out_units)
            if node.name in self.positions and None not in shape[1:]:
                count = _positions(graph, node)
                if count != self.positions[node.name]:
                    return (f"with layer {node.name!r} at {self.positions[node.name]} output positions, the "
                            f"model's has {count}")
        return None

    def to_dict(self):
        """Plain JSON values: what :meth:`save` writes."""
        return {
            "format": FORMAT,
            "model": self.model_name,
            "layers": {name: list(w) for name, w in self.layers.items()},
            "backend": self.backend,
            "device": self.device,
            "grid": list(self.grid),
            "measure_seconds": self.measure_seconds,
            "positions": dict(self.positions),
            "narrow_widths": None if self.narrow_widths is None else {
                name: list(w) for name, w in self.narrow_widths.items()},
            "segments": {name: list(after) for name, after in self.segments.items()},
            "input_shapes": None if self.input_shapes is None else [list(shape) for shape in self.input_shapes],
            "layer_shapes": None if self.layer_shapes is None else {
                name: [list(shape) for shape in shapes] for name, shapes in self.layer_shapes.items()},
            "batches": {str(batch): {
                "model": entry["model"], "rest": entry["rest"], "scale": entry["scale"],
                **{key: entry[key] for key in _OPTIONAL if key in entry},
                "layers": {name: {"in": g["in"], "out": g["out"], "seconds": g["seconds"].tolist()}
                           for name, g in entry["layers"].items()},
            } for batch, entry in self._entries.items()},
        }

    @classmethod
    def from_dict(cls, data):
        """The table that :meth:`to_dict` gave ``data``.

        A dict without ``input_shapes`` and ``layer_shapes`` (written before they were recorded) is read too;
        :meth:`check_model` then checks the output positions of its hidden layers.

        Raises:
            InvalidParameterError: ``data`` is not a latency table, or one of its values is not what a table
                holds (a time that is NaN, infinite or negative, a grid whose times do not match its widths, a
                width that is not a positive integer, ...); the message names the value by its keys.
        """
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            fail(_OWNER, "data", f"a latency table (a dict with format {FORMAT!r})",
                 Described(f"format {data.get('format')!r}" if isinstance(data, dict) else repr(data)))
        try:
            return cls._read(data)
        except _Malformed as bad:
            fail(_OWNER, "data", "a latency table as LatencyTable.to_dict writes it",
                 Described(f"a dict whose {bad.found()}"))

    @classmethod
    def _read(cls, data):
        """The table of the dict ``data`` (its format checked already); :class:`_Malformed` for a bad value."""
        table = cls.__new__(cls)
        table._set(_read_fields(data))
        return table

    def save(self, path):
        """Write the table to ``path`` as JSON, replacing the file there whole.

        The table is written to a new file in the same directory, which then takes the place of ``path`` in one
        step: a save that fails midway (a full disk, an exception) leaves the file that was there as it was, and
        no other file. The file has the mode that ``open`` gives: a new file's under the umask, or the mode of
        the file it replaces. A link at ``path`` is followed (the file it points to is replaced).
        """
        target = os.path.realpath(os.fspath(path))
        directory, base = os.path.split(target)
        temporary, descriptor = _new_file(directory, f".{base}.")
        try:
            with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
                json.dump(self.to_dict(), handle, indent=1)
                handle.flush()
                os.fsync(handle.fileno())
            try:
                mode = os.stat(target).st_mode
            except FileNotFoundError:
                mode = None
            if mode is not None and stat.S_ISREG(mode):
                os.chmod(temporary, stat.S_IMODE(mode))  # as open() keeps the mode of a file it overwrites
            os.replace(temporary, target)
        except BaseException:
            try:
                os.remove(temporary)
            except OSError:
                pass
            raise

    @classmethod
    def load(cls, path, model=None):
        """Read a table written by :meth:`save`; with ``model``, check that it was measured for that model.

        A file saved before the shapes were recorded is read too (see :meth:`from_dict`).

        Args:
            path: the JSON file.
            model: ``None``, or a model to check the table against (:meth:`check_model`).

        Returns:
            A :class:`LatencyTable`.

        Raises:
            InvalidParameterError: ``path`` is a directory, not UTF-8 text, not JSON, or not a latency table, or
                one of its values is not what a table holds (the message says which and why); or ``model`` is
                not the table's model.
            FileNotFoundError: there is no file at ``path`` (and the other errors of ``open``: a file that may
                not be read raises ``PermissionError``).
        """
        name = os.fspath(path)
        if os.path.isdir(name):
            fail(_OWNER, "path", "a JSON file written by LatencyTable.save", Described(f"{name!r} (a directory)"))
        reason = None
        try:
            with open(name, encoding="utf-8") as handle:
                data = json.load(handle)
        except json.JSONDecodeError as error:
            reason = f"not JSON: {error}"
        except UnicodeDecodeError as error:
            reason = f"not UTF-8 text: {error.reason} at byte {error.start}"
        except RecursionError:
            reason = "nested too deeply"
        if reason is None:
            if not isinstance(data, dict):
                reason = f"it holds {_JSON_KINDS.get(type(data), 'a value')}, not a JSON object"
            elif data.get("format", _MISSING) != FORMAT:
                reason = f"its {_Malformed(('format',), repr(FORMAT), data.get('format', _MISSING)).found()}"
        if reason is None:
            try:
                table = cls._read(data)
            except _Malformed as bad:
                reason = f"its {bad.found()}"
        if reason is not None:
            fail(_OWNER, "path", "a JSON file written by LatencyTable.save", Described(f"{name!r} ({reason})"))
        if model is not None:
            table.check_model(model, name="path")
        return table

    def __eq__(self, other):
        if not isinstance(other, LatencyTable):
            return NotImplemented
        return json.dumps(self.to_dict(), sort_keys=True) == json.dumps(other.to_dict(), sort_keys=True)

    __hash__ = None

    def __repr__(self):
        return (f"LatencyTable(model={self.model_name!r}, layers={len(self.layers)}, "
                f"batch_sizes={list(self.batch_sizes)}, backend={self.backend!r}, device={self.device!r})")

    def to_text(self):
        """The table as readable text: each layer's time at full width, its grid, and the rest."""
        took = "" if self.measure_seconds is None else f", measured in {self.measure_seconds:.1f} s"
        lines = [f"LatencyTable of model {self.model_name!r} on {self.backend}, {self.device}{took}"]
        for batch, entry in sorted(self._entries.items()):
            call = f" (one call: {_ms(entry['call'])})" if "call" in entry else ""
            lines.append(f"  batch {batch}: dense model {_ms(entry['model'])} = layers "
                         f"{_ms(entry['model'] - entry['rest'])} + rest {_ms(entry['rest'])}{call}")
            if "rest_narrow" in entry:
                lines.append(f"    narrow model ({_widths_text(self.narrow_widths)}): {_ms(entry['narrow'])}, "
                             f"rest {_ms(entry['rest_narrow'])}")
            width = max(len(name) for name in self.layers)
            lines.append(f"    {'layer'.ljust(width)}  {'in x out':>12}  {'full width':>10}  {'smallest':>10}  grid"
                         f"{'   timed with' if any(self.segments.values()) else ''}")
            for name, (dense_in, dense_out) in self.layers.items():
                g = entry["layers"][name]
                lines.append(f"    {name.ljust(width)}  {f'{dense_in} x {dense_out}':>12}  "
                             f"{_ms(entry['scale'] * g['seconds'][-1, -1]):>10}  "
                             f"{_ms(entry['scale'] * g['seconds'][0, 0]):>10}  "
                             f"{len(g['in'])} x {len(g['out'])}"
                             f"{'    ' + ', '.join(self.segments[name]) if self.segments.get(name) else ''}")
        return "\n".join(lines)

    __str__ = to_text


def _ms(seconds):
    return f"{1e3 * seconds:.3f} ms"


def _widths_text(widths):
    return ", ".join(f"{name} {w[0]}->{w[1]}" for name, w in widths.items())


# ----------------------------------------------------------------------------- reading a table

_MISSING = Described("missing")  # a key a table lacks, shown as its value
_JSON_KINDS = {list: "a list", str: "a string", int: "a number", float: "a number", bool: "a boolean",
               type(None): "null"}
_ARGUMENTS = {"model": "model_name", "batches": "entries"}  # LatencyTable's arguments named unlike to_dict's keys
_TIME = "a finite time in seconds >= 0"
_ASCENDING = "a non-empty list of increasing integers >= 1"
_PAIR = "(input units, output units), integers >= 1"


class _Malformed(Exception):
    """A value of a latency table that is not what a table holds, found where the keys ``where`` lead.

    ``key``: the value is a key of the dict at ``where`` (a batch size, a layer name), not a value in it.
    """

    def __init__(self, where, expected, value, key=False):
        super().__init__(where, expected, value)
        self.where, self.expected, self.value, self.key = tuple(where), expected, value, key

    def found(self):
        """``['batches']['8']['model'] is nan, not a finite time in seconds >= 0``."""
        keys = "".join(f"[{key!r}]" for key in self.where)
        if self.key:
            return f"{keys} has the key {_shown(self.value)}, not {self.expected}"
        return f"{keys} is {_shown(self.value)}, not {self.expected}"

    def fail_argument(self):
        """Raise the constructor's error: the argument, and where in it the value lies."""
        argument = _ARGUMENTS.get(self.where[0], self.where[0])
        inner = argument + "".join(f"[{key!r}]" for key in self.where[1:])
        place = f" at {inner}" if len(self.where) > 1 else ""
        if self.key:
            fail(_OWNER, argument, f"keyed by {self.expected}{place}", Described(f"the key {_shown(self.value)}"))
        fail(_OWNER, argument, f"{self.expected}{place}", Described(_shown(self.value)))


def _shown(value, limit=120):
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _whole(value):
    """``value`` as an int if it is a whole number (an integer, or a float without a fraction), else ``None``.

    A bool is not a width, and ``int(2.7)`` would quietly be 2.
    """
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real) and math.isfinite(value) and float(value).is_integer():
        return int(value)
    return None


def _whole_pair(value):
    """``(input units, output units)`` of a pair of whole numbers >= 0, else ``None``."""
    if isinstance(value, (str, bytes, dict)):
        return None
    try:
        pair = tuple(value)
    except TypeError:
        return None
    if len(pair) != 2:
        return None
    pair = tuple(_whole(v) for v in pair)
    return None if None in pair or min(pair) < 0 else pair


def _pair(value, where, minimum=1, expected=_PAIR):
    pair = _whole_pair(value)
    if pair is None or min(pair) < minimum:
        raise _Malformed(where, expected, value)
    return pair


def _time(value, where, expected=_TIME):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value < 0:
        raise _Malformed(where, expected, value)
    return float(value)


def _dict(value, where, expected, nonempty=False):
    if not isinstance(value, dict) or (nonempty and not value):
        raise _Malformed(where, expected, value)
    return value


def _names(value, where, layers):
    """``value``, a dict keyed by names of ``layers`` (``None``: an empty one)."""
    value = {} if value is None else _dict(value, where, "a dict keyed by layer names")
    for name in value:
        if name not in layers:
            raise _Malformed(where, f"a layer of ['layers'] ({', '.join(layers)})", name, key=True)
    return value


def _shape(value, where, expected):
    if not isinstance(value, (list, tuple)):
        raise _Malformed(where, expected, value)
    dims = []
    for d in value:
        size = None if d is None else _whole(d)
        if d is not None and (size is None or size < 0):
            raise _Malformed(where, expected, value)
        dims.append(size)
    return tuple(dims)


def _grid_of(value, where):
    """One layer's grid ``{"in": [...], "out": [...], "seconds": array (len(in), len(out))}``."""
    grid = _dict(value, where, "a grid of the layer's times")
    axes = {}
    for axis in ("in", "out"):
        points = grid.get(axis, _MISSING)
        widths = [_whole(v) for v in points] if isinstance(points, (list, tuple)) else [None]
        if not widths or None in widths or widths[0] < 1 or any(b <= a for a, b in zip(widths, widths[1:])):
            raise _Malformed(where + (axis,), _ASCENDING, points)
        axes[axis] = widths
    shape = (len(axes["in"]), len(axes["out"]))
    values = grid.get("seconds", _MISSING)
    try:
        seconds = np.array(values, dtype=np.float64)
    except (TypeError, ValueError):
        seconds = None
    if seconds is None or values is _MISSING or seconds.shape != shape:
        raise _Malformed(where + ("seconds",), f"an array of shape {shape} (len(in), len(out))", values)
    if not np.all(np.isfinite(seconds)) or np.any(seconds < 0):
        raise _Malformed(where + ("seconds",), "times in seconds, each finite and >= 0", values)
    return {"in": axes["in"], "out": axes["out"], "seconds": seconds}


def _entry_of(value, where, layers):
    """The times of one batch size: the dense model, the rest, the scale, the optional times, the grids."""
    entry = _dict(value, where, "a dict of times")
    read = {"model": _time(entry.get("model", _MISSING), where + ("model",)),
            "rest": _time(entry.get("rest", _MISSING), where + ("rest",))}
    scale = entry.get("scale", 1.0)
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not 0.0 < scale <= 1.0:
        raise _Malformed(where + ("scale",), "a finite number in (0, 1]", scale)
    read["scale"] = float(scale)
    for key in _OPTIONAL:
        if entry.get(key) is not None:
            read[key] = _time(entry[key], where + (key,))
    grids = _dict(entry.get("layers", _MISSING), where + ("layers",), "a dict {layer name: grid of times}")
    for name in grids:
        if name not in layers:
            raise _Malformed(where + ("layers", name), f"a grid of a layer of ['layers'] ({', '.join(layers)})",
                             grids[name])
    read["layers"] = {name: _grid_of(grids.get(name, _MISSING), where + ("layers", name))
                      for name in layers}
    return read


def _batch_of(key, where):
    size = int(key) if isinstance(key, str) and key.isascii() and key.isdigit() else _whole(key)
    if size is None or size < 1:
        raise _Malformed(where, "a batch size (an integer >= 1)", key, key=True)
    return size


def _read_fields(data):
    """The attributes of a table from ``data`` (keyed as :meth:`LatencyTable.to_dict` writes), each checked.

    Raises:
        _Malformed: the first value that is not what a table holds.
    """
    model = data.get("model", _MISSING)
    if not isinstance(model, str):
        raise _Malformed(("model",), "a model name (a string)", model)
    layers = _dict(data.get("layers", _MISSING), ("layers",),
                   "a non-empty dict {layer name: (input units, output units)}", nonempty=True)
    layers = {str(name): _pair(value, ("layers", name)) for name, value in layers.items()}
    fields = {"model": model, "layers": layers}
    for key, expected in (("backend", "a backend name (a string)"), ("device", "a device, in words (a string)")):
        fields[key] = data.get(key, _MISSING)
        if not isinstance(fields[key], str):
            raise _Malformed((key,), expected, fields[key])
    grid = data.get("grid", DEFAULT_GRID)
    if not isinstance(grid, (list, tuple)) or not grid or any(
            isinstance(f, bool) or not isinstance(f, numbers.Real) or not 0.0 < f <= 1.0 for f in grid):
        raise _Malformed(("grid",), "a non-empty list of fractions in (0, 1]", grid)
    fields["grid"] = tuple(float(f) for f in grid)
    took = data.get("measure_seconds")
    fields["measure_seconds"] = None if took is None else _time(took, ("measure_seconds",),
                                                                "None or a finite time in seconds >= 0")
    positions = _names(data.get("positions"), ("positions",), layers)
    fields["positions"] = {}
    for name, count in positions.items():
        whole = _whole(count)
        if whole is None or whole < 1:
            raise _Malformed(("positions", name), "an integer >= 1", count)
        fields["positions"][str(name)] = whole
    narrow = data.get("narrow_widths")
    fields["narrow_widths"] = None if narrow is None else {
        str(name): _pair(value, ("narrow_widths", name), 0, "(input units, output units), integers >= 0")
        for name, value in _names(narrow, ("narrow_widths",), layers).items()}
    segments = _names(data.get("segments"), ("segments",), layers)
    fields["segments"] = {}
    for name, after in segments.items():
        if not isinstance(after, (list, tuple)) or not all(isinstance(v, str) for v in after):
            raise _Malformed(("segments", name), "a list of layer names", after)
        fields["segments"][str(name)] = tuple(after)
    shapes = data.get("input_shapes")
    if shapes is not None and (not isinstance(shapes, (list, tuple)) or not shapes):
        raise _Malformed(("input_shapes",), "None or a non-empty list of shapes", shapes)
    fields["input_shapes"] = None if shapes is None else tuple(
        _shape(shape, ("input_shapes", k), "a shape (a list of integers >= 0 or None)")
        for k, shape in enumerate(shapes))
    shapes = data.get("layer_shapes")
    fields["layer_shapes"] = None if shapes is None else {}
    for name, pair in _names(shapes, ("layer_shapes",), layers).items():
        expected = "(input shape, output shape), lists of integers >= 0 or None"
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise _Malformed(("layer_shapes", name), expected, pair)
        fields["layer_shapes"][str(name)] = tuple(_shape(shape, ("layer_shapes", name), expected) for shape in pair)
    batches = _dict(data.get("batches", _MISSING), ("batches",), "a non-empty dict {batch size: times}",
                    nonempty=True)
    fields["batches"] = {_batch_of(key, ("batches",)): _entry_of(entry, ("batches", key), layers)
                         for key, entry in batches.items()}
    if fields["positions"] and any("rest_narrow" in entry for entry in fields["batches"].values()) and (
            fields["narrow_widths"] is None or any(name not in fields["narrow_widths"] for name in positions)):
        raise _Malformed(("narrow_widths",), "the widths of the narrow model of each layer in ['positions'] (the "
                         "batches hold its rest_narrow)", narrow)
    return fields


def _input_shapes(model):
    """The shape of each input of ``model`` without the batch axis (``None`` when the model does not say)."""
    inputs = getattr(model, "inputs", None)
    if not inputs:
        return None
    return tuple(tuple(None if d is None else int(d) for d in tuple(tensor.shape)[1:]) for tensor in inputs)


def _unit_shapes(graph, node):
    """``(input shape, output shape)`` of the units node ``node`` without the batch axis."""
    found = (_layer_input_shape(graph, node, graph.layers[node.name]), graph.output_shape(node.name, node.out_units))
    return tuple(tuple(None if d is None else int(d) for d in tuple(shape)[1:]) for shape in found)


def _same_shapes(measured, actual):
    """Whether the shapes a table was measured at are ``actual``'s (an axis of unknown size matches any)."""
    return len(measured) == len(actual) and all(
        len(a) == len(b) and all(x is None or y is None or x == y for x, y in zip(a, b))
        for a, b in zip(measured, actual))


def _shapes_text(shapes):
    return " and ".join(str(tuple(shape)) for shape in shapes)


def _new_file(directory, prefix):
    """``(path, descriptor)`` of a new file ``directory/prefix<random>.tmp``, open for writing.

    Created with mode 0o666 under the umask, as ``open`` creates a file (``tempfile.mkstemp`` would make it
    0600 whatever the umask).
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    for _ in range(100):
        path = os.path.join(directory, f"{prefix}{secrets.token_hex(4)}.tmp")
        try:
            return path, os.open(path, flags, 0o666)
        except FileExistsError:
            continue
    raise FileExistsError(f"{_OWNER}: no free name {prefix}XXXXXXXX.tmp in {directory!r}")


def _check_batch_sizes(owner, name, value):
    values = value if isinstance(value, (tuple, list)) else (value,)
    if not values:
        fail(owner, name, "an integer >= 1 or a tuple of them", value)
    for v in values:
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
            fail(owner, name, "an integer >= 1 or a tuple of them", value)
    return tuple(sorted({int(v) for v in values}))


def _check_grid(grid):
    constraint = "a non-empty sequence of fractions in (0, 1]"
    try:
        values = tuple(float(f) for f in grid)
    except (TypeError, ValueError):
        fail(_OWNER, "grid", constraint, grid)
    if not values or any(isinstance(f, bool) or not (0.0 < f <= 1.0) for f in values):
        fail(_OWNER, "grid", constraint, grid)
    return tuple(sorted(set(values) | {1.0}))


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


def _positions(graph, node):
    """Output positions of a units node (its activations per sample are ``positions * out_units``)."""
    shape = graph.output_shape(node.name, node.out_units)
    return int(np.prod([int(d) for d in shape[1:-1] if d is not None])) if len(shape) > 2 else 1


def _narrow_model(model, graph, fraction):
    """``(pruned model, widths)``: ``model`` with each hidden layer at ``ceil(fraction * units)`` units.

    Built by :func:`~keras_group_lasso.surgery.build.prune_as_if` from kernels whose columns beyond that width are
    zero, values the model's own weights never hold. ``(None, None)`` with a warning when the model cannot be
    pruned.
    """
    values = {}
    for node in graph.units:
        layer = graph.layers[node.name]
        if node.is_output or "#" in node.name or not registry.units_rule(layer).rounds:
            continue
        keep = max(1, int(math.ceil(fraction * node.out_units)))
        value = np.array(keras.ops.convert_to_numpy(layer.kernel))
        value[..., keep:] = 0.0
        values[layer.kernel.path] = value
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
