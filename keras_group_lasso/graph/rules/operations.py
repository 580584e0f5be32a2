"""keras.ops operations in a functional graph: each becomes a layer the rules know, or one recognized by
what it computes."""


import keras
import numpy as np

from keras_group_lasso.graph.rules.base import note_operation_call
from keras_group_lasso.graph.rules.shape import channel_slice

# ----------------------------------------------------------------------------- keras.ops operations

_SCALAR_OPERATIONS = {}


def _scalar_operations():
    """``{operation class: name}`` of the keras.ops arithmetic a Rescaling can stand for (found once, symbolically)."""
    if not _SCALAR_OPERATIONS:
        x = keras.Input((1,))
        for name, function in (("add", keras.ops.add), ("subtract", keras.ops.subtract),
                               ("multiply", keras.ops.multiply), ("divide", keras.ops.true_divide)):
            _SCALAR_OPERATIONS[type(keras.Model(x, function(x, 2.0)).operations[-1])] = name
    return _SCALAR_OPERATIONS


# The keras.ops activations an ``Activation`` layer computes alike: the op's class name, the activation's name.
_UNARY_ACTIVATIONS = {
    "Relu": "relu", "Relu6": "relu6", "Sigmoid": "sigmoid", "Tanh": "tanh", "Silu": "silu",
    "HardSigmoid": "hard_sigmoid", "HardSilu": "hard_silu", "Softplus": "softplus", "Softsign": "softsign",
    "Mish": "mish", "Selu": "selu", "Exp": "exponential",
}
_GLOBAL_POOLS = {3: "GlobalAveragePooling1D", 4: "GlobalAveragePooling2D", 5: "GlobalAveragePooling3D"}


def operation_name(operation):
    """The class name of a keras.ops operation of Keras itself (``"Split"``), else ``None``."""
    cls = type(operation)
    return cls.__name__ if cls.__module__.startswith("keras.") else None



def _tensor_arguments(inbound_nodes):
    """``(args, kwargs, shape, dtype)`` of an operation's one call on one tensor (its first argument), or ``None``."""
    if not inbound_nodes or len(inbound_nodes) != 1 or not isinstance(inbound_nodes[0], dict):
        return None
    args, kwargs = inbound_nodes[0].get("args", []), inbound_nodes[0].get("kwargs", {})
    if len(args) != 1 or not (isinstance(args[0], dict) and args[0].get("class_name") == "__keras_tensor__"):
        return None
    config = args[0]["config"]
    return args, kwargs, tuple(config["shape"]), config.get("dtype")


def _one_tensor_layer(operation, inbound_nodes):
    """The layer for a keras.ops call on one tensor: an activation (``ops.sigmoid(x)``), a mean over every
    position (``ops.mean(x, axis=(1, 2), keepdims=True)``, squeeze-and-excitation's pooling), or a cast from one
    float dtype to another (``ops.cast(x, "float32")``)."""
    name = operation_name(operation)
    called = _tensor_arguments(inbound_nodes)
    if name is None or called is None:
        return None
    _, kwargs, shape, dtype = called
    if kwargs:
        return None
    if name in _UNARY_ACTIVATIONS:
        layer = keras.layers.Activation(_UNARY_ACTIVATIONS[name], name=operation.name, dtype=dtype)
    elif name == "Gelu":
        approximate = getattr(operation, "approximate", None)
        layer = keras.layers.Activation("gelu" if approximate is False else gelu_approximate, name=operation.name,
                                        dtype=dtype)
    elif name == "Cast" and "float" in str(dtype) and "float" in str(getattr(operation, "dtype", "")):
        # ``ops.cast`` between float dtypes (an activation computed in float32 inside a float16 model): an
        # Identity of the target dtype, which casts what it reads element by element, as the operation does.
        layer = keras.layers.Identity(name=operation.name, dtype=keras.backend.standardize_dtype(operation.dtype))
    elif name == "Mean" and len(shape) in _GLOBAL_POOLS and operation.axis is not None:
        axes = sorted(a % len(shape) for a in operation.axis)
        if axes != list(range(1, len(shape) - 1)):
            return None
        layer = getattr(keras.layers, _GLOBAL_POOLS[len(shape)])(keepdims=bool(operation.keepdims),
                                                                 name=operation.name, dtype=dtype)
    else:
        return None
    layer(keras.KerasTensor(shape, dtype=dtype))
    return layer


@keras.saving.register_keras_serializable(package="keras_group_lasso", name="gelu_approximate")
def gelu_approximate(x):
    """``keras.ops.gelu(x, approximate=True)`` as an activation (Gemma's feed-forward computes it): the layer that
    stands for that operation. A model holding it loads once ``keras_group_lasso`` is imported; a KerasHub block
    that computes it is built again as itself, so the pruned block does not hold it."""
    return keras.activations.gelu(x, approximate=True)


def _scalar(argument):
    """A call argument that is one number: a Python int or float, or a constant array of no axes (``ops.sqrt(16)``
    cast to the input's dtype); else ``None``."""
    if isinstance(argument, bool):
        return None
    if isinstance(argument, (int, float)):
        return float(argument)
    if (isinstance(argument, dict) and argument.get("class_name") in ("__tensor__", "__numpy__")
            and np.asarray(argument["config"]["value"]).ndim == 0):
        return float(np.asarray(argument["config"]["value"]))
    return None


