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
    prune_model,
    sparsity_report,
)
from keras_group_lasso.groups import GroupView
from keras_group_lasso.graph.build import model_graph
from test_branching import kill_units
from test_cnn import thresholded_outputs

T = 1e-3
L = keras.layers
BACKEND = keras.backend.backend()
# JAX runs these full-size families op by op, 2-4 minutes each on two cores against well under one on TensorFlow
# and PyTorch; it checks the same parts on the smaller models of this file (the squeeze-and-excite net, the
# one-dimensional U-Net) and the families of test_applications.py and test_keras_hub.py that run on it.
NOT_ON_JAX = pytest.mark.skipif(BACKEND == "jax", reason="tested on TensorFlow and PyTorch (time on JAX)")


def outputs(model, x):
    """Every output of ``model`` on ``x`` (inference mode), float64."""
    return [np.asarray(keras.ops.convert_to_numpy(y), np.float64) for y in keras.tree.flatten(model(x, training=False))]


def assert_same_outputs(small, model, x, rtol):
    """``small`` computes what the thresholded ``model`` computes, to ``rtol`` of the output scale."""
    want = thresholded_outputs(model, x, outputs)
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
    floatx, policy = keras.config.floatx(), keras.config.dtype_policy().name
    keras.config.set_floatx("float64")
    keras.config.set_dtype_policy("float64")
    try:
        if BACKEND == "jax":
            import jax

            with jax.enable_x64(True):
                yield
        else:
            yield
    finally:  # the global dtype policy follows floatx once read: put both back
        keras.config.set_floatx(floatx)
        keras.config.set_dtype_policy(policy)


def _constants_everywhere(model, rng):
    """Random weights; in every hidden layer some units read nothing (they output ``act(b)``, b != 0)
    and some input groups are zero; BatchNormalization with random statistics and a non-zero beta."""
    graph = model_graph(model)
    for node in graph.units:
        layer = graph.layers[node.name]
        kernel, bias = layer.get_weights()
        view = GroupView().units(rng.normal(size=kernel.shape), node.in_units)
        dead = rng.random(node.in_units) < 0.25
        dead[rng.integers(node.in_units)] = False  # a path from the input stays
        view[:, dead, :] = 0.0
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


# ----------------------------------------------------------------------------- squeeze-and-excite, keras.ops arithmetic

OPERATION = ("a keras.ops operation called on a tensor inside the model, not a layer, and not one of the operations "
             "surgery knows; write it as the layer that computes it: Activation or Rescaling for a function of each "
             "element, GlobalMaxPooling or GlobalAveragePooling for a max or mean over positions")


# The larger families (MobileNetV3Large, EfficientNetB0, EfficientNetV2B0) are in test_applications.py.
@NOT_ON_JAX
@pytest.mark.parametrize("make", ["MobileNetV3Small"])
def test_squeeze_and_excite_families_prune_exactly_and_reload(make, rng, tmp_path):
    # Gates (1, 1, C) broadcast over (H, W, C) maps; MobileNetV3's hard-sigmoid is relu6(x + 3) * (1 / 6)
    # written with keras.ops; EfficientNet normalizes its input per channel.
    model = getattr(keras.applications, make)(input_shape=(32, 32, 3), weights=None, classes=10,
                                              classifier_activation=None)
    kill_groups(model, rng)
    x = rng.uniform(0, 255, size=(2, 32, 32, 3)).astype("float32")
    small = assert_prunes_exactly_and_reloads(model, x, tmp_path)
    report = small.pruning_report
    assert report.uninterpreted_layers == () and report.params_after < report.params_before
    sparse = add_group_sparsity(model, 1e-3)  # every convolution gets its groups, the gates' too
    assert sparsity_report(sparse, T).uninterpreted_layers == ()


