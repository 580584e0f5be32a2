"""export_pruned after an export killed half-way (kill -9), and the modes of the SavedModel it writes.

A killed export cannot clean up: it leaves its hidden staging directory behind, and when it was killed while
it swapped the artifacts, the earlier ones sit in that directory's ``.replaced`` folder. The next export into
the same directory puts them back (or removes the leftover when nothing in it is needed), says so, and never
touches another file.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import warnings

import keras
import numpy as np
import pytest

from keras_group_lasso import InvalidParameterError, export_pruned
from keras_group_lasso import export as export_module

try:
    import fcntl
except ImportError:  # no advisory file locks on this system
    fcntl = None

N_FEATURES = 5
INSIDE = ".keras_group_lasso.partial-"


def _model(seed=0):
    rng = np.random.default_rng(seed)
    model = keras.Sequential([keras.Input((N_FEATURES,)), keras.layers.Dense(4, activation="relu"),
                              keras.layers.Dense(2)])
    model.set_weights([rng.normal(size=w.shape).astype("float32") for w in model.get_weights()])
    return model


def _tree(root):
    """Every file (its bytes) and directory (None) under ``root``, hidden ones included, by relative path."""
    tree = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs:
            tree[os.path.relpath(os.path.join(folder, name), root)] = None
        for name in files:
            with open(os.path.join(folder, name), "rb") as f:
                tree[os.path.relpath(os.path.join(folder, name), root)] = f.read()
    return tree


def _users_files(target):
    (target / "data").mkdir(parents=True)
    (target / "data" / "train.csv").write_text("a,b\n1,2\n")
    (target / "notes.txt").write_text("the user's own notes")
    return _tree(target)


def _export_messages(record):
    return [str(w.message) for w in record if str(w.message).startswith("export_pruned:")]


def _hidden(folder):
    return sorted(name for name in os.listdir(folder) if name.startswith("."))


class _Killed(BaseException):
    """The simulated kill -9: raised by the step it hits and by every later one, so no clean-up runs."""


def _die_at(monkeypatch, step, root):
    """Make export_pruned die, as under kill -9, at its ``step``-th step under ``root``.

    The steps that change the file system after the artifacts are built: writing ``manifest.json`` into
    the staging directory (the last thing built), each rename, and removing the staging directory. The
    step hit and every later one raise :class:`_Killed`, so nothing is undone or cleaned up.
    """
    root = str(root)
    seen = []
    write_manifest, rename, rmtree = export_module._write_manifest_file, os.rename, shutil.rmtree

    def counted(path):
        if os.fspath(path).startswith(root):
            seen.append(path)
        if len(seen) >= step:
            raise _Killed(f"killed at step {step}: {path}")

    def dying_write_manifest(path, manifest):
        counted(path)
        write_manifest(path, manifest)

    def dying_rename(source, destination):
        counted(source)
        rename(source, destination)

    def dying_rmtree(path, *args, **kwargs):
        counted(path)
        rmtree(path, *args, **kwargs)

    monkeypatch.setattr(export_module, "_write_manifest_file", dying_write_manifest)
    monkeypatch.setattr(os, "rename", dying_rename)
    monkeypatch.setattr(shutil, "rmtree", dying_rmtree)


# Replacing a keras-only export by another: write the new manifest (1), the earlier manifest aside (2), the
# earlier model aside (3), the new model in (4), the new manifest in (5), remove the staging directory (6).
STEPS = {
    1: "while building",
    2: "before the earlier manifest goes aside",
    3: "after the earlier manifest went aside",
    4: "after the earlier model went aside",
    5: "after the new model came in",
    6: "after the new manifest came in",
}


@pytest.mark.parametrize("step", sorted(STEPS), ids=[STEPS[s] for s in sorted(STEPS)])
def test_the_next_export_puts_back_what_a_killed_export_took_aside(tmp_path, monkeypatch, step):
    target = tmp_path / "out"
    users = _users_files(target)
    export_pruned(_model(0), target, formats=("keras",))
    earlier = _tree(target)
    _die_at(monkeypatch, step, target)
    with pytest.raises(_Killed):
        export_pruned(_model(1), target, formats=("keras",), overwrite=True)
    monkeypatch.undo()
    killed = _tree(target)
    [leftover] = _hidden(target)
    assert leftover.startswith(INSIDE)
    leftover = str(target / leftover)
    if step < 6:
        expected = earlier
    else:  # the killed export had put all its artifacts in place: that export stands
        expected = {k: v for k, v in killed.items() if not k.startswith(".")}
        assert json.loads(expected["manifest.json"])["formats"] == {"keras": "model.keras"}
        assert expected["model.keras"] != earlier["model.keras"]

    # Without overwrite: the leftover is dealt with, then the (earlier or completed) export refuses as usual.
    with pytest.warns(UserWarning) as record:
        with pytest.raises(InvalidParameterError, match="without an earlier export"):
            export_pruned(_model(2), target, formats=("keras",))
    if step <= 2:
        message = (f"export_pruned: removed {leftover!r}, the staging directory of an interrupted export; it held "
                   "only new artifacts that export had not put in place.")
    elif step == 6:
        message = (f"export_pruned: removed {leftover!r}, the staging directory of an interrupted export that had "
                   "put all its artifacts in place; it held only the earlier artifacts they replaced.")
    else:
        back = {3: "'manifest.json'", 4: "'model.keras', 'manifest.json'", 5: "'model.keras', 'manifest.json'"}
        message = (f"export_pruned: an export into {str(target)!r} was interrupted while it replaced the artifacts "
                   f"there; put back the earlier {back[step]} from its staging directory {leftover!r}"
                   + (", took out its new 'model.keras'" if step == 5 else "")
                   + ", and removed that staging directory.")
    assert _export_messages(record) == [message]
    assert [w.filename for w in record if str(w.message).startswith("export_pruned:")] == [__file__]  # the caller
    assert _tree(target) == expected  # nothing lost, nothing left over
    assert {k: v for k, v in expected.items() if k in users} == users

    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        result = export_pruned(_model(2), target, formats=("keras",), overwrite=True)
    assert _export_messages(record) == []
    assert result.replaced == (str(target / "model.keras"), str(target / "manifest.json"))
    assert sorted(set(_tree(target)) - set(users)) == ["manifest.json", "model.keras"]
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_an_export_killed_with_sigkill_is_put_back_by_the_next_one(tmp_path):
    """A real kill -9, in a child process, after the new model came in and before the new manifest did."""
    target = tmp_path / "out"
    users = _users_files(target)
    export_pruned(_model(0), target, formats=("keras",))
    earlier = _tree(target)
    child = textwrap.dedent(
        """
        import os, signal, sys
        import keras
        from keras_group_lasso import export_pruned

        model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(4), keras.layers.Dense(2)])
        rename, done = os.rename, []

        def rename_then_die(source, destination):
            if len(done) == 3:  # the earlier manifest and model went aside, the new model came in
                os.kill(os.getpid(), signal.SIGKILL)
            rename(source, destination)
            done.append(destination)

        os.rename = rename_then_die
        export_pruned(model, sys.argv[1], formats=("keras",), overwrite=True)
        """
    )
    env = dict(os.environ, KERAS_BACKEND=keras.backend.backend(), TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run([sys.executable, "-c", child, str(target)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert "manifest.json" not in os.listdir(target)  # what the user found: no manifest, a hidden directory
    [leftover] = _hidden(target)
    assert sorted(os.listdir(target / leftover / ".replaced")) == ["manifest.json", "model.keras"]

    with pytest.warns(UserWarning) as record:
        with pytest.raises(InvalidParameterError, match="without an earlier export"):
            export_pruned(_model(2), target, formats=("keras",))
    assert _export_messages(record) == [
        (f"export_pruned: an export into {str(target)!r} was interrupted while it replaced the artifacts there; put "
        f"back the earlier 'model.keras', 'manifest.json' from its staging directory {str(target / leftover)!r}, "
        "took out its new 'model.keras', and removed that staging directory.")
    ]
    assert _tree(target) == earlier
    assert {k: v for k, v in _tree(target).items() if k in users} == users


def test_a_killed_export_into_a_new_directory_leaves_nothing_the_next_one_keeps(tmp_path, monkeypatch):
    target = tmp_path / "out"
    (tmp_path / "other.txt").write_text("next to the export")
    _die_at(monkeypatch, 2, tmp_path)  # built whole next to the target, killed before it was renamed into place
    with pytest.raises(_Killed):
        export_pruned(_model(0), target, formats=("keras",))
    monkeypatch.undo()
    [leftover] = _hidden(tmp_path)
    assert leftover.startswith(".out.partial-") and not target.exists()
    assert sorted(os.listdir(tmp_path / leftover)) == ["manifest.json", "model.keras"]

    with pytest.warns(UserWarning) as record:
        export_pruned(_model(1), target, formats=("keras",))
    assert _export_messages(record) == [
        (f"export_pruned: removed {str(tmp_path / leftover)!r}, the staging directory of an interrupted export; it "
        "held only new artifacts that export had not put in place.")
    ]
    assert sorted(os.listdir(tmp_path)) == ["other.txt", "out"]
    assert sorted(os.listdir(target)) == ["manifest.json", "model.keras"]
    assert (tmp_path / "other.txt").read_text() == "next to the export"


def _interrupted_layout(target, leftover, written):
    """``target`` and its staging directory ``leftover`` as an export killed half-way through replacing leaves
    them: written by hand, for layouts that need a format other than ``"keras"``."""
    os.makedirs(os.path.join(leftover, ".replaced"))
    manifest = {"package": "keras-group-lasso", "formats": {f: export_module._FILENAMES[f] for f in written}}
    with open(os.path.join(leftover, "manifest.json"), "w") as f:
        json.dump(manifest, f)


def test_a_new_artifact_a_killed_export_put_in_place_is_taken_out(tmp_path):
    """Killed while adding a SavedModel to a keras-only export: the SavedModel was in, the earlier model not yet
    aside."""
    target = tmp_path / "out"
    users = _users_files(target)
    export_pruned(_model(0), target, formats=("keras",))
    earlier = _tree(target)
    leftover = target / (INSIDE + "0123abcd")
    _interrupted_layout(target, leftover, ("saved_model", "keras"))
    os.rename(target / "manifest.json", leftover / ".replaced" / "manifest.json")
    (target / "saved_model" / "variables").mkdir(parents=True)
    (target / "saved_model" / "saved_model.pb").write_bytes(b"the killed export's")
    (leftover / "model.keras").write_bytes(b"the killed export's model")

    with pytest.warns(UserWarning) as record:
        with pytest.raises(InvalidParameterError, match="without an earlier export"):
            export_pruned(_model(2), target, formats=("keras",))
    assert _export_messages(record) == [
        (f"export_pruned: an export into {str(target)!r} was interrupted while it replaced the artifacts there; put "
        f"back the earlier 'manifest.json' from its staging directory {str(leftover)!r}, took out its new "
        "'saved_model', and removed that staging directory.")
    ]
    assert _tree(target) == earlier
    assert {k: v for k, v in earlier.items() if k in users} == users


def test_earlier_artifacts_that_cannot_be_put_back_stay_where_they_are_and_are_named(tmp_path):
    target = tmp_path / "out"
    export_pruned(_model(0), target, formats=("keras",))
    leftover = target / (INSIDE + "0123abcd")
    _interrupted_layout(target, leftover, ("keras",))
    os.rename(target / "manifest.json", leftover / ".replaced" / "manifest.json")
    os.rename(target / "model.keras", leftover / ".replaced" / "model.keras")
    (leftover / "model.keras").write_bytes(b"the killed export's model")
    (target / "model.keras").write_bytes(b"a model.keras that no export wrote")  # neither new nor earlier
    kept = _tree(leftover)

    with pytest.warns(UserWarning) as record:
        export_pruned(_model(2), target, formats=("keras",), overwrite=True)
    messages = _export_messages(record)
    assert messages[0] == (
        f"export_pruned: left {str(leftover)!r} in place: it holds the earlier 'model.keras', 'manifest.json' of "
        f"{str(target)!r}, taken aside by an interrupted export, and {str(target)!r} now holds another "
        "'model.keras'; move back what you need by hand."
    )
    assert _tree(leftover) == kept  # all of it, manifest too: a manifest.json beside a foreign model would lie
    assert sorted(os.listdir(target)) == [INSIDE + "0123abcd", "manifest.json", "model.keras"]


@pytest.mark.skipif(fcntl is None, reason="no advisory file locks on this system")
def test_a_staging_directory_that_another_export_is_writing_is_left_alone(tmp_path):
    target = tmp_path / "out"
    export_pruned(_model(0), target, formats=("keras",))
    busy = target / (INSIDE + "0123abcd")
    busy.mkdir()
    (busy / "model.keras").write_bytes(b"being written")
    fd = os.open(busy, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # what the other export holds while it writes
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            export_pruned(_model(1), target, formats=("keras",), overwrite=True)
    finally:
        os.close(fd)
    assert _export_messages(record) == []
    assert _tree(busy) == {"model.keras": b"being written"}


@pytest.mark.skipif(fcntl is None, reason="no advisory file locks on this system")
def test_an_export_started_while_another_one_builds_leaves_its_staging_directory_alone(tmp_path, monkeypatch):
    target = tmp_path / "out"
    export_pruned(_model(0), target, formats=("keras",))
    write_manifest, seen = export_module._write_manifest_file, {}

    def write_after_another_export(path, manifest):
        if not seen:  # the first export, its model built: a second one runs to the end meanwhile
            seen["staging"] = sorted(os.listdir(os.path.dirname(path)))
            with warnings.catch_warnings(record=True) as record:
                warnings.simplefilter("always")
                seen["second"] = export_pruned(_model(1), target, formats=("keras",), overwrite=True)
            seen["messages"] = _export_messages(record)
            seen["staging after"] = sorted(os.listdir(os.path.dirname(path)))
        write_manifest(path, manifest)

    monkeypatch.setattr(export_module, "_write_manifest_file", write_after_another_export)
    first = export_pruned(_model(2), target, formats=("keras",), overwrite=True)
    assert seen["messages"] == []
    assert seen["staging"] == seen["staging after"] == ["model.keras"]
    assert seen["second"].replaced == first.replaced == (str(target / "model.keras"), str(target / "manifest.json"))
    assert sorted(os.listdir(target)) == ["manifest.json", "model.keras"]


def test_only_staging_directories_of_this_export_are_taken_for_leftovers(tmp_path):
    target = tmp_path / "out"
    export_pruned(_model(0), target, formats=("keras",))
    look_alikes = {
        target / (INSIDE + "0123abcd.txt"): "dir",  # not 8 hex digits
        target / (INSIDE + "0123ABCD"): "dir",
        target / (INSIDE + "89abcdef"): "file",  # not a directory
        tmp_path / ".other.partial-0123abcd": "dir",  # another target's
        tmp_path / "out.partial-0123abcd": "dir",
    }
    for path, kind in look_alikes.items():
        if kind == "dir":
            path.mkdir()
            (path / "keep.txt").write_text("someone's")
        else:
            path.write_text("someone's")
    (target / (INSIDE + "01234567")).symlink_to(tmp_path / ".other.partial-0123abcd")
    before = _tree(tmp_path)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        with pytest.raises(InvalidParameterError, match="without an earlier export"):
            export_pruned(_model(1), target, formats=("keras",))
    assert _export_messages(record) == []
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("umask", [0o002, 0o022], ids=oct)
def test_the_saved_model_follows_the_umask(tmp_path, umask):
    pytest.importorskip("tensorflow", reason="SavedModel needs TensorFlow")
    target = tmp_path / "out"
    old = os.umask(umask)
    try:
        export_pruned(_model(0), target, formats=("saved_model", "keras"))
    finally:
        os.umask(old)
    modes = {os.path.relpath(os.path.join(root, name), tmp_path): os.stat(os.path.join(root, name)).st_mode & 0o777
             for root, dirs, files in os.walk(target) for name in dirs + files}
    assert os.path.join("out", "saved_model", "saved_model.pb") in modes
    expected = {path: 0o666 & ~umask if os.path.isfile(tmp_path / path) else 0o777 & ~umask for path in modes}
    assert modes == expected
    assert target.stat().st_mode & 0o777 == 0o777 & ~umask
