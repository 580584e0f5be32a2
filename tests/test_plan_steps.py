"""The pruning plan as typed steps: what each node becomes, decided before anything is built."""

import dataclasses
import json

import keras
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from keras_group_lasso import InvalidParameterError, plan_pruning, prune_model
from keras_group_lasso.analysis import unit_masks
from keras_group_lasso.graph import model_graph
from keras_group_lasso.surgery import steps as S
from test_branching import branching, build, kill_units
from test_cnn import assert_same_outputs, outputs, randomize_batchnorm
from _examples import examples

L = keras.layers
T = 1e-3
# Steps that build one layer of the new model each; the others build none.
BUILDS = (S.SelectUnits, S.SliceUnits, S.SlicePerUnit, S.Merge, S.Concat, S.FoldConstants)


def by_name(plan, cls):
    return {step.name: step for step in plan.steps if isinstance(step, cls)}


def set_kernel(model, name, kernel, bias=None):
    layer = model.get_layer(name)
    kernel = np.asarray(kernel, dtype="float32")
    bias = np.zeros(kernel.shape[-1], "float32") if bias is None else np.asarray(bias, "float32")
    layer.set_weights([kernel, bias])


def assert_well_formed(plan, small):
    """Each step reads only tensors written before it, that the new model has; one layer per building step."""
    written, absent = set(), set()
    for step in plan.steps:
        reads = [getattr(step, "source", None)] + list(getattr(step, "operands", ()))
        for name in filter(None, reads):
            assert name in written, (step, "reads a tensor not written before")
            if not isinstance(step, (S.Alias, S.Concat)):
                assert name not in absent, (step, "reads a dropped tensor")
        if isinstance(step, S.Concat):
            assert all(name not in absent for name in step.operands)
        if isinstance(step, S.Drop) or (isinstance(step, S.Alias) and step.source in absent):
            absent.add(step.name)
        written.add(step.name)
    built = [layer for layer in small.layers if not isinstance(layer, L.InputLayer)]
    assert len(built) == sum(isinstance(step, BUILDS) for step in plan.steps)
    for step in plan.steps:
        assert dataclasses.is_dataclass(step)
        with pytest.raises(dataclasses.FrozenInstanceError):
            step.name = "other"


def test_a_dropped_feature_is_a_row_the_first_dense_leaves_out():
    model = keras.Sequential([keras.Input((4,)), L.Dense(3, name="hidden"), L.Dense(2, name="out")])
    kernel = np.ones((4, 3))
    kernel[[1, 3], :] = 0.0  # features 1 and 3 are dead
    kernel[:, 2] = 0.0  # so is hidden unit 2
    set_kernel(model, "hidden", kernel)
    plan = plan_pruning(model, T)
    (new_input,) = by_name(plan, S.NewInput).values()
    assert new_input.shape == (4,) and new_input.features == (0, 1, 2, 3)  # the original input, all of it
    hidden, out = by_name(plan, S.SliceUnits)["hidden"], by_name(plan, S.SliceUnits)["out"]
    # The original input: the dropped features' rows stay, all zero (no selection: 2 * (4 + 2) < 4 * 2 is false).
    assert hidden.rows == (0, 1, 2, 3) and hidden.batchnorm is None
    assert hidden.units == plan.dense[0].kept_units == (0, 1) and plan.kept_features == (0, 2)
    assert out.source == "hidden" and out.rows == (0, 1) and out.units == (0, 1)
    assert not by_name(plan, S.SelectUnits)

    selected = plan_pruning(model, T, inputs="selected")
    (new_input,) = by_name(selected, S.NewInput).values()
    assert new_input.shape == (2,) and new_input.features == (0, 2)
    assert by_name(selected, S.SliceUnits)["hidden"].rows == plan.dense[0].kept_inputs == (0, 2)
    x = np.random.default_rng(0).normal(size=(5, 4)).astype("float32")
    small = prune_model(model, T, inputs="selected")
    np.testing.assert_allclose(outputs(small, x[:, [0, 2]])[0], outputs(model, x)[0], atol=1e-5)


def test_a_selection_comes_first_when_it_costs_fewer_multiply_adds():
    n, u = 12, 10
    model = keras.Sequential([keras.Input((n,)), L.Dense(u, name="wide"), L.Dense(2, name="out")])
    rng = np.random.default_rng(1)
    kernel = rng.normal(size=(n, u))
    kernel[3:, :] = 0.0  # 3 of 12 features: 3 * (12 + 10) < 12 * 10
    set_kernel(model, "wide", kernel)
    plan = plan_pruning(model, T)
    select = by_name(plan, S.SelectUnits)["wide/select"]
    assert (select.source, select.kept, select.width, select.reader) == ("<input>", (0, 1, 2), n, "wide")
    wide = by_name(plan, S.SliceUnits)["wide"]
    assert wide.source == "wide/select" and wide.rows == (0, 1, 2)
    small = prune_model(model, T)
    assert [layer.name for layer in small.layers] == ["select_features", "wide", "out"]
    assert_well_formed(small.pruning_plan, small)
    x = rng.normal(size=(6, n)).astype("float32")
    assert_same_outputs(small, model, x)


