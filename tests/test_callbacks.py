"""SparsityMonitor: epoch logs, TensorBoard summaries read back from the event files, errors."""

import csv
import glob
import json
import math
import os
import sys
import warnings

import keras
import numpy as np
import pytest

from keras_group_lasso import InvalidParameterError, SparsityMonitor, is_chief
from keras_group_lasso.analysis import input_feature_strength, layer_group_norms, sparsity_report
from keras_group_lasso.callbacks import feature_strength_image

THRESHOLD = 1e-3


def _known_model(n_features=16, input_shape=None, seed=0):
    """n_features -> 5 -> 3 -> 2 with a known sparsity pattern.

    Features 0..3 have all-zero outgoing rows (12 selected); hidden unit 4 of
    the first layer and unit 2 of the second have all-zero outgoing rows
    (4 + 2 = 6 live neurons). Every other weight is at least 0.1 in magnitude.
    """
    rng = np.random.default_rng(seed)

    def big(*shape):
        return (rng.uniform(0.1, 1.0, shape) * rng.choice([-1.0, 1.0], shape)).astype("float32")

    layers = [keras.Input(input_shape or (n_features,))]
    if input_shape is not None and len(input_shape) > 1:
        layers.append(keras.layers.Flatten())
    layers += [
        keras.layers.Dense(5, activation="relu", name="hidden_1"),
        keras.layers.Dense(3, activation="relu", name="hidden_2"),
        keras.layers.Dense(2, name="output"),
    ]
    model = keras.Sequential(layers)
    w1, w2, w3 = big(n_features, 5), big(5, 3), big(3, 2)
    w1[:4] = 0.0
    w2[4] = 0.0
    w3[2] = 0.0
    model.get_layer("hidden_1").set_weights([w1, big(5)])
    model.get_layer("hidden_2").set_weights([w2, big(3)])
    model.get_layer("output").set_weights([w3, big(2)])
    # Learning rate 0: the weights (and so every reported number) stay fixed.
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.0), loss="mse")
    return model


def _data(model, n=32):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(n,) + tuple(model.inputs[0].shape[1:])).astype("float32")
    y = rng.normal(size=(n, 2)).astype("float32")
    return x, y


class _Recorder(keras.callbacks.Callback):
    """Copies the logs it sees, to check what callbacks placed after the monitor receive."""

    def __init__(self):
        super().__init__()
        self.seen = {}

    def on_epoch_end(self, epoch, logs=None):
        self.seen[epoch] = dict(logs or {})


# ----------------------------------------------------------------------------- arguments


@pytest.mark.quick
@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            {"threshold": -1e-3},
            "SparsityMonitor: argument `threshold` must be a finite number >= 0; received -0.001.",
        ),
        (
            {"threshold": "1e-3"},
            "SparsityMonitor: argument `threshold` must be a finite number >= 0; received '1e-3'.",
        ),
        ({"every": 0}, "SparsityMonitor: argument `every` must be an integer >= 1; received 0."),
        ({"every": 1.5}, "SparsityMonitor: argument `every` must be an integer >= 1; received 1.5."),
        ({"every": True}, "SparsityMonitor: argument `every` must be an integer >= 1; received True."),
        (
            {"log_dir": 3},
            "SparsityMonitor: argument `log_dir` must be a non-empty path (str or os.PathLike) "
            "or None; received 3.",
        ),
        (
            {"log_dir": ""},
            "SparsityMonitor: argument `log_dir` must be a non-empty path (str or os.PathLike) "
            "or None; received ''.",
        ),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(InvalidParameterError) as info:
        SparsityMonitor(**kwargs)
    assert str(info.value) == message


def test_log_dir_that_is_an_existing_file_is_refused_at_construction(tmp_path):
    taken = tmp_path / "events"
    taken.write_text("not a directory")
    with pytest.raises(InvalidParameterError) as info:
        SparsityMonitor(log_dir=taken)
    assert str(info.value) == (
        "SparsityMonitor: argument `log_dir` must be a directory for the TensorBoard event files, "
        f"not an existing file; received {str(taken)!r}."
    )
    with pytest.raises(InvalidParameterError) as info:
        SparsityMonitor(log_dir=str(taken / "run1"))
    assert str(info.value) == (
        f"SparsityMonitor: argument `log_dir` must be a directory that can be created ({str(taken)!r} "
        f"is a file); received {str(taken / 'run1')!r}."
    )


