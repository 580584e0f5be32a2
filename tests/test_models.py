import re
import subprocess
import sys
import textwrap
import warnings

import keras
import numpy as np
import pytest

from keras_group_lasso import (
    GroupLasso,
    HiddenGroupLasso,
    InputGroupLasso,
    InvalidParameterError,
    SparseGroupLasso,
    add_group_sparsity,
    prune_model,
    sparsity_report,
)
from keras_group_lasso.analysis import dense_roles, get_layer
from keras_group_lasso.models import input_dense_layers

requires_tensorflow_backend = pytest.mark.skipif(
    keras.backend.backend() != "tensorflow", reason="tf.distribute needs the TensorFlow backend"
)


def sequential():
    return keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(6, activation="relu", kernel_regularizer="l2"),
            keras.layers.Dropout(0.2),
            keras.layers.Dense(5, activation="relu"),
            keras.layers.Dense(3, activation="softmax", use_bias=False),
        ]
    )


@pytest.mark.quick
def test_sequential_gets_input_and_hidden_groups(rng):
    model = sequential()
    before = [w.copy() for w in model.get_weights()]
    sparse = add_group_sparsity(model, 1e-2)
    dense = [l for l in sparse.layers if isinstance(l, keras.layers.Dense)]
    assert dense[0].kernel_regularizer == InputGroupLasso(1e-2, l1=1e-2)
    assert dense[1].kernel_regularizer == HiddenGroupLasso(1e-2, l1=1e-2)
    assert dense[2].kernel_regularizer == HiddenGroupLasso(1e-2, l1=1e-2)
    assert dense[0].bias_regularizer == SparseGroupLasso(1e-2)
    assert dense[2].bias_regularizer is None  # no bias
    # the original is untouched and the weights were copied
    assert isinstance(model.layers[0].kernel_regularizer, keras.regularizers.L2)
    assert model.layers[2].kernel_regularizer is None
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)
    x = rng.random((4, 8)).astype("float32")
    np.testing.assert_allclose(sparse.predict(x, verbose=0), model.predict(x, verbose=0), atol=1e-6)
    assert sparse is not model


def test_options_group_penalty_input_factor_no_bias():
    sparse = add_group_sparsity(sequential(), 1e-3, penalty="group", input_factor=1e-2, bias=False)
    dense = [l for l in sparse.layers if isinstance(l, keras.layers.Dense)]
    assert dense[0].kernel_regularizer == InputGroupLasso(1e-2)
    assert dense[1].kernel_regularizer == HiddenGroupLasso(1e-3)
    assert all(l.bias_regularizer is None for l in dense)
    sgl = add_group_sparsity(sequential(), 1e-3, l1=5e-4)
    assert sgl.layers[0].kernel_regularizer == InputGroupLasso(1e-3, l1=5e-4)
    grp = add_group_sparsity(sequential(), 1e-3, penalty="group")
    assert grp.layers[0].bias_regularizer == GroupLasso(1e-3)


def small_cnn():
    return keras.Sequential([
        keras.Input((10, 10, 2)),
        keras.layers.Conv2D(4, 3, padding="same", name="conv1"), keras.layers.BatchNormalization(),
        keras.layers.ReLU(), keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(6, 3, padding="valid", name="conv2"), keras.layers.ReLU(),
        keras.layers.Flatten(), keras.layers.Dense(7, activation="relu", name="dense"), keras.layers.Dense(3, name="out"),
    ])


