"""A block traced into the graph, built again as its own class with the widths that surgery left it.

A block written as a ``keras.layers.Layer`` (keras.io's ``TransformerBlock(embed_dim, num_heads, ff_dim)``, a
residual block ``ResidualBlock(filters)``) is seen through: its sublayers are nodes of the graph and are pruned one
by one. The pruned model can hold the block's own class again when its config says the new widths: each integer
argument of the config is tried once with another value to see which dimensions of which weights it sets
(:func:`widths`), the values that give the pruned weights' shapes are solved for, and the block built from that
config must compute what its pruned layers compute (checked on random inputs by the caller); otherwise its
layers stay plain Keras layers.
"""

import contextlib
import dataclasses
import warnings

import keras
import numpy as np

from keras_group_lasso.graph import registry
from keras_group_lasso.graph.build import block_arguments, block_operands, block_outputs

__all__ = ["Rebuilt", "rebuilt_block", "built_block", "same_outputs", "zero_initializers"]


@dataclasses.dataclass(frozen=True)
class Rebuilt:
    """What became of a block: ``layer``, its class built again with ``changed`` (``{argument: (old, new)}``), or
    ``None`` with ``reason`` (its layers stay plain Keras layers)."""

    layer: object
    changed: dict
    reason: str = ""


def rebuilt_block(block, weights, tensors, name, probes=None):
    """A :class:`Rebuilt` for the traced ``block``: its class from its config, the integer arguments changed so
    that its weights have the shapes of ``weights`` (numpy arrays in ``block.weights``' order) when it is called
    on ``tensors`` (its operands in the pruned model), named ``name``, those weights set. ``probes``: a dict that
    keeps what each argument sets for blocks of the same class and config (a network's repeated blocks)."""
    try:
        config = dict(registry.layer_config(block), name=name)
        type(block).from_config(config)  # as Keras loads it: what it cannot load stays plain layers
    except Exception as error:  # noqa: BLE001 - a config that cannot make the block again
        return Rebuilt(None, {}, f"Keras cannot make its class again from its config ({type(error).__name__}: "
                                 "give its constructor **kwargs and a get_config that returns its arguments)")
    targets = [tuple(w.shape) for w in weights]
    shapes = [tuple(x.shape) for x in tensors]
    dtypes = [x.dtype for x in tensors]
    if registry.config_is_read(block) and not _computes_as(block, config):
        return Rebuilt(None, {}, "its class writes no config it can load, and the one read from its attributes "
                                 "makes a block that computes something else")
    # The arguments whose value is a width that changed are tried alone first (a block of ten integer
    # arguments whose feed-forward width changed: one probe, not ten; each probe builds the block); every
    # argument that could set a changed width where that does not give the pruned widths.
    for exact in (True, False):
        changed = widths(block, config, targets, shapes, dtypes, probes, exact=exact)
        if changed is None:
            continue
        new = built_block(block, dict(config, **{key: value for key, (_, value) in changed.items()}), shapes, dtypes)
        if new is not None and [tuple(w.shape) for w in new.weights] == targets:
            break
    else:
        return Rebuilt(None, {}, "no integer argument of its config gives the pruned widths")
    new.set_weights(weights)
    registry.keep_config(new, dict(config, **{key: value for key, (_, value) in changed.items()}))
    return Rebuilt(new, changed)


