"""State between the pieces: a budget's run resumed, stopped early or steered by hand ends where it should.

Each training here is deterministic (no shuffling, no dropout), so a training
interrupted and resumed from what a checkpoint saved must end with the weights,
the zeros and the strength of the uninterrupted one.
"""

import warnings

import keras
import numpy as np
import pytest

from keras_group_lasso import Proximal, SparsityBudget, add_group_sparsity, sparsity_report
from keras_group_lasso.declared import BUDGET_VARIABLES, declared_penalties

EPOCHS = 10
SETTLE = 0.3  # the search is epochs 0-6, settling 7-9


class Interrupt(Exception):
    pass


def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 12)).astype("float32")
    y = (x[:, :3].sum(axis=1) > 0).astype("float32")
    return x, y


def build(kind="add_group_sparsity"):
    keras.utils.set_random_seed(0)
    if kind == "add_group_sparsity":
        model = add_group_sparsity(keras.Sequential([keras.Input((12,)), keras.layers.Dense(8, activation="relu"),
                                                     keras.layers.Dense(1, activation="sigmoid")]), 2e-3)
    elif kind == "batch normalization":  # penalties too weak to select: the cut does it, then the statistics renew
        model = add_group_sparsity(keras.Sequential([
            keras.Input((12,)), keras.layers.Dense(8), keras.layers.BatchNormalization(), keras.layers.ReLU(),
            keras.layers.Dense(1, activation="sigmoid")]), 1e-6)
    else:  # the plain way: penalties on the layers of a functional model
        from keras_group_lasso import SparseGroupLasso

        inputs = keras.Input((12,))
        hidden = keras.layers.Dense(8, activation="relu", kernel_regularizer=SparseGroupLasso(2e-3))(inputs)
        outputs = keras.layers.Dense(1, activation="sigmoid", kernel_regularizer=SparseGroupLasso(2e-3))(hidden)
        model = keras.Model(inputs, outputs)
    model.compile(Proximal(keras.optimizers.SGD(0.1, momentum=0.9)), "binary_crossentropy")
    return model


VARIANTS = {"default": {}, "update_freq=2": {"update_freq": 2},
            "round_to=4, spare_block": {"round_to": 4, "spare_block": True, "max_units": 5}}


def budget(variant="default"):
    return SparsityBudget(max_features=4, settle=SETTLE, **VARIANTS[variant])


def train(model, callbacks, initial_epoch=0):
    x, y = data()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model.fit(x, y, epochs=EPOCHS, batch_size=64, shuffle=False, verbose=0, callbacks=callbacks,
                         initial_epoch=initial_epoch)


def stop_at(epoch):
    def raise_at(index, logs=None):
        if index == epoch:
            raise Interrupt(epoch)

    return keras.callbacks.LambdaCallback(on_epoch_begin=raise_at)


def outcome(model):
    weights = [np.asarray(w) for w in model.get_weights()]
    return weights, declared_penalties(model).multiplier_values()


def assert_same(got, want):
    (weights, multiplier), (ref_weights, ref_multiplier) = got, want
    assert multiplier == pytest.approx(ref_multiplier, rel=1e-6, abs=1e-7)
    for a, b in zip(weights, ref_weights):
        np.testing.assert_array_equal(a == 0.0, b == 0.0)
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)


_UNINTERRUPTED = {}


def uninterrupted(kind="add_group_sparsity", variant="default"):
    """The outcome of the training without an interruption (trained once per kind and budget)."""
    if (kind, variant) not in _UNINTERRUPTED:
        model = build(kind)
        train(model, [budget(variant)])
        assert sparsity_report(model).n_selected_features <= 4
        _UNINTERRUPTED[kind, variant] = outcome(model)
    return _UNINTERRUPTED[kind, variant]


@pytest.mark.turns  # 12 cases: each backend resumes 4 of them (the other resume tests run on every backend)
@pytest.mark.parametrize("interrupt", [3, 8], ids=["searching", "settling"])
@pytest.mark.parametrize("budget_first", [True, False], ids=["budget first", "backup first"])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_backup_and_restore_resumes_a_budget_exactly(tmp_path, interrupt, budget_first, variant):
    def callbacks(*extra):
        backup = keras.callbacks.BackupAndRestore(str(tmp_path / "backup"))
        ordered = [budget(variant), backup] if budget_first else [backup, budget(variant)]
        return ordered + list(extra)

    with pytest.raises(Interrupt):
        train(build(), callbacks(stop_at(interrupt)))
    resumed = build()  # a new process would build the model again: nothing survives but the backup
    train(resumed, callbacks())
    assert_same(outcome(resumed), uninterrupted(variant=variant))


