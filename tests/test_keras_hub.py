"""KerasHub's CNN backbones and an image classifier around one, as KerasHub builds them.

A KerasHub Backbone or Task is a ``Functional`` subclass whose ``get_config()`` holds its constructor's arguments,
not a layer graph: the graph is read from the model's own nodes. Some families build their blocks as subclassed
layers (EfficientNetV2's FusedMBConvBlock and MBConvBlock, MobileNetV3's blocks): those are traced into the graph.
ResNetV2 pads with ``keras.ops.pad(..., constant_values=-inf)`` before its first max pool; CSPNet splits the
channels of its cross-stage blocks in two with ``keras.ops.split``. HGNetV2's encoder is a
block that returns several tensors; its outputs are a dict of stages.

Each backbone is built from its constructor with a tiny configuration (no download), gets a group penalty on every
kernel without a warning, and prunes exactly into a plain functional model that reloads with plain Keras.
"""

import warnings

import keras
import numpy as np
import pytest
from _fresh_process import assert_loads_without_this_package
from test_applications import sparsify
from test_model_families import T, assert_prunes_exactly_and_reloads

from keras_group_lasso import (GroupSparseModel, InvalidParameterError, UnsupportedModelError, add_group_sparsity,
                               apply_threshold, prune_model)
from keras_group_lasso.graph import registry
from keras_group_lasso.graph.build import fixed_sizes, model_graph

keras_hub = pytest.importorskip("keras_hub")
M = keras_hub.models


def _resnet(block_type, pre_activation):
    return M.ResNetBackbone(
        input_conv_filters=[64], input_conv_kernel_sizes=[3], stackwise_num_filters=[64, 64],
        stackwise_num_blocks=[1, 1], stackwise_num_strides=[1, 2], block_type=block_type,
        use_pre_activation=pre_activation, image_shape=(32, 32, 3))


def _efficientnet(block_types, ratios):
    return M.EfficientNetBackbone(
        stackwise_kernel_sizes=[3, 3, 3], stackwise_num_repeats=[1, 2, 1], stackwise_input_filters=[8, 8, 16],
        stackwise_output_filters=[8, 16, 24], stackwise_expansion_ratios=ratios,
        stackwise_squeeze_and_excite_ratios=[0.25, 0.0, 0.25], stackwise_strides=[1, 2, 2],
        stackwise_block_types=block_types, width_coefficient=1.0, depth_coefficient=1.0, input_shape=(32, 32, 3))


def _mobilenet_v3():
    return M.MobileNetBackbone(
        stackwise_expansion=[[16, 24], [32, 48]], stackwise_num_blocks=[2, 2],
        stackwise_num_filters=[[8, 8], [16, 16]], stackwise_kernel_size=[[3, 3], [5, 5]],
        stackwise_num_strides=[[2, 1], [2, 1]], stackwise_se_ratio=[[None, None], [0.25, 0.25]],
        stackwise_activation=[["relu", "relu"], ["hard_swish", "hard_swish"]],
        stackwise_padding=[[1, 1], [2, 2]], output_num_filters=32, depthwise_filters=8, depthwise_stride=2,
        depthwise_residual=False, last_layer_filter=48, squeeze_and_excite=0.5, input_activation="hard_swish",
        output_activation="hard_swish", input_num_filters=8, image_shape=(32, 32, 3))


def _cspnet(stage_type, block_type, **ratios):
    return M.CSPNetBackbone(
        stem_filters=8, stem_kernel_size=3, stem_strides=2, stackwise_depth=[1, 2], stackwise_strides=2,
        stackwise_num_filters=[16, 32], block_type=block_type, stage_type=stage_type, image_shape=(32, 32, 3),
        **ratios)


BACKBONES = {
    "VGG": lambda: M.VGGBackbone(stackwise_num_repeats=[1, 2], stackwise_num_filters=[8, 16],
                                 image_shape=(32, 32, 3)),
    "ResNet": lambda: _resnet("basic_block", False),
    "ResNet-bottleneck": lambda: _resnet("bottleneck_block", False),
    "ResNetV2": lambda: _resnet("basic_block", True),
    "DenseNet": lambda: M.DenseNetBackbone(stackwise_num_repeats=[2, 2], growth_rate=8, image_shape=(32, 32, 3)),
    "Xception": lambda: M.XceptionBackbone(stackwise_conv_filters=[[8, 16], [16, 32], [32, 32]],
                                           stackwise_pooling=[True, True, False], image_shape=(71, 71, 3)),
    "EfficientNet": lambda: _efficientnet(["v1", "v1", "v1"], [1, 6, 6]),
    "EfficientNetV2": lambda: _efficientnet(["fused", "fused", "unfused"], [1, 4, 4]),
    "MobileNetV3": _mobilenet_v3,
    # cross-stage blocks: keras.ops.split halves the channels, one half through the blocks (CSPDarkNet-53's
    # stages, CS3's) or plain darknet stages
    "CSPDarkNet": lambda: _cspnet("csp", "dark_block", expand_ratio=[2.0, 1.0], bottle_ratio=[0.5, 1.0],
                                  block_ratio=[1.0, 0.5], down_growth=True),
    "CSPNet-cs3": lambda: _cspnet("cs3", "bottleneck_block", bottle_ratio=[0.5], expand_ratio=[2.0],
                                  block_ratio=[1.0]),
    # blocks that return several tensors (its encoder returns every stage's output, its input first), layers made
    # with a dtype policy object
    "HGNetV2": lambda: M.HGNetV2Backbone(
        depths=[1, 1], embedding_size=16, hidden_sizes=[32, 64], stem_channels=[3, 8, 16], hidden_act="relu",
        use_learnable_affine_block=False, stackwise_stage_filters=[(16, 8, 32, 1, 1, 3), (32, 16, 64, 1, 1, 3)],
        apply_downsample=[False, True], use_lightweight_conv_block=[False, True], image_shape=(32, 32, 3)),
}


def _bare_kernel_warnings(model):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sparse = add_group_sparsity(model, 1e-3)
    return sparse, [str(w.message) for w in caught if "get no group penalty" in str(w.message)]


# JAX runs op by op here: the whole list costs it minutes (4.5 on two cores) against 27 s on TensorFlow and 17 s
# on PyTorch, so it prunes the family whose parts are new to the graph on every backend, a pad of -inf (ResNetV2),
# and TensorFlow and PyTorch test them all. (Blocks traced into the graph, EfficientNetV2's, 33 s on JAX, are
# checked there by tests/test_traced_blocks.py; CSPDarkNet, 56 s on JAX: its keras.ops.split of the channels by
# tests/test_branching.py's split blocks.)
ON_JAX = ("ResNetV2",)


def on_torch(why):
    """The mark of a test run on PyTorch only, where KerasHub's models run 3-6x faster than on TensorFlow and JAX
    (the suite's time on 2 cores): ``why`` says where its parts are tested on the other backends."""
    return pytest.mark.skipif(keras.backend.backend() != "torch", reason=f"tested on PyTorch (time; {why})")


def on_tensorflow(why):
    """The mark of a test run on TensorFlow only (one that runs slower on PyTorch): ``why`` as for :func:`on_torch`."""
    return pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason=f"tested on TensorFlow (time; {why})")


def _params():
    skip = pytest.mark.skipif(keras.backend.backend() == "jax", reason="tested on TensorFlow and PyTorch (time)")
    return [pytest.param(family, marks=() if family in ON_JAX else (skip,)) for family in sorted(BACKBONES)]


@pytest.mark.parametrize("family", _params())
def test_a_keras_hub_backbone_is_penalised_whole_and_prunes_exactly(family, rng, tmp_path):
    model = BACKBONES[family]()
    sparse, said = _bare_kernel_warnings(model)
    assert said == []
    graph = model_graph(sparse)
    units_layers = [graph.layers[node.name] for node in graph.units]
    bare = [v.path for layer in units_layers for v in layer.trainable_weights
            if len(v.shape) >= 2 and v.regularizer is None]
    assert bare == [] and len(units_layers) >= 3
    # the kernels left without a group penalty are the depthwise ones (one channel each: per-unit layers)
    left = {v.path for v in sparse.trainable_weights if len(v.shape) >= 2 and v.regularizer is None}
    assert all(registry.rule_of(layer).classify(layer)[0] == "per_unit" for layer in graph.layers.values()
               if layer is not None and any(v.path in left for v in getattr(layer, "trainable_weights", [])))
    sparsify(model, rng)
    side = model.input.shape[1]
    x = rng.uniform(-1, 1, size=(2, side, side, 3)).astype("float32")
    small = assert_prunes_exactly_and_reloads(model, x, tmp_path)  # every output (a dict of stages for some)
    assert type(small) is keras.Model or type(small).__name__ == "Functional"
    assert small.pruning_report.uninterpreted_layers == ()


@pytest.mark.skipif(keras.backend.backend() == "jax", reason="tested on TensorFlow and PyTorch (time: 10 s on JAX, "
                                                             "where a backbone prunes above)")
def test_a_keras_hub_image_classifier_prunes_exactly_with_its_backbone_inside(rng, tmp_path):
    backbone = BACKBONES["ResNet"]()
    classifier = M.ImageClassifier(backbone=backbone, num_classes=5, activation=None)
    _, said = _bare_kernel_warnings(classifier)
    assert said == []
    sparsify(classifier, rng)
    x = rng.uniform(-1, 1, size=(2, 32, 32, 3)).astype("float32")
    small = assert_prunes_exactly_and_reloads(classifier, x, tmp_path)
    assert small.output.shape == (None, 5)


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="a process of its own: 85 s on JAX, 20 s on TensorFlow "
                                                               "(both reload these models in-process above); on PyTorch")
