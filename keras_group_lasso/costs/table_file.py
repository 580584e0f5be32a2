"""A latency table as a file: the JSON values :meth:`.LatencyTable.to_dict` writes, read back with every value checked,
and written whole or not at all.
"""

import json
import math
import numbers
import os
import secrets
import stat

import numpy as np

from keras_group_lasso._validation import Described, fail
from keras_group_lasso.costs.timing import DEFAULT_GRID

__all__ = ["FORMAT", "OPTIONAL", "Malformed", "read_fields", "read_json", "write_json", "whole_pair"]

_OWNER = "LatencyTable"
FORMAT = "keras_group_lasso.LatencyTable/1"
OPTIONAL = ("narrow", "rest_narrow", "call")  # entry values that older tables or unprunable models lack

# ----------------------------------------------------------------------------- reading a table

_MISSING = Described("missing")  # a key a table lacks, shown as its value
_JSON_KINDS = {list: "a list", str: "a string", int: "a number", float: "a number", bool: "a boolean",
               type(None): "null"}
_ARGUMENTS = {"model": "model_name", "batches": "entries"}  # LatencyTable's arguments named unlike to_dict's keys
_TIME = "a finite time in seconds >= 0"
_ASCENDING = "a non-empty list of increasing integers >= 1"
_PAIR = "(input units, output units), integers >= 1"


class Malformed(Exception):
    """A value of a latency table that is not what a table holds, found where the keys ``where`` lead.

    ``key``: the value is a key of the dict at ``where`` (a batch size, a layer name), not a value in it.
    """

    def __init__(self, where, expected, value, key=False):
        super().__init__(where, expected, value)
        self.where, self.expected, self.value, self.key = tuple(where), expected, value, key

    def found(self):
        """``['batches']['8']['model'] is nan, not a finite time in seconds >= 0``."""
        keys = "".join(f"[{key!r}]" for key in self.where)
        if self.key:
            return f"{keys} has the key {_shown(self.value)}, not {self.expected}"
        return f"{keys} is {_shown(self.value)}, not {self.expected}"

    def fail_argument(self):
        """Raise the constructor's error: the argument, and where in it the value lies."""
        argument = _ARGUMENTS.get(self.where[0], self.where[0])
        inner = argument + "".join(f"[{key!r}]" for key in self.where[1:])
        place = f" at {inner}" if len(self.where) > 1 else ""
        if self.key:
            fail(_OWNER, argument, f"keyed by {self.expected}{place}", Described(f"the key {_shown(self.value)}"))
        fail(_OWNER, argument, f"{self.expected}{place}", Described(_shown(self.value)))


def _shown(value, limit=120):
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _whole(value):
    """``value`` as an int if it is a whole number (an integer, or a float without a fraction), else ``None``.

    A bool is not a width, and ``int(2.7)`` would quietly be 2.
    """
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real) and math.isfinite(value) and float(value).is_integer():
        return int(value)
    return None


def whole_pair(value):
    """``(input units, output units)`` of a pair of whole numbers >= 0, else ``None``."""
    if isinstance(value, (str, bytes, dict)):
        return None
    try:
        pair = tuple(value)
    except TypeError:
        return None
    if len(pair) != 2:
        return None
    pair = tuple(_whole(v) for v in pair)
    return None if None in pair or min(pair) < 0 else pair


def _pair(value, where, minimum=1, expected=_PAIR):
    pair = whole_pair(value)
    if pair is None or min(pair) < minimum:
        raise Malformed(where, expected, value)
    return pair


def _time(value, where, expected=_TIME):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value < 0:
        raise Malformed(where, expected, value)
    return float(value)


def _dict(value, where, expected, nonempty=False):
    if not isinstance(value, dict) or (nonempty and not value):
        raise Malformed(where, expected, value)
    return value


def _names(value, where, layers):
    """``value``, a dict keyed by names of ``layers`` (``None``: an empty one)."""
    value = {} if value is None else _dict(value, where, "a dict keyed by layer names")
    for name in value:
        if name not in layers:
            raise Malformed(where, f"a layer of ['layers'] ({', '.join(layers)})", name, key=True)
    return value


def _shape(value, where, expected):
    if not isinstance(value, (list, tuple)):
        raise Malformed(where, expected, value)
    dims = []
    for d in value:
        size = None if d is None else _whole(d)
        if d is not None and (size is None or size < 0):
            raise Malformed(where, expected, value)
        dims.append(size)
    return tuple(dims)


