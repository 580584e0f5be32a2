"""What a group-sparse network has left: weights -> masks -> a frozen :class:`SparsityReport`.

Nothing here changes a model except :func:`apply_threshold`, whose name says
so. Everything reads each weight once with numpy.

Vocabulary (the paper's): a *group* is all outgoing weights of one unit: the
row ``W[i, :]`` of a Dense kernel, the slice ``K[..., i, :]`` of a
convolution kernel (input channel ``i``), and for a Dense layer after
``Flatten`` of a ``(..., C)`` map all rows of one channel. A weight is *zero*
when ``|w| <= threshold``; the paper sets weights "under 1e-3" to zero after
training, and the two rules differ only for weights exactly equal to the
threshold. With ``threshold=0`` exactly the stored zeros count.

The model is read as a graph (:func:`keras_group_lasso.graph.model_graph`):
the layers that make units (Dense, convolutions) with the per-unit layers
between them, classified by one registry. Which units survive is decided in
one place, :func:`keras_group_lasso.graph.masks.compute_masks` (a forward
*varying* and a backward *kept* pass; see that module), used by the report,
the :class:`~keras_group_lasso.callbacks.SparsityMonitor` callback and the
surgery in :mod:`keras_group_lasso.surgery`, so the reported sizes are the
sizes of the pruned model.
"""

import dataclasses
import math

import keras
import numpy as np

from keras_group_lasso._validation import NonFiniteError, check_non_negative, check_positive_int, fail
from keras_group_lasso.graph import Kind, registry
from keras_group_lasso.graph.build import class_name, graph_model, is_graph_model, model_graph, traced_block
from keras_group_lasso.graph.masks import UnitMasks, block_siblings, compute_masks, needed_units, threshold_array

__all__ = [
    "SparsityReport",
    "LayerSparsity",
    "StreamSparsity",
    "InputSparsity",
    "UnitMasks",
    "Analysis",
    "analyze",
    "sparsity_report",
    "unit_masks",
    "apply_threshold",
    "input_feature_strength",
    "layer_group_norms",
    "image_shape",
    "dense_layers",
    "dense_roles",
    "input_dense_layers",
    "get_layer",
    "is_zero",
]


# ----------------------------------------------------------------------------- the one rule


def is_zero(weights, threshold):
    """Boolean array, ``|w| <= threshold``: the one definition of a zero weight.

    Example:
        >>> is_zero(np.array([0.0, -5e-4, 2e-3]), 1e-3)
        array([ True,  True, False])
    """
    return np.abs(weights) <= threshold


def _to_numpy(variable):
    # `.value` skips the Variable wrapper: about 2x faster on both backends.
    return np.asarray(keras.ops.convert_to_numpy(getattr(variable, "value", variable)))


# ----------------------------------------------------------------------------- validation


_NO_THRESHOLD = object()  # for the functions without a threshold (None is a bad threshold)


def _check_model(owner, model, threshold=_NO_THRESHOLD):
    """``(graph, threshold)`` after checking the arguments every public function here takes."""
    if threshold is _NO_THRESHOLD:
        threshold = None
    else:
        threshold = check_non_negative(owner, "threshold", threshold)
    if not isinstance(model, keras.Model):
        fail(owner, "model", "a keras.Model", model)
    if not model.built:
        fail(owner, "model", "a built keras.Model (give it an Input or call it on data first)", model)
    graph = model_graph(graph_model(model))
    if not graph.units:
        fail(owner, "model", "a model with at least one Dense or convolution layer", model)
    return graph, threshold


def get_layer(model, name):
    """The layer of ``model`` called ``name`` in the analysis: ``"block/layer"`` is inside a nested model.

    Names are the ones :func:`sparsity_report`, :func:`dense_layers` and the
    pruning plan use: a layer of a nested Sequential or functional block is
    named after the block, ``"<block>/<layer>"`` (recursively); so is a layer
    inside a block of layers whose call the graph traces (a subclassed ``Layer``).

    Raises:
        ValueError: no such layer (Keras's own error from ``get_layer``).

    Example:
        >>> block = keras.Sequential([keras.layers.Dense(3, name="inner")], name="block")
        >>> model = keras.Sequential([keras.Input((4,)), block, keras.layers.Dense(2)])
        >>> get_layer(model, "block/inner").units
        3
    """
    layer = model
    for part in name.split("/"):
        # a block of layers that is not a functional model is seen through its traced call
        source = layer if layer is model or is_graph_model(layer) else traced_block(layer) or layer
        layer = source.get_layer(part)
    return layer


def dense_roles(model):
    """``{name: "input" | "hidden"}`` for every Dense layer of ``model``, in graph order.

    ``"input"``: the layer's kernel rows are the model's input features (the
    paper's *input groups*); ``"hidden"``: they are units of an earlier layer
    (hidden groups). A Dense layer reads the input when the layers between the
    model input and it only pass features through one by one (Dropout,
    elementwise activations, BatchNormalization, Normalization, Rescaling,
    Flatten, ...). This is the one definition the report's ``role``,
    :func:`~keras_group_lasso.add_group_sparsity` and surgery share.

    Layers inside a nested Sequential or functional block, or a block of
    layers whose call is traced (on any number of tensors), are included,
    named ``"<block>/<layer>"`` (see :func:`get_layer`); a Dense layer inside
    a nested model the graph cannot see through (shared, several inputs, a
    call that does not trace) is not.

    Raises:
        InvalidParameterError: ``model`` is not a built Sequential or functional ``keras.Model``.

    Example:
        >>> block = keras.Sequential([keras.layers.Dense(5, name="a")], name="block")
        >>> model = keras.Sequential([keras.Input((6,)), block, keras.layers.Dense(2, name="out")])
        >>> dense_roles(model)
        {'block/a': 'input', 'out': 'hidden'}
    """
    return _dense_roles("dense_roles", model)


