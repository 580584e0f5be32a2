"""Attention masks given as tensors: computed again in the pruned model, never read as units.

A ``MultiHeadAttention`` called with ``attention_mask=`` (a padding mask turned into one by keras.ops calls, in a
block's ``call`` as KerasHub's encoders do, or in the functional graph) reads a tensor that carries no units: the
graph keeps it aside (``ModelGraph.side_tensors``) as the keras.ops calls that compute it from the model's inputs,
and the pruned model makes those calls again on its own inputs. A mask computed from a layer's output is refused
by name.
"""

import keras
import numpy as np
import pytest
from test_model_families import T, assert_prunes_exactly_and_reloads
from test_traced_blocks import penalty_warnings, sparsify

from keras_group_lasso import UnsupportedModelError, prune_model, sparsity_report
from keras_group_lasso.graph.build import model_graph

L = keras.layers
ops = keras.ops


@keras.saving.register_keras_serializable("test_attention_masks")  # a pruned model may hold it again
class PaddedEncoder(L.Layer):
    """An encoder block called ``block(x, padding_mask)``: a position attends only to the positions the mask
    keeps (``attention_mask = padding_mask[:, None, :]``), as KerasHub's TransformerEncoder does."""

    def __init__(self, dim, heads, hidden, **kwargs):
        super().__init__(**kwargs)
        self.dim, self.heads, self.hidden = dim, heads, hidden
        self.att = L.MultiHeadAttention(heads, dim // heads, name="att")
        self.up = L.Dense(hidden, activation="relu", name="up")
        self.down = L.Dense(dim, name="down")
        self.norm1 = L.LayerNormalization(name="norm1")
        self.norm2 = L.LayerNormalization(name="norm2")

    def call(self, x, padding_mask):
        attention_mask = ops.cast(ops.expand_dims(padding_mask, axis=1), "bool")
        x = self.norm1(x + self.att(query=x, value=x, attention_mask=attention_mask))
        return self.norm2(x + self.down(self.up(x)))

    def get_config(self):
        return dict(super().get_config(), dim=self.dim, heads=self.heads, hidden=self.hidden)


def padded_model(length=7):
    tokens = keras.Input((length,), dtype="int32", name="tokens")
    mask = keras.Input((length,), dtype="int32", name="padding_mask")
    x = L.Embedding(30, 16, name="embed")(tokens)
    x = PaddedEncoder(16, 4, 24, name="enc0")(x, mask)
    x = PaddedEncoder(16, 4, 20, name="enc1")(x, padding_mask=mask)
    return keras.Model({"tokens": tokens, "padding_mask": mask}, L.Dense(3, name="out")(x))


def batch(rng, length=7):
    keep = np.array([length, length - 3, 2, 1])
    mask = (np.arange(length)[None, :] < keep[:, None]).astype("int32")
    return {"tokens": rng.integers(1, 30, size=(4, length)).astype("int32"), "padding_mask": mask}


@pytest.mark.quick
def test_a_padding_mask_given_to_encoder_blocks_is_computed_again_in_the_pruned_model(rng, tmp_path):
    model = padded_model()
    graph = model_graph(model)
    assert graph.supported and graph.problems == ()
    assert set(graph.side_tensors) == {"enc0/att", "enc1/att"}
    assert graph.side_inputs() == ("padding_mask",)
    sparse, said = penalty_warnings(model)
    assert said == []
    assert all(v.regularizer is not None for v in sparse.trainable_weights if "/up/" in v.path or "/down/" in v.path)
    sparsify(model, rng)
    x = batch(rng)
    small = assert_prunes_exactly_and_reloads(model, x, tmp_path)
    assert small.count_params() < model.count_params()
    # the pruned model masks as the original does: tokens the mask leaves out change nothing
    y = dict(x, tokens=np.where(x["padding_mask"] == 1, x["tokens"], 29 - x["tokens"]).astype("int32"))
    kept = x["padding_mask"][..., None] == 1
    for m in (model, small):
        a, b = (keras.ops.convert_to_numpy(m(v)) for v in (x, y))
        np.testing.assert_allclose(np.where(kept, a, 0), np.where(kept, b, 0), rtol=1e-5, atol=1e-5)
    report = sparsity_report(model, T)
    found = {entry.name: entry for entry in report.inputs}
    assert found["padding_mask"].mask and found["padding_mask"].kept
    assert "input padding_mask: read as a mask" in str(report)
    # a model that takes only the selected inputs still takes the mask, whole
    selected = prune_model(model, T, inputs="selected")
    assert "padding_mask" in selected.kept_inputs
    assert tuple(selected.input["padding_mask"].shape) == (None, 7)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(selected(x)), keras.ops.convert_to_numpy(small(x)),
                               rtol=0, atol=1e-6)


def test_an_attention_mask_that_is_a_model_input_goes_straight_to_the_pruned_layer(rng, tmp_path):
    inputs = keras.Input((5, 6), name="x")
    allowed = keras.Input((5, 5), dtype="bool", name="allowed")
    h = L.Dense(8, activation="relu", name="first")(inputs)
    a = L.MultiHeadAttention(3, 4, name="att")(h, h, attention_mask=allowed)
    model = keras.Model([inputs, allowed], L.Dense(2, name="out")(L.Add(name="res")([h, a])))
    graph = model_graph(model)
    assert graph.supported and graph.side_inputs() == ("allowed",)
    sparsify(model, rng)
    causal = np.tril(np.ones((5, 5), bool))
    x = [rng.normal(size=(3, 5, 6)).astype("float32"), np.broadcast_to(causal, (3, 5, 5)).copy()]
    assert_prunes_exactly_and_reloads(model, x, tmp_path)


def test_an_attention_mask_computed_from_a_layer_output_is_refused_by_name():
    inputs = keras.Input((5, 6))
    h = L.Dense(8, activation="relu", name="first")(inputs)
    near = ops.greater(ops.matmul(h, ops.transpose(h, (0, 2, 1))), 0.0)  # reads the units: not a side tensor
    a = L.MultiHeadAttention(2, 4, name="att")(h, h, attention_mask=near)
    model = keras.Model(inputs, L.Dense(2, name="out")(a))
    graph = model_graph(model)
    assert not graph.supported
    assert ("att", "MultiHeadAttention", "its attention_mask is computed from the layers' outputs (only keras.ops "
            "calls on the model's inputs are computed again in the pruned model)") in graph.problems
    with pytest.raises(UnsupportedModelError, match=r"^prune_model: cannot prune layer 'att' \(MultiHeadAttention\): "
                                                    r"its attention_mask is computed from the layers' outputs"):
        prune_model(model, T)
