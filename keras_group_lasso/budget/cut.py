"""Groups held at zero: the weakest groups a budget cuts, and the constraint that keeps them at zero.

A group is a row along axis -2 of a penalty's group view (a unit that the
layer reads); the rows of one coupled group count as one.
"""

import math

import keras
import numpy as np

from keras_group_lasso import prox
from keras_group_lasso.graph import registry
from keras_group_lasso.regularizers import CoupledGroupLasso, GroupSparseRegularizer

__all__ = ["FrozenGroups", "strength", "ranked_groups", "fewest", "fixed_units", "narrowed", "group_loads", "zeroed",
           "zero_rows", "penalised_kernels", "group_count", "dead_groups", "zero_dead_groups", "least_groups", "FORCED",
           "hold_groups", "tied_by_rank", "Slot", "freeze_groups", "hold_live", "zero_groups", "release_frozen_groups", "spare_floors"]


def penalised_kernels(model):
    """The kernels of ``model`` (rank >= 2) that carry a group penalty of this package."""
    return [v for v in model.weights
            if isinstance(getattr(v, "regularizer", None), GroupSparseRegularizer) and len(v.shape) >= 2]


def group_count(model):
    """The groups a cut may take: the rows of every penalised kernel (a channel two kernels read counts twice)."""
    return sum(int(v.regularizer.group_shape(tuple(v.shape))[-2]) for v in penalised_kernels(model))


def _largest(variable):
    """Each group's largest ``|w|``: ``(groups,)``."""
    view = variable.regularizer.group_shape(tuple(variable.shape))
    value = np.abs(np.asarray(keras.ops.convert_to_numpy(variable))).reshape(view)
    return np.max(value, axis=prox.group_axes(view))


def dead_groups(model, threshold, exact=False):
    """``{(path, row)}``: the groups of every penalised kernel whose weights are all ``<= threshold``
    (``exact``: all exactly zero)."""
    dead = set()
    for variable in penalised_kernels(model):
        largest = _largest(variable)
        dead |= {(variable.path, int(row))
                 for row in np.flatnonzero(largest == 0.0 if exact else largest <= threshold)}
    return dead


def zero_dead_groups(model, threshold):
    """Set every group at or below ``threshold`` exactly to zero (the thresholded outputs do not change)."""
    for variable in penalised_kernels(model):
        dead = _largest(variable) <= threshold
        view = variable.regularizer.group_shape(tuple(variable.shape))
        value = np.array(keras.ops.convert_to_numpy(variable))
        grouped = value.reshape(view)
        if dead.any() and np.any(grouped[..., dead, :] != 0.0):
            grouped[..., dead, :] = 0.0
            variable.assign(value)


def hold_groups(model):
    """Give every trainable group-penalised kernel of ``model`` a :class:`FrozenGroups` constraint that holds no
    group yet; returns whether a constraint was added (a compiled step holds the constraints it was traced
    with: trace it again).

    From then on :func:`freeze_groups` holds groups at zero by writing the constraints' masks, which a compiled
    step reads as it runs: the masks of a :class:`~keras_group_lasso.Proximal` optimizer on every backend, the
    constraint's own variable on TensorFlow and PyTorch (a JAX step holds the value of a variable that is
    neither the optimizer's nor trainable as it was traced).
    """
    optimizer = getattr(model, "optimizer", None)
    kept_groups = getattr(optimizer, "kept_groups", None)
    changed = False
    for variable in penalised_kernels(model):
        if not variable.trainable:
            continue
        view = variable.regularizer.group_shape(tuple(variable.shape))
        current = variable.constraint
        if isinstance(current, FrozenGroups):
            current.keep.assign(np.ones(view[-2], dtype="float32"))
            continue
        mask = kept_groups(variable) if kept_groups is not None else None
        variable.constraint = FrozenGroups(np.ones(view[-2], dtype="float32"), view, current, variable=mask)
        changed = True
    return changed


