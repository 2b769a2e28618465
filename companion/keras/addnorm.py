"""The position-wise feed-forward network and the Add & Norm wrapper in Keras 3."""

from __future__ import annotations

from collections.abc import Callable

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="companion")
class PositionwiseFeedForward(keras.layers.Layer):
    """``FFN(x) = max(0, x W1 + b1) W2 + b2``, the same two-layer network applied at every position.

    It is equivalent to two 1x1 convolutions over the sequence. The hidden layer is wider than the model
    (``d_ff = 2048`` vs ``d_model = 512`` in the paper).

    Args:
        d_model: input and output size.
        d_ff: hidden size.
        dropout: dropout on the hidden activations.
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        self.d_model, self.d_ff = d_model, d_ff
        self.linear1 = keras.layers.Dense(d_ff, name="linear1")
        self.linear2 = keras.layers.Dense(d_model, name="linear2")
        self.dropout = keras.layers.Dropout(dropout)

    def build(self, input_shape):
        self.linear1.build(input_shape)
        self.linear2.build((*input_shape[:-1], self.d_ff))

    def call(self, x, training=None):
        """``(batch, seq_len, d_model)`` -> ``(batch, seq_len, d_model)``."""
        return self.linear2(self.dropout(ops.relu(self.linear1(x)), training=training))

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-1], self.d_model)

    def get_config(self):
        return {**super().get_config(), "d_model": self.d_model, "d_ff": self.d_ff, "dropout": self.dropout.rate}


@keras.saving.register_keras_serializable(package="companion")
class AddNorm(keras.layers.Layer):
    """A residual connection around a sublayer, with layer normalization.

    Post-LN (the paper, ``norm_first=False``): ``LayerNorm(x + Dropout(sublayer(x)))``.
    Pre-LN (``norm_first=True``): ``x + Dropout(sublayer(LayerNorm(x)))``. Pre-LN leaves the residual path
    untouched from input to output, which makes deep stacks easier to train (Xiong et al. 2020 trained them without
    a warm-up in their settings; GPT-3 and Llama still warm up); a pre-LN stack
    needs one final LayerNorm (see ``Encoder``).

    Args:
        d_model: size normalized over.
        dropout: dropout on the sublayer's output, before the addition.
        norm_first: pre-LN instead of post-LN.
        eps: added to the variance inside the square root. Keras defaults to 1e-3; 1e-5 matches torch.
    """

    def __init__(self, d_model: int, dropout: float = 0.0, norm_first: bool = False, eps: float = 1e-5, **kwargs):
        super().__init__(**kwargs)
        self.d_model, self.norm_first, self.eps = d_model, norm_first, eps
        self.norm = keras.layers.LayerNormalization(epsilon=eps, name="norm")
        self.dropout = keras.layers.Dropout(dropout)

    def build(self, input_shape):
        self.norm.build(input_shape)

    def call(self, x, sublayer: Callable, training=None):
        """``x`` ``(batch, seq_len, d_model)`` and a callable of the same shape in and out -> same shape."""
        if self.norm_first:
            return x + self.dropout(sublayer(self.norm(x)), training=training)
        return self.norm(x + self.dropout(sublayer(x), training=training))

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = {"d_model": self.d_model, "dropout": self.dropout.rate, "norm_first": self.norm_first, "eps": self.eps}
        return {**super().get_config(), **config}
