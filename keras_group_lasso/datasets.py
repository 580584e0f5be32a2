"""Datasets of the paper, preprocessed as in its experiments.

The paper (Scardapane et al. 2017, Sec. 4) uses five classification datasets:

==================  ======================================  ========  =========  =======
name                source                                   features  patterns   classes
==================  ======================================  ========  =========  =======
``digits``          bundled with scikit-learn                64        1,797      10
``fashion-mnist``   Debian package ``dataset-fashion-mnist``  784       70,000     10
``mnist``           IDX files (download or copy by hand)     784       70,000     10
``sdd``             UCI Sensorless Drive Diagnosis           48        58,509     11
``cover``           UCI Forest Covertype                     54        581,012    7
==================  ======================================  ========  =========  =======

(The paper uses MNIST; Fashion-MNIST is its drop-in replacement that a Debian
system can install offline.)

:func:`load_dataset` returns a frozen :class:`Dataset` whose features are
``float32`` and min-max scaled per column, and whose labels are integers
``0 .. n_classes - 1``.

Where the files come from:

* ``digits`` needs nothing.
* Every other dataset is read from a directory: the ``path`` argument if given,
  otherwise ``<data home>/<name>`` (see :func:`get_data_home`) and, for
  ``fashion-mnist``, the Debian location ``/usr/share/datasets/fashion-mnist``.
* Nothing is downloaded unless ``download=True``. Missing files raise
  :class:`DatasetNotFoundError` at once, naming each file, its URL and the
  directory to put it in, so an offline machine never waits on the network.

This module needs only numpy and scikit-learn; it never imports a deep learning
backend.
"""

import dataclasses
import gzip
import http.client
import numbers
import os
import pathlib
import shutil
import urllib.request

import numpy as np

from keras_group_lasso._validation import check_choice, check_positive_int, fail

__all__ = [
    "DATASETS",
    "Dataset",
    "DatasetFormatError",
    "DatasetNotFoundError",
    "available_datasets",
    "get_data_home",
    "load_dataset",
    "read_idx",
]

DATASETS = ("digits", "fashion-mnist", "mnist", "sdd", "cover")
"""Names accepted by :func:`load_dataset`, in the paper's order of size."""

DATA_HOME_ENV = "KERAS_GROUP_LASSO_DATA"
"""Environment variable that overrides the default data home."""

_DEFAULT_DATA_HOME = pathlib.Path("~", ".keras_group_lasso", "datasets")
_DOWNLOAD_TIMEOUT_S = 10.0

_IDX_FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)

# IDX type code -> big-endian numpy dtype (http://yann.lecun.com/exdb/mnist/).
_IDX_DTYPES = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_GZIP_MAGIC = b"\x1f\x8b"


class DatasetNotFoundError(FileNotFoundError):
    """The files of a dataset are not on this machine (or could not be downloaded).

    The message names every missing file, the URL it comes from and the
    directory to put it in.
    """


class DatasetFormatError(ValueError):
    """A dataset file exists but its content is not in the expected format."""


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class Dataset:
    """A train/test split of one dataset, ready for ``model.fit``.

    Attributes:
        x_train: ``float32`` array ``(n_train, n_features)``; every column lies
            in ``[0, 1]``.
        x_test: ``float32`` array ``(n_test, n_features)``, scaled with the
            training statistics (see :func:`load_dataset`).
        y_train: ``int64`` labels ``(n_train,)`` in ``0 .. n_classes - 1``.
        y_test: ``int64`` labels ``(n_test,)`` in ``0 .. n_classes - 1``.
        name: the dataset name, one of :data:`DATASETS`.
        n_classes: number of classes.
        image_shape: ``(height, width)`` of one image when the features are
            pixels in row-major order (``x.reshape(-1, *image_shape)`` gives the
            images), ``None`` for tabular data.
    """

    x_train: np.ndarray
    x_test: np.ndarray
    y_train: np.ndarray
    y_test: np.ndarray
    name: str
    n_classes: int
    image_shape: tuple | None = None

    @property
    def n_features(self):
        """Number of input features (columns of ``x_train``)."""
        return self.x_train.shape[1]

    def __repr__(self):
        return (
            f"Dataset(name={self.name!r}, x_train={self.x_train.shape}, "
            f"x_test={self.x_test.shape}, n_classes={self.n_classes}, "
            f"image_shape={self.image_shape})"
        )


