"""The cases of a test marked ``turns`` are dealt out over the backends: each once, evenly."""

import collections

from hypothesis import given
from hypothesis import strategies as st

from _turns import deal

BACKENDS = ("tensorflow", "jax", "torch")


@given(st.lists(st.sampled_from(["a.py::f", "a.py::g", "b.py::f", "docs::block"]), max_size=60),
       st.integers(2, 3))
def test_every_case_goes_to_one_backend_and_each_gets_an_even_share_of_every_test(tests, n):
    backends = BACKENDS[:n]
    dealt = deal(tests, backends)
    assert len(dealt) == len(tests) and set(dealt) <= set(backends)
    assert deal(tests, backends) == dealt  # the same in every backend's process
    for test in set(tests):
        shares = collections.Counter(b for t, b in zip(tests, dealt) if t == test)
        counts = [shares[b] for b in backends]
        assert max(counts) - min(counts) <= 1


def test_a_backend_named_twice_takes_two_shares():
    tests = ["docs::block"] * 40
    shares = collections.Counter(deal(tests, BACKENDS + ("torch",)))
    assert shares == {"torch": 20, "tensorflow": 10, "jax": 10}


def test_tests_of_one_case_each_spread_over_the_backends():
    dealt = deal([f"test_x.py::test_{i}" for i in range(30)], BACKENDS)
    assert set(dealt) == set(BACKENDS)
