"""Pictures of a search: the candidates a beam search reads at each step, and what becomes of each.

Framework-free: :func:`beam_tree` draws the ``trace`` that ``companion.decoding.beam_search_from_scores`` records.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import matplotlib.pyplot as plt
import numpy as np

from .decoding import length_normalized
from .plots import use_book_style

use_book_style()

#: Okabe & Ito's colour-blind-safe colours, one per fate, with a line style each so grey print tells them apart too.
FATE_STYLE = {
    "live": {"color": "#0072B2", "linestyle": "-", "label": "kept: a live beam"},
    "finished": {"color": "#D55E00", "linestyle": "-", "label": "finished: </s> within the best k"},
    "dropped": {"color": "#999999", "linestyle": ":", "label": "dropped"},
}

Step = Sequence[tuple[float, Sequence[int], str]]


def beam_tree(
    trace: Sequence[Step],
    id_to_token: Callable[[int], str],
    chosen: Sequence[int] | None = None,
    length_penalty: float = 0.6,
    ax: plt.Axes | None = None,
    title: str | None = None,
) -> plt.Axes:
    """Draw a beam search step by step: one column per step, its candidates ranked from the top.

    Args:
        trace: what ``beam_search_from_scores(..., trace=[])`` recorded: per step, the ``2k`` extensions read,
            best first, as (summed log-probability, tokens from ``<s>``, fate).
        id_to_token: the target vocabulary's id -> word.
        chosen: the tokens after ``<s>`` that the search returned; their path is drawn thick.
        length_penalty: the alpha the search used, to print each finished hypothesis' normalized score.

    Each box shows the candidate's last word and its summed log-probability (a finished one also its
    length-normalized score); a line joins it to the live prefix it extends.
    """
    if not trace:
        raise ValueError("trace is empty: pass the list that beam_search_from_scores(..., trace=[]) filled")
    rows = max(len(step) for step in trace)
    if ax is None:
        _, ax = plt.subplots(figsize=(max(8.0, 1.3 * len(trace) + 1.5), 0.62 * rows + 1.6), layout="constrained")
    place: dict[tuple[int, ...], tuple[float, float]] = {(): (0.0, (rows - 1) / 2)}  # <s> at step 0
    chosen_path = {tuple(chosen[: i + 1]) for i in range(len(chosen))} if chosen is not None else set()
    ax.text(0, (rows - 1) / 2, "<s>", ha="center", va="center", fontsize=10,
            bbox={"boxstyle": "round,pad=0.3", "facecolor": "white", "edgecolor": "black"})
    for step, candidates in enumerate(trace, start=1):
        for rank, (score, tokens, fate) in enumerate(candidates):
            key = tuple(int(t) for t in tokens[1:])
            style = FATE_STYLE[fate]
            y = rows - 1 - rank
            parent = place.get(key[:-1])
            on_path = key in chosen_path
            if parent is not None:
                ax.plot([parent[0], step], [parent[1], y], color=style["color"],
                        linestyle=style["linestyle"], linewidth=3.0 if on_path else 1.0, zorder=1)
            if fate == "live":
                place[key] = (float(step), float(y))
            label = f"{id_to_token(key[-1])}\n{score:.2f}"
            if fate == "finished":
                label += f"\n({length_normalized(score, len(key), length_penalty):.2f})"
            ax.text(step, y, label, ha="center", va="center", fontsize=9,
                    color="black" if fate != "dropped" else "#555555",
                    bbox={"boxstyle": "round,pad=0.25", "facecolor": "white", "edgecolor": style["color"],
                          "linestyle": "--" if fate == "dropped" else "-", "linewidth": 2.5 if on_path else 1.2},
                    zorder=2)
    handles = [plt.Line2D([], [], color=s["color"], linestyle=s["linestyle"], linewidth=2, label=s["label"])
               for s in FATE_STYLE.values()]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=3, fontsize=9, frameon=False)
    ax.set_xlim(-0.6, len(trace) + 0.6)
    ax.set_ylim(-0.7, rows - 0.3)
    ax.set_xticks(np.arange(len(trace) + 1), ["<s>"] + [f"step {i}" for i in range(1, len(trace) + 1)], fontsize=9)
    ax.set_yticks([])
    for side in ("left", "right", "top"):
        ax.spines[side].set_visible(False)
    if title:
        ax.set_title(title, fontsize=11)
    return ax
