import os

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