def _se_net(gate="sigmoid"):
    inputs = keras.Input((6, 6, 3))
    x = L.Conv2D(8, 3, padding="same", activation="relu", name="conv")(inputs)
    s = L.GlobalAveragePooling2D(keepdims=True, name="squeeze")(x)
    s = L.Conv2D(4, 1, activation="relu", name="reduce")(s)
    s = L.Conv2D(8, 1, name="expand")(s)
    s = L.Activation(gate, name="gate")(s) if gate == "sigmoid" else L.ReLU(6.0)(s + 3.0) * (1.0 / 6.0)
    x = L.Multiply(name="excite")([x, s])
    x = L.Conv2D(5, 1, name="project")(x)
    return keras.Model(inputs, L.Dense(3, name="out")(L.GlobalAveragePooling2D()(x)))


@pytest.mark.parametrize("gate", ["sigmoid", "hard_sigmoid_ops"])
def test_a_constant_gate_channel_scales_its_channel_and_a_constant_gate_leaves_as_a_rescaling(gate, rng):
    model = _se_net(gate)
    kill_units(model, rng, dead=0.0, constant=0.0, dead_layer=0.0)
    x = rng.normal(size=(4, 6, 6, 3)).astype("float32")
    expand = model.get_layer("expand")
    kernel, bias = expand.get_weights()
    kernel[..., [1, 5]] = 0.0  # gate channels 1 and 5 are sigmoid(b): they scale conv's channels 1 and 5
    expand.set_weights([kernel, bias + 1.0])
    project = model.get_layer("project")
    weights = project.get_weights()
    weights[0][..., 2, :] = 0.0  # channel 2 is read by nobody: it goes from conv, the gate and the product
    project.set_weights(weights)
    reduce = model.get_layer("reduce")
    weights = reduce.get_weights()
    weights[0][..., 2, :] = 0.0  # (the squeeze branch does not read it either)
    reduce.set_weights(weights)
    small = prune_model(model, T)
    assert_same_outputs(small, model, x, rtol=1e-5)
    assert small.get_layer("conv").filters == 7 and small.get_layer("expand").filters == 7
    # The whole gate constant: the product is the map scaled per channel, the squeeze branch goes.
    expand.set_weights([np.zeros_like(kernel), bias])
    small = prune_model(model, T)
    assert_same_outputs(small, model, x, rtol=1e-5)
    names = [layer.name for layer in small.layers]
    assert "reduce" not in names and "expand" not in names and "excite" in names
    assert type(small.get_layer("excite")) is L.Rescaling


def test_keras_ops_arithmetic_with_a_number_is_rebuilt_as_rescaling(rng, tmp_path):
    inputs = keras.Input((5,))
    h = L.Dense(6, name="h")(inputs)
    h = 2.0 - (h + 1.0) * 0.5
    h = L.Activation("tanh")(h / 4.0 - 0.25)
    model = keras.Model(inputs, L.Dense(2, name="out")(h))
    kill_units(model, rng, dead=0.0, constant=0.0, dead_layer=0.0)
    kernel, bias = model.get_layer("h").get_weights()
    kernel[:, 1] = 0.0  # unit 1 is a constant: through the arithmetic, folded into out's bias
    model.get_layer("h").set_weights([kernel, bias])
    kernel, bias = model.get_layer("out").get_weights()
    kernel[4] = 0.0  # unit 4 is read by nobody
    model.get_layer("out").set_weights([kernel, bias])
    x = rng.normal(size=(8, 5)).astype("float32")
    small = assert_prunes_exactly_and_reloads(model, x, tmp_path)
    assert small.get_layer("h").units == 4
    kinds = [type(layer).__name__ for layer in small.layers]
    assert kinds.count("Rescaling") == 5


def test_keras_ops_that_are_not_a_number_and_a_tensor_are_still_refused_by_name():
    inputs = keras.Input((5,))
    h = L.Dense(6, name="h")(inputs)
    model = keras.Model(inputs, L.Dense(2, name="out")(keras.ops.square(h)))
    before = weights_of(model)
    with pytest.raises(UnsupportedModelError) as info:
        prune_model(model, T)
    assert re.match(rf"prune_model: cannot prune layer 'square(_\d+)?' \(keras\.ops\.Square\): {OPERATION}",
                    str(info.value))
    assert_untouched(model, before)