def widths(block, config, targets, shapes, dtypes, probes=None, exact=False):
    """``{argument: (old, new)}``: the integer arguments of ``config`` to change so that the block's weights have
    the shapes ``targets`` on inputs of ``shapes``, or ``None`` where no such change is found.

    Each argument ``k`` of value ``v`` is probed once: the block built with ``2 v`` (on inputs whose channels
    equal ``v`` widened alike, for an argument the input's width must match) tells which dimensions it sets and
    by how much per step; a dimension set by one argument alone gives that argument's new value. The others
    follow the inputs' widths, or nothing: the caller builds the block on the new inputs and compares. With
    ``exact``, only the arguments whose value is a changed width are probed (``None`` where there is none).
    """
    base = [tuple(w.shape) for w in block.weights]
    original = [tuple(x.shape) for x in block_operands(block)]
    changed = {}
    if targets == base and shapes == original:
        return changed
    # an argument can set a changed dimension only as a multiple or a part of it (not a kernel size of 3 among
    # widths of 16 and 32): the others stay as they are, unprobed
    changed_dims = {a for old, new in zip(base + original, targets + shapes, strict=True)
                    for a, b in zip(old, new, strict=True) if a != b and a}
    keys = [key for key, value in config.items()
            if not isinstance(value, bool) and isinstance(value, int) and value > 1
            and any(d % value == 0 or value % d == 0 for d in changed_dims)]
    if exact:
        keys = [key for key in keys if config[key] in changed_dims]
        if not keys:
            return None
    same = (type(block), repr(sorted((k, v) for k, v in config.items() if k != "name")), tuple(original))
    probes = {} if probes is None else probes
    slopes = {}
    for key in keys:
        if (same, key) not in probes:
            probes[same, key] = _slopes(block, config, key, base, original, dtypes)
        for at, slope in probes[same, key].items():
            slopes.setdefault(at, {})[key] = slope
    solved = {}
    for (i, axis), found in slopes.items():
        if len(found) != 1:
            continue
        (key, slope), = found.items()
        step = (targets[i][axis] - base[i][axis]) / slope
        value = config[key] + step
        if abs(value - round(value)) > 1e-9 or round(value) < 1 or solved.get(key, round(value)) != round(value):
            return None
        solved[key] = round(value)
    # a dimension no argument sets follows the inputs (a Dense's rows): the block built on the new inputs says
    return {key: (config[key], value) for key, value in solved.items() if value != config[key]}


def _computes_as(block, config, seed=0):
    """A block of ``block``'s class made from ``config``, holding ``block``'s weights, computes what ``block``
    computes (random operands of the shapes it was traced on, to 1e-5 of the output's scale; both called eagerly,
    so ``block`` gains no node)."""
    operands = block_operands(block)
    copy = built_block(block, config, [tuple(x.shape) for x in operands], [x.dtype for x in operands])
    if copy is None or len(copy.weights) != len(block.weights):
        return False
    try:
        copy.set_weights([keras.ops.convert_to_numpy(v) for v in block.weights])
    except ValueError:
        return False
    rng = np.random.default_rng(seed)
    values = [keras.ops.convert_to_tensor(random_values(tuple(x.shape), x.dtype, rng)) for x in operands]
    args, kwargs = block_arguments(block, values)
    return _close(keras.tree.flatten(block(*args, **kwargs)), keras.tree.flatten(copy(*args, **kwargs)))


def _close(want, got):
    if len(want) != len(got):
        return False
    for a, b in zip(want, got, strict=True):
        a, b = keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b)
        if a.shape != b.shape:
            return False
        scale = max(1.0, float(np.max(np.abs(a))) if a.size else 1.0)
        if not np.allclose(a, b, rtol=0.0, atol=1e-5 * scale):
            return False
    return True


def same_outputs(reference, block, new, tensors, seed=0):
    """Whether ``new`` (built again from the traced ``block``) computes what the model ``reference`` (the pruned
    layers it stands for, from the same operands) computes, on random operands shaped as ``tensors`` (to 1e-5 of
    the output's scale, inference mode). With ``block`` ``None``: whether the model ``new`` computes what the model
    ``reference`` computes, on random inputs of ``reference``'s."""
    rng = np.random.default_rng(seed)
    try:
        if block is None:
            inputs = reference.inputs[0] if isinstance(reference, keras.Sequential) else reference.input
            values = keras.tree.map_structure(lambda x: random_values(tuple(x.shape), x.dtype, rng), inputs)
            want = keras.tree.flatten(reference(values, training=False))
            got = keras.tree.flatten(new(values, training=False))
        else:
            values = [random_values(tuple(x.shape), x.dtype, rng) for x in tensors]
            want = keras.tree.flatten(reference(values if len(values) > 1 else values[0], training=False))
            args, kwargs = block_arguments(block, [keras.ops.convert_to_tensor(v) for v in values])
            got = block_outputs(block, new(*args, **kwargs))  # called outside fit: inference, as the reference
    except Exception:  # noqa: BLE001 - what does not run does not stand in for the layers
        return False
    return _close(want, got)