def test_flop_group_weights_are_the_cost_of_each_unit():
    model = small_cnn()
    sparse = add_group_sparsity(model, 1e-3, input_factor=2e-3, penalty="group", group_weight="flops")
    # Multiply-adds per sample of each layer: conv1 10x10 positions, conv2 3x3 (a 5x5 map, valid), dense 9 positions.
    macs = {"conv1": 100 * 9 * 2 * 4, "conv2": 9 * 9 * 4 * 6, "dense": 9 * 6 * 7, "out": 7 * 3}
    # A group is one unit that a layer reads: its cost is making it (producer MACs / its units) + reading it.
    cost = {
        "conv1": macs["conv1"] / 2,  # an input channel: read only
        "conv2": macs["conv1"] / 4 + macs["conv2"] / 4,
        "dense": macs["conv2"] / 6 + macs["dense"] / 6,
        "out": macs["dense"] / 7 + macs["out"] / 7,
    }
    groups = {"conv1": 2, "conv2": 4, "dense": 6, "out": 7}
    root = {"conv1": np.sqrt(9 * 4), "conv2": np.sqrt(9 * 6), "dense": np.sqrt(9 * 7), "out": np.sqrt(3)}
    n = sum(groups.values())
    mean_cost = sum(cost[k] * groups[k] for k in groups) / n
    mean_root = sum(root[k] * groups[k] for k in groups) / n
    for name, strength in (("conv1", 2e-3), ("conv2", 1e-3), ("dense", 1e-3), ("out", 1e-3)):
        penalty = sparse.get_layer(name).kernel_regularizer
        # The group weight sqrt(|g|) the penalty applies becomes cost / mean cost * mean sqrt(|g|).
        np.testing.assert_allclose(penalty.factor * root[name], strength * cost[name] / mean_cost * mean_root,
                                   rtol=1e-6)
        assert sparse.get_layer(name).bias_regularizer == GroupLasso(1e-3)  # bias groups keep `factor`
    # The size weighting (default) keeps the paper's sqrt(|g|).
    assert add_group_sparsity(model, 1e-3, penalty="group").get_layer("conv2").kernel_regularizer == HiddenGroupLasso(1e-3)
    # The penalty value is the flop-weighted sum of group norms.
    value = sum(float(loss) for loss in sparse.losses)
    want = 0.0
    for name, strength in (("conv1", 2e-3), ("conv2", 1e-3), ("dense", 1e-3), ("out", 1e-3)):
        layer = sparse.get_layer(name)
        kernel = keras.ops.convert_to_numpy(layer.kernel)
        rows = kernel.reshape(-1, *kernel.shape[-2:]) if kernel.ndim > 2 else kernel[None]
        if name == "dense":
            rows = kernel.reshape(9, 6, 7)
        norms = np.sqrt((rows ** 2).sum(axis=(0, 2)))
        want += strength * cost[name] / mean_cost * mean_root * norms.sum()
        want += 1e-3 * np.sqrt(layer.bias.shape[0]) * np.linalg.norm(keras.ops.convert_to_numpy(layer.bias))
    np.testing.assert_allclose(value, want, rtol=1e-4)


def test_flop_weights_of_coupled_groups_follow_their_cost():
    inputs = keras.Input((6, 6, 3))
    wide = keras.layers.Conv2D(3, 3, padding="same", name="wide")(inputs)  # 36 positions
    stream = keras.layers.Add(name="add")([inputs, wide])
    pooled = keras.layers.MaxPooling2D(name="pool")(stream)
    narrow = keras.layers.Conv2D(5, 1, name="narrow")(pooled)  # 9 positions
    out = keras.layers.Dense(2, name="out")(keras.layers.GlobalAveragePooling2D()(narrow))
    model = keras.Model(inputs, out)
    sparse = add_group_sparsity(model, 1e-3, group_weight="flops")
    config = sparse.get_layer("wide").kernel_regularizer.get_config()
    # The three input channels are one stream read by "wide" and "narrow": one coupled group each.
    assert config["coupled"] == [0, 1, 2]
    cost_stream = 36 * 9 * 3 * 3 / 3 + 36 * 9 * 3 * 3 / 3 + 9 * 3 * 5 / 3  # made by wide, read by wide and narrow
    cost_narrow = 9 * 3 * 5 / 5 + 5 * 2 / 5  # a unit of "narrow", read by "out"
    mean_cost = (3 * cost_stream + 5 * cost_narrow) / 8
    mean_root = (3 * np.sqrt(9 * 3 + 5) + 5 * np.sqrt(2)) / 8
    np.testing.assert_allclose(config["scales"], [1e-3 * cost_stream / mean_cost * mean_root] * 3, rtol=1e-6)
    np.testing.assert_allclose(sparse.get_layer("out").kernel_regularizer.factor * np.sqrt(2),
                               1e-3 * cost_narrow / mean_cost * mean_root, rtol=1e-6)


def test_dict_inputs_and_outputs_keep_their_structure(rng):
    inputs = keras.Input((4,), name="x")
    hidden = keras.layers.Dense(3, name="h")(inputs)
    model = keras.Model({"x": inputs}, {"a": keras.layers.Dense(2, name="a")(hidden),
                                        "b": keras.layers.Dense(1, name="b")(hidden)})
    sparse = add_group_sparsity(model, 1e-3)
    x = {"x": rng.normal(size=(3, 4)).astype("float32")}
    got, want = sparse(x), model(x)
    assert isinstance(got, dict) and sorted(got) == ["a", "b"]
    for key in want:
        np.testing.assert_allclose(keras.ops.convert_to_numpy(got[key]), keras.ops.convert_to_numpy(want[key]),
                                   atol=1e-6)