@pytest.mark.parametrize("between", [True, False], ids=["float16-activation", "cast-and-back"])
def test_a_cast_between_float_dtypes_is_an_identity_of_that_dtype_and_prunes_exactly(between, rng, tmp_path):
    """``keras.ops.cast`` from one float dtype to another is an ``Identity`` of the target dtype: it casts what it
    reads as the operation does, constants folded through it too (rounded to float16 on the way)."""
    inputs = keras.Input((5,))
    h = keras.ops.cast(L.Dense(6, activation="relu", name="h")(inputs), "float16")
    if between:
        h = L.Activation("sigmoid", dtype="float16", name="gate")(h)
    model = keras.Model(inputs, L.Dense(2, name="out")(keras.ops.cast(h, "float32")))
    kernel, bias = model.get_layer("h").get_weights()
    kernel[:, 1] = 0.0  # unit 1 outputs relu(b): a constant, folded into out's bias through both casts
    kernel[:, 3] = 0.0
    bias[1], bias[3] = 4.0 / 3.0, 0.0  # not a float16 number: rounded by the cast (by 3e-4); unit 3: zero
    model.get_layer("h").set_weights([kernel, bias])
    x = rng.normal(size=(8, 5)).astype("float32")
    small = assert_prunes_exactly_and_reloads(model, x, tmp_path)
    assert small.get_layer("h").units == 4
    casts = [layer for layer in small.layers if type(layer) is L.Identity]
    assert [layer.dtype_policy.name for layer in casts] == ["float16", "float32"]


def _channels_first(sequential):
    layers = [L.Conv2D(8, 3, data_format="channels_first", name="first"), L.GlobalAveragePooling2D(),
              L.Dense(4, name="head")]
    if sequential:
        return keras.Sequential([keras.Input((8, 8, 8))] + layers)
    x = inp = keras.Input((8, 8, 8))
    for layer in layers:
        x = layer(x)
    return keras.Model(inp, x)


@pytest.mark.parametrize("sequential", [True, False], ids=["sequential", "functional"])
def test_a_refused_convolution_is_named_by_every_entry_point(sequential):
    model = _channels_first(sequential)
    before = weights_of(model)
    with pytest.raises(ValueError) as info:
        add_group_sparsity(model, 1e-3)
    assert str(info.value).startswith(
        "add_group_sparsity: argument `model` must be a model whose layers that make units can be read (layer "
        "'first' (Conv2D) is a convolution with data_format='channels_first'; see 'Supported layers' in the README); "
        "received ")
    assert "whose graph cannot be read" not in str(info.value)
    with pytest.raises(UnsupportedModelError, match=r"^prune_model: cannot prune layer 'first' \(Conv2D\): "
                                                    r"a convolution with data_format='channels_first'\.\n"
                                                    r"The supported layers are listed"):
        prune_model(model, T)
    report = sparsity_report(model, T)
    assert report.uninterpreted_layers == ("first (Conv2D)",)
    assert_untouched(model, before)


# ----------------------------------------------------------------------------- Reshape of size-1 axes


def kill_groups(model, rng):
    """Random group sparsity (``test_branching.kill_units``: dead input groups, units that output ``act(b)``,
    weights below the threshold, random biases and BatchNormalization statistics with a non-zero beta), plus a
    few all-zero DepthwiseConv channels (constants through BatchNormalization)."""
    kill_units(model, rng, dead=0.3, constant=0.2, dead_layer=0.0)
    for layer in model.layers:
        if type(layer) is L.DepthwiseConv2D:
            weights = layer.get_weights()
            weights[0][..., rng.random(weights[0].shape[-2]) < 0.1, :] = 0.0
            layer.set_weights(weights)


