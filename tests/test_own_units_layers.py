"""A layer of one's own that makes units from kernels of its own, declared with ``register_layer(cls, "units", ...)``.

``GatedDense`` computes ``(x W + b) * sigmoid(x G)``: two kernels ``(inputs, units)`` and a bias, its math written
with ``keras.ops``. Declared by its kernels and its width, it gets a group penalty on every kernel, is counted by
the report and the budget, and is pruned to a narrower ``GatedDense`` with the same outputs as the thresholded
model, over random architectures.
"""

import warnings

import keras
import numpy as np
import pytest
from test_model_families import T, assert_same_outputs, outputs
from test_never_a_silent_half import GatedDense as Unregularizable  # the same math, no regularizer arguments

from keras_group_lasso import (
    HiddenGroupLasso,
    InputGroupLasso,
    InvalidParameterError,
    Proximal,
    SparsityBudget,
    UnsupportedModelError,
    add_group_sparsity,
    apply_threshold,
    prune_model,
    sparsity_report,
)
from keras_group_lasso.graph import register_layer, registry, unregister_layer

L = keras.layers
ops = keras.ops


@keras.saving.register_keras_serializable("test_own_units_layers")
class GatedDense(L.Layer):
    """``(x W + b) * sigmoid(x G)``, written as keras.io writes a layer with weights."""

    def __init__(self, units, kernel_regularizer=None, gate_regularizer=None, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.kernel_regularizer = keras.regularizers.get(kernel_regularizer)
        self.gate_regularizer = keras.regularizers.get(gate_regularizer)

    def build(self, input_shape):
        self.kernel = self.add_weight(shape=(input_shape[-1], self.units), name="kernel",
                                      regularizer=self.kernel_regularizer)
        self.gate = self.add_weight(shape=(input_shape[-1], self.units), name="gate",
                                    regularizer=self.gate_regularizer)
        self.bias = self.add_weight(shape=(self.units,), name="bias", initializer="random_normal")

    def call(self, x):
        return (ops.matmul(x, self.kernel) + self.bias) * ops.sigmoid(ops.matmul(x, self.gate))

    def get_config(self):
        return dict(super().get_config(), units=self.units,
                    kernel_regularizer=keras.regularizers.serialize(self.kernel_regularizer),
                    gate_regularizer=keras.regularizers.serialize(self.gate_regularizer))


@keras.saving.register_keras_serializable("test_own_units_layers")
class GatedConv2D(L.Layer):
    """``conv(x, K) * sigmoid(conv(x, G)) + b``: kernels ``(3, 3, inputs, filters)``, ``padding="same"``."""

    def __init__(self, filters, kernel_regularizer=None, gate_regularizer=None, **kwargs):
        super().__init__(**kwargs)
        self.filters = filters
        self.kernel_regularizer = keras.regularizers.get(kernel_regularizer)
        self.gate_regularizer = keras.regularizers.get(gate_regularizer)

    def build(self, input_shape):
        shape = (3, 3, input_shape[-1], self.filters)
        self.kernel = self.add_weight(shape=shape, name="kernel", regularizer=self.kernel_regularizer)
        self.gate = self.add_weight(shape=shape, name="gate", regularizer=self.gate_regularizer)
        self.bias = self.add_weight(shape=(self.filters,), name="bias", initializer="random_normal")

    def call(self, x):
        gate = ops.sigmoid(ops.conv(x, self.gate, padding="same"))
        return ops.conv(x, self.kernel, padding="same") * gate + self.bias

    def get_config(self):
        return dict(super().get_config(), filters=self.filters,
                    kernel_regularizer=keras.regularizers.serialize(self.kernel_regularizer),
                    gate_regularizer=keras.regularizers.serialize(self.gate_regularizer))


class ScaledGatedDense(GatedDense):
    """A weight the declaration does not name (``scale``): refused, with that weight's name."""

    def build(self, input_shape):
        super().build(input_shape)
        self.scale = self.add_weight(shape=(), name="scale", initializer="ones")

    def call(self, x):
        return super().call(x) * self.scale


@keras.saving.register_keras_serializable("test_own_units_layers")
class SoftmaxDense(GatedDense):
    """``softmax(x W)`` over its units: declared as units, which it is not (a unit's output reads every column)."""

    def call(self, x):
        return ops.softmax(ops.matmul(x, self.kernel) + self.gate[0] * 0.0 + self.bias)


@pytest.fixture(autouse=True)
def declared():
    rules = [register_layer(GatedDense, "units", kernels=("kernel", "gate"), width="units", biases="bias"),
             register_layer(Unregularizable, "units", kernels=["kernel", "gate"], width="units"),
             register_layer(ScaledGatedDense, "units", kernels={"kernel": "kernel_regularizer",
                                                               "gate": "gate_regularizer"},
                            width="units", biases=["bias"]),
             register_layer(SoftmaxDense, "units", kernels=("kernel", "gate"), width="units", biases="bias"),
             register_layer(GatedConv2D, "units", kernels=("kernel", "gate"), width="filters", biases="bias")]
    yield rules
    for rule in rules:
        unregister_layer(rule.cls)


def _random_model(rng, sequence):
    """Input -> a chain of GatedDense and Dense layers of random widths (a GatedDense's output added back into
    the stream now and then) -> Dense; on a sequence, pooled before the output."""
    features = int(rng.integers(3, 7))
    inputs = keras.Input((5, features) if sequence else (features,))
    x = inputs
    for i in range(int(rng.integers(2, 4))):
        units = int(rng.integers(3, 9))
        if rng.random() < 0.7:
            y = GatedDense(units, name=f"gated{i}")(x)
        else:
            y = L.Dense(units, activation="tanh", name=f"dense{i}")(x)
        if rng.random() < 0.3 and x.shape[-1] == units:
            y = L.Add(name=f"add{i}")([x, y])
        x = y
    if sequence:
        x = L.GlobalAveragePooling1D(name="pool")(x)
    return keras.Model(inputs, L.Dense(2, name="out")(x))


def _sparsify(model, rng):
    """Zero random input rows of every kernel (of all of a GatedDense's kernels, or of one), random units'
    columns, and some weights to just under the threshold."""
    for layer in model.layers:
        if not layer.weights or isinstance(layer, L.InputLayer):
            continue
        weights = layer.get_weights()
        kernels = [w for w in weights if w.ndim >= 2]
        if not kernels:
            continue
        rows, columns = kernels[0].shape[-2:]
        dead_rows = rng.random(rows) < 0.35
        dead_columns = rng.random(columns) < 0.2
        for k, kernel in enumerate(kernels):
            kernel[..., dead_rows if k == 0 or rng.random() < 0.7 else np.zeros(rows, bool), :] = 0.0
            kernel[..., dead_columns] = 0.0
            kernel[rng.random(kernel.shape) < 0.1] = 0.5 * T
        layer.set_weights(weights)


@pytest.mark.parametrize("sequence", [False, True])
@pytest.mark.parametrize("seed", [pytest.param(0, marks=pytest.mark.quick), 1, 2, 3]
                         [:2 if keras.backend.backend() == "jax" else 4])  # JAX compiles each shape op by op
def test_random_models_holding_gated_dense_prune_exactly_and_reload(seed, sequence, tmp_path):
    rng = np.random.default_rng(seed + 10 * sequence)
    keras.utils.set_random_seed(seed)
    model = _random_model(rng, sequence)
    _sparsify(model, rng)
    x = rng.normal(size=(8,) + tuple(model.input.shape[1:])).astype("float32")
    small = prune_model(model, T)
    assert_same_outputs(small, model, x, rtol=1e-5)
    report = sparsity_report(model, T)
    for row in report.layers:
        if row.kind == "GatedDense":
            assert type(small.get_layer(row.name)) is GatedDense
            assert small.get_layer(row.name).units == row.units_alive
            assert small.get_layer(row.name).kernel.shape == small.get_layer(row.name).gate.shape
    assert small.count_params() <= model.count_params()
    path = tmp_path / "small.keras"
    small.save(path)
    again = keras.saving.load_model(path)
    np.testing.assert_allclose(outputs(again, x)[0], outputs(small, x)[0], rtol=0, atol=1e-6)


def _chain(layer_class=GatedDense, width=8):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6,))
    hidden = layer_class(width, name="gated")(inputs)
    return keras.Model(inputs, L.Dense(1, name="out")(hidden))


