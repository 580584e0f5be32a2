"""A latency budget: its table (given, kept in the model's state, or measured), the batch size it counts at and its
limit in the table's seconds."""

import json
import logging

import keras

from keras_group_lasso._validation import InvalidParameterError, fail
from keras_group_lasso.budget import schedule
from keras_group_lasso.costs import LatencyTable, current_device

__all__ = ["LatencyLimit", "LATENCY_BATCH_SIZE", "milliseconds"]

_LOG = logging.getLogger("keras_group_lasso")
#: The batch size a latency table is measured at when neither ``max_latency`` nor ``latency_table`` says one.
LATENCY_BATCH_SIZE = 256
# The note of the model's state that keeps the latency table a budget measured.
_TABLE_NOTE = "latency_table"


class LatencyLimit:
    """``max_latency`` (checked) and the table it is counted with.

    ``max_latency`` is a fraction of the dense model's predicted time or ``(seconds, batch size)``. The table is the
    one given; else the one a budget of an earlier (or interrupted) ``fit`` kept in the model's state, when it was
    measured for this model, backend, device and batch size; else measured when training begins (and kept).

    Example:
        >>> limit = LatencyLimit.checked("SparsityBudget", 0.25, None)
        >>> limit.batch_size, limit.given
        (256, 0.25)
    """

    def __init__(self, owner, spec, given, table):
        self.owner, self.spec, self.given, self.given_table, self.table = owner, spec, given, table, table
        self.dense = self.limit = None

    @classmethod
    def checked(cls, owner, max_latency, latency_table):
        """The limit of ``max_latency`` with ``latency_table`` (``None``: measured when training begins), or
        ``None`` without ``max_latency``.

        Raises:
            InvalidParameterError: a bad ``max_latency``, a ``latency_table`` that is not a ``LatencyTable``, one
                given without ``max_latency``, one without the batch size ``max_latency`` names, or one of several
                batch sizes with a fractional ``max_latency``.
        """
        spec = schedule.check_latency(owner, "max_latency", max_latency)
        if latency_table is not None and not isinstance(latency_table, LatencyTable):
            fail(owner, "latency_table", "None or a LatencyTable", latency_table)
        if spec is None:
            if latency_table is not None:
                fail(owner, "latency_table", "None without max_latency (the table serves a latency budget)",
                     latency_table)
            return None
        if latency_table is not None and spec[0] == "seconds" and spec[2] not in latency_table.batch_sizes:
            fail(owner, "max_latency", "a time at a batch size the latency table was measured at "
                 f"({', '.join(map(str, latency_table.batch_sizes))})", max_latency)
        if latency_table is not None and spec[0] == "fraction" and len(latency_table.batch_sizes) > 1:
            fail(owner, "latency_table", "a table of one batch size with a fractional max_latency (or give "
                 "max_latency=(seconds, batch size))", latency_table)
        return cls(owner, spec, spec[1] if spec[0] == "fraction" else spec[1:], latency_table)

    @property
    def batch_size(self):
        """The batch size the budget counts at."""
        if self.spec[0] == "seconds":
            return self.spec[2]
        return self.given_table.batch_sizes[0] if self.given_table is not None else LATENCY_BATCH_SIZE

    def predict(self, widths):
        """The table's predicted time of ``{layer name: (in, out)}`` (``None``: dense) at the budget's batch size."""
        return self.table.predict(widths, self.batch_size)

    def begin(self, model, declared, above):
        """When training begins: the table, the dense time and the limit (``above`` gains a note when the dense
        model is within it)."""
        if self.given_table is None:
            self.table = self._kept(model, declared)
            if self.table is None:
                self.table = LatencyTable.measure(model, batch_size=self.batch_size)
                _LOG.info("%s: measured the latency table in %.1f s:\n%s", self.owner, self.table.measure_seconds,
                          self.table.to_text())
                declared.set_note(_TABLE_NOTE, self.table.to_dict())
        else:
            self.table.check_model(model, owner=self.owner, name="latency_table")
        self._set_limit(above)

    def adopt_restored(self, model, declared):
        """A checkpoint restored after ``begin`` (``BackupAndRestore`` later in the list of callbacks) brings the
        table the interrupted training measured: count with that one. Returns whether the limit changed."""
        if self.given_table is not None:
            return False
        kept = declared.note(_TABLE_NOTE)
        if kept is None:  # a restored state from before any table: keep this one with it
            declared.set_note(_TABLE_NOTE, self.table.to_dict())
            return False
        if json.dumps(kept, sort_keys=True) == json.dumps(self.table.to_dict(), sort_keys=True):
            return False
        table = self._kept(model, declared)
        if table is None:
            return False
        self.table = table
        self._set_limit([])
        return True

    def _kept(self, model, declared):
        """The table the model's state keeps, or ``None`` when there is none or it does not fit this model, batch
        size, backend and device."""
        kept = declared.note(_TABLE_NOTE)
        if kept is None:
            return None
        try:
            table = LatencyTable.from_dict(kept).check_model(model, owner=self.owner, name="latency_table")
        except InvalidParameterError as error:
            _LOG.info("%s: the latency table the model's state keeps is measured again: %s", self.owner, error)
            return None
        here = (keras.backend.backend(), current_device())
        if (table.backend, table.device) != here or self.batch_size not in table.batch_sizes:
            _LOG.info("%s: the latency table the model's state keeps (%s, %s, batch sizes %s) is measured again "
                      "for %s, %s, batch size %d.", self.owner, table.backend, table.device, list(table.batch_sizes),
                      *here, self.batch_size)
            return None
        return table

    def _set_limit(self, above):
        """The dense time and the limit; a limit below the narrowest model's predicted time is refused."""
        batch = self.batch_size
        self.dense = dense = self.table.predict(None, batch)
        limit = self.spec[1] * dense if self.spec[0] == "fraction" else self.spec[1]
        if limit >= dense:
            above.append(f"max_latency={self.given!r} (the dense model takes {milliseconds(dense)} at batch {batch})")
        layers = self.table.to_dict()["batches"][str(batch)]["layers"]
        # every layer at its smallest measured widths (one unit on each axis a pruning narrows)
        floor = self.table.predict({name: (grid["in"][0], grid["out"][0]) for name, grid in layers.items()}, batch)
        if limit < floor:
            fail(self.owner, "max_latency", f"a time the model can reach: its narrowest form (every prunable layer "
                 f"one unit wide) is predicted to take {milliseconds(floor)} at batch {batch}, {floor / dense:.3g} of "
                 f"the dense model's {milliseconds(dense)} (latency table of {self.table.backend}, "
                 f"{self.table.device})", self.given)
        self.limit = min(limit, dense)


def milliseconds(seconds):
    return f"{1e3 * seconds:.3g} ms"
