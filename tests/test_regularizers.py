import json
import math

import keras
from keras import ops
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import _autodiff
from keras_group_lasso import (
    GroupLasso,
    HiddenGroupLasso,
    InputGroupLasso,
    InvalidParameterError,
    SparseGroupLasso,
)
from keras_group_lasso import optimizers as kgl_optimizers
from keras_group_lasso import regularizers as kgl_regularizers
from keras_group_lasso import add_group_sparsity

ALL_CLASSES = [GroupLasso, SparseGroupLasso, InputGroupLasso, HiddenGroupLasso]


def np_group_lasso(w, factor):
    w = np.asarray(w, dtype=np.float64)
    if w.ndim == 1:
        return factor * np.abs(w).sum()
    moved = np.moveaxis(w, -2, 0).reshape(w.shape[-2], -1)
    size = moved.shape[1]
    return factor * math.sqrt(size) * np.linalg.norm(moved, axis=1).sum()


def np_sgl(w, factor, l1):
    return np_group_lasso(w, factor) + l1 * np.abs(np.asarray(w, np.float64)).sum()


def value(reg, w):
    return float(keras.ops.convert_to_numpy(reg(keras.ops.convert_to_tensor(w))))


def gradient(reg, w):
    """Gradient of the penalty, via the backend's own autodiff."""
    return _autodiff.gradient(reg, w)


weights = hnp.arrays(
    np.float32,
    st.one_of(
        hnp.array_shapes(min_dims=1, max_dims=1, min_side=1, max_side=7),
        hnp.array_shapes(min_dims=2, max_dims=4, min_side=1, max_side=5),
    ),
    # Below ~1e-19 a weight's square underflows in float32, so a group of such weights is a zero group
    # (gradient 0, see prox.group_sparse_penalty); subnormals are also flushed to zero by TF on CPU.
    elements=st.floats(-3, 3, width=32, allow_subnormal=False).filter(lambda v: v == 0 or abs(v) >= 1e-15),
)