def test_a_residual_merge_and_a_constant_operand():
    inp = keras.Input((4,), name="x")
    a = L.Dense(4, name="a")(inp)
    b = L.Dense(4, name="b")(inp)
    c = L.Dense(4, name="c")(inp)
    y = L.Add(name="add")([a, b])
    z = L.Add(name="fold")([y, c])
    model = keras.Model(inp, L.Dense(2, name="out")(z))
    rng = np.random.default_rng(2)
    for name in "ab":
        set_kernel(model, name, rng.normal(size=(4, 4)))
    set_kernel(model, "c", np.zeros((4, 4)), bias=[1.0, 2.0, 3.0, 4.0])  # c is a constant operand
    plan = plan_pruning(model, T)
    steps = {step.name: step for step in plan.steps}
    assert steps["add"] == S.Merge("add", ("a", "b"))
    assert steps["c"] == S.Drop("c", S.DETACHED) and plan.removed_layers == ("c",)
    fold = steps["fold"]
    assert isinstance(fold, S.FoldConstants) and fold.source == "add" and not fold.separate
    np.testing.assert_array_equal(fold.scale, np.ones(4))
    np.testing.assert_allclose(fold.offset, [1, 2, 3, 4])
    small = prune_model(model, T)
    assert "c" not in [layer.name for layer in small.layers]
    assert isinstance(small.get_layer("fold"), L.Rescaling)  # the merge is gone: its own name
    assert_well_formed(plan, small)
    assert_same_outputs(small, model, rng.normal(size=(5, 4)).astype("float32"))


def test_a_branch_that_loses_every_unit_and_an_input_nothing_reads():
    x1, x2 = keras.Input((3,), name="x1"), keras.Input((2,), name="x2")
    a = L.Dense(3, name="a")(x1)
    b = L.Dense(3, name="b")(x2)
    model = keras.Model([x1, x2], L.Dense(2, name="out")(L.Concatenate(name="cat")([a, b])))
    rng = np.random.default_rng(3)
    set_kernel(model, "a", rng.normal(size=(3, 3)))
    set_kernel(model, "b", rng.normal(size=(2, 3)))
    kernel = rng.normal(size=(6, 2))
    kernel[3:] = 0.0  # nothing reads b
    set_kernel(model, "out", kernel)
    plan = plan_pruning(model, T, inputs="selected")
    steps = {step.name: step for step in plan.steps}
    assert steps["x2"] == S.Drop("x2", S.UNUSED_INPUT)
    assert steps["b"] == S.Drop("b", S.LOST)
    assert steps["cat"] == S.Alias("cat", "a", S.ONE_OPERAND)
    assert steps["out"].source == "cat" and steps["out"].rows == (0, 1, 2)
    small = prune_model(model, T, inputs="selected")
    assert small.kept_inputs == ("x1",) and [t.name for t in small.inputs] == ["x1"]
    assert_well_formed(plan, small)
    data = [rng.normal(size=(4, 3)).astype("float32"), rng.normal(size=(4, 2)).astype("float32")]
    np.testing.assert_allclose(outputs(small, data[0])[0], outputs(model, data)[0], atol=1e-5)


def test_the_batchnorms_fold_batchnorm_leaves_are_named_with_why():
    inputs = keras.Input((6,))
    ok = L.BatchNormalization(name="bn_ok")(L.Dense(5, name="lin")(inputs))
    after = L.BatchNormalization(name="bn_act")(L.Dense(4, activation="relu", name="act")(ok))
    shared = L.Dense(3, name="shared")(after)
    twice = L.BatchNormalization(name="bn_shared")(shared)
    model = keras.Model(inputs, L.Dense(2, name="out")(L.Concatenate()([twice, shared])))
    with pytest.warns(UserWarning) as caught:
        small = prune_model(model, T, fold_batchnorm=True)
    said = [str(w.message) for w in caught if "fold_batchnorm" in str(w.message)]
    assert said == ["prune_model: fold_batchnorm=True merges a BatchNormalization into the Dense or convolution "
                    "layer right before it; these stay layers: 'bn_act' ('act' applies its activation 'relu' before "
                    "it); 'bn_shared' ('shared' is read elsewhere too)"]
    assert small.folded_batchnorms == {"bn_ok": "lin"}
    assert S.unfolded_batchnorms(model_graph(model), unit_masks(model, T)) == {
        "bn_act": "'act' applies its activation 'relu' before it", "bn_shared": "'shared' is read elsewhere too"}


