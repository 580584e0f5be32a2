"""Rules of layers that act on each channel on its own (activations, Dropout, BatchNormalization,
depthwise convolutions, per-element preprocessing) and of normalizations that mix them (tails)."""


import keras
import numpy as np

from keras_group_lasso.graph.rules.base import Kind, LayerRule, activation_is_elementwise


class ActivationRule(LayerRule):
    """``Activation``: per unit when elementwise; a softmax after the output layer is a tail."""

    def refusal(self, layer):
        return None if activation_is_elementwise(layer.activation) else "an activation that mixes units"

    def classify(self, layer):
        reason = self.refusal(layer)
        return (Kind.ACTIVATION_TAIL, reason) if reason else (self.kind, None)


class DropoutRule(LayerRule):
    """Dropout and noise layers: the identity at inference."""

    constants = "identity"
    inference_identity = True


class BatchNormRule(LayerRule):
    """BatchNormalization on the last axis: gamma, beta, moving mean and variance sliced per channel."""

    batchnorm = True


class PerElementRule(LayerRule):
    """Input preprocessing with one value per element (Normalization, Rescaling)."""

    kind = Kind.PER_ELEMENT

    def between_units(self, layer):
        """It may stand between units layers: one value per element of a flat vector."""
        try:
            return len(layer.input.shape) == 2
        except Exception:  # noqa: BLE001 - unknown rank
            return False


class NormalizationRule(PerElementRule):
    """``Normalization``: its mean and variance sliced to the kept elements."""

    def refusal(self, layer):
        return "a Normalization that is not built" if getattr(layer, "mean", None) is None else None

    def set_weights(self, layer, weights):
        # set_weights leaves Normalization's cached mean and variance at their initial
        # values; loading its variables (the saving API) also recomputes them.
        layer.load_own_variables({str(i): w for i, w in enumerate(weights)})

    def between_units(self, layer):
        """On a flat vector, or with one mean and variance per channel (``axis=-1``) on a map."""
        return super().between_units(layer) or _per_channel(layer.mean)

    def refresh(self, layer):
        """Recompute the cached statistics of a built layer from its variables (after ``set_weights``)."""
        if layer.weights:
            self.set_weights(layer, layer.get_weights())


class RescalingRule(PerElementRule):
    """``Rescaling``: scalars anywhere; one value per channel anywhere; one per element before a Flatten."""

    def refusal(self, layer):
        per_element = np.ndim(layer.scale) > 0 or np.ndim(layer.offset) > 0
        if per_element and keras.config.image_data_format() == "channels_first":
            return "a Rescaling with a non-scalar scale or offset under channels_first"
        return None

    def between_units(self, layer):
        if all(_per_channel(v) for v in (layer.scale, layer.offset)):
            return True
        return super().between_units(layer)


def _per_channel(values):
    # Broadcast against (batch, ..., channels), a value of shape (), (C,) or (1, ..., 1, C) is one per channel.
    shape = np.shape(keras.ops.convert_to_numpy(values)) if not isinstance(values, (int, float)) else ()
    return all(d == 1 for d in shape[:-1])

class TailRule(LayerRule):
    """A layer that mixes units (softmax): every unit it reads is kept."""

    kind = Kind.TAIL
    constants = None


class MixingNormalizationRule(TailRule):
    """Layer, RMS, group and unit normalization over the channels: every channel they normalize is kept.

    Their statistics are taken over the channels (all of them, or each group
    of them), so removing a channel, even an all-zero one, changes every
    other channel's output: the units they read all stay (and so does a
    residual stream they normalize). Units that no normalization reads
    (ConvNeXt's expansion units between its two pointwise Dense layers) are
    pruned as anywhere else.
    """

    def refusal(self, layer):
        axis = layer.axis if isinstance(layer.axis, (list, tuple)) else [layer.axis]
        try:
            rank = len(layer.input.shape)
        except Exception:  # noqa: BLE001 - unknown rank
            return "a normalization whose input is unknown"
        if (rank - 1) not in {int(a) % rank for a in axis}:
            return "a normalization that does not normalize over the channels (last axis)"
        return None

    def slice(self, layer, kept):
        if np.asarray(kept).size != self._channels(layer):  # pragma: no cover - the masks keep them all
            raise RuntimeError(f"the channels that '{layer.name}' normalizes were to be sliced; please report this")
        return layer.get_config(), layer.get_weights()

    @staticmethod
    def _channels(layer):
        return int(layer.input.shape[-1])