@settings(max_examples=25, deadline=None)
@given(w=weights, factor=st.floats(0, 1), l1=st.floats(0, 1))
def test_values_match_numpy(w, factor, l1):
    np.testing.assert_allclose(value(GroupLasso(factor), w), np_group_lasso(w, factor), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(value(SparseGroupLasso(factor, l1), w), np_sgl(w, factor, l1), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(value(InputGroupLasso(factor), w), np_group_lasso(w, factor), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(value(HiddenGroupLasso(factor, l1=l1), w), np_sgl(w, factor, l1), rtol=1e-4, atol=1e-5)


@pytest.mark.quick
def test_dense_kernel_rows_are_the_groups():
    w = np.array([[3.0, 4.0, 0.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]], np.float32)
    # rows have norms 5, 0, 1 and 3 weights each
    assert value(GroupLasso(0.5), w) == pytest.approx(0.5 * math.sqrt(3) * 6)
    assert value(SparseGroupLasso(0.5), w) == pytest.approx(0.5 * math.sqrt(3) * 6 + 0.5 * 8)


def test_conv_kernel_groups_are_input_channels():
    w = np.zeros((3, 3, 4, 2), np.float32)
    w[..., 1, :] = 1.0  # one live input channel with 18 weights, each 1
    assert value(GroupLasso(1.0), w) == pytest.approx(math.sqrt(18) * math.sqrt(18))


@pytest.mark.quick
def test_bias_every_scalar_is_a_group():
    b = np.array([1.0, -2.0, 0.0], np.float32)
    assert value(GroupLasso(0.1), b) == pytest.approx(0.3)
    assert value(SparseGroupLasso(0.1), b) == pytest.approx(0.6)
    assert value(SparseGroupLasso(0.1, l1=0.2), b) == pytest.approx(0.9)


def test_sparse_group_lasso_l1_defaults_to_factor():
    assert SparseGroupLasso(0.3).l1 == 0.3
    assert SparseGroupLasso(0.3, l1=0.0).l1 == 0.0
    assert InputGroupLasso(0.3).l1 == 0.0
    assert HiddenGroupLasso(0.3).l1 == 0.0


def test_roles():
    assert InputGroupLasso().role == "input"
    assert HiddenGroupLasso().role == "hidden"
    assert SparseGroupLasso().role == "any"
    assert GroupLasso().role == "any"


@settings(max_examples=25, deadline=None)
@given(w=weights, factor=st.floats(0.01, 1), l1=st.floats(0, 1))
def test_gradient_matches_numpy_subgradient(w, factor, l1):
    w = w.astype(np.float32)
    got = gradient(SparseGroupLasso(factor, l1), w)
    if w.ndim == 1:
        expected = (factor + l1) * np.sign(w)
    else:
        moved = np.moveaxis(w, -2, 0)
        flat = moved.reshape(moved.shape[0], -1)
        norms = np.linalg.norm(flat.astype(np.float64), axis=1)
        scale = np.where(norms > 0, factor * math.sqrt(flat.shape[1]) / np.where(norms > 0, norms, 1), 0)
        g = (flat * scale[:, None]).reshape(moved.shape)
        expected = np.moveaxis(g, 0, -2) + l1 * np.sign(w)
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-4)


def test_gradient_at_zero_group_and_zero_weight_is_zero():
    w = np.zeros((4, 3), np.float32)
    w[0] = [1.0, 0.0, -2.0]
    g = gradient(SparseGroupLasso(0.1), w)
    assert np.all(np.isfinite(g))
    np.testing.assert_array_equal(g[1:], 0.0)
    # inside a live group, the L1 part contributes 0 where the weight is 0
    expected_mid = 0.1 * math.sqrt(3) * 0.0 / math.sqrt(5)
    assert g[0, 1] == pytest.approx(expected_mid)
    np.testing.assert_array_equal(gradient(SparseGroupLasso(0.1), np.zeros(5, np.float32)), 0.0)


@pytest.mark.quick
@pytest.mark.parametrize("cls", ALL_CLASSES)
@pytest.mark.parametrize(
    "bad, shown",
    [(-1.0, "-1.0"), (float("nan"), "nan"), (float("inf"), "inf"), ("0.1", "'0.1'"), (True, "True"), (None, "None")],
)
def test_bad_factor_is_rejected_at_construction(cls, bad, shown):
    with pytest.raises(InvalidParameterError) as info:
        cls(bad)
    assert str(info.value) == f"{cls.__name__}: argument `factor` must be a finite number >= 0; received {shown}."


@pytest.mark.parametrize("cls", [SparseGroupLasso, InputGroupLasso, HiddenGroupLasso])
def test_bad_l1_is_rejected(cls):
    with pytest.raises(InvalidParameterError, match=rf"{cls.__name__}: argument `l1` must be a finite number >= 0.*received -0.5\."):
        cls(0.1, l1=-0.5)
    with pytest.raises(ValueError):  # InvalidParameterError is also a ValueError and a TypeError
        cls(0.1, l1=[1])


def test_numpy_scalars_are_accepted():
    assert SparseGroupLasso(np.float32(0.5)).factor == 0.5
    assert GroupLasso(np.array(2)).factor == 2.0


@pytest.mark.parametrize("cls", ALL_CLASSES)
def test_rank0_tensor_gets_a_clear_error(cls):
    with pytest.raises(InvalidParameterError, match=r"rank >= 1.*not a scalar"):
        cls(0.1)(keras.ops.convert_to_tensor(1.0))


@pytest.mark.quick
@pytest.mark.parametrize("cls", ALL_CLASSES)
def test_config_round_trip(cls):
    reg = cls(0.25) if cls is GroupLasso else cls(0.25, l1=0.5)
    config = reg.get_config()
    json.dumps(config)
    assert all(type(v) is float for v in config.values())
    again = cls.from_config(config)
    assert again == reg
    assert again.get_config() == config


@pytest.mark.parametrize("cls", ALL_CLASSES)
def test_keras_serialize_deserialize_get(cls):
    reg = cls(0.25)
    payload = keras.regularizers.serialize(reg)
    assert payload["registered_name"] == f"keras_group_lasso>{cls.__name__}"
    assert keras.regularizers.deserialize(payload) == reg
    assert keras.regularizers.get(payload) == reg


def test_package_get_resolves_aliases_and_keras_names():
    assert kgl_regularizers.get("sparse_group_lasso") == SparseGroupLasso()
    assert kgl_regularizers.get("input_group_lasso") == InputGroupLasso()
    assert isinstance(kgl_regularizers.get("l2"), keras.regularizers.L2)
    assert kgl_regularizers.get(None) is None
    with pytest.raises(InvalidParameterError, match=r"get: argument `identifier`.*received 'nope'"):
        kgl_regularizers.get("nope")


def paper_model():
    return keras.Sequential(
        [
            keras.Input((64,)),
            keras.layers.Dense(
                40, activation="relu", kernel_regularizer=InputGroupLasso(1e-3), bias_regularizer=SparseGroupLasso(1e-3)
            ),
            keras.layers.Dense(
                20, activation="relu", kernel_regularizer=SparseGroupLasso(1e-3), bias_regularizer=SparseGroupLasso(1e-3)
            ),
            keras.layers.Dense(10, activation="softmax", kernel_regularizer=HiddenGroupLasso(1e-3)),
        ]
    )


@pytest.mark.quick
def test_model_saves_and_loads_without_custom_objects(tmp_path, rng):
    model = paper_model()
    x = rng.random((8, 64)).astype("float32")
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    for original, again in zip(model.layers, loaded.layers):
        assert type(again.kernel_regularizer) is type(original.kernel_regularizer)
        assert again.kernel_regularizer == original.kernel_regularizer
        assert again.bias_regularizer == original.bias_regularizer
    np.testing.assert_allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0), atol=1e-6)
    np.testing.assert_allclose(
        sum(float(keras.ops.convert_to_numpy(l)) for l in loaded.losses),
        sum(float(keras.ops.convert_to_numpy(l)) for l in model.losses),
        rtol=1e-6,
    )


