"""Declared constraints on the estimators' parameters, and the check that reads them.

Each estimator declares, per constructor parameter, a list of constraints; a
value is valid when at least one of them accepts it. A value that none accepts
raises :class:`ParameterError` with scikit-learn's message form::

    The '<name>' parameter of <Estimator> must be <c_1>, <c_2> or <c_n>. Got <value!r> instead.

where each ``<c_i>`` describes one constraint (``an int in the range [1, inf)``,
``a str among {'adam', 'sgd'}``, ``None``, ...).

A declaration holds :class:`Interval` and :class:`StrOptions` objects, ``None``,
the builtin ``callable``, or one of the names ``"boolean"``, ``"array-like"``,
``"random_state"``, ``"verbose"`` and ``"cv_object"`` (see :data:`NAMED`).

Like scikit-learn, an int interval accepts ``bool`` (a ``bool`` is an
``numbers.Integral``) and a float interval accepts any real number, ints included.
"""

import math
import numbers
from collections.abc import Iterable

import numpy as np

from keras_group_lasso._validation import InvalidParameterError

__all__ = ["ParameterError", "Interval", "StrOptions", "check_parameters"]


class ParameterError(InvalidParameterError):
    """A bad estimator parameter, in scikit-learn's message form.

    ``The '<name>' parameter of <Estimator> must be <constraint>. Got <value!r> instead.``

    It is a :class:`keras_group_lasso.InvalidParameterError`, so also a
    ``ValueError`` and a ``TypeError``: code that catches either of those (as
    code written for scikit-learn's estimators does) catches it.
    """


def _join(descriptions):
    """``"a"``, ``"a or b"``, ``"a, b or c"``."""
    descriptions = [str(d) for d in descriptions]
    if len(descriptions) == 1:
        return descriptions[0]
    return f"{', '.join(descriptions[:-1])} or {descriptions[-1]}"


def _type_name(kind):
    module = kind.__module__
    return kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"


class Constraint:
    """One kind of accepted value: :meth:`accepts` says whether a value is one, ``str`` describes it."""

    def accepts(self, value):
        raise NotImplementedError

    def __str__(self):
        raise NotImplementedError

    def __repr__(self):
        return f"<{type(self).__name__}: {self}>"


class Interval(Constraint):
    """Numbers of one kind between two bounds, each end open or closed.

    Args:
        kind: ``numbers.Integral`` (described as ``an int``) or
            ``numbers.Real`` (``a float``; ints are accepted too).
        left, right: the bounds; ``None`` for ``-inf`` / ``inf``.
        closed: ``"left"``, ``"right"``, ``"both"`` or ``"neither"``: which
            bounds belong to the interval. An infinite bound never does, and
            NaN is in no interval.

    Example:
        >>> import numbers
        >>> rate = Interval(numbers.Real, 0, None, closed="neither")
        >>> str(rate), rate.accepts(0.1), rate.accepts(0), rate.accepts(float("inf"))
        ('a float in the range (0.0, inf)', True, False, False)
    """

    def __init__(self, kind, left, right, *, closed):
        if kind not in (numbers.Integral, numbers.Real):
            raise ValueError(f"Interval: argument `kind` must be numbers.Integral or numbers.Real; received {kind!r}.")
        if closed not in ("left", "right", "both", "neither"):
            raise ValueError(
                f"Interval: argument `closed` must be one of 'left', 'right', 'both', 'neither'; received {closed!r}."
            )
        self.kind = kind
        self.left = left
        self.right = right
        self.closed = closed

    def accepts(self, value):
        if not isinstance(value, self.kind):
            return False
        if not isinstance(value, numbers.Integral) and math.isnan(value):
            return False
        low = -math.inf if self.left is None else self.left
        high = math.inf if self.right is None else self.right
        above_low = value >= low if self.closed in ("left", "both") else value > low
        below_high = value <= high if self.closed in ("right", "both") else value < high
        return bool(above_low and below_high)

    def _bound(self, bound, infinity):
        if bound is None:
            return infinity
        return bound if self.kind is numbers.Integral else float(bound)

    def __str__(self):
        kind = "an int" if self.kind is numbers.Integral else "a float"
        opening = "[" if self.closed in ("left", "both") else "("
        closing = "]" if self.closed in ("right", "both") else ")"
        return (
            f"{kind} in the range {opening}{self._bound(self.left, '-inf')}, "
            f"{self._bound(self.right, 'inf')}{closing}"
        )


class StrOptions(Constraint):
    """One of a fixed set of strings (described in sorted order).

    Example:
        >>> solver = StrOptions({"sgd", "adam"})
        >>> str(solver), solver.accepts("adam"), solver.accepts("lbfgs")
        ("a str among {'adam', 'sgd'}", True, False)
    """

    def __init__(self, options):
        self.options = frozenset(options)

    def accepts(self, value):
        return isinstance(value, str) and value in self.options

    def __str__(self):
        return f"a str among {{{', '.join(repr(o) for o in sorted(self.options))}}}"