def assert_prunes_exactly_and_reloads(model, x, tmp_path):
    before = weights_of(model)
    small = prune_model(model, T)
    assert_untouched(model, before)
    assert small.count_params() < model.count_params()
    assert_same_outputs(small, model, x, rtol=1e-5)
    path = tmp_path / "small.keras"
    small.save(path)
    again = keras.saving.load_model(path)  # plain Keras: no custom objects
    np.testing.assert_allclose(outputs(again, x)[0], outputs(small, x)[0], rtol=0, atol=1e-6)
    return small


@pytest.mark.skipif(BACKEND == "jax", reason="38 s on JAX, the longest leg of the suite; the reshapes are read "
                                              "alike on every backend (TensorFlow and PyTorch run it)")
def test_mobilenet_prunes_exactly_through_the_reshapes_of_its_head(rng, tmp_path):
    # The head: GlobalAveragePooling2D(keepdims=True), Dropout, a 1x1 Conv2D (padding="same"), Reshape((10,)).
    model = keras.applications.MobileNet(input_shape=(32, 32, 3), weights=None, classes=10,
                                         classifier_activation=None)  # logits: the strictest comparison
    kill_groups(model, rng)
    x = rng.normal(size=(4, 32, 32, 3)).astype("float32")
    small = assert_prunes_exactly_and_reloads(model, x, tmp_path)
    report = small.pruning_report
    assert report.uninterpreted_layers == ()
    assert report.params_after < report.params_before
    assert type(small.get_layer("reshape_2")) is L.Reshape
    assert small.get_layer("reshape_2").get_config()["target_shape"] == (10,)


def _reshaping_head(flatten):
    """Conv -> GAP(keepdims) -> Reshape((C,)) or Flatten -> Dense -> Reshape((1, 1, U)) -> 1x1 Conv "same"
    -> Reshape((V,)) -> Dense: units cross every Reshape."""
    inp = keras.Input((7, 7, 3))
    x = L.Conv2D(8, 3, activation="relu", name="features")(inp)
    x = L.BatchNormalization(name="features_bn")(x)
    x = L.GlobalAveragePooling2D(keepdims=True, name="pool")(x)
    x = (L.Flatten(name="flat") if flatten else L.Reshape((8,), name="flat"))(x)
    x = L.Dense(9, activation="tanh", name="squeeze")(x)
    x = L.Reshape((1, 1, 9), name="to_map")(x)
    x = L.Conv2D(7, 1, padding="same", activation="sigmoid", name="expand")(x)
    x = L.BatchNormalization(name="expand_bn")(x)
    x = L.Reshape((7,), name="to_vector")(x)
    return keras.Model(inp, L.Dense(3, name="out")(x))


@pytest.mark.parametrize("flatten", [False, True], ids=["reshape", "flatten"])
def test_units_cross_reshapes_of_size_one_axes_and_the_reshapes_are_sliced(flatten, rng, tmp_path):
    model = _reshaping_head(flatten)
    graph = model_graph(model)
    assert graph.supported and graph.node("expand").positions == 1
    _constants_everywhere(model, rng)  # a third of each hidden layer's units are constants act(b)
    x = rng.normal(size=(8, 7, 7, 3)).astype("float32")
    small = assert_prunes_exactly_and_reloads(model, x, tmp_path)
    masks = small.pruning_plan.masks
    kept = {name: int(masks.units[name].sum()) for name in ("features", "squeeze", "expand")}
    assert kept["squeeze"] < 9 and kept["expand"] < 7
    # constants before the 1x1 "same" convolution are folded into its bias (a 1x1 window pads nothing)
    assert masks.folded["squeeze"].any() and not masks.inputs["expand"][masks.folded["squeeze"]].any()
    assert small.get_layer("to_map").get_config()["target_shape"] == (1, 1, kept["squeeze"])
    assert small.get_layer("to_vector").get_config()["target_shape"] == (kept["expand"],)
    assert small.get_layer("flat").output.shape == (None, kept["features"])
    report = sparsity_report(model, T)
    assert report.layer_sizes == small.pruning_report.layer_sizes
    assert dict(zip(["features", "squeeze", "expand"], report.layer_sizes[1:])) == kept