def test_inputs_keep_their_names_in_the_copy_and_the_pruned_model(rng):
    # an unnamed input is named by its layer (input_layer_N), not by its symbolic tensor (keras_tensor_N)
    unnamed, named = keras.Input((4,)), keras.Input((3,), name="extra")
    hidden = keras.layers.Dense(5, name="h")(keras.layers.Concatenate()([unnamed, named]))
    model = keras.Model([unnamed, named], keras.layers.Dense(2, name="out")(hidden))
    names = [layer.name for layer in model.layers if isinstance(layer, keras.layers.InputLayer)]
    assert names[1] == "extra" and names[0].startswith("input_layer")
    sparse = add_group_sparsity(model, 1e-3)
    pruned = prune_model(sparse, 0.0)  # threshold 0: the same outputs
    for copy in (sparse, pruned):
        assert [layer.name for layer in copy.layers if isinstance(layer, keras.layers.InputLayer)] == names
    x = [rng.normal(size=(3, 4)).astype("float32"), rng.normal(size=(3, 3)).astype("float32")]
    np.testing.assert_allclose(keras.ops.convert_to_numpy(pruned(x)), keras.ops.convert_to_numpy(sparse(x)),
                               atol=1e-6)


def test_functional_branches_from_the_input_are_input_groups():
    inputs = keras.Input((6,))
    a = keras.layers.Dense(5, name="a")(inputs)
    b = keras.layers.Dense(4, name="b")(keras.layers.Dropout(0.1)(inputs))
    out = keras.layers.Dense(2, name="out")(keras.layers.Concatenate()([a, b]))
    model = keras.Model(inputs, out)
    assert input_dense_layers(model) == ["a", "b"]
    sparse = add_group_sparsity(model)
    assert sparse.get_layer("a").kernel_regularizer.role == "input"
    assert sparse.get_layer("b").kernel_regularizer.role == "input"
    assert sparse.get_layer("out").kernel_regularizer.role == "hidden"


