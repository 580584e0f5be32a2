import subprocess
import sys
import textwrap

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
)
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


def test_bad_arguments():
    with pytest.raises(InvalidParameterError, match=r"add_group_sparsity: argument `factor` must be a finite number >= 0; received -1\.0\."):
        add_group_sparsity(sequential(), -1)
    with pytest.raises(InvalidParameterError, match=r"argument `penalty` must be one of 'sgl', 'group'; received 'l3'\."):
        add_group_sparsity(sequential(), penalty="l3")
    with pytest.raises(InvalidParameterError, match=r"argument `bias` must be True or False; received 1\."):
        add_group_sparsity(sequential(), bias=1)

    class Subclassed(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(2)

        def call(self, x):
            return self.dense(x)

    with pytest.raises(InvalidParameterError, match=r"argument `model` must be a Sequential or Functional keras.Model"):
        add_group_sparsity(Subclassed())
    with pytest.raises(InvalidParameterError, match=r"a built model with a known input"):
        add_group_sparsity(keras.Sequential([keras.layers.Dense(2)]))


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
