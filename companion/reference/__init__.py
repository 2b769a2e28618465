"""The NumPy oracle: plain, readable versions of every layer, used to test ``companion.torch`` and ``companion.keras``.

Arrays follow the same shapes and the same mask convention (bool, True = may attend) as the framework code;
weights are passed explicitly as dicts of arrays in the ``x @ w + b`` convention.
"""

from .addnorm import add_norm, feed_forward, layer_norm
from .attention import scaled_dot_product_attention, softmax
from .gpt import gpt_forward, gpt_generate, gpt_parameter_count, gpt_params
from .grouped import grouped_query_attention, grouped_query_projections, kv_cache_bytes
from .masking import causal_mask, combine_masks, padding_mask
from .model import decoder, decoder_layer, encoder, encoder_layer, transformer, transformer_params
from .modern import (
    interleave_permutation,
    rms_norm,
    rotary_embedding,
    rotary_embedding_interleaved,
    rotate_half,
    sliding_window_mask,
    swiglu,
)
from .modern_decoder import (
    modern_decoder_forward,
    modern_decoder_generate,
    modern_decoder_parameter_count,
    modern_decoder_params,
)
from .multihead import multi_head_attention
from .online_softmax import online_softmax_attention
from .positional import sinusoidal_positional_encoding