class _InstanceOf(Constraint):
    def __init__(self, kind):
        self.kind = kind

    def accepts(self, value):
        return isinstance(value, self.kind)

    def __str__(self):
        return f"an instance of {_type_name(self.kind)!r}"


class _NoneValue(Constraint):
    def accepts(self, value):
        return value is None

    def __str__(self):
        return "None"


class _Callable(Constraint):
    def accepts(self, value):
        return callable(value)

    def __str__(self):
        return "a callable"


class _ArrayLike(Constraint):
    """What numpy can read as an array of at least one dimension (a list, a tuple, an array), not a scalar."""

    def accepts(self, value):
        has_array_form = hasattr(value, "__len__") or hasattr(value, "shape") or hasattr(value, "__array__")
        return has_array_form and not np.isscalar(value)

    def __str__(self):
        return "an array-like"


class _HasMethods(Constraint):
    def __init__(self, *methods):
        self.methods = methods

    def accepts(self, value):
        return all(callable(getattr(value, name, None)) for name in self.methods)

    def __str__(self):
        names = [repr(name) for name in self.methods]
        listed = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
        return f"an object implementing {listed}"


class _IterableNotStr(Constraint):
    def accepts(self, value):
        return isinstance(value, Iterable) and not isinstance(value, str)

    def __str__(self):
        return "an iterable"


class _AnyOf(Constraint):
    """Accepted by any of ``parts``; described as their list (``a, b or c``)."""

    def __init__(self, *parts):
        self.parts = parts

    def accepts(self, value):
        return any(part.accepts(value) for part in self.parts)

    def __str__(self):
        return _join(self.parts)


_BOOLEAN = _AnyOf(_InstanceOf(bool), _InstanceOf(np.bool_))

NAMED = {
    # True or False, as a Python or a numpy bool (not 0 or 1).
    "boolean": _BOOLEAN,
    "array-like": _ArrayLike(),
    # Anything sklearn.utils.check_random_state takes.
    "random_state": _AnyOf(
        Interval(numbers.Integral, 0, 2**32 - 1, closed="both"), _InstanceOf(np.random.RandomState), _NoneValue()
    ),
    "verbose": _AnyOf(Interval(numbers.Integral, 0, None, closed="left"), *_BOOLEAN.parts),
    # Anything sklearn.model_selection.check_cv takes: a number of folds, a splitter, (train, test) pairs.
    "cv_object": _AnyOf(
        Interval(numbers.Integral, 2, None, closed="left"),
        _HasMethods("split", "get_n_splits"),
        _IterableNotStr(),
        _NoneValue(),
    ),
}
"""The constraints a declaration may name by a string."""


def as_constraint(declared):
    """The :class:`Constraint` for one entry of a declaration.

    ``None`` accepts ``None``, the builtin ``callable`` any callable, a name
    of :data:`NAMED` its constraint; a :class:`Constraint` is returned as is.

    Raises:
        ValueError: ``declared`` is none of these (a mistake in a declaration, not in user input).
    """
    if isinstance(declared, Constraint):
        return declared
    if declared is None:
        return _NoneValue()
    if declared is callable:
        return _Callable()
    if isinstance(declared, str) and declared in NAMED:
        return NAMED[declared]
    raise ValueError(
        f"as_constraint: argument `declared` must be a Constraint, None, callable or one of "
        f"{', '.join(repr(n) for n in NAMED)}; received {declared!r}."
    )


def check_parameters(constraints, params, owner):
    """Check each value of ``params`` that has an entry in ``constraints``; raise on the first bad one.

    A value is valid when any constraint of its entry accepts it; ``params``
    without an entry are not checked.

    Args:
        constraints: ``{name: [declared constraint, ...]}`` (see :func:`as_constraint`).
        params: ``{name: value}``, checked in its order.
        owner: the name in the message, e.g. the estimator's class name.

    Raises:
        ParameterError: ``The '<name>' parameter of <owner> must be <constraints>. Got <value!r> instead.``

    Example:
        >>> import numbers
        >>> constraints = {"epochs": [Interval(numbers.Integral, 1, None, closed="left")],
        ...                "batch_size": [StrOptions({"auto"}), Interval(numbers.Integral, 1, None, closed="left")]}
        >>> check_parameters(constraints, {"epochs": 10, "batch_size": "auto"}, "Model")
        >>> check_parameters(constraints, {"epochs": 10, "batch_size": 0}, "Model")
        Traceback (most recent call last):
        ...
        keras_group_lasso.sklearn._constraints.ParameterError: The 'batch_size' parameter of Model must be
        a str among {'auto'} or an int in the range [1, inf). Got 0 instead.
    """
    for name, value in params.items():
        if name not in constraints:
            continue
        accepted = [as_constraint(c) for c in constraints[name]]
        if any(c.accepts(value) for c in accepted):
            continue
        raise ParameterError(f"The {name!r} parameter of {owner} must be {_join(accepted)}. Got {value!r} instead.")