def test_a_batchnorm_merged_into_the_layer_before():
    model = keras.Sequential([keras.Input((4,)), L.Dense(5, name="d"), L.BatchNormalization(name="bn"),
                              L.ReLU(name="relu"), L.Dense(2, name="out")])
    rng = np.random.default_rng(4)
    randomize_batchnorm(model, rng)
    kernel = rng.normal(size=(4, 5))
    kernel[:, 1] = 0.0  # unit 1 outputs relu(bn(0)), a constant
    set_kernel(model, "d", kernel)
    plan = plan_pruning(model, T, fold_batchnorm=True)
    steps = {step.name: step for step in plan.steps}
    assert steps["bn"] == S.Alias("bn", "d", S.BATCHNORM)
    assert steps["d"].batchnorm == "bn" and steps["d"].units == plan.dense[0].kept_units
    assert steps["relu"] == S.SlicePerUnit("relu", "bn", steps["d"].units, None)  # unit 1 is folded
    assert 1 not in steps["d"].units
    small = prune_model(model, T, fold_batchnorm=True)
    assert small.folded_batchnorms == {"bn": "d"} and [layer.name for layer in small.layers] == ["d", "relu", "out"]
    assert_well_formed(plan, small)
    x = rng.normal(size=(6, 4)).astype("float32")
    assert_same_outputs(small, model, x)

    unfolded = plan_pruning(model, T)
    bn = by_name(unfolded, S.SlicePerUnit)["bn"]
    assert bn.source == "d" and bn.entries == plan.dense[0].kept_units
    assert by_name(unfolded, S.SliceUnits)["d"].batchnorm is None


def test_a_later_call_of_a_shared_layer_calls_the_same_new_layer():
    inp = keras.Input((4,), name="x")
    shared = L.Dense(4, activation="tanh", name="shared")
    model = keras.Model(inp, L.Dense(2, name="out")(shared(shared(inp))))
    rng = np.random.default_rng(5)
    kernel = rng.normal(size=(4, 4))
    kernel[:, 3] = 0.0
    kernel[3, :] = 0.0
    set_kernel(model, "shared", kernel)
    set_kernel(model, "out", rng.normal(size=(4, 2)))
    plan = plan_pruning(model, T)
    graph = model_graph(model)
    (call,) = by_name(plan, S.CallShared).values()
    assert call.layer == graph.layer_name(call.name) == "shared" and call.name != "shared"
    assert by_name(plan, S.SliceUnits)["shared"].units == plan.dense[0].kept_units
    small = prune_model(model, T)
    assert [layer.name for layer in small.layers if isinstance(layer, L.Dense)].count("shared") == 1
    assert_same_outputs(small, model, rng.normal(size=(5, 4)).astype("float32"))


def test_to_dict_holds_the_steps_and_survives_json():
    inp = keras.Input((6,), name="x")
    h = L.Dense(5, name="h")(inp)
    model = keras.Model(inp, L.Dense(2, name="out")(L.Add(name="add")([h, L.Dense(5, name="g")(inp)])))
    plan = plan_pruning(model, T, inputs="selected", fold_batchnorm=True)
    as_dict = plan.to_dict()
    assert json.loads(json.dumps(as_dict)) == as_dict
    assert (as_dict["inputs"], as_dict["fold_batchnorm"]) == ("selected", True)
    assert [entry["step"] for entry in as_dict["steps"]] == [step.kind for step in plan.steps]
    for entry, step in zip(as_dict["steps"], plan.steps):
        fields = {key: tuple(value) if isinstance(value, list) else value
                  for key, value in entry.items() if key != "step"}
        assert type(step)(**fields) == step


def test_the_new_options_are_checked_as_prune_model_checks_them():
    model = keras.Sequential([keras.Input((3,)), L.Dense(2)])
    with pytest.raises(InvalidParameterError) as info:
        plan_pruning(model, T, inputs="all")
    assert str(info.value) == "plan_pruning: argument `inputs` must be one of 'original', 'selected'; received 'all'."
    with pytest.raises(InvalidParameterError) as info:
        plan_pruning(model, T, fold_batchnorm="yes")
    assert str(info.value) == "plan_pruning: argument `fold_batchnorm` must be a bool; received 'yes'."


@settings(max_examples=examples(6), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(branching())
def test_prune_model_applies_the_steps_plan_pruning_shows(case):
    shape, image, blocks, head, n_outputs, seed = case
    keras.utils.set_random_seed(seed)
    model = build(shape, image, blocks, head, n_outputs)
    rng = np.random.default_rng(seed)
    kill_units(model, rng)
    if not unit_masks(model, T).live_path:
        return
    options = dict(fold_batchnorm=seed % 2 == 0, round_to=1 + seed % 3)
    plan = plan_pruning(model, T, **options)
    small = prune_model(model, T, **options)
    assert small.pruning_plan.steps == plan.steps
    assert_well_formed(plan, small)
    names = {step.name for step in plan.steps}
    assert {node.name for node in model_graph(model).nodes} <= names  # every node has a step
    assert_same_outputs(small, model, rng.normal(size=(3,) + shape).astype("float32"))
