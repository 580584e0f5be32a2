"""Rules of recurrent layers: SimpleRNN, GRU, LSTM and Bidirectional."""


import keras
import numpy as np

from keras_group_lasso.graph.rules.base import Kind, activation_is_elementwise, adapted, to_numpy
from keras_group_lasso.graph.rules.units import UnitsRule
from keras_group_lasso.groups import GroupView


class SequenceRule(UnitsRule):
    """The base of the recurrent and attention rules: layers whose units carry state over a sequence.

    A unit they make is never a constant (a recurrent unit's state evolves
    over time even with all incoming weights zero; an attention output mixes
    the positions), so nothing is folded into their biases and only a
    constant 0 of their input is removed. They read the channels of a
    sequence (one position of their kernel), and their activations act on
    each unit on its own.
    """

    merges_batchnorm = False
    rounds = False
    constant_outputs = False

    def classify(self, layer):
        reason = self.refusal(layer)
        return (Kind.OTHER, reason) if reason else (self.kind, None)

    def mixes_units(self, layer):
        return False

    def unit_shape(self, layer, channels, positions):
        if positions != 1 or self.kernel_shape(layer)[1] != channels:
            return None
        return channels, 1

    def constant_contribution(self, layer, weights, in_units, values):
        if np.any(np.asarray(values) != 0):  # pragma: no cover - pads() lets only constants of 0 through
            raise RuntimeError(f"a constant was to be folded into '{layer.name}'; please report this")
        return np.zeros(self.kernel_shape(layer)[2])

    def pads(self, layer):
        return True


class RecurrentRule(SequenceRule):
    """``SimpleRNN``, ``GRU``, ``LSTM``: input groups over its features and hidden units with a recurrence.

    Its kernel ``(in, G * units)`` holds ``G`` gates side by side (1 for
    SimpleRNN, 3 for GRU, 4 for LSTM; column ``g * units + j`` is gate ``g``
    of unit ``j``): row ``i`` (every gate) is input feature ``i``'s group, at
    every time step. Row ``j`` of the recurrent kernel ``(units, G * units)``
    is hidden unit ``j``'s group inside the layer (:meth:`recurrence`); with
    what the next layer reads of it (every step with ``return_sequences``,
    the last one otherwise) it is all of the unit's outgoing weights. A unit
    that neither a reader nor a kept unit's recurrence reads goes: its gate
    columns leave both kernels and the bias (both biases of a GRU with
    ``reset_after``). A unit is never a constant (its state evolves over time
    even with all incoming weights zero), and only a constant 0 of its input
    is removed (a constant input would have to go into every gate's bias,
    which is exact but not done).
    """

    width_key = "units"

    def __init__(self, cls, gates, description=None, **kwargs):
        super().__init__(cls, description, **kwargs)
        self.gates = int(gates)

    def refusal(self, layer):
        reason = adapted(layer)
        if reason:
            return reason
        if layer.stateful:
            return "a stateful recurrent layer (its state carries over between batches)"
        if layer.return_state:
            return "a recurrent layer with return_state=True (its states are outputs of their own)"
        for attribute in ("activation", "recurrent_activation"):
            function = getattr(layer.cell, attribute, None)
            if function is not None and not activation_is_elementwise(function):
                return f"a recurrent layer whose {attribute} is not elementwise"
        return None

    def kernels(self, layer):
        return {"kernel": layer.cell.kernel, "recurrent": layer.cell.recurrent_kernel}

    def own_unit_attributes(self, layer):
        return ("recurrent_regularizer",)

    def bias(self, layer):
        return layer.cell.bias if layer.cell.use_bias else None

    def kernel_shape(self, layer):
        rows, columns = (int(d) for d in layer.cell.kernel.shape)
        return 1, rows, columns // self.gates

    def units_view(self, weights, in_units, layer=None):
        """The kernel as ``(gates, in_units, units)``: gate ``g``'s weights from input ``i`` into unit ``j``."""
        kernel = weights["kernel"]
        return np.moveaxis(kernel.reshape(kernel.shape[0], self.gates, -1), 1, 0)

    def recurrence(self, layer, weights):
        """bool ``(units, units)``: hidden unit ``j`` reaches unit ``k`` through a non-zero recurrent weight."""
        recurrent = weights["recurrent"]
        return np.any(recurrent.reshape(recurrent.shape[0], self.gates, -1) != 0, axis=1)

    def columns(self, units, kept_out):
        """The kernel columns of the units ``kept_out`` in every gate (gate-major)."""
        return (np.arange(self.gates)[:, None] * units + np.asarray(kept_out, dtype=int)[None, :]).reshape(-1)

    def slice_units(self, layer, weights, in_units, kept_in, kept_out):
        kept_in = np.asarray(kept_in, dtype=int)
        kept_out = np.asarray(kept_out, dtype=int)
        columns = self.columns(weights["recurrent"].shape[0], kept_out)
        new = [np.ascontiguousarray(weights["kernel"][kept_in][:, columns]),
               np.ascontiguousarray(weights["recurrent"][kept_out][:, columns])]
        if weights["bias"] is not None:
            new.append(np.ascontiguousarray(weights["bias"][..., columns]))
        return dict(layer.get_config(), units=int(kept_out.size)), new

    def serving_config(self, layer):
        """Unrolled over a sequence of known length: the same computation without a loop (TFLite's own ops)."""
        if layer.unroll or self._steps(layer, None) is None:
            return None
        return dict(layer.get_config(), unroll=True)

    def _steps(self, layer, unknown=1):
        try:
            steps = layer.input.shape[1]
        except Exception:  # noqa: BLE001 - a layer with no single input
            return unknown
        return unknown if steps is None else int(steps)

    def flops(self, layer, positions, in_units, out_units, output_shape):
        """``steps * G * (in + units) * units`` multiply-adds (a sequence of unknown length: per step)."""
        return self._steps(layer) * self.gates * (in_units + out_units) * out_units

    def params(self, layer, positions, in_units, out_units, has_bias):
        biases = 2 if getattr(layer.cell, "reset_after", False) else 1
        return self.gates * out_units * (in_units + out_units + (biases if has_bias else 0))


