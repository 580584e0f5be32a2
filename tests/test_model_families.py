"""Model families beyond plain chains: float64 models, refusals that name the real culprit, MobileNet's head.

Every surgery test compares the pruned model output-for-output with the
thresholded original (a copy: the user's model is never changed).
"""

import contextlib
import re

import keras
import numpy as np
import pytest

from keras_group_lasso import (
    UnsupportedModelError,
    add_group_sparsity,
    apply_threshold,
    prune_model,
    sparsity_report,
)
from keras_group_lasso.graph import registry
from keras_group_lasso.graph.build import model_graph

T = 1e-3
L = keras.layers
BACKEND = keras.backend.backend()


def thresholded_copy(model):
    copy = keras.models.clone_model(model)
    copy.set_weights(model.get_weights())
    apply_threshold(copy, T)
    return copy


def outputs(model, x):
    """Every output of ``model`` on ``x`` (inference mode), float64."""
    return [np.asarray(keras.ops.convert_to_numpy(y), np.float64) for y in keras.tree.flatten(model(x, training=False))]


def assert_same_outputs(small, model, x, rtol):
    """``small`` computes what the thresholded ``model`` computes, to ``rtol`` of the output scale."""
    want = outputs(thresholded_copy(model), x)
    got = outputs(small, x)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.shape == b.shape
        scale = max(1.0, float(np.max(np.abs(b))))
        np.testing.assert_allclose(a, b, rtol=0, atol=rtol * scale)


def weights_of(model):
    return [np.array(w) for w in model.get_weights()]


def assert_untouched(model, before):
    after = model.get_weights()
    assert len(after) == len(before)
    for a, b in zip(after, before):
        np.testing.assert_array_equal(a, b)


# ----------------------------------------------------------------------------- float64


# Off TensorFlow, Keras's type promotion turns float64 into float32 wherever a layer promotes dtypes
# (`keras.backend.result_type("float64", "float32")` is "float32" on JAX and PyTorch: BatchNormalization, tanh on
# JAX): the model itself is then float32-exact only, and a float32 rounding of a value the pruned model computes
# in another order can differ by one float32 ulp.
FLOAT64_EXACT = 1e-10 if BACKEND == "tensorflow" else 1e-5


@contextlib.contextmanager
def float64():
    """Layers built inside are float64 (JAX computes in float64 only with x64 enabled)."""
    floatx = keras.config.floatx()
    keras.config.set_floatx("float64")
    try:
        if BACKEND == "jax":
            import jax

            with jax.enable_x64(True):
                yield
        else:
            yield
    finally:
        keras.config.set_floatx(floatx)