def input_dense_layers(model):
    """Names of the Dense layers whose kernel rows are the model's input features, in graph order.

    The names with role ``"input"`` in :func:`dense_roles`.

    Raises:
        InvalidParameterError: ``model`` is not a built Sequential or functional ``keras.Model``.

    Example:
        >>> inputs = keras.Input((6,))
        >>> a = keras.layers.Dense(5, name="a")(inputs)
        >>> b = keras.layers.Dense(4, name="b")(keras.layers.Dropout(0.1)(inputs))
        >>> out = keras.layers.Dense(2, name="out")(keras.layers.Concatenate()([a, b]))
        >>> input_dense_layers(keras.Model(inputs, out))
        ['a', 'b']
    """
    return [name for name, role in _dense_roles("input_dense_layers", model).items() if role == "input"]


def _dense_roles(owner, model):
    if not isinstance(model, keras.Model) or not is_graph_model(model):
        fail(owner, "model", "a Sequential or Functional keras.Model", model)
    if not model.built:
        fail(owner, "model", "a built keras.Model (give it an Input or call it on data first)", model)
    graph = model_graph(model)
    return {name: ("input" if name in graph.input_readers else "hidden") for name in graph.all_units
            if name not in graph.calls}


def dense_layers(model):
    """The layers that make units (Dense, convolutions) of ``model``, input to output.

    Raises:
        InvalidParameterError: ``model`` is not a built ``keras.Model`` with such a layer.
    """
    graph, _ = _check_model("dense_layers", model)
    return [graph.layers[node.name] for node in graph.units if node.name not in graph.calls]


# ----------------------------------------------------------------------------- weights


def _read_weights(graph, owner, values=None):
    """``{name: thresholdable weights}`` of every units layer (raw numpy; a variable whose path is in ``values``
    as the array given there); refuses NaN or inf.

    A NaN weight is neither zero nor alive (``|NaN| <= t`` is False, and so is
    ``|NaN| > t``), so every count made from it would be wrong: refuse it here,
    where every report, mask and pruning plan reads the weights.
    """
    def read(variable):
        given = values.get(variable.path) if values else None
        return _to_numpy(variable) if given is None else given

    weights = {}
    broken = []
    names = [node.name for node in graph.units]
    for name in names:
        weights[name] = registry.units_rule(graph.layers[name]).weights(graph.layers[name], read)
    for name in names:
        for kind, values in weights[name].items():
            if values is not None and not np.all(np.isfinite(values)):
                broken.append((f"{name}/{kind}", values))
    for node in graph.nodes:  # thresholded per-unit layers (DepthwiseConv)
        layer = graph.layers[node.name]
        rule = registry.rule_of(layer) if node.kind != Kind.UNITS else None
        for kind, values in (rule.checked_weights(layer) if rule is not None else {}).items():
            if not np.all(np.isfinite(values)):
                broken.append((f"{node.name}/{kind}", values))
    if broken:
        raise NonFiniteError(
            f"{owner}: the weights of the model are not finite, so no weight can be counted as zero or "
            "kept: "
            + ", ".join(f"{label} ({_non_finite_counts(values)})" for label, values in broken)
            + ". The training diverged: scale the inputs (e.g. a keras.layers.Normalization layer or "
            "scikit-learn's StandardScaler) or lower the learning rate, then train again.",
            names=[label for label, _ in broken],
        )
    return weights


def _thresholded(weights, threshold):
    return {
        name: {kind: (None if values is None else threshold_array(values, threshold)) for kind, values in w.items()}
        for name, w in weights.items()
    }


def _non_finite_counts(values):
    nan = int(np.count_nonzero(np.isnan(values)))
    inf = int(np.count_nonzero(np.isinf(values)))
    counts = [f"{n} {what}" for n, what in ((nan, "NaN"), (inf, "inf")) if n]
    return " and ".join(counts) + f" of {values.size} value{'s' if values.size != 1 else ''}"


def unit_masks(model, threshold=1e-3):
    """Decide which input features, hidden units and channels survive pruning at ``threshold``.

    The one place that decides what is dead (see
    :mod:`keras_group_lasso.graph.masks` for the fixed point): the report
    counts these masks and surgery cuts them.

    Args:
        model: a built ``keras.Model`` with at least one Dense or convolution layer.
        threshold: finite number >= 0; weights with ``|w| <= threshold`` are zero.

    Returns:
        A :class:`UnitMasks`.

    Raises:
        InvalidParameterError: for a bad ``threshold`` or ``model``.
        NonFiniteError: a kernel or bias holds NaN or inf (the message names them).

    Example:
        >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="d")])
        >>> model.layers[0].set_weights([np.array([[1.0, 0.0], [0.0, 0.0], [0.0, 2.0]]), np.zeros(2)])
        >>> unit_masks(model, 1e-3).features
        array([ True, False,  True])
    """
    return analyze(model, threshold, owner="unit_masks").masks


@dataclasses.dataclass(frozen=True)
class StreamSparsity:
    """Live channels of a stream of units coupled by merges (a residual stream), each channel counted once.

    Attributes:
        name: the stream's first merge layer.
        merges: every merge layer on it.
        makers: the layers that make its channels (``"<input>"``: a shortcut from the input).
        channels: channels of the stream.
        channels_alive: channels that stay.
    """

    name: str
    merges: tuple
    makers: tuple
    channels: int
    channels_alive: int