def test_backup_and_restore_resumes_a_budget_on_a_plain_functional_model(tmp_path):
    def callbacks(*extra):
        return [keras.callbacks.BackupAndRestore(str(tmp_path / "backup")), budget(), *extra]

    with pytest.raises(Interrupt):
        train(build("functional"), callbacks(stop_at(8)))
    resumed = build("functional")
    train(resumed, callbacks())
    assert_same(outcome(resumed), uninterrupted("functional"))


@pytest.mark.parametrize("budget_first", [True, False], ids=["budget first", "backup first"])
def test_a_training_resumed_after_a_cut_renews_batch_normalization_as_the_uninterrupted_one(tmp_path, budget_first):
    def callbacks(*extra):
        backup = keras.callbacks.BackupAndRestore(str(tmp_path / "backup"))
        return ([budget(), backup] if budget_first else [backup, budget()]) + list(extra)

    want = uninterrupted("batch normalization")
    with pytest.raises(Interrupt):
        train(build("batch normalization"), callbacks(stop_at(8)))
    resumed = build("batch normalization")
    history = train(resumed, callbacks())
    assert resumed.layers[1].momentum == 0.99  # fit ends with the layer's own momentum
    assert_same(outcome(resumed), want)  # the moving statistics among the weights
    assert history.history["budget_phase"][-1] == 2  # settled after a cut


@pytest.mark.parametrize("interrupt", [3, 8], ids=["searching", "settling"])
@pytest.mark.parametrize("budget_first", [True, False], ids=["budget first", "checkpoint first"])
def test_a_checkpoint_loaded_with_load_model_resumes_a_budget_exactly(tmp_path, interrupt, budget_first):
    path = str(tmp_path / "epoch{epoch:02d}.keras")
    checkpoint = keras.callbacks.ModelCheckpoint(path, save_freq="epoch")
    callbacks = [budget(), checkpoint] if budget_first else [checkpoint, budget()]
    with pytest.raises(Interrupt):
        train(build(), callbacks + [stop_at(interrupt)])
    resumed = keras.saving.load_model(str(tmp_path / f"epoch{interrupt:02d}.keras"))
    train(resumed, [budget()], initial_epoch=interrupt)
    assert_same(outcome(resumed), uninterrupted())


def test_early_stopping_that_restores_earlier_weights_still_ends_within_the_budget():
    model = build()
    # "Best" is the epoch with the most features: the first, before the budget removed any.
    stop = keras.callbacks.EarlyStopping(monitor="budget_features", mode="max", patience=100,
                                         restore_best_weights=True)
    with pytest.warns(RuntimeWarning, match="a callback after it gave the model weights over its budget"):
        x, y = data()
        model.fit(x, y, epochs=EPOCHS, batch_size=64, shuffle=False, verbose=0,
                  callbacks=[SparsityBudget(max_features=2, settle=SETTLE), stop])
    assert stop.best_epoch == 0
    assert sparsity_report(model).n_selected_features <= 2
    assert "on_train_end" not in vars(model.history)  # the check ran once, after every callback


def test_assigning_the_multiplier_directly_reaches_the_proximal_step():
    x, y = data()
    model, reference = build(), build()
    model.penalty_multiplier.assign(np.zeros(2, "float32"))  # no strength: Proximal must not shrink anything
    for layer in reference.layers:  # the same as penalties of strength 0
        layer.kernel_regularizer.factor = layer.kernel_regularizer.l1 = 0.0
        layer.bias_regularizer.factor = layer.bias_regularizer.l1 = 0.0
    for each in (model, reference):
        each.fit(x, y, epochs=3, batch_size=64, shuffle=False, verbose=0)
    for a, b in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)
    # And a strength set in the middle of training reaches the next step.
    model.penalty_multiplier.assign(np.full(2, 50.0, "float32"))
    model.fit(x, y, epochs=1, batch_size=64, shuffle=False, verbose=0)
    assert sparsity_report(model).n_selected_features < 12