def _grid_of(value, where):
    """One layer's grid ``{"in": [...], "out": [...], "seconds": array (len(in), len(out))}``."""
    grid = _dict(value, where, "a grid of the layer's times")
    axes = {}
    for axis in ("in", "out"):
        points = grid.get(axis, _MISSING)
        widths = [_whole(v) for v in points] if isinstance(points, (list, tuple)) else [None]
        if not widths or None in widths or widths[0] < 1 or any(b <= a for a, b in zip(widths, widths[1:])):
            raise Malformed(where + (axis,), _ASCENDING, points)
        axes[axis] = widths
    shape = (len(axes["in"]), len(axes["out"]))
    values = grid.get("seconds", _MISSING)
    try:
        seconds = np.array(values, dtype=np.float64)
    except (TypeError, ValueError):
        seconds = None
    if seconds is None or values is _MISSING or seconds.shape != shape:
        raise Malformed(where + ("seconds",), f"an array of shape {shape} (len(in), len(out))", values)
    if not np.all(np.isfinite(seconds)) or np.any(seconds < 0):
        raise Malformed(where + ("seconds",), "times in seconds, each finite and >= 0", values)
    return {"in": axes["in"], "out": axes["out"], "seconds": seconds}


def _entry_of(value, where, layers):
    """The times of one batch size: the dense model, the rest, the scale, the optional times, the grids."""
    entry = _dict(value, where, "a dict of times")
    read = {"model": _time(entry.get("model", _MISSING), where + ("model",)),
            "rest": _time(entry.get("rest", _MISSING), where + ("rest",))}
    scale = entry.get("scale", 1.0)
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not 0.0 < scale <= 1.0:
        raise Malformed(where + ("scale",), "a finite number in (0, 1]", scale)
    read["scale"] = float(scale)
    for key in OPTIONAL:
        if entry.get(key) is not None:
            read[key] = _time(entry[key], where + (key,))
    grids = _dict(entry.get("layers", _MISSING), where + ("layers",), "a dict {layer name: grid of times}")
    for name in grids:
        if name not in layers:
            raise Malformed(where + ("layers", name), f"a grid of a layer of ['layers'] ({', '.join(layers)})",
                             grids[name])
    read["layers"] = {name: _grid_of(grids.get(name, _MISSING), where + ("layers", name))
                      for name in layers}
    return read


def _batch_of(key, where):
    size = int(key) if isinstance(key, str) and key.isascii() and key.isdigit() else _whole(key)
    if size is None or size < 1:
        raise Malformed(where, "a batch size (an integer >= 1)", key, key=True)
    return size


def read_fields(data):
    """The attributes of a table from ``data`` (keyed as :meth:`LatencyTable.to_dict` writes), each checked.

    Raises:
        Malformed: the first value that is not what a table holds.
    """
    model = data.get("model", _MISSING)
    if not isinstance(model, str):
        raise Malformed(("model",), "a model name (a string)", model)
    layers = _dict(data.get("layers", _MISSING), ("layers",),
                   "a non-empty dict {layer name: (input units, output units)}", nonempty=True)
    layers = {str(name): _pair(value, ("layers", name)) for name, value in layers.items()}
    fields = {"model": model, "layers": layers}
    for key, expected in (("backend", "a backend name (a string)"), ("device", "a device, in words (a string)")):
        fields[key] = data.get(key, _MISSING)
        if not isinstance(fields[key], str):
            raise Malformed((key,), expected, fields[key])
    grid = data.get("grid", DEFAULT_GRID)
    if not isinstance(grid, (list, tuple)) or not grid or any(
            isinstance(f, bool) or not isinstance(f, numbers.Real) or not 0.0 < f <= 1.0 for f in grid):
        raise Malformed(("grid",), "a non-empty list of fractions in (0, 1]", grid)
    fields["grid"] = tuple(float(f) for f in grid)
    took = data.get("measure_seconds")
    fields["measure_seconds"] = None if took is None else _time(took, ("measure_seconds",),
                                                                "None or a finite time in seconds >= 0")
    positions = _names(data.get("positions"), ("positions",), layers)
    fields["positions"] = {}
    for name, count in positions.items():
        whole = _whole(count)
        if whole is None or whole < 1:
            raise Malformed(("positions", name), "an integer >= 1", count)
        fields["positions"][str(name)] = whole
    narrow = data.get("narrow_widths")
    fields["narrow_widths"] = None if narrow is None else {
        str(name): _pair(value, ("narrow_widths", name), 0, "(input units, output units), integers >= 0")
        for name, value in _names(narrow, ("narrow_widths",), layers).items()}
    segments = _names(data.get("segments"), ("segments",), layers)
    fields["segments"] = {}
    for name, after in segments.items():
        if not isinstance(after, (list, tuple)) or not all(isinstance(v, str) for v in after):
            raise Malformed(("segments", name), "a list of layer names", after)
        fields["segments"][str(name)] = tuple(after)
    shapes = data.get("input_shapes")
    if shapes is not None and (not isinstance(shapes, (list, tuple)) or not shapes):
        raise Malformed(("input_shapes",), "None or a non-empty list of shapes", shapes)
    fields["input_shapes"] = None if shapes is None else tuple(
        _shape(shape, ("input_shapes", k), "a shape (a list of integers >= 0 or None)")
        for k, shape in enumerate(shapes))
    shapes = data.get("layer_shapes")
    fields["layer_shapes"] = None if shapes is None else {}
    for name, pair in _names(shapes, ("layer_shapes",), layers).items():
        expected = "(input shape, output shape), lists of integers >= 0 or None"
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise Malformed(("layer_shapes", name), expected, pair)
        fields["layer_shapes"][str(name)] = tuple(_shape(shape, ("layer_shapes", name), expected) for shape in pair)
    batches = _dict(data.get("batches", _MISSING), ("batches",), "a non-empty dict {batch size: times}",
                    nonempty=True)
    fields["batches"] = {_batch_of(key, ("batches",)): _entry_of(entry, ("batches", key), layers)
                         for key, entry in batches.items()}
    if fields["positions"] and any("rest_narrow" in entry for entry in fields["batches"].values()) and (
            fields["narrow_widths"] is None or any(name not in fields["narrow_widths"] for name in positions)):
        raise Malformed(("narrow_widths",), "the widths of the narrow model of each layer in ['positions'] (the "
                         "batches hold its rest_narrow)", narrow)
    return fields