@dataclasses.dataclass(frozen=True)
class LayerSparsity:
    """Sparsity of one layer that makes units (Dense, convolution) at one threshold.

    Attributes:
        name: layer name.
        role: ``"input"`` (reads the model input) or ``"hidden"``.
        weights: kernel size (biases are not counted; both kernels of a SeparableConv).
        zero_weights: kernel weights with ``|w| <= threshold``.
        sparsity: ``zero_weights / weights``.
        groups: input units (kernel rows of a Dense layer, input channels of a convolution).
        groups_alive: groups with at least one ``|w| > threshold``.
        units: output units (neurons, or channels of a convolution).
        units_alive: units kept by pruning (all of them for an output layer).
        constant_units: units with no non-zero weight from a varying input:
            they output a constant, which surgery folds into the next bias.
        is_output: the layer produces the model output.
        kind: the layer's class name.
        flops_before: multiply-adds per sample of the layer (per position of
            its variable axes when ``flops_per_position``).
        flops_after: the same with only the kept input and output units.
        flops_per_position: the layer's output has axes of unknown size
            (``None``, e.g. the time axis of ``keras.Input((None, 8))``), so its
            FLOPs are counted at one position of those axes (the known axes
            in full); ``False``: per sample.
        heads: attention heads (a MultiHeadAttention; 0 for other layers).
        heads_alive: heads kept by pruning (non-zero output weights).
        inputs_alive: input units kept by pruning (the groups alive whose unit in the layer before lives; what a
            :class:`~keras_group_lasso.LatencyTable` predicts the pruned layer's time at). ``-1``: not counted.
    """

    name: str
    role: str
    weights: int
    zero_weights: int
    sparsity: float
    groups: int
    groups_alive: int
    units: int
    units_alive: int
    constant_units: int
    is_output: bool
    kind: str = "Dense"
    flops_before: int = 0
    flops_after: int = 0
    flops_per_position: bool = False
    heads: int = 0
    heads_alive: int = 0
    inputs_alive: int = -1


@dataclasses.dataclass(frozen=True)
class InputSparsity:
    """What one input of a model with several inputs keeps.

    Attributes:
        name: the input's name.
        n_features: its features (flat elements, or the channels of a map).
        selected_features: indices, within this input, of the features that survive.
        first: index of its first feature among all the model's features
            (:attr:`SparsityReport.selected_features` numbers the inputs' features one after the other).
        mask: it is read as a mask (an attention layer's ``attention_mask`` is computed from it), not as
            features: a pruned model takes it whole.
    """

    name: str
    n_features: int
    selected_features: tuple
    first: int
    mask: bool = False

    @property
    def kept(self):
        """Some feature of this input survives, or it is read as a mask (a model pruned with
        ``inputs="selected"`` takes it)."""
        return bool(self.selected_features) or self.mask