@pytest.mark.quick
def test_every_kernel_gets_its_group_penalty_and_the_report_counts_them():
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # every kernel penalised: no word said
        model = add_group_sparsity(_chain(), 1e-3)
    gated = model.get_layer("gated")
    assert type(gated.kernel.regularizer) is InputGroupLasso and type(gated.gate.regularizer) is InputGroupLasso
    assert gated.bias.regularizer is None
    assert type(model.get_layer("out").kernel.regularizer) is HiddenGroupLasso
    kernel, gate, bias = gated.get_weights()
    kernel[[1, 4]] = 0.0
    gate[[1, 4]] = 0.0
    gate[0] = 0.0  # row 0 still reaches through the kernel: the feature stays
    gated.set_weights([kernel, gate, bias])
    out_kernel, out_bias = model.get_layer("out").get_weights()
    out_kernel[[2, 3, 7]] = 0.0
    model.get_layer("out").set_weights([out_kernel, out_bias])
    report = sparsity_report(model, T)
    row = report.layers[0]
    zero = int(np.sum(np.abs(kernel) <= T) + np.sum(np.abs(gate) <= T))  # >= 40: rows 1, 4 of both, row 0 of gate
    assert (row.name, row.kind, row.weights, row.zero_weights) == ("gated", "GatedDense", 96, zero) and zero >= 40
    assert (row.groups, row.groups_alive, row.units, row.units_alive) == (6, 4, 8, 5)
    assert report.n_selected_features == 4
    # two kernels (6, 8) and a bias (8,), then out (8, 1) + (1,): before; 4 rows and 5 units kept: after
    assert (report.params_before, report.params_after) == (2 * 48 + 8 + 9, 2 * 20 + 5 + 6)
    assert (report.flops_before, report.flops_after) == (2 * 48 + 8, 2 * 20 + 5)
    small = prune_model(model, T)
    # the model's input stays whole; a selection before 4 of 6 rows would cost more than it saves (4 * (6 + 5) > 30)
    assert small.get_layer("gated").units == 5 and small.get_layer("gated").kernel.shape == (6, 5)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(small.get_layer("gated").gate)[[1, 4]], 0.0)


