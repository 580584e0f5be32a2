"""What a latency table checks: the shapes it was measured at, the values a table file holds, how it is saved.

The tables are built from dicts where the times do not matter (no timing), and measured once on a tiny CNN where
the shapes a measurement records do.
"""

import copy
import errno
import json
import math
import os
import re

import keras
import numpy as np
import pytest

from keras_group_lasso import (
    InvalidParameterError,
    LatencyTable,
    SparsityBudget,
    add_group_sparsity,
)

FILE = "LatencyTable: argument `path` must be a JSON file written by LatencyTable.save; received "


def tiny_cnn(size=8, strides=1, pool=2, name="tiny"):
    return keras.Sequential([keras.Input((size, size, 3)),
                             keras.layers.Conv2D(4, 3, strides=strides, padding="same", activation="relu",
                                                 name="conv"),
                             keras.layers.MaxPooling2D(pool, name="pool"),
                             keras.layers.Flatten(name="flat"),
                             keras.layers.Dense(2, name="logits")], name=name)


@pytest.fixture(scope="module")
def measured():
    keras.utils.set_random_seed(0)
    return LatencyTable.measure(tiny_cnn(8), batch_size=8, repeats=1, grid=(0.5,))


def hand_made():
    """A table of ``tiny_cnn()`` as a file holds it, with made-up times (nothing is timed)."""
    return {
        "format": "keras_group_lasso.LatencyTable/1", "model": "tiny",
        "layers": {"conv": [3, 4], "logits": [4, 2]},
        "backend": keras.backend.backend(), "device": "hand-made", "grid": [0.5, 1.0], "measure_seconds": 1.5,
        "positions": {"conv": 64}, "narrow_widths": {"conv": [3, 2], "logits": [2, 2]},
        "segments": {"conv": ["pool"], "logits": []},
        "batches": {"8": {
            "model": 1e-3, "rest": 6e-4, "scale": 1.0, "narrow": 7e-4, "rest_narrow": 5e-4, "call": 5e-4,
            "layers": {"conv": {"in": [3], "out": [1, 2, 4], "seconds": [[1e-4, 2e-4, 3e-4]]},
                       "logits": {"in": [1, 2, 4], "out": [2], "seconds": [[1e-5], [2e-5], [1e-4]]}},
        }},
    }


def changed(data, keys, value):
    """A deep copy of ``data`` with ``data[k0][k1]...`` set to ``value`` (removed for ``...``)."""
    data = copy.deepcopy(data)
    inner = data
    for key in keys[:-1]:
        inner = inner[key]
    if value is ...:
        del inner[keys[-1]]
    else:
        inner[keys[-1]] = value
    return data


def write(path, data):
    path.write_text(json.dumps(data), encoding="utf-8")  # json writes NaN and Infinity as such
    return path


# ----------------------------------------------------------------------------- 1. the shapes a table holds for


def test_a_table_measured_at_other_input_shapes_is_refused(measured, tmp_path):
    assert measured.input_shapes == ((8, 8, 3),)
    assert measured.layer_shapes == {"conv": ((8, 8, 3), (8, 8, 4)), "logits": ((64,), (2,))}
    assert measured.check_model(tiny_cnn(8)) is measured
    larger = tiny_cnn(16)  # the same layers and widths, 4x the positions
    with pytest.raises(InvalidParameterError, match=re.escape(
            "LatencyTable: argument `model` must be a model of the shapes this table was measured at (a layer's time "
            "grows with the positions it computes); received model 'tiny' (the table was measured for inputs of shape "
            "(8, 8, 3), the model's are (16, 16, 3)).")):
        measured.check_model(larger)
    measured.save(tmp_path / "t.json")
    with pytest.raises(InvalidParameterError, match=re.escape(
            "LatencyTable: argument `path` must be a latency table measured for this model at its shapes")):
        LatencyTable.load(tmp_path / "t.json", model=larger)
    assert LatencyTable.load(tmp_path / "t.json", model=tiny_cnn(8)) == measured
    # Where a table steers: a budget refuses it when fit starts.
    model = add_group_sparsity(larger, 1e-3)
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with pytest.raises(InvalidParameterError, match=re.escape(
            "SparsityBudget: argument `latency_table` must be a latency table measured for this model at its shapes")):
        model.fit(np.zeros((8, 16, 16, 3), "float32"), np.zeros((8,), "int32"), epochs=1, verbose=0,
                  callbacks=[SparsityBudget(max_latency=0.5, latency_table=measured)])