def test_log_dir_in_a_read_only_directory_is_refused_at_construction(tmp_path, monkeypatch):
    from keras_group_lasso import callbacks

    readonly = tmp_path / "readonly"
    readonly.mkdir()
    # Root may write anywhere, so the permission check itself is what is replaced here.
    monkeypatch.setattr(callbacks.os, "access", lambda path, mode: os.path.abspath(path) != str(readonly))
    with pytest.raises(InvalidParameterError) as info:
        SparsityMonitor(log_dir=str(readonly / "logs" / "run1"))
    assert str(info.value) == (
        f"SparsityMonitor: argument `log_dir` must be a writable directory ({str(readonly)!r} is not "
        f"writable); received {str(readonly / 'logs' / 'run1')!r}."
    )
    monkeypatch.undo()
    assert SparsityMonitor(log_dir=str(readonly / "logs" / "run1")).log_dir == str(readonly / "logs" / "run1")
    assert not (readonly / "logs").exists()  # checked, not created
    assert SparsityMonitor(log_dir="gs://bucket/logs").log_dir == "gs://bucket/logs"  # TensorFlow's to check


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root may write into any directory")
def test_log_dir_without_write_permission_is_refused(tmp_path):
    readonly = tmp_path / "readonly"
    readonly.mkdir()
    readonly.chmod(0o500)
    try:
        with pytest.raises(InvalidParameterError, match=r"must be a writable directory"):
            SparsityMonitor(log_dir=str(readonly / "run1"))
    finally:
        readonly.chmod(0o700)


def test_model_without_dense_layer_fails_at_train_begin():
    model = keras.Sequential(
        [keras.Input((6, 6, 1)), keras.layers.MaxPooling2D(), keras.layers.GlobalAveragePooling2D()]
    )
    monitor = SparsityMonitor()
    monitor.set_model(model)
    with pytest.raises(InvalidParameterError) as info:
        monitor.on_train_begin()
    assert str(info.value).startswith(
        "SparsityMonitor: argument `model` must be a keras.Model with at least one Dense or convolution "
        "layer (the layers whose sparsity it reports); received <Sequential"
    )