class LastAxisNormalizationRule(MixingNormalizationRule):
    """A normalization of its own class that normalizes over the channels alone, by construction (KerasHub's
    RMS normalizations of Gemma and Llama): every channel it normalizes is kept, with its weights."""

    def refusal(self, layer):
        return None


class GroupNormRule(LayerRule):
    """``GroupNormalization`` (last axis): a group of channels stays or goes whole.

    Each group's mean and variance are its own, so when every channel of a
    group goes, the other groups' outputs do not change: the group leaves and
    ``groups`` shrinks with it. A channel of a kept group stays, even a
    constant one (removing it would change its group's statistics).
    """

    constants = None

    def refusal(self, layer):
        axis = layer.axis if isinstance(layer.axis, int) else None
        try:
            rank = len(layer.input.shape)
        except Exception:  # noqa: BLE001 - unknown rank
            return "a GroupNormalization whose input is unknown"
        if axis is None or axis % rank != rank - 1:
            return "a GroupNormalization over an axis other than the channels (last axis)"
        return None

    @property
    def slices(self):
        return True

    def _size(self, layer):
        channels = int(layer.input.shape[-1])
        groups = channels if layer.groups == -1 else int(layer.groups)
        return channels, groups, channels // groups

    def unit_groups(self, layer):
        """The channel indices of each group: kept or removed together."""
        channels, groups, size = self._size(layer)
        return [np.arange(g * size, (g + 1) * size) for g in range(groups)] if size > 1 else []

    def slice(self, layer, kept):
        kept = np.asarray(kept, dtype=int)
        _, groups, size = self._size(layer)
        if kept.size % size or np.any(np.bincount(kept // size, minlength=groups)[np.unique(kept // size)] != size):
            raise RuntimeError(  # pragma: no cover - the masks keep whole groups
                f"the channels of '{layer.name}' were to be cut inside a group; please report this")
        config = dict(layer.get_config(), groups=int(kept.size // size) if layer.groups != -1 else -1)
        return config, [w[kept] for w in layer.get_weights()]

# ----------------------------------------------------------------------------- per-unit slicers and refusals


def _per_unit_vectors(layer, kept):
    """Every weight is one value per channel (BatchNormalization's gamma, beta, moving mean and variance)."""
    return layer.get_config(), [w[..., kept] for w in layer.get_weights()]


def _prelu(layer, kept):
    """PReLU's alpha, shared over the spatial axes: sliced on its channel axis unless shared there too."""
    channels = int(layer.input.shape[-1])
    weights = []
    for w in layer.get_weights():
        weights.append(w[..., kept] if w.shape[-1] == channels else w)
    return layer.get_config(), weights


def _prelu_refusal(layer):
    try:
        rank = len(layer.input.shape)
    except Exception:  # noqa: BLE001 - unknown: refuse to be safe
        return "a PReLU whose input is unknown"
    shared = set(a % rank for a in (layer.shared_axes or ()))
    if rank > 2 and not set(range(1, rank - 1)) <= shared:
        return "a PReLU with a different alpha per position (set shared_axes to the spatial axes)"
    return None


def _batchnorm_refusal(layer):
    axis = layer.axis if isinstance(layer.axis, int) else None
    try:
        rank = len(layer.input.shape)
    except Exception:  # noqa: BLE001
        rank = None
    if axis is None or (axis != -1 and (rank is None or axis != rank - 1)):
        return "a BatchNormalization not on the last axis"
    return None


def _per_element(values, shape):
    """``values`` broadcast as Keras broadcasts them against a ``(batch, *shape)`` input, flattened."""
    values = np.asarray(keras.ops.convert_to_numpy(values))
    return np.broadcast_to(values, (1,) + tuple(shape)).reshape(-1)


def _input_shape(layer):
    # An axis of unknown size (None) counts as 1: only values that are the same at every position
    # along it (one per channel) reach a slicer there (one per element is refused on such a map).
    return tuple(1 if d is None else int(d) for d in layer.input.shape[1:])


def _normalization(layer, kept):
    """Normalization's mean and variance, one value per element of its input, sliced to ``kept``.

    ``y = (x - mean) / max(sqrt(variance), eps)`` (or its inverse) with the
    statistics broadcast over the input, whatever ``axis`` was: the kept
    elements keep their own statistics, so the map is unchanged on them. The
    result normalizes a flat vector of ``len(kept)`` values (``axis=-1``).
    """
    shape = _input_shape(layer)
    weights = layer.get_weights()
    if weights:  # adapted or loaded: the statistics are variables over the kept axes
        mean, variance = (np.reshape(w, np.shape(layer.mean)) for w in weights[:2])
    else:  # given to the constructor
        mean, variance = layer.mean, layer.variance
    mean = _per_element(mean, shape)[kept]
    variance = _per_element(variance, shape)[kept]
    config = layer.get_config()
    config.update(axis=-1, mean=None, variance=None)
    return config, [mean, variance, np.zeros((), "int64")]


def _rescaling(layer, kept):
    """Rescaling ``y = x * scale + offset``: scalars stay, per-element scale / offset are sliced to ``kept``.

    ``kept`` are entries of the input flattened (the input's elements) or
    channels of a map; a value per channel broadcast over the map gives
    channel ``c`` at flattened entry ``c``, so one slicing serves both.
    """
    if np.ndim(layer.scale) == 0 and np.ndim(layer.offset) == 0:
        return layer.get_config(), []
    shape = _input_shape(layer)
    config = layer.get_config()
    config["scale"] = _per_element(layer.scale, shape)[kept].tolist()
    config["offset"] = _per_element(layer.offset, shape)[kept].tolist()
    return config, []


def _position_table(layer, kept):
    """KerasHub's ``PositionEmbedding``: its table ``(positions, channels)`` sliced by channel."""
    return layer.get_config(), [w[:, kept] for w in layer.get_weights()]


def _position_refusal(layer):
    for node in getattr(layer, "_inbound_nodes", ()):
        kwargs = node.arguments.kwargs
        if kwargs.get("positions") is not None or not isinstance(kwargs.get("start_index", 0), int):
            return "a PositionEmbedding called with positions or a start index given as tensors"
    return None


def position_embedding_rule(cls, description):
    """The rule of KerasHub's ``PositionEmbedding`` (its output is its table, sliced by channel)."""
    return LayerRule(cls, description, slicer=_position_table, constants=None, refusal=_position_refusal)


def builtin_rules():
    """The rules of Keras's layers that act on each channel, preprocess inputs, or mix channels, in the table's
    order."""
    layers = keras.layers
    rules = [DropoutRule(getattr(layers, name))
              for name in ("Dropout", "GaussianDropout", "GaussianNoise", "AlphaDropout")]
    rules += [LayerRule(getattr(layers, name), constants="identity")
              for name in ("SpatialDropout1D", "SpatialDropout2D", "SpatialDropout3D")]
    # An Identity of another float dtype casts (a keras.ops cast in the graph is one): a constant is cast too.
    rules.append(LayerRule(layers.Identity, constants="call"))
    rules += [LayerRule(getattr(layers, name)) for name in ("ReLU", "LeakyReLU", "ELU")]
    rules.append(ActivationRule(layers.Activation, "Activation (elementwise)"))
    rules.append(BatchNormRule(layers.BatchNormalization, "BatchNormalization (last axis)",
                               slicer=_per_unit_vectors, refusal=_batchnorm_refusal))
    rules.append(LayerRule(layers.PReLU, "PReLU (shared over positions)", slicer=_prelu, refusal=_prelu_refusal))
    rules += [LayerRule(getattr(layers, name), constants="identity")
              for name in ("MaxPooling1D", "MaxPooling2D", "MaxPooling3D", "AveragePooling1D", "AveragePooling2D",
                           "AveragePooling3D", "Cropping1D", "Cropping2D", "Cropping3D", "UpSampling1D",
                           "UpSampling2D", "UpSampling3D")]
    rules += [LayerRule(getattr(layers, name), constants="zero_only")
              for name in ("ZeroPadding1D", "ZeroPadding2D", "ZeroPadding3D")]
    rules.append(NormalizationRule(layers.Normalization, slicer=_normalization))
    rules.append(RescalingRule(layers.Rescaling, slicer=_rescaling))
    rules += [TailRule(layers.Softmax), TailRule(layers.Masking, "Masking (its mask reads every feature)"),
              GroupNormRule(layers.GroupNormalization, "GroupNormalization (whole groups kept or removed)")]
    rules += [MixingNormalizationRule(getattr(layers, name), f"{name} (its channels stay)")
              for name in ("LayerNormalization", "RMSNormalization", "UnitNormalization") if hasattr(layers, name)]
    return rules
