"""Coupled group penalties: one norm over a unit's outgoing weights in every layer that reads it."""

import math

import keras
import numpy as np
import pytest

from keras_group_lasso import (
    CoupledGroupLasso,
    GroupSparseModel,
    HiddenGroupLasso,
    Proximal,
    add_group_sparsity,
    coupled_groups,
    prune_model,
)

L = keras.layers
LAM = 0.05


def residual(n=4, hidden=3):
    """x + g(x) read by 'out': feature j lives in the input, in g's output j and in the sum."""
    inputs = keras.Input((n,), name="x")
    g = L.Dense(hidden, activation="relu", name="g_in")(inputs)
    g = L.Dense(n, name="g_out")(g)
    s = L.Add(name="sum")([inputs, g])
    return keras.Model(inputs, L.Dense(2, name="out")(s))


def sparse_residual(seed=0):
    model = add_group_sparsity(residual(), LAM, penalty="group", bias=False)
    rng = np.random.default_rng(seed)
    model.set_weights([rng.normal(size=w.shape).astype("float32") for w in model.get_weights()])
    return model


def full_batch_steps(model, x, y, steps):
    """``steps`` steps on the whole of ``x`` at once, as one epoch (``steps`` Keras epochs of one step each cost
    Keras's per-epoch work every step: seconds on TensorFlow)."""
    model.fit(np.tile(x, (steps, 1)), np.tile(y, (steps, 1)), epochs=1, batch_size=len(x), shuffle=False, verbose=0)


def kernels(model):
    return {name: keras.ops.convert_to_numpy(model.get_layer(name).kernel) for name in ("g_in", "g_out", "out")}


def reference_penalty(k):
    # Feature j: row j of g_in (3 weights) and row j of out (2 weights), one group of 5.
    # g_out reads g_in's 3 hidden units (own groups of 4 weights).
    coupled = sum(LAM * math.sqrt(5) * math.sqrt(np.sum(k["g_in"][j] ** 2) + np.sum(k["out"][j] ** 2)) for j in range(4))
    own = sum(LAM * math.sqrt(4) * np.linalg.norm(k["g_out"][i]) for i in range(3))
    return coupled + own


def test_add_group_sparsity_couples_the_readers_of_a_residual_stream():
    model = sparse_residual()
    assert isinstance(model, GroupSparseModel)
    assert [(g.readers, g.size) for g in coupled_groups(model)] == [
        ((("g_in", j), ("out", j)), 5) for j in range(4)]
    g_in, out = model.get_layer("g_in").kernel.regularizer, model.get_layer("out").kernel.regularizer
    assert isinstance(g_in, CoupledGroupLasso) and isinstance(out, CoupledGroupLasso)
    assert g_in.anchor and not out.anchor and g_in.role == "input" and out.role == "hidden"
    assert g_in.scales == pytest.approx([LAM * math.sqrt(5)] * 4)
    assert isinstance(model.get_layer("g_out").kernel.regularizer, HiddenGroupLasso)  # not coupled


def test_the_loss_holds_one_norm_per_coupled_group():
    model = sparse_residual()
    value = float(sum(keras.ops.convert_to_numpy(loss) for loss in model.losses))
    np.testing.assert_allclose(value, reference_penalty(kernels(model)), rtol=1e-5)


def test_the_gradient_of_a_coupled_group_is_its_union_direction():
    model = sparse_residual()
    k = kernels(model)
    g_in, out = model.get_layer("g_in").kernel, model.get_layer("out").kernel
    union = np.sqrt(np.sum(k["g_in"] ** 2, axis=1) + np.sum(k["out"] ** 2, axis=1))[:, None]
    np.testing.assert_allclose(keras.ops.convert_to_numpy(g_in.regularizer.gradient(g_in.value)),
                               LAM * math.sqrt(5) * k["g_in"] / union, rtol=1e-5)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(out.regularizer.gradient(out.value)),
                               LAM * math.sqrt(5) * k["out"] / union, rtol=1e-5)
    if keras.backend.backend() == "tensorflow":  # autodiff of the loss agrees with the closed form (JAX: see test_regularizers)
        import tensorflow as tf

        with tf.GradientTape() as tape:
            total = tf.add_n(model.losses)
        grads = tape.gradient(total, [g_in.value, out.value])
        np.testing.assert_allclose(grads[0].numpy(), LAM * math.sqrt(5) * k["g_in"] / union, rtol=1e-5)
        np.testing.assert_allclose(grads[1].numpy(), LAM * math.sqrt(5) * k["out"] / union, rtol=1e-5)
    if keras.backend.backend() == "torch":  # the same through torch's autograd
        total = sum(model.losses)
        total.backward()
        np.testing.assert_allclose(g_in.value.grad.numpy(), LAM * math.sqrt(5) * k["g_in"] / union, rtol=1e-5)
        np.testing.assert_allclose(out.value.grad.numpy(), LAM * math.sqrt(5) * k["out"] / union, rtol=1e-5)


