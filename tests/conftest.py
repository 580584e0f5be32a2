import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import pytest

BACKEND = keras.backend.backend()


@pytest.fixture(autouse=True)
def _seed_everything():
    keras.utils.set_random_seed(0)
    yield
    keras.backend.clear_session()


@pytest.fixture
def rng():
    return np.random.default_rng(0)


requires_tensorflow_backend = pytest.mark.skipif(
    BACKEND != "tensorflow", reason="needs the TensorFlow backend"
)