def test_pruned_keras_hub_backbones_load_in_a_process_without_this_package(rng, tmp_path):
    # CSPNet's parts of a split are keras.ops slices, EfficientNetV2's traced blocks plain Keras layers, ViT's
    # blocks plain Keras layers after its kept-whole ViTPatchingAndEmbedding (whose config, as this package writes it,
    # loads), DeiT's the same with its feed-forward parts KerasHub's own: KerasHub and Keras load them, with this
    # package nowhere to import
    from test_traced_blocks import sparsify as sparsify_blocks

    families = {"CSPDarkNet": (BACKBONES["CSPDarkNet"], sparsify, (2, 32, 32, 3)),
                "EfficientNetV2": (BACKBONES["EfficientNetV2"], sparsify, (2, 32, 32, 3)),
                "ViT": (_vit, sparsify_blocks, (2, 16, 16, 3)),
                "DeiT": (_deit, sparsify_blocks, (2, 16, 16, 3))}
    pruned = {}
    for family, (build, sparsify_model, shape) in families.items():
        model = build()
        sparsify_model(model, rng)
        pruned[family] = (prune_model(model, 1e-3), rng.uniform(-1, 1, size=shape).astype("float32"))
    assert_loads_without_this_package(pruned, tmp_path)


# ----------------------------------------------------------------------------- Transformer encoders

# Each encoder block (TransformerEncoder, called with the padding mask) is traced into the graph: its attention
# heads and feed-forward neurons are groups; the attention mask it builds from the padding mask is computed again
# in the pruned model; the token and position embeddings (ReversibleEmbedding, PositionEmbedding) slice their
# tables by channel; the pooler reads the first token (``x[:, 0, :]``).
ENCODERS = {
    "BERT": lambda: M.BertBackbone(vocabulary_size=50, num_layers=2, num_heads=2, hidden_dim=16,
                                   intermediate_dim=32, max_sequence_length=12),
    "BertTextClassifier": lambda: M.BertTextClassifier(
        M.BertBackbone(vocabulary_size=50, num_layers=1, num_heads=2, hidden_dim=16, intermediate_dim=32,
                       max_sequence_length=12), num_classes=3, preprocessor=None, activation=None),
    "DistilBERT": lambda: M.DistilBertBackbone(vocabulary_size=50, num_layers=1, num_heads=2, hidden_dim=16,
                                               intermediate_dim=32, max_sequence_length=12),
    "RoBERTa": lambda: M.RobertaBackbone(vocabulary_size=50, num_layers=1, num_heads=2, hidden_dim=16,
                                         intermediate_dim=32, max_sequence_length=12),
    # one encoder layer called twice: a unit goes only when both calls leave it
    "ALBERT": lambda: M.AlbertBackbone(vocabulary_size=50, num_layers=2, num_heads=2, embedding_dim=8,
                                       hidden_dim=16, intermediate_dim=32, num_groups=1, num_inner_repetitions=1,
                                       max_sequence_length=12),
    "ELECTRA": lambda: M.ElectraBackbone(vocab_size=50, num_layers=1, num_heads=2, embedding_dim=8, hidden_dim=16,
                                         intermediate_dim=32, max_sequence_length=12),
}
# BERT and its classifier on every backend; the others on one each (their parts are BERT's)
ENCODER_BACKENDS = {"DistilBERT": "tensorflow", "RoBERTa": "torch", "ALBERT": "jax", "ELECTRA": "tensorflow"}


def _encoder_params():
    params = []
    for family in ENCODERS:
        only = ENCODER_BACKENDS.get(family)
        skip = pytest.mark.skipif(only is not None and keras.backend.backend() != only,
                                  reason=f"tested on {only} (the parts are BERT's, tested everywhere)")
        if family in ("BERT", "BertTextClassifier"):  # 21-24 s each on JAX, the suite's longest leg
            why = "tested on TensorFlow and PyTorch (time; the encoder block on JAX: ALBERT)"
            skip = pytest.mark.skipif(keras.backend.backend() == "jax", reason=why)
        params.append(pytest.param(family, marks=(skip,)))
    return params


def _token_batch(model, rng, length=12):
    names = {tensor.name if hasattr(tensor, "name") else key for key, tensor in model.input.items()}
    x = {"token_ids": rng.integers(1, 50, size=(3, length)).astype("int32"),
         "padding_mask": (np.arange(length)[None] < np.array([length, 7, 3])[:, None]).astype("int32")}
    if "segment_ids" in names or "segment_ids" in model.input:
        x["segment_ids"] = rng.integers(0, 2, size=(3, length)).astype("int32")
    return x


@pytest.mark.parametrize("family", _encoder_params())
def test_a_keras_hub_transformer_encoder_prunes_heads_and_neurons_exactly(family, rng, tmp_path):
    from test_traced_blocks import sparsify as sparsify_blocks

    model = ENCODERS[family]()
    graph = model_graph(model)
    assert graph.supported, graph.problems
    assert "padding_mask" in graph.side_inputs()
    sparse, said = _bare_kernel_warnings(model)
    assert said == []
    dense = [v for v in sparse.trainable_weights if v.path.endswith("_dense/kernel") and "pooled" not in v.path]
    assert dense and all(v.regularizer is not None for v in dense)
    # the penalised copy (a functional model of the same layers: a Task's Backbone called on a dict) prunes exactly
    # too, each input read where the original reads it
    copy_small = prune_model(sparse, T)
    x = _token_batch(model, rng)
    apply_threshold(sparse, T)
    for got, want in zip(keras.tree.flatten(copy_small(x)), keras.tree.flatten(sparse(x))):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(got), keras.ops.convert_to_numpy(want), rtol=1e-5,
                                   atol=1e-5)
    if family == "BERT":  # the copy reloads with every penalty, those inside KerasHub's blocks too
        sparse.save(tmp_path / "sparse.keras")
        again = keras.saving.load_model(tmp_path / "sparse.keras")
        assert ({v.path for v in again.trainable_weights if v.regularizer is not None}
                == {v.path for v in sparse.trainable_weights if v.regularizer is not None})
    sparsify_blocks(model, rng)
    x = _token_batch(model, rng)
    small = assert_prunes_exactly_and_reloads(model, x, tmp_path)
    assert small.pruning_report.uninterpreted_layers == ()
    # the pruned model still masks: tokens the padding mask leaves out change nothing that is read
    y = dict(x, token_ids=np.where(x["padding_mask"] == 1, x["token_ids"], 49 - x["token_ids"]).astype("int32"))
    for got, want in zip(keras.tree.flatten(small(x)), keras.tree.flatten(small(y))):
        got, want = keras.ops.convert_to_numpy(got), keras.ops.convert_to_numpy(want)
        if got.ndim == 3:  # the sequence: the kept positions
            kept = x["padding_mask"][..., None] == 1
            got, want = np.where(kept, got, 0), np.where(kept, want, 0)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _trained_in_uniform_budget(make, factor, x, y):
    """``make()`` penalised at ``factor``, trained 4 epochs with Proximal(Adam) under
    ``SparsityBudget(max_flops=0.6, uniform_blocks=True)``."""
    from keras_group_lasso import Proximal, SparsityBudget

    keras.utils.set_random_seed(0)
    sparse = add_group_sparsity(make(), factor)
    sparse.compile(optimizer=Proximal(keras.optimizers.Adam(1e-2)),
                   loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the cut to the budget when settling began: said, tested elsewhere
        sparse.fit(x, y, epochs=4, batch_size=32, verbose=0,
                   callbacks=[SparsityBudget(max_flops=0.6, uniform_blocks=True)])
    return sparse


def _kill_columns(model, suffix, dead):
    """Zero the columns ``dead`` (units) of every kernel whose path ends with ``suffix``: each block loses them."""
    for variable in model.weights:
        if variable.path.endswith(suffix):
            kernel = keras.ops.convert_to_numpy(variable).copy()
            kernel[:, dead] = 0.0
            variable.assign(kernel)


# A MaskedLM Task: KerasHub's MaskedLMHead gathers the encoder's outputs at ``mask_positions`` (an input passed by
# position, read as a side tensor), transforms them and projects them with the token table it was given (tied to
# the Backbone's). It is kept whole; the pruned model's head projects with the new model's table, still tied.
MASKED_LMS = {
    "BertMaskedLM": lambda: M.BertMaskedLM(backbone=ENCODERS["BERT"](), preprocessor=None),
    "RobertaMaskedLM": lambda: M.RobertaMaskedLM(backbone=ENCODERS["RoBERTa"](), preprocessor=None),
    "DistilBertMaskedLM": lambda: M.DistilBertMaskedLM(backbone=ENCODERS["DistilBERT"](), preprocessor=None),
    "AlbertMaskedLM": lambda: M.AlbertMaskedLM(backbone=ENCODERS["ALBERT"](), preprocessor=None),
}
MASKED_LM_BACKENDS = {"BertMaskedLM": "tensorflow", "RobertaMaskedLM": "torch", "DistilBertMaskedLM": "jax",
                      "AlbertMaskedLM": "torch"}


def _masked_lm_batch(model, rng):
    x = _token_batch(model, rng)
    x["mask_positions"] = np.stack([rng.permutation(length)[:3] for length in (12, 7, 3)]).astype("int32")
    return x


def _tables(model):
    return {id(layer) for layer in model._flatten_layers() if type(layer).__name__ == "ReversibleEmbedding"}


@pytest.mark.parametrize("family", [pytest.param(family, marks=pytest.mark.skipif(
    keras.backend.backend() != backend, reason=f"tested on {backend} (the head's rule is one for all)"))
    for family, backend in MASKED_LM_BACKENDS.items()])
def test_a_masked_lm_prunes_exactly_with_its_head_whole_and_its_token_table_still_tied(family, rng, tmp_path):
    from test_model_families import assert_same_outputs
    from test_traced_blocks import sparsify as sparsify_blocks

    model = MASKED_LMS[family]()
    graph = model_graph(model)
    assert graph.supported, graph.problems
    assert {"padding_mask", "mask_positions"} <= set(graph.side_inputs())
    sparsify_blocks(model, rng)
    x = _masked_lm_batch(model, rng)
    small = prune_model(model, T)
    assert_same_outputs(small, model, x, 1e-5)
    small.save(tmp_path / "small.keras")
    again = keras.saving.load_model(tmp_path / "small.keras")  # plain Keras and KerasHub
    assert_same_outputs(again, small, x, 1e-6)
    head = next(layer for layer in small.layers if type(layer).__name__ == "MaskedLMHead")
    if family in ("BertMaskedLM", "AlbertMaskedLM"):  # the table is a layer of the model: the head projects with it
        assert _tables(small) == {id(head.token_embedding)}
    else:  # inside the TokenAndPositionEmbedding block built again: a copy (a Keras file holds a layer once)
        assert len(_tables(small)) == 2


@pytest.mark.skipif(keras.backend.backend() == "jax", reason="tested on TensorFlow and PyTorch (time; the head "
                                                             "prunes on JAX above)")
def test_a_bert_masked_lm_whose_blocks_keep_as_many_neurons_is_a_bert_masked_lm_again(rng):
    """Every block loses the same feed-forward neurons: a ``BertMaskedLM`` from its config, its Backbone's pooler
    (which no output of the Task reads, so surgery leaves it out) holding the original's weights."""
    from test_model_families import assert_same_outputs

    lm = MASKED_LMS["BertMaskedLM"]()
    _kill_columns(lm, "feedforward_intermediate_dense/kernel", rng.permutation(32)[:9])
    pooler = keras.ops.convert_to_numpy(lm.backbone.get_layer("pooled_dense").kernel)
    small = prune_model(lm, T)
    assert type(small) is M.BertMaskedLM and small.rebuilt_model and small.backbone.intermediate_dim == 23
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(small.backbone.get_layer("pooled_dense").kernel), pooler)
    apply_threshold(lm, T)
    assert_same_outputs(small, lm, _masked_lm_batch(lm, rng), 1e-5)  # the tied table thresholded too
    assert len(_tables(small)) == 1