def test_a_budget_steers_a_model_of_gated_dense_layers_and_prunes_it_exactly():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 6)).astype("float32")
    y = x[:, :2].sum(axis=1, keepdims=True)
    model = add_group_sparsity(_chain(width=16), 1e-3)
    model.compile(Proximal(keras.optimizers.Adam(1e-2)), "mse")
    model.fit(x, y, epochs=6, batch_size=64, verbose=0, callbacks=[SparsityBudget(max_flops=0.5)])
    report = sparsity_report(model, T)
    assert 0.8 * 0.5 <= report.flops_after / report.flops_before <= 0.5
    small = prune_model(model, T)
    apply_threshold(model, T)
    np.testing.assert_allclose(outputs(small, x[:32])[0], outputs(model, x[:32])[0], rtol=0, atol=1e-5)
    assert small.get_layer("gated").units < 16


def test_a_declared_layer_that_cannot_take_penalties_or_holds_other_weights_is_named_before_training():
    with pytest.raises(InvalidParameterError) as info:
        add_group_sparsity(_chain(Unregularizable), 1e-3)
    assert ("layer 'gated' (GatedDense) is a layer whose config has no 'kernel_regularizer', "
            "'gate_regularizer' (the width and the kernels' regularizer arguments named in register_layer)"
            in str(info.value))
    model = _chain(ScaledGatedDense)
    with pytest.raises(UnsupportedModelError) as info:
        prune_model(model, T)
    assert info.value.layer_name == "gated" and info.value.layer_class == "ScaledGatedDense"
    assert "a layer holding weights that register_layer does not name: 'scale'" in str(info.value)


@pytest.mark.parametrize("kwargs, message", [
    ({"width": "units"}, 'argument `kernels` must be with kind="units", the attribute names of its kernels (a str, '
                         "a list of str, or a dict of attribute to regularizer config key); received None."),
    ({"kernels": ("kernel",), "width": 3}, 'argument `width` must be with kind="units", the config key of its '
                                           "number of units (a str); received 3."),
    ({"kernels": ("gate", "kernel"), "width": "units"}, "argument `kernels` must be kernel attributes other than "
                                                        "'bias' (a bias goes in `biases`), one named 'kernel' given "
                                                        "first; received ('gate', 'kernel')."),
    ({"kernels": "kernel", "width": "units", "biases": 5}, "argument `biases` must be the attribute names of its "
                                                           "per-unit weights (a str or a list of str); received 5."),
    ({"kernels": "kernel", "width": "units", "biases": ("kernel",)}, "argument `biases` must be distinct attribute "
                                                                     "names that are not kernels; received "
                                                                     "('kernel',)."),
    ({"kernels": "kernel", "width": "units", "slicer": len}, 'argument `slicer` must be None with kind="units" '
                                                             "(its kernels say how to slice it); received "),
])
def test_a_bad_declaration_names_the_argument(kwargs, message):
    with pytest.raises(InvalidParameterError) as info:
        register_layer(GatedDense, "units", **kwargs)
    assert str(info.value).startswith("register_layer: " + message)


