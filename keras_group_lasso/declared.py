"""The group penalties a model declares, and their state: one object that everything reads.

A model's group-sparse penalties (this package's regularizers on its layers)
share one strength multiplier ``(input groups, other groups)`` and, while a
:class:`~keras_group_lasso.SparsityBudget` steers them, the budget's progress.
Both are *model state*: non-trainable variables saved with the model's weights
(``model.save``, ``save_weights``, ``keras.callbacks.BackupAndRestore``,
``ModelCheckpoint``), so a training resumed from them goes on where it was.
:class:`GroupPenalties` is that declaration. The penalties read their strength
from it, :class:`~keras_group_lasso.Proximal` reads it for its proximal steps,
the budget writes it, and nothing keeps a copy.

Where the variables live:

* a model made by :func:`~keras_group_lasso.add_group_sparsity` (a
  ``GroupSparseModel`` or ``GroupSparseSequential``) holds the multiplier as
  its own weight ``penalty_multiplier`` and the rest in its
  ``group_penalty_state`` layer; its config declares both, so
  ``keras.saving.load_model`` restores them;
* any other model whose layers carry this package's penalties gets a
  ``group_penalty_state`` layer set as its attribute when something first
  needs the state (``SparsityBudget``, ``set_penalty_multiplier``): saved by
  ``save``, ``save_weights`` and ``BackupAndRestore`` and restored by
  ``load_weights`` into a model that declared it (a budget declares it before
  ``BackupAndRestore`` restores); a plain model read back by ``load_model``
  (whose config knows nothing of it) starts again at strength 1. On
  TensorFlow and PyTorch the model's ``weights``, ``get_weights()`` and
  ``count_params()`` stay its layers' own. On JAX the compiled step receives
  a model's own variables only, so a Functional model counts the state's
  variables among its weights there (``get_weights()`` has more arrays;
  :func:`layer_weights` leaves them out), and a plain Sequential, which cannot
  count them, is refused (use ``add_group_sparsity``).
"""

import json
import weakref

import keras
import numpy as np

from keras_group_lasso._validation import Described, InvalidParameterError, fail
from keras_group_lasso.analysis import dense_roles
from keras_group_lasso.graph import registry
from keras_group_lasso.regularizers import WEIGHT_ONLY, CoupledGroupLasso, GroupSparseRegularizer, link_coupled_penalties

__all__ = ["GroupPenalties", "PenaltyState", "declare_group_penalties", "declared_penalties", "layer_weights",
           "group_sparse_penalties", "link_penalty_multiplier", "BUDGET_VARIABLES"]

#: A budget's progress (:class:`keras_group_lasso.budget.state.BudgetState`): each variable's name after ``budget_``
#: and its shape, float32, zeros while no budget started.
BUDGET_VARIABLES = {"started": (), "phase": (), "settling": (), "initial": (2,), "reached": (2,), "last_sizes": (5,),
                    "measured": (), "cut": (), "rounded": (), "decided": ()}
# Files saved before the state had named variables hold one vector of 16 values: each name's slice of it (the
# last sizes' latency came last).
_LEGACY = {"started": [0], "phase": [1], "settling": [2], "initial": [3, 4], "reached": [5, 6],
           "last_sizes": [7, 8, 9, 10, 15], "measured": [11], "cut": [12], "rounded": [13], "decided": [14]}
_NOTES = "notes"
#: The note of the own momentum of each BatchNormalization layer (by path) a budget's cut renews.
MOMENTA = "batch_normalization_momenta"
_ATTRIBUTE = "_group_penalties"
_PENALTY_ATTRIBUTES = ("kernel_regularizer", "bias_regularizer", "depthwise_regularizer", "pointwise_regularizer",
                       "recurrent_regularizer")
# The variable each attribute's penalty lands on when the layer builds.
_ATTRIBUTE_VARIABLES = {"kernel_regularizer": "kernel", "bias_regularizer": "bias",
                        "depthwise_regularizer": "depthwise_kernel", "pointwise_regularizer": "pointwise_kernel",
                        "recurrent_regularizer": "recurrent_kernel"}


