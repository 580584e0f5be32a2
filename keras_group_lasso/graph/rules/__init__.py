"""The rule of each layer class, one module per family; :mod:`keras_group_lasso.graph.registry` is their table.

* :mod:`.base`: :class:`~.base.LayerRule` (a layer's kind, its refusal, how a constant passes it, how surgery
  slices it) and the helpers every family reads;
* :mod:`.units`: layers that make units (Dense, EinsumDense, convolutions, embeddings, a user's declared units
  layer) and depthwise convolutions;
* :mod:`.recurrent`: SimpleRNN, GRU, LSTM, Bidirectional; :mod:`.attention`: MultiHeadAttention;
* :mod:`.channels`: layers that act on each channel on its own, input preprocessing, normalizations (tails);
* :mod:`.shape`: constants, channel slices, Flatten, Reshape, global pooling, padding and position slices;
* :mod:`.merge`: element-by-element merges and Concatenate;
* :mod:`.operations`: keras.ops operations of a functional graph as layers the rules know;
* :mod:`.recognized`: layers of other classes recognized by what they compute.
"""
