"""Matplotlib helpers shared by the chapters (framework-free: they take NumPy arrays)."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np


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
