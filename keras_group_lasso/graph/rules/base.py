"""The rule every layer class has: its kind, its refusal, how constants pass it, how surgery slices it."""

import enum
import functools
import inspect
import types
import weakref

import keras
import numpy as np


class Kind(enum.StrEnum):
    """How units flow through a node of the graph (a string too: ``Kind.UNITS == "units"``).

    The kinds a rule gives its layers (see :mod:`keras_group_lasso.graph.registry`; ``WHOLE`` reads every channel
    and makes new units, all kept: a layer kept whole, a channels-first pooling), and the ones the graph derives:
    ``UNITS_MIXING`` (a units layer whose activation mixes units), ``ACTIVATION_TAIL`` (an Activation that mixes
    them), ``SLICE`` (a slice of the channels) and ``OTHER`` (refused, with a reason).
    """

    INPUT = "input"
    CONSTANT = "constant"
    UNITS = "units"
    UNITS_MIXING = "units_mixing"
    PER_UNIT = "per_unit"
    PER_ELEMENT = "per_element"
    FLATTEN = "flatten"
    GLOBAL_POOL = "global_pool"
    MERGE = "merge"
    CONCAT = "concat"
    TAIL = "tail"
    ACTIVATION_TAIL = "activation_tail"
    WHOLE = "whole"
    SLICE = "slice"
    OTHER = "other"


#: The kinds of the table, in the order of the supported layers' list.
KINDS = (Kind.UNITS, Kind.PER_UNIT, Kind.PER_ELEMENT, Kind.FLATTEN, Kind.GLOBAL_POOL, Kind.MERGE, Kind.CONCAT,
         Kind.TAIL, Kind.WHOLE, Kind.INPUT, Kind.CONSTANT)
CONSTANTS = ("call", "identity", "zero_only", None)

# Keras activations that act on each scalar on its own (softmax, log_softmax,
# sparsemax and glu mix units; a custom function is not trusted).
ELEMENTWISE_ACTIVATIONS = frozenset(
    {
        "linear", "relu", "relu6", "leaky_relu", "elu", "selu", "celu", "gelu", "sigmoid",
        "hard_sigmoid", "log_sigmoid", "sparse_sigmoid", "tanh", "hard_tanh", "tanh_shrink",
        "softplus", "softsign", "sparse_plus", "squareplus", "silu", "swish", "hard_silu",
        "hard_swish", "mish", "exponential", "hard_shrink", "soft_shrink",
    }
)
MIXES_UNITS = "a layer whose activation mixes units"
_UNSET = object()


def activation_is_elementwise(function):
    """``True`` for a Keras activation that acts on each scalar on its own."""
    try:
        name = keras.activations.serialize(function)
    except Exception:  # noqa: BLE001 - an unserializable function is simply unknown
        return False
    if isinstance(name, dict):  # a function registered for serialization by another package
        return name.get("config") in _ELEMENTWISE_REGISTERED
    return isinstance(name, str) and name in ELEMENTWISE_ACTIVATIONS


#: Elementwise activations registered for serialization by other packages (KerasHub's BERT uses the first) and by
#: this one (:func:`~keras_group_lasso.graph.rules.operations.gelu_approximate`).
_ELEMENTWISE_REGISTERED = frozenset({"keras_hub>gelu_approximate", "keras_group_lasso>gelu_approximate"})


def to_numpy(variable):
    return np.asarray(keras.ops.convert_to_numpy(getattr(variable, "value", variable)))


def call_arguments(layer):
    try:
        return inspect.signature(layer.call).parameters
    except (TypeError, ValueError):
        return {}


def layer_dtype(layer):
    """The dtype ``layer`` reads in the model: its input's, else its compute dtype (a float64 model stays float64)."""
    try:
        dtype = keras.backend.standardize_dtype(layer.input.dtype)
    except Exception:  # noqa: BLE001 - a layer with no single input: its policy says
        dtype = getattr(layer, "compute_dtype", None) or keras.config.floatx()
    return dtype if "float" in str(dtype) else keras.config.floatx()