@pytest.mark.parametrize("target, shape, reason", [
    ((4, 2), (8,), "a Reshape of (None, 8) to (None, 4, 2) (only a Reshape that adds or removes axes of size 1 "
                   "and keeps the last axis, the units, is supported)"),
    ((8, 1), (8,), "a Reshape of (None, 8) to (None, 8, 1) (only a Reshape that adds"),
    ((18,), (3, 3, 2), "a Reshape of (None, 3, 3, 2) to (None, 18) (only a Reshape that adds"),
], ids=["split-units", "units-off-the-last-axis", "merge-positions"])
def test_every_other_reshape_is_still_refused_by_name(target, shape, reason):
    inp = keras.Input(shape)
    x = L.Dense(2, name="first")(inp) if len(shape) == 1 else L.Conv2D(2, 1, name="first")(inp)
    if len(shape) == 1:
        x = L.Dense(8, name="hidden")(x)
    x = L.Reshape(target, name="odd")(x)
    model = keras.Model(inp, L.Dense(3, name="out")(x))
    before = weights_of(model)
    with pytest.raises(UnsupportedModelError) as info:
        prune_model(model, T)
    assert str(info.value).startswith(f"prune_model: cannot prune layer 'odd' (Reshape): {reason}")
    assert "Reshape (adding or removing axes of size 1)" in info.value.supported  # the list of what is supported
    assert sparsity_report(model, T).uninterpreted_layers == ("odd (Reshape)",)
    assert_untouched(model, before)


# ----------------------------------------------------------------------------- transposed convolutions


def _unet(dims=2):
    """A small U-Net: two downsampling stages, a transposed-convolution decoder with skip connections."""
    conv, up = getattr(L, f"Conv{dims}D"), getattr(L, f"Conv{dims}DTranspose")
    pool = getattr(L, f"MaxPooling{dims}D")
    inputs = keras.Input((8,) * dims + (2,))
    a = conv(6, 3, padding="same", activation="relu", name="enc1")(inputs)
    b = conv(8, 3, padding="same", activation="relu", name="enc2")(pool(2)(a))
    b = L.BatchNormalization(name="bn")(b)
    c = conv(10, 3, padding="same", activation="relu", name="mid")(pool(2)(b))
    u = up(7, 3, strides=2, padding="same", activation="relu", name="up1")(c)
    u = L.Concatenate(name="skip1")([u, b])
    u = up(5, 2, strides=2, padding="valid", name="up2")(u)
    u = L.Add(name="skip2")([u, conv(5, 1, name="proj")(a)])
    return keras.Model(inputs, conv(3, 1, name="out")(u))


@pytest.mark.parametrize("dims", [1, pytest.param(2, marks=NOT_ON_JAX), pytest.param(3, marks=NOT_ON_JAX)])
def test_a_unet_with_transposed_convolutions_prunes_exactly_and_reloads(dims, rng, tmp_path):
    model = _unet(dims)
    kill_units(model, rng, dead=0.3, constant=0.25, dead_layer=0.0)
    x = rng.normal(size=(3,) + (8,) * dims + (2,)).astype("float32")
    small = assert_prunes_exactly_and_reloads(model, x, tmp_path)
    assert small.pruning_report.uninterpreted_layers == ()
    sizes = {layer.name: layer.units_alive for layer in small.pruning_report.layers}
    for name in ("up1", "up2"):
        kernel = small.get_layer(name).kernel  # (k..., out, in): out is what the report keeps
        assert int(kernel.shape[-2]) == sizes[name] and small.get_layer(name).filters == sizes[name]
    assert sizes["up1"] < 7


