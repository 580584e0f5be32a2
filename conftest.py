"""Shared by the doctests: every ``>>>`` example in the package runs under pytest.

Examples use ``keras``, ``np`` (numpy) and ``ops`` (``keras.ops``) without
importing them, and start from the same random seed, so what they print is
the same on every run.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import pytest


@pytest.fixture(autouse=True, scope="session")
def _doctest_names(doctest_namespace):
    doctest_namespace.update(keras=keras, np=np, ops=keras.ops)


@pytest.fixture(autouse=True)
def _seed():
    # tests/conftest.py seeds the same way; the doctests need it too.
    keras.utils.set_random_seed(0)