def call_on_constants(layer, values):
    """``layer`` (inference mode) on a one-position tensor holding ``values`` on its last axis.

    In the dtype the layer reads in the model, so that a constant folded from a
    float64 model is as exact as the model itself.
    """
    try:
        rank = len(layer.input.shape)
    except Exception:  # noqa: BLE001 - a layer seen on a flat vector
        rank = 2
    x = np.zeros((1,) * (rank - 1) + (values.size,), dtype=layer_dtype(layer))
    x.reshape(-1)[:] = values
    kwargs = {"training": False} if "training" in call_arguments(layer) else {}
    out = layer(keras.ops.convert_to_tensor(x), **kwargs)
    return np.asarray(keras.ops.convert_to_numpy(out), dtype=np.float64).reshape(-1)[-values.size:]


def call_activation(layer, values):
    """``layer``'s own activation on pre-activations ``values`` (NaN stays NaN), in its compute dtype."""
    activation = getattr(layer, "activation", None)
    if activation is None:
        return values
    finite = np.where(np.isnan(values), 0.0, values)
    dtype = getattr(layer, "compute_dtype", None) or keras.config.floatx()
    out = np.asarray(keras.ops.convert_to_numpy(activation(keras.ops.convert_to_tensor(finite[None, :], dtype=dtype))),
                     dtype=np.float64)[0]
    return np.where(np.isnan(values), np.nan, out)


def threshold_array(values, threshold):
    """``values`` with every ``|w| <= threshold`` set to an exact 0 (a new array)."""
    values = np.asarray(values)
    return np.where(np.abs(values) <= threshold, np.zeros((), values.dtype), values)


def layer_from_config(layer, config):
    """A new layer of ``layer``'s class from ``config`` (its config, changed or not).

    Two kinds of classes cannot take their own config back, and get the entries
    their constructors name: a block whose constructor takes no ``**kwargs``
    (keras.io's ``super().__init__()``; its name and whether it trains are set
    on it after), and a layer whose config holds values its class derives
    (KerasHub's ``ViTPatchingAndEmbedding`` writes ``num_patches``), the latter
    only when the new layer derives the same values. A new layer of such a
    class writes its config less those values (however it was made: from its
    class's config or from one written so), so that a model saved with it loads
    (with plain Keras: a layer that Keras itself makes again from a file writes
    its class's config once more).
    """
    cls = type(layer)
    used = config
    try:
        new = cls.from_config(config)
    except TypeError:
        parameters = inspect.signature(cls.__init__).parameters
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
            new = cls.from_config({key: value for key, value in config.items() if key in parameters})
            new.name = config.get("name", new.name)
            new.trainable = config.get("trainable", new.trainable)
            return new
        named = _constructor_names(cls)
        derived = {key: value for key, value in config.items() if key not in named}
        used = {key: value for key, value in config.items() if key in named}
        try:
            new = cls.from_config(used)
            written = cls.get_config(new)
            same = all(_equal(written.get(key, _UNSET), value) for key, value in derived.items())
        except Exception:  # noqa: BLE001 - a config it refuses, or values that do not compare: not the same layer
            same = False
        if not same:
            raise
    _write_loadable_config(new, used)
    keep_config(new, used)
    return new


def _constructor_names(cls):
    """The argument names of the constructors of ``cls`` and of its bases up to ``keras.layers.Layer``."""
    return {name for base in cls.__mro__ if isinstance(base, type) and issubclass(base, keras.layers.Layer)
            for name in inspect.signature(base.__init__).parameters}


def _equal(a, b):
    try:
        return bool(a == b) or (isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and list(a) == list(b))
    except Exception:  # noqa: BLE001 - arrays and other values without a plain truth value
        return False


def _write_loadable_config(new, config):
    """Give ``new`` a ``get_config`` without the entries its class writes but no constructor takes (and that
    ``config``, the one it was made from, did not hold): the config of a layer like ``ViTPatchingAndEmbedding``,
    then, loads."""
    try:
        written = type(new).get_config(new)
    except Exception:  # noqa: BLE001 - a layer without a config of its own: nothing is written for it
        return
    missing = set(written) - set(config)
    if not missing:
        return  # the usual case: the class writes what it was given
    extra = missing - _constructor_names(type(new))
    if not extra:
        return
    own = type(new).get_config

    def get_config():
        return {key: value for key, value in own(new).items() if key not in extra}

    new.get_config = get_config


# ----------------------------------------------------------------------------- the rule classes


