"""Every ``keras.applications`` family: group penalties on every layer, and exact pruning that reloads.

Each family is tested on its smallest member, built with ``weights=None`` at the
smallest input size it accepts, ``classes=10`` and ``classifier_activation=None``
(logits: the strictest comparison), on pixel inputs in [0, 255] (several
families rescale or normalize their input inside the model).

Random group sparsity is that of ``test_model_families.kill_groups`` (dead input
groups, units that output ``act(b)``, weights pushed below the threshold, random
biases and BatchNormalization statistics). Those helpers push every weight
under 0.05 below the threshold, which suits unit-scale kernels; the kernels of
these networks have fan-ins in the thousands and nearly all of their weights are
smaller, so every path to the output would die. Each kernel is therefore scaled
up for the draw (its 30% smallest weights go below the threshold) and scaled back
after. Models with SeparableConv layers (whose first weight is the depthwise
kernel) take ``test_cnn.kill_channels``, which knows both of their kernels.

Cost: on a two-core CPU the whole list takes about 2.5 minutes on TensorFlow
and more than 13 on JAX (whose op-by-op execution makes a pruning test of a
mid-sized family 35 s to over 2 minutes), far above a fair share of the suite.
So each family runs on one backend only, named in ``FAMILIES`` (``runs_on``),
and is skipped, saying where it runs, on the other two: the three backends
together test every family once. They go to TensorFlow and PyTorch, where they
are cheapest (MobileNet: 41 s on JAX, 2.5 s on PyTorch; DenseNet: 41 s on
TensorFlow, 17 s on PyTorch; ResNetV2 took JAX 61 s and takes TensorFlow 7 s;
Keras builds no NASNet on PyTorch); a cheap family on every backend would still
cost JAX tens of seconds, and MobileNet, MobileNetV3 and both EfficientNets are
already pruned on every backend in ``test_model_families``. The model is built
once per family and shared by its two tests (the pruning test, which runs second
and changes the weights, takes it out of the cache).

Families that surgery cannot rebuild yet are strict expected failures with the
reason the package gives: when support lands, they pass, the run fails, and the
mark must go.
"""

import dataclasses

import keras
import numpy as np
import pytest

from keras_group_lasso import add_group_sparsity, sparsity_report
from keras_group_lasso.graph.build import model_graph
from test_cnn import _separable, kill_channels
from test_model_families import T, assert_prunes_exactly_and_reloads, kill_groups

BACKEND = keras.backend.backend()


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    smallest: str  # the constructor under test
    members: tuple  # every constructor of the family in keras.applications
    runs_on: str = "tensorflow"  # the one backend that tests it
    size: int = 32  # the smallest input side the family accepts
    interpret_fails: object = None  # (exception, reason) while add_group_sparsity/sparsity_report cannot read it
    prune_fails: object = None  # (exception, reason) while prune_model refuses it

    def build(self):
        return getattr(keras.applications, self.smallest)(
            input_shape=(self.size, self.size, 3), weights=None, classes=10, classifier_activation=None)


FAMILIES = [
    Family("ConvNeXt", "ConvNeXtTiny",
           ("ConvNeXtTiny", "ConvNeXtSmall", "ConvNeXtBase", "ConvNeXtLarge", "ConvNeXtXLarge")),
    Family("DenseNet", "DenseNet121", ("DenseNet121", "DenseNet169", "DenseNet201"), runs_on="torch"),
    Family("EfficientNet", "EfficientNetB0", tuple(f"EfficientNetB{i}" for i in range(8)), runs_on="torch"),
    Family("EfficientNetV2", "EfficientNetV2B0",
           ("EfficientNetV2B0", "EfficientNetV2B1", "EfficientNetV2B2", "EfficientNetV2B3",
            "EfficientNetV2S", "EfficientNetV2M", "EfficientNetV2L")),
    # Its CustomScaleLayer (x + scale * branch) is recognized as a weighted sum of its operands.
    Family("InceptionResNetV2", "InceptionResNetV2", ("InceptionResNetV2",), size=75),  # 158 s on PyTorch
    Family("InceptionV3", "InceptionV3", ("InceptionV3",), size=75),
    Family("MobileNet", "MobileNet", ("MobileNet",), runs_on="torch"),
    Family("MobileNetV2", "MobileNetV2", ("MobileNetV2",), runs_on="torch"),
    Family("MobileNetV3", "MobileNetV3Small", ("MobileNetV3Small", "MobileNetV3Large"), runs_on="torch"),
    Family("NASNet", "NASNetMobile", ("NASNetMobile", "NASNetLarge")),  # not built on PyTorch by Keras  # 32x32 without ImageNet weights
    Family("ResNet", "ResNet50", ("ResNet50", "ResNet101", "ResNet152"), runs_on="torch"),
    Family("ResNetV2", "ResNet50V2", ("ResNet50V2", "ResNet101V2", "ResNet152V2"), runs_on="torch"),
    Family("VGG", "VGG16", ("VGG16", "VGG19"), runs_on="torch"),
    Family("Xception", "Xception", ("Xception",), runs_on="torch", size=71),
]