def test_add_group_sparsity_says_which_regularizers_it_replaces_and_refuses_a_model_with_nothing_to_penalise():
    from keras_group_lasso import InvalidParameterError

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, kernel_regularizer="l2", name="a"),
                              keras.layers.Dense(1, name="b")])
    with pytest.warns(UserWarning, match=r"replace the regularizers these layers had: a\.kernel_regularizer \(L2\)"):
        add_group_sparsity(model, 1e-3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        add_group_sparsity(keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)]), 1e-3)  # nothing replaced
    assert not [w for w in caught if "replace the regularizers" in str(w.message)]
    nothing = keras.Sequential([keras.Input((4,)), keras.layers.Activation("relu")])
    with pytest.raises(InvalidParameterError, match="add_group_sparsity: argument `model` must be a model with at "
                                                    "least one Dense or convolution layer"):
        add_group_sparsity(nothing, 1e-3)


def test_a_count_budget_of_zero_is_refused_and_one_above_the_model_says_so():
    from keras_group_lasso import InvalidParameterError

    for kwargs in ({"max_features": 0}, {"max_units": 0}):
        with pytest.raises(InvalidParameterError, match="must be an int >= 1"):
            SparsityBudget(**kwargs)
    model = build()
    x, y = data()
    with pytest.warns(RuntimeWarning, match=r"max_features=1000 \(the model has 12\): the dense model is within it"):
        model.fit(x, y, epochs=2, verbose=0, callbacks=[SparsityBudget(max_features=1000)])


def test_a_budget_on_a_plain_sequential_model_and_what_a_plain_model_saves(tmp_path):
    from keras_group_lasso import InvalidParameterError, SparseGroupLasso

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((12,)),
                              keras.layers.Dense(8, activation="relu", kernel_regularizer=SparseGroupLasso(2e-3)),
                              keras.layers.Dense(1, activation="sigmoid", kernel_regularizer=SparseGroupLasso(2e-3))])
    model.compile(Proximal(keras.optimizers.SGD(0.1, momentum=0.9)), "binary_crossentropy")
    if keras.backend.backend() == "jax":
        with pytest.raises(InvalidParameterError, match="SparsityBudget: argument `model` must be a Functional model "
                                                        "or one made by add_group_sparsity, on the JAX backend"):
            train(model, [budget()])
        model = build("functional")
    train(model, [budget()])
    assert sparsity_report(model).n_selected_features <= 4
    # Only on JAX a (functional) model counts the state's variables (the multiplier, the budget's ten) among its
    # weights: JAX needs them there.
    assert len(model.get_weights()) == (4 + 1 + len(BUDGET_VARIABLES) if keras.backend.backend() == "jax" else 4)
    assert len(add_group_sparsity(model, 1e-3).get_weights()) == 4  # a copy takes the layers' weights
    # A plain model read back by load_model knows nothing of the state: the same layers and outputs.
    path = str(tmp_path / "plain.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    x, _ = data()
    np.testing.assert_allclose(np.asarray(loaded.predict(x, verbose=0)), np.asarray(model.predict(x, verbose=0)),
                               atol=1e-6)


def test_a_budget_that_cannot_be_met_says_so_and_does_its_best():
    model = build()
    x, y = data()
    with pytest.warns(RuntimeWarning, match=r"the budget cannot be met: with every group it may cut set to zero .* "
                                            r"the model has params \d+ \(budget 1\)"):
        model.fit(x, y, epochs=3, verbose=0, callbacks=[SparsityBudget(max_params=1)])
    report = sparsity_report(model)
    assert report.n_selected_features == 1 and report.live_neurons == 1  # the strongest group of each layer


def test_a_feature_budget_cuts_input_features_that_a_residual_stream_carries():
    """Input features added into a residual stream are coupled groups: still input groups for the budget."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(6)(inputs)
    outputs = keras.layers.Dense(2)(keras.layers.Add()([inputs, hidden]))
    model = add_group_sparsity(keras.Model(inputs, outputs), 1e-3)
    model.compile(Proximal(keras.optimizers.SGD(0.05)), "mse")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 6)).astype("float32")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(x, x[:, :2] * 2.0, epochs=3, verbose=0, callbacks=[SparsityBudget(max_features=3)])
    assert not [w for w in caught if "cannot be met" in str(w.message)]
    assert sparsity_report(model).n_selected_features <= 3


def test_the_penalties_state_is_no_parameter():
    plain = keras.Sequential([keras.Input((12,)), keras.layers.Dense(8), keras.layers.Dense(1)])
    inputs = keras.Input((12,))
    functional = keras.Model(inputs, keras.layers.Dense(1)(keras.layers.Dense(8)(inputs)))
    for model in (plain, functional):
        sparse = add_group_sparsity(model, 1e-3)
        assert sparse.count_params() == model.count_params() == 12 * 8 + 8 + 8 + 1
        assert len(sparse.get_weights()) == len(model.get_weights()) == 4