def freeze_groups(model, groups):
    """Hold ``groups`` (``{(path, row)}``) at zero after every optimizer step, and only them; returns whether the
    compiled step must be traced again to do so.

    Each kernel with such groups gets them in its :class:`FrozenGroups` constraint (applied by the optimizer
    inside the compiled step, after the constraint the kernel had). A kernel without one (see
    :func:`hold_groups`) gets one, and a constraint whose mask a traced step does not read as it runs
    (``read_as_it_runs``) changes: both need the step traced again. A kernel with none of ``groups`` whose mask
    holds some (units that rounding grew back) keeps every group again.
    """
    changed = False
    masks = list(_kernel_masks(model, groups))
    masked = {id(variable) for variable, _, _ in masks}
    for variable in model.weights:
        current = variable.constraint
        if id(variable) not in masked and isinstance(current, FrozenGroups) and not np.all(current.kept == 1.0):
            masks.append((variable, None, np.ones_like(current.kept)))
    for variable, _, keep in masks:
        if not variable.trainable:  # no optimizer step moves it
            continue
        current = variable.constraint
        if isinstance(current, FrozenGroups):
            if not np.array_equal(current.kept, keep):
                current.keep.assign(keep)
                changed = changed or not current.read_as_it_runs
            continue
        variable.constraint = FrozenGroups(keep, variable.regularizer.group_shape(tuple(variable.shape)), current)
        changed = True
    return changed


def hold_live(model, groups):
    """Hold ``groups`` (``{(path, row)}``) at zero where a step traced before reads it as it runs; returns the rest.

    A kernel whose :class:`FrozenGroups` constraint a traced step reads as it runs takes more groups through its
    mask. The groups of other kernels are returned: hold them with :func:`zero_groups` after each step until the
    step is traced again with :func:`freeze_groups`.
    """
    rest = set()
    live = {}
    for variable, _, keep in _kernel_masks(model, groups):
        constraint = variable.constraint
        if not variable.trainable or (isinstance(constraint, FrozenGroups) and constraint.read_as_it_runs):
            live[variable.path] = (constraint, keep)
    for path, row in groups:
        if path not in live:
            rest.add((path, row))
    for constraint, keep in live.values():
        if not isinstance(constraint, FrozenGroups):
            continue
        kept = constraint.kept * keep
        if not np.array_equal(kept, constraint.kept):
            constraint.keep.assign(kept)
    return rest


def zero_groups(model, groups):
    """Set ``groups`` (``{(path, row)}``) exactly to zero (what :class:`FrozenGroups` does after a step)."""
    for variable, view, keep in _kernel_masks(model, groups):
        keep = keep.reshape((1,) * (len(view) - 2) + (view[-2], 1))
        kept = keras.ops.reshape(variable.value, view) * keras.ops.cast(keep, variable.dtype)
        variable.assign(keras.ops.reshape(kept, tuple(variable.shape)))


def _kernel_masks(model, groups):
    """``(variable, its group view, keep)`` for each kernel with some of ``groups`` (``{(path, row)}``): ``keep``
    is ``(groups,)``, 0.0 at those rows of the view (groups along axis -2), 1.0 elsewhere."""
    rows_by_path = {}
    for path, row in groups:
        rows_by_path.setdefault(path, set()).add(row)
    for variable in model.weights:
        rows = rows_by_path.get(variable.path)
        if not rows:
            continue
        view = variable.regularizer.group_shape(tuple(variable.shape))
        keep = np.ones(view[-2], dtype="float32")
        keep[sorted(rows)] = 0.0
        yield variable, view, keep


def release_frozen_groups(model):
    """Give every kernel back the constraint it had; returns whether one changed (trace the step again)."""
    changed = False
    for variable in model.weights:
        if isinstance(variable.constraint, FrozenGroups):
            variable.constraint = variable.constraint.inner
            changed = True
    return changed


def spare_floors(model, share, least=0):
    """Let the penalties spare each layer's strongest groups, its least width; returns ``{kernel path: groups}``.

    The penalty of every trainable kernel of hidden groups spares its strongest ``ceil(share * groups)`` of them
    (input groups: none), and every kernel's penalty at least ``least``, for this ``fit``. A stream's channels
    (coupled groups) too: every reader spares the stream's strongest channels. The kernels that spare more than
    one are returned: no cut takes those groups while the budget can be met without (:func:`cut_weakest`'s
    ``floors``).
    """
    keeps = least_groups(model, share, least)
    for variable in penalised_kernels(model):
        if variable.path in keeps:
            variable.regularizer.spared = keeps[variable.path]
    return {path: keep for path, keep in keeps.items() if keep > 1}


