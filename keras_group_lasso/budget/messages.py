"""What a budget says when it cannot do what was asked quietly: the texts of its warnings (the callback warns)."""

from keras_group_lasso.budget.latency_limit import milliseconds

__all__ = ["size_text", "sizes_text", "within_already", "far_below", "unmeetable", "cut_to_meet", "restored_over"]


def size_text(kind, value):
    """A budgeted size in words: a count, or milliseconds for the latency.

    Example:
        >>> size_text("flops", 1200), size_text("latency", 0.0042)
        ('1200', '4.2 ms')
    """
    return milliseconds(value) if kind == "latency" else str(value)


def sizes_text(sizes, limits):
    """``"kind size (budget limit), ..."`` for every budgeted kind."""
    return ", ".join(f"{kind} {size_text(kind, sizes[kind])} (budget {size_text(kind, limit)})"
                     for kind, limit in limits.items())


def within_already(owner, notes):
    """The warning when the dense model meets some budgets already (``notes``: one for each)."""
    return (f"{owner}: {', '.join(notes)}: the dense model is within it already; the budget removes nothing for "
            "it.")


def far_below(owner, sizes, limits, dense, epoch):
    """The warning when settling begins below half a budget (the penalties took more than was asked), or ``None``."""
    far = [f"{kind} {size_text(kind, sizes[kind])} (budget {size_text(kind, limit)})"
           for kind, limit in limits.items() if sizes[kind] < 0.5 * limit and sizes[kind] < dense[kind]]
    if not far:
        return None
    return (f"{owner}: at the end of epoch {epoch + 1} the model was far below its budget: {', '.join(far)}. The "
            "penalties removed more than the budget asks before they could be eased (with Proximal a group at zero "
            "stays there); a smaller penalty factor lets the search land closer.")


def unmeetable(owner, newly, sizes, limits, frozen_layers, unread):
    """The warning when even every group a cut may take leaves the model over its budget. ``frozen_layers``: names
    of penalised layers with ``trainable=False``; ``unread``: the text naming kernels the graph cannot read, or
    ``""``."""
    frozen = (f", and so do frozen layers (trainable=False: {', '.join(frozen_layers)}), whose weights the budget "
              "never changes" if frozen_layers else "")
    frozen += f", and the kernels of {unread}" if unread else ""
    return (f"{owner}: the budget cannot be met: with every group it may cut set to zero ({newly} newly) the model has "
            f"{sizes_text(sizes, limits)}. The strongest group of every layer stays, and layers without a group "
            f"penalty keep their size{frozen}; ask for a larger budget.")


def cut_to_meet(owner, what, sizes, limits, epoch, stale_statistics):
    """The warning when ``what`` (groups, units) was set to zero at once to meet the budget (``epoch`` ``None``: when
    training ended; ``stale_statistics``: BatchNormalization statistics had no step left to be renewed)."""
    when = "at the end of training" if epoch is None else f"at the end of epoch {epoch + 1}"
    stale = (" Its BatchNormalization statistics were gathered before the cut, and no training step was left to "
             "renew them: run the model over training data in training mode before inference, or let settling "
             "begin an epoch or more before the end (settle)." if stale_statistics else "")
    return (f"{owner}: {when} the model was still over its budget; {what} to meet it: {sizes_text(sizes, limits)} "
            "(logs['budget_cut'] counts them at the epoch they went). A larger penalty factor or more epochs let "
            f"the training get closer by itself.{stale}")


def restored_over(owner):
    """The warning when a callback after the budget gave the model weights over it as ``fit`` ended."""
    return (f"{owner}: a callback after it gave the model weights over its budget when fit ended "
            "(EarlyStopping(restore_best_weights=True) restores weights from an epoch before the budget was "
            "reached); their weakest groups are set to zero again to meet it.")