def constructors():
    """Every model constructor that ``keras.applications`` exports."""
    return {name for name in dir(keras.applications)
            if name[:1].isupper() and callable(getattr(keras.applications, name))}


def test_the_family_list_covers_every_constructor_in_keras_applications():
    listed = [name for family in FAMILIES for name in family.members]
    assert len(listed) == len(set(listed))
    assert all(family.smallest in family.members for family in FAMILIES)
    missing = sorted(constructors() - set(listed))
    assert not missing, f"keras.applications has constructors of no listed family: {missing}"
    gone = sorted(set(listed) - constructors())
    assert not gone, f"listed constructors that keras.applications no longer has: {gone}"


def _params(failure_of):
    params = []
    for family in FAMILIES:
        marks = [pytest.mark.skipif(BACKEND != family.runs_on, reason=f"{family.name} is tested on "
                                    f"{family.runs_on} only (each family runs on one backend, to keep the run short)")]
        failure = failure_of(family)
        if failure is not None:
            raises, reason = failure
            marks.append(pytest.mark.xfail(strict=True, raises=raises, reason=reason))
        params.append(pytest.param(family, id=family.name, marks=marks))
    return params


def sparsify(model, rng):
    """Random group sparsity on ``model`` (in place), with kernels at a scale where the helpers' cut-off leaves
    most weights alive."""
    graph = model_graph(model)
    layers = [graph.layers[node.name] for node in graph.units]
    scales = {}
    for layer in layers:
        weights = layer.get_weights()
        # At most 40: a weight the draw leaves above 0.05 stays above the threshold once scaled back.
        scales[layer.name] = min(40.0, 0.05 / float(np.quantile(np.abs(weights[0]), 0.3)))
        weights[0] = weights[0] * scales[layer.name]
        layer.set_weights(weights)
    (kill_channels if any(_separable(layer) for layer in layers) else kill_groups)(model, rng)
    for layer in layers:
        weights = layer.get_weights()
        weights[0] = weights[0] / scales[layer.name]
        layer.set_weights(weights)


_BUILT = {}


def built(family, keep):
    """``family``'s model, built once and shared by its two tests; ``keep=False`` takes it out of the cache."""
    model = _BUILT.pop(family.name, None)
    if model is None:
        model = family.build()
    if keep:
        _BUILT[family.name] = model
    return model


@pytest.mark.parametrize("family", _params(lambda family: family.interpret_fails))
def test_add_group_sparsity_gives_every_layer_of_the_family_its_groups(family):
    model = built(family, keep=True)
    sparse = add_group_sparsity(model, 1e-3)
    assert sparsity_report(sparse, T).uninterpreted_layers == ()


@pytest.mark.parametrize("family", _params(lambda family: family.prune_fails))
def test_the_family_prunes_exactly_reloads_and_leaves_the_model_untouched(family, rng, tmp_path):
    model = built(family, keep=False)
    sparsify(model, rng)
    x = rng.uniform(0, 255, size=(2, family.size, family.size, 3)).astype("float32")
    small = assert_prunes_exactly_and_reloads(model, x, tmp_path)
    assert small.pruning_report.uninterpreted_layers == ()