def test_sequential_without_input_is_checked_once_built():
    # On the TensorFlow backend such a model is built by its first step, after on_train_begin.
    model = keras.Sequential([keras.layers.Dense(3, activation="relu"), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    x = np.ones((8, 5), "float32")
    history = model.fit(x, x[:, :2], epochs=1, verbose=0, callbacks=[SparsityMonitor()])
    assert history.history["selected_features"] == [5]


def test_missing_tensorflow_is_a_clear_error(monkeypatch, tmp_path):
    # A None entry in sys.modules makes `import tensorflow` fail, as on a JAX-only install.
    monkeypatch.setitem(sys.modules, "tensorflow", None)
    with pytest.raises(ImportError, match=r"SparsityMonitor: writing TensorBoard summaries .* needs TensorFlow installed"):
        SparsityMonitor(log_dir=str(tmp_path))
    SparsityMonitor(log_dir=None)  # logs only: fine without TensorFlow


# ----------------------------------------------------------------------------- non-finite weights


def test_non_finite_weights_warn_once_and_log_nan_instead_of_counting_zeros(tmp_path):
    model = _known_model()
    x, y = _data(model)

    def diverge(epoch, logs):
        if epoch == 1:
            kernel = model.get_layer("hidden_2").kernel
            kernel.assign(np.full(kernel.shape, np.nan, "float32"))

    monitor = SparsityMonitor(threshold=THRESHOLD, log_dir=str(tmp_path / "logs"))
    recorder = _Recorder()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = model.fit(
            x,
            y,
            epochs=3,
            batch_size=32,
            verbose=0,
            # NaN written after the second epoch's steps, before the monitor reads the weights;
            # the third epoch then trains from it (its NaN gradient spreads to other weights).
            callbacks=[keras.callbacks.LambdaCallback(on_epoch_end=diverge), monitor, recorder],
        )
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert messages == [
        "SparsityMonitor: at the end of epoch 2 the weights are not finite (hidden_2/kernel): sparsity, "
        "selected_features, live_neurons and flops are NaN while they stay so. The training diverged: scale the "
        "inputs or lower the learning rate; keras.callbacks.TerminateOnNaN() stops such a training."
    ]
    assert history.history["selected_features"][0] == 12
    for key in ("sparsity", "selected_features", "live_neurons", "flops"):
        assert [math.isnan(v) for v in history.history[key]] == [False, True, True]
        assert math.isnan(recorder.seen[2][key])
    assert monitor.last_report is None


def test_an_attention_model_logs_its_heads_as_nan_in_an_epoch_that_is_not_finite():
    """Every epoch logs the same keys: ``live_heads`` too, NaN with the others (``History`` keeps the epochs
    aligned)."""
    inputs = keras.Input((4, 8))
    attended = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4, name="mha")(inputs, inputs)
    outputs = keras.layers.Dense(1, name="out")(keras.layers.GlobalAveragePooling1D()(attended))
    model = keras.Model(inputs, outputs)
    model.compile("sgd", "mse")
    x = np.random.default_rng(0).normal(size=(32, 4, 8)).astype("float32")

    def diverge(epoch, logs):
        if epoch == 1:
            kernel = model.get_layer("out").kernel
            kernel.assign(np.full(kernel.shape, np.nan, "float32"))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        history = model.fit(x, x[:, 0, :1], epochs=3, batch_size=16, verbose=0,
                            callbacks=[keras.callbacks.LambdaCallback(on_epoch_end=diverge),
                                       SparsityMonitor(log_dir=None)])
    assert history.history["live_heads"][0] == 2
    assert [math.isnan(v) for v in history.history["live_heads"]] == [False, True, True]


# ----------------------------------------------------------------------------- epoch logs


@pytest.mark.quick
def test_logs_history_and_csv_logger_see_the_values(tmp_path):
    model = _known_model()
    x, y = _data(model)
    recorder = _Recorder()
    csv_path = tmp_path / "log.csv"
    monitor = SparsityMonitor(threshold=THRESHOLD)
    history = model.fit(
        x,
        y,
        epochs=2,
        batch_size=16,
        verbose=0,
        callbacks=[monitor, recorder, keras.callbacks.CSVLogger(str(csv_path))],
    )
    report = sparsity_report(model, threshold=THRESHOLD)
    assert len(report.selected_features) == 12
    assert report.live_neurons == 6
    assert monitor.last_report == report
    for key, value in [
        ("sparsity", report.sparsity),
        ("selected_features", 12),
        ("live_neurons", 6),
        ("flops", report.flops_after / report.flops_before),
    ]:
        assert history.history[key] == [pytest.approx(value)] * 2
        assert all(recorder.seen[e][key] == pytest.approx(value) for e in (0, 1))
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2
    assert all(float(r["sparsity"]) == pytest.approx(report.sparsity) for r in rows)
    assert all(float(r["selected_features"]) == 12 for r in rows)
    assert all(float(r["live_neurons"]) == 6 for r in rows)


def test_every_logs_only_on_every_nth_epoch():
    model = _known_model()
    x, y = _data(model)
    recorder = _Recorder()
    history = model.fit(
        x, y, epochs=5, batch_size=32, verbose=0, callbacks=[SparsityMonitor(every=2), recorder]
    )
    logged = [e for e in range(5) if "sparsity" in recorder.seen[e]]
    assert logged == [1, 3]
    assert len(history.history["live_neurons"]) == 2
    assert len(history.history["loss"]) == 5


def test_threshold_changes_what_is_counted():
    model = _known_model()
    # Every non-zero weight is >= 0.1 in magnitude: a threshold of 2 zeroes them all.
    low, high = SparsityMonitor(threshold=0.0), SparsityMonitor(threshold=2.0)
    for monitor in (low, high):
        monitor.set_model(model)
        monitor.on_epoch_end(0, logs={})
    assert low.last_report.sparsity < 1.0
    assert high.last_report.sparsity == 1.0


# ----------------------------------------------------------------------------- TensorBoard


def _read_events(log_dir):
    """{tag: [(step, ndarray)]} from every event file under log_dir; "<plugins>": {tag: {plugin}}.

    Plugin names are recorded only in a tag's first event, so later ones read "".
    """
    from tensorboard.backend.event_processing import event_file_loader
    from tensorboard.util import tensor_util

    found, plugins = {}, {}
    files = sorted(glob.glob(f"{log_dir}/**/events.out.tfevents.*", recursive=True))
    for path in files:
        for event in event_file_loader.EventFileLoader(path).Load():
            for value in event.summary.value:
                found.setdefault(value.tag, []).append(
                    (event.step, tensor_util.make_ndarray(value.tensor))
                )
                plugins.setdefault(value.tag, set()).add(value.metadata.plugin_data.plugin_name)
    found["<plugins>"] = plugins
    return found


@pytest.mark.quick
def test_tensorboard_scalars_histograms_and_image(tmp_path):
    tf = pytest.importorskip("tensorflow", reason="TensorBoard writing needs TensorFlow")
    model = _known_model(n_features=16)
    x, y = _data(model)
    log_dir = tmp_path / "run"
    keras_tb = tmp_path / "keras_tb"
    model.fit(
        x,
        y,
        epochs=2,
        batch_size=32,
        verbose=0,
        callbacks=[
            SparsityMonitor(threshold=THRESHOLD, log_dir=log_dir),
            keras.callbacks.TensorBoard(str(keras_tb), write_graph=False, profile_batch=0),
        ],
    )
    report = sparsity_report(model, threshold=THRESHOLD)
    events = _read_events(log_dir)

    def scalar(tag):
        return [(step, float(value)) for step, value in events[tag]]

    assert scalar("sparsity/total") == [(0, pytest.approx(report.sparsity)), (1, pytest.approx(report.sparsity))]
    assert scalar("selected_features") == [(0, 12.0), (1, 12.0)]
    assert scalar("live_neurons") == [(0, 6.0), (1, 6.0)]
    assert scalar("flops/after") == [(0, float(report.flops_after)), (1, float(report.flops_after))]
    assert scalar("flops/ratio")[-1] == (1, pytest.approx(report.flops_ratio))
    assert report.flops_after < report.flops_before
    for layer in report.layers:
        assert scalar(f"sparsity/{layer.name}")[-1] == (1, pytest.approx(layer.sparsity))
        assert scalar(f"live_units/{layer.name}")[-1] == (1, float(layer.units_alive))
    assert scalar("live_units/hidden_1")[-1][1] == 4.0
    assert scalar("live_units/hidden_2")[-1][1] == 2.0

    plugins = events["<plugins>"]
    assert plugins["sparsity/total"] - {""} == {"scalars"}
    assert plugins["group_norms/hidden_1"] - {""} == {"histograms"}
    assert plugins["input_feature_strength"] - {""} == {"images"}

    # Histograms: buckets [left, right, count] covering every group norm exactly once.
    for name, norms in layer_group_norms(model).items():
        step, buckets = events[f"group_norms/{name}"][-1]
        assert step == 1
        assert buckets.shape[1] == 3
        assert buckets[:, 2].sum() == pytest.approx(len(norms))
        assert buckets[0, 0] == pytest.approx(norms.min(), abs=1e-6)
        assert buckets[-1, 1] == pytest.approx(norms.max(), abs=1e-6)

    # The image: [width, height, png] of the normalized, masked feature strengths.
    step, image = events["input_feature_strength"][-1]
    assert step == 1
    assert (int(image[0]), int(image[1])) == (4, 4)
    pixels = tf.io.decode_png(image[2]).numpy()
    assert pixels.shape == (4, 4, 1)
    expected = feature_strength_image(input_feature_strength(model), report.selected_features, (4, 4))
    np.testing.assert_allclose(pixels[..., 0] / 255.0, expected[0, ..., 0], atol=1 / 255 + 1e-6)
    assert (pixels.reshape(-1)[:4] == 0).all()  # the dropped features are blank
    assert pixels.max() == 255

    # A keras TensorBoard callback placed after the monitor logs its values too.
    keras_events = _read_events(keras_tb)
    assert [float(v) for _, v in keras_events["epoch_live_neurons"]] == [6.0, 6.0]


def test_tensorboard_image_for_image_input_and_none_for_other_lengths(tmp_path):
    tf = pytest.importorskip("tensorflow", reason="TensorBoard writing needs TensorFlow")
    image_model = _known_model(n_features=12, input_shape=(3, 4))
    flat_model = _known_model(n_features=6)
    for name, model in [("image", image_model), ("flat", flat_model)]:
        monitor = SparsityMonitor(log_dir=tmp_path / name)
        monitor.set_model(model)
        monitor.on_epoch_end(0, logs={})
        monitor.on_train_end()
    image_events = _read_events(tmp_path / "image")
    _, image = image_events["input_feature_strength"][0]
    assert (int(image[0]), int(image[1])) == (4, 3)  # width, height
    assert tf.io.decode_png(image[2]).numpy().shape == (3, 4, 1)
    flat_events = _read_events(tmp_path / "flat")
    assert "input_feature_strength" not in flat_events
    assert "sparsity/total" in flat_events


# ----------------------------------------------------------------------------- image helpers


@pytest.mark.parametrize(
    "task, cluster, chief",
    [
        ({"type": "worker", "index": 0}, {"worker": ["a:1", "b:1"]}, True),
        ({"type": "worker", "index": 1}, {"worker": ["a:1", "b:1"]}, False),
        ({"type": "chief", "index": 0}, {"chief": ["a:1"], "worker": ["b:1"]}, True),
        ({"type": "worker", "index": 0}, {"chief": ["a:1"], "worker": ["b:1"]}, False),
        ({"type": "evaluator", "index": 0}, {"worker": ["a:1"]}, False),
    ],
)
def test_is_chief_reads_the_tf_config_cluster(monkeypatch, task, cluster, chief):
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": task}))
    assert is_chief() is chief


def test_is_chief_without_a_cluster(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert is_chief() is True


def test_only_the_chief_writes_tensorboard_every_process_logs(tmp_path, monkeypatch):
    pytest.importorskip("tensorflow", reason="TensorBoard writing needs TensorFlow")
    model = _known_model(n_features=16)
    x, y = _data(model)
    cluster = {"worker": ["localhost:1", "localhost:2"]}
    histories = {}
    for index in (1, 0):
        monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}}))
        log_dir = tmp_path / f"worker{index}"
        history = model.fit(x, y, epochs=2, batch_size=32, verbose=0,
                            callbacks=[SparsityMonitor(threshold=THRESHOLD, log_dir=log_dir)])
        histories[index] = history.history["sparsity"]
    assert not (tmp_path / "worker1").exists() or not os.listdir(tmp_path / "worker1")
    assert len(glob.glob(str(tmp_path / "worker0" / "events.out.tfevents.*"))) == 1
    assert len(histories[1]) == len(histories[0]) == 2