@keras.saving.register_keras_serializable(package="keras_group_lasso", name="PenaltyState")
class PenaltyState(keras.layers.Layer):
    """Non-trainable state of a model's group penalties (not a layer of its graph; never called on data).

    Attributes:
        multiplier: ``(2,)`` strength multiplier (input groups, other groups),
            or ``None`` where the model holds it itself (``penalty_multiplier``).
        budget: ``{name: variable}``, the progress of a
            :class:`~keras_group_lasso.SparsityBudget` (:data:`BUDGET_VARIABLES`; zeros: none started).
    """

    def __init__(self, with_multiplier=True, **kwargs):
        kwargs.setdefault("name", "group_penalty_state")
        super().__init__(trainable=False, **kwargs)
        self.with_multiplier = bool(with_multiplier)
        # JSON values saved beside the variables (a budget's measured latency table, the own momentum of
        # the BatchNormalization layers whose statistics a cut renews): what a resumed training needs to
        # decide as the uninterrupted one.
        self.notes = {}
        self._owner_model = None  # a weak reference to the model whose state this is (attach_state)
        self.multiplier = None
        if self.with_multiplier:
            self.multiplier = self.add_weight(shape=(2,), initializer="ones", trainable=False, name="multiplier",
                                              dtype="float32")
        self.budget = {name: self.add_weight(shape=shape, initializer="zeros", trainable=False, name=f"budget_{name}",
                                             dtype="float32")
                       for name, shape in BUDGET_VARIABLES.items()}
        self.built = True

    def call(self, inputs):
        return inputs

    def save_own_variables(self, store):
        super().save_own_variables(store)
        if self.notes:
            store[_NOTES] = np.frombuffer(json.dumps(self.notes, sort_keys=True).encode("utf-8"), dtype="uint8")

    def load_own_variables(self, store):
        # Files written before this state existed have none: keep the initial values.
        keys = list(store.keys())
        if len(keys) == 0:
            return
        values = {key: store[key] for key in keys if key != _NOTES}
        if len(values) == int(self.with_multiplier) + 1:  # saved as one vector
            legacy = np.asarray(values.pop(str(len(values) - 1)), dtype="float32")
            values.update({str(len(values) + i): legacy[_LEGACY[name]].reshape(shape)
                           for i, (name, shape) in enumerate(BUDGET_VARIABLES.items())})
        super().load_own_variables(values)
        self.notes = json.loads(bytes(np.asarray(store[_NOTES], dtype="uint8")).decode("utf-8")) \
            if _NOTES in keys else {}
        model = None if self._owner_model is None else self._owner_model()
        if model is not None:
            restore_momenta(model, self.notes.get(MOMENTA, {}))

    def get_config(self):
        config = super().get_config()
        config["with_multiplier"] = self.with_multiplier
        return config


def layer_paths(model, keep, prefix=""):
    """``[(path, layer)]`` of the layers of ``model`` (nested models walked, ``outer/inner`` paths) that ``keep``."""
    found = []
    for layer in model.layers:
        path = f"{prefix}{layer.name}"
        if isinstance(layer, keras.Model):
            found += layer_paths(layer, keep, f"{path}/")
        elif keep(layer):
            found.append((path, layer))
    return found


def restore_momenta(model, momenta):
    """Give each layer at a path of ``momenta`` (``{path: momentum}``) its momentum back.

    While a budget renews the statistics of BatchNormalization layers after a
    cut their momentum is lowered until ``fit`` ends; a model saved then
    carries the lowered value in its config. The state notes each layer's own
    momentum, and loading the state gives it back (a resumed budget lowers it
    again, as the uninterrupted training does).
    """
    if not momenta:
        return
    layers = dict(layer_paths(model, lambda layer: hasattr(layer, "momentum")))
    for path, momentum in momenta.items():
        if path in layers:
            layers[path].momentum = float(momentum)


def _unwrapped(optimizer):
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return optimizer.inner_optimizer
    return optimizer


def _layers(model):
    for layer in model.layers:
        if isinstance(layer, keras.Model):
            yield from _layers(layer)
        else:
            rule = registry.units_rule(layer)
            yield from (layer,) if rule is None else rule.penalty_layers(layer)