@pytest.mark.skipif(keras.backend.backend() == "jax", reason="tested on TensorFlow and PyTorch (its parts are BERT's "
                                                             "and GPT-2's, tested on JAX)")
def test_bart_prunes_exactly_with_its_cross_attention_kept_whole(rng, tmp_path):
    from test_traced_blocks import sparsify as sparsify_blocks

    model = M.BartBackbone(vocabulary_size=50, num_layers=2, num_heads=2, hidden_dim=16, intermediate_dim=32,
                           max_sequence_length=12)
    graph = model_graph(model)
    assert graph.supported, graph.problems
    cross = [node.name for node in graph.nodes if node.name.endswith("/cross_attention")]
    assert len(cross) == 2 and all(graph.tensor(name).kind == "whole" for name in cross)
    sparse, said = _bare_kernel_warnings(model)
    heads_whole, crossing = said  # the decoders' self-attention heads (their class ties a head's size to their
    assert "the heads of 'transformer_decoder_layer_0/self_attention'" in heads_whole  # number), cross-attention
    assert "'transformer_decoder_layer_0/cross_attention', 'transformer_decoder_layer_1/cross_attention' read two" \
        in crossing
    assert not any("cross_attention" in v.path for v in sparse.trainable_weights if v.regularizer is not None)
    sparsify_blocks(model, rng)
    x = {f"{side}_{key}": value for side in ("encoder", "decoder") for key, value in _token_batch(model, rng).items()}
    small = assert_prunes_exactly_and_reloads(model, x, tmp_path)
    assert small.pruning_report.uninterpreted_layers == ()
    # the decoders (traced at fixed sizes) are built again as themselves, their cross-attention inside them
    assert [type(small.get_layer(f"transformer_decoder_layer_{k}")).__name__ for k in (0, 1)] == [
        "TransformerDecoder"] * 2
    # its Task too: the logits are the token table again (tied), the backbone inside it prunes the same
    lm = M.BartSeq2SeqLM(backbone=model, preprocessor=None)
    small_lm = prune_model(lm, T)
    apply_threshold(lm, T)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(small_lm(x)), keras.ops.convert_to_numpy(lm(x)),
                               rtol=1e-5, atol=1e-5)
    assert small_lm.count_params() < lm.count_params()


# T5: each stack's first block computes the relative position bias (its own table, the padding or causal mask
# folded in) and returns it beside its outputs; the later blocks of the stack are given it. The attention layers
# (self and cross) are kept whole, the position bias a side tensor from the first block's attention to the later
# ones; the gated feed-forward neurons go, each block built again as a T5TransformerLayer.
def _t5():
    return M.T5Backbone(vocabulary_size=50, num_layers=2, num_heads=2, hidden_dim=16, intermediate_dim=32,
                        key_value_dim=8, dropout=0.0)


_T5_BLOCKS = [f"transformer_{stack}_layer_{i}" for stack in ("encoder", "decoder") for i in (0, 1)]


def _t5_batch(rng, encoder=12, decoder=12):
    x = {}
    for side, length in (("encoder", encoder), ("decoder", decoder)):
        x[f"{side}_token_ids"] = rng.integers(1, 50, size=(3, length)).astype("int32")
        x[f"{side}_padding_mask"] = (np.arange(length)[None] < np.array([length, 7, 3])[:, None]).astype("int32")
    return x


def _assert_generates_the_thresholded_tokens(small, lm, rng):
    """The pruned sequence-to-sequence Task ``small`` generates greedily what ``lm`` thresholded (in place) does."""
    x = {"encoder_token_ids": rng.integers(1, 50, size=(2, 6)).astype("int32"),
         "encoder_padding_mask": np.ones((2, 6), "int32"), "decoder_token_ids": np.zeros((2, 5), "int32"),
         "decoder_padding_mask": (np.arange(5) < 1)[None].repeat(2, 0).astype("int32")}
    apply_threshold(lm, T)  # what prune_model's result computes: the same greedy tokens
    for task in (small, lm):
        task.compile(sampler="greedy")
    got, want = small.generate(x, stop_token_ids=None), lm.generate(x, stop_token_ids=None)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(got["decoder_token_ids"]),
                                  keras.ops.convert_to_numpy(want["decoder_token_ids"]))


def _kill_t5_neurons(model, counts, rng):
    for call, count in zip(_T5_BLOCKS, counts):  # rows of the down projection: neurons whose group is zero
        variable = next(v for v in model.weights if v.path == f"{call}/output_projector/kernel")
        kernel = keras.ops.convert_to_numpy(variable).copy()
        kernel[rng.permutation(kernel.shape[0])[:count]] = 0.0
        variable.assign(kernel)


def test_t5_is_read_with_its_position_bias_a_side_tensor_from_each_stack_s_first_block():
    # on JAX too, where the decoder's causal mask (a JAX array) and its padding mask (an input) meet in `&`
    graph = model_graph(_t5())
    assert graph.supported, graph.problems
    for stack in ("encoder", "decoder"):
        side = graph.side_tensors[f"transformer_{stack}_layer_1/self_attention"]["position_bias"]
        assert side.end == f"transformer_{stack}_layer_0/self_attention/@1" and side.steps == ()
        mask = graph.side_tensors[f"transformer_{stack}_layer_1/self_attention"]["mask"]
        assert mask.reads() == (f"{stack}_padding_mask",)  # padding_mask[:, None, :], computed again
    assert all(graph.tensor(f"{call}/self_attention").kind == "whole" for call in _T5_BLOCKS)
    assert [graph.tensor(f"transformer_decoder_layer_{i}/cross_attention").kind for i in (0, 1)] == ["whole"] * 2
    assert fixed_sizes(graph.blocks["transformer_decoder_layer_0"].layer)  # its causal mask: built again as itself


@pytest.mark.skipif(keras.backend.backend() == "jax", reason="tested on TensorFlow and PyTorch (time; the graph is "
                                                             "read on JAX above)")
def test_t5_loses_gated_feed_forward_neurons_exactly_with_its_attention_and_position_bias_whole(rng, tmp_path):
    from test_model_families import assert_same_outputs

    model = _t5()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sparse = add_group_sparsity(model, 1e-3)
    said = [str(w.message) for w in caught if "stay whole" in str(w.message)]
    assert len(said) == 1 and "'transformer_decoder_layer_0/self_attention' (T5MultiHeadAttention)" in said[0], said
    assert {v.path for v in sparse.trainable_weights if v.regularizer is not None} == {
        f"{call}/{kernel}/kernel" for call in _T5_BLOCKS
        for kernel in ("input_projector", "gate_projector", "output_projector")}
    _kill_t5_neurons(model, (3, 7, 1, 11), rng)
    small = assert_prunes_exactly_and_reloads(model, _t5_batch(rng), tmp_path)
    assert_same_outputs(small, model, _t5_batch(rng, encoder=5, decoder=9), 1e-5)  # other lengths, other masks
    for call, kept in zip(_T5_BLOCKS, (29, 25, 31, 21)):
        assert type(small.get_layer(call)).__name__ == "T5TransformerLayer"
        assert small.rebuilt_blocks[call].changed == {"intermediate_dim": (32, kept)}
    # the token table the encoder and the decoder share stays one layer
    assert [type(layer).__name__ for layer in small.layers].count("ReversibleEmbedding") == 1


@on_torch("T5 prunes on TensorFlow above, its graph is read on JAX")
def test_a_t5_whose_blocks_keep_as_many_neurons_is_a_t5_seq2seq_lm_again_and_generates(rng):
    from test_model_families import assert_same_outputs

    model = _t5()
    _kill_t5_neurons(model, (5, 5, 5, 5), rng)
    lm = M.T5Seq2SeqLM(backbone=model, preprocessor=None)
    small = prune_model(lm, T)
    assert type(small) is M.T5Seq2SeqLM and small.rebuilt_model
    assert small.backbone.intermediate_dim == 27
    assert_same_outputs(small, lm, _t5_batch(rng, encoder=7, decoder=4), 1e-5)
    _assert_generates_the_thresholded_tokens(small, lm, rng)