def _constants_everywhere(model, rng):
    """Random weights; in every hidden layer some units read nothing (they output ``act(b)``, b != 0)
    and some input groups are zero; BatchNormalization with random statistics and a non-zero beta."""
    graph = model_graph(model)
    for node in graph.units:
        layer = graph.layers[node.name]
        kernel, bias = layer.get_weights()
        view = registry.kernel_view(rng.normal(size=kernel.shape), node.in_units)
        view[:, rng.random(node.in_units) < 0.25, :] = 0.0
        if not node.is_output:
            view[:, :, : max(1, node.out_units // 3)] = 0.0  # constants act(b), folded into the next bias
        layer.set_weights([view.reshape(kernel.shape), rng.normal(size=bias.shape)])
    for layer in model.layers:
        if type(layer) is L.BatchNormalization:
            shape = layer.moving_mean.shape
            layer.set_weights([rng.uniform(0.5, 1.5, shape), rng.normal(size=shape), rng.normal(size=shape),
                               rng.uniform(0.5, 2.0, shape)])


def _float64_mlp():
    return keras.Sequential([
        keras.Input((6,)), L.Dense(9, activation="tanh"), L.BatchNormalization(), L.Dense(7, activation="sigmoid"),
        L.Dense(5, activation="elu"), L.Dense(3),
    ])


def _float64_cnn():
    return keras.Sequential([
        keras.Input((9, 9, 2)), L.Conv2D(6, 3, activation="sigmoid"), L.BatchNormalization(),
        L.Conv2D(5, 3, activation="tanh"), L.MaxPooling2D(), L.Conv2D(4, 1, activation="softplus"),
        L.GlobalAveragePooling2D(), L.Dense(3),
    ])


@pytest.mark.parametrize("make", [_float64_mlp, _float64_cnn], ids=["mlp", "cnn"])
def test_a_float64_model_with_folded_constants_prunes_exactly_in_float64(make, rng):
    with float64():
        model = make()
        _constants_everywhere(model, rng)
        x = rng.normal(size=(16,) + tuple(model.inputs[0].shape[1:]))
        small = prune_model(model, T)
        folded = small.pruning_plan.masks.folded
        assert sum(int(v.sum()) for v in folded.values()) >= 3  # constants were folded, not kept
        assert model.count_params() > small.count_params()
        assert all(w.dtype == np.float64 for w in small.get_weights())
        assert_same_outputs(small, model, x, rtol=FLOAT64_EXACT)


# ----------------------------------------------------------------------------- refusals that name the culprit

OPERATION = "a keras.ops operation called on a tensor inside the model, not a layer"
BROADCAST = "a merge of tensors of different shapes {} (broadcasting, as the gate of a squeeze-and-excite block does"


@pytest.mark.parametrize("make, gate, shapes", [
    ("MobileNetV3Small", "expanded_conv_squeeze_excite_mul", "(8, 8, 16), (1, 1, 16)"),
    ("MobileNetV3Large", "expanded_conv_3_squeeze_excite_mul", "(4, 4, 72), (1, 1, 72)"),
], ids=["small", "large"])
def test_mobilenet_v3_is_refused_for_its_broadcasting_gate_and_names_its_keras_ops(make, gate, shapes):
    model = getattr(keras.applications, make)(input_shape=(32, 32, 3), weights=None, classes=10,
                                              include_preprocessing=False)
    before = weights_of(model)
    sparse = add_group_sparsity(model, 1e-3)  # the penalties need no surgery: every convolution gets its groups
    for candidate in (model, sparse):
        with pytest.raises(UnsupportedModelError) as info:
            prune_model(candidate, T)
        message = str(info.value)
        assert message.startswith(f"prune_model: cannot prune layer '{gate}' (Multiply): " + BROADCAST.format(shapes))
        assert (info.value.layer_name, info.value.layer_class) == (gate, "Multiply")
        # hard-sigmoid's relu6(x + 3) / 6 is written with keras.ops: named as such, after the layers
        # (the operations' names are unique per session: 'add', 'add_1', ...)
        add = re.search(rf"'(add(_\d+)?)' \(keras\.ops\.Add\): {OPERATION}", message)
        assert add and re.search(rf"'multiply(_\d+)?' \(keras\.ops\.Multiply\): {OPERATION}", message)
        assert message.index(f"'{gate}'") < add.start()
        assert "could not be found" not in message and "(Functional)" not in message
        assert "(GroupSparseModel)" not in message
        report = sparsity_report(candidate, T)
        assert report.uninterpreted_layers[0] == f"{gate} (Multiply)"
        assert f"{add.group(1)} (keras.ops.Add)" in report.uninterpreted_layers
        assert "uninterpreted:     " + f"{gate} (Multiply)" in str(report)
    assert_untouched(model, before)


def _grouped(sequential):
    layers = [L.Conv2D(8, 3, groups=4, name="grouped"), L.GlobalAveragePooling2D(), L.Dense(4, name="head")]
    if sequential:
        return keras.Sequential([keras.Input((8, 8, 8))] + layers)
    x = inp = keras.Input((8, 8, 8))
    for layer in layers:
        x = layer(x)
    return keras.Model(inp, x)


@pytest.mark.parametrize("sequential", [True, False], ids=["sequential", "functional"])
def test_a_grouped_convolution_is_named_by_every_entry_point(sequential):
    model = _grouped(sequential)
    before = weights_of(model)
    with pytest.raises(ValueError) as info:
        add_group_sparsity(model, 1e-3)
    assert str(info.value) == (
        "add_group_sparsity: argument `model` must be a model whose layers that make units can be read (layer "
        "'grouped' (Conv2D) is a grouped convolution (groups > 1); supported: Conv1D, Conv2D, Conv3D, "
        f"SeparableConv1D, SeparableConv2D, Dense); received {model!r}."
    )
    assert "whose graph cannot be read" not in str(info.value)
    with pytest.raises(UnsupportedModelError, match=r"^prune_model: cannot prune layer 'grouped' \(Conv2D\): "
                                                    r"a grouped convolution \(groups > 1\)\. Supported: "):
        prune_model(model, T)
    report = sparsity_report(model, T)
    assert report.uninterpreted_layers == ("grouped (Conv2D)",)
    assert_untouched(model, before)