def test_a_table_measured_at_other_layer_shapes_is_refused(measured):
    # The same input shape, layer names and widths: a stride makes conv compute a quarter of the positions, a
    # larger pooling gives the Dense layer a quarter of the inputs.
    with pytest.raises(InvalidParameterError, match=re.escape(
            " measured with layer 'conv' making outputs of shape (8, 8, 4), the model's makes (4, 4, 4)).")):
        measured.check_model(tiny_cnn(8, strides=2))
    with pytest.raises(InvalidParameterError, match=re.escape(
            " measured with layer 'logits' reading inputs of shape (64,), the model's reads (16,)).")):
        measured.check_model(tiny_cnn(8, pool=4))


def test_the_shapes_are_saved_and_read_back(measured, tmp_path):
    data = measured.to_dict()
    assert data["input_shapes"] == [[8, 8, 3]]
    assert data["layer_shapes"] == {"conv": [[8, 8, 3], [8, 8, 4]], "logits": [[64], [2]]}
    measured.save(tmp_path / "t.json")
    loaded = LatencyTable.load(tmp_path / "t.json")
    assert loaded == measured and loaded.input_shapes == measured.input_shapes
    assert loaded.layer_shapes == measured.layer_shapes
    with pytest.raises(InvalidParameterError, match=re.escape("the model's are (16, 16, 3)).")):
        loaded.check_model(tiny_cnn(16))


def test_an_older_table_without_shapes_loads_and_is_checked_by_its_positions(measured):
    data = measured.to_dict()
    del data["input_shapes"], data["layer_shapes"]
    older = LatencyTable.from_dict(data)
    assert older.input_shapes is None and older.layer_shapes is None
    assert older.predict() == pytest.approx(measured.predict())
    older.check_model(tiny_cnn(8))
    # What an older table holds beyond the widths: the output positions of its hidden layers.
    with pytest.raises(InvalidParameterError, match=re.escape(
            "received model 'tiny' (the table was measured with layer 'conv' at 64 output positions, the model's has "
            "256).")):
        older.check_model(tiny_cnn(16))
    # A table that records none of them (made by hand) is checked by its layers and widths only.
    del data["positions"]
    LatencyTable.from_dict(data).check_model(tiny_cnn(16))


# ----------------------------------------------------------------------------- 2. the values a table holds

TIME = "a finite time in seconds >= 0"