@on_torch("T5 prunes on TensorFlow above, uniform-block budgets on Gemma and plain blocks everywhere")
def test_a_budget_with_uniform_blocks_trains_a_t5_seq2seq_lm_into_a_t5_seq2seq_lm_within_its_size(rng):
    """``SparsityBudget(max_flops=0.6, uniform_blocks=True)`` on a ``T5Seq2SeqLM`` (two sequences, FLOPs counted per
    position): the gated feed-forward neurons of its four blocks go during training, by rank together; the result
    of ``prune_model(blocks="uniform")`` is a ``T5Seq2SeqLM`` within the budget, exact against the thresholded copy,
    and generates its tokens."""
    from test_model_families import assert_same_outputs

    from keras_group_lasso.analysis import analyze

    enc = rng.integers(1, 50, size=(256, 8)).astype("int32")
    x = {"encoder_token_ids": enc, "encoder_padding_mask": np.ones_like(enc),  # the answer: each token times 7
         "decoder_token_ids": np.concatenate([np.zeros_like(enc[:, :1]), (enc[:, :-1] * 7) % 50], axis=1),
         "decoder_padding_mask": np.ones_like(enc)}
    sparse = _trained_in_uniform_budget(lambda: M.T5Seq2SeqLM(backbone=_t5(), preprocessor=None), 1e-4, x,
                                        (enc * 7) % 50)
    report = analyze(sparse, T, uniform=True).report
    assert report.flops_per_position and 0.48 <= report.flops_after / report.flops_before <= 0.6
    small = prune_model(sparse, T, blocks="uniform")
    assert type(small) is M.T5Seq2SeqLM and small.rebuilt_model and small.backbone.intermediate_dim < 32
    assert small.pruning_report.flops_after == report.flops_after
    apply_threshold(sparse, T)
    assert_same_outputs(small, sparse, _t5_batch(rng, encoder=7, decoder=4), 1e-5)
    # the penalised copy is a functional model (no generate()): its greedy tokens, one position at a time
    x = {"encoder_token_ids": enc[:2], "encoder_padding_mask": np.ones_like(enc[:2]),
         "decoder_token_ids": np.zeros((2, 5), "int32"), "decoder_padding_mask": np.ones((2, 5), "int32")}
    for i in range(4):
        logits = keras.ops.convert_to_numpy(sparse(x))
        x["decoder_token_ids"][:, i + 1] = logits[:, i].argmax(-1)
    small.compile(sampler="greedy")
    got = small.generate(dict(x, decoder_token_ids=np.zeros((2, 5), "int32"),
                              decoder_padding_mask=(np.arange(5) < 1)[None].repeat(2, 0).astype("int32")),
                         stop_token_ids=None)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(got["decoder_token_ids"]), x["decoder_token_ids"])


@on_torch("BART prunes on TensorFlow above; its parts are BERT's and GPT-2's, tested on JAX")
def test_a_bart_whose_blocks_keep_as_many_neurons_is_a_bart_seq2seq_lm_again_and_generates(rng):
    from test_model_families import assert_same_outputs

    model = M.BartBackbone(vocabulary_size=50, num_layers=2, num_heads=2, hidden_dim=16, intermediate_dim=32,
                           max_sequence_length=12)
    for variable in model.weights:  # each block of both stacks loses 5 neurons, its heads all stay
        if variable.path.endswith("feedforward_output_dense/kernel"):
            kernel = keras.ops.convert_to_numpy(variable).copy()
            kernel[rng.permutation(32)[:5]] = 0.0
            variable.assign(kernel)
    lm = M.BartSeq2SeqLM(backbone=model, preprocessor=None)
    small = prune_model(lm, T)
    assert type(small) is M.BartSeq2SeqLM and small.rebuilt_model and small.backbone.intermediate_dim == 27
    assert_same_outputs(small, lm, _t5_batch(rng, encoder=7, decoder=4), 1e-5)
    _assert_generates_the_thresholded_tokens(small, lm, rng)


@pytest.mark.skipif(keras.backend.backend() == "jax", reason="40 s on JAX; blocks built again are tested there in "
                                                             "tests/test_traced_blocks.py")
def test_an_encoder_that_lost_feed_forward_neurons_only_is_a_keras_hub_transformer_encoder_again(rng, tmp_path):
    model = ENCODERS["BERT"]()
    for variable in model.weights:  # each encoder loses its own neurons; the heads all stay
        if variable.path.endswith("intermediate_dense/kernel"):
            kernel = keras.ops.convert_to_numpy(variable).copy()
            kernel[:, rng.permutation(kernel.shape[1])[: int(rng.integers(4, 20))]] = 0.0
            variable.assign(kernel)
    small = assert_prunes_exactly_and_reloads(model, _token_batch(model, rng), tmp_path)
    for call, found in small.rebuilt_blocks.items():
        block = small.get_layer(call)
        assert type(block).__name__ == "TransformerEncoder" and type(block).__module__.startswith("keras_hub")
        old, new = found.changed["intermediate_dim"]
        assert old == 32 > new == block.intermediate_dim and set(found.changed) == {"intermediate_dim"}
    assert len(small.rebuilt_blocks) == 2


DECODERS = {  # grouped-query attention whose class ties the size of a head to the width: heads stay whole
    family: (lambda cls=cls: getattr(M, cls)(vocabulary_size=50, num_layers=2, num_query_heads=4,
                                              num_key_value_heads=2, hidden_dim=16, intermediate_dim=24))
    for family, cls in (("Llama", "LlamaBackbone"), ("Llama3", "Llama3Backbone"), ("Mistral", "MistralBackbone"),
                        ("Qwen2", "QwenBackbone"), ("Phi3", "Phi3Backbone"))
}
# each family on one backend or two (the suite's time on 2 cores): the parts are Llama's, and Gemma's rule (the
# same one, heads pruned) runs on all three
DECODER_BACKENDS = {"Llama": ("tensorflow",), "Llama3": ("torch",), "Mistral": ("torch",),
                    "Qwen2": ("tensorflow",), "Phi3": ("torch",)}


def _decoder_params():
    return [pytest.param(family, marks=(pytest.mark.skipif(
        keras.backend.backend() not in DECODER_BACKENDS[family],
        reason=f"tested on {', '.join(DECODER_BACKENDS[family])} (the parts are Llama's)"),)) for family in DECODERS]


def _kill_neurons(model, dead):
    """Zero the down-projection rows of feed-forward neurons ``dead[i]`` in decoder ``i``."""
    for i, neurons in enumerate(dead):
        variable = next(v for v in model.weights
                        if v.path == f"transformer_layer_{i}/feedforward_output_dense/kernel")
        values = keras.ops.convert_to_numpy(variable).copy()
        values[list(neurons)] = 0.0
        variable.assign(values)


@pytest.mark.parametrize("family", _decoder_params())
def test_llama_style_decoders_lose_gated_neurons_exactly_with_their_heads_whole(family, rng, tmp_path):
    """KerasHub's Llama (and Llama 3), Mistral, Qwen2 and Phi-3 decoders: traced at probe sizes (their causal mask and rotary
    positions), read as a grouped-query attention kept whole (their classes derive the size of a head from the
    width and the number of heads; said once) and a gated feed-forward whose neurons go from gate, up and down
    together; built again as their own class (KerasHub 0.32's Llama decoder writes no config it can read: the
    pruned one writes its arguments), saved, loaded without this package."""
    from test_model_families import assert_same_outputs

    model = DECODERS[family]()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sparse = add_group_sparsity(model, 1e-3)
    said = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    assert len(said) == 1 and "get no group penalty and stay whole" in said[0], said
    penalised = {v.path for v in sparse.trainable_weights if v.regularizer is not None}
    assert {f"transformer_layer_{i}/feedforward_{part}_dense/kernel" for i in (0, 1)
            for part in ("gate", "intermediate", "output")} <= penalised
    _kill_neurons(model, ([1, 4, 7], [0, 2]))
    small = assert_prunes_exactly_and_reloads(model, _token_batch(model, rng), tmp_path)
    assert_same_outputs(small, model, _token_batch(model, rng, length=5), 1e-5)
    assert {call: found.changed for call, found in small.rebuilt_blocks.items()} == {
        "transformer_layer_0": {"intermediate_dim": (24, 21)}, "transformer_layer_1": {"intermediate_dim": (24, 22)}}
    assert small.pruning_report.uninterpreted_layers == ()
    assert_loads_without_this_package({family: (small, _token_batch(model, rng))}, tmp_path)


@on_torch("Llama prunes on TensorFlow above; a Task built again is tested on JAX with GPT-2")
def test_a_llama_causal_lm_whose_decoders_keep_as_many_neurons_is_a_llama_causal_lm_again_and_generates(rng,
                                                                                                       tmp_path):
    lm = M.LlamaCausalLM(backbone=DECODERS["Llama"](), preprocessor=None)
    _kill_neurons(lm.backbone, ([1, 4, 7], [2, 5, 9]))
    small = assert_prunes_exactly_and_reloads(lm, _token_batch(lm, rng), tmp_path)
    assert type(small) is M.LlamaCausalLM and small.rebuilt_model and small.backbone.intermediate_dim == 21
    prompt = {"token_ids": np.array([[5, 6, 7, 0, 0, 0]], "int32"),
              "padding_mask": np.array([[1, 1, 1, 0, 0, 0]], "int32")}
    apply_threshold(lm, T)
    for model in (small, lm):
        model.compile(sampler="greedy")  # Llama samples from the top k by default
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(small.generate(prompt, stop_token_ids=None)["token_ids"]),
                                  keras.ops.convert_to_numpy(lm.generate(prompt, stop_token_ids=None)["token_ids"]))


def _gpt2():
    return M.GPT2Backbone(vocabulary_size=50, num_layers=2, num_heads=2, hidden_dim=8, intermediate_dim=12,
                          max_sequence_length=16)


@pytest.mark.skipif(keras.backend.backend() == "jax", reason="tested on TensorFlow and PyTorch (time: 21 s on JAX, "
                                                             "where GPT-2's decoders are built again below)")