def least_groups(model, share, least=0):
    """``{kernel path: groups}``: the strongest groups each trainable penalised kernel keeps at a least width of
    ``share`` of its hidden groups (``ceil(share * groups)``; input groups: none), at least ``least``; kernels that
    keep none are left out.

    Example:
        >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(10, name="hidden"),
        ...                           keras.layers.Dense(2, name="out")])
        >>> from keras_group_lasso import add_group_sparsity
        >>> least_groups(add_group_sparsity(model), 0.25)
        {'out/kernel': 3}
    """
    keeps = {}
    for variable in penalised_kernels(model):
        penalty = variable.regularizer
        if not variable.trainable:
            continue
        groups = penalty.group_shape(tuple(variable.shape))[-2]
        kept = 0.0 if penalty.group_role == "input" else share
        keep = max(least, min(groups, int(math.ceil(kept * groups))))
        if keep:
            keeps[variable.path] = keep
    return keeps


class FrozenGroups(keras.constraints.Constraint):
    """Zero the cut groups of one kernel (a variable's constraint while a budgeted ``fit`` runs).

    ``w`` seen as its penalty's group view (groups along axis -2) times ``keep`` (``(groups,)``: 0 for a cut
    group, 1 otherwise), after ``inner``, the constraint the kernel had. ``keep`` is a variable, so that groups
    are held without tracing the step again: ``variable`` (a :class:`~keras_group_lasso.Proximal` optimizer's
    mask of the kernel, which a compiled step reads as it runs on every backend) or one of its own, made from
    the array ``keep`` (read as it runs on TensorFlow and PyTorch, not on JAX: ``read_as_it_runs``). Never
    saved: the callback removes it when ``fit`` ends.
    """

    def __init__(self, keep, view, inner=None, variable=None):
        self.keep = variable if variable is not None else keras.Variable(
            np.asarray(keep, dtype="float32").reshape(-1), trainable=False, dtype="float32", name="frozen_groups")
        if variable is not None:
            variable.assign(np.asarray(keep, dtype="float32").reshape(-1))
        self.view = tuple(int(n) for n in view)
        self.inner = inner
        self.read_as_it_runs = variable is not None or keras.backend.backend() != "jax"

    @property
    def kept(self):
        """``keep`` now, as a ``(groups,)`` array."""
        return np.asarray(keras.ops.convert_to_numpy(self.keep))

    def __call__(self, w):
        if self.inner is not None:
            w = self.inner(w)
        shape = keras.ops.shape(w)
        mask = keras.ops.reshape(keras.ops.cast(self.keep, w.dtype), (1,) * (len(self.view) - 2) + (self.view[-2], 1))
        return keras.ops.reshape(keras.ops.reshape(w, self.view) * mask, shape)


def strength(penalty):
    scales = getattr(penalty, "scales", ())
    return max([penalty.factor, penalty.l1, *scales])


