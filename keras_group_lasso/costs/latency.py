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
import numbers
import os
import time

import keras
import numpy as np

from keras_group_lasso import analysis
from keras_group_lasso._validation import Described, check_non_negative, check_positive_int, fail
from keras_group_lasso.costs import table_file, timing
from keras_group_lasso.costs.table_file import FORMAT
from keras_group_lasso.costs.timing import DEFAULT_GRID, TINY, current_device
from keras_group_lasso.graph import model_graph

__all__ = ["LatencyTable", "DEFAULT_GRID", "FORMAT", "current_device"]

_OWNER = "LatencyTable"


# ----------------------------------------------------------------------------- the table


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


class LatencyTable:
    """Measured inference time of a model's prunable layers at a grid of widths, and of the rest of the model.

    Measure it with :meth:`measure` (on the machine and backend that will run
    the pruned model; how: :func:`.timing.measure_fields`), then :meth:`predict`
    the time of a structure, for example the live units of a
    :func:`~keras_group_lasso.sparsity_report`. Each layer that makes units has
    its time at a grid of ``(in, out)`` widths, bilinear in between (at 0 units
    it is one unit's) and never decreasing with width along either axis. The
    rest of the model is the measured dense model minus its layers at full
    width, measured again on the model at the grid's smallest fraction of each
    hidden layer, and in between counted in proportion to the activations the
    hidden layers make (``sum positions * out_units``: what normalization,
    activations and pooling read)::

        predict(widths) = rest(widths) + sum_layer  t_layer(in_layer, out_layer)

    so the dense widths predict the dense model's measured time exactly. When
    the standalone layers add up to more than the model (a compiled model fuses
    what they do apart), each layer's time counts scaled by ``dense model /
    sum of the layers`` and the rest is 0.

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
            fields = table_file.read_fields({
                "model": model_name, "layers": layers, "batches": entries, "backend": backend, "device": device,
                "grid": grid, "measure_seconds": measure_seconds, "positions": positions,
                "narrow_widths": narrow_widths, "segments": segments, "input_shapes": input_shapes,
                "layer_shapes": layer_shapes})
        except table_file.Malformed as bad:
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
        """Measure ``model`` on the running backend and device (how: :func:`.timing.measure_fields`).

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
        fields = timing.measure_fields(model, timing.check_batch_sizes(_OWNER, "batch_size", batch_size),
                                       timing.check_grid(grid), check_positive_int(_OWNER, "repeats", repeats))
        table = cls(**fields, measure_seconds=time.perf_counter() - started)
        for batch, entry in table._entries.items():
            if "narrow" in entry:  # what the rest takes at the narrow structure (its layers' part taken out)
                layers_part = sum(table.layer_seconds(name, *w, batch) for name, w in table.narrow_widths.items())
                entry["rest_narrow"] = float(min(max(entry["narrow"] - layers_part, 0.0), entry["rest"]))
        return table

    time_model = staticmethod(timing.time_model)
    time_models = staticmethod(timing.time_models)

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
            fail(owner, name, "a batch size the latency table was measured at "
                 f"({', '.join(map(str, self.batch_sizes))})", batch_size)
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
                if row is None:
                    widths[name] = (dense_in, dense_out)
                    continue
                live_in = row.groups_alive if row.inputs_alive < 0 else row.inputs_alive
                widths[name] = (min(dense_in, live_in), row.units_alive)
            return widths
        if isinstance(structure, dict):
            widths = {}
            for name, value in structure.items():
                if name not in self.layers:
                    fail(_OWNER, "structure", f"widths of the layers of model {self.model_name!r} "
                         f"({', '.join(self.layers)})", Described(f"a layer named {name!r}"))
                pair = table_file.whole_pair(value)
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
                :class:`~keras_group_lasso.SparsityReport` (each layer at the input units and units pruning keeps).
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
        return float(max(total, TINY))

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

    def check_model(self, model, owner=_OWNER, name=None):
        """Raise unless ``model`` has the layers, dense widths and shapes the table was measured for.

        The shapes are the model's input shapes and each units layer's input and output shapes (a table
        without them, saved before they were recorded: the output positions of its hidden layers); an axis of
        unknown size in ``model`` matches any size (a model that takes inputs of any size, with a table
        measured at the size it will run at).

        Returns:
            The table.

        Args:
            model: the model to check.
            owner: the function or class named in the message.
            name: the argument that gave the table (``latency_table``, ``path``), named in the message; ``None``
                (a direct call): the message names ``model``.

        Raises:
            InvalidParameterError: ``owner: argument `name` must be a latency table measured for this model
                ...``, naming the layers and widths, or the shape that differs; ``model`` is not a
                ``keras.Model``.
        """
        if not isinstance(model, keras.Model):
            fail(owner, "model", "a keras.Model", model)
        graph = model_graph(model)
        widths = {node.name: (node.in_units, node.out_units) for node in graph.units}
        if widths != self.layers:
            if name is None:
                fail(owner, "model", f"a model of the layers this table was measured for ({_widths_text(self.layers)})",
                     Described(f"model {model.name!r} (layers {_widths_text(widths)})"))
            fail(owner, name, f"a latency table measured for this model (layers {_widths_text(widths)})", self)
        difference = self._shape_difference(model, graph)
        if difference is not None:
            if name is None:
                fail(owner, "model", "a model of the shapes this table was measured at (a layer's time grows with "
                     "the positions it computes)", Described(f"model {model.name!r} (the table was measured "
                                                            f"{difference})"))
            fail(owner, name, "a latency table measured for this model at its shapes (a layer's time grows with "
                 "the positions it computes)", Described(f"{self!r} measured {difference}"))
        return self

    def _shape_difference(self, model, graph):
        """How the shapes the table was measured at differ from ``model``'s, in words (``None``: they do not)."""
        if self.input_shapes is not None:
            shapes = timing.input_shapes(model)
            if shapes is not None and not _same_shapes(self.input_shapes, shapes):
                return (f"for inputs of shape {_shapes_text(self.input_shapes)}, the model's are "
                        f"{_shapes_text(shapes)}")
        if self.layer_shapes is not None:
            for node in graph.units:
                if node.name not in self.layer_shapes:
                    continue
                (was_in, was_out), now = self.layer_shapes[node.name], timing.unit_shapes(graph, node)
                now_in, now_out = now
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
                count = timing.output_positions(graph, node)
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
                **{key: entry[key] for key in table_file.OPTIONAL if key in entry},
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
        except table_file.Malformed as bad:
            fail(_OWNER, "data", "a latency table as LatencyTable.to_dict writes it",
                 Described(f"a dict whose {bad.found()}"))

    @classmethod
    def _read(cls, data):
        """The table of the dict ``data`` (its format checked already); :class:`.table_file.Malformed` for a bad
        value."""
        table = cls.__new__(cls)
        table._set(table_file.read_fields(data))
        return table

    def save(self, path):
        """Write the table to ``path`` as JSON, replacing the file there whole (:func:`.table_file.write_json`: a
        save that fails midway leaves the file that was there as it was)."""
        table_file.write_json(self.to_dict(), path)

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
        data, reason = table_file.read_json(path)
        if reason is None:
            try:
                table = cls._read(data)
            except table_file.Malformed as bad:
                reason = f"its {bad.found()}"
        if reason is not None:
            fail(_OWNER, "path", "a JSON file written by LatencyTable.save",
                 Described(f"{os.fspath(path)!r} ({reason})"))
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


def _same_shapes(measured, actual):
    """Whether the shapes a table was measured at are ``actual``'s (an axis of unknown size matches any)."""
    return len(measured) == len(actual) and all(
        len(a) == len(b) and all(x is None or y is None or x == y for x, y in zip(a, b))
        for a, b in zip(measured, actual))


def _shapes_text(shapes):
    return " and ".join(str(tuple(shape)) for shape in shapes)