def test_gpt2_loses_feed_forward_neurons_exactly_and_its_decoders_stay_keras_hub_decoders(rng, tmp_path):
    """GPT-2's decoders take the sequence length as a number (their causal mask): traced at probe sizes, they are
    penalised inside (feed-forward neurons; heads stay whole, said once) and pruned only as themselves, built again
    from their config, each with the neurons it kept; the pruned model computes its causal masks at any length."""
    from test_model_families import assert_same_outputs
    from test_traced_blocks import sparsify as sparsify_blocks

    model = _gpt2()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sparse = add_group_sparsity(model, 1e-3)
    said = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    assert len(said) == 1 and said[0].startswith(
        "add_group_sparsity: the heads of 'transformer_layer_0/self_attention', 'transformer_layer_1/self_attention' "
        "get no group penalty and stay whole"), said
    penalised = {v.path for v in sparse.trainable_weights if v.regularizer is not None}
    assert {f"transformer_layer_{i}/feedforward_{part}_dense/kernel" for i in (0, 1)
            for part in ("intermediate", "output")} <= penalised
    sparsify_blocks(model, rng)
    for call, dead in (("transformer_layer_0", [1, 4, 7]), ("transformer_layer_1", [0, 2, 3, 9, 11])):
        layer = model.get_layer(call)._feedforward_intermediate_dense  # neurons that output gelu(b): constants
        kernel, bias = layer.get_weights()
        kernel[:, dead] = 0.0
        layer.set_weights([kernel, bias])
    small = assert_prunes_exactly_and_reloads(model, _token_batch(model, rng), tmp_path)
    assert_same_outputs(small, model, _token_batch(model, rng, length=5), 1e-5)
    assert set(small.rebuilt_blocks) == {"transformer_layer_0", "transformer_layer_1"}
    for call, found in small.rebuilt_blocks.items():
        block = small.get_layer(call)
        assert type(block).__name__ == "TransformerDecoder" and type(block).__module__.startswith("keras_hub")
        live = int(np.any(model.get_layer(call)._feedforward_intermediate_dense.get_weights()[0] != 0, axis=0).sum())
        assert found.changed == {"intermediate_dim": (12, live)} and block.intermediate_dim == live < 12
        assert block.num_heads == 2


# Bloom's attention (ALiBi positions), GPT-NeoX's (one fused query-key-value projection, partial rotary positions)
# and Falcon's (an ALiBi table its decoder computes from the padding mask and passes in) are kept whole by their
# class; their decoders, traced at probe sizes, lose feed-forward neurons and are built again as themselves.
# (Falcon's decoder multiplies a JAX array by a symbolic tensor on JAX: traced there as elsewhere.) SmolLM3's
# grouped-query attention builds and computes its output shapes from a list of input shapes: kept whole too, built
# and called symbolically with Keras's shapes; its gated feed-forward loses a neuron from gate, up and down together.
def _smollm3():
    return M.SmolLM3Backbone(
        vocabulary_size=50, hidden_dim=16, intermediate_dim=32, num_layers=2, num_attention_heads=4,
        num_key_value_heads=2, attention_bias=False, attention_dropout=0.0, rope_layer_enabled_list=[True, True],
        layer_types=["attention", "attention"], mlp_bias=False, layer_norm_epsilon=1e-6, max_position_embeddings=32,
        rope_theta=10000.0, partial_rotary_factor=1.0)


WHOLE_ATTENTION = {  # family: (backbone, feed-forward kernel (a down projection: its rows), decoder, attention, width)
    "Bloom": (lambda: M.BloomBackbone(vocabulary_size=50, num_layers=2, num_heads=2, hidden_dim=16,
                                      intermediate_dim=32), "mlp_intermediate_dense", "BloomDecoder", "self_attention",
              "intermediate_dim"),
    "GPTNeoX": (lambda: M.GPTNeoXBackbone(vocabulary_size=50, num_layers=2, num_heads=2, hidden_dim=16,
                                          intermediate_dim=32, max_sequence_length=16),
                "feedforward_intermediate_dense", "GPTNeoXDecoder", "self_attention", "intermediate_dim"),
    "Falcon": (lambda: M.FalconBackbone(vocabulary_size=50, num_layers=2, num_attention_heads=2, hidden_dim=16,
                                        intermediate_dim=32), "dense_h_to_4h", "FalconTransformerDecoder", "attention",
               "intermediate_dim"),
    "SmolLM3": (_smollm3, "mlp/down_proj", "SmolLM3DecoderLayer", "self_attn", "intermediate_size"),
}


@pytest.mark.parametrize("family", [pytest.param(family, marks=pytest.mark.skipif(
    keras.backend.backend() != backend, reason=f"tested on {backend} (time; the rule is one for all)"))
    for family, backend in (("Bloom", "tensorflow"), ("GPTNeoX", "torch"), ("Falcon", "torch"),
                            ("SmolLM3", "torch"))])
def test_decoders_whose_attention_is_kept_whole_lose_feed_forward_neurons_exactly(family, rng, tmp_path):
    from test_model_families import assert_same_outputs

    build, intermediate, decoder, attention, width = WHOLE_ATTENTION[family]
    model = build()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sparse = add_group_sparsity(model, 1e-3)
    said = [str(w.message) for w in caught if "stay whole" in str(w.message)]
    assert len(said) == 1 and said[0].startswith(
        f"add_group_sparsity: the heads of 'transformer_layer_0/{attention}'"), said
    penalised = {v.path for v in sparse.trainable_weights if v.regularizer is not None}
    assert {f"transformer_layer_{i}/{intermediate}/kernel" for i in (0, 1)} <= penalised
    assert not any("attention" in path for path in penalised)
    for i, dead in enumerate(([1, 4, 7, 20], [0, 2, 3, 9, 11, 31])):
        layer = next(v for v in model.weights if v.path == f"transformer_layer_{i}/{intermediate}/kernel")
        kernel = keras.ops.convert_to_numpy(layer).copy()
        if intermediate.endswith("down_proj"):
            kernel[dead] = 0.0  # neurons whose outgoing group is zero
        else:
            kernel[:, dead] = 0.0  # neurons that output act(b): constants, folded into the next layer's bias
        layer.assign(kernel)
    small = assert_prunes_exactly_and_reloads(model, _token_batch(model, rng), tmp_path)
    assert_same_outputs(small, model, _token_batch(model, rng, length=5), 1e-5)
    for call, kept in (("transformer_layer_0", 28), ("transformer_layer_1", 26)):
        assert small.rebuilt_blocks[call].changed == {width: (32, kept)}
        assert type(small.get_layer(call)).__name__ == decoder


def test_falcon_is_read_on_every_backend():
    # its decoder computes its ALiBi table from a JAX array and the padding mask on JAX (pruned exactly above)
    graph = model_graph(WHOLE_ATTENTION["Falcon"][0]())
    assert graph.supported, graph.problems
    assert graph.tensor("transformer_layer_1/attention").kind == "whole"
    assert all(fixed_sizes(graph.blocks[f"transformer_layer_{i}"].layer) for i in (0, 1))  # built again as itself


def test_gpt2_whose_decoders_keep_as_many_neurons_is_a_gpt2_backbone_again_and_generates(rng, tmp_path):
    """Every decoder with the same ``intermediate_dim``: the pruned model is a ``GPT2Backbone`` again (its config
    says that width), exact, reloaded, and a ``GPT2CausalLM`` holds it and generates."""
    model = _gpt2()
    for call in ("transformer_layer_0", "transformer_layer_1"):
        layer = model.get_layer(call)._feedforward_intermediate_dense
        kernel, bias = layer.get_weights()
        kernel[:, [1, 4, 7]] = 0.0
        layer.set_weights([kernel, bias])
    small = assert_prunes_exactly_and_reloads(model, _token_batch(model, rng), tmp_path)
    assert type(small) is M.GPT2Backbone and small.rebuilt_model and small.intermediate_dim == 9
    assert small.count_params() < model.count_params()
    lm = M.GPT2CausalLM(backbone=small, preprocessor=None)
    prompt = {"token_ids": np.array([[5, 6, 7, 0, 0, 0]], "int32"), "padding_mask": np.array([[1, 1, 1, 0, 0, 0]],
                                                                                             "int32")}
    tokens = keras.ops.convert_to_numpy(lm.generate(prompt, stop_token_ids=None)["token_ids"])
    assert tokens.shape == (1, 6) and tokens[0, :3].tolist() == [5, 6, 7] and (tokens < 50).all()
    # decoders that keep different widths: a functional model of KerasHub's decoders
    layer = model.get_layer("transformer_layer_1")._feedforward_intermediate_dense
    kernel, bias = layer.get_weights()
    kernel[:, 0] = 0.0
    layer.set_weights([kernel, bias])
    small = prune_model(model, T)
    assert not isinstance(small, M.GPT2Backbone) and not small.rebuilt_model


def test_a_gpt2_decoder_is_never_flattened_into_layers_that_hold_its_mask_at_one_length():
    model = _gpt2()
    with pytest.raises(UnsupportedModelError, match=r"^prune_model: cannot prune layer 'transformer_layer_0' "
                                                    r"\(TransformerDecoder\): a block whose call takes its input's "
                                                    r"length as a number .* \(blocks='rebuild'\)\."):
        prune_model(model, T, blocks="flatten")