def test_proximal_shrinks_each_union_as_one_group():
    model = sparse_residual()
    k = kernels(model)
    k["g_in"][1] *= 0.01  # feature 1: small in both readers -> the whole union goes at once
    k["out"][1] *= 0.01
    for name in k:
        model.get_layer(name).kernel.assign(k[name])
    lr = 0.5
    opt = Proximal(keras.optimizers.SGD(lr))
    variables = model.trainable_variables
    opt.build(variables)
    grads = [v.regularizer.gradient(v.value) if v.regularizer is not None else keras.ops.zeros(v.shape)
             for v in variables]  # the gradient of the penalties alone: no data gradient
    opt.apply(grads, variables)
    union = np.sqrt(np.sum(k["g_in"] ** 2, axis=1) + np.sum(k["out"] ** 2, axis=1))[:, None]
    factor = np.maximum(0.0, 1.0 - lr * LAM * math.sqrt(5) / union)
    got = kernels(model)
    np.testing.assert_allclose(got["g_in"], k["g_in"] * factor, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got["out"], k["out"] * factor, rtol=1e-5, atol=1e-7)
    assert factor[1] == 0.0 and not got["g_in"][1].any() and not got["out"][1].any()
    own = np.maximum(0.0, 1.0 - lr * LAM * 2.0 / np.linalg.norm(k["g_out"], axis=1))[:, None]
    np.testing.assert_allclose(got["g_out"], k["g_out"] * own, rtol=1e-5, atol=1e-7)


def test_a_spared_coupled_group_is_left_alone_by_the_value_the_gradient_and_the_proximal_step():
    # g_in spares its strongest coupled group (by the norm of the whole union): 'out', which reads the same
    # stream, leaves it alone too, so the stream keeps that channel however strong the penalty.
    model = sparse_residual()
    k = kernels(model)
    g_in, out = model.get_layer("g_in").kernel, model.get_layer("out").kernel
    union = np.sqrt(np.sum(k["g_in"] ** 2, axis=1) + np.sum(k["out"] ** 2, axis=1))
    strongest = int(np.argmax(union))
    g_in.regularizer.spared = 1
    try:
        value = float(sum(keras.ops.convert_to_numpy(loss) for loss in model.losses))
        want = reference_penalty(k) - LAM * math.sqrt(5) * union[strongest]
        np.testing.assert_allclose(value, want, rtol=1e-5)
        for variable, name in ((g_in, "g_in"), (out, "out")):
            grad = keras.ops.convert_to_numpy(variable.regularizer.gradient(variable.value))
            assert not grad[strongest].any()
            rest = np.delete(np.arange(4), strongest)
            np.testing.assert_allclose(grad[rest], LAM * math.sqrt(5) * k[name][rest] / union[rest, None], rtol=1e-5)
        # A step of the penalties alone (the gradient of the penalties as the loss's, as in the test above), so
        # large that every other union goes to zero; the spared one stays exactly as it was.
        opt = Proximal(keras.optimizers.SGD(100.0))
        variables = model.trainable_variables
        opt.build(variables)
        opt.apply([v.regularizer.gradient(v.value) if v.regularizer is not None else keras.ops.zeros(v.shape)
                   for v in variables], variables)
        got = kernels(model)
        np.testing.assert_array_equal(got["g_in"][strongest], k["g_in"][strongest])
        np.testing.assert_array_equal(got["out"][strongest], k["out"][strongest])
        assert not np.delete(got["g_in"], strongest, axis=0).any() and not np.delete(got["out"], strongest, axis=0).any()
    finally:
        g_in.regularizer.spared = 0


