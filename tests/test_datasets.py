"""Tests for keras_group_lasso.datasets.

Every downloadable dataset is exercised on tiny files written here in the real
format; the network is never touched (``urlopen`` is replaced in every test).
"""

import gzip
import pathlib
import struct
import subprocess
import sys
import urllib.error
import urllib.request

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from keras_group_lasso import datasets
from keras_group_lasso._validation import InvalidParameterError
from keras_group_lasso.datasets import (
    DATASETS,
    Dataset,
    DatasetFormatError,
    DatasetNotFoundError,
    available_datasets,
    get_data_home,
    load_dataset,
    read_idx,
)

FASHION_DIR = pathlib.Path("/usr/share/datasets/fashion-mnist")
IDX_FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)
_IDX_CODES = {
    np.uint8: 0x08,
    np.int8: 0x09,
    np.int16: 0x0B,
    np.int32: 0x0C,
    np.float32: 0x0D,
    np.float64: 0x0E,
}
UCI = "https://archive.ics.uci.edu/ml/machine-learning-databases/"


# ----------------------------------------------------------------------------- helpers


@pytest.fixture(autouse=True)
def _seed_everything():
    """Replace conftest's Keras seeding: these tests use no Keras, and its
    per-test ``clear_session()`` costs ~0.35 s on JAX (a full ``gc.collect``)."""
    yield


