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


def pytest_collection_modifyitems(config, items):
    # The scikit-learn estimators' examples train several networks each; eager PyTorch takes 17-44 s per example
    # here (three minutes in all). On PyTorch tests/test_sklearn.py and test_sklearn_cv.py run the same estimator
    # code; the examples themselves run on TensorFlow and JAX.
    if keras.backend.backend() != "torch":
        return
    skip = pytest.mark.skip(reason="the scikit-learn examples run on TensorFlow and JAX (slow on eager PyTorch)")
    for item in items:
        if isinstance(item, pytest.DoctestItem) and "keras_group_lasso/sklearn/" in str(item.path).replace("\\", "/"):
            item.add_marker(skip)