def layer_config(layer):
    """``layer.get_config()``; for a layer whose class writes no config of its own but that was made with a value
    Keras's automatic config cannot hold (a dtype policy object, as KerasHub passes), the config every layer has
    (its name, whether it trains, its dtype policy) and each of its constructor's arguments, read from the
    attribute of that name (or that name after ``_``) where the layer keeps it (KerasHub's ``CachedGemmaAttention``);
    raises where one is not kept."""
    try:
        config = layer.get_config()
    except (NotImplementedError, AttributeError):  # no config of its own, or one that reads a missing attribute
        if not isinstance(layer, keras.layers.Layer):
            raise
        config = {"name": layer.name, "trainable": layer.trainable,
                  "dtype": keras.dtype_policies.serialize(layer.dtype_policy)}
        for key in _own_arguments(layer):
            found = _argument_value(layer, key)
            if found is _UNSET:  # not kept, or a value a config cannot hold (a function)
                raise
            config[key] = found
        return config
    return _without_refused(layer, dict(config, **_forgotten(layer, config)))


def _without_refused(layer, config):
    """``config`` less the keys that no constructor of ``layer``'s classes takes, where its class refuses them and
    loads without (KerasHub 0.32's ``DeiTEncoderBlock`` writes ``key_dim``, which it derives from ``hidden_dim``
    and ``num_heads``)."""
    taken = _constructor_arguments(type(layer))
    if taken is None:
        return config
    extra = [key for key in config if key not in taken]
    if not extra:
        return config
    trimmed = {key: value for key, value in config.items() if key not in extra}
    try:
        type(layer).from_config(config)
    except TypeError:
        try:
            type(layer).from_config(trimmed)
        except Exception:  # noqa: BLE001 - not what makes it fail: the config as written
            return config
        return trimmed
    except Exception:  # noqa: BLE001 - a config its class refuses otherwise: as written
        return config
    return config


@functools.lru_cache(maxsize=None)
def _constructor_arguments(cls):
    """The argument names the constructors of ``cls`` and its bases name, or ``None`` where one has no signature."""
    taken = {"name", "trainable", "dtype"}
    for base in cls.__mro__:
        init = vars(base).get("__init__")
        if init is not None:
            try:
                taken.update(inspect.signature(init).parameters)
            except (TypeError, ValueError):
                return None
    return frozenset(taken)


def _forgotten(layer, config):
    """``{argument: value}`` of the constructor arguments ``config`` leaves out, read where the layer keeps them: a
    required one (KerasHub 0.32's Qwen3 decoder forgets ``head_dim``), or one kept at another value than its default
    (the same decoder's ``sliding_window_size``)."""
    found = {}
    for key, parameter in _own_parameters(layer):
        if key in config:
            continue
        value = _argument_value(layer, key)
        if value is not _UNSET and (parameter.default is inspect.Parameter.empty or value != parameter.default):
            found[key] = value
    return found


def config_is_read(layer):
    """``layer``'s config is (in part) read from its attributes by :func:`layer_config`: its class writes none that
    it can load (its ``get_config`` raises, or leaves out an argument its constructor requires or that the layer
    was given another value of than its default)."""
    try:
        written = layer.get_config()
    except (NotImplementedError, AttributeError):
        return True
    return any(key not in written for key in _own_arguments(layer, required=True)) or bool(_forgotten(layer, written))


def _own_parameters(layer):
    """``(name, inspect.Parameter)`` of the arguments of ``layer``'s constructor beyond those of every layer."""
    return [(key, parameter) for key, parameter in inspect.signature(type(layer).__init__).parameters.items()
            if key not in ("self", "name", "dtype", "trainable")
            and parameter.kind not in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)]


def _own_arguments(layer, required=False):
    """The names of the arguments of ``layer``'s constructor beyond those of every layer (all, or those without a
    default)."""
    return [key for key, parameter in _own_parameters(layer)
            if not required or parameter.default is inspect.Parameter.empty]