@pytest.mark.parametrize("keys, value, where, expected", [
    (("batches", "8", "model"), math.nan, "['batches']['8']['model']", TIME),
    (("batches", "8", "model"), ..., "['batches']['8']['model']", TIME),
    (("batches", "8", "rest"), math.inf, "['batches']['8']['rest']", TIME),
    (("batches", "8", "rest"), -1e-3, "['batches']['8']['rest']", TIME),
    (("batches", "8", "rest"), "0.001", "['batches']['8']['rest']", TIME),
    (("batches", "8", "call"), math.nan, "['batches']['8']['call']", TIME),
    (("batches", "8", "narrow"), -math.inf, "['batches']['8']['narrow']", TIME),
    (("batches", "8", "rest_narrow"), -2.0, "['batches']['8']['rest_narrow']", TIME),
    (("batches", "8", "scale"), 0.0, "['batches']['8']['scale']", "a finite number in (0, 1]"),
    (("batches", "8", "scale"), 1.5, "['batches']['8']['scale']", "a finite number in (0, 1]"),
    (("batches", "8", "scale"), math.nan, "['batches']['8']['scale']", "a finite number in (0, 1]"),
    (("batches", "8", "layers", "conv", "seconds"), [[1e-4, math.nan, 3e-4]],
     "['batches']['8']['layers']['conv']['seconds']", "times in seconds, each finite and >= 0"),
    (("batches", "8", "layers", "logits", "seconds"), [[1e-5], [-2e-5], [1e-4]],
     "['batches']['8']['layers']['logits']['seconds']", "times in seconds, each finite and >= 0"),
    (("batches", "8", "layers", "conv", "seconds"), [[1e-4, 2e-4]],
     "['batches']['8']['layers']['conv']['seconds']", "an array of shape (1, 3) (len(in), len(out))"),
    (("batches", "8", "layers", "conv", "seconds"), [[1e-4, 2e-4, 3e-4], [1e-4]],
     "['batches']['8']['layers']['conv']['seconds']", "an array of shape (1, 3) (len(in), len(out))"),
    (("batches", "8", "layers", "conv", "out"), [], "['batches']['8']['layers']['conv']['out']",
     "a non-empty list of increasing integers >= 1"),
    (("batches", "8", "layers", "conv", "out"), [4, 2, 1], "['batches']['8']['layers']['conv']['out']",
     "a non-empty list of increasing integers >= 1"),
    (("batches", "8", "layers", "logits", "in"), [1, 2.5, 4], "['batches']['8']['layers']['logits']['in']",
     "a non-empty list of increasing integers >= 1"),
    (("batches", "8", "layers", "logits", "in"), [1, "2", 4], "['batches']['8']['layers']['logits']['in']",
     "a non-empty list of increasing integers >= 1"),
    (("layers", "conv"), [3, 0], "['layers']['conv']", "(input units, output units), integers >= 1"),
    (("layers", "conv"), [3, -4], "['layers']['conv']", "(input units, output units), integers >= 1"),
    (("layers", "conv"), [3, 4.5], "['layers']['conv']", "(input units, output units), integers >= 1"),
    (("layers", "conv"), [True, 4], "['layers']['conv']", "(input units, output units), integers >= 1"),
    (("positions", "conv"), 0, "['positions']['conv']", "an integer >= 1"),
    (("measure_seconds",), -1.0, "['measure_seconds']", "None or a finite time in seconds >= 0"),
    (("grid",), [0.5, 1.5], "['grid']", "a non-empty list of fractions in (0, 1]"),
])
def test_a_table_with_a_bad_value_is_refused(keys, value, where, expected, tmp_path):
    data = changed(hand_made(), keys, value)
    received = "missing" if value is ... else repr(value)
    with pytest.raises(InvalidParameterError, match=re.escape(
            f"LatencyTable: argument `data` must be a latency table as LatencyTable.to_dict writes it; received a "
            f"dict whose {where} is {received}, not {expected}.")):
        LatencyTable.from_dict(data)
    path = write(tmp_path / "t.json", data)
    with pytest.raises(InvalidParameterError, match=re.escape(
            f"{FILE}{str(path)!r} (its {where} is {received}, not {expected}).")):
        LatencyTable.load(path)


def test_the_constructor_refuses_bad_times_and_widths():
    good = hand_made()
    entries = {8: good["batches"]["8"]}
    layers = {"conv": (3, 4), "logits": (4, 2)}
    table = LatencyTable("tiny", layers, entries, keras.backend.backend(), "hand-made")
    assert table.predict() == pytest.approx(1e-3)
    with pytest.raises(InvalidParameterError, match=re.escape(
            "LatencyTable: argument `entries` must be a finite time in seconds >= 0 at entries[8]['model']; "
            "received nan.")):
        LatencyTable("tiny", layers, {8: dict(entries[8], model=math.nan)}, "jax", "hand-made")
    with pytest.raises(InvalidParameterError, match=re.escape(
            "LatencyTable: argument `layers` must be (input units, output units), integers >= 1 at "
            "layers['conv']; received (3, 2.7).")):
        LatencyTable("tiny", {"conv": (3, 2.7), "logits": (4, 2)}, entries, "jax", "hand-made")
    with pytest.raises(InvalidParameterError, match=re.escape(
            "LatencyTable: argument `entries` must be a grid of the layer's times at entries[8]['layers']['logits']; "
            "received missing.")):
        LatencyTable("tiny", layers, {8: dict(entries[8], layers={"conv": entries[8]["layers"]["conv"]})},
                     "jax", "hand-made")


def test_a_file_with_a_nan_time_does_not_load(measured, tmp_path):
    # json writes (and reads) NaN: what a table of a failed measurement, or one edited by hand, can hold.
    data = measured.to_dict()
    data["batches"]["8"]["model"] = math.nan
    path = tmp_path / "nan.json"
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(data, handle)
    with pytest.raises(InvalidParameterError, match=re.escape(
            f"{FILE}{str(path)!r} (its ['batches']['8']['model'] is nan, not {TIME}).")):
        LatencyTable.load(path)