class BidirectionalRule(SequenceRule):
    """``Bidirectional`` around a SimpleRNN, GRU or LSTM: forward and backward units.

    With ``merge_mode="concat"`` the output holds the forward units, then the
    backward ones: separate units, each with its own groups. Keras builds both
    directions with the same width, so where one direction keeps more units
    than the other, dead units of the other one stay (their outgoing weights
    are zero: the outputs do not change). With ``"sum"``, ``"ave"`` or
    ``"mul"`` forward unit ``j`` and backward unit ``j`` are one output unit,
    kept or removed together.
    """

    _DIRECTIONS = ("forward", "backward")

    def __init__(self, cls, inner, description=None, **kwargs):
        super().__init__(cls, description, **kwargs)
        self.inner = {rule.cls: rule for rule in inner}  # the rules of the layers it may wrap

    def _inner(self, layer):
        return self.inner.get(type(layer.forward_layer))

    def _layers(self, layer):
        return layer.forward_layer, layer.backward_layer

    def penalty_layers(self, layer):
        return self._layers(layer)

    def penalty_config_keys(self, layer):
        """The keys of its config that hold the configs of :meth:`penalty_layers`."""
        return ("layer", "backward_layer")

    def serving_config(self, layer):
        inner = self._inner(layer)
        if layer.forward_layer.unroll or inner._steps(layer, None) is None:
            return None
        config = layer.get_config()
        for key in self.penalty_config_keys(layer):
            config[key] = {k: v for k, v in config[key].items() if k != "build_config"}
            config[key]["config"] = dict(config[key]["config"], unroll=True)
        return config

    def refusal(self, layer):
        inner = self._inner(layer)
        if not isinstance(inner, RecurrentRule) or type(layer.backward_layer) is not type(layer.forward_layer):
            return "a Bidirectional wrapper of a layer other than SimpleRNN, GRU or LSTM"
        if layer.merge_mode not in ("concat", "sum", "ave", "mul"):
            return f"a Bidirectional layer with merge_mode={layer.merge_mode!r} (two outputs)"
        return inner.refusal(layer.forward_layer) or inner.refusal(layer.backward_layer)

    def _concat(self, layer):
        return layer.merge_mode == "concat"

    def kernels(self, layer):
        inner = self._inner(layer)
        out = {}
        for direction, sub in zip(self._DIRECTIONS, self._layers(layer)):
            for role, variable in inner.kernels(sub).items():
                out[f"{direction}_{role}"] = variable
        return out

    def regularizer_attributes(self, layer):
        return ("kernel_regularizer",)

    def own_unit_attributes(self, layer):
        return ("recurrent_regularizer",)

    def bias(self, layer):
        return None

    def weights(self, layer, read=to_numpy):
        out = {role: read(variable) for role, variable in self.kernels(layer).items()}
        inner = self._inner(layer)
        for direction, sub in zip(self._DIRECTIONS, self._layers(layer)):
            bias = inner.bias(sub)
            out[f"{direction}_bias"] = None if bias is None else read(bias)
        out["bias"] = None
        return out

    def thresholded_variables(self, layer):
        inner = self._inner(layer)
        return [v for sub in self._layers(layer) for v in inner.thresholded_variables(sub)]

    def _direction(self, weights, direction):
        return {role.split("_", 1)[1]: value for role, value in weights.items() if role.startswith(direction + "_")}

    def kernel_shape(self, layer):
        _, rows, units = self._inner(layer).kernel_shape(layer.forward_layer)
        return 1, rows, units * (2 if self._concat(layer) else 1)

    def unit_shape(self, layer, channels, positions):
        return self._inner(layer).unit_shape(layer.forward_layer, channels, positions)

    def connections(self, layer, weights, in_units):
        inner = self._inner(layer)
        forward, backward = (inner.connections(layer.forward_layer, self._direction(weights, d), in_units)
                             for d in self._DIRECTIONS)
        return np.concatenate([forward, backward], axis=1) if self._concat(layer) else forward | backward

    def recurrence(self, layer, weights):
        inner = self._inner(layer)
        forward, backward = (inner.recurrence(layer.forward_layer, self._direction(weights, d))
                             for d in self._DIRECTIONS)
        if not self._concat(layer):
            return forward | backward
        units = forward.shape[0]
        out = np.zeros((2 * units, 2 * units), dtype=bool)
        out[:units, :units], out[units:, units:] = forward, backward
        return out

    def paired_halves(self, layer):
        """Its output's two halves must keep as many units each (Keras builds both directions alike)."""
        return self._concat(layer)

    def group_norms(self, layer, in_units):
        weights = self.weights(layer)
        norms = [GroupView().norms(weights[f"{d}_kernel"], in_units) for d in self._DIRECTIONS]
        return np.sqrt(norms[0] ** 2 + norms[1] ** 2)

    def slice_units(self, layer, weights, in_units, kept_in, kept_out):
        inner = self._inner(layer)
        kept_out = np.asarray(kept_out, dtype=int)
        units = self._inner(layer).kernel_shape(layer.forward_layer)[2]
        if self._concat(layer):
            kept = (kept_out[kept_out < units], kept_out[kept_out >= units] - units)
            if kept[0].size != kept[1].size:  # pragma: no cover - the masks keep as many in each direction
                raise RuntimeError(f"the two directions of '{layer.name}' keep different widths; please report this")
        else:
            kept = (kept_out, kept_out)
        config = layer.get_config()
        new = []
        for key, direction, sub, keep in zip(("layer", "backward_layer"), self._DIRECTIONS, self._layers(layer), kept):
            sub_config, sub_weights = inner.slice_units(sub, self._direction(weights, direction), in_units, kept_in,
                                                        keep)
            # Built when called (its serialized build_config holds the old input width).
            config[key] = {k: v for k, v in config[key].items() if k != "build_config"}
            config[key]["config"] = sub_config
            new += sub_weights
        return config, new

    def flops(self, layer, positions, in_units, out_units, output_shape):
        per_direction = out_units // 2 if self._concat(layer) else out_units
        inner = self._inner(layer)
        # The sequence length from the wrapper (the layers it holds are not called in the model's graph).
        return 2 * inner._steps(layer) * inner.gates * (in_units + per_direction) * per_direction

    def params(self, layer, positions, in_units, out_units, has_bias):
        per_direction = out_units // 2 if self._concat(layer) else out_units
        has_bias = self._inner(layer).bias(layer.forward_layer) is not None
        return 2 * self._inner(layer).params(layer.forward_layer, positions, in_units, per_direction, has_bias)


def builtin_rules():
    """The rules of Keras's recurrent layers, in the table's order."""
    layers = keras.layers
    inner = [RecurrentRule(layers.SimpleRNN, 1), RecurrentRule(layers.GRU, 3), RecurrentRule(layers.LSTM, 4)]
    return [*inner, BidirectionalRule(layers.Bidirectional, inner, "Bidirectional (SimpleRNN, GRU, LSTM)")]
