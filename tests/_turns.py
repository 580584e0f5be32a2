"""How the cases of a test marked ``turns`` are dealt out over the backends of a run (see ``conftest.py``)."""

import collections
import zlib


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