def _argument_value(layer, key):
    """The value of constructor argument ``key`` as a config holds it, from the attribute of that name (or that
    name after ``_``; a rate ``key`` from the ``Dropout`` it made, ``<key>_layer``: KerasHub T5's attention);
    ``_UNSET`` where the layer keeps no such attribute or its value cannot be written."""
    found = next((vars(layer)[at] for at in (key, f"_{key}") if at in vars(layer)), _UNSET)
    if found is _UNSET and isinstance(getattr(layer, f"{key}_layer", None), keras.layers.Dropout):
        found = float(getattr(layer, f"{key}_layer").rate)
    if isinstance(found, (keras.initializers.Initializer, keras.regularizers.Regularizer, keras.constraints.Constraint)):
        return keras.saving.serialize_keras_object(found)
    if callable(found) and isinstance(_activation_name(found), str):  # an activation: by its name
        return _activation_name(found)
    return found if _plain(found) else _UNSET


def _activation_name(function):
    try:
        return keras.activations.serialize(function)
    except Exception:  # noqa: BLE001 - not a Keras activation
        return None


def keep_config(layer, config):
    """Give ``layer`` (made from ``config``) a ``get_config`` that returns ``config`` where its class's own raises
    (KerasHub 0.32's ``LlamaTransformerDecoder`` reads an attribute it never sets), or its class's own with the
    arguments of ``config`` it leaves out: a model holding it saves, and loads wherever its class can be imported."""
    try:
        written = layer.get_config()
    except (NotImplementedError, AttributeError):
        def get_config():
            return dict(config, name=layer.name)

        layer.get_config = get_config
        return
    forgotten = {key: value for key, value in config.items() if key not in written}
    if forgotten:  # arguments its class leaves out of its config (KerasHub 0.32's Qwen3 decoder: head_dim)
        own = layer.get_config  # its class's, or the loadable one layer_from_config gave it

        def get_config_and_forgotten():
            return dict(own(), **forgotten)

        layer.get_config = get_config_and_forgotten


def _plain(value):
    """``value`` is what a config holds as it is: ``None``, a bool, number or string, or lists of those."""
    if isinstance(value, (list, tuple)):
        return all(_plain(item) for item in value)
    return value is None or isinstance(value, (bool, int, float, str))


class LayerRule:
    """How the package treats one layer class: the base of every rule, a per-unit layer by default.

    Args:
        cls: the layer class (matched exactly: a subclass may do anything).
        description: a few words for the list of supported layers (default: the class name).
        slicer: ``(layer, kept) -> (config, weights)`` for a layer with
            per-unit weights or config (``kept``: the channel indices that
            stay); ``None`` when it has none (its config is copied).
        constants: how a constant channel passes (see the module docstring);
            default: the class's.
        refusal: ``layer -> reason or None``, for configurations of the class
            that cannot be handled exactly (``None``: all are fine).

    Subclasses override the methods below; the attributes say what the
    layer is to the rest of the package.
    """

    kind = Kind.PER_UNIT
    constants = "call"
    #: ``apply_threshold`` and surgery threshold its weights (its kernels and bias).
    thresholded = False
    #: The identity at inference (Dropout, noise): serving formats leave it out.
    inference_identity = False
    #: A BatchNormalization on the last axis: ``prune_model(fold_batchnorm=True)`` may merge it into a units layer.
    batchnorm = False
    #: It costs multiply-adds per channel on its own (:meth:`channel_flops`: a depthwise convolution).
    per_channel_flops = False
    #: Keyword arguments that take a tensor carrying no units (an attention mask): not read as units, and
    #: computed again from the model's inputs in the pruned model (``ModelGraph.side_tensors``).
    side_arguments = ()

    def __init__(self, cls, description=None, *, slicer=None, constants=_UNSET, refusal=None):
        self.cls = cls
        self.description = description or cls.__name__
        self.slicer = slicer
        if constants is not _UNSET:
            self.constants = constants
        self._refusal = refusal

    def __repr__(self):
        return f"{type(self).__name__}({self.cls.__name__})"

    def refusal(self, layer):
        """Why this configuration of the layer cannot be handled exactly, or ``None``."""
        return self._refusal(layer) if self._refusal is not None else None

    def variant(self, layer):
        """The rule of this configuration of the layer: itself, or another rule of the same class (a grouped
        convolution's)."""
        return self

    def classify(self, layer):
        """``(kind, reason)``: the graph kind of ``layer`` (``"other"`` with a reason when refused)."""
        reason = self.refusal(layer)
        return (Kind.OTHER, reason) if reason else (self.kind, None)

    @property
    def slices(self):
        """It has weights or config per unit, so surgery slices it (not a plain copy)."""
        return self.slicer is not None

    def slice(self, layer, kept):
        """``(config, weights)`` of ``layer`` restricted to the units ``kept`` (int indices)."""
        if self.slicer is None:
            return layer_config(layer), layer.get_weights()
        return self.slicer(layer, np.asarray(kept, dtype=int))

    def pass_constants(self, layer, values, threshold=0.0):
        """Constants ``values`` (NaN: not constant) after ``layer``; NaN where a constant stops being one."""
        how = self.constants
        if how == "identity":
            return values.copy()
        if how == "zero_only":
            return np.where(values == 0, 0.0, np.nan)
        if how is None:
            return np.full_like(values, np.nan)
        if callable(how):
            return np.asarray(how(layer, values, threshold), np.float64)
        if np.all(np.isnan(values)):
            return values.copy()
        out = call_on_constants(layer, np.where(np.isnan(values), 0.0, values))
        return np.where(np.isnan(values), np.nan, out)

    def thresholded_variables(self, layer):
        """The variables ``apply_threshold`` thresholds (none for most layers)."""
        return []

    def checked_weights(self, layer):
        """``{label: numpy}`` of the weights whose finiteness every report checks (thresholded layers)."""
        return {}

    def set_weights(self, layer, weights):
        """Put ``weights`` into a freshly built ``layer``."""
        layer.set_weights(weights)

    def call(self, layer, x, options=None):
        """Call ``layer`` on ``x`` as the model did (``options``: the call's keyword arguments that are not tensors)."""
        return layer(x, **(options or {}))

    def unit_groups(self, layer):
        """Index arrays of channels that are kept or removed together (a GroupNormalization's groups); ``[]``."""
        return []

    def shared_sublayers(self, layer):
        """``{attribute: layer}``: layers this one holds that the model calls elsewhere too (a token table a head
        projects with, tied): surgery gives the new layer the new model's layer there, so the tie holds; ``{}``."""
        return {}

    def channel_flops(self, layer, output_shape):
        """Multiply-adds per sample that each channel costs in this layer on its own (a depthwise convolution's
        window at every output position); 0 for a layer counted as free (normalization, activation, pooling)."""
        return 0

    def serving_config(self, layer):
        """The config a serving export builds the layer from instead, or ``None`` (the layer as it is)."""
        return None