def test_model_losses_include_the_penalties(rng):
    model = paper_model()
    expected = 0.0
    for layer in model.layers:
        expected += np_group_lasso(layer.kernel.numpy(), 1e-3)
        if isinstance(layer.kernel_regularizer, SparseGroupLasso):
            expected += 1e-3 * np.abs(layer.kernel.numpy()).sum()
        if layer.bias_regularizer is not None:
            expected += 2e-3 * np.abs(layer.bias.numpy()).sum()
    got = sum(float(keras.ops.convert_to_numpy(l)) for l in model.losses)
    assert got == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("jit_compile", [False, True])
def test_trains_with_jit_compile_and_stays_finite(jit_compile, rng):
    model = paper_model()
    # start from an exactly zero group, the NaN trap of a plain sqrt(sum(w**2))
    kernel = model.layers[0].kernel.numpy()
    kernel[:5] = 0.0
    model.layers[0].kernel.assign(kernel)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy", jit_compile=jit_compile)
    x = rng.random((64, 64)).astype("float32")
    y = rng.integers(0, 10, 64)
    history = model.fit(x, y, epochs=2, batch_size=32, verbose=0)
    assert all(np.isfinite(history.history["loss"]))
    for w in model.get_weights():
        assert np.all(np.isfinite(w))


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="torch.compile")
def test_torch_compile_traces_every_penalty_whole():
    # fullgraph=True fails on any graph break: the penalties, plain and coupled, must trace into one graph.
    import torch

    from keras_group_lasso import add_group_sparsity

    inputs = keras.Input((4,))
    branch = keras.layers.Dense(4)(keras.layers.Dense(3, activation="relu")(inputs))
    stream = keras.layers.Add()([inputs, branch])
    model = add_group_sparsity(keras.Model(inputs, keras.layers.Dense(2)(stream)), 0.05, penalty="sgl")
    variable = keras.Variable(np.arange(12, dtype="float32").reshape(3, 4))
    penalties = [cls(0.1) for cls in ALL_CLASSES]
    for read in (lambda: list(model.losses), lambda: [penalty(variable) for penalty in penalties]):
        traced = torch.compile(read, fullgraph=True)()
        eager = read()
        assert len(traced) == len(eager)
        for a, b in zip(traced, eager):
            assert float(a) == pytest.approx(float(b), rel=1e-6)


@pytest.mark.parametrize("policy", ["float16", "bfloat16", "mixed_float16", "mixed_bfloat16"])
def test_mixed_precision(policy, rng):
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        model = paper_model()
        model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
        x = rng.random((32, 64)).astype("float32")
        y = rng.integers(0, 10, 32)
        history = model.fit(x, y, epochs=1, batch_size=16, verbose=0)
        assert np.isfinite(history.history["loss"][0])
        kernel = keras.ops.convert_to_numpy(keras.ops.cast(model.layers[1].kernel, "float32"))
        reg_value = value(SparseGroupLasso(1e-3), model.layers[1].kernel.value)
        assert reg_value == pytest.approx(np_sgl(kernel, 1e-3, 1e-3), rel=1e-2)
    finally:
        keras.config.set_dtype_policy(previous)


