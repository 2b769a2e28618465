"""PyTorch implementations of the course's layers (same names and arguments as ``companion.keras``)."""

from .addnorm import AddNorm, PositionwiseFeedForward
from .attention import scaled_dot_product_attention
from .device import default_device
from .gpt import GPT, GPTBlock, generate
from .grouped import GroupedQueryAttention, repeat_kv
from .masking import causal_mask, combine_masks, padding_mask
from .min_transformer import MinTransformer
from .model import Decoder, DecoderLayer, Encoder, EncoderLayer, Transformer
from .modern import RMSNorm, RotaryEmbedding, SwiGLU, rotate_half, sliding_window_mask
from .modern_decoder import ModernBlock, ModernDecoder
from .multihead import MultiHeadAttention
from .online_softmax import online_softmax_attention
from .positional import PositionalEncoding, sinusoidal_positional_encoding
from .text import TokenEmbedding, check_ids