@dataclasses.dataclass(frozen=True)
class _Source:
    """Where the files of one downloadable dataset come from."""

    title: str
    files: tuple
    base_url: str
    page: str
    system_dirs: tuple = ()
    apt_package: str | None = None


_SOURCES = {
    "fashion-mnist": _Source(
        title="Fashion-MNIST",
        files=_IDX_FILES,
        base_url="https://storage.googleapis.com/tensorflow/tf-keras-datasets/",
        page="https://github.com/zalandoresearch/fashion-mnist",
        system_dirs=("/usr/share/datasets/fashion-mnist",),
        apt_package="dataset-fashion-mnist",
    ),
    "mnist": _Source(
        title="MNIST",
        files=_IDX_FILES,
        base_url="https://storage.googleapis.com/cvdf-datasets/mnist/",
        page="http://yann.lecun.com/exdb/mnist/",
    ),
    "sdd": _Source(
        title="UCI Sensorless Drive Diagnosis",
        files=("Sensorless_drive_diagnosis.txt",),
        base_url="https://archive.ics.uci.edu/ml/machine-learning-databases/00325/",
        page="https://archive.ics.uci.edu/dataset/325/dataset+for+sensorless+drive+diagnosis",
    ),
    "cover": _Source(
        title="UCI Forest Covertype",
        files=("covtype.data.gz",),
        base_url="https://archive.ics.uci.edu/ml/machine-learning-databases/covtype/",
        page="https://archive.ics.uci.edu/dataset/31/covertype",
    ),
}


def get_data_home():
    """Return the directory that holds downloaded datasets, one folder per name.

    It is ``$KERAS_GROUP_LASSO_DATA`` when that environment variable is set and
    not empty, otherwise ``~/.keras_group_lasso/datasets``. Dataset ``name``
    lives in ``get_data_home() / name`` (for example
    ``~/.keras_group_lasso/datasets/sdd/Sensorless_drive_diagnosis.txt``).
    The directory is not created here.

    Returns:
        A ``pathlib.Path`` with ``~`` expanded.

    Example:
        >>> import os, pathlib
        >>> from unittest import mock
        >>> with mock.patch.dict(os.environ, {"KERAS_GROUP_LASSO_DATA": "~/data"}):
        ...     get_data_home() / "sdd" == pathlib.Path.home() / "data" / "sdd"
        True
    """
    env = os.environ.get(DATA_HOME_ENV, "")
    return pathlib.Path(env if env else _DEFAULT_DATA_HOME).expanduser()


def available_datasets():
    """Return the names that :func:`load_dataset` can load now without a network.

    ``digits`` is always available; another dataset is available when all of
    its files are in ``get_data_home() / name`` or in its system directory
    (``/usr/share/datasets/fashion-mnist`` for ``fashion-mnist``). Use
    :data:`DATASETS` for every supported name.

    Returns:
        A tuple of names, a subset of :data:`DATASETS` in the same order.

    Example:
        >>> "digits" in available_datasets()
        True
    """
    return tuple(
        name for name in DATASETS if name == "digits" or _find_dir(name, None)[0] is not None
    )


def read_idx(file):
    """Read one IDX file (the MNIST format), gzip-compressed or not.

    The format is a 4-byte magic number ``0x00 0x00 <type> <ndim>``, then
    ``ndim`` big-endian ``uint32`` sizes, then the values in row-major order.
    Compression is detected from the content, not from the file name.

    Args:
        file: path of the file (``str`` or ``os.PathLike``).

    Returns:
        A numpy array with the shape and (native-endian) dtype stored in the
        file, e.g. ``uint8`` of shape ``(60000, 28, 28)`` for MNIST images.

    Raises:
        FileNotFoundError: the file does not exist.
        DatasetFormatError: the magic number, the type code or the size of
            the data is wrong; the message names the file.

    Example:
        >>> import gzip, os, tempfile
        >>> sizes = (2).to_bytes(4, "big") + (3).to_bytes(4, "big")
        >>> raw = bytes([0, 0, 0x08, 2]) + sizes + bytes(range(6))   # uint8, 2 dimensions: 2 x 3
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     file = os.path.join(tmp, "tiny-idx2-ubyte.gz")
        ...     with gzip.open(file, "wb") as handle:
        ...         _ = handle.write(raw)
        ...     images = read_idx(file)
        >>> images
        array([[0, 1, 2],
               [3, 4, 5]], dtype=uint8)
    """
    file = pathlib.Path(file)
    with open(file, "rb") as handle:
        raw = handle.read()
    if raw[:2] == _GZIP_MAGIC:
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise DatasetFormatError(f"{file}: corrupt gzip data ({exc}).") from exc
    if len(raw) < 4:
        raise DatasetFormatError(f"{file}: {len(raw)} bytes, too short to be an IDX file.")
    if raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES or raw[3] == 0:
        raise DatasetFormatError(
            f"{file}: not an IDX file; its magic number is 0x{raw[:4].hex()}, "
            "expected 0x0000 then a type code (08, 09, 0b, 0c, 0d or 0e) and a "
            "number of dimensions >= 1, e.g. 0x00000803 for images."
        )
    dtype, ndim = _IDX_DTYPES[raw[2]], raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DatasetFormatError(f"{file}: IDX header truncated (expected {ndim} dimension sizes).")
    shape = tuple(int(s) for s in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) - header != expected:
        raise DatasetFormatError(
            f"{file}: IDX header announces shape {shape} ({expected} bytes of data) "
            f"but the file holds {len(raw) - header} bytes."
        )
    # astype copies, so the result is writable and native-endian.
    data = np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)
    return data.astype(dtype.newbyteorder("="))