@on_torch("GPT-2's decoders prune on TensorFlow and PyTorch above and are built again on JAX")
def test_a_parameter_budget_trains_gpt2_to_its_size_and_the_decoders_lose_neurons_exactly(rng):
    """A language-model head on GPT-2, group penalties, Proximal(Adam) and a parameter budget: the decoders' neurons
    go during training, and the pruned model is exact against the thresholded one."""
    from keras_group_lasso import Proximal, SparsityBudget, sparsity_report

    keras.utils.set_random_seed(0)
    tokens = keras.Input((None,), dtype="int32", name="token_ids")
    mask = keras.Input((None,), dtype="int32", name="padding_mask")
    hidden = _gpt2()({"token_ids": tokens, "padding_mask": mask})
    model = keras.Model({"token_ids": tokens, "padding_mask": mask}, keras.layers.Dense(50, name="head")(hidden))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the heads stay whole: said, tested above
        sparse = add_group_sparsity(model, 1e-3)
    ids = rng.integers(1, 50, size=(256, 10)).astype("int32")
    x = {"token_ids": ids, "padding_mask": np.ones_like(ids)}
    sparse.compile(optimizer=Proximal(keras.optimizers.Adam(1e-2)),
                   loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    sparse.fit(x, np.roll(ids, -1, axis=1), epochs=4, batch_size=32, verbose=0,
               callbacks=[SparsityBudget(max_params=0.9)])
    report = sparsity_report(sparse, T)
    assert 0.72 <= report.params_after / report.params_before <= 0.9
    small = prune_model(sparse, T)
    decoders = [layer for layer in small.layers if type(layer).__name__ == "TransformerDecoder"]
    assert len(decoders) == 2 and all(layer.intermediate_dim < 12 for layer in decoders)
    apply_threshold(sparse, T)
    want = keras.ops.convert_to_numpy(sparse(x))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(small(x)), want, rtol=0,
                               atol=1e-5 * max(1.0, float(np.max(np.abs(want)))))


# A ViT's patches and positions come from one layer with weights and math of its own (a patch convolution, the class
# token, the position table): it is kept whole (its image channels and the stream it makes stay); the encoder blocks
# (ViTEncoderBlock inside ViTEncoder) are traced into the graph, their heads and MLP neurons pruned. KerasHub 0.32's
# ViTPatchingAndEmbedding writes a config it cannot load (`num_patches`); the package's copies write one that loads.
def _vit():
    return M.ViTBackbone(image_shape=(16, 16, 3), patch_size=4, num_layers=2, num_heads=2, hidden_dim=16, mlp_dim=32)


VISION = {
    "ViT": _vit,
    "ViTImageClassifier": lambda: M.ViTImageClassifier(backbone=_vit(), num_classes=5, preprocessor=None),
}


def _penalised_blocks(model, encoder, mlp):
    """``(penalised copy, penalised paths)``: ``add_group_sparsity`` says nothing of a vision Transformer and
    penalises each of its two blocks' heads (the output projection's rows) and MLP neurons."""
    sparse, said = _bare_kernel_warnings(model)
    assert said == []
    penalised = {v.path for v in sparse.trainable_weights if v.regularizer is not None}
    for block in (1, 2):
        assert {f"{encoder}/transformer_block_{block}/mha/attention_output/kernel",
                f"{encoder}/transformer_block_{block}/{mlp}/kernel"} <= penalised
    return sparse, penalised


@pytest.mark.parametrize("family", [
    pytest.param("ViT", marks=on_tensorflow("20-30 s on JAX; the ViT classifier, DeiT and a ViT budget on PyTorch")),
    pytest.param("ViTImageClassifier", marks=on_torch("the ViT inside it on TensorFlow"))])
def test_a_keras_hub_vision_transformer_prunes_heads_and_neurons_exactly(family, rng, tmp_path):
    from test_traced_blocks import sparsify as sparsify_blocks

    model = VISION[family]()
    sparse, penalised = _penalised_blocks(model, "vit_encoder", "mlp/dense_1")
    sparse.save(tmp_path / "sparse.keras")  # the penalised copy saves and loads, every penalty with it
    again = keras.saving.load_model(tmp_path / "sparse.keras")
    assert {v.path for v in again.trainable_weights if v.regularizer is not None} == penalised
    sparsify_blocks(model, rng)
    x = rng.normal(size=(3, 16, 16, 3)).astype("float32")
    small = assert_prunes_exactly_and_reloads(model, x, tmp_path)
    report = small.pruning_report
    assert report.uninterpreted_layers == () and report.params_after < report.params_before
    # the penalised copy pruned too (a copy of a copy of ViTPatchingAndEmbedding): it saves a config that loads
    sparsify_blocks(again, rng)
    assert_prunes_exactly_and_reloads(again, x, tmp_path)


@on_torch("ViT prunes on TensorFlow above; a Backbone built again is tested on JAX with GPT-2")
def test_a_vit_whose_blocks_lose_as_many_neurons_is_a_vit_backbone_again(rng, tmp_path):
    model = _vit()
    _kill_columns(model, "mlp/dense_1/kernel", rng.permutation(32)[:9])  # each block: 9 MLP neurons; heads all stay
    x = rng.normal(size=(3, 16, 16, 3)).astype("float32")
    small = assert_prunes_exactly_and_reloads(model, x, tmp_path)
    assert type(small) is M.ViTBackbone and small.rebuilt_model and small.mlp_dim == 23
    assert small.rebuilt_blocks["vit_encoder"].changed == {"mlp_dim": (32, 23)}


@on_torch("a Task again on PyTorch with the other Tasks; ViT prunes on TensorFlow above")
def test_a_tasks_preprocessor_stays_with_its_penalised_copy_and_comes_back_with_the_task_pruned_uniformly(rng):
    """A ViTImageClassifier with an image preprocessor (resizing and scaling raw images): the penalised copy keeps
    the preprocessor, says that it does not apply it, and the model pruned with ``blocks="uniform"`` is a
    ViTImageClassifier with it again, predicting on raw images what the thresholded copy gives their preprocessed
    form."""
    converter = keras_hub.layers.ViTImageConverter(image_size=(16, 16), scale=1 / 255.0)
    preprocessor = M.ViTImageClassifierPreprocessor(image_converter=converter)
    task = M.ViTImageClassifier(backbone=_vit(), num_classes=5, preprocessor=preprocessor)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sparse = add_group_sparsity(task, 1e-3)
    told = [str(w.message) for w in caught if str(w.message).startswith("add_group_sparsity")]
    assert len(told) == 1 and "does not apply it" in told[0] and "ViTImageClassifierPreprocessor" in told[0]
    assert sparse.preprocessor is preprocessor
    _kill_columns(sparse, "mlp/dense_1/kernel", rng.permutation(32)[:9])
    small = prune_model(sparse, 1e-3, blocks="uniform")
    assert type(small) is M.ViTImageClassifier and small.preprocessor is preprocessor
    raw = rng.integers(0, 256, size=(3, 20, 20, 3)).astype("float32")  # resized to 16 x 16 by the preprocessor
    apply_threshold(sparse, 1e-3)
    expected = keras.ops.convert_to_numpy(sparse(preprocessor(raw)))
    np.testing.assert_allclose(small.predict(raw, verbose=0), expected, rtol=0, atol=1e-5)
    assert GroupSparseModel(sparse.inputs, sparse.outputs).preprocessor is None  # only a Task's copy has one
    # not saved with the copy: without it the Task comes back without one, and says so; given back, it is kept
    count = len(sparse.weights)
    sparse.preprocessor = None
    with pytest.warns(UserWarning, match="built again without the preprocessor its config names"):
        again = prune_model(sparse, 1e-3, blocks="uniform")
    assert type(again) is M.ViTImageClassifier and again.preprocessor is None
    sparse.preprocessor = preprocessor
    assert prune_model(sparse, 1e-3, blocks="uniform").preprocessor is preprocessor
    assert preprocessor not in sparse.layers and len(sparse.weights) == count  # never tracked as a layer
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        again = add_group_sparsity(sparse, 1e-4)  # a penalised copy penalised again keeps it too
    assert again.preprocessor is preprocessor and type(prune_model(again, 1e-3, blocks="uniform")) is type(small)
    with pytest.raises(InvalidParameterError, match=r"GroupSparseModel: argument `preprocessor` must be a "
                                                    r"preprocessor layer \(a KerasHub Task's\) or None; received 'x'"):
        sparse.preprocessor = "x"


# DeiT: its patches, class and distillation tokens and positions come from one layer kept whole (DeiTEmbeddings);
# its encoder blocks return ``(y, None)`` (no attention scores), which Keras records no node for: the trace records
# the tensor and gives the block's call its ``None`` back. KerasHub 0.32's DeiTEncoderBlock writes a ``key_dim`` its
# constructor refuses (it derives it): the block is made again without it.
def _deit():
    return M.DeiTBackbone(image_shape=(16, 16, 3), patch_size=4, num_layers=2, num_heads=2, hidden_dim=16,
                          intermediate_dim=32)


@on_torch("ViT's traced encoder prunes on TensorFlow above; traced blocks on every backend: test_traced_blocks.py")
def test_deit_prunes_heads_and_neurons_exactly_and_a_deit_whose_blocks_lose_as_many_neurons_is_a_deit_again(
        rng, tmp_path):
    from test_traced_blocks import sparsify as sparsify_blocks

    model = M.DeiTImageClassifier(backbone=_deit(), num_classes=5, preprocessor=None)
    _penalised_blocks(model, "deit_encoder", "mlp/dense")
    sparsify_blocks(model, rng)
    x = rng.normal(size=(3, 16, 16, 3)).astype("float32")
    small = assert_prunes_exactly_and_reloads(model, x, tmp_path)
    assert small.pruning_report.uninterpreted_layers == ()
    # Every block loses the same MLP neurons, the heads all stay: a DeiTBackbone of the same class, from its config.
    backbone = _deit()
    _kill_columns(backbone, "mlp/dense/kernel", rng.permutation(32)[:9])
    small = assert_prunes_exactly_and_reloads(backbone, x, tmp_path)
    assert type(small) is M.DeiTBackbone and small.rebuilt_model and small.intermediate_dim == 23