# ----------------------------------------------------------------------------- activity_regularizer misuse

_ACTIVITY_MESSAGE = (
    r"argument `x` must be a weight \(a kernel or a bias\): a group penalty sums over the rows of a weight, "
    r"so use it as kernel_regularizer or bias_regularizer; as activity_regularizer it would receive the "
    r"layer's output and group the samples of a batch; received the output of layer 'hidden' \(Dense\), "
)


def _with_activity_penalty(cls):
    return keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(3, activity_regularizer=cls(0.1), name="hidden"), keras.layers.Dense(1)]
    )


@pytest.mark.parametrize("cls", ALL_CLASSES)
@pytest.mark.parametrize("declare", ["add_group_sparsity", "set_penalty_multiplier", "SparsityBudget"])
def test_activity_regularizer_use_is_refused_where_a_model_declares_its_penalties(cls, declare, rng):
    """A penalty is a pure function of its input: the model that declares it tells a weight from an output."""
    from keras_group_lasso import SparsityBudget, set_penalty_multiplier

    model = _with_activity_penalty(cls)
    message = (cls.__name__ + ": " + _ACTIVITY_MESSAGE.split("received the output")[0]
               + r"received the activity_regularizer of layer 'hidden' \(Dense\)\.")
    with pytest.raises(InvalidParameterError, match=message):
        if declare == "add_group_sparsity":
            add_group_sparsity(model, 1e-3)
        elif declare == "set_penalty_multiplier":
            set_penalty_multiplier(model, 2.0)
        else:
            model.compile(optimizer="sgd", loss="mse")
            x = rng.random((8, 4)).astype("float32")
            model.fit(x, np.ones((8, 1)), epochs=1, verbose=0, callbacks=[SparsityBudget(max_units=2)])


def test_a_penalty_reads_no_call_stack():
    """The value is a function of the weight and the declared state: called from anywhere, the same number."""
    import inspect

    source = inspect.getsource(kgl_regularizers) + inspect.getsource(kgl_optimizers)
    assert "_getframe" not in source and "inspect.stack" not in source and "f_back" not in source
    penalty = GroupLasso(0.1)
    x = np.arange(12, dtype="float32").reshape(3, 4)
    first = float(ops.convert_to_numpy(penalty(x)))
    assert first == pytest.approx(np_group_lasso(x, 0.1), rel=1e-6)
    assert float(ops.convert_to_numpy(penalty(keras.Variable(x)))) == first
    assert not penalty.value_only and penalty.declared is None


@pytest.mark.parametrize("cls", ALL_CLASSES)
def test_a_tensor_with_an_unknown_dimension_is_not_a_weight(cls):
    with pytest.raises(
        InvalidParameterError,
        match=cls.__name__ + r": argument `x` must be a weight .* received a tensor of shape \(None, 3\), which no weight has\.",
    ):
        cls(0.1)(keras.KerasTensor((None, 3)))


def test_weight_use_inside_a_stateless_scope_reads_the_scope_values(rng):
    # The JAX trainer computes the penalties this way: inside a StatelessScope, on the values it traces.
    model = paper_model()
    zeros = [(v, keras.ops.zeros(v.shape, v.dtype)) for v in model.trainable_variables]
    with keras.StatelessScope(state_mapping=zeros):
        losses = model.losses
    assert len(losses) == 5
    assert sum(float(keras.ops.convert_to_numpy(l)) for l in losses) == 0.0
    assert sum(float(keras.ops.convert_to_numpy(l)) for l in model.losses) > 0.0


# ---------------------------------------------------------------- channel groups (Dense after Flatten)


def as_numpy(x):
    return np.asarray(ops.convert_to_numpy(x))


def test_channels_groups_the_rows_of_one_channel(rng):
    """Kernel rows p * C + c belong to channel c: one group per channel, sqrt(|g|) = sqrt(P * out)."""
    positions, channels, out = 3, 4, 5
    w = rng.normal(size=(positions * channels, out)).astype(np.float32)
    w[1::channels] = 0.0  # channel 1 is dead at every position
    reg = GroupLasso(0.3, channels=channels)
    grouped = w.reshape(positions, channels, out)
    expected = 0.3 * math.sqrt(positions * out) * sum(
        np.linalg.norm(grouped[:, c, :]) for c in range(channels)
    )
    assert float(ops.convert_to_numpy(reg(w))) == pytest.approx(expected, rel=1e-5)
    step = as_numpy(reg.prox(w, 0.5))
    assert step.shape == w.shape and np.all(step[1::channels] == 0.0)
    strong = as_numpy(GroupLasso(100.0, channels=channels).prox(w, 1.0))
    assert np.all(strong == 0.0)
    np.testing.assert_allclose(as_numpy(reg.gradient(w))[1::channels], 0.0)