def test_a_transposed_convolution_kernel_is_penalised_along_its_input_axis(rng):
    model = add_group_sparsity(_unet(2), 1e-2)
    up = model.get_layer("up1")
    penalty = up.kernel_regularizer
    assert penalty.axis == -1 and model.get_layer("mid").kernel_regularizer.axis == -2
    assert type(penalty).from_config(penalty.get_config()).axis == -1
    # Input channel i's group is kernel[..., :, i]: zeroing it leaves the other groups' norms as they were.
    kernel = rng.normal(size=tuple(up.kernel.shape)).astype("float32")
    kernel[..., 4] = 0.0
    norms = np.sqrt(np.sum(kernel.reshape(-1, kernel.shape[-1]) ** 2, axis=0))
    size = kernel.size // kernel.shape[-1]
    value = float(keras.ops.convert_to_numpy(penalty(keras.ops.convert_to_tensor(kernel))))
    np.testing.assert_allclose(value, 1e-2 * (np.sqrt(size) * norms.sum() + np.abs(kernel).sum()), rtol=1e-5)
    report = sparsity_report(model)
    assert {layer.name: layer.groups for layer in report.layers}["up1"] == 10


def test_the_proximal_step_zeroes_whole_input_channels_of_a_transposed_convolution(rng):
    from keras_group_lasso import Proximal

    model = add_group_sparsity(keras.Sequential([
        keras.Input((4, 4, 3)), L.Conv2DTranspose(5, 3, strides=2, name="up"), L.Flatten(), L.Dense(2, name="out"),
    ]), 1e-2)
    kernel = rng.normal(size=(3, 3, 5, 3)).astype("float32")  # (k, k, out, in)
    kernel[..., 1] *= 1e-4  # input channel 1: far below the step's threshold lr * factor * sqrt(|g|)
    model.get_layer("up").set_weights([kernel, np.zeros(5, "float32")])
    x = rng.normal(size=(8, 4, 4, 3)).astype("float32")
    y = keras.ops.convert_to_numpy(model(x))  # targets the model already hits: the step is the proximal one
    model.compile(Proximal(keras.optimizers.SGD(0.5)), "mse")
    model.fit(x, y, epochs=1, batch_size=8, verbose=0)
    after = keras.ops.convert_to_numpy(model.get_layer("up").kernel)
    assert np.all(after[..., 1] == 0)  # the whole group kernel[..., :, 1], exactly
    assert np.all(np.any(after[..., [0, 2]] != 0, axis=(0, 1, 2)))
    assert np.all(np.any(after != 0, axis=(0, 1, 3)))  # no output channel was taken as a group
    small = prune_model(model, T)
    assert small.kept_features == tuple(range(small.pruning_report.n_features))  # input channels of a map stay
    assert_same_outputs(small, model, x[:4], rtol=1e-5)


# ----------------------------------------------------------------------------- normalizations that mix units, ConvNeXt


def randomize(model, rng, scale=0.3):
    """Every weight drawn at random (but BatchNormalization's and Normalization's statistics), so that the
    small initial weights of a family (ConvNeXt's 0.02) are not all below the threshold."""
    for layer in model.layers:
        weights = layer.get_weights()
        if weights and type(layer) not in (L.BatchNormalization, L.Normalization):
            layer.set_weights([rng.normal(size=w.shape).astype(w.dtype) * scale for w in weights])


@NOT_ON_JAX
def test_convnext_prunes_exactly_and_reloads(rng, tmp_path):
    # One group per channel convolutions, LayerNormalization, Dense on feature maps, LayerScale (recognized as a
    # per-channel scale), residual `inputs + x` written with keras.ops.
    model = keras.applications.ConvNeXtTiny(input_shape=(32, 32, 3), weights=None, classes=10,
                                            classifier_activation=None)
    randomize(model, rng)
    kill_groups(model, rng)
    x = rng.uniform(0, 255, size=(2, 32, 32, 3)).astype("float32")
    small = assert_prunes_exactly_and_reloads(model, x, tmp_path)
    report = small.pruning_report
    assert report.uninterpreted_layers == ()
    sizes = {layer.name: (layer.units, layer.units_alive) for layer in report.layers}
    # The expansion units between the two pointwise Dense layers go; the stream that LayerNormalization reads stays.
    units, alive = sizes["convnext_tiny_stage_0_block_0_pointwise_conv_1"]
    assert alive < units == 4 * 96
    assert sizes["convnext_tiny_stage_0_block_0_pointwise_conv_2"] == (96, 96)