class InputRule(LayerRule):
    """The model's input."""

    kind = Kind.INPUT

def output_shape(layer, out_units):
    """The layer's output shape, ``(None, out_units)`` for a layer inside a model the graph cannot see into. A
    layer called only inside a block traced at probe sizes (:data:`PROBE_SIZES`) has its batch and the axes of
    those sizes unknown again (``None``): they take any size."""
    try:
        shape = tuple(layer.output.shape)
    except Exception:  # noqa: BLE001 - Keras raises several types for a layer with no single output
        return (None, out_units)
    if probe_sized(layer) and shape:
        shape = (None,) + tuple(None if d == PROBE_SIZES[1] else d for d in shape[1:-1]) + shape[-1:]
    return shape


def variable_axes(output_shape):
    """The axes of a units layer's output, between batch and units, whose size is not known (``None``).

    A model built on ``keras.Input((None, 8))`` or ``(None, None, 3)`` takes
    sequences or images of any size: a layer before global pooling then has
    output positions that depend on the input, and its multiply-adds are
    counted per position of those axes (:meth:`UnitsRule.flops`).

    Example:
        >>> variable_axes((None, None, 12, 4)), variable_axes((None, 5, 4)), variable_axes((None, 4))
        ((1,), (), ())
    """
    shape = tuple(output_shape)
    return tuple(axis for axis in range(1, len(shape) - 1) if shape[axis] is None)


def adapted(layer, noun="layer"):
    """Why a LoRA-enabled or quantized layer is refused (its kernel is not the weights it computes with)."""
    if getattr(layer, "lora_enabled", False):
        return f"a LoRA-enabled {noun}"
    if getattr(layer, "quantization_mode", None):
        return f"a quantized {noun}"
    return None


def pads(layer):
    """The layer pads its input with zeros (a constant is not constant at the border).

    A window of size 1 on every axis (a 1x1 convolution) pads nothing,
    whatever its ``padding`` and strides: ``"same"`` pads ``(ceil(n / s) - 1)
    * s + 1 - n <= 0`` entries, ``"causal"`` ``dilation * (1 - 1) = 0``.
    """
    if getattr(layer, "padding", "valid") not in ("same", "causal"):
        return False
    window = getattr(layer, "kernel_size", None)
    return not (window and all(int(k) == 1 for k in window))


