"""Matplotlib helpers shared by the chapters (framework-free: they take NumPy arrays).

Importing this module also sets the book's figure style once for the whole notebook (:func:`use_book_style`): every
chapter imports it, so no chapter needs a setting of its own.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib
import matplotlib.pyplot as plt
import numpy as np

# What the book's figures need: a white background of their own, so that they stay readable when the reader's page
# is dark (the theme shows figures as light cards), and text drawn as paths, so SVG looks the same with any fonts.
BOOK_RC = {
    "figure.facecolor": "white",
    "axes.facecolor": "white",
    "savefig.facecolor": "white",
    "savefig.transparent": False,
    "svg.fonttype": "path",
    "figure.dpi": 100,  # the resolution of images embedded in an SVG (heatmaps), not the size on the page
}


def use_book_style(fmt: str = "svg") -> str | None:
    """Draw figures as the book shows them: SVG (sharp on high-density screens) on a white background.

    Inside a Jupyter kernel the inline backend is switched to ``fmt`` (``"svg"``, or ``"retina"`` for 2x PNG);
    elsewhere only the matplotlib settings change. Returns the format set in the kernel, or ``None`` outside one.
    """
    if fmt not in ("svg", "retina", "png"):
        raise ValueError(f"fmt must be 'svg', 'retina' or 'png'; got {fmt!r}")
    matplotlib.rcParams.update(BOOK_RC)
    try:
        from IPython import get_ipython
        from matplotlib_inline.backend_inline import set_matplotlib_formats
    except ImportError:
        return None
    shell = get_ipython()
    if shell is None or not hasattr(shell, "kernel"):
        return None
    set_matplotlib_formats(fmt)
    return fmt


use_book_style()


def heatmap(
    matrix: np.ndarray,
    ax: plt.Axes | None = None,
    xlabels: Sequence[str] | None = None,
    ylabels: Sequence[str] | None = None,
    title: str | None = None,
    xlabel: str | None = None,
    ylabel: str | None = None,
    cmap: str = "viridis",
    colorbar: bool = True,
    annotate: bool = False,
    vmin: float | None = None,
    vmax: float | None = None,
) -> plt.Axes:
    """Draw a 2-D array with rows top to bottom and columns left to right, labelled by token when given.

    For attention weights pass ``(query_len, key_len)`` with ``ylabels`` = query tokens and ``xlabels`` = key
    tokens: each row is one query's distribution over the keys.
    """
    matrix = np.asarray(matrix)
    if matrix.ndim != 2:
        raise ValueError(f"matrix must be 2-D (rows, columns); got shape {matrix.shape}")
    ax = ax or plt.gca()
    image = ax.imshow(matrix, cmap=cmap, aspect="auto", vmin=vmin, vmax=vmax, interpolation="nearest")
    if xlabels is not None:
        ax.set_xticks(range(len(xlabels)), list(xlabels), rotation=90 if max(map(len, xlabels), default=0) > 3 else 0)
    if ylabels is not None:
        ax.set_yticks(range(len(ylabels)), list(ylabels))
    if annotate:
        for (row, col), value in np.ndenumerate(matrix):
            ax.text(col, row, f"{value:.2g}", ha="center", va="center", fontsize=7, color="white")
    if title:
        ax.set_title(title)
    if xlabel:
        ax.set_xlabel(xlabel)
    if ylabel:
        ax.set_ylabel(ylabel)
    if colorbar:
        ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    return ax


def attention_heatmap(
    weights: np.ndarray,
    query_tokens: Sequence[str],
    key_tokens: Sequence[str],
    ax: plt.Axes | None = None,
    title: str | None = None,
    colorbar: bool = True,
) -> plt.Axes:
    """Attention weights ``(query_len, key_len)``: queries on the vertical axis, keys on the horizontal axis."""
    weights = np.asarray(weights)
    if weights.shape != (len(query_tokens), len(key_tokens)):
        raise ValueError(
            f"weights must have shape (query_len, key_len) = ({len(query_tokens)}, {len(key_tokens)}); "
            f"got {weights.shape}"
        )
    return heatmap(
        weights, ax=ax, xlabels=key_tokens, ylabels=query_tokens, title=title, xlabel="key (attended to)",
        ylabel="query (attending)", cmap="Blues", colorbar=colorbar, vmin=0.0, vmax=1.0,
    )


def attention_grid(
    weights: np.ndarray,
    query_tokens: Sequence[str],
    key_tokens: Sequence[str],
    titles: Sequence[str] | None = None,
    ncols: int = 4,
    suptitle: str | None = None,
    panel_size: float = 2.6,
) -> plt.Figure:
    """One attention heatmap per head, ``weights`` of shape ``(num_heads, query_len, key_len)``.

    Queries run down the vertical axis and keys along the horizontal axis of every panel, as in
    :func:`attention_heatmap`; all panels share the colour scale 0..1 (one colour bar for the figure).
    """
    weights = np.asarray(weights)
    if weights.ndim != 3 or weights.shape[1:] != (len(query_tokens), len(key_tokens)):
        raise ValueError(
            f"weights must have shape (num_heads, query_len, key_len) = (h, {len(query_tokens)}, {len(key_tokens)}); "
            f"got {weights.shape}"
        )
    num_heads = weights.shape[0]
    ncols = max(1, min(ncols, num_heads))
    nrows = -(-num_heads // ncols)
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(panel_size * ncols + 1.0, panel_size * nrows + 0.6), squeeze=False, layout="constrained"
    )
    titles = list(titles) if titles is not None else [f"head {h}" for h in range(num_heads)]
    for index, ax in enumerate(axes.flat):
        if index >= num_heads:
            ax.axis("off")
            continue
        attention_heatmap(weights[index], query_tokens, key_tokens, ax=ax, title=titles[index], colorbar=False)
        if index % ncols:
            ax.set_ylabel("")
            ax.set_yticklabels([])
        if index < num_heads - ncols:
            ax.set_xlabel("")
            ax.set_xticklabels([])
    fig.colorbar(axes.flat[0].images[0], ax=axes, fraction=0.03, pad=0.02, label="attention weight")
    if suptitle:
        fig.suptitle(suptitle)
    return fig


def mask_heatmap(
    mask: np.ndarray,
    ax: plt.Axes | None = None,
    query_tokens: Sequence[str] | None = None,
    key_tokens: Sequence[str] | None = None,
    title: str | None = None,
) -> plt.Axes:
    """A boolean attention mask ``(query_len, key_len)``: dark = may attend (True), light = blocked (False).

    A ``(1, key_len)`` padding mask is drawn as one row; broadcast it first to see it per query.
    """
    mask = np.asarray(mask)
    if mask.ndim != 2:
        raise ValueError(f"mask must be 2-D (query_len, key_len); got shape {mask.shape}")
    ax = heatmap(
        mask.astype(float), ax=ax, xlabels=key_tokens, ylabels=query_tokens, title=title, xlabel="key (attended to)",
        ylabel="query (attending)", cmap="Greys", colorbar=False, vmin=0.0, vmax=1.0,
    )
    if query_tokens is None:
        ax.set_yticks(range(mask.shape[0]))
    if key_tokens is None:
        ax.set_xticks(range(mask.shape[1]))
    return ax