def ranked_groups(model, roles, cut_before=frozenset(), loads=None, floors=None, ceilings=None, families=()):
    """``([(score, ((variable index, row), ...), all zero), ...] weakest first, [variables])``.

    A group is a row along axis -2 of a penalty's group view (a unit that the
    layer reads); the rows of one coupled group are one entry. ``roles``:
    ``"input"`` (groups of input features, a coupled group too when its unit
    is an input feature: one a layer reading the model's input reads) and/or
    ``"hidden"`` (the others). The score is the root mean square of a group's
    weights over the median of its kernel's nonzero groups, so every layer is
    cut by how weak a group is among its own (a layer of many small input
    groups does not go first as a whole); groups in ``cut_before`` (``(path,
    row)``) come first, and the strongest group of each kernel is left out.

    ``loads``: ``{kernel path: (groups,) array}``, the share of the budget each group's unit takes
    (:func:`group_loads`). A group's score is then divided by its load over the mean load, so that of two
    groups as weak in their layers the one that frees more of the budget goes first (a kernel missing from
    ``loads`` counts the mean load).

    The groups of frozen weights (``trainable=False``) are left out. The strongest group of each kernel is left
    out, a coupled one too (when a stream's channel is a
    kernel's strongest group, that coupled group stays): no cut leaves a kernel all zero. The ``j``-th weakest of
    a kernel's ``n`` hidden groups (those already at zero count) scores ``n / (n - j)`` times its own, so the last
    units of a layer are the dearest and a cut does not leave a layer one unit wide while others keep most of
    theirs; input groups (features) keep their own score.

    ``floors``: ``{kernel path: k}``: the ``k`` strongest groups of that kernel are left out too (a layer's
    least width; for a kernel that reads a residual stream, the coupled groups of its ``k`` strongest rows: the
    stream's least width).

    ``ceilings``: ``{kernel path: k}``: a kernel with more than ``k`` groups above zero has its weakest ones beyond
    ``k`` (of its own hidden groups, not coupled ones) ranked right after the groups at zero (score ``FORCED``).

    ``families``: tuples of kernel paths whose groups go by rank together (:func:`tied_by_rank`): the kernels at the
    same place of blocks of one class, so that every block keeps as many units.
    """
    variables, entries, coupled, kept_keys = [], [], {}, set()
    input_keys = {key for v in model.weights if isinstance(getattr(v, "regularizer", None), CoupledGroupLasso)
                  and v.regularizer.role == "input" for key in v.regularizer.coupled if key >= 0}
    # A frozen layer's weights (trainable=False) are the user's to keep: none of its groups is cut, nor a coupled
    # group it holds a part of.
    kept_keys |= {key for v in model.weights if not v.trainable
                  and isinstance(getattr(v, "regularizer", None), CoupledGroupLasso)
                  for key in v.regularizer.coupled if key >= 0}
    for variable in model.weights:
        penalty = getattr(variable, "regularizer", None)
        if not isinstance(penalty, GroupSparseRegularizer) or len(variable.shape) < 2 or not variable.trainable:
            continue
        index = len(variables)
        variables.append(variable)
        view = penalty.group_shape(tuple(variable.shape))
        value = np.asarray(keras.ops.convert_to_numpy(variable), dtype=np.float64).reshape(view)
        rms = np.sqrt(np.sum(value ** 2, axis=prox.group_axes(view)) / (value.size // view[-2]))
        live = rms[rms > 0]
        scale = float(np.median(live)) if live.size else 1.0
        per_load = _relative_loads(loads, variable.path, view[-2])
        strongest = int(np.argmax(rms))
        kept_rows = set(np.argsort(-rms, kind="stable")[:max(1, (floors or {}).get(variable.path, 1))].tolist())
        keys = penalty.coupled if isinstance(penalty, CoupledGroupLasso) else (-1,) * view[-2]
        if keys[strongest] >= 0:  # a coupled group (a residual stream's channel) is this kernel's strongest: it
            kept_keys.add(keys[strongest])  # stays, or a cut of the whole stream could leave the kernel all zero
        kept_keys |= {keys[row] for row in kept_rows if keys[row] >= 0}  # a stream's least width
        scores = np.array([-1.0 if (variable.path, row) in cut_before else rms[row] / scale / per_load[row]
                           for row in range(view[-2])])
        depleted = scores * _depletion(scores)
        most = (ceilings or {}).get(variable.path)
        if most is not None and penalty.group_role != "input":
            live = [row for row in np.argsort(depleted, kind="stable") if scores[row] >= 0.0 and rms[row] > 0]
            eligible = [row for row in live if keys[row] < 0 and row != strongest and row not in kept_rows]
            depleted[eligible[:max(0, len(live) - most)]] = FORCED
        for row, key in enumerate(keys):
            is_input = penalty.group_role == "input" if key < 0 else key in input_keys
            if ("input" if is_input else "hidden") not in roles:
                continue
            score = scores[row] if is_input else depleted[row]  # a feature is selected or not: no bottleneck
            if key >= 0:
                total = coupled.setdefault(key, [0.0, 0, [], True])
                total[0] += score
                total[1] += 1
                total[2].append((index, row))
                total[3] = total[3] and rms[row] == 0
            elif row != strongest and row not in kept_rows:
                entries.append((score, ((index, row),), rms[row] == 0))
    for key, (score, parts, rows, zero) in coupled.items():
        if key not in kept_keys:
            entries.append((score / parts, tuple(rows), zero))
    if families:
        entries = tied_by_rank(entries, [v.path for v in variables], families)
    entries.sort(key=lambda entry: entry[0])
    return entries, variables


class Slot(tuple):
    """The rows of the groups that go together by rank (:func:`tied_by_rank`), one group of each kernel: each
    counts as a group."""


def tied_by_rank(entries, paths, families):
    """``entries`` (:func:`ranked_groups`'s, unsorted) with the single groups of the members of each family tied by
    rank: the ``r``-th weakest group of every member of a family goes with the ``r``-th weakest of the others, as
    one entry whose score is their mean and whose rows are a :class:`Slot`. A slot of groups at zero and live ones
    scores the live ones' mean: it is not forced (a group at zero in one block does not force a live one out of
    another).

    ``paths``: the kernel path of each variable index; ``families``: tuples of members, each a kernel path (all its
    groups) or ``(path, rows)`` (those groups of it: the query heads of one key-value group). A family keeps as
    many of each member's groups as its member with the fewest rankable groups leaves (the others' weakest beyond
    that are not ranked): the members end as wide each. A family with a kernel missing from ``paths`` ties nothing
    (its groups are not ranked at all); a coupled group (a residual stream's channel) is not tied.

    Example:
        >>> entries = [(0.1, ((0, 0),), False), (0.5, ((0, 1),), False), (0.2, ((1, 1),), False),
        ...            (0.9, ((1, 0),), False), (0.3, ((2, 0),), False)]
        >>> tied = tied_by_rank(entries, ["a/kernel", "b/kernel", "c/kernel"], [("a/kernel", "b/kernel")])
        >>> [(round(score, 2), tuple(rows)) for score, rows, _ in tied]
        [(0.3, ((2, 0),)), (0.15, ((0, 0), (1, 1))), (0.7, ((0, 1), (1, 0)))]
        >>> halves = [("a/kernel", (0, 1)), ("a/kernel", (2, 3))]  # the rows of one kernel in two members
        >>> entries = [(0.4, ((0, 0),), False), (0.1, ((0, 1),), False), (0.2, ((0, 2),), False),
        ...            (0.8, ((0, 3),), False)]
        >>> [tuple(rows) for _, rows, _ in tied_by_rank(entries, ["a/kernel"], [halves])]
        [((0, 1), (0, 2)), ((0, 0), (0, 3))]
    """
    index = {path: i for i, path in enumerate(paths)}
    member_of = {}  # (variable index, row or None: every row) -> (family, member)
    for number, family in enumerate(families):
        members = [(member, None) if isinstance(member, str) else (member[0], tuple(member[1])) for member in family]
        if any(path not in index for path, _ in members):
            for path, rows in members:  # nothing of this family is ranked
                if path in index:
                    member_of.update({(index[path], row): None for row in (rows or (None,))})
            continue
        for k, (path, rows) in enumerate(members):
            member_of.update({(index[path], row): (number, k) for row in (rows or (None,))})
    own, found = [], {}
    for entry in entries:
        rows = entry[1]
        key = -1
        if len(rows) == 1:
            variable, row = rows[0]
            key = member_of.get((variable, row), member_of.get((variable, None), -1))
        if key == -1:
            own.append(entry)
        elif key is not None:
            found.setdefault(key[0], {}).setdefault(key[1], []).append(entry)
    for number, members in found.items():
        if len(members) < len(families[number]):
            continue  # a member of the family has no group to go: none goes
        ranked = [sorted(member, key=lambda entry: entry[0]) for member in members.values()]
        for rank in range(min(len(member) for member in ranked)):
            slot = [member[rank] for member in ranked]
            scores = [entry[0] for entry in slot]
            paid = [score for score in scores if score >= 0.0] or scores  # what the slot's live groups cost
            own.append((float(np.mean(paid)), Slot(entry[1][0] for entry in slot), all(entry[2] for entry in slot)))
    return own


#: The score of a group above its kernel's ceiling (:func:`ranked_groups`): after the groups at zero, before the rest.
FORCED = -0.5


def fewest(ranked, sizes_at, within):
    """``(count, met)``: the fewest of the weakest ``ranked`` groups (:func:`ranked_groups`, the groups at zero
    already first) whose sizes with them at zero, ``sizes_at(count)``, are ``within`` (a predicate on sizes);
    ``met`` is False when not even all of them are (``count`` is then all of them).

    Sizes only shrink as groups go. The search doubles from the groups at zero already plus one, then halves: a
    step along a schedule cuts a few groups, found in a few probes rather than the ~log2(groups) of a search over
    all of them.

    Example:
        >>> ranked = [(0.0, ((0, 0),), True)] + [(0.5, ((0, row),), False) for row in range(1, 10)]
        >>> def sizes_at(count):  # twelve units, of which the ten ranked can go
        ...     return {"units": 12 - count}
        >>> fewest(ranked, sizes_at, lambda sizes: sizes["units"] <= 6)
        (6, True)
        >>> fewest(ranked, sizes_at, lambda sizes: sizes["units"] <= 1)
        (10, False)
    """
    groups = len(ranked)
    low, step = next((index for index, entry in enumerate(ranked) if not entry[2]), len(ranked)), 1
    while True:  # (low, high]: the smallest count within lies there
        high = min(low + step, groups)
        if within(sizes_at(high)):
            break
        if high == groups:
            return groups, False
        low, step = high, step * 2
    while low + 1 < high:
        middle = (low + high) // 2
        if within(sizes_at(middle)):
            high = middle
        else:
            low = middle
    return high, True


def cut_weakest(model, threshold, roles, loads, floors, measure, within, floors_yield=True, closing=None,
                ceilings=None, families=()):
    """Set to zero the fewest of the weakest groups of ``roles`` (:func:`ranked_groups`) that make the model's sizes
    ``within`` (a predicate on sizes); returns how many of them were above ``threshold`` (the ones that went now).

    Each candidate count is weighed on copies of the kernels' values: ``measure(values)`` gives the sizes as if the
    kernels held ``values`` (``{kernel path: array}``), the model unchanged; the chosen cut is written once. No
    group under a layer's ``floors`` goes while the goal can be met without; with ``floors_yield`` it goes when
    it cannot (a budget comes before the floors; a step along the schedule leaves them).

    ``closing``: ``(share, within the budget)``: at least ``share`` of the groups (rounded up) that the fewest cut
    meeting that predicate would set to zero go too. ``ceilings`` (:func:`ranked_groups`): the groups of each kernel
    beyond its ceiling go in any case. ``families`` (:func:`tied_by_rank`): kernels whose groups go by rank together.
    """
    dead, below = dead_groups(model, threshold, exact=True), dead_groups(model, threshold)
    groups, variables = ranked_groups(model, roles, dead, loads, floors, ceilings, families)
    forced = sum(1 for score, _, _ in groups if score < 0.0)  # at zero already, or above a ceiling
    values = [np.array(keras.ops.convert_to_numpy(v)) for v in variables]

    def sizes_at(count):
        zeroed_values = zeroed(values, groups[:count], variables)
        return measure({variable.path: value for variable, value in zip(variables, zeroed_values)})

    least = _closing_count(groups, sizes_at, closing)
    if least is not None and within(sizes_at(least)):
        count = least  # the fewest meeting ``within`` are no more: one probe instead of a search
    else:
        count, met = fewest(groups, sizes_at, within)
        if not met and floors and floors_yield:
            groups, variables = ranked_groups(model, roles, dead, loads, families=families)
            values = [np.array(keras.ops.convert_to_numpy(v)) for v in variables]
            count, met = fewest(groups, sizes_at, within)
        count = max(count, least or 0)
    count = max(count, forced)
    for variable, value in zip(variables, zeroed(values, groups[:count], variables)):
        variable.assign(value)
    # Groups at or below the threshold count as gone already (the sizes do not count them); a coupled group's rows
    # are one group, a slot's each one.
    went = [[(member,) for member in rows] if isinstance(rows, Slot) else [rows] for _, rows, _ in groups[:count]]
    return sum(1 for parts in went for part in parts
               if any((variables[index].path, row) not in below for index, row in part))


def _closing_count(groups, sizes_at, closing):
    """The groups (ranked, the ones at zero first) at zero after a check closes ``closing[0]`` of those still to go
    before ``closing[1]`` holds (the fewest that meet it, or all of them when the least widths keep it from holding:
    the check then closes its share of the way to the least widths), rounded up; ``None`` without closing."""
    if closing is None or closing[0] <= 0.0:
        return None
    zero = next((index for index, entry in enumerate(groups) if not entry[2]), len(groups))
    needed, _ = fewest(groups, sizes_at, closing[1])
    return zero + math.ceil(closing[0] * (needed - zero))


def _depletion(scores):
    """``n / (n - j)`` for the ``j``-th weakest of a kernel's ``n`` groups (``j`` from 0): what cutting it leaves.

    A group's score is multiplied by it, so the first groups of a layer go at
    their own score and the last ones cost more the fewer would be left (the
    second strongest of ``n`` at ``n / 2`` times): a cut spreads over the
    layers rather than leaving one a single unit wide, a bottleneck the rest of
    the network cannot route around. Within a kernel the order is unchanged.
    """
    n = len(scores)
    rank = np.empty(n)
    rank[np.argsort(scores, kind="stable")] = np.arange(n)
    return n / (n - rank)


def _relative_loads(loads, path, rows):
    """The loads of kernel ``path``'s groups over the mean load of all groups (at least 1 %); ones without ``loads``."""
    if not loads:
        return np.ones(rows)
    mean = float(np.mean(np.concatenate([np.asarray(v, dtype=np.float64) for v in loads.values()])))
    found = loads.get(path)
    if found is None or len(found) != rows or not mean > 0.0:
        return np.ones(rows)
    return np.maximum(np.asarray(found, dtype=np.float64) / mean, _LEAST_LOAD)


def fixed_units(graph):
    """The unit ids of ``graph`` that no cut removes: the model's outputs and every unit a layer that mixes its
    units reads (a ``LayerNormalization`` over the channels of a residual stream, a channels-first pooling)."""
    fixed = graph.output_ids
    for _, ids in graph.whole_readers():
        fixed |= {int(unit) for unit in ids}
    return fixed


def group_loads(graph, model, costs, fixed=()):
    """``{kernel path: (groups,) array}``: the share of a budget each penalised group's unit takes.

    ``costs``: ``[({unit id: cost}, limit), ...]``, one per budgeted kind (see
    :func:`~keras_group_lasso.costs.unit_costs`); a unit's load is ``sum cost / limit``, and 0 for the units in
    ``fixed`` (:func:`fixed_units`: a group of one frees nothing, so it ranks last). The groups are the
    rows of a layer's input kernel (whose groups are the units it reads), in its penalty's view order (a grouped
    convolution's rows are not its channels' order); kernels whose groups are other units (a recurrent kernel's,
    an attention layer's heads) get none.
    """
    load = {}
    for unit_cost, limit in costs:
        for unit, value in unit_cost.items():
            load[unit] = load.get(unit, 0.0) + value / max(float(limit), 1e-30)
    for unit in fixed:
        load[unit] = 0.0
    penalised = {id(v) for v in penalised_kernels(model)}
    out = {}
    for node in graph.units:
        if node.name in graph.calls:
            continue
        layer = graph.layers[node.name]
        order = registry.units_rule(layer).view_of(layer).unit_order(node.in_units)
        ids = np.asarray(node.in_ids)[np.asarray(order, dtype=int)]
        variable = registry.units_rule(layer).kernels(layer).get("kernel")
        if id(variable) in penalised and variable.regularizer.group_shape(tuple(variable.shape))[-2] == ids.size:
            out[variable.path] = np.array([load.get(int(u), 0.0) for u in ids])
    return out


#: A group's load counts at least this fraction of the mean load (a group that frees nothing still ranks).
_LEAST_LOAD = 0.01


def zero_rows(value, penalty, rows):
    """Set the groups ``rows`` (an index or a slice along the group axis of ``penalty``'s view) of the numpy
    array ``value`` to zero, in place."""
    view = value.reshape(penalty.group_shape(value.shape))
    where = [slice(None)] * view.ndim
    where[-2] = rows
    view[tuple(where)] = 0.0


def narrowed(model, share):
    """``{kernel path: numpy array}``: every trainable penalised kernel of ``model`` as ones with all but its first
    ``max(1, ceil(share * groups))`` groups at zero (input groups too: a parameter or FLOP budget cuts features as
    well), the values of the model narrowed alike to ``share`` of every prunable layer's width; for
    :func:`~keras_group_lasso.analysis.analyze`'s ``values`` (the model's own weights are not read).

    Example:
        >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="hidden"),
        ...                           keras.layers.Dense(2, name="out")])
        >>> from keras_group_lasso import add_group_sparsity
        >>> values = narrowed(add_group_sparsity(model), 0.5)
        >>> [(path, value.sum(axis=-1).tolist()) for path, value in sorted(values.items())]
        [('hidden/kernel', [3.0, 3.0, 0.0, 0.0]), ('out/kernel', [2.0, 2.0, 0.0])]
    """
    values = {}
    for variable in penalised_kernels(model):
        if variable.trainable:
            penalty, shape = variable.regularizer, tuple(variable.shape)
            value = np.ones(shape, dtype=keras.backend.standardize_dtype(variable.dtype))
            zero_rows(value, penalty, slice(max(1, math.ceil(share * penalty.group_shape(shape)[-2])), None))
            values[variable.path] = value
    return values


def zeroed(values, groups, variables):
    """Copies of ``values`` with the rows of ``groups`` set to zero."""
    out = [v.copy() for v in values]
    for _, rows, _ in groups:
        for index, row in rows:
            zero_rows(out[index], variables[index].regularizer, row)
    return out