@on_torch("ViT prunes on TensorFlow above; FLOP budgets on plain models everywhere")
def test_a_flop_budget_trains_a_vit_classifier_to_its_size_and_prunes_it_exactly(rng):
    """``ViTImageClassifier``, group penalties, Proximal(Adam) and ``SparsityBudget(max_flops=0.6)``: heads or MLP
    neurons go during training, the FLOPs land within the budget, and the pruned model is exact."""
    from keras_group_lasso import Proximal, SparsityBudget, sparsity_report

    keras.utils.set_random_seed(0)
    sparse = add_group_sparsity(VISION["ViTImageClassifier"](), 1e-3)
    x = rng.normal(size=(128, 16, 16, 3)).astype("float32")
    y = (x[:, :8].mean(axis=(1, 2, 3)) > x[:, 8:].mean(axis=(1, 2, 3))).astype("int32")  # top half brighter
    sparse.compile(optimizer=Proximal(keras.optimizers.Adam(1e-2)),
                   loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    sparse.fit(x, y, epochs=4, batch_size=32, verbose=0, callbacks=[SparsityBudget(max_flops=0.6)])
    report = sparsity_report(sparse, T)
    assert 0.48 <= report.flops_after / report.flops_before <= 0.6
    small = prune_model(sparse, T)
    assert small.count_params() < sparse.count_params()
    apply_threshold(sparse, T)
    want = keras.ops.convert_to_numpy(sparse(x))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(small(x)), want, rtol=0,
                               atol=1e-5 * max(1.0, float(np.max(np.abs(want)))))


# Gemma's decoder blocks use grouped-query attention (4 query heads reading 2 key-value heads here, rotary
# embeddings, a head size of its own) and a gated feed-forward, gelu(gate(x)) * up(x): a query head goes with its
# slice of the output projection, a key-value head with the last query head that reads it, a neuron from the gate,
# the up and the down projections together. The blocks are traced at probe sizes (their causal mask) and built
# again as GemmaDecoderBlock with the heads and neurons they kept.
def _gemma():
    return M.GemmaBackbone(vocabulary_size=50, num_layers=2, num_query_heads=4, num_key_value_heads=2, hidden_dim=16,
                           intermediate_dim=48, head_dim=8)


def _kill_gemma(model, block, heads, neurons):
    """Zero the output projection of query ``heads`` and the down-projection rows of feed-forward ``neurons``."""
    layer = model.get_layer(f"decoder_block_{block}")
    for variable, dead in ((layer.attention.output_dense.kernel, heads), (layer.ffw_linear.kernel, neurons)):
        values = keras.ops.convert_to_numpy(variable).copy()
        values[list(dead)] = 0.0
        variable.assign(values)


@on_tensorflow("Gemma's tied logits and Task on PyTorch below; a Gemma pruned on JAX: tests/test_distribution.py")
def test_gemma_loses_query_heads_key_value_heads_and_neurons_exactly_and_stays_gemma_decoders(rng, tmp_path):
    from test_model_families import assert_same_outputs

    model = _gemma()
    sparse, said = _bare_kernel_warnings(model)
    assert said == []  # every head and neuron is penalised: nothing kept whole
    penalised = {v.path for v in sparse.trainable_weights if v.regularizer is not None}
    assert {f"decoder_block_{i}/{part}/kernel" for i in (0, 1)
            for part in ("attention/attention_output", "ffw_gating", "ffw_gating_2", "ffw_linear")} <= penalised
    # block 0: query head 1 dead, but its group keeps as many query heads as the other one (2); block 1: query heads
    # 0 and 1 (the whole first group, so its key-value head too) and 3 dead: one query head on one key-value head
    _kill_gemma(model, 0, [1], [0, 3, 5, 7])
    _kill_gemma(model, 1, [0, 1, 3], [2, 3, 4])
    small = assert_prunes_exactly_and_reloads(model, _token_batch(model, rng), tmp_path)
    assert_same_outputs(small, model, _token_batch(model, rng, length=5), 1e-5)  # the causal mask at any length
    assert not isinstance(small, M.GemmaBackbone) and not small.rebuilt_model
    changed = {call: found.changed for call, found in small.rebuilt_blocks.items()}
    assert changed == {"decoder_block_0": {"intermediate_dim": (48, 40)},
                       "decoder_block_1": {"intermediate_dim": (48, 42), "num_query_heads": (4, 1),
                                           "num_key_value_heads": (2, 1)}}
    for call in changed:
        assert type(small.get_layer(call)).__name__ == "GemmaDecoderBlock"
    report = small.pruning_report
    assert report.uninterpreted_layers == () and report.params_after < report.params_before
    if keras.backend.backend() != "jax":  # a fresh JAX process costs the suite 10 s; loaded so on the other two
        assert_loads_without_this_package({"gemma": (small, _token_batch(model, rng))}, tmp_path)


@pytest.mark.skipif(keras.backend.backend() == "jax", reason="compiles slowly on JAX; Gemma's blocks prune "
                                                             "there above")
def test_a_gemma_whose_blocks_keep_as_many_heads_and_neurons_is_a_gemma_backbone_again_and_generates(rng, tmp_path):
    model = _gemma()
    for block in (0, 1):  # the second key-value group and 3 neurons go from each block
        _kill_gemma(model, block, [2, 3], [1, 4, 7])
    small = assert_prunes_exactly_and_reloads(model, _token_batch(model, rng), tmp_path)
    assert type(small) is M.GemmaBackbone and small.rebuilt_model
    assert (small.num_query_heads, small.num_key_value_heads, small.intermediate_dim, small.head_dim) == (2, 1, 42, 8)
    lm = M.GemmaCausalLM(backbone=small, preprocessor=None)
    prompt = {"token_ids": np.array([[5, 6, 7, 0, 0, 0]], "int32"),
              "padding_mask": np.array([[1, 1, 1, 0, 0, 0]], "int32")}
    tokens = keras.ops.convert_to_numpy(lm.generate(prompt, stop_token_ids=None)["token_ids"])
    assert tokens.shape == (1, 6) and tokens[0, :3].tolist() == [5, 6, 7] and (tokens < 50).all()


@on_torch("Gemma's blocks prune on TensorFlow above")
def test_a_gemma_causal_lm_prunes_exactly_with_its_tied_logits_and_is_a_gemma_causal_lm_again(rng, tmp_path):
    """``GemmaCausalLM``: the logits are the token table again (``ReversibleEmbedding`` called with
    ``reverse=True``), kept whole, so the table keeps its columns; heads and neurons go from the blocks. Blocks that
    keep different widths: a functional model, exact; the same widths: a ``GemmaCausalLM`` again, whose ``generate``
    gives what the thresholded original's gives."""
    lm = M.GemmaCausalLM(backbone=_gemma(), preprocessor=None)
    sparse, said = _bare_kernel_warnings(lm)
    assert said == []
    assert {f"decoder_block_{i}/attention/attention_output/kernel" for i in (0, 1)} <= {
        v.path for v in sparse.trainable_weights if v.regularizer is not None}
    for block in (0, 1):
        _kill_gemma(lm.backbone, block, [2, 3], [1, 4, 7])
    small = assert_prunes_exactly_and_reloads(lm, _token_batch(lm, rng), tmp_path)
    assert type(small) is M.GemmaCausalLM and small.rebuilt_model
    assert (small.backbone.num_query_heads, small.backbone.intermediate_dim) == (2, 42)
    prompt = {"token_ids": np.array([[5, 6, 7, 0, 0, 0]], "int32"),
              "padding_mask": np.array([[1, 1, 1, 0, 0, 0]], "int32")}
    apply_threshold(lm, T)
    want = keras.ops.convert_to_numpy(lm.generate(prompt, stop_token_ids=None)["token_ids"])
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(small.generate(prompt, stop_token_ids=None)["token_ids"]),
                                  want)
    _kill_gemma(lm.backbone, 0, [0], [])  # block 0 keeps 3 query heads (2 per group), block 1 keeps 2: different
    small = assert_prunes_exactly_and_reloads(lm, _token_batch(lm, rng), tmp_path)
    assert not isinstance(small, M.GemmaCausalLM) and not small.rebuilt_model
    assert small.output.shape[-1] == 50  # the logits: one per token of the vocabulary


@on_torch("Gemma prunes on TensorFlow above; FLOP budgets on plain models everywhere")
def test_a_flop_budget_per_token_trains_a_gemma_causal_lm_to_its_size_and_prunes_it_exactly(rng):
    """``SparsityBudget(max_flops=0.6)`` on a ``GemmaCausalLM`` (sequences of any length: its FLOPs are counted per
    token), group penalties and Proximal(Adam): heads or neurons go during training, the FLOPs land within the
    budget, and the pruned model is exact against the thresholded one."""
    from keras_group_lasso import Proximal, SparsityBudget, sparsity_report

    keras.utils.set_random_seed(0)
    sparse = add_group_sparsity(M.GemmaCausalLM(backbone=_gemma(), preprocessor=None), 1e-3)
    ids = rng.integers(1, 50, size=(256, 10)).astype("int32")
    ids[:, 1::2] = (ids[:, ::2] * 7) % 50  # every other token follows from the one before
    x = {"token_ids": ids, "padding_mask": np.ones_like(ids)}
    sparse.compile(optimizer=Proximal(keras.optimizers.Adam(1e-2)),
                   loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    sparse.fit(x, np.roll(ids, -1, axis=1), epochs=4, batch_size=32, verbose=0,
               callbacks=[SparsityBudget(max_flops=0.6)])
    report = sparsity_report(sparse, T)
    assert report.flops_per_position and 0.48 <= report.flops_after / report.flops_before <= 0.6
    small = prune_model(sparse, T)
    assert small.count_params() < sparse.count_params()
    apply_threshold(sparse, T)
    want = keras.ops.convert_to_numpy(sparse(x))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(small(x)), want, rtol=0,
                               atol=1e-5 * max(1.0, float(np.max(np.abs(want)))))


@pytest.mark.skipif(keras.backend.backend() == "jax", reason="10 s on JAX, the suite's longest leg; the graph is "
                                                             "one for every backend")