def group_sparse_penalties(model):
    """``[(path, layer, penalty)]``: this package's penalties on the layers of ``model`` (nested models too)."""
    found, seen = [], set()
    for layer in _layers(model):
        for attribute in _PENALTY_ATTRIBUTES:
            penalty = getattr(layer, attribute, None)
            if isinstance(penalty, GroupSparseRegularizer):
                found.append((f"{layer.name}.{attribute}", layer, penalty))
                seen.add(id(penalty))
        # A penalty put on one variable (an attention layer's head kernel) rather than through a config attribute.
        for variable in layer.weights:
            penalty = getattr(variable, "regularizer", None)
            if isinstance(penalty, GroupSparseRegularizer) and id(penalty) not in seen:
                found.append((f"{layer.name}.{variable.path.split('/')[-2]}", layer, penalty))
                seen.add(id(penalty))
    return found


class GroupPenalties:
    """The group-sparse penalties of one model and their shared state (see the module docstring).

    Attributes:
        multiplier: the ``(2,)`` ``keras.Variable`` every penalty of the model
            scales its strength by: entry 0 for input groups, 1 for the others.
        state: the :class:`PenaltyState` layer (``state.budget``: a budget's progress, named variables).
        training_latency: ``(LatencyTable, batch size)`` of a latency budget steering the ``fit`` that runs now, or
            ``None``; what a :class:`~keras_group_lasso.SparsityMonitor` without a table of its own reports the
            predicted latency with. Not saved.
    """

    def __init__(self, model, multiplier, state):
        self._model = weakref.ref(model)
        self.multiplier = multiplier
        self.state = state
        self.training_latency = None
        self._roles = {}

    def role_of(self, penalty):
        """``"input"`` for the kernel penalty of a layer that reads the model's input, else ``"hidden"``."""
        return self._roles.get(id(penalty), "hidden")

    @property
    def model(self):
        return self._model()

    def penalties(self):
        """``[(path, layer, penalty)]`` of the model, read now (layers added later count too)."""
        model = self.model
        return [] if model is None else group_sparse_penalties(model)

    def applied_by_optimizer(self):
        """Whether the model's optimizer applies the penalties itself (``Proximal``: by their proximal step).

        The penalties then give their value to the loss without a gradient;
        :class:`~keras_group_lasso.Proximal` reads the same answer, so a
        penalty gradient is never counted twice or not at all.
        """
        model = self.model
        optimizer = _unwrapped(getattr(model, "optimizer", None)) if model is not None else None
        applies = bool(getattr(optimizer, "applies_group_penalties", False))
        if applies and keras.backend.backend() == "jax":
            # JAX's trainer hands an optimizer that is built already only the values of the model's variables:
            # one built for another model would apply that model's penalties to these values. The other backends
            # hand it the variables, which it checks itself.
            optimizer.check_trains(model.trainable_variables)
        return applies

    def multiplier_values(self):
        """The multiplier now, as two Python floats."""
        return [float(v) for v in keras.ops.convert_to_numpy(self.multiplier)]

    def set_multiplier(self, input=None, hidden=None):
        """Set the entries given (``None`` keeps one); read by the next training step, nothing retraced."""
        current = self.multiplier_values()
        for index, given in enumerate((input, hidden)):
            if given is not None:
                current[index] = float(given)
        # Numbers, not one array shared with another variable: JAX donates each buffer once.
        self.multiplier.assign(np.asarray(current, dtype="float32"))

    def budget_values(self):
        """``{name: float32 array}`` of the budget's variables now (:data:`BUDGET_VARIABLES`)."""
        return {name: np.asarray(keras.ops.convert_to_numpy(variable), dtype="float32").copy()
                for name, variable in self.state.budget.items()}

    def set_budget_values(self, values):
        """Write ``{name: value}`` into the budget's variables (every name of :data:`BUDGET_VARIABLES`)."""
        for name, variable in self.state.budget.items():
            variable.assign(np.asarray(values[name], dtype="float32").reshape(BUDGET_VARIABLES[name]))

    def note(self, key, default=None):
        """A JSON value kept with the state (saved with the model's weights), or ``default``."""
        return self.state.notes.get(key, default)

    def set_note(self, key, value):
        """Keep ``value`` (plain JSON values) with the state; ``None`` removes the note."""
        if value is None:
            self.state.notes.pop(key, None)
        else:
            self.state.notes[key] = value

    def link(self):
        """Point every penalty of the model at this declaration and link the coupled ones to each other."""
        model = self.model
        _refuse_activity_penalties(model)
        if self._own_penalties(model):
            # A compiled step holds the penalty objects it was traced with: the next one must read these.
            for attribute in ("train_function", "test_function", "predict_function"):
                if getattr(model, attribute, None) is not None:
                    setattr(model, attribute, None)
        penalties = self.penalties()
        kernels = [(layer, p) for path, layer, p in penalties if not path.endswith(".bias_regularizer")]
        roles = {}
        if any(p.role == "any" for _, p in kernels):  # a penalty put on by hand: the graph says what it reads
            try:
                roles = {name.split("/")[-1]: role for name, role in dense_roles(model).items()}
            except InvalidParameterError:  # a model whose graph cannot be read: its groups count as hidden
                roles = {}
        for _, _, penalty in penalties:
            penalty.declared = self
        self._roles = {id(p): "input" for layer, p in kernels if roles.get(layer.name) == "input"}
        members = [(v, v.regularizer) for v in model.weights
                   if isinstance(getattr(v, "regularizer", None), CoupledGroupLasso)]
        if members:
            link_coupled_penalties(members)

    def _own_penalties(self, model):
        """Give every weight of ``model`` a penalty object of its own, owned by this declaration.

        The role (input or hidden groups) is a property of the weight and the
        strength one of the model, while Keras users pass one regularizer
        object to many layers (``reg = SparseGroupLasso(1e-3)``,
        ``kernel_regularizer=reg`` everywhere) and to many models. So a
        penalty object that another model declared, that no model declared
        yet, or that a second weight of this model carries, is replaced on
        that weight by a copy (``from_config(get_config())``: the same
        penalty). The objects the user passed are never changed: they stay
        undeclared (strength 1 wherever they are still used).

        Returns:
            Whether any weight got a new object.
        """
        kept, replaced = set(), False  # ids of the objects kept on a slot in this pass

        def own(penalty):
            nonlocal replaced
            if penalty.declared is self and id(penalty) not in kept:
                kept.add(id(penalty))
                return penalty
            replaced = True
            copy = type(penalty).from_config(penalty.get_config())
            copy.declared = self
            kept.add(id(copy))
            return copy

        for layer in _layers(model):
            new_of_variable = {}
            for variable in layer.weights:
                penalty = getattr(variable, "regularizer", None)
                if isinstance(penalty, GroupSparseRegularizer):
                    new = own(penalty)
                    variable.regularizer = new
                    new_of_variable[variable.name] = (penalty, new)
            for attribute in _PENALTY_ATTRIBUTES:
                penalty = getattr(layer, attribute, None)
                if not isinstance(penalty, GroupSparseRegularizer):
                    continue
                old, new = new_of_variable.get(_ATTRIBUTE_VARIABLES[attribute], (None, None))
                if old is not penalty:  # a layer not built yet (or a variable that carries another penalty)
                    new = own(penalty)
                if new is not penalty:
                    _set_penalty(layer, attribute, new)
        return replaced


