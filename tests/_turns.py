"""How the cases of a test marked ``turns`` are dealt out over the backends of a run (see ``conftest.py``)."""

import collections
import os
import zlib

import keras
import pytest


def deal(tests, backends):
    """The backend of each case: ``tests`` names each case's test (one entry per case, in collection order).

    The cases of one test go round the ``backends`` in turn, from a backend that depends on the test's name (so
    that tests of one case each do not all land on the first backend): every case on exactly one backend, and each
    backend gets a share of every test's cases that differs from another's by at most one. A backend named twice
    takes two shares (a faster leg of the run).
    """
    dealt = collections.Counter()
    out = []
    for test in tests:
        out.append(backends[(zlib.crc32(test.encode()) + dealt[test]) % len(backends)])
        dealt[test] += 1
    return out


def widest(backends):
    """The backend named most often in ``backends`` (the one with the most shares: the shortest leg of a run), or
    ``None`` when fewer than two are named (pytest called alone: no run to balance)."""
    if len(backends) < 2:
        return None
    return max(dict.fromkeys(backends), key=backends.count)


def own_processes(what):
    """The skip mark of a test module whose checks run in processes of their own (``what``), whichever backend runs
    pytest: a run of ``scripts/test.sh`` starts them from its shortest leg (:func:`widest` of ``TEST_TURNS``), so that
    the longest legs do not wait for them; pytest alone starts them from any backend."""
    leg = widest(os.environ.get("TEST_TURNS", "").split())
    return pytest.mark.skipif(leg not in (None, keras.backend.backend()),
                              reason=f"{what}: started from the {leg} leg of the run")
