"""Argument checks shared by every public object.

Every check raises :class:`InvalidParameterError` with one message form::

    <Owner>: argument `<name>` must be <constraint>; received <value!r>.
"""

import math
import numbers

__all__ = [
    "InvalidParameterError",
    "NonFiniteError",
    "check_non_negative",
    "check_positive_int",
    "check_choice",
]


class InvalidParameterError(ValueError, TypeError):
    """A public function or class received an argument it cannot use.

    It subclasses both ``ValueError`` and ``TypeError`` so that callers who
    catch either (as scikit-learn and Keras users commonly do) keep working.
    """


class NonFiniteError(ValueError):
    """Weights or a training loss are NaN or infinite: the training diverged.

    Raised instead of treating NaN as a number: a NaN weight is neither zero
    nor alive, so no report, pruning or fitted estimator can be made from it.
    The message names the owner, what is not finite and the usual causes
    (unscaled inputs, a too large learning rate).

    Attributes:
        names: ``"layer/weight"`` of each weight that is not finite (may be
            empty when only a loss was not finite).
    """

    def __init__(self, message, names=()):
        super().__init__(message)
        self.names = tuple(names)


class Described:
    """A value shown in an error message by its description (a tensor's repr can print all its values)."""

    def __init__(self, text):
        self.text = text

    def __repr__(self):
        return self.text


def fail(owner, name, constraint, value):
    """Raise the project's one error form for a bad argument."""
    raise InvalidParameterError(
        f"{owner}: argument `{name}` must be {constraint}; received {value!r}."
    )


def _is_real(value):
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_non_negative(owner, name, value, allow_none=False):
    """Return ``value`` as a float if it is a finite real number >= 0.

    Args:
        owner: the class or function name shown in the message.
        name: the argument name shown in the message.
        value: what the user passed.
        allow_none: accept ``None`` (returned unchanged).

    Raises:
        InvalidParameterError: for bools, non-numbers, NaN, infinities and
            negative numbers.
    """
    if value is None and allow_none:
        return None
    constraint = "a finite number >= 0" + (" or None" if allow_none else "")
    if not _is_real(value):
        # numpy scalars of a float/int dtype are numbers.Real already; a 0-d
        # array is not, so accept it explicitly.
        try:
            import numpy as np

            if isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in "fiu":
                value = value.item()
            else:
                fail(owner, name, constraint, value)
        except ImportError:  # pragma: no cover - numpy is a dependency
            fail(owner, name, constraint, value)
    value = float(value)
    if not math.isfinite(value) or value < 0:
        fail(owner, name, constraint, value)
    return value


def check_positive_int(owner, name, value, minimum=1):
    """Return ``value`` if it is an int >= ``minimum`` (bools rejected)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        fail(owner, name, f"an integer >= {minimum}", value)
    return int(value)


def check_choice(owner, name, value, choices):
    """Return ``value`` if it is one of ``choices``."""
    if not isinstance(value, str) or value not in choices:
        options = ", ".join(repr(c) for c in choices)
        fail(owner, name, f"one of {options}", value)
    return value