def test_channels_config_round_trip_and_bad_values():
    reg = SparseGroupLasso(1e-3, channels=8)
    assert reg.get_config() == {"factor": 1e-3, "l1": 1e-3, "channels": 8}
    assert SparseGroupLasso.from_config(reg.get_config()) == reg
    assert "channels" not in GroupLasso(1e-3).get_config()
    with pytest.raises(InvalidParameterError, match=r"GroupLasso: argument `channels` must be an integer >= 1; "
                                                    r"received 0\."):
        GroupLasso(1e-3, channels=0)
    with pytest.raises(InvalidParameterError, match=r"argument `channels` must be a divisor of the rows of a Dense "
                                                    r"kernel \(the kernel has shape \(10, 2\)\); received 4\."):
        GroupLasso(1e-3, channels=4)(np.ones((10, 2), np.float32))


def _groups_first(view):
    return np.moveaxis(np.asarray(view, dtype=np.float64), -2, 0)


@pytest.mark.parametrize("shape, channels", [((6, 4), None), ((3, 3, 5, 4), None), ((12, 3), 4)])
@pytest.mark.parametrize("cls", [GroupLasso, SparseGroupLasso])
def test_spared_groups_are_left_out_of_the_value_the_gradient_and_the_prox(cls, shape, channels, rng):
    x = rng.normal(size=shape).astype("float32")
    plain, spared = cls(0.1, channels=channels), cls(0.1, channels=channels)
    spared.spared = 2
    view = x.reshape(plain.group_shape(shape))
    norms = np.sqrt((_groups_first(view) ** 2).reshape(view.shape[-2], -1).sum(axis=1))
    strongest = np.argsort(-norms)[:2]
    mask = np.zeros(view.shape[-2], bool)
    mask[strongest] = True
    assert ops.convert_to_numpy(spared.spared_mask(view)).astype(bool).tolist() == mask.tolist()

    others = _groups_first(view).copy()
    others[mask] = 0.0
    others = np.moveaxis(others, 0, -2).reshape(shape).astype("float32")
    np.testing.assert_allclose(float(spared(x)), float(plain(others)), rtol=1e-5)

    gradient = _groups_first(ops.convert_to_numpy(spared.gradient(x)).reshape(view.shape))
    reference = _groups_first(ops.convert_to_numpy(plain.gradient(x)).reshape(view.shape))
    assert np.all(gradient[mask] == 0.0)
    np.testing.assert_allclose(gradient[~mask], reference[~mask], rtol=1e-5, atol=1e-7)

    z = _groups_first(ops.convert_to_numpy(spared.prox(x, 50.0)).reshape(view.shape))
    z_plain = _groups_first(ops.convert_to_numpy(plain.prox(x, 50.0)).reshape(view.shape))
    np.testing.assert_array_equal(z[mask], _groups_first(view)[mask])
    np.testing.assert_allclose(z[~mask], z_plain[~mask], rtol=1e-6, atol=1e-7)
    assert np.all(z[~mask] == 0.0)  # a step of 50 empties every group the penalty reads


def test_sparing_more_groups_than_there_are_spares_them_all_and_is_never_saved():
    penalty = GroupLasso(0.1)
    penalty.spared = 10
    x = np.arange(12, dtype="float32").reshape(3, 4)
    assert float(penalty(x)) == 0.0
    np.testing.assert_array_equal(ops.convert_to_numpy(penalty.prox(x, 100.0)), x)
    assert "spared" not in penalty.get_config()
    assert kgl_regularizers.GroupLasso.from_config(penalty.get_config()).spared == 0


def test_assigning_one_penalty_s_multiplier_still_works_and_is_deprecated():
    penalty = GroupLasso(0.1)
    x = np.arange(12, dtype="float32").reshape(3, 4)
    with pytest.warns(DeprecationWarning, match="link_penalty_multiplier"):
        penalty.multiplier = keras.Variable(np.array([1.0, 3.0], "float32"))
    assert float(ops.convert_to_numpy(penalty(x))) == pytest.approx(3 * np_group_lasso(x, 0.1), rel=1e-6)
