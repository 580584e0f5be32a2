import gc
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import pytest

import _turns


@pytest.fixture(autouse=True)
def _seed_everything():
    keras.utils.set_random_seed(0)


@pytest.fixture(autouse=True, scope="module")
def _fresh_session_per_module():
    # clear_session is slow on JAX (~0.3 s): once per module, not per test.
    yield
    keras.backend.clear_session(free_memory=False)


@pytest.fixture
def rng():
    return np.random.default_rng(0)


# Python's cycle collector scans every object it tracks in its oldest generation: a test process holds about a
# million (the backends' modules, the models tests build), and with the default thresholds that scan took 5-7 % of the
# process's CPU time (TensorFlow, test_applications.py and test_keras_hub.py: 12.8 of 178 s). What the imports made
# is frozen once the tests are collected (never scanned again) and the collector runs less often: test_applications.py
# spent 2.2 s in it instead of 5.3, its peak memory 8 % higher.
gc.set_threshold(10_000, 10, 10)


def pytest_collection_finish(session):
    gc.collect()
    gc.freeze()


def pytest_configure(config):
    config.addinivalue_line("markers", "turns: the cases of this test take turns over the backends of a "
                            "`scripts/test.sh` run (each runs on one of them; see pytest_collection_modifyitems)")


def pytest_collection_modifyitems(config, items):
    """The cases of a test marked ``turns`` (many alike: model families, documentation blocks) take turns over the
    backends of a run of ``scripts/test.sh`` (``TEST_TURNS``, the backends it runs): each case runs on one of them
    (:func:`_turns.deal`). Without ``TEST_TURNS`` (pytest called alone) every case runs."""
    backends = os.environ.get("TEST_TURNS", "").split()
    if len(backends) < 2 or keras.backend.backend() not in backends:
        return
    marked = [item for item in items if item.get_closest_marker("turns") is not None]
    tests = [f"{item.path.name}::{getattr(item, 'originalname', item.name)}" for item in marked]
    drop = {id(item) for item, backend in zip(marked, _turns.deal(tests, backends))
            if backend != keras.backend.backend()}
    if drop:
        config.hook.pytest_deselected(items=[item for item in items if id(item) in drop])
        items[:] = [item for item in items if id(item) not in drop]
