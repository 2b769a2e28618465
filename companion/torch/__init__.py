"""PyTorch implementations of the course's layers (same names and arguments as ``companion.keras``)."""

from .attention import scaled_dot_product_attention
from .device import default_device
from .masking import causal_mask, combine_masks, padding_mask
from .multihead import MultiHeadAttention
from .text import TokenEmbedding, check_ids