def test_feature_strength_image_matches_numpy_reference():
    rng = np.random.default_rng(0)
    strength = rng.uniform(0, 2, 2 * 3 * 2)
    selected = [1, 2, 5, 6, 7, 11]
    image = feature_strength_image(strength, selected, (2, 3, 2))
    masked = np.zeros_like(strength)
    masked[selected] = strength[selected]
    merged = np.sqrt((masked.reshape(2, 3, 2) ** 2).sum(-1))
    assert image.shape == (1, 2, 3, 1) and image.dtype == np.float32
    np.testing.assert_allclose(image[0, :, :, 0], merged / merged.max(), rtol=1e-6)
    assert feature_strength_image(np.zeros(4), [], (2, 2)).max() == 0.0


def test_monitor_reports_live_channels_and_flops_of_a_cnn(tmp_path):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(4, 3, padding="same", name="conv"),
        keras.layers.BatchNormalization(),
        keras.layers.ReLU(),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(2, name="out"),
    ])
    head = model.get_layer("out")
    kernel, bias = head.get_weights()
    kernel[[0, 2]] = 0.0  # channels 0 and 2 reach nothing
    head.set_weights([kernel, bias])
    model.compile(keras.optimizers.SGD(0.0), "mse")  # the weights stay as set
    monitor = SparsityMonitor(threshold=THRESHOLD, log_dir=str(tmp_path / "cnn"))
    x = np.random.default_rng(0).normal(size=(8, 8, 8, 1)).astype("float32")
    history = model.fit(x, np.zeros((8, 2)), epochs=1, verbose=0, callbacks=[monitor])
    assert history.history["live_neurons"] == [2]
    assert history.history["flops"] == [pytest.approx((64 * 9 * 2 + 2 * 2) / (64 * 9 * 4 + 4 * 2))]
    events = _read_events(str(tmp_path / "cnn"))
    assert [float(v) for _, v in events["live_units/conv"]] == [2.0]