#: The sizes that stand for the unknown axes of a block's inputs (batch first, then each other axis) when its call
#: takes a size as a number (:func:`keras_group_lasso.graph.build.fixed_sizes`): small, distinct, and unlike any
#: channel count of a tiny model.
PROBE_SIZES = (2, 7)

_PROBE_SIZED = weakref.WeakKeyDictionary()  # layers called while a block was traced at probe sizes


def mark_probe_sized(layer):
    """Note that ``layer`` was called while a block was traced at probe sizes (see
    :func:`keras_group_lasso.graph.build.fixed_sizes`)."""
    try:
        _PROBE_SIZED[layer] = True
    except TypeError:  # pragma: no cover - not weak-referenceable
        pass


def probe_sized(layer):
    """``layer`` was traced at probe sizes, or called inside a block that was: it is pruned only as part of that
    block built again from its config (an attention layer there keeps its heads whole)."""
    try:
        return layer in _PROBE_SIZED
    except TypeError:  # pragma: no cover - not weak-referenceable
        return False


_OPERATION_CALLS = weakref.WeakKeyDictionary()


def note_operation_call(operation, kwargs):
    """Keep the keyword arguments ``operation`` (a keras.ops operation of a functional graph) was called with."""
    try:
        _OPERATION_CALLS[operation] = dict(kwargs or {})
    except TypeError:  # pragma: no cover - not weak-referenceable
        pass


def operation_call(operation):
    """The keyword arguments (not tensors) a keras.ops operation of the model was called with (``{}``)."""
    return _OPERATION_CALLS.get(operation, {})


def call_without_none(layer, call_layer, args, kwargs):
    """``layer`` called symbolically by ``call_layer`` (its class's ``__call__``) where its call returns ``None``
    among its outputs (KerasHub's ``DeiTEncoderBlock``: ``(y, None)`` without attention scores), which Keras
    records no node for (on PyTorch it cannot even infer the outputs): the node records the tensors alone, and the
    caller gets the structure back with its ``None``s."""
    call, returned = layer.call, []

    def tensors_only(*a, **k):
        returned.append(call(*a, **k))
        return without_none(returned[-1])

    object.__setattr__(layer, "call", tensors_only)  # read by compute_output_spec; not an attribute Keras tracks
    try:
        outputs = call_layer(layer, *args, **kwargs)
    finally:
        object.__delattr__(layer, "call")
    structure = returned[-1] if returned else None  # none: its class infers its outputs without its call
    if not isinstance(structure, (tuple, list)):
        return outputs
    tensors = iter(keras.tree.flatten(outputs))
    return type(structure)(None if x is None else next(tensors) for x in structure)


def call_with_keras_shapes(layer, call_layer, args, kwargs):
    """``layer`` called symbolically by ``call_layer`` (as :func:`call_without_none`) with Keras's own
    ``compute_output_shape``, which runs the layer's ``call`` on symbolic tensors, in place of the layer's:
    KerasHub 0.32's ``SmolLM3Attention`` computes its output shapes from a tuple of input shapes it is not given.
    Raises ``ValueError`` for a layer whose output shapes are Keras's already (nothing else to try)."""
    own = {name for klass in type(layer).__mro__ if klass is not keras.layers.Layer
           and issubclass(klass, keras.layers.Layer) for name in vars(klass)}
    if "compute_output_shape" not in own:
        raise ValueError(f"the output shapes of '{layer.name}' are Keras's already")
    default = types.MethodType(keras.layers.Layer.compute_output_shape, layer)
    object.__setattr__(layer, "compute_output_shape", default)  # read by compute_output_spec; not tracked by Keras
    try:
        return call_without_none(layer, call_layer, args, kwargs)
    finally:
        object.__delattr__(layer, "compute_output_shape")


def without_none(value):
    """A call's outputs less the ``None`` entries of a tuple or list of them (one left: that one)."""
    if not isinstance(value, (tuple, list)) or all(x is not None for x in value):
        return value
    kept = [x for x in value if x is not None]
    return kept[0] if len(kept) == 1 else type(value)(kept)
