"""Chapter 9's diagram: chapter 8's GPT block (GPT-2 layout) next to a Llama-style block, with computed shapes
(framework-free).

As in :mod:`companion.diagrams`, every shape written on the figure is computed by running the NumPy oracle
(``companion.reference``) on zero arrays of the configured sizes (zero strides, so a large model costs no memory).
"""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from companion import reference
from companion.diagram_shapes import shape_label
from companion.diagrams import FONT, RESIDUAL, _Canvas

__all__ = ["block_comparison", "block_shapes"]


def _zeros(*shape: int) -> np.ndarray:
    return np.broadcast_to(np.zeros(1), shape)


def block_shapes(d_model: int = 512, num_heads: int = 8, num_kv_heads: int = 2, d_ff: int = 1376,
                 batch: int = 2, seq_len: int = 5) -> dict[str, tuple[int, ...]]:
    """Shapes of the two blocks' steps, from the oracle: norms, the cached keys/values, feed-forward hidden layers
    and outputs. The GPT-2 side uses ``4 * d_model`` for its feed-forward width and one key/value head per head."""
    if d_model % num_heads or num_heads % num_kv_heads:
        raise ValueError(f"num_heads must divide d_model and num_kv_heads must divide num_heads; got d_model="
                         f"{d_model}, num_heads={num_heads}, num_kv_heads={num_kv_heads}")
    head_dim = d_model // num_heads
    x = _zeros(batch, seq_len, d_model)

    def attention_params(kv_heads: int) -> dict[str, np.ndarray]:
        return {"wq": _zeros(d_model, d_model), "wk": _zeros(d_model, kv_heads * head_dim),
                "wv": _zeros(d_model, kv_heads * head_dim), "wo": _zeros(d_model, d_model)}

    _, gpt_k, _ = reference.grouped_query_projections(x, attention_params(num_heads), num_heads, num_heads, None)
    q, k, _ = reference.grouped_query_projections(x, attention_params(num_kv_heads), num_heads, num_kv_heads)
    mask = reference.causal_mask(seq_len)
    modern_attention = reference.grouped_query_attention(x, attention_params(num_kv_heads), num_heads, num_kv_heads,
                                                         mask)
    gpt_attention = reference.grouped_query_attention(x, attention_params(num_heads), num_heads, num_heads, mask, None)
    ffn = {"w1": _zeros(d_model, 4 * d_model), "b1": _zeros(4 * d_model), "w2": _zeros(4 * d_model, d_model),
           "b2": _zeros(d_model)}
    swiglu = {"w1": _zeros(d_model, d_ff), "w3": _zeros(d_model, d_ff), "w2": _zeros(d_ff, d_model)}
    return {
        "input": x.shape,
        "layer_norm": reference.layer_norm(x, np.ones(d_model), np.zeros(d_model)).shape,
        "rms_norm": reference.rms_norm(x, np.ones(d_model)).shape,
        "gpt_kv": gpt_k.shape,
        "modern_q": q.shape,
        "modern_kv": k.shape,
        "gpt_attention": gpt_attention.shape,
        "modern_attention": modern_attention.shape,
        "gpt_hidden": (x @ ffn["w1"]).shape,
        "swiglu_hidden": (x @ swiglu["w1"]).shape,
        "gpt_ffn": reference.feed_forward(x, ffn).shape,
        "swiglu": reference.swiglu(x, swiglu).shape,
    }


def block_comparison(d_model: int = 512, num_heads: int = 8, num_kv_heads: int = 2, d_ff: int = 1376,
                     batch: int = 2, seq_len: int = 5) -> Figure:
    """Chapter 8's GPT block (GPT-2's pre-LN layout, with the course's ReLU feed-forward; left) and chapter 9's
    Llama-style block (right), bottom to top, with the shapes of each step, the two residual connections drawn as
    paths that bypass each norm and sublayer, and the key/value cache each block keeps."""
    s = block_shapes(d_model, num_heads, num_kv_heads, d_ff, batch, seq_len)
    x_label = shape_label(s["input"], "batch seq_len d_model")
    c = _Canvas.make(10.4, 6.4, (0, 13), (0, 8.0))
    residual = "+ (residual)"  # both additions carry the same label: each adds the block's running x
    columns = [
        (0.3, "Chapter 8's GPT (GPT-2 layout)", "token + learned position", [
            ("LayerNorm", "norm", shape_label(s["layer_norm"], None)),
            (f"multi-head attention, {num_heads} heads", "attention", shape_label(s["gpt_attention"], None)),
            (residual, "data", x_label),
            ("LayerNorm", "norm", shape_label(s["layer_norm"], None)),
            (f"ReLU feed-forward, hidden {s['gpt_hidden'][-1]}", "ffn", shape_label(s["gpt_ffn"], None)),
            (residual, "data", x_label),
        ], shape_label(s["gpt_kv"], "batch heads seq_len d_head")),
        (6.8, "Llama-style decoder (chapter 9)", "token only (no position vector)", [
            ("RMSNorm", "norm", shape_label(s["rms_norm"], None)),
            (f"grouped-query attention, RoPE on q and k, {num_heads} q / {num_kv_heads} kv heads", "attention",
             shape_label(s["modern_attention"], None)),
            (residual, "data", x_label),
            ("RMSNorm", "norm", shape_label(s["rms_norm"], None)),
            (f"SwiGLU, hidden {s['swiglu_hidden'][-1]}, no biases", "ffn", shape_label(s["swiglu"], None)),
            (residual, "data", x_label),
        ], shape_label(s["modern_kv"], "batch kv_heads seq_len d_head")),
    ]
    box_x, box_w, centre, lane = 0.6, 4.6, 2.9, 0.3  # offsets from the column's left edge
    for x0, title, source, steps, cache in columns:
        c.text(x0, 7.65, title, size=FONT + 1, weight="bold")
        c.box(x0 + box_x, 0.25, box_w, 0.45, source, "embed")
        y, label = 0.7, x_label  # each arrow carries the shape of what the box below it produced
        branch = None  # where the running x leaves the main path for the next addition
        for text, kind, output in steps:
            c.arrow((x0 + centre, y), (x0 + centre, y + 0.45), label)
            if branch is None:
                branch = y + 0.15
            c.box(x0 + box_x, y + 0.45, box_w, 0.5, text, kind, size=FONT - (1 if len(text) > 40 else 0))
            if text == residual:  # the bypass: from the branch point around the norm and sublayer into the "+"
                add_y = y + 0.7
                c.ax.plot([x0 + centre, x0 + lane, x0 + lane], [branch, branch, add_y], color=RESIDUAL,
                          linewidth=1.1)
                c.ax.plot([x0 + centre], [branch], marker="o", markersize=3, color=RESIDUAL)
                c.arrow((x0 + lane, add_y), (x0 + box_x, add_y), colour=RESIDUAL)
                branch = None
            y, label = y + 0.95, output
        c.arrow((x0 + centre, y), (x0 + centre, y + 0.35), label)
        c.text(x0 + box_x, y + 0.5, f"cache per block: k and v, each\n{cache}", size=FONT - 1, color="#1a4f8a",
               family="monospace")
    c.text(0.3, 0.02, "shapes computed by the NumPy oracle; red: the residual path, x added to each sublayer's "
           "output; each block is repeated num_layers times, then a final norm", size=FONT - 1)
    return c.fig
