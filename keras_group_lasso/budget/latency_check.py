"""When a latency budget's ``fit`` ends: time the pruned model beside the dense one and compare with the table."""

import logging
import warnings

import keras

from keras_group_lasso import analysis
from keras_group_lasso._validation import InvalidParameterError
from keras_group_lasso.costs import LatencyTable, current_device
from keras_group_lasso.surgery import prune_model

__all__ = ["MEASURED_SLACK", "time_pruned"]

_LOG = logging.getLogger("keras_group_lasso")
#: A pruned model measured above ``(1 + MEASURED_SLACK) * budget`` of the dense one measured beside it is warned of.
MEASURED_SLACK = 0.1


def time_pruned(model, table, threshold, batch_size, limit, owner):
    """Build ``model``'s pruned model at ``threshold``, time it and the dense ``model`` side by side at
    ``batch_size``, and compare with what ``table`` predicts.

    ``limit`` is the budget in the table's seconds. Returns ``{"batch_size", "predicted", "measured",
    "dense_predicted", "dense_measured", "predicted_speedup", "measured_speedup", "budget"}`` (seconds), or
    ``None`` when the table was measured on another backend or device (its times do not apply here) or the
    model cannot be pruned (with a warning). Logs the result; warns when the pruned model measures more than
    ``MEASURED_SLACK`` over its budget's share of the dense time.
    """
    here = (keras.backend.backend(), current_device())
    if (table.backend, table.device) != here:
        _LOG.info("%s: the pruned model is not timed: the latency table was measured on %s, %s, fit runs on %s, %s.",
                  owner, table.backend, table.device, *here)
        return None
    found = analysis.analyze(model, threshold, owner=owner)
    predicted = table.predict(table.widths_of(found), batch_size)
    dense_predicted = table.predict(None, batch_size)
    try:
        pruned = prune_model(model, threshold, blocks="flatten")  # what it computes, the same either way
    except InvalidParameterError as error:  # the trained model cannot be pruned: say so, keep the training
        warnings.warn(f"{owner}: the pruned model is not timed: {error}", RuntimeWarning, stacklevel=3)
        return None
    measured, dense_measured = LatencyTable.time_models([pruned, model], batch_size)
    result = {
        "batch_size": batch_size,
        "predicted": predicted,
        "measured": measured,
        "dense_predicted": dense_predicted,
        "dense_measured": dense_measured,
        "predicted_speedup": dense_predicted / predicted,
        "measured_speedup": dense_measured / measured,
        "budget": limit,
    }
    _LOG.info("%s: the pruned model takes %s at batch %d, predicted %s (dense: %s measured now, %s in the table); "
              "speed-up measured %.2fx, predicted %.2fx.", owner, _ms(measured), batch_size, _ms(predicted),
              _ms(dense_measured), _ms(dense_predicted), result["measured_speedup"], result["predicted_speedup"])
    asked = limit / dense_predicted  # the budget as a fraction of the dense time
    if measured > (1.0 + MEASURED_SLACK) * asked * dense_measured:
        warnings.warn(
            f"{owner}: the pruned model measured {_ms(measured)} at batch {batch_size}, "
            f"{measured / dense_measured:.2f} of the dense model's {_ms(dense_measured)} measured beside it; the "
            f"budget asked {asked:.2f} and the latency table predicted {predicted / dense_predicted:.2f}. A table "
            "measured on a quiet machine (or with more repeats) predicts closer.",
            RuntimeWarning,
            stacklevel=3,
        )
    return result


def _ms(seconds):
    return f"{1e3 * seconds:.3g} ms"