def _slopes(block, config, key, base, original, dtypes):
    """``{(weight, axis): change of that dimension per unit of argument ``key``}``, from one probe (see
    :func:`widths`)."""
    value = config[key]
    probe = dict(config, **{key: 2 * value})  # doubled: what divides it still does (heads by key-value heads, a
    # width halved by its class, as Gemma's feed-forward is)
    built = built_block(block, probe, original, dtypes)
    if built is None:  # an argument the input's width must equal (a residual block's channels)
        built = built_block(block, probe, [_widened(s, value) for s in original], dtypes)
    if built is None or len(built.weights) != len(base):
        return {}
    slopes = {}
    for i, (old, new) in enumerate(zip(base, [tuple(w.shape) for w in built.weights], strict=True)):
        if len(old) == len(new):
            slopes.update({(i, axis): (b - a) / value for axis, (a, b) in enumerate(zip(old, new, strict=True))
                           if a != b})
    return slopes


def _widened(shape, value):
    return shape[:-1] + (2 * value,) if shape and shape[-1] == value else shape


def built_block(block, config, shapes, dtypes):
    """A layer of ``block``'s class from ``config``, called as the graph calls ``block`` on inputs of ``shapes``
    (its variables zeros); ``None`` where that fails."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a probe that does not fit together may say so before it fails
            layer = type(block).from_config(config)
            inputs = [keras.Input(batch_shape=shape, dtype=dtype) for shape, dtype in zip(shapes, dtypes, strict=True)]
            args, kwargs = block_arguments(block, inputs)
            with zero_initializers(layer):
                layer(*args, **kwargs)
    except Exception:  # noqa: BLE001 - a config the class refuses, or widths that do not fit together
        return None
    return layer


@contextlib.contextmanager
def zero_initializers(layer):
    """Build ``layer`` (and the sublayers it holds or makes) with variables of zeros inside this context, its
    initializers put back after: its weights are set right after, so a random draw is wasted work (on JAX a
    compilation per shape)."""
    saved, stack, seen = [], [layer], set()
    while stack:
        found = stack.pop()
        if id(found) in seen:
            continue
        seen.add(id(found))
        for key, value in list(vars(found).items()):
            if key.endswith("_initializer") and isinstance(value, keras.initializers.Initializer):
                saved.append((found, key, value))
            elif isinstance(value, keras.layers.Layer):
                stack.append(value)
            elif isinstance(value, (list, tuple)):
                stack.extend(item for item in value if isinstance(item, keras.layers.Layer))
    zeros = keras.initializers.Zeros()
    try:
        for found, key, _ in saved:
            object.__setattr__(found, key, zeros)
        yield layer
    finally:
        for found, key, value in saved:
            object.__setattr__(found, key, value)


def random_values(shape, dtype, rng):
    """Random operands of ``shape`` (``None``: 2 for the batch, 3 elsewhere): N(0, 1) floats, integers in {0, 1},
    booleans all True (a mask)."""
    shape = tuple(2 if i == 0 and s is None else (3 if s is None else s) for i, s in enumerate(shape))
    dtype = keras.backend.standardize_dtype(dtype)
    if dtype == "bool":
        return np.ones(shape, dtype=bool)
    if "int" in dtype:
        return rng.integers(0, 2, size=shape).astype(dtype)
    return rng.normal(size=shape).astype(dtype)