# ----------------------------------------------------------------------------- 3. malformed files


@pytest.mark.parametrize("content, reason", [
    (b"{", "not JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
    (b"\xff\xfe{}", "not UTF-8 text: invalid start byte at byte 0"),
    (b"[1, 2]", "it holds a list, not a JSON object"),
    (b"{}", "its ['format'] is missing, not 'keras_group_lasso.LatencyTable/1'"),
    (b"[" * 100000 + b"]" * 100000, "nested too deeply"),
])
def test_a_file_that_is_not_a_table_is_refused(content, reason, tmp_path):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(InvalidParameterError, match=re.escape(f"{FILE}{str(path)!r} ({reason}).")):
        LatencyTable.load(path)


@pytest.mark.parametrize("keys, value, reason", [
    (("batches",), ..., "its ['batches'] is missing, not a non-empty dict {batch size: times}"),
    (("batches", "8", "layers"), ..., ("its ['batches']['8']['layers'] is missing, not a dict "
                                      "{layer name: grid of times}")),
    (("batches", "8", "layers", "conv", "in"), ..., ("its ['batches']['8']['layers']['conv']['in'] is missing, "
                                                    "not a non-empty list of increasing integers >= 1")),
    (("batches", "8", "layers", "logits"), ..., ("its ['batches']['8']['layers']['logits'] is missing, not a grid "
                                                "of the layer's times")),
    (("batches", "8", "layers", "dense"), {"in": [1], "out": [1], "seconds": [[0.0]]},
     ("its ['batches']['8']['layers']['dense'] is {'in': [1], 'out': [1], 'seconds': [[0.0]]}, not a grid of a "
     "layer of ['layers'] (conv, logits)")),
    (("layers", "conv"), [3], "its ['layers']['conv'] is [3], not (input units, output units), integers >= 1"),
    (("layers", "conv"), 5, "its ['layers']['conv'] is 5, not (input units, output units), integers >= 1"),
    (("layers",), [], "its ['layers'] is [], not a non-empty dict {layer name: (input units, output units)}"),
    (("batches",), {"abc": {}}, "its ['batches'] has the key 'abc', not a batch size (an integer >= 1)"),
    (("batches", "8"), [], "its ['batches']['8'] is [], not a dict of times"),
    (("model",), 3, "its ['model'] is 3, not a model name (a string)"),
    (("positions", "dense"), 4, "its ['positions'] has the key 'dense', not a layer of ['layers'] (conv, logits)"),
    (("narrow_widths",), None, ("its ['narrow_widths'] is None, not the widths of the narrow model of each layer "
                               "in ['positions'] (the batches hold its rest_narrow)")),
    (("segments", "conv"), "pool", "its ['segments']['conv'] is 'pool', not a list of layer names"),
])
def test_a_malformed_table_is_refused_with_what_is_wrong(keys, value, reason, tmp_path):
    data = changed(hand_made(), keys, value)
    path = write(tmp_path / "bad.json", data)
    with pytest.raises(InvalidParameterError, match=re.escape(f"{FILE}{str(path)!r} ({reason}).")):
        LatencyTable.load(path)
    with pytest.raises(InvalidParameterError, match=re.escape(
            "LatencyTable: argument `data` must be a latency table as LatencyTable.to_dict writes it; received ")):
        LatencyTable.from_dict(data)


def test_a_directory_or_a_missing_file(tmp_path):
    with pytest.raises(InvalidParameterError, match=re.escape(f"{FILE}{str(tmp_path)!r} (a directory).")):
        LatencyTable.load(tmp_path)
    with pytest.raises(FileNotFoundError):  # as open() says it
        LatencyTable.load(tmp_path / "missing.json")


def test_a_save_into_a_missing_directory_names_the_file_asked_for(measured, tmp_path):
    target = tmp_path / "missing" / "table.json"
    with pytest.raises(FileNotFoundError, match=re.escape(f"No such file or directory: {str(target)!r}")):
        measured.save(target)
    assert os.listdir(tmp_path) == []


def test_from_dict_refuses_what_is_not_a_table():
    for bad, received in ((None, "None"), ([], "[]"), ({"format": "other"}, "format 'other'")):
        with pytest.raises(InvalidParameterError, match=re.escape(
                "LatencyTable: argument `data` must be a latency table (a dict with format "
                f"'keras_group_lasso.LatencyTable/1'); received {received}.")):
            LatencyTable.from_dict(bad)


# ----------------------------------------------------------------------------- 4. saving


def test_a_save_that_fails_midway_leaves_the_earlier_file(tmp_path, monkeypatch):
    table = LatencyTable.from_dict(hand_made())
    path = tmp_path / "t.json"
    table.save(path)
    before = path.read_bytes()

    def full_disk(obj, handle, **kwargs):
        handle.write('{"format": "keras_group_lasso.LatencyTable/1", "model": ')
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(json, "dump", full_disk)
    with pytest.raises(OSError, match="No space left on device"):
        table.save(path)
    monkeypatch.undo()
    assert path.read_bytes() == before and LatencyTable.load(path) == table
    assert os.listdir(tmp_path) == ["t.json"]  # no temporary left behind
    # An exception while the table is written (a value json cannot write) likewise.
    monkeypatch.setattr(table, "to_dict", lambda: dict(LatencyTable.to_dict(table), zz=object()))
    with pytest.raises(TypeError):
        table.save(path)
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["t.json"]


@pytest.mark.skipif(os.name != "posix", reason="file modes and umask are POSIX")
def test_a_saved_table_has_the_mode_open_gives(tmp_path):
    table = LatencyTable.from_dict(hand_made())
    old = os.umask(0o027)
    try:
        with open(tmp_path / "plain.txt", "w", encoding="utf-8"):
            pass
        table.save(tmp_path / "t.json")
    finally:
        os.umask(old)
    mode = os.stat(tmp_path / "t.json").st_mode & 0o777
    assert mode == os.stat(tmp_path / "plain.txt").st_mode & 0o777 == 0o640
    os.chmod(tmp_path / "t.json", 0o604)  # a file saved again keeps its mode, as open() keeps it
    table.save(tmp_path / "t.json")
    assert os.stat(tmp_path / "t.json").st_mode & 0o777 == 0o604
    # Saved through a link: the file it points to is written, the link stays.
    os.symlink(tmp_path / "t.json", tmp_path / "link.json")
    table.save(tmp_path / "link.json")
    assert os.path.islink(tmp_path / "link.json") and LatencyTable.load(tmp_path / "t.json") == table
    assert sorted(os.listdir(tmp_path)) == ["link.json", "plain.txt", "t.json"]


# ----------------------------------------------------------------------------- 5. whole widths


def test_a_fractional_width_is_refused():
    table = LatencyTable.from_dict(hand_made())
    whole = table.predict({"conv": (3, 2)})
    assert table.predict({"conv": (3.0, np.int64(2))}) == whole  # integral floats and numpy integers
    assert table.widths_of({"conv": (3.0, np.int32(2))}) == {"conv": (3, 2)}
    for bad in ((3, 2.7), (3, 1.5), (True, 2), (3, np.float32(0.5)), (3, math.nan), (3, "2")):
        with pytest.raises(InvalidParameterError, match=re.escape(
                f"LatencyTable: argument `structure` must be (input units, output units) pairs of integers; "
                f"received {bad!r}.")):
            table.predict({"conv": bad})
        with pytest.raises(InvalidParameterError, match=re.escape("argument `structure` must be (input units, ")):
            table.widths_of({"conv": bad})


def test_layer_seconds_checks_its_arguments():
    table = LatencyTable.from_dict(hand_made())
    # Between grid points the time is interpolated (a fraction of a unit included): what the grid holds.
    assert table.layer_seconds("conv", 3, 1.5) == pytest.approx(1.5e-4)
    with pytest.raises(InvalidParameterError, match=re.escape(
            "LatencyTable: argument `name` must be a layer of the table (conv, logits); received 'dense'.")):
        table.layer_seconds("dense", 1, 1)
    for bad in (True, math.nan, "2", None):
        with pytest.raises(InvalidParameterError, match=re.escape(
                f"LatencyTable: argument `out_units` must be a finite number >= 0; received {bad!r}.")):
            table.layer_seconds("conv", 3, bad)