def test_a_budget_with_a_strength_too_high_keeps_a_residual_stream_open():
    # With a strength far too high for the model the penalties alone emptied the stream (no cut, no warning,
    # 0.8 % of the FLOPs left of a budget of 50 %); under a budget every reader spares the stream's strongest
    # channels, so the stream keeps its least width and the model lands on its budget.
    from keras_group_lasso import SparsityBudget, sparsity_report
    from keras_group_lasso.budget.settings import LEAST_WIDTH

    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 8, 1))
    stream = L.Conv2D(16, 3, padding="same", name="stem")(inputs)
    inner = L.Conv2D(32, 1, activation="relu", name="expand")(stream)
    stream = L.Add()([stream, L.Conv2D(16, 1, name="project")(inner)])
    outputs = L.Dense(4)(L.GlobalAveragePooling2D()(stream))
    model = add_group_sparsity(keras.Model(inputs, outputs), 0.05)
    model.compile(Proximal(keras.optimizers.Adam(1e-2)), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(128, 8, 8, 1)).astype("float32")
    y = (x.mean(axis=(1, 2, 3)) > 0).astype("int32") + 2 * (x[:, :4].mean(axis=(1, 2, 3)) > 0).astype("int32")
    budget = SparsityBudget(max_flops=0.5)
    model.fit(x, y, epochs=3, batch_size=32, verbose=0, callbacks=[budget])
    expand = keras.ops.convert_to_numpy(model.get_layer("expand").kernel)
    live = int(np.sum(np.abs(expand).sum(axis=(0, 1, 3)) > 1e-3))
    assert 0.5 * LEAST_WIDTH <= budget.least_width <= LEAST_WIDTH * math.sqrt(0.5)
    assert live >= math.ceil(budget.least_width * 16), live
    report = sparsity_report(model)
    assert 0.8 * 0.5 <= report.flops_after / report.flops_before <= 0.5
    assert model.get_layer("expand").kernel.regularizer.spared == 0  # spared for the fit only


def test_saved_loaded_and_cloned_models_keep_their_coupled_penalty(tmp_path):
    model = sparse_residual()
    want = reference_penalty(kernels(model))
    model.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras")
    assert isinstance(loaded, GroupSparseModel)
    np.testing.assert_allclose(float(sum(keras.ops.convert_to_numpy(x) for x in loaded.losses)), want, rtol=1e-5)
    clone = keras.models.clone_model(loaded)
    clone.set_weights(loaded.get_weights())
    np.testing.assert_allclose(float(sum(keras.ops.convert_to_numpy(x) for x in clone.losses)), want, rtol=1e-5)


@pytest.mark.parametrize("proximal", [False, True])
def test_training_removes_whole_coupled_units_and_surgery_follows(proximal):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype("float32")
    y = np.stack([x[:, 0] - x[:, 2], x[:, 0]], axis=1).astype("float32")  # features 1 and 3 are noise
    keras.utils.set_random_seed(0)
    model = add_group_sparsity(residual(), 0.1, penalty="group", bias=False)
    optimizer = Proximal(keras.optimizers.SGD(0.05)) if proximal else keras.optimizers.SGD(0.05)
    model.compile(optimizer=optimizer, loss="mse")
    full_batch_steps(model, x, y, 200)
    k = kernels(model)
    union = np.linalg.norm(np.concatenate([k["g_in"], k["out"]], axis=1), axis=1)
    if not proximal:  # subgradients: the noise features' unions end far below the signal's
        assert max(union[1], union[3]) < 0.2 * min(union[0], union[2])
        return
    # exact zeros, for a whole union at once: zero in every member or in none
    zero_in = ~(k["g_in"] != 0).any(axis=1), ~(k["out"] != 0).any(axis=1)
    np.testing.assert_array_equal(zero_in[0], zero_in[1])
    np.testing.assert_array_equal(union == 0, [False, True, False, True])
    small = prune_model(model, 0.0)
    assert small.kept_features == (0, 2)
    names = {layer.name for layer in small.layers}
    if k["g_out"].any():
        assert small.get_layer("g_out").kernel.shape[1] == 2
    else:  # g's hidden groups all went: g adds a constant, so it goes whole and the merge adds the constant
        assert not names & {"g_in", "g_out"} and isinstance(small.get_layer("sum"), keras.layers.Rescaling)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(small(x)), keras.ops.convert_to_numpy(model(x)),
                               rtol=0, atol=1e-5)