@pytest.mark.quick
def test_bad_arguments():
    with pytest.raises(InvalidParameterError, match=r"add_group_sparsity: argument `factor` must be a finite number >= 0; received -1\.0\."):
        add_group_sparsity(sequential(), -1)
    with pytest.raises(InvalidParameterError, match=r"argument `penalty` must be one of 'sgl', 'group'; received 'l3'\."):
        add_group_sparsity(sequential(), penalty="l3")
    with pytest.raises(InvalidParameterError, match=r"argument `bias` must be True or False; received 1\."):
        add_group_sparsity(sequential(), bias=1)
    with pytest.raises(InvalidParameterError, match=r"argument `group_weight` must be one of 'size', 'flops', 'latency'; received 'macs'\."):
        add_group_sparsity(sequential(), group_weight="macs")

    class Subclassed(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(2)

        def call(self, x):
            return self.dense(x)

    with pytest.raises(InvalidParameterError, match=r"argument `model` must be a Sequential or Functional "
                                                    r"keras.Model, or a subclassed one built on data \(call it on a "
                                                    r"batch first\) whose call can be traced"):
        add_group_sparsity(Subclassed())
    with pytest.raises(InvalidParameterError, match=r"a built model with a known input"):
        add_group_sparsity(keras.Sequential([keras.layers.Dense(2)]))
    # what is no model at all (a builder that forgot its return) is named too, not an AttributeError
    for bad in (None, "model.keras", [keras.layers.Dense(3)]):
        with pytest.raises(InvalidParameterError, match=r"^add_group_sparsity: argument `model` must be a Sequential "
                           rf"or Functional keras.Model, .*; received {re.escape(repr(bad))}\.$"):
            add_group_sparsity(bad)
    # group Lasso has no elementwise term: a strength for one is refused, not dropped
    for bad in (1e-2, 0.0, -1, "x"):
        with pytest.raises(InvalidParameterError, match=r"^add_group_sparsity: argument `l1` must be None with "
                           r"penalty='group' \(group Lasso has no elementwise term; penalty='sgl' has\); received "):
            add_group_sparsity(sequential(), penalty="group", l1=bad)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the first layer's L2 is replaced: said elsewhere
        assert add_group_sparsity(sequential(), penalty="group", l1=None).layers[0].kernel_regularizer.l1 == 0.0
        # numpy's booleans are booleans, as for SparsityBudget's flags
        sparse = add_group_sparsity(sequential(), bias=np.False_)
    assert all(getattr(layer, "bias_regularizer", None) is None for layer in sparse.layers)
    one_layer = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    assert add_group_sparsity(one_layer, bias=np.True_).layers[0].bias_regularizer is not None


def test_a_subclassed_model_that_applies_a_preprocessor_of_its_own_keeps_it_in_its_copy_once(rng):
    """A model of the user's whose ``call`` runs ``self.preprocessor`` is no KerasHub Task: its traced copy runs that
    layer already, keeps no ``preprocessor`` beside it and says nothing of one."""

    class Net(keras.Model):
        def __init__(self):
            super().__init__()
            self.preprocessor = keras.layers.Rescaling(1 / 255.0)
            self.hidden = keras.layers.Dense(8, activation="relu")
            self.out = keras.layers.Dense(1)

        def call(self, x):
            return self.out(self.hidden(self.preprocessor(x)))

    model = Net()
    x = rng.uniform(0, 255, size=(4, 5)).astype("float32")
    model(x)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        copy = add_group_sparsity(model, 1e-3)
    assert not [w for w in caught if "preprocessor" in str(w.message)]
    assert getattr(copy, "preprocessor", None) is None
    np.testing.assert_allclose(keras.ops.convert_to_numpy(copy(x)), keras.ops.convert_to_numpy(model(x)),
                               rtol=1e-6, atol=1e-6)


DISTRIBUTED = textwrap.dedent(
    """
    import os
    os.environ["KERAS_BACKEND"] = "tensorflow"
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()])
    import keras, numpy as np
    from keras_group_lasso import SparseGroupLasso, InputGroupLasso

    def build():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([
            keras.Input((8,)),
            keras.layers.Dense(6, activation="relu", kernel_regularizer=InputGroupLasso(0.05, l1=0.05),
                               bias_regularizer=SparseGroupLasso(0.05)),
            keras.layers.Dense(3, kernel_regularizer=SparseGroupLasso(0.05)),
        ])
        model.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse")
        return model

    rng = np.random.default_rng(0)
    x = rng.random((16, 8)).astype("float32")
    y = rng.random((16, 3)).astype("float32")
    single = build()
    single_penalty = float(sum(single.losses))
    single.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    assert strategy.num_replicas_in_sync == 2
    with strategy.scope():
        mirrored = build()
    mirrored_penalty = float(sum(mirrored.losses))
    mirrored.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0)
    print("PENALTY", single_penalty, mirrored_penalty)
    diff = max(float(np.abs(a - b).max()) for a, b in zip(single.get_weights(), mirrored.get_weights()))
    print("MAXDIFF", diff)
    """
)


@requires_tensorflow_backend
def test_penalty_under_mirrored_strategy_matches_single_device(tmp_path):
    script = tmp_path / "mirrored.py"
    script.write_text(DISTRIBUTED)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines() if line.startswith(("PENALTY", "MAXDIFF")))
    single, mirrored = map(float, lines["PENALTY"].split())
    assert single > 0
    assert mirrored == pytest.approx(single, rel=1e-6)
    # three SGD steps on the full batch: a penalty counted once per replica would move the weights differently
    assert float(lines["MAXDIFF"]) < 1e-5


# ----------------------------------------------------------------------------- nested models


def _roles(model):
    """``{qualified Dense name: penalty role}`` of a model returned by add_group_sparsity."""
    out = {}
    for name in dense_roles(model):
        regularizer = get_layer(model, name).kernel_regularizer
        out[name] = regularizer.role if regularizer is not None else None
    return out


def _adapted_normalization(n, name="norm"):
    layer = keras.layers.Normalization(name=name)
    layer.adapt(np.random.default_rng(1).normal(5.0, 3.0, size=(64, n)).astype("float32"))
    return layer


def _assert_copy(model, sparse, x):
    assert sparse is not model
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(sparse(x, training=False)),
        keras.ops.convert_to_numpy(model(x, training=False)),
        rtol=1e-6,
        atol=1e-6,
    )