def test_a_layer_kept_whole_takes_no_slicer_and_no_constants():
    for kwargs, name in (({"slicer": len}, "slicer"), ({"constants": "identity"}, "constants")):
        with pytest.raises(InvalidParameterError) as info:
            register_layer(TokenProjection, "whole", **kwargs)
        assert str(info.value).startswith(f'register_layer: argument `{name}` must be left out with kind="whole" '
                                          "(the layer is kept as it is); received ")
    assert registry.rule_of(TokenProjection(3)) is None  # the failed calls left the table as it was


def test_kernels_and_width_are_for_units_layers_only():
    with pytest.raises(InvalidParameterError, match=r'argument `kernels` must be given only with kind="units"; '
                                                    r"received \('kernel',\)\."):
        register_layer(GatedDense, kernels=("kernel",))
    assert registry.rule_of(GatedDense(3)).kind == "units"  # the failed call left the table as it was


@pytest.mark.quick
def test_a_declaration_the_layer_does_not_keep_is_caught_when_its_copy_is_made():
    model = _chain(SoftmaxDense)
    kernel, bias = model.get_layer("out").get_weights()
    kernel[[1, 5]] = 0.0  # nothing reads units 1 and 5: a copy of 6 units, whose softmax is over 6
    model.get_layer("out").set_weights([kernel, bias])
    with pytest.raises(UnsupportedModelError) as info:
        prune_model(model, T)
    assert info.value.layer_name == "gated" and info.value.layer_class == "SoftmaxDense"
    assert info.value.reason.startswith('declared with register_layer(..., "units"), but its copy keeping 6 of 8 '
                                        "units computes something else (largest difference ")
    assert info.value.reason.endswith("a kernel must enter its call only as x @ K, and unit j read only column j "
                                      "of each kernel and entry j of each bias")
    model.get_layer("out").set_weights([np.where(kernel == 0, 1.0, kernel), bias])
    assert prune_model(model, T).get_layer("gated").units == 8  # every unit read: the copy is the layer


@pytest.mark.parametrize("seed", [pytest.param(0, marks=pytest.mark.quick), 1])
def test_a_convolution_of_ones_own_prunes_exactly(seed, tmp_path):
    rng = np.random.default_rng(seed)
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((6, 6, 3))
    x = GatedConv2D(8, name="gconv1")(inputs)
    x = L.BatchNormalization(name="bn")(x)
    x = L.Conv2D(6, 3, activation="relu", name="conv")(x)
    x = GatedConv2D(5, name="gconv2")(x)
    model = keras.Model(inputs, L.Dense(2, name="out")(L.GlobalAveragePooling2D()(x)))
    _sparsify(model, rng)
    x = rng.normal(size=(4, 6, 6, 3)).astype("float32")
    small = prune_model(model, T)
    assert_same_outputs(small, model, x, rtol=1e-5)
    report = sparsity_report(model, T)
    widths = {row.name: row.units_alive for row in report.layers}
    assert small.get_layer("gconv1").filters == widths["gconv1"]
    assert tuple(small.get_layer("gconv2").gate.shape) == (3, 3, widths["conv"], widths["gconv2"])
    assert report.flops_after < report.flops_before
    path = tmp_path / "small.keras"
    small.save(path)
    np.testing.assert_allclose(outputs(keras.saving.load_model(path), x)[0], outputs(small, x)[0], rtol=0, atol=1e-6)


class RMSNorm(L.Layer):
    """An RMS normalization of one's own: it mixes the channels it reads (``register_layer(cls, "tail")``)."""

    def build(self, input_shape):
        self.scale = self.add_weight(shape=(input_shape[-1],), initializer="ones", name="scale")

    def call(self, x):
        return x * ops.rsqrt(ops.mean(x * x, axis=-1, keepdims=True) + 1e-6) * self.scale