def _normalized_net(norm):
    inputs = keras.Input((6, 6, 3))
    x = L.Conv2D(8, 3, padding="same", name="conv")(inputs)
    x = norm(x)
    x = L.Dense(12, activation="gelu", name="expand")(x)  # a Dense on a feature map: a 1x1 convolution
    x = L.Dense(8, name="shrink")(x)
    x = L.Conv2D(8, 3, padding="same", groups=8, name="depthwise")(x)  # one group per channel
    x = L.Conv2D(5, 1, name="project")(x)
    return keras.Model(inputs, L.Dense(3, name="out")(L.GlobalAveragePooling2D()(x)))


@pytest.mark.parametrize("norm", [
    lambda: L.LayerNormalization(name="norm"),
    lambda: L.RMSNormalization(name="norm"),
    lambda: L.GroupNormalization(groups=4, name="norm"),
    lambda: L.UnitNormalization(name="norm"),
], ids=["layer", "rms", "group", "unit"])
def test_the_channels_a_normalization_reads_stay_and_the_others_prune_exactly(norm, rng, tmp_path):
    model = _normalized_net(norm())
    randomize(model, rng)
    kill_units(model, rng, dead=0.0, constant=0.0, dead_layer=0.0)
    conv = model.get_layer("conv")
    kernel, bias = conv.get_weights()
    kernel[..., [2, 6]] = 0.0  # constant channels: the normalization still mixes them with the others
    conv.set_weights([kernel, bias])
    expand = model.get_layer("expand")
    kernel, bias = expand.get_weights()
    kernel[:, [1, 4, 7]] = 0.0  # units 1, 4, 7 of expand are constants, folded into shrink's bias
    expand.set_weights([kernel, bias])
    project = model.get_layer("project")
    kernel, bias = project.get_weights()
    kernel[..., 3, :] = 0.0  # nobody reads channel 3 of the depthwise convolution
    project.set_weights([kernel, bias])
    x = rng.normal(size=(4, 6, 6, 3)).astype("float32")
    small = assert_prunes_exactly_and_reloads(model, x, tmp_path)
    assert small.get_layer("conv").filters == 8  # every channel the normalization reads
    assert small.get_layer("expand").units == 9
    assert small.get_layer("shrink").units == 7 and small.get_layer("depthwise").filters == 7
    assert small.get_layer("depthwise").groups == 7
    kept = sparsity_report(model, T).kept_whole
    assert kept == ((f"norm ({type(model.get_layer('norm')).__name__})", 8),)  # the report says what it keeps


@pytest.mark.parametrize("groups", [4, 1, -1])
def test_group_normalization_keeps_or_removes_whole_groups(groups, rng, tmp_path):
    inputs = keras.Input((6, 6, 3))
    x = L.Conv2D(8, 3, padding="same", name="conv")(inputs)
    x = L.GroupNormalization(groups=groups, name="norm")(x)
    x = L.Conv2D(5, 1, activation="relu", name="project")(x)
    model = keras.Model(inputs, L.Dense(3, name="out")(L.GlobalAveragePooling2D()(x)))
    randomize(model, rng)
    conv = model.get_layer("conv")
    kernel, bias = conv.get_weights()
    kernel[..., 3] = 0.0  # a constant channel in a group that stays
    conv.set_weights([kernel, bias])
    project = model.get_layer("project")
    kernel, bias = project.get_weights()
    kernel[..., [0, 1, 2, 5], :] = 0.0  # nobody reads group 0 (channels 0, 1), nor channels 2 and 5
    project.set_weights([kernel, bias])
    x = rng.normal(size=(4, 6, 6, 3)).astype("float32")
    if groups == 1:  # one group read by the others: nothing goes
        small = prune_model(model, T)
        assert_same_outputs(small, model, x, 1e-5)
    else:
        small = assert_prunes_exactly_and_reloads(model, x, tmp_path)
    # Groups of 2: (0, 1) goes; 2 stays with 3, and 5 with 4. One group: all stay. One channel per group: the
    # unread channels 0, 1, 2 and 5 go.
    want = {4: (6, 3), 1: (8, 1), -1: (4, 4)}[groups]  # groups=-1 is one group per channel
    assert (small.get_layer("conv").filters, small.get_layer("norm").groups) == want
    kept = sparsity_report(model, T).kept_whole  # the report says what the groups keep
    assert kept == ((("norm (GroupNormalization)", want[0]),) if groups != -1 else ())