def test_nested_sequential_at_the_input_gets_input_and_hidden_groups(rng):
    # Before: the inner Dense layers stayed unpenalised and the outer output layer got input groups.
    block = keras.Sequential(
        [_adapted_normalization(8), keras.layers.Dense(6, activation="relu", name="a"), keras.layers.Dense(5, name="b")],
        name="block",
    )
    model = keras.Sequential([keras.Input((8,)), block, keras.layers.Dense(3, name="out")])
    before = [w.copy() for w in model.get_weights()]
    sparse = add_group_sparsity(model, 1e-2)
    assert _roles(sparse) == {"block/a": "input", "block/b": "hidden", "out": "hidden"}
    assert get_layer(sparse, "block/a").kernel_regularizer == InputGroupLasso(1e-2, l1=1e-2)
    assert get_layer(sparse, "block/b").bias_regularizer == SparseGroupLasso(1e-2, l1=1e-2)
    # the user's model, nested block included, is not changed
    assert sparse.get_layer("block") is not block
    assert all(layer.kernel_regularizer is None for layer in block.layers[1:])
    assert model.get_layer("out").kernel_regularizer is None
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)
    _assert_copy(model, sparse, rng.normal(5.0, 3.0, size=(4, 8)).astype("float32"))
    # the report reads the same roles
    assert {layer.name: layer.role for layer in sparsity_report(sparse).layers} == _roles(sparse)


def test_nested_functional_blocks_in_a_functional_model(rng):
    block_in = keras.Input((6,))
    x = keras.layers.Dense(5, activation="tanh", name="h")(block_in)
    hidden = keras.Model(block_in, keras.layers.Dropout(0.1, name="drop")(x), name="hidden_block")
    inputs = keras.Input((4, 3), name="image")
    x = keras.layers.Rescaling(1 / 255.0)(inputs)
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dense(6, activation="relu", name="first")(x)
    outputs = keras.layers.Dense(2, name="out")(hidden(x))
    model = keras.Model(inputs, outputs)
    sparse = add_group_sparsity(model, penalty="group", input_factor=1e-2)
    assert _roles(sparse) == {"first": "input", "hidden_block/h": "hidden", "out": "hidden"}
    assert get_layer(sparse, "first").kernel_regularizer == InputGroupLasso(1e-2)
    assert get_layer(sparse, "hidden_block/h").kernel_regularizer == HiddenGroupLasso(1e-3)
    assert {layer.name: layer.role for layer in sparsity_report(sparse).layers} == _roles(sparse)
    _assert_copy(model, sparse, rng.uniform(0, 255, size=(3, 4, 3)).astype("float32"))


def test_nested_model_that_cannot_be_read_is_refused_naming_it():
    shared = keras.Sequential([keras.layers.Dense(4, name="d")], name="inner")
    inputs = keras.Input((4,))
    twice = keras.Model(inputs, keras.layers.Dense(2)(shared(shared(inputs))))

    # (a subclassed block is traced: tests/test_traced_blocks.py)
    for model, inside in ((twice, "'inner/d' is inside 'inner' (Sequential)"),):
        before = [w.copy() for w in model.get_weights()]
        with pytest.raises(InvalidParameterError) as info:
            add_group_sparsity(model)
        assert str(info.value) == (
            "add_group_sparsity: argument `model` must be a model whose nested models are called once, on one input, "
            f"and whose blocks trace (the Dense layer {inside}, whose graph cannot be read); received {model!r}."
        )
        for a, b in zip(before, model.get_weights()):
            np.testing.assert_array_equal(a, b)


def test_one_definition_of_the_input_dense_layer():
    from keras_group_lasso import analysis, models

    assert models.input_dense_layers is analysis.input_dense_layers
    # Features pass through per-unit layers and preprocessing; a convolution makes new ones.
    conv = keras.Sequential(
        [keras.Input((5, 5, 1)), keras.layers.Conv2D(2, 3, name="c"), keras.layers.Flatten(), keras.layers.Dense(3, name="d")]
    )
    assert input_dense_layers(conv) == ["c"]  # the convolution reads the input (its channels)
    assert add_group_sparsity(conv).get_layer("d").kernel_regularizer.role == "hidden"
    through = keras.Sequential(
        [keras.Input((6,)), keras.layers.BatchNormalization(), keras.layers.GaussianNoise(0.1), keras.layers.Dense(3, name="d")]
    )
    assert input_dense_layers(through) == ["d"]


def test_models_the_package_builds_agree_with_the_one_definition(rng):
    # The demo and the scikit-learn estimators build their own chains of Dense layers; the roles
    # of the penalties they attach are the roles the graph reads.
    from keras_group_lasso import demo
    from keras_group_lasso.sklearn import GroupSparseMLPClassifier

    built = demo.build_model(6, 3, 1e-3, hidden=(5, 4))
    x = rng.normal(size=(30, 6)).astype("float32")
    fitted = GroupSparseMLPClassifier((5, 4), epochs=1, random_state=0).fit(x, np.arange(30) % 3)
    for model in (built, fitted.model_):
        roles = dense_roles(model)
        assert list(roles.values()) == ["input", "hidden", "hidden"]
        assert _roles(model) == roles