def _set_penalty(layer, attribute, penalty):
    """Set ``layer.<attribute>``; a recurrent layer reads it from its cell (a property without a setter)."""
    holder = layer
    while getattr(getattr(type(holder), attribute, None), "fset", True) is None and hasattr(holder, "cell"):
        holder = holder.cell
    setattr(holder, attribute, penalty)


def _refuse_activity_penalties(model):
    for layer in _layers(model):
        penalty = getattr(layer, "activity_regularizer", None)
        if isinstance(penalty, GroupSparseRegularizer):
            received = f"the activity_regularizer of layer '{layer.name}' ({type(layer).__name__})"
            fail(type(penalty).__name__, "x", WEIGHT_ONLY, Described(received))


def attach_state(model, state, carried):
    """Set ``state`` as ``model.group_penalty_state``: saved with the model's weights either way.

    ``carried``: tracked by Keras, so a Functional model counts its variables
    among its own (what a compiled JAX step needs to receive them); otherwise
    not tracked, so ``model.weights``, ``get_weights`` and ``count_params``
    stay the layers' own (TensorFlow and PyTorch read the variables
    themselves). Keras saves and restores an attribute either way.
    """
    state._owner_model = weakref.ref(model)
    if carried:
        model.group_penalty_state = state
    else:
        object.__setattr__(model, "group_penalty_state", state)


