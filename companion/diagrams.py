"""Architecture diagrams drawn in code (framework-free: matplotlib and the NumPy oracle).

Every shape written on an arrow is *computed*: the diagram runs the oracle (``companion.reference``) on arrays of the
configured sizes and prints the shapes it gets back, so a diagram cannot disagree with the code. The weights of
those runs are zero arrays with zero strides (``np.broadcast_to``), so even the paper's base model costs no memory.

Each function returns a :class:`matplotlib.figure.Figure` built without ``pyplot``, so a notebook cell that ends
with the call shows the diagram once.

========================  ==========================================================
function                  shows
========================  ==========================================================
:func:`transformer`       the whole encoder-decoder, with shapes and masks
:func:`qkv_dataflow`      one attention: projections, scores, softmax, weighted sum
:func:`heads`             splitting into heads and merging them back
:func:`mask_placement`    which mask goes to which attention, with the masks drawn
:func:`residual_wiring`   Add & Norm wired post-LN (the paper) and pre-LN
:func:`greedy_decoding`   greedy decoding step by step, with a real model's choices
========================  ==========================================================
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch

from companion.diagram_shapes import (
    Config,
    attention_shapes,
    decode_greedily,
    head_shapes,
    mask_shapes,
    model_shapes,
    residual_shapes,
    shape_label,
)

__all__ = ["Config", "transformer", "qkv_dataflow", "heads", "mask_placement", "residual_wiring", "greedy_decoding"]

# Fill colours by kind of block, light enough for black text (figures keep a white background, also in dark mode).
COLOURS = {
    "embed": "#dccff2", "attention": "#f8d9a8", "norm": "#f6f1b4", "ffn": "#c8e3f6", "linear": "#d3ecd1",
    "data": "#eeeeee", "mask": "#f4c7c3",
}
FONT = 8
RESIDUAL = "#c0392b"  # the residual path, in every diagram that draws it


@dataclass
class _Canvas:
    """A figure with one axes in data units (x right, y up), no frame."""

    fig: Figure
    ax: Any

    @classmethod
    def make(cls, width: float, height: float, xlim: tuple[float, float], ylim: tuple[float, float]) -> _Canvas:
        fig = Figure(figsize=(width, height), facecolor="white")
        ax = fig.add_axes((0.0, 0.0, 1.0, 1.0))
        ax.set_xlim(*xlim)
        ax.set_ylim(*ylim)
        ax.axis("off")
        return cls(fig, ax)

    def box(self, x: float, y: float, w: float, h: float, text: str, kind: str = "data", size: int = FONT) -> None:
        """A rounded box with its lower-left corner at ``(x, y)``."""
        self.ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.08",
                                         facecolor=COLOURS[kind], edgecolor="#333333", linewidth=0.8))
        self.ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size, color="black")

    def arrow(self, start: tuple[float, float], end: tuple[float, float], label: str = "", side: str = "right",
              colour: str = "#333333", size: int = FONT - 1) -> None:
        """An arrow from ``start`` to ``end`` with ``label`` beside its middle."""
        self.ax.annotate("", xy=end, xytext=start,
                         arrowprops={"arrowstyle": "-|>", "color": colour, "linewidth": 1.0, "shrinkA": 0,
                                     "shrinkB": 0})
        if label:
            mx, my = (start[0] + end[0]) / 2, (start[1] + end[1]) / 2
            offset = 0.08 if side == "right" else -0.08
            self.ax.text(mx + offset, my, label, ha="left" if side == "right" else "right", va="center", fontsize=size,
                         color="#1a4f8a", family="monospace")

    def text(self, x: float, y: float, text: str, size: int = FONT, **kwargs: Any) -> None:
        kwargs.setdefault("color", "black")
        self.ax.text(x, y, text, fontsize=size, **kwargs)


# ----------------------------------------------------------------------------------------------- whole model


def transformer(config: Config | None = None, model: Any = None, batch: int = 2, src_len: int = 6,
                tgt_len: int = 5) -> Figure:
    """The encoder-decoder of the paper, bottom to top, each arrow labelled with the shape it carries.

    Args:
        config: sizes of the model; default the paper's base model (or ``model``'s sizes when given).
        model: a companion ``Transformer`` (torch or keras) whose sizes to draw instead of ``config``.
        batch, src_len, tgt_len: the example batch whose shapes are printed.
    """
    config = Config.from_model(model) if model is not None else (config or Config())
    s = model_shapes(config, batch, src_len, tgt_len)
    c = _Canvas.make(10.4, 7.4, (0, 13), (0, 9.4))
    small = FONT - 1
    enc_x, dec_x, w = 0.9, 7.6, 4.2
    src_mask = "mask: source padding " + shape_label(s["src_mask"], "batch 1 1 src_len")
    tgt_mask = "mask: padding AND causal " + shape_label(s["tgt_mask"], "batch 1 tgt_len tgt_len")
    columns = [
        (enc_x, "source ids", "src", [("multi-head self-attention\n" + src_mask, "attention"), ("Add & Norm", "norm"),
                                      (f"feed-forward (d_ff = {config.d_ff})", "ffn"), ("Add & Norm", "norm")]),
        (dec_x, "target ids, shifted right: <s> y1 y2 ...", "tgt",
         [("masked multi-head self-attention\n" + tgt_mask, "attention"), ("Add & Norm", "norm"),
          ("cross-attention: queries from the decoder\n" + src_mask, "attention"), ("Add & Norm", "norm"),
          (f"feed-forward (d_ff = {config.d_ff})", "ffn"), ("Add & Norm", "norm")]),
    ]
    tops = {}
    for x, ids_text, side, blocks in columns:
        centre = x + w / 2
        c.box(x, 0.2, w, 0.5, ids_text, "data")
        c.arrow((centre, 0.7), (centre, 1.3), shape_label(s[f"{side}_ids"], f"batch {side}_len"))
        c.box(x, 1.3, w, 0.6, "embedding × √d_model\n+ positional encoding", "embed")
        c.arrow((centre, 1.9), (centre, 2.6), shape_label(s[f"{side}_embedded"], f"batch {side}_len d_model"))
        step = 0.8
        top = 2.6 + len(blocks) * step + 0.1
        c.ax.add_patch(FancyBboxPatch((x - 0.3, 2.6), w + 0.6, top - 2.6, boxstyle="round,pad=0.05",
                                      facecolor="none", edgecolor="#777777", linestyle="--"))
        for i, (text, kind) in enumerate(blocks):
            c.box(x, 2.75 + i * step, w, 0.58, text, kind, size=small)
        # The residual connections: each sublayer's input branches off below it, runs up beside the column (on the
        # encoder's outer left, on the decoder's right, away from the memory's arrow) and enters its Add & Norm.
        lane = x - 0.15 if side == "src" else x + w + 0.15
        edge = x if side == "src" else x + w
        for i, (_, kind) in enumerate(blocks):
            if kind == "norm":
                continue
            branch_y, target_y = 2.75 + i * step - 0.11, 2.75 + (i + 1) * step + 0.29
            c.ax.plot([centre, lane, lane], [branch_y, branch_y, target_y], color=RESIDUAL, linewidth=1.1)
            c.ax.plot([centre], [branch_y], marker="o", markersize=2.5, color=RESIDUAL)
            c.arrow((lane, target_y), (edge, target_y), colour=RESIDUAL)
        c.text(x, top + 0.12, "encoder layer" if side == "src" else "decoder layer", style="italic")
        c.text(x - 0.45 if side == "src" else x + w + 0.45, (2.6 + top) / 2, f"× {config.num_layers}",
               size=FONT + 2, ha="right" if side == "src" else "left", va="center")
        tops[side] = top
    memory_y = tops["src"] + 0.7
    c.arrow((enc_x + w / 2, tops["src"]), (enc_x + w / 2, memory_y), shape_label(s["memory"], "batch src_len d_model"))
    c.box(enc_x, memory_y, w, 0.5, "memory (encoder output)", "data")
    # The memory goes to the cross-attention of every decoder layer, as its keys and values.
    cross_y = 2.75 + 2 * 0.8 + 0.29
    bend = (enc_x + w + dec_x) / 2
    c.ax.plot([enc_x + w, bend, bend], [memory_y + 0.25, memory_y + 0.25, cross_y], color="#333333", linewidth=1.0)
    c.arrow((bend, cross_y), (dec_x, cross_y))
    c.text(bend, memory_y + 0.45, "keys and values\nof every layer", ha="center", size=small)
    top = tops["tgt"]
    c.arrow((dec_x + w / 2, top), (dec_x + w / 2, top + 0.55), shape_label(s["decoded"], "batch tgt_len d_model"))
    c.box(dec_x, top + 0.55, w, 0.45, f"linear (generator): {config.tgt_vocab_size} scores", "linear")
    c.arrow((dec_x + w / 2, top + 1.0), (dec_x + w / 2, top + 1.5), shape_label(s["logits"], "batch tgt_len tgt_vocab"))
    c.text(dec_x + w / 2, top + 1.62, "logits: softmax gives next-token probabilities", ha="center")
    c.text(0.1, 9.1, f"d_model = {config.d_model}, num_heads = {config.num_heads}, N = {config.num_layers}"
           + (", pre-LN" if config.norm_first else ", post-LN (the paper)"), size=FONT + 1)
    c.text(0.1, 8.75, "red: residual connections, each sublayer's input added to its output in the Add & Norm above it",
           size=FONT, color=RESIDUAL)
    return c.fig


# ------------------------------------------------------------------------------------------- one attention


def qkv_dataflow(d_model: int = 512, d_k: int = 64, d_v: int = 64, batch: int = 2, query_len: int = 4,
                 key_len: int = 6) -> Figure:
    """Scaled dot-product attention as data flow: ``X W^Q``, ``X W^K``, ``X W^V``, scores, softmax, weighted sum.

    ``query_len != key_len`` draws cross-attention (queries from one sequence, keys and values from another).
    """
    s = attention_shapes(d_model, d_k, d_v, batch, query_len, key_len)
    # Larger type than the other diagrams: the figure is shown at its natural width, where 9-10 pt stays legible.
    text, label = FONT + 2, FONT + 1
    c = _Canvas.make(10.2, 5.8, (0, 12.75), (0, 7))
    q_from = "Y (queries' sequence)" if query_len != key_len else "X"
    c.box(0.3, 0.45, 3.2, 0.5, q_from, "data", size=text)
    c.box(6.0, 0.45, 3.2, 0.5, "X (keys' and values' sequence)" if query_len != key_len else "X", "data", size=text)
    # Each input's shape under its own box, centred on it, so that no label runs into the other box.
    c.text(1.9, 0.18, shape_label(s["queries_in"], "batch query_len d_model"), size=label, va="center",
           ha="center", color="#1a4f8a", family="monospace")
    c.text(7.6, 0.18, shape_label(s["keys_in"], "batch key_len d_model"), size=label, va="center",
           ha="center", color="#1a4f8a", family="monospace")
    centres = {"Q": 1.9, "K": 5.6, "V": 9.2}
    for name, x in centres.items():
        source_x = 1.9 if name == "Q" else 7.6
        c.arrow((source_x, 0.95), (x, 1.5))
        c.box(x - 1.2, 1.5, 2.4, 0.5, f"× W^{name}  ({name} projection)", "linear", size=label)
    c.arrow((1.9, 2.0), (1.9, 2.9), "Q " + shape_label(s["q"], "batch query_len d_k"), size=label)
    c.arrow((5.6, 2.0), (5.6, 2.9), "K " + shape_label(s["k"], "batch key_len d_k"), size=label)
    c.arrow((9.2, 2.0), (9.2, 4.9), "V " + shape_label(s["v"], "batch key_len d_v"), size=label)
    c.box(1.0, 2.9, 5.5, 0.5, "scores = Q Kᵀ / √d_k   (mask: blocked → lowest value)", "attention", size=label)
    c.arrow((3.75, 3.4), (3.75, 4.0), shape_label(s["weights"], "batch query_len key_len"), size=label)
    c.box(2.25, 4.0, 3.0, 0.5, "softmax over keys (rows sum to 1)", "attention", size=label)
    c.arrow((3.75, 4.5), (3.75, 4.9), "weights " + shape_label(s["weights"], "batch query_len key_len"), size=label)
    c.box(2.25, 4.9, 7.6, 0.5, "weights @ V: each query's weighted average of the values", "attention", size=text)
    c.arrow((3.75, 5.4), (3.75, 6.1), "output " + shape_label(s["out"], "batch query_len d_v"), size=label)
    c.text(3.75, 6.3, "one output vector per query", ha="center", size=text)
    return c.fig


def heads(d_model: int = 512, num_heads: int = 8, batch: int = 2, seq_len: int = 5) -> Figure:
    """Multi-head attention's reshapes: project, split into heads, attend per head, merge, project with ``W^O``.

    One row per step, with the shape of the array that step produces printed on the right of its box.
    """
    s = head_shapes(d_model, num_heads, batch, seq_len)
    steps = [
        ("X (input)", "data", shape_label(s["input"], "batch seq_len d_model")),
        ("× W^Q, W^K, W^V (one d_model × d_model matrix each)", "linear",
         "Q " + shape_label(s["projected"], "batch seq_len d_model")),
        ("reshape: cut d_model into num_heads pieces of d_head", "data",
         shape_label(s["reshaped"], "batch seq_len num_heads d_head")),
        ("transpose axes 1 and 2: heads become a batch axis", "data",
         shape_label(s["split"], "batch num_heads seq_len d_head")),
        ("softmax(Q Kᵀ / √d_head) in every head at once", "attention",
         "weights " + shape_label(s["weights"], "batch num_heads seq_len seq_len")),
        ("weights @ V in every head: the heads' outputs", "attention",
         shape_label(s["attended"], "batch num_heads seq_len d_head")),
        ("transpose back", "data", shape_label(s["transposed"], "batch seq_len num_heads d_head")),
        ("reshape: concatenate the heads", "data", shape_label(s["merged"], "batch seq_len d_model")),
        ("× W^O (mixes the heads)", "linear", shape_label(s["out"], "batch seq_len d_model")),
    ]
    size, step = FONT + 1, 0.95
    c = _Canvas.make(10.0, 7.4, (0, 12), (0, len(steps) * step + 0.6))
    for i, (text, kind, label) in enumerate(steps):
        y = len(steps) * step - i * step
        c.box(0.3, y - 0.45, 5.6, 0.5, text, kind, size=size)
        if i < len(steps) - 1:
            c.arrow((3.1, y - 0.45), (3.1, y - 0.9))
        # The shape sits on the box's own line (its centre, y - 0.2), so a row's box and its shape read together.
        c.text(6.1, y - 0.2, label, size=size, va="center", color="#1a4f8a", family="monospace")
    c.text(0.3, 0.15, f"d_model = {d_model}, num_heads = {num_heads}, d_head = {s['split'][-1]}: the shape after "
           "each step on the right", size=size)
    return c.fig


# ----------------------------------------------------------------------------------------------------- masks


def mask_placement(src_lengths: Sequence[int] = (4, 6), tgt_lengths: Sequence[int] = (3, 5)) -> Figure:
    """The three attentions of the model and the mask each one gets, drawn for the first sentence of a batch.

    ``src_lengths`` and ``tgt_lengths`` are the real lengths of each sentence; shorter ones are padded.
    """
    s = mask_shapes(src_lengths, tgt_lengths)
    # The grids are small, so their labels are set larger than the other diagrams' text: 11 pt keeps a tick label's
    # digits about 10 px high when the page shows the figure at its natural width (9.6 in, about 920 px).
    label_size = FONT + 3
    fig = Figure(figsize=(9.6, 4.6), facecolor="white", layout="constrained")
    axes = fig.subplots(1, 3)
    panels = [
        ("encoder self-attention", "source padding", s["enc"], "source key", "source query"),
        ("decoder self-attention", "target padding AND causal", s["dec_self"], "target key", "target query"),
        ("cross-attention", "source padding", s["cross"], "source key", "target query"),
    ]
    for ax, (title, name, (mask, shape), xlabel, ylabel) in zip(axes, panels, strict=True):
        ax.imshow(mask, cmap="Greys", vmin=0, vmax=1.6, aspect="equal")
        names = "batch 1 1 src_len" if shape[2] == 1 else "batch 1 tgt_len tgt_len"
        ax.set_title(f"{title}\n{name}\nbuilt as {shape_label(shape, names)}", fontsize=label_size - 1)
        ax.set_xticks(np.arange(mask.shape[1] + 1) - 0.5, minor=True)
        ax.set_yticks(np.arange(mask.shape[0] + 1) - 0.5, minor=True)
        ax.grid(which="minor", color="#999999", linewidth=0.5)
        ax.tick_params(which="minor", length=0)
        ax.set_xlabel(xlabel, fontsize=label_size)
        ax.set_ylabel(ylabel, fontsize=label_size)
        ax.set_xticks(range(mask.shape[1]))
        ax.set_yticks(range(mask.shape[0]))
        ax.tick_params(labelsize=label_size)
    fig.suptitle(f"sentence 1 of the batch: {src_lengths[0]} of {max(src_lengths)} source tokens real, "
                 f"{tgt_lengths[0]} of {max(tgt_lengths)} target tokens real (dark = may attend)", fontsize=label_size)
    return fig


# ------------------------------------------------------------------------------------------ Add & Norm wiring


def residual_wiring(d_model: int = 512, batch: int = 2, seq_len: int = 5) -> Figure:
    """One sublayer with its residual connection and LayerNorm, post-LN (the paper) beside pre-LN."""
    s = residual_shapes(d_model, batch, seq_len)
    label = shape_label(s["post"], "batch seq_len d_model")
    c = _Canvas.make(9.6, 4.8, (0, 12), (0, 6))
    for x0, title, order in [(0.4, "post-LN (the paper): LayerNorm(x + sublayer(x))", ("sublayer", "add", "norm")),
                             (6.4, "pre-LN: x + sublayer(LayerNorm(x))", ("norm", "sublayer", "add"))]:
        c.text(x0, 5.6, title, size=FONT + 1, weight="bold")
        c.box(x0 + 0.8, 0.3, 2.4, 0.45, "x", "data")
        y = 0.75
        heights = {"sublayer": ("sublayer (attention or FFN)", "attention"), "add": ("+", "data"),
                   "norm": ("LayerNorm", "norm")}
        centres = {}
        for step in order:
            c.arrow((x0 + 2.0, y), (x0 + 2.0, y + 0.6), label if step == order[0] else "")
            text, kind = heights[step]
            c.box(x0 + 0.8, y + 0.6, 2.4, 0.5, text, kind)
            centres[step] = y + 0.85
            y += 1.1
        c.arrow((x0 + 2.0, y), (x0 + 2.0, y + 0.5), "output " + label)
        # The residual path: from x around to the addition.
        c.ax.annotate("", xy=(x0 + 0.8, centres["add"]), xytext=(x0 + 0.8, 0.52),
                      arrowprops={"arrowstyle": "-|>", "color": RESIDUAL, "linewidth": 1.2,
                                  "connectionstyle": "bar,fraction=-0.35"})
        c.text(x0 - 0.1, (centres["add"] + 0.5) / 2, "residual", size=FONT - 1, color=RESIDUAL, ha="right",
               rotation=90, va="center")
    c.text(0.4, 0.02, "red: the residual path; pre-LN keeps it free of LayerNorm (each pre-LN stack ends with one "
           "final LayerNorm)", size=FONT - 1)
    return c.fig


# ----------------------------------------------------------------------------------------------- decoding


def greedy_decoding(model: Any, source: str | Sequence[str], src_vocab: Any, tgt_vocab: Any,
                    max_steps: int = 12) -> Figure:
    """Greedy decoding of one sentence by ``model`` (a companion Transformer, torch or keras), step by step.

    The steps are computed by the oracle on the model's weights: the encoder runs once, then each step runs the
    decoder on the tokens so far, keeps the scores of the last position only and appends the best token, until
    ``</s>``. Each row of the figure is one step, with the shapes of that step.
    """
    steps = decode_greedily(model, source, src_vocab, tgt_vocab, max_steps)
    rows = len(steps)
    c = _Canvas.make(10.0, 1.2 + 0.55 * rows, (0, 14), (0, rows + 1.6))
    c.text(0.1, rows + 1.1, "source: " + " ".join(steps[0]["source"]) + "   → encoder once, memory "
           + shape_label(steps[0]["memory"], "batch src_len d_model"), size=FONT + 1)
    c.text(0.1, rows + 0.55, "step", size=FONT, weight="bold")
    c.text(0.9, rows + 0.55, "decoder input (tokens so far)", size=FONT, weight="bold")
    c.text(7.2, rows + 0.55, "logits; last position", size=FONT, weight="bold")
    c.text(11.6, rows + 0.55, "argmax (p)", size=FONT, weight="bold")
    for i, step in enumerate(steps):
        y = rows - i - 0.2
        c.text(0.3, y + 0.2, str(i + 1), size=FONT, va="center")
        x = 0.9
        for token in step["prefix"]:
            width = 0.25 + 0.09 * len(token)
            c.box(x, y, width, 0.4, token, "data", size=FONT - 1)
            x += width + 0.08
        c.text(7.2, y + 0.2, shape_label(step["logits"], None) + " → " + shape_label(step["last"], None),
               size=FONT - 1, va="center", family="monospace", color="#1a4f8a")
        c.box(11.6, y, 1.1 + 0.08 * len(step["token"]), 0.4, f"{step['token']} ({step['p']:.2f})", "linear",
              size=FONT - 1)
    return c.fig