def test_a_normalization_of_ones_own_declared_as_tail_keeps_its_channels_and_the_rest_prunes():
    register_layer(RMSNorm, "tail")
    try:
        keras.utils.set_random_seed(0)
        inputs = keras.Input((6,))
        hidden = L.Dense(8, activation="relu", name="a")(inputs)
        hidden = L.Dense(5, activation="relu", name="b")(RMSNorm(name="norm")(hidden))
        model = add_group_sparsity(keras.Model(inputs, L.Dense(2, name="c")(hidden)), 1e-3)
        kernel, bias = model.get_layer("c").get_weights()
        kernel[[1, 3]] = 0.0  # units 1 and 3 of b go; the norm's channels all stay
        model.get_layer("c").set_weights([kernel, bias])
        small = prune_model(model, T)
        assert small.get_layer("a").units == 8 and small.get_layer("b").units == 3
        assert tuple(small.get_layer("norm").scale.shape) == (8,)
        x = np.random.default_rng(0).normal(size=(8, 6)).astype("float32")
        assert_same_outputs(small, model, x, rtol=1e-5)
    finally:
        unregister_layer(RMSNorm)


@keras.saving.register_keras_serializable("test_own_units_layers")
class TokenProjection(L.Layer):
    """``x W + P``: a projection of each position with a table of position values, math and weights of its own (as a
    ViT's patch embedding adds its position table)."""

    def __init__(self, units, **kwargs):
        super().__init__(**kwargs)
        self.units = units

    def build(self, input_shape):
        self.w = self.add_weight(shape=(input_shape[-1], self.units), initializer="glorot_uniform")
        self.table = self.add_weight(shape=(input_shape[-2], self.units), initializer="random_normal")

    def call(self, x):
        return ops.matmul(x, self.w) + self.table

    def get_config(self):
        return {**super().get_config(), "units": self.units}


def test_a_layer_of_ones_own_declared_whole_is_copied_as_it_is_and_the_rest_prunes(tmp_path):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((5, 3))
    before = L.Dense(4, activation="tanh", name="before")(inputs)
    hidden = L.Dense(10, activation="relu", name="hidden")(TokenProjection(6, name="tokens")(before))
    model = keras.Model(inputs, L.Dense(4, name="out")(hidden))
    kernel, bias = model.get_layer("out").get_weights()
    kernel[[2, 5, 7]] = 0.0  # hidden units 2, 5 and 7 feed nothing
    model.get_layer("out").set_weights([kernel, bias])
    kernel, bias = model.get_layer("before").get_weights()
    kernel[:, 1] = 0.0  # unit 1 of `before` is a constant, tanh(b): the layer kept whole reads it, so it stays
    model.get_layer("before").set_weights([kernel, bias + 0.5])
    with pytest.raises(UnsupportedModelError, match="'tokens' \\(TokenProjection\\)"):
        prune_model(model, T)
    rule = register_layer(TokenProjection, "whole")
    try:
        assert rule.kind == "whole"
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            sparse = add_group_sparsity(model, 1e-3)
        assert [w for w in caught if issubclass(w.category, UserWarning)] == []  # no layer it cannot read
        assert sparse.get_layer("tokens").w.regularizer is None  # kept whole: no group penalty
        report = sparsity_report(model, T)
        assert [layer.name for layer in report.layers] == ["before", "hidden", "out"]
        small = prune_model(model, T)
        assert small.get_layer("hidden").units == 7 and small.get_layer("out").get_weights()[0].shape == (7, 4)
        assert small.get_layer("before").units == 4
        for got, want in zip(small.get_layer("tokens").get_weights(), model.get_layer("tokens").get_weights()):
            np.testing.assert_array_equal(got, want)
        x = np.random.default_rng(1).normal(size=(8, 5, 3)).astype("float32")
        assert_same_outputs(small, model, x, rtol=1e-5)
        small.save(tmp_path / "small.keras")
        again = keras.saving.load_model(tmp_path / "small.keras")
        np.testing.assert_allclose(outputs(again, x)[0], outputs(small, x)[0], rtol=0, atol=1e-6)
    finally:
        unregister_layer(TokenProjection)