@dataclasses.dataclass(frozen=True)
class SparsityReport:
    """What a group-sparse network has left at one threshold (plain Python values).

    Attributes:
        threshold: weights with ``|w| <= threshold`` count as zero.
        n_features: input features of the model: the input units of the
            first layer that makes units (the flattened elements of the input
            for an MLP, the input channels for a convolution).
        selected_features: indices of the input features that survive.
        layers: one :class:`LayerSparsity` per layer that makes units, input to output.
        layer_sizes: compact sizes, input layer included, output layer
            excluded (the paper's Table 3), e.g. ``(582, 45, 41, 61)``.
        original_layer_sizes: the same before pruning, e.g. ``(784, 400, 300, 100)``.
        total_weights: kernel weights (connections; biases excluded, as in the paper).
        zero_weights: of those, how many have ``|w| <= threshold``.
        sparsity: ``zero_weights / total_weights``.
        live_neurons: hidden units kept; a unit that several layers make (a
            channel of a residual stream) counts once.
        params_before: parameters (kernels and biases) of the layers that make units.
        params_after: the same after removing the dead features and units.
        flops_before: multiply-adds per sample of those layers and of the
            depthwise convolutions (``per_channel``); per position when
            ``flops_per_position``.
        flops_after: the same after removing the dead features and units.
        flops_per_position: some layer's output has axes of unknown size (a
            model on ``keras.Input((None, 8))`` or ``(None, None, 3)`` takes
            any length or image size): the FLOPs of such a layer depend on
            the input's size, so each layer is counted at one position of its
            variable axes (see :attr:`LayerSparsity.flops_per_position`) and
            the layers after global pooling per sample. The totals and
            ``flops_ratio`` add up these counts: a summary that does not
            depend on the input's size, not the cost of any real input, so a
            FLOP limit per sample cannot be read against them. Selected
            features, units, parameters and surgery do not depend on the size
            and are exact.
        uninterpreted_layers: ``"name (Class)"`` for each layer the analysis
            could not see through; when not empty the unit counts are
            conservative and :func:`~keras_group_lasso.prune_model` refuses the model.
        neurons: hidden units before pruning, counted as ``live_neurons`` is.
        streams: one :class:`StreamSparsity` per stream of coupled units.
        inputs: one :class:`InputSparsity` per model input (the features of all
            inputs are numbered one after the other in ``selected_features``).
        kept_whole: ``(("name (Class)", channels), ...)``: the layers that mix
            the units they read (a LayerNormalization, GroupNormalization,
            softmax) and how many channels each keeps whole, dead or not
            (removing one would change the others' outputs).
        latency_before: with a ``latency_table`` given to
            :func:`sparsity_report`, the dense model's predicted time in
            seconds of one inference call on a batch of ``latency_batch_size``
            (``None`` without a table).
        latency_after: the same for the pruned structure (live features and units).
        latency_batch_size: the batch size those times are for.
        per_channel: ``(("name (Class)", flops_before, flops_after), ...)``: the
            layers that cost multiply-adds per channel on their own (a
            depthwise convolution: its window at every output position, for
            each channel it keeps), counted in ``flops_before`` and
            ``flops_after`` (normalization, activations, pooling and merges
            are not counted).
    """

    threshold: float
    n_features: int
    selected_features: tuple
    layers: tuple
    layer_sizes: tuple
    original_layer_sizes: tuple
    total_weights: int
    zero_weights: int
    sparsity: float
    live_neurons: int
    params_before: int
    params_after: int
    uninterpreted_layers: tuple
    flops_before: int = 0
    flops_after: int = 0
    neurons: int = None
    streams: tuple = ()
    flops_per_position: bool = False
    inputs: tuple = ()
    kept_whole: tuple = ()
    latency_before: float = None
    latency_after: float = None
    latency_batch_size: int = None
    per_channel: tuple = ()

    @property
    def n_selected_features(self):
        """``len(selected_features)``."""
        return len(self.selected_features)

    @property
    def flops_ratio(self):
        """``flops_after / flops_before`` (1.0 when nothing is removed)."""
        return self.flops_after / self.flops_before if self.flops_before else 1.0

    @property
    def latency_speedup(self):
        """``latency_before / latency_after``: how many times faster the pruned model is predicted to run
        (``None`` without a latency table)."""
        if self.latency_before is None or self.latency_after is None:
            return None
        return self.latency_before / self.latency_after

    @property
    def compression(self):
        """``params_after / params_before`` (1.0 when nothing is removed)."""
        return self.params_after / self.params_before if self.params_before else 1.0

    def to_dict(self):
        """A JSON-serializable dict (tuples become lists)."""
        out = dataclasses.asdict(self)
        out["selected_features"] = list(self.selected_features)
        out["layer_sizes"] = list(self.layer_sizes)
        out["original_layer_sizes"] = list(self.original_layer_sizes)
        out["uninterpreted_layers"] = list(self.uninterpreted_layers)
        out["layers"] = [dataclasses.asdict(layer) for layer in self.layers]
        out["streams"] = [dict(dataclasses.asdict(stream), merges=list(stream.merges), makers=list(stream.makers))
                          for stream in self.streams]
        out["inputs"] = [dict(dataclasses.asdict(found), selected_features=list(found.selected_features))
                         for found in self.inputs]
        out["kept_whole"] = [list(item) for item in self.kept_whole]
        out["per_channel"] = [list(item) for item in self.per_channel]
        return out

    def __str__(self):
        rows = [
            ("layer", "role", "weights", "zero", "sparsity", "groups alive", "units alive", "constant")
        ]
        for layer in self.layers:
            rows.append(
                (
                    layer.name,
                    ("input, output" if layer.role == "input" else "output") if layer.is_output else layer.role,
                    f"{layer.weights:,}",
                    f"{layer.zero_weights:,}",
                    f"{100 * layer.sparsity:.1f}%",
                    f"{layer.groups_alive}/{layer.groups}",
                    f"{layer.units_alive}/{layer.units}",
                    str(layer.constant_units),
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = [f"SparsityReport (|w| <= {self.threshold:g} counts as zero)"]
        for i, row in enumerate(rows):
            cells = [c.ljust(w) if j < 2 else c.rjust(w) for j, (c, w) in enumerate(zip(row, widths))]
            lines.append("  " + "  ".join(cells).rstrip())
        hidden = self.neurons if self.neurons is not None else sum(self.original_layer_sizes[1:])
        lines += [
            f"  selected features: {len(self.selected_features)}/{self.n_features}",
            f"  live neurons:      {self.live_neurons}/{hidden}",
            "  layer sizes:       "
            + "-".join(map(str, self.original_layer_sizes))
            + " -> "
            + "-".join(map(str, self.layer_sizes)),
            f"  sparsity:          {100 * self.sparsity:.2f}% of {self.total_weights:,} kernel weights",
            f"  params:            {self.params_before:,} -> {self.params_after:,}"
            f" ({100 * self.compression:.1f}%; kernels and biases of the layers that make units)",
            f"  FLOPs:             {self.flops_before:,} -> {self.flops_after:,} multiply-adds per sample"
            + (" (per position of the variable (None) axes)" if self.flops_per_position else "")
            + f" ({100 * self.flops_ratio:.1f}%)",
        ]
        if self.per_channel:
            lines.append(f"  of which per channel: {sum(before for _, before, _ in self.per_channel):,} -> "
                         f"{sum(after for _, _, after in self.per_channel):,} in {len(self.per_channel)} "
                         "depthwise layers")
        if self.latency_before is not None:
            lines.append(f"  latency:           {1e3 * self.latency_before:.3f} ms -> {1e3 * self.latency_after:.3f} ms"
                         f" per batch of {self.latency_batch_size} (predicted by the latency table, "
                         f"{self.latency_speedup:.2f}x faster)")
        if len(self.inputs) > 1:
            for found in self.inputs:
                lines.append(f"  input {found.name}: "
                             + ("read as a mask" if found.mask else
                                f"{len(found.selected_features)}/{found.n_features} features"
                                + ("" if found.kept else " (nothing reads it)")))
        for layer in self.layers:
            if layer.heads:
                lines.append(f"  heads of {layer.name}: {layer.heads_alive}/{layer.heads} alive")
        for name, channels in self.kept_whole:
            lines.append(f"  kept whole: {channels} channels read by {name} (it mixes them)")
        for stream in self.streams:
            lines.append(f"  stream {stream.name}: {stream.channels_alive}/{stream.channels} channels "
                         f"(made by {', '.join(stream.makers)})")
        if self.uninterpreted_layers:
            lines.append("  uninterpreted:     " + ", ".join(self.uninterpreted_layers))
        return "\n".join(lines)

    def plot(self, ax=None):
        """Draw the width of every layer before and after: the input features, then the units each layer makes.

        One pair of bars per layer (the dense width, light; what is alive, dark), labelled ``alive/dense``.
        Needs matplotlib (``pip install "keras-group-lasso[plot]"``), imported only here.

        Args:
            ax: a matplotlib ``Axes`` to draw on; ``None``: a new figure.

        Returns:
            The ``Axes``.

        Raises:
            ImportError: matplotlib is not installed (the message says how to install it).

        Example:
            >>> import matplotlib
            >>> matplotlib.use("Agg")
            >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="hidden"),
            ...                           keras.layers.Dense(2, name="out")])
            >>> ax = sparsity_report(model).plot()
            >>> print(*(label.get_text() for label in ax.get_xticklabels()))
            features hidden out
        """
        try:
            import matplotlib.pyplot as plt
        except ImportError as error:
            raise ImportError('SparsityReport.plot needs matplotlib: pip install "keras-group-lasso[plot]" (or '
                              'matplotlib)') from error
        names = ["features"] + [layer.name for layer in self.layers]
        dense = [self.n_features] + [layer.units for layer in self.layers]
        alive = [len(self.selected_features)] + [layer.units_alive for layer in self.layers]
        if ax is None:
            _, ax = plt.subplots(figsize=(max(4.0, 0.6 * len(names) + 1.5), 3.5))
        positions = np.arange(len(names))
        ax.bar(positions, dense, width=0.8, color="#c6dbef", label="dense")
        ax.bar(positions, alive, width=0.5, color="#2171b5", label=f"alive at |w| > {self.threshold:g}")
        for x, (kept, full) in enumerate(zip(alive, dense)):
            ax.annotate(f"{kept}/{full}", (x, full), ha="center", va="bottom", fontsize=8)
        ax.set_xticks(positions)
        ax.set_xticklabels(names, rotation=45 if len(names) > 6 else 0, ha="right" if len(names) > 6 else "center")
        ax.set_ylabel("features / units")
        ax.set_title(f"widths: {self.flops_ratio:.0%} of the FLOPs, {self.compression:.0%} of the parameters")
        ax.legend(loc="upper right", fontsize=8)
        ax.margins(y=0.15)
        return ax


def sparsity_report(model, threshold=1e-3, latency_table=None):
    """Describe the sparsity of ``model``'s Dense and convolution layers at ``threshold`` (the model is not changed).

    ``sparsity = #{|w| <= threshold} / #weights`` over every kernel (the
    paper's "percentage of zero weights with respect to the total number of
    connections"; biases excluded). Selected features, live neurons and
    channels, layer sizes, parameters and FLOPs after pruning come from
    :func:`unit_masks`, so they are those of :func:`~keras_group_lasso.prune_model`.

    A model whose input has axes of unknown size (``keras.Input((None, 8))``,
    ``(None, None, 1)``) is analysed like any other: its groups and what
    survives do not depend on the size. The multiply-adds of a layer before
    global pooling do: they are counted per position of its variable axes,
    and ``report.flops_per_position`` is ``True`` (``str(report)`` says so).

    With a ``latency_table`` the report also holds the predicted time of the
    dense model and of the pruned structure (``latency_before``,
    ``latency_after``, ``latency_speedup``): table look-ups, nothing is timed.

    Args:
        model: a built ``keras.Model`` with at least one Dense or convolution layer.
        threshold: finite number >= 0 (default ``1e-3``, the paper's).
        latency_table: ``None`` or a :class:`~keras_group_lasso.LatencyTable`
            measured for ``model`` at one batch size.

    Returns:
        A frozen :class:`SparsityReport`; ``str(report)`` is a readable table,
        ``report.to_dict()`` is JSON-serializable.

    Raises:
        InvalidParameterError: ``threshold`` is negative, NaN, infinite or not
            a number; ``model`` is not a built ``keras.Model`` or has no Dense
            or convolution layer; ``latency_table`` is not a table of this
            model at one batch size.
        NonFiniteError: a kernel or bias holds NaN or inf (the message names them).

    Example:
        >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(2)])
        >>> kernel = np.ones((4, 3))
        >>> kernel[0] = 0.0  # input feature 0 is dead
        >>> model.layers[0].set_weights([kernel, np.zeros(3)])
        >>> report = sparsity_report(model, threshold=1e-3)
        >>> report.selected_features, report.layer_sizes
        ((1, 2, 3), (3, 3))
    """
    owner = "sparsity_report"
    found = analyze(model, threshold, owner=owner)
    if latency_table is None:
        return found.report
    # A LatencyTable, known by what it does: the costs sit above the report and times narrow copies made by surgery,
    # which builds on this module.
    if not all(callable(getattr(latency_table, name, None)) for name in ("annotate", "check_model")):
        fail(owner, "latency_table", "None or a LatencyTable", latency_table)
    latency_table.check_model(model, owner=owner, name="latency_table")
    if len(latency_table.batch_sizes) > 1:
        fail(owner, "latency_table", "a LatencyTable of one batch size", latency_table)
    return latency_table.annotate(found)


@dataclasses.dataclass(frozen=True, eq=False)
class Analysis:
    """Everything known about a model at one threshold, from one read of its weights.

    Attributes:
        graph: the :class:`~keras_group_lasso.graph.ModelGraph`.
        weights: ``{units layer name: {"kernel", "pointwise", "bias"}}``, thresholded numpy arrays.
        masks: the :class:`UnitMasks`.
        report: the :class:`SparsityReport`.
    """

    graph: object
    weights: dict
    masks: UnitMasks
    report: "SparsityReport"

    @property
    def threshold(self):
        return self.report.threshold


def analyze(model, threshold=1e-3, owner="analyze", round_to=1, values=None, uniform=False):
    """The :class:`Analysis` of ``model`` at ``threshold``: graph, thresholded weights, masks, report.

    What surgery builds on; the report and masks are the ones
    :func:`sparsity_report` and :func:`unit_masks` return. With ``round_to``
    > 1 each hidden layer keeps a multiple of ``round_to`` units (some dead
    ones kept, the outputs unchanged), and the masks and report count those:
    what :func:`~keras_group_lasso.prune_model` with that ``round_to`` builds.
    With ``values`` (``{variable path: numpy array}``) the analysis is of the
    model as if those weights held those values; the model is not changed
    (how a budget weighs candidate cuts). With ``uniform``, the layers at the
    same place of blocks of one class keep as many units each, and their
    attention layers as many heads (``prune_model(blocks="uniform")``).

    Raises:
        InvalidParameterError: for a bad ``threshold`` or ``model``.
        NonFiniteError: a kernel or bias holds NaN or inf.
    """
    graph, threshold = _check_model(owner, model, threshold)
    weights = _thresholded(_read_weights(graph, owner, values), threshold)
    round_to = check_positive_int(owner, "round_to", round_to)
    masks = compute_masks(graph, weights, threshold, round_to, uniform=uniform)
    if uniform:
        weights = _even_heads(graph, weights, masks)
    report = _report_from(graph, weights, masks, threshold)
    return Analysis(graph, weights, masks, report)


def _even_heads(graph, weights, masks):
    """``weights`` with, for the attention layers at the same place of blocks of one class
    (:func:`~keras_group_lasso.graph.masks.block_siblings`) whose rule can keep more heads
    (``UnitsRule.head_floor``), the floor each must keep (``weights[name]["head_floor"]``)."""
    weights = dict(weights)
    for names in block_siblings(graph):
        rules = [registry.units_rule(graph.layers[name]) for name in names]
        if not all(hasattr(rule, "head_floor") for rule in rules):
            continue
        shapes = [rule.head_floor(graph.layers[name], weights[name], np.flatnonzero(masks.units[name]))
                  for rule, name in zip(rules, names)]
        floor = np.max(np.asarray(shapes), axis=0)
        for name in names:
            weights[name] = dict(weights[name], head_floor=floor)
    return weights


def _kernels(layer, weights):
    """The layer's kernels among its ``weights`` (not its biases)."""
    return [weights[role] for role in registry.units_rule(layer).kernels(layer)]


def _report_from(graph, weights, masks, threshold):
    per_layer = []
    total = zero = params_before = params_after = live = flops_before = flops_after = 0
    # A layer called several times (shared) is one row, its weights and parameters counted once and its
    # multiply-adds in every call.
    extra_flops = {}
    for name, first in graph.calls.items():
        if name in masks.units:
            node = graph.node(name)
            shape = graph.output_shape(name, node.out_units)
            rule = registry.units_rule(graph.layers[name])
            kept = (int(masks.inputs[name].sum()), int(masks.units[name].sum()))
            before = graph.node_flops(name)
            after = rule.kept_cost(graph.layers[name], node.positions, kept[0], kept[1], shape,
                                   weights[name]["bias"] is not None, weights[name], masks.units[name])[0]
            total_before, total_after = extra_flops.get(first, (0, 0))
            extra_flops[first] = (total_before + before, total_after + after)
    for node in graph.units:
        name = node.name
        if name in graph.calls:
            continue
        layer = graph.layers[name]
        w = weights[name]
        size = sum(v.size for v in _kernels(layer, w))
        nz = sum(int(np.count_nonzero(v)) for v in _kernels(layer, w))
        kept_in = int(masks.inputs[name].sum())
        kept_out = int(masks.units[name].sum())
        has_bias = w["bias"] is not None
        is_output = masks.is_output[name]
        rule = registry.units_rule(layer)
        shape = graph.output_shape(name, node.out_units) if graph.supported else registry.output_shape(layer, node.out_units)
        before = rule.flops(layer, node.positions, node.in_units, node.out_units, shape)
        after, params_kept = rule.kept_cost(layer, node.positions, kept_in, kept_out, shape, has_bias, w,
                                            masks.units[name])
        before, after = before + extra_flops.get(name, (0, 0))[0], after + extra_flops.get(name, (0, 0))[1]
        params = rule.params(layer, node.positions, node.in_units, node.out_units, has_bias)
        inner = rule.inner_units(layer, w, np.flatnonzero(masks.units[name]))
        per_layer.append(
            LayerSparsity(
                name=name,
                role=masks.roles[name],
                weights=int(size),
                zero_weights=int(size - nz),
                sparsity=float((size - nz) / size) if size else 0.0,
                groups=int(node.in_units),
                groups_alive=int(np.count_nonzero(masks.connections[name].any(axis=1))),
                units=int(node.out_units),
                units_alive=kept_out,
                constant_units=int(masks.constant[name].sum()),
                is_output=bool(is_output),
                kind=class_name(layer),
                flops_before=int(before),
                flops_after=int(after),
                flops_per_position=bool(registry.variable_axes(shape)),
                heads=0 if inner is None else inner[1],
                heads_alive=0 if inner is None else inner[0],
                inputs_alive=kept_in,
            )
        )
        total += size
        zero += size - nz
        params_before += params
        params_after += params_kept
        flops_before += before
        flops_after += after
        if not is_output:
            live += kept_out

    per_channel = _per_channel(graph, masks)
    flops_before += sum(before for _, before, _ in per_channel)
    flops_after += sum(after for _, _, after in per_channel)
    hidden = [layer for layer in per_layer if not layer.is_output]
    n_features = int(masks.features.size)
    neurons, live, streams = _counted_once(graph, masks, live)
    return SparsityReport(
        threshold=float(threshold),
        n_features=n_features,
        selected_features=tuple(int(i) for i in np.flatnonzero(masks.features)),
        layers=tuple(per_layer),
        layer_sizes=(int(masks.features.sum()),) + tuple(layer.units_alive for layer in hidden),
        original_layer_sizes=(n_features,) + tuple(layer.units for layer in hidden),
        total_weights=int(total),
        zero_weights=int(zero),
        sparsity=float(zero / total) if total else 0.0,
        live_neurons=int(live),
        params_before=int(params_before),
        params_after=int(params_after),
        uninterpreted_layers=tuple(f"{name} ({cls})" for name, cls, _ in graph.problems),
        flops_before=int(flops_before),
        flops_after=int(flops_after),
        neurons=neurons,
        streams=streams,
        flops_per_position=any(layer.flops_per_position for layer in per_layer),
        inputs=tuple(
            InputSparsity(found.name, found.count,
                          tuple(int(i) for i in np.flatnonzero(masks.features[found.start : found.start + found.count])),
                          found.start, found.name in graph.side_inputs())
            for found in graph.inputs
        ),
        kept_whole=_kept_whole(graph, masks),
        per_channel=per_channel,
    )


def _per_channel(graph, masks):
    """``(("name (Class)", flops before, flops after), ...)`` of the layers that cost multiply-adds per channel
    (:meth:`~keras_group_lasso.graph.ModelGraph.channel_costs`), after: at the channels that stay."""
    costs = graph.channel_costs() if graph.supported else {}
    needed = needed_units(graph, masks) if costs else None
    return tuple((f"{name} ({class_name(graph.layers[name])})", each * int(ids.size),
                  0 if name in masks.detached else each * int(needed[ids].sum()))
                 for name, (each, ids) in costs.items())


def _kept_whole(graph, masks):
    """``(("name (Class)", channels), ...)`` of the unit-mixing layers before the outputs (a softmax on the
    output units keeps nothing that would otherwise go)."""
    if not graph.supported:
        return ()
    outputs = graph.output_ids
    whole = dict(graph.whole_readers())
    needed = None
    found = []
    for node in graph.nodes:
        if node in whole and node.name not in masks.detached and not {int(i) for i in whole[node]} <= outputs:
            found.append((f"{node.name} ({class_name(graph.layers[node.name])})", int(len(whole[node]))))
        elif node.kind == Kind.PER_UNIT and node.name not in masks.detached and registry.rule_of(
                graph.layers[node.name]).unit_groups(graph.layers[node.name]):
            # A GroupNormalization keeps the whole groups of the channels that are read.
            needed = needed_units(graph, masks) if needed is None else needed
            found.append((f"{node.name} ({class_name(graph.layers[node.name])})", int(needed[node.ids].sum())))
    return tuple(found)


def _counted_once(graph, masks, live):
    """``(neurons, live neurons, streams)``: a unit that several layers make (a residual channel) counts once."""
    if not graph.supported:
        return None, live, ()
    needed = needed_units(graph, masks)
    hidden = set()
    outputs = set()
    for node in graph.units:
        (outputs if node.is_output else hidden).update(int(i) for i in node.out_ids)
    hidden = np.array(sorted(i for i in hidden - outputs if i >= graph.n_features), dtype=int)
    streams = tuple(
        StreamSparsity(s.name, s.merges, s.makers, int(s.ids.size), int(needed[s.ids].sum())) for s in graph.streams
    )
    return int(hidden.size), int(needed[hidden].sum()), streams


# ----------------------------------------------------------------------------- in place


def _thresholdable_layers(model, graph):
    """Every Dense and convolution layer (also those outside the chain), with their kernel and bias variables."""
    layers = list(graph.layers.values()) if graph.layers else _all_layers(model)
    out = []
    for layer in layers:
        rule = registry.rule_of(layer) if layer is not None else None
        if rule is not None and rule.thresholded:
            out.append((layer, rule.thresholded_variables(layer)))
    return out


def _all_layers(model):
    found = []
    for layer in model.layers:
        found.extend(_all_layers(layer) if isinstance(layer, keras.Model) else [layer])
    return found


def apply_threshold(model, threshold=1e-3):
    """Set every Dense and convolution kernel and bias weight with ``|w| <= threshold`` to exactly 0, IN PLACE.

    The paper's final step ("all weights under 1e-3 in absolute value are set
    to 0"), with the same ``<=`` rule as :func:`sparsity_report`, so afterwards
    the report's zero weights are stored zeros. Dense, Conv1D/2D/3D,
    DepthwiseConv and SeparableConv layers are thresholded (both kernels of
    a SeparableConv), BatchNormalization and other layers are not. This is the
    one function here that changes the model; :func:`~keras_group_lasso.prune_model`
    does the same on a copy.

    Args:
        model: a built ``keras.Model`` with at least one Dense or convolution layer.
        threshold: finite number >= 0.

    Returns:
        The number of weights that were non-zero and are now 0.

    Raises:
        InvalidParameterError: for a bad ``threshold`` or ``model``, or a
            ``threshold`` so large that no path of weights above it would lead
            from an input feature to the output (the output a constant:
            :func:`~keras_group_lasso.prune_model` refuses it alike); no weight
            is changed then.
        NonFiniteError: a kernel or bias holds NaN or inf (the message names
            them); no weight is changed then.

    Example:
        >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2)])
        >>> model.layers[0].set_weights([np.array([[5e-4, 1.0], [-2e-4, 3.0]]), np.zeros(2)])
        >>> apply_threshold(model, 1e-3)
        2
    """
    graph, threshold = _check_model("apply_threshold", model, threshold)
    weights = _read_weights(graph, "apply_threshold")  # refuse NaN or inf before changing anything
    # a threshold that would make the output a constant (1e3 typed for 1e-3) is refused as surgery refuses it; a
    # model whose output is a constant already is thresholded as asked
    if threshold > 0 and not compute_masks(graph, _thresholded(weights, threshold), threshold, 1).live_path \
            and compute_masks(graph, _thresholded(weights, 0.0), 0.0, 1).live_path:
        refuse_no_live_path("apply_threshold", model, threshold)
    changed = 0
    for layer, variables in _thresholdable_layers(model, graph):
        for variable in variables:
            values = _to_numpy(variable)
            cut = is_zero(values, threshold) & (values != 0)
            count = int(np.count_nonzero(cut))
            if count:
                variable.assign(np.where(cut, np.zeros((), values.dtype), values))
                changed += count
    return changed


def refuse_no_live_path(owner, model, threshold):
    """Raise for a model with no path of weights from an input feature to the output at ``threshold``: blame the
    threshold only when it is the cause (threshold 0 leaves one)."""
    exact_analysis = analyze(model, 0.0, owner=owner)
    exact = exact_analysis.report
    if threshold > 0 and exact_analysis.masks.live_path:
        fail(
            owner,
            "threshold",
            "small enough to leave a path of weights above it from an input feature to the output "
            f"(at this threshold every input feature is pruned and no input feature reaches the output; "
            f"at threshold 0, {exact.n_selected_features} of {exact.n_features} features reach it)",
            threshold,
        )
    all_zero = [layer.name for layer in exact.layers if layer.zero_weights == layer.weights]
    cause = (
        "every kernel weight of " + ", ".join(f"'{name}'" for name in all_zero) + " is 0"
        if all_zero
        else "each path of non-zero weights from an input feature stops before the output"
    )
    fail(
        owner,
        "model",
        "a model with a path of non-zero weights from an input feature to the output (in this one "
        f"{cause}, so no input feature reaches its output at any threshold, which is a constant or, after a masked "
        "recurrent layer, depends on the sequence lengths only: there is nothing to prune to)",
        model,
    )


# ----------------------------------------------------------------------------- for pictures


def _group_norms(graph, node):
    layer = graph.layers[node.name]
    rule = registry.units_rule(layer)
    return rule.group_norms(layer, node.in_units)


def input_feature_strength(model):
    """Per input feature, the L2 norm of its outgoing weights in the layer that reads the input.

    ``s_i = ||W[i, :]||_2`` of the first kernel (the paper's "overall strength
    of outgoing weights", Figs. 3 and 5); for a convolution, the norm of input
    channel ``i``'s kernel slice. Raw weights, no threshold.

    Returns:
        float32 array ``(n_features,)``.

    Raises:
        InvalidParameterError: ``model`` has no Dense or convolution layer reading its input.

    Example:
        >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2)])
        >>> model.layers[0].set_weights([np.array([[3.0, 4.0], [0.0, 0.0]]), np.zeros(2)])
        >>> input_feature_strength(model)
        array([5., 0.], dtype=float32)
    """
    graph, _ = _check_model("input_feature_strength", model)
    if not graph.supported:
        fail(
            "input_feature_strength",
            "model",
            "a model whose input is read by a Dense or convolution layer (through per-feature layers only)",
            model,
        )
    return _group_norms(graph, graph.first)


def layer_group_norms(model):
    """``{layer name: ||group||_2 for each input unit}`` of every Dense and convolution layer (raw weights).

    Example:
        >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="d")])
        >>> {name: norms.shape for name, norms in layer_group_norms(model).items()}
        {'d': (3,)}
    """
    graph, _ = _check_model("layer_group_norms", model)
    return {node.name: _group_norms(graph, node) for node in graph.units}


def image_shape(model):
    """A shape to draw one value per input feature as an image, or ``None``.

    The model input's own shape when it has 2 or 3 dimensions (``(H, W)`` or
    ``(H, W, C)``, read through Flatten); a square ``(s, s)`` for a flat
    input of ``s * s > 1`` features (a guess: DIGITS' 64 -> 8x8, MNIST's
    784 -> 28x28); otherwise ``None``.

    Example:
        >>> mlp = keras.Sequential([keras.Input((28, 28)), keras.layers.Flatten(), keras.layers.Dense(10)])
        >>> image_shape(mlp)
        (28, 28)
    """
    graph, _ = _check_model("image_shape", model)
    shape = graph.input_shape
    if shape is None or any(d is None for d in shape):
        return None
    if len(shape) in (2, 3):
        return tuple(int(d) for d in shape)
    if len(shape) == 1 and shape[0] > 1:
        side = math.isqrt(int(shape[0]))
        if side * side == shape[0]:
            return (side, side)
    return None