class _ChannelScale(L.Layer):
    def __init__(self, channels, **kwargs):
        super().__init__(**kwargs)
        self.channels = channels

    def build(self, _):
        self.gamma = self.add_weight(shape=(self.channels,), initializer="ones")

    def call(self, x):
        return x * self.gamma

    def get_config(self):
        return dict(super().get_config(), channels=self.channels)


class _DropPath(L.Layer):
    def call(self, x, training=None):
        return x * 0.5 if training else x


class _Shift(L.Layer):
    def build(self, shape):
        self.beta = self.add_weight(shape=(shape[-1],), initializer="ones")

    def call(self, x):
        return x + self.beta  # per channel, but not a scale: not recognized


def test_unregistered_per_channel_scales_and_inference_identities_are_recognized(rng):
    def net(middle):
        inputs = keras.Input((5,))
        h = L.Dense(6, name="h")(inputs)
        return keras.Model(inputs, L.Dense(2, name="out")(middle(h)))

    model = net(lambda h: _DropPath(name="drop")(_ChannelScale(6, name="scale")(h)))
    randomize(model, rng)
    kernel, bias = model.get_layer("out").get_weights()
    kernel[[0, 3]] = 0.0
    model.get_layer("out").set_weights([kernel, bias])
    small = prune_model(model, T)
    assert_same_outputs(small, model, rng.normal(size=(4, 5)).astype("float32"), rtol=1e-5)
    assert small.get_layer("scale").channels == 4 and small.get_layer("h").units == 4
    serving = {layer.name: layer for layer in export_layers(small)}
    assert type(serving["drop"]) is L.Identity  # the identity at inference, served as one
    shifted = net(lambda h: _Shift(name="shift")(h))
    with pytest.raises(UnsupportedModelError, match=r"cannot prune layer 'shift' \(_Shift\): a layer with weights "
                                                     r"of its own \('beta'\), whose math needs a rule"):
        prune_model(shifted, T)
    # Keras's own wrapper of a Dense: the message says the Dense alone computes the same
    wrapped = keras.Sequential([keras.Input((6, 4)), L.TimeDistributed(L.Dense(4), name="td"),
                                L.GlobalAveragePooling1D(), L.Dense(2)])
    with pytest.raises(UnsupportedModelError, match=r"cannot prune layer 'td' \(TimeDistributed\): .*; Keras's "
                       r"Dense acts on the last axis of inputs of any rank: Dense\(n\) in place of "
                       r"TimeDistributed\(Dense\(n\)\) computes the same and is read"):
        prune_model(wrapped, T)


def export_layers(small):
    """The layers a serving export holds (identities at inference become ``Identity``)."""
    from keras_group_lasso.export import _serving_model

    return _serving_model(small).layers


@pytest.mark.quick
def test_the_readme_table_of_supported_layers_is_the_registry():
    import pathlib

    from keras_group_lasso.graph import registry

    text = (pathlib.Path(__file__).parents[1] / "README.md").read_text()
    table = text.split("<!-- BEGIN supported layers -->\n", 1)[1].split("\n<!-- END supported layers -->", 1)[0]
    assert table == registry.supported_markdown(), (
        "README.md's table of supported layers is out of date: paste "
        "keras_group_lasso.graph.registry.supported_markdown() between its markers")