def test_a_cut_takes_query_heads_key_value_group_by_group_and_with_uniform_blocks_block_by_block():
    """The kernels whose groups a budget's cut takes by rank together: a grouped-query attention's query heads, one
    member per key-value group (its class gives every group as many); with ``uniform_blocks`` the same place of both
    decoder blocks too (the query heads of every group of every block, each feed-forward kernel)."""
    from keras_group_lasso.budget.measure import kernel_families

    graph = model_graph(add_group_sparsity(M.GemmaCausalLM(backbone=_gemma(), preprocessor=None), 1e-3))
    heads = "decoder_block_{}/attention/attention_output/kernel"
    assert kernel_families(graph, uniform=False) == [
        ((heads.format(block), (0, 1)), (heads.format(block), (2, 3))) for block in (0, 1)]
    uniform = kernel_families(graph)
    assert tuple((heads.format(block), rows) for block in (0, 1) for rows in ((0, 1), (2, 3))) in uniform
    for kernel in ("ffw_gating", "ffw_gating_2", "ffw_linear"):
        assert (f"decoder_block_0/{kernel}/kernel", f"decoder_block_1/{kernel}/kernel") in uniform
    assert len(uniform) == 4


@on_torch("Gemma prunes on TensorFlow above; uniform-block budgets on traced blocks everywhere")
def test_a_budget_with_uniform_blocks_trains_a_gemma_causal_lm_into_a_gemma_causal_lm_within_its_size(rng):
    """``SparsityBudget(max_flops=0.6, uniform_blocks=True)`` counts the sizes ``prune_model(blocks="uniform")``
    builds and cuts the heads and neurons at the same place of the two decoder blocks by rank together: the result
    is a ``GemmaCausalLM`` again, within the budget, exact against the thresholded copy."""
    from keras_group_lasso.analysis import analyze

    ids = rng.integers(1, 50, size=(256, 10)).astype("int32")
    ids[:, 1::2] = (ids[:, ::2] * 7) % 50  # every other token follows from the one before
    x = {"token_ids": ids, "padding_mask": np.ones_like(ids)}
    sparse = _trained_in_uniform_budget(lambda: M.GemmaCausalLM(backbone=_gemma(), preprocessor=None), 1e-3, x,
                                        np.roll(ids, -1, axis=1))
    report = analyze(sparse, T, uniform=True).report
    assert 0.3 <= report.flops_after / report.flops_before <= 0.6
    small = prune_model(sparse, T, blocks="uniform")
    assert type(small) is M.GemmaCausalLM and small.rebuilt_model
    assert small.pruning_report.flops_after == report.flops_after
    assert small.backbone.intermediate_dim < 48 or small.backbone.num_query_heads < 4
    apply_threshold(sparse, T)
    x = _token_batch(sparse, rng)
    want = keras.ops.convert_to_numpy(sparse(x))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(small(x)), want, rtol=0,
                               atol=1e-5 * max(1.0, float(np.max(np.abs(want)))))


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="tested on torch (Gemma's rule, tested everywhere)")
def test_gemma3_loses_heads_and_neurons_exactly_with_its_query_and_key_norms(rng, tmp_path):
    """Gemma3's attention normalizes each head's queries and keys (one scale over the head size, shared by the
    heads): heads go as Gemma's do and the norms stay as they are."""
    model = M.Gemma3Backbone(vocabulary_size=50, image_size=16, num_layers=2, num_query_heads=4, num_key_value_heads=2,
                             hidden_dim=16, intermediate_dim=48, head_dim=8)
    sparse, said = _bare_kernel_warnings(model)
    assert said == []
    _kill_gemma(model, 0, [1], [0, 3])
    _kill_gemma(model, 1, [0, 1, 3], [2, 4])
    small = assert_prunes_exactly_and_reloads(model, _token_batch(model, rng), tmp_path)
    assert {call: found.changed for call, found in small.rebuilt_blocks.items()} == {
        "decoder_block_0": {"intermediate_dim": (48, 46)},
        "decoder_block_1": {"intermediate_dim": (48, 46), "num_query_heads": (4, 1), "num_key_value_heads": (2, 1)}}
    assert_loads_without_this_package({"gemma3": (small, _token_batch(model, rng))}, tmp_path)


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="tested on PyTorch (Gemma's rule, tested "
                                                                  "everywhere)")
def test_qwen3_loses_grouped_query_heads_and_neurons_exactly_with_its_sliding_window(rng, tmp_path):
    """Qwen3's attention has a head size of its own (``head_dim``), per-head query and key norms and a sliding
    window: its heads go as Gemma's do; keras-hub 0.32's decoder config forgets ``head_dim`` (read from the layer)."""
    model = M.Qwen3Backbone(vocabulary_size=50, num_layers=2, num_query_heads=4, num_key_value_heads=2, hidden_dim=16,
                            intermediate_dim=32, head_dim=8, sliding_window_size=4)
    sparse, said = _bare_kernel_warnings(model)
    assert said == []
    for block, heads, neurons in ((0, [1], [0, 3]), (1, [0, 1, 3], [2, 4, 5])):
        layer = model.get_layer(f"transformer_layer_{block}")
        for variable, dead in ((layer._self_attention_layer._output_dense.kernel, heads),
                               (layer._feedforward_output_dense.kernel, neurons)):
            values = keras.ops.convert_to_numpy(variable).copy()
            values[dead] = 0.0
            variable.assign(values)
    small = assert_prunes_exactly_and_reloads(model, _token_batch(model, rng), tmp_path)
    assert {call: found.changed for call, found in small.rebuilt_blocks.items()} == {
        "transformer_layer_0": {"intermediate_dim": (32, 30)},
        "transformer_layer_1": {"intermediate_dim": (32, 29), "num_query_heads": (4, 1), "num_key_value_heads": (2, 1)}}
    assert_loads_without_this_package({"qwen3": (small, _token_batch(model, rng))}, tmp_path)


def test_attention_in_a_decoder_of_fixed_length_is_counted_at_that_length():
    """A decoder traced at probe sizes only for its batch axis (its input has a fixed length of 16): its
    attention's multiply-adds are counted at the 16 positions, as its Dense layers are."""
    from keras_group_lasso import sparsity_report

    inputs = keras.Input((16, 8))
    hidden = keras_hub.layers.TransformerDecoder(intermediate_dim=12, num_heads=2)(inputs)
    model = keras.Model(inputs, keras.layers.Dense(3)(hidden))
    layers = {layer.kind: layer for layer in sparsity_report(model, T).layers}
    attention = layers["CachedMultiHeadAttention"]
    # T * in * H * (2 kd + vd) + T^2 * H * (kd + vd) + T * H * vd * out, with T 16, in and out 8, H 2, kd = vd = 4
    assert attention.flops_before == 16 * 8 * 2 * 12 + 256 * 2 * 8 + 16 * 2 * 4 * 8
    assert not attention.flops_per_position


def _kill_in(model, block, heads, neurons):
    """As :func:`_kill_gemma`, on any model holding Gemma's blocks (a penalised copy too), by weight path."""
    for suffix, dead in (("attention/attention_output/kernel", heads), ("ffw_linear/kernel", neurons)):
        variable = next(v for v in model.weights if v.path == f"decoder_block_{block}/{suffix}")
        values = keras.ops.convert_to_numpy(variable).copy()
        values[list(dead)] = 0.0
        variable.assign(values)


@pytest.mark.skipif(keras.backend.backend() == "jax", reason="compiles slowly on JAX; Gemma's blocks prune "
                                                             "there above")
@pytest.mark.quick
def test_the_penalised_copy_of_a_gemma_causal_lm_prunes_into_a_gemma_causal_lm_with_uniform_blocks(rng):
    """``add_group_sparsity`` copies a ``GemmaCausalLM`` into a functional model that remembers the class it copied
    (``source_model``, in its config). Its blocks lose different heads and neurons: ``prune_model`` gives a
    functional model of decoder blocks; ``blocks="uniform"`` keeps dead heads and neurons in the narrower blocks
    (one key-value group of two query heads in block 0 and two groups of one in block 1 make two groups of two
    in both), exactly, so that the result is a ``GemmaCausalLM`` again, which generates what the thresholded
    copy computes."""
    # Gemma 2's layout: every other block attends over a sliding window (same widths, another config)
    backbone = M.GemmaBackbone(vocabulary_size=50, num_layers=2, num_query_heads=4, num_key_value_heads=2,
                               hidden_dim=16, intermediate_dim=48, head_dim=8, use_sliding_window_attention=True,
                               sliding_window_size=4)
    sparse = add_group_sparsity(M.GemmaCausalLM(backbone=backbone, preprocessor=None), 1e-3)
    assert sparse.source_model["class_name"] == "GemmaCausalLM"
    assert type(sparse).from_config(sparse.get_config()).source_model == sparse.source_model
    _kill_in(sparse, 0, [2, 3], [0, 3, 5, 7])
    _kill_in(sparse, 1, [1, 3], [2, 3, 4])
    x = _token_batch(sparse, rng)
    plain = prune_model(sparse, T)
    assert not isinstance(plain, M.GemmaCausalLM)
    small = prune_model(sparse, T, blocks="uniform")
    assert type(small) is M.GemmaCausalLM and small.rebuilt_model
    assert (small.backbone.num_query_heads, small.backbone.num_key_value_heads, small.backbone.intermediate_dim) == (
        4, 2, 42)
    assert plain.pruning_report.flops_after < small.pruning_report.flops_after < plain.pruning_report.flops_before
    apply_threshold(sparse, T)
    want = keras.ops.convert_to_numpy(sparse(x))
    for got in (plain(x), small(x)):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(got), want, rtol=0,
                                   atol=1e-5 * max(1.0, float(np.max(np.abs(want)))))
    prompt = {"token_ids": np.array([[5, 6, 7, 0, 0, 0]], "int32"),
              "padding_mask": np.array([[1, 1, 1, 0, 0, 0]], "int32")}
    tokens = keras.ops.convert_to_numpy(small.generate(prompt, stop_token_ids=None)["token_ids"])
    assert tokens.shape == (1, 6) and tokens[0, :3].tolist() == [5, 6, 7]
    # greedy: the first generated token is the argmax of the thresholded copy's logits after the prompt
    logits = keras.ops.convert_to_numpy(sparse(prompt))[0, 2]
    assert tokens[0, 3] == int(np.argmax(logits))
