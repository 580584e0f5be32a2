import collections
import os
import zlib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import pytest


@pytest.fixture(autouse=True)
def _seed_everything():
    keras.utils.set_random_seed(0)


@pytest.fixture(autouse=True, scope="module")
def _fresh_session_per_module():
    # clear_session is slow on JAX (~0.3 s): once per module, not per test.
    yield
    keras.backend.clear_session()


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def pytest_configure(config):
    config.addinivalue_line("markers", "turns: the cases of this test take turns over the backends of a "
                            "`scripts/test.sh` run (each runs on one of them; see pytest_collection_modifyitems)")


def pytest_collection_modifyitems(config, items):
    """The cases of a test marked ``turns`` (many alike: model families, documentation blocks) take turns over the
    backends of a run of ``scripts/test.sh`` (``TEST_TURNS``, the backends it runs): each case runs on one of them,
    each backend runs a third of them. Without ``TEST_TURNS`` (pytest called alone) every case runs."""
    backends = os.environ.get("TEST_TURNS", "").split()
    backend = keras.backend.backend()
    if len(backends) < 2 or backend not in backends:
        return
    dealt = collections.Counter()
    keep, drop = [], []
    for item in items:
        if item.get_closest_marker("turns") is None:
            keep.append(item)
            continue
        test = f"{item.path.name}::{getattr(item, 'originalname', item.name)}"
        turn = dealt[test] + zlib.crc32(test.encode())  # the first case of each test starts at another backend
        dealt[test] += 1
        (keep if backends[turn % len(backends)] == backend else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