def load_dataset(name, test_size=None, seed=0, path=None, download=False):
    """Load a dataset of the paper as a scaled, stratified train/test split.

    Preprocessing follows the paper (Sec. 4): every input column is mapped
    to ``[0, 1]`` by an affine transformation, and 25 % of the patterns are
    kept for testing, drawn at random and stratified by class for each seed.
    One deliberate difference: the min-max statistics are fitted on the
    training split only (the paper fitted them on the whole dataset before
    splitting), so no information leaks from the test set::

        x' = (x - min_train) / (max_train - min_train)

    Every training column therefore lies exactly in ``[0, 1]``. Test values
    are not clipped and may fall slightly outside it. A column that is
    constant on the training split carries nothing the model can learn, so it
    maps to 0 on both splits (instead of dividing by a tiny range).

    Args:
        name: one of :data:`DATASETS`.
        test_size: fraction of the patterns used for testing, a float in
            ``(0, 1)``; the training and test patterns are then drawn from
            all patterns with ``sklearn.model_selection.train_test_split``
            (stratified, ``random_state=seed``). ``None`` (default) means the
            dataset's standard protocol: the official 60,000 / 10,000 split for
            ``mnist`` and ``fashion-mnist`` (``seed`` is then unused), and a
            random stratified 25 % test split for the others. Pass
            ``test_size=0.25`` to apply the paper's random split to MNIST too.
        seed: integer >= 0 that fixes the random split.
        path: directory that holds the dataset files (``str`` or
            ``os.PathLike``). ``None`` searches ``get_data_home() / name`` and
            then the system location (``/usr/share/datasets/fashion-mnist``
            for ``fashion-mnist``). Must be ``None`` for ``digits``.
        download: if True and files are missing, fetch them from their
            public URL (``urllib``, 10 s timeout) into ``path`` or
            ``get_data_home() / name``. Default False: never touch the
            network.

    Returns:
        A :class:`Dataset` with ``float32`` features and ``int64`` labels.

    Raises:
        InvalidParameterError: an unknown ``name``, a ``test_size`` outside
            ``(0, 1)``, a negative or non-integer ``seed``, a ``path`` that is
            not a path (or is given for ``digits``), a non-bool ``download``.
        DatasetNotFoundError: files are missing (and ``download`` is False)
            or the download failed; the message says which file, from which
            URL, and where to put it.
        DatasetFormatError: a file exists but is malformed.

    Example:
        >>> data = load_dataset("digits", seed=3)
        >>> data.x_train.shape, data.x_test.shape, data.image_shape
        ((1347, 64), (450, 64), (8, 8))
        >>> float(data.x_train.min()), float(data.x_train.max())
        (0.0, 1.0)
    """
    owner = "load_dataset"
    check_choice(owner, "name", name, DATASETS)
    if test_size is not None:
        if (
            isinstance(test_size, bool)
            or not isinstance(test_size, numbers.Real)
            or not 0.0 < float(test_size) < 1.0
        ):
            fail(owner, "test_size", "a float in (0, 1) or None", test_size)
        test_size = float(test_size)
    seed = check_positive_int(owner, "seed", seed, minimum=0)
    if path is not None:
        if not isinstance(path, (str, os.PathLike)):
            fail(owner, "path", "a directory (str or os.PathLike) or None", path)
        if name == "digits":
            fail(owner, "path", "None for 'digits' (bundled with scikit-learn)", path)
        path = pathlib.Path(path).expanduser()
    if not isinstance(download, bool):
        fail(owner, "download", "True or False", download)

    if name == "digits":
        x, y = _read_digits()
        official_n_train, image_shape, n_classes = None, (8, 8), 10
    else:
        directory = _locate(name, path, download)
        if name in ("fashion-mnist", "mnist"):
            x, y, official_n_train, image_shape = _read_idx_pair(directory)
            n_classes = 10
        elif name == "sdd":
            x, y = _read_labelled_table(
                directory / "Sensorless_drive_diagnosis.txt", 48, 11, None, np.float64
            )
            official_n_train, image_shape, n_classes = None, None, 11
        else:
            x, y = _read_labelled_table(directory / "covtype.data.gz", 54, 7, ",", np.int32)
            official_n_train, image_shape, n_classes = None, None, 7

    if test_size is None and official_n_train is not None:
        x_train, x_test = x[:official_n_train], x[official_n_train:]
        y_train, y_test = y[:official_n_train], y[official_n_train:]
    else:
        from sklearn.model_selection import train_test_split

        x_train, x_test, y_train, y_test = train_test_split(
            x, y, test_size=0.25 if test_size is None else test_size, random_state=seed, stratify=y
        )
    x_train, x_test = _min_max_scale(x_train, x_test)
    return Dataset(
        x_train=x_train,
        x_test=x_test,
        y_train=y_train.astype(np.int64, copy=False),
        y_test=y_test.astype(np.int64, copy=False),
        name=name,
        n_classes=n_classes,
        image_shape=image_shape,
    )