def is_constant_value(argument):
    """A serialized call argument is a constant array (``__tensor__`` or ``__numpy__``, of at least one axis)."""
    return (isinstance(argument, dict) and argument.get("class_name") in ("__tensor__", "__numpy__")
            and np.asarray(argument["config"]["value"]).ndim >= 1)


def constant_array(argument):
    """The numpy value of a serialized constant array (:func:`is_constant_value`), in its dtype where numpy has it."""
    config = argument["config"]
    try:
        return np.asarray(config["value"], dtype=config.get("dtype"))
    except TypeError:  # a dtype numpy does not know (bfloat16): the values as they are
        return np.asarray(config["value"])


def _operand_shape(argument):
    """``(shape, dtype)`` of a serialized tensor argument (a symbolic tensor or a constant array), else ``None``."""
    if isinstance(argument, dict) and argument.get("class_name") == "__keras_tensor__":
        return tuple(argument["config"]["shape"]), argument["config"].get("dtype")
    if is_constant_value(argument):
        return tuple(np.asarray(argument["config"]["value"]).shape), argument["config"].get("dtype")
    return None


# keras.ops operations whose result depends on their operand's shape only, not on its values.
_SHAPE_ONLY = ("ZerosLike", "OnesLike")


def reads_no_values(operation):
    """A keras.ops operation whose result depends on its operand's shape only (``zeros_like``, ``ones_like``):
    with that shape known, a constant whatever the input."""
    return operation_name(operation) in _SHAPE_ONLY


def operation_layer(operation, inbound_nodes):
    """The Keras layer that computes what a keras.ops arithmetic operation computes, or ``None``.

    Of two tensors, ``x + y``, ``x - y``, ``x * y``: ``Add``, ``Subtract``,
    ``Multiply`` (one may be a constant array, such as positions computed when
    the model was built: a :class:`ConstantValue` of the graph; an operand
    with fewer axes takes leading axes of size 1, as keras.ops broadcasts
    it). Of one tensor and one number, a ``Rescaling``:

    ``x + c``, ``c + x``: ``Rescaling(1, c)``; ``x - c``: ``(1, -c)``; ``c -
    x``: ``(-1, c)``; ``x * c``, ``c * x``: ``(c, 0)``; ``x / c``: ``(1 / c,
    0)`` (the one that rounds differently, by at most one unit in the last
    place). ``inbound_nodes`` is the operation's entry in the functional
    config (its call arguments). The layer is called on a symbolic tensor of
    the operation's input shape, so it has an input like any layer of the model.
    """
    if operation is None:
        return None
    if inbound_nodes and len(inbound_nodes) == 1 and isinstance(inbound_nodes[0], dict):
        note_operation_call(operation, inbound_nodes[0].get("kwargs"))
    layer = _one_tensor_layer(operation, inbound_nodes)
    if layer is not None:
        return layer
    if operation_name(operation) == "GetItem" and inbound_nodes and len(inbound_nodes) == 1:
        args = inbound_nodes[0].get("args", [])
        shape = _operand_shape(args[0]) if len(args) == 2 else None
        return channel_slice(operation.name, args[1], shape[0]) if shape is not None else None
    name = _scalar_operations().get(type(operation))
    if name is None or not inbound_nodes or len(inbound_nodes) != 1:
        return None
    args, kwargs = inbound_nodes[0].get("args", []), inbound_nodes[0].get("kwargs", {})
    tensors = [isinstance(a, dict) and a.get("class_name") == "__keras_tensor__" for a in args]
    if kwargs or len(args) != 2 or not any(tensors):
        return None
    shapes = [_operand_shape(a) for a in args]
    if all(shape is not None for shape in shapes):
        # Two tensors (``inputs + x``, a residual connection; or positions, a constant, added to the input's
        # path): the merge layer, on the operands' shapes with leading axes of size 1 where one has fewer (as
        # keras.ops broadcasts), so that it merges channel by channel as the operation does.
        merge = {"add": keras.layers.Add, "subtract": keras.layers.Subtract, "multiply": keras.layers.Multiply}.get(name)
        if merge is None:
            return None
        rank = max(len(shape) for shape, _ in shapes)
        layer = merge(name=operation.name, dtype=args[tensors.index(True)]["config"].get("dtype"))
        layer([keras.KerasTensor((1,) * (rank - len(shape)) + shape, dtype=dtype) for shape, dtype in shapes])
        return layer
    first = tensors[0]
    tensor, number = (args[0], args[1]) if first else (args[1], args[0])
    dtype = tensor["config"].get("dtype")
    number = _scalar(number)
    if number is None or "float" not in str(dtype):
        return None
    if name == "add":
        scale, offset = 1.0, number
    elif name == "subtract":
        scale, offset = (1.0, -number) if first else (-1.0, number)
    elif name == "multiply":
        scale, offset = number, 0.0
    elif first and number != 0:
        scale, offset = 1.0 / number, 0.0
    else:
        return None
    layer = keras.layers.Rescaling(scale=scale, offset=offset, name=operation.name, dtype=dtype)
    layer(keras.KerasTensor(tuple(tensor["config"]["shape"]), dtype=dtype))
    return layer