@pytest.fixture(autouse=True)
def no_network(monkeypatch, tmp_path):
    """Fail any attempt to reach the network; point the data home at an empty folder."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args!r}")

    monkeypatch.setattr(urllib.request, "urlopen", refuse)
    monkeypatch.setenv("KERAS_GROUP_LASSO_DATA", str(tmp_path / "home"))


def write_idx(file, array, compress=True):
    array = np.asarray(array)
    code = _IDX_CODES[array.dtype.type]
    header = bytes([0, 0, code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    payload = header + array.astype(array.dtype.newbyteorder(">")).tobytes()
    pathlib.Path(file).write_bytes(gzip.compress(payload) if compress else payload)


def make_idx_dataset(directory, n_train=30, n_test=20, shape=(4, 5), seed=0, compress=True):
    """Write four MNIST-style files with every class present; return the raw arrays."""
    rng = np.random.default_rng(seed)
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    arrays = {}
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        images = rng.integers(0, 256, size=(n, *shape), dtype=np.uint8)
        labels = (np.arange(n) % 10).astype(np.uint8)
        suffix = ".gz" if compress else ""
        write_idx(directory / f"{prefix}-images-idx3-ubyte{suffix}", images, compress)
        write_idx(directory / f"{prefix}-labels-idx1-ubyte{suffix}", labels, compress)
        arrays[prefix] = (images, labels)
    return arrays


def make_sdd_file(directory, per_class=4, seed=0):
    rng = np.random.default_rng(seed)
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    n = 11 * per_class
    x = rng.normal(scale=1e-3, size=(n, 48)) + rng.normal(size=48)
    y = np.arange(n) % 11 + 1
    lines = [" ".join(f"{v:.6e}" for v in row) + f" {label}" for row, label in zip(x, y)]
    (directory / "Sensorless_drive_diagnosis.txt").write_text("\n".join(lines) + "\n")
    return x, y


def make_cover_file(directory, per_class=4, seed=0, name="covtype.data.gz"):
    rng = np.random.default_rng(seed)
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    n = 7 * per_class
    quantitative = rng.integers(1800, 3900, size=(n, 10))
    binary = rng.integers(0, 2, size=(n, 44))  # wilderness areas and soil types
    x = np.concatenate([quantitative, binary], axis=1)
    y = np.arange(n) % 7 + 1
    text = "\n".join(",".join(str(v) for v in [*row, label]) for row, label in zip(x, y)) + "\n"
    data = gzip.compress(text.encode()) if name.endswith(".gz") else text.encode()
    (directory / name).write_bytes(data)
    return x, y


def check_dataset(data, name, n_features, n_classes, image_shape):
    assert isinstance(data, Dataset)
    assert data.name == name and data.n_classes == n_classes and data.image_shape == image_shape
    assert data.n_features == n_features
    assert data.x_train.dtype == np.float32 and data.x_test.dtype == np.float32
    assert data.y_train.dtype == np.int64 and data.y_test.dtype == np.int64
    assert data.x_train.shape == (data.y_train.shape[0], n_features)
    assert data.x_test.shape == (data.y_test.shape[0], n_features)
    assert data.x_train.min() >= 0.0 and data.x_train.max() <= 1.0
    assert np.isfinite(data.x_test).all()
    for y in (data.y_train, data.y_test):
        assert y.min() >= 0 and y.max() <= n_classes - 1


# ----------------------------------------------------------------------------- DIGITS


def test_names():
    assert DATASETS == ("digits", "fashion-mnist", "mnist", "sdd", "cover")
    available = available_datasets()
    assert "digits" in available
    assert available == tuple(name for name in DATASETS if name in available)


def test_digits_shapes_dtypes_and_range():
    data = load_dataset("digits")
    check_dataset(data, "digits", 64, 10, (8, 8))
    assert data.x_train.shape == (1347, 64) and data.x_test.shape == (450, 64)
    live = data.x_train.max(axis=0) > 0
    # Non-constant training columns reach both ends of [0, 1] exactly.
    np.testing.assert_array_equal(data.x_train[:, live].min(axis=0), 0.0)
    np.testing.assert_array_equal(data.x_train[:, live].max(axis=0), 1.0)
    assert "x_train=(1347, 64)" in repr(data)


def test_digits_matches_numpy_reference():
    seed, test_size = 7, 0.3
    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=test_size, random_state=seed, stratify=y
    )
    low, high = x_train.min(axis=0), x_train.max(axis=0)
    span = high - low
    safe = np.where(span > 0, span, 1.0)
    expected_train = np.where(span > 0, (x_train - low) / safe, 0.0)
    expected_test = np.where(span > 0, (x_test - low) / safe, 0.0)

    data = load_dataset("digits", test_size=test_size, seed=seed)
    np.testing.assert_allclose(data.x_train, expected_train, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(data.x_test, expected_test, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(data.y_train, y_train)
    np.testing.assert_array_equal(data.y_test, y_test)


@pytest.mark.parametrize("test_size", [0.1, 0.25, 0.5])
def test_split_is_stratified(test_size):
    data = load_dataset("digits", test_size=test_size, seed=3)
    all_counts = np.bincount(np.concatenate([data.y_train, data.y_test]), minlength=10)
    test_counts = np.bincount(data.y_test, minlength=10)
    assert np.all(np.abs(test_counts - test_size * all_counts) <= 1)
    assert data.x_test.shape[0] == int(np.ceil(test_size * 1797))


def test_split_is_reproducible_by_seed():
    a, b, c = (load_dataset("digits", seed=s) for s in (5, 5, 6))
    for field in ("x_train", "x_test", "y_train", "y_test"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    assert not np.array_equal(a.y_test, c.y_test)


def test_dataset_is_frozen():
    data = load_dataset("digits")
    with pytest.raises(AttributeError):
        data.name = "other"


@settings(max_examples=50, deadline=None)
@given(
    st.integers(2, 30),
    st.integers(1, 6),
    st.integers(0, 2**32 - 1),
    st.floats(1e-3, 1e6),
    st.floats(-1e6, 1e6),
)
def test_min_max_scale_properties(n_rows, n_cols, seed, scale, offset):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n_rows + 5, n_cols)) * scale + offset
    x[:, 0] = offset  # one constant column
    x_train, x_test = datasets._min_max_scale(x[:n_rows], x[n_rows:])
    assert x_train.dtype == np.float32 and x_test.dtype == np.float32
    assert x_train.min() >= 0.0 and x_train.max() <= 1.0
    np.testing.assert_array_equal(x_train[:, 0], 0.0)
    np.testing.assert_array_equal(x_test[:, 0], 0.0)
    if n_rows > 1 and n_cols > 1:
        live = np.ptp(x[:n_rows, 1:], axis=0) > 0
        np.testing.assert_array_equal(x_train[:, 1:][:, live].max(axis=0), 1.0)
        np.testing.assert_array_equal(x_train[:, 1:][:, live].min(axis=0), 0.0)


# ----------------------------------------------------------------------------- IDX parser


@pytest.mark.parametrize("dtype", list(_IDX_CODES))
@pytest.mark.parametrize("compress", [True, False])
def test_read_idx_round_trip(tmp_path, dtype, compress):
    array = (np.arange(24) - 5).reshape(2, 3, 4).astype(dtype)
    write_idx(tmp_path / "a.idx", array, compress)
    result = read_idx(tmp_path / "a.idx")
    assert result.dtype == np.dtype(dtype) and result.dtype.isnative
    np.testing.assert_array_equal(result, array)
    result[0, 0, 0] = 1  # writable


def test_read_idx_rejects_bad_magic(tmp_path):
    file = tmp_path / "bad.gz"
    file.write_bytes(gzip.compress(b"\x08\x03\x00\x00" + b"\x00" * 20))
    with pytest.raises(DatasetFormatError, match="its magic number is 0x08030000") as info:
        read_idx(file)
    assert str(file) in str(info.value)
    file.write_bytes(b"\x00\x00\x07\x01" + b"\x00" * 8)  # unknown type code 0x07
    with pytest.raises(DatasetFormatError, match="magic number is 0x00000701"):
        read_idx(file)


def test_read_idx_rejects_wrong_size_and_short_files(tmp_path):
    file = tmp_path / "short.idx"
    file.write_bytes(bytes([0, 0, 8, 2]) + struct.pack(">2I", 3, 4) + b"\x00" * 11)
    expected = r"announces shape \(3, 4\) \(12 bytes of data\) but the file holds 11 bytes"
    with pytest.raises(DatasetFormatError, match=expected):
        read_idx(file)
    file.write_bytes(b"\x00\x00")
    with pytest.raises(DatasetFormatError, match="2 bytes, too short to be an IDX file"):
        read_idx(file)
    file.write_bytes(b"\x1f\x8bnot really gzip")
    with pytest.raises(DatasetFormatError, match="corrupt gzip data"):
        read_idx(file)


def test_read_idx_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_idx(tmp_path / "absent.gz")


# ----------------------------------------------------------------------------- MNIST-like loaders


@pytest.mark.parametrize("name", ["mnist", "fashion-mnist"])
def test_idx_loader_official_split(tmp_path, name):
    raw = make_idx_dataset(tmp_path / "d")
    data = load_dataset(name, path=tmp_path / "d")
    check_dataset(data, name, 20, 10, (4, 5))
    assert data.x_train.shape == (30, 20) and data.x_test.shape == (20, 20)
    np.testing.assert_array_equal(data.y_train, raw["train"][1])
    np.testing.assert_array_equal(data.y_test, raw["t10k"][1])
    # The official split keeps the file order; scaling uses the training pixels only.
    train = raw["train"][0].reshape(30, -1).astype(np.float64)
    test = raw["t10k"][0].reshape(20, -1).astype(np.float64)
    low, span = train.min(axis=0), np.ptp(train, axis=0)
    np.testing.assert_allclose(data.x_test, (test - low) / span, rtol=1e-6)


def test_idx_loader_random_split_pools_all_images(tmp_path):
    make_idx_dataset(tmp_path)
    data = load_dataset("mnist", test_size=0.25, seed=1, path=str(tmp_path))
    assert data.x_train.shape == (37, 20) and data.x_test.shape == (13, 20)
    assert set(np.unique(data.y_test)) == set(range(10))  # stratified over the 50 images
    again = load_dataset("mnist", test_size=0.25, seed=1, path=tmp_path)
    np.testing.assert_array_equal(data.x_test, again.x_test)


def test_idx_loader_accepts_uncompressed_files(tmp_path):
    make_idx_dataset(tmp_path, compress=False)
    assert load_dataset("mnist", path=tmp_path).x_train.shape == (30, 20)


def test_pixel_constant_in_training_maps_to_zero_in_test(tmp_path):
    raw = make_idx_dataset(tmp_path)
    train_images, train_labels = raw["train"]
    test_images, test_labels = raw["t10k"]
    train_images[:, 0, 0] = 0
    test_images[:, 0, 0] = 200
    write_idx(tmp_path / IDX_FILES[0], train_images)
    write_idx(tmp_path / IDX_FILES[2], test_images)
    data = load_dataset("mnist", path=tmp_path)
    np.testing.assert_array_equal(data.x_train[:, 0], 0.0)
    np.testing.assert_array_equal(data.x_test[:, 0], 0.0)


def test_idx_loader_rejects_inconsistent_files(tmp_path):
    raw = make_idx_dataset(tmp_path)
    write_idx(tmp_path / IDX_FILES[1], raw["train"][1][:-1])
    expected = r"has shape \(30, 4, 5\) and train-labels-idx1-ubyte.gz has shape \(29,\)"
    with pytest.raises(DatasetFormatError, match=expected):
        load_dataset("mnist", path=tmp_path)
    labels = raw["train"][1].copy()
    labels[0] = 12
    write_idx(tmp_path / IDX_FILES[1], labels)
    with pytest.raises(DatasetFormatError, match=r"labels must lie in 0..9; found 0..12"):
        load_dataset("mnist", path=tmp_path)


def test_data_home_env_var(tmp_path, monkeypatch):
    monkeypatch.setenv("KERAS_GROUP_LASSO_DATA", str(tmp_path / "cache"))
    assert get_data_home() == tmp_path / "cache"
    assert "mnist" not in available_datasets()
    make_idx_dataset(tmp_path / "cache" / "mnist")
    assert "mnist" in available_datasets()
    assert load_dataset("mnist").x_test.shape == (20, 20)
    monkeypatch.delenv("KERAS_GROUP_LASSO_DATA")
    assert get_data_home() == pathlib.Path("~/.keras_group_lasso/datasets").expanduser()


@pytest.mark.skipif(
    not all((FASHION_DIR / f).is_file() for f in IDX_FILES),
    reason="Fashion-MNIST not installed: apt-get install dataset-fashion-mnist",
)
def test_real_fashion_mnist():
    assert "fashion-mnist" in available_datasets()
    data = load_dataset("fashion-mnist")  # data home is empty: found in the Debian folder
    check_dataset(data, "fashion-mnist", 784, 10, (28, 28))
    assert data.x_train.shape == (60000, 784) and data.x_test.shape == (10000, 784)
    np.testing.assert_array_equal(np.bincount(data.y_train), 6000)
    np.testing.assert_array_equal(np.bincount(data.y_test), 1000)
    assert data.x_train.max() == 1.0
    images = read_idx(FASHION_DIR / "t10k-images-idx3-ubyte.gz")
    assert images.shape == (10000, 28, 28) and images.dtype == np.uint8


# ----------------------------------------------------------------------------- tabular loaders


def test_sdd_loader(tmp_path):
    x, y = make_sdd_file(tmp_path)
    data = load_dataset("sdd", path=tmp_path, seed=2)
    check_dataset(data, "sdd", 48, 11, None)
    assert data.x_train.shape == (33, 48) and data.x_test.shape == (11, 48)
    np.testing.assert_array_equal(np.bincount(data.y_test), 1)  # one of each of the 11 classes
    # Columns with a large offset and a tiny range keep their resolution.
    assert np.ptp(data.x_train, axis=0).min() == 1.0


def test_cover_loader(tmp_path):
    make_cover_file(tmp_path)
    data = load_dataset("cover", path=tmp_path)
    check_dataset(data, "cover", 54, 7, None)
    assert data.x_train.shape == (21, 54) and data.x_test.shape == (7, 54)
    np.testing.assert_array_equal(np.sort(data.y_test), np.arange(7))


def test_cover_loader_accepts_uncompressed_file(tmp_path):
    make_cover_file(tmp_path, name="covtype.data")
    assert load_dataset("cover", path=tmp_path).n_features == 54


def test_tabular_format_errors(tmp_path):
    make_sdd_file(tmp_path)
    file = tmp_path / "Sensorless_drive_diagnosis.txt"
    file.write_text("1.0 2.0 3\n4.0 5.0 1\n")
    expected = "expected 48 feature columns and 1 label column; found 3 columns"
    with pytest.raises(DatasetFormatError, match=expected):
        load_dataset("sdd", path=tmp_path)
    file.write_text(" ".join(["0.5"] * 48) + " 12\n")
    with pytest.raises(DatasetFormatError, match=r"integer labels 1..11; found values in 12..12"):
        load_dataset("sdd", path=tmp_path)
    file.write_text(" ".join(["0.5"] * 48) + " abc\n")
    with pytest.raises(DatasetFormatError, match="cannot parse as a table of numbers"):
        load_dataset("sdd", path=tmp_path)


# ----------------------------------------------------------------------------- offline errors


@pytest.mark.parametrize(
    "name, files, url",
    [
        ("mnist", IDX_FILES, "https://storage.googleapis.com/cvdf-datasets/mnist/"),
        ("sdd", ("Sensorless_drive_diagnosis.txt",), UCI + "00325/"),
        ("cover", ("covtype.data.gz",), UCI + "covtype/"),
    ],
)
def test_missing_files_fail_fast_with_instructions(tmp_path, name, files, url):
    target = tmp_path / "home" / name
    with pytest.raises(DatasetNotFoundError) as info:
        load_dataset(name)  # the autouse fixture turns any network access into a failure
    message = str(info.value)
    assert isinstance(info.value, FileNotFoundError)
    assert message.startswith(f"Dataset {name!r} (")
    assert f"Searched: {target} (does not exist)." in message
    for filename in files:
        assert f"{filename}  <-  {url}{filename}" in message
    assert (
        f"by hand into {target} (or a directory passed as path=..., "
        f"or set KERAS_GROUP_LASSO_DATA to a directory holding a {name!r} folder)" in message
    )
    assert f"load_dataset({name!r}, download=True)" in message
    assert "apt-get" not in message


def test_missing_fashion_mnist_mentions_debian_package(tmp_path):
    folder = tmp_path / "partial"
    folder.mkdir()
    write_idx(folder / IDX_FILES[1], np.zeros(3, np.uint8))
    with pytest.raises(DatasetNotFoundError) as info:
        load_dataset("fashion-mnist", path=folder)
    message = str(info.value)
    assert (
        f"Searched: {folder} (lacks train-images-idx3-ubyte.gz, t10k-images-idx3-ubyte.gz, "
        "t10k-labels-idx1-ubyte.gz)." in message
    )
    assert (
        "`apt-get install dataset-fashion-mnist` (they go to /usr/share/datasets/fashion-mnist)"
        in message
    )
    keras_mirror = "https://storage.googleapis.com/tensorflow/tf-keras-datasets/"
    assert f"train-images-idx3-ubyte.gz  <-  {keras_mirror}train-images-idx3-ubyte.gz" in message
    assert f"by hand into {folder}, or call load_dataset('fashion-mnist', download=True)" in message


def test_download_failure_becomes_clear_error(tmp_path, monkeypatch):
    calls = []

    def offline(url, timeout=None):
        calls.append((url, timeout))
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    with pytest.raises(DatasetNotFoundError) as info:
        load_dataset("sdd", path=tmp_path / "sdd", download=True)
    url = UCI + "00325/Sensorless_drive_diagnosis.txt"
    assert calls == [(url, 10.0)]
    message = str(info.value)
    assert "Could not download Sensorless_drive_diagnosis.txt for dataset 'sdd'" in message
    assert f"from {url}: <urlopen error [Errno -3] Temporary failure in name resolution>" in message
    assert f"put it in {tmp_path / 'sdd'}." in message
    assert list((tmp_path / "sdd").iterdir()) == []  # no partial file left behind


def test_download_fetches_only_missing_files(tmp_path, monkeypatch):
    source = tmp_path / "source"
    make_idx_dataset(source)
    target = tmp_path / "home" / "mnist"
    target.mkdir(parents=True)
    (target / IDX_FILES[0]).write_bytes((source / IDX_FILES[0]).read_bytes())
    fetched = []

    class Response:
        def __init__(self, url):
            self.data = (source / url.rsplit("/", 1)[1]).read_bytes()
            self.offset = 0

        def read(self, size=-1):
            end = len(self.data) if size < 0 else self.offset + size
            chunk = self.data[self.offset : end]
            self.offset += len(chunk)
            return chunk

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    def fake_urlopen(url, timeout=None):
        fetched.append(url.rsplit("/", 1)[1])
        return Response(url)

    monkeypatch.setattr(urllib.request, "urlopen", fake_urlopen)
    data = load_dataset("mnist", download=True)
    assert fetched == list(IDX_FILES[1:])
    assert data.x_train.shape == (30, 20)
    assert sorted(p.name for p in target.iterdir()) == sorted(IDX_FILES)


# ----------------------------------------------------------------------------- bad arguments


NAMES = "'digits', 'fashion-mnist', 'mnist', 'sdd', 'cover'"
TEST_SIZE = "a float in (0, 1) or None"


@pytest.mark.parametrize(
    "kwargs, argument, constraint, received",
    [
        ({"name": "imagenet"}, "name", f"one of {NAMES}", "'imagenet'"),
        ({"name": None}, "name", f"one of {NAMES}", "None"),
        ({"test_size": 0.0}, "test_size", TEST_SIZE, "0.0"),
        ({"test_size": 1}, "test_size", TEST_SIZE, "1"),
        ({"test_size": 1.5}, "test_size", TEST_SIZE, "1.5"),
        ({"test_size": -0.25}, "test_size", TEST_SIZE, "-0.25"),
        ({"test_size": float("nan")}, "test_size", TEST_SIZE, "nan"),
        ({"test_size": True}, "test_size", TEST_SIZE, "True"),
        ({"test_size": "0.25"}, "test_size", TEST_SIZE, "'0.25'"),
        ({"seed": -1}, "seed", "an integer >= 0", "-1"),
        ({"seed": 1.5}, "seed", "an integer >= 0", "1.5"),
        ({"seed": None}, "seed", "an integer >= 0", "None"),
        ({"path": 3}, "path", "a directory (str or os.PathLike) or None", "3"),
        ({"path": "data"}, "path", "None for 'digits' (bundled with scikit-learn)", "'data'"),
        ({"download": "yes"}, "download", "True or False", "'yes'"),
    ],
)
def test_bad_arguments(kwargs, argument, constraint, received):
    kwargs = {"name": "digits", **kwargs}
    with pytest.raises(InvalidParameterError) as info:
        load_dataset(**kwargs)
    expected = f"load_dataset: argument `{argument}` must be {constraint}; received {received}."
    assert str(info.value) == expected
    assert isinstance(info.value, ValueError) and isinstance(info.value, TypeError)


def test_numpy_arguments_are_accepted():
    data = load_dataset("digits", test_size=np.float32(0.5), seed=np.int64(2))
    assert data.x_test.shape[0] == 899


# ----------------------------------------------------------------------------- imports


def test_module_imports_no_deep_learning_backend():
    # Load datasets.py without the package __init__ (which imports keras) to
    # check that the module itself needs only numpy and scikit-learn.
    package_dir = pathlib.Path(datasets.__file__).parent
    code = (
        "import sys, types\n"
        "pkg = types.ModuleType('keras_group_lasso')\n"
        f"pkg.__path__ = [{str(package_dir)!r}]\n"
        "sys.modules['keras_group_lasso'] = pkg\n"
        "import keras_group_lasso.datasets as d\n"
        "d.load_dataset('digits')\n"
        "bad = sorted(m for m in ('tensorflow', 'keras', 'jax', 'torch') if m in sys.modules)\n"
        "assert not bad, bad\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