def _min_max_scale(x_train, x_test):
    """Scale columns to [0, 1] with the training min and max; return float32 copies.

    Integer sources (pixels, covertype) are exact in float32; float sources are
    scaled in float64 so a column with a large offset and a small range keeps
    its resolution. Dividing (rather than multiplying by 1 / range) keeps
    ``(max - min) / range`` exactly 1, so training values never exceed 1.
    """
    work = np.float64 if np.issubdtype(x_train.dtype, np.floating) else np.float32
    x_train = np.array(x_train, dtype=work)
    x_test = np.array(x_test, dtype=work)
    low = x_train.min(axis=0)
    span = x_train.max(axis=0) - low
    constant = span == 0
    span[constant] = 1
    for x in (x_train, x_test):
        x -= low
        x /= span
        x[:, constant] = 0
    return x_train.astype(np.float32, copy=False), x_test.astype(np.float32, copy=False)


def _read_digits():
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    return x, y


def _read_idx_pair(directory):
    """Read the four MNIST-style IDX files; return pooled x, y and the official train size."""
    parts = []
    for images_file, labels_file in (_IDX_FILES[:2], _IDX_FILES[2:]):
        images = read_idx(_existing(directory, images_file))
        labels = read_idx(_existing(directory, labels_file))
        if images.ndim != 3 or labels.ndim != 1 or images.shape[0] != labels.shape[0]:
            raise DatasetFormatError(
                f"{directory}: {images_file} has shape {images.shape} and {labels_file} has "
                f"shape {labels.shape}; expected (n, height, width) images and (n,) labels."
            )
        if labels.size and (labels.min() < 0 or labels.max() > 9):
            raise DatasetFormatError(
                f"{directory / labels_file}: labels must lie in 0..9; found "
                f"{labels.min()}..{labels.max()}."
            )
        parts.append((images, labels))
    (train_images, train_labels), (test_images, test_labels) = parts
    if train_images.shape[1:] != test_images.shape[1:]:
        raise DatasetFormatError(
            f"{directory}: training images are {train_images.shape[1:]} but test images "
            f"are {test_images.shape[1:]}."
        )
    image_shape = tuple(train_images.shape[1:])
    x = np.concatenate([train_images, test_images]).reshape(-1, int(np.prod(image_shape)))
    y = np.concatenate([train_labels, test_labels]).astype(np.int64)
    return x, y, train_images.shape[0], image_shape