def _new_file(directory, prefix):
    """``(path, descriptor)`` of a new file ``directory/prefix<random>.tmp``, open for writing.

    Created with mode 0o666 under the umask, as ``open`` creates a file (``tempfile.mkstemp`` would make it
    0600 whatever the umask).
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    for _ in range(100):
        path = os.path.join(directory, f"{prefix}{secrets.token_hex(4)}.tmp")
        try:
            return path, os.open(path, flags, 0o666)
        except FileExistsError:
            continue
    raise FileExistsError(f"{_OWNER}: no free name {prefix}XXXXXXXX.tmp in {directory!r}")



def _file_name(path):
    """``path`` as ``os.fspath`` gives it (a ``str`` or ``bytes``), or the package's error naming ``path``."""
    if not isinstance(path, (str, bytes, os.PathLike)):
        fail(_OWNER, "path", "a file name (str or os.PathLike)", path)
    return os.fspath(path)


def write_json(data, path):
    """Write ``data`` as JSON to ``path``, replacing the file there whole.

    The data go to a new file in the same directory, which then takes the place of ``path`` in one step: a write
    that fails midway (a full disk, an exception) leaves the file that was there as it was, and no other file. The
    file has the mode that ``open`` gives: a new file's under the umask, or the mode of the file it replaces. A
    link at ``path`` is followed (the file it points to is replaced).
    """
    target = os.path.realpath(_file_name(path))
    if os.path.isdir(target):
        fail(_OWNER, "path", "the name of a file to write the table to",
             Described(f"{os.fspath(path)!r} (a directory)"))
    directory, base = os.path.split(target)
    try:
        temporary, descriptor = _new_file(directory, f".{base}.")
    except OSError as error:  # a missing or read-only directory: said of the file asked for, not of the temporary
        raise type(error)(error.errno, error.strerror, os.fspath(path)) from None
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=1)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            mode = os.stat(target).st_mode
        except FileNotFoundError:
            mode = None
        if mode is not None and stat.S_ISREG(mode):
            os.chmod(temporary, stat.S_IMODE(mode))  # as open() keeps the mode of a file it overwrites
        os.replace(temporary, target)
    except BaseException:
        try:
            os.remove(temporary)
        except OSError:
            pass
        raise


def read_json(path):
    """``(data, None)``: the JSON value of the file at ``path`` when it is a latency table's format; else ``(None,
    why not)`` in words.

    Raises:
        InvalidParameterError: ``path`` is a directory.
        FileNotFoundError: there is no file at ``path`` (and the other errors of ``open``).
    """
    name = _file_name(path)
    if os.path.isdir(name):
        fail(_OWNER, "path", "a JSON file written by LatencyTable.save", Described(f"{name!r} (a directory)"))
    reason = None
    try:
        with open(name, encoding="utf-8") as handle:
            data = json.load(handle)
    except json.JSONDecodeError as error:
        reason = f"not JSON: {error}"
    except UnicodeDecodeError as error:
        reason = f"not UTF-8 text: {error.reason} at byte {error.start}"
    except RecursionError:
        reason = "nested too deeply"
    if reason is None:
        if not isinstance(data, dict):
            reason = f"it holds {_JSON_KINDS.get(type(data), 'a value')}, not a JSON object"
        elif data.get("format", _MISSING) != FORMAT:
            reason = f"its {Malformed(('format',), repr(FORMAT), data.get('format', _MISSING)).found()}"
    return (data, None) if reason is None else (None, reason)