def test_proximal_adam_takes_the_joint_step_in_its_own_metric():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype("float32")
    y = np.stack([x[:, 0] - x[:, 2], x[:, 0]], axis=1).astype("float32")
    keras.utils.set_random_seed(0)
    model = add_group_sparsity(residual(), 0.1, penalty="group", bias=False)
    model.compile(optimizer=Proximal(keras.optimizers.Adam(0.02)), loss="mse")
    full_batch_steps(model, x, y, 150)
    k = kernels(model)
    zero_in = ~(k["g_in"] != 0).any(axis=1), ~(k["out"] != 0).any(axis=1)
    np.testing.assert_array_equal(zero_in[0], zero_in[1])  # a union goes in all its members at once
    assert zero_in[0][1] and zero_in[0][3] and not zero_in[0][0] and not zero_in[0][2]


def test_a_compiled_coupled_step_equals_an_eager_step():
    # torch: jit_compile=True is torch.compile, which traces the coupled penalties and their joint step too
    # (Adam: the proximal step after a deliberate graph break; tests/test_optimizers.py has SGD's one graph). The
    # model holds a plain penalty as well ('g_out', its hidden units): this is Proximal(Adam)'s compiled check on
    # torch for both kinds.
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype("float32")
    y = np.stack([x[:, 0] - x[:, 2], x[:, 0]], axis=1).astype("float32")
    weights = {}
    for jit_compile in (False, True):
        keras.utils.set_random_seed(0)
        model = add_group_sparsity(residual(), 0.1, penalty="sgl", bias=False)
        assert isinstance(model.get_layer("g_out").kernel.regularizer, HiddenGroupLasso)  # a plain penalty too
        model.compile(optimizer=Proximal(keras.optimizers.Adam(0.02)), loss="mse", jit_compile=jit_compile)
        model.fit(x, y, epochs=6, batch_size=32, shuffle=False, verbose=0)
        weights[jit_compile] = [w.numpy() for w in model.trainable_weights]
    for eager, compiled in zip(weights[False], weights[True]):
        np.testing.assert_allclose(compiled, eager, atol=1e-5)
    assert any(np.any(w == 0.0) for w in weights[True])  # the joint step gave exact zeros, compiled too


def test_an_unlinked_coupled_penalty_refuses_to_give_a_value():
    penalty = CoupledGroupLasso(0.1, coupled=[0, -1], scales=[1.0])
    with pytest.raises(ValueError, match="not linked to the other layers of its coupled groups"):
        penalty(keras.ops.ones((2, 3)))
    with pytest.raises(ValueError, match="not linked"):
        penalty.gradient(keras.ops.ones((2, 3)))
    with pytest.raises(NotImplementedError, match="jointly"):
        penalty.prox(keras.ops.ones((2, 3)), 0.1)
    members = [(keras.Variable(np.ones((2, 3), "float32")), CoupledGroupLasso(coupled=[0, 0], scales=[1.0]))]
    with pytest.raises(ValueError, match="exactly one anchor; received 0 anchors"):
        from keras_group_lasso.regularizers import link_coupled_penalties

        link_coupled_penalties(members)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(coupled=[1], scales=[1.0]), r"argument `coupled` must be indices in \[-1, 1\)"),
        (dict(coupled=[0], scales=[-1.0]), r"argument `scales` must be finite numbers >= 0"),
        (dict(role="output"), r"argument `role` must be 'input' or 'hidden'"),
        (dict(coupled=["a"]), r"argument `coupled` must be a list of group indices"),
        # what int() or bool() would read as something else is refused
        (dict(coupled=[0.7], scales=[1.0]), r"argument `coupled` must be a list of group indices \(integers\); "
                                            r"received \(0.7,\)"),
        (dict(coupled=[True], scales=[1.0]), r"argument `coupled` must be .*; received \(True,\)"),
        (dict(coupled="01", scales=[1.0, 1.0]), r"argument `coupled` must be .*; received \('0', '1'\)"),
        (dict(coupled=[0], scales=[True]), r"argument `scales` must be finite numbers >= 0; received \(True,\)"),
        (dict(coupled=[0], scales=["1"]), r"argument `scales` must be finite numbers >= 0; received \('1',\)"),
        (dict(coupled=[0], scales=[1.0], anchor="no"), r"argument `anchor` must be True or False; received 'no'"),
    ],
)
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CoupledGroupLasso(0.1, **kwargs)


def test_config_round_trip():
    penalty = CoupledGroupLasso(0.1, l1=0.01, channels=2, coupled=[0, -1], scales=[0.5], anchor=True, role="input")
    again = CoupledGroupLasso.from_config(penalty.get_config())
    assert again == penalty and again.anchor and again.role == "input" and again.scales == (0.5,)