def state_variables(model):
    """The variables of the penalties' state that ``model`` holds (its multiplier included)."""
    found = []
    state = getattr(model, "group_penalty_state", None)
    if isinstance(state, PenaltyState):
        found += list(state.weights)
    multiplier = getattr(model, "penalty_multiplier", None)
    if isinstance(multiplier, keras.Variable):
        found.append(multiplier)
    return found


def layer_weights(model):
    """``model.weights`` without the penalties' state: the weights the model's layers hold."""
    state = {id(v) for v in state_variables(model)}
    return [v for v in model.weights if id(v) not in state]


def declared_penalties(model):
    """The :class:`GroupPenalties` ``model`` declared, or ``None`` (nothing needed its state yet)."""
    found = getattr(model, _ATTRIBUTE, None)
    return found if isinstance(found, GroupPenalties) and found.model is model else None


def declare_group_penalties(model, owner="declare_group_penalties", multiplier=None, state=None):
    """The :class:`GroupPenalties` of ``model``, declared now if it has none yet (see the module docstring).

    Args:
        model: a Keras model whose layers carry this package's penalties.
        owner: the public name that asked (for the error message).
        multiplier: the model's own ``(2,)`` multiplier variable, if it has one.
        state: the model's own :class:`PenaltyState`, if it has one.

    Raises:
        InvalidParameterError: ``model`` is not a ``keras.Model`` or none of
            its layers carries a penalty of this package, or one is a layer's
            ``activity_regularizer``.
    """
    if not isinstance(model, keras.Model):
        fail(owner, "model", "a keras.Model", model)
    _refuse_activity_penalties(model)
    found = declared_penalties(model)
    if found is None:
        if multiplier is None:
            penalties = group_sparse_penalties(model)
            if not penalties:
                fail(owner, "model", "a model whose layers carry group penalties of keras_group_lasso (e.g. "
                     "kernel_regularizer=SparseGroupLasso(1e-4), or a model made by add_group_sparsity)", model)
            if state is None:
                state = getattr(model, "group_penalty_state", None)
            attached = not isinstance(state, PenaltyState)
            if attached:
                state = PenaltyState(with_multiplier=True)
                attach_state(model, state, carried=keras.backend.backend() == "jax")
            if keras.backend.backend() == "jax" and not any(v is state.multiplier
                                                           for v in model.non_trainable_variables):
                # A compiled JAX step receives the model's variables only; a plain Sequential does not
                # count a layer set as its attribute among them, so a new strength would never arrive.
                if attached:  # refused: the model is left as it was
                    delattr(model, "group_penalty_state")
                fail(owner, "model", "a Functional model or one made by add_group_sparsity, on the JAX backend "
                     "(a plain Sequential cannot carry the penalties' strength into a compiled JAX step: "
                     "use keras_group_lasso.add_group_sparsity(model) or the functional API)", model)
            multiplier = state.multiplier
        found = GroupPenalties(model, multiplier, state)
        object.__setattr__(model, _ATTRIBUTE, found)
    found.link()
    return found


def link_penalty_multiplier(model, multiplier):
    """Make every group-sparse penalty of ``model`` scale its strength by ``multiplier`` (a ``(2,)`` ``keras.Variable``).

    The penalties then give ``m * (factor * group Lasso + l1 * Lasso)``, with
    ``m = multiplier[0]`` for input groups (feature selection) and
    ``multiplier[1]`` for all others (coupled groups included), and read the
    variable at every step, so changing it changes the strength inside a
    compiled train step. The variable must be a variable of ``model`` (so a
    compiled JAX step receives it). Models made by
    :func:`~keras_group_lasso.add_group_sparsity` are linked to their own
    ``penalty_multiplier``; use :func:`keras_group_lasso.set_penalty_multiplier`
    to change it.
    """
    found = declared_penalties(model)
    if found is not None:
        found.multiplier = multiplier
        found.link()
        return
    declare_group_penalties(model, "link_penalty_multiplier", multiplier=multiplier)