def _read_labelled_table(file, n_features, n_classes, delimiter, dtype):
    """Read rows of ``n_features`` numbers then a label in 1..n_classes; return x, y (0-based)."""
    file = _existing(file.parent, file.name)
    opener = gzip.open if _is_gzip(file) else open
    try:
        with opener(file, "rt") as handle:
            table = np.loadtxt(handle, delimiter=delimiter, dtype=dtype, ndmin=2)
    except (ValueError, OSError, EOFError) as exc:
        raise DatasetFormatError(f"{file}: cannot parse as a table of numbers ({exc}).") from exc
    if table.shape[1] != n_features + 1:
        raise DatasetFormatError(
            f"{file}: expected {n_features} feature columns and 1 label column; "
            f"found {table.shape[1]} columns."
        )
    labels = table[:, -1]
    if labels.size == 0:
        raise DatasetFormatError(f"{file}: the file holds no rows.")
    if np.any(labels != np.round(labels)) or labels.min() < 1 or labels.max() > n_classes:
        raise DatasetFormatError(
            f"{file}: the last column must hold integer labels 1..{n_classes}; "
            f"found values in {labels.min():g}..{labels.max():g}."
        )
    return table[:, :-1], labels.astype(np.int64) - 1


def _is_gzip(file):
    with open(file, "rb") as handle:
        return handle.read(2) == _GZIP_MAGIC


def _existing(directory, filename):
    """Return the path of ``filename`` in ``directory``, accepting an uncompressed ``.gz``."""
    candidate = directory / filename
    if not candidate.is_file() and filename.endswith(".gz"):
        plain = directory / filename[: -len(".gz")]
        if plain.is_file():
            return plain
    return candidate


def _missing(directory, source):
    return [f for f in source.files if not _existing(directory, f).is_file()]


def _candidate_dirs(name, path):
    if path is not None:
        return [path]
    return [get_data_home() / name] + [pathlib.Path(d) for d in _SOURCES[name].system_dirs]


def _find_dir(name, path):
    """Return (first directory holding every file or None, [(directory, why unusable)])."""
    source = _SOURCES[name]
    problems = []
    for directory in _candidate_dirs(name, path):
        if not directory.is_dir():
            why = "is not a directory" if directory.exists() else "does not exist"
            problems.append((directory, why))
            continue
        missing = _missing(directory, source)
        if not missing:
            return directory, problems
        problems.append((directory, "lacks " + ", ".join(missing)))
    return None, problems


def _locate(name, path, download):
    """Return the directory holding every file of ``name``, downloading if asked."""
    directory, problems = _find_dir(name, path)
    if directory is not None:
        return directory
    target = _candidate_dirs(name, path)[0]
    if download:
        return _download(name, target)
    source = _SOURCES[name]
    plural = len(source.files) > 1
    searched = "; ".join(f"{d} ({why})" for d, why in problems)
    lines = [
        f"Dataset {name!r} ({source.title}) not found. Searched: {searched}.",
        f"It needs {'these files' if plural else 'this file'} (see {source.page}):",
        *(f"  {f}  <-  {source.base_url}{f}" for f in source.files),
    ]
    if source.apt_package:
        lines.append(
            f"On Debian/Ubuntu install them with `apt-get install {source.apt_package}` "
            f"(they go to {source.system_dirs[0]})."
        )
    where = f"into {target}"
    if path is None:
        where += (
            f" (or a directory passed as path=..., or set {DATA_HOME_ENV} to a directory "
            f"holding a {name!r} folder)"
        )
    lines.append(
        f"Or download {'them' if plural else 'it'} by hand {where}, or call "
        f"load_dataset({name!r}, download=True) on a machine with internet access."
    )
    raise DatasetNotFoundError("\n".join(lines))


def _download(name, target):
    """Fetch the missing files of ``name`` into ``target``; any failure -> DatasetNotFoundError."""
    source = _SOURCES[name]
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DatasetNotFoundError(
            f"Cannot create {target} to download dataset {name!r} ({exc}); pass path=... "
            f"pointing at a writable directory or set {DATA_HOME_ENV}."
        ) from exc
    for filename in _missing(target, source):
        url = source.base_url + filename
        destination = target / filename
        partial = target / (filename + ".part")
        try:
            with urllib.request.urlopen(url, timeout=_DOWNLOAD_TIMEOUT_S) as response:
                with open(partial, "wb") as handle:
                    shutil.copyfileobj(response, handle)
            os.replace(partial, destination)
        except (OSError, ValueError, http.client.HTTPException) as exc:
            partial.unlink(missing_ok=True)
            raise DatasetNotFoundError(
                f"Could not download {filename} for dataset {name!r} ({source.title}) from "
                f"{url}: {exc}. Download it by hand (see {source.page}) and put it in {target}."
            ) from exc
    return target
