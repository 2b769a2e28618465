"""Choosing the next token from a model's logits: greedy, temperature, top-k and top-p (nucleus) sampling.

Framework-free (NumPy): ``companion.torch.gpt.generate`` and ``companion.keras.gpt.generate`` hand the logits of the
last position to :func:`sample_next`, so both frameworks draw the same tokens from the same logits and seed.

The rules are applied in this order, to each row of a ``(batch, vocab_size)`` array of logits:

1. **temperature** ``T``: divide the logits by ``T``. ``T < 1`` sharpens the distribution, ``T > 1`` flattens it,
   and ``T = 0`` means greedy decoding (always the arg-max; nothing random is drawn).
2. **top-k**: keep the ``k`` largest logits and give every other token probability 0.
3. **top-p** (nucleus): sort what is left by probability and keep the smallest prefix whose mass reaches ``p``.
4. draw one token from the renormalised probabilities with the ``numpy.random.Generator`` given.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "check_sampling_args",
    "filter_logits",
    "make_rng",
    "sample_next",
    "softmax",
    "top_k_mask",
    "top_p_mask",
]


def check_sampling_args(temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None) -> None:
    """Raise ValueError unless ``temperature >= 0``, ``top_k`` is None or a positive integer and ``top_p`` is None
    or in ``(0, 1]``."""
    if not np.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature must be a finite number >= 0 (0 means greedy); got {temperature}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int | np.integer) or top_k < 1):
        raise ValueError(f"top_k must be None or a positive integer; got {top_k!r}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be None or a number in (0, 1]; got {top_p}")


def _as_logits(logits) -> np.ndarray:
    logits = np.asarray(logits, dtype=np.float64)
    if logits.ndim != 2 or logits.shape[1] < 1:
        raise ValueError(f"logits must have shape (batch, vocab_size); got shape {logits.shape}")
    return logits


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax of ``(batch, vocab_size)`` logits; entries at ``-inf`` get probability exactly 0."""
    shifted = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(shifted)
    return e / e.sum(axis=-1, keepdims=True)


def top_k_mask(logits, k: int) -> np.ndarray:
    """bool ``(batch, vocab_size)``: True for the ``k`` largest logits of each row (exactly ``min(k, vocab_size)``
    of them; among equal logits the lower id wins)."""
    logits = _as_logits(logits)
    check_sampling_args(top_k=k)
    order = np.argsort(-logits, axis=-1, kind="stable")[:, : min(k, logits.shape[1])]  # (batch, k)
    keep = np.zeros(logits.shape, dtype=bool)
    np.put_along_axis(keep, order, True, axis=-1)
    return keep


def top_p_mask(logits, p: float) -> np.ndarray:
    """bool ``(batch, vocab_size)``: the nucleus of each row, the smallest set of tokens whose probability (softmax
    of ``logits``) adds up to at least ``p``.

    Sort the probabilities in decreasing order and keep tokens until the running sum reaches ``p``; the token that
    crosses ``p`` is kept, so the most likely token is always in. Tokens with probability 0 (logit ``-inf``) are
    never kept.
    """
    logits = _as_logits(logits)
    check_sampling_args(top_p=p)
    probs = softmax(logits)
    order = np.argsort(-probs, axis=-1, kind="stable")  # (batch, vocab): most likely first
    running = np.cumsum(np.take_along_axis(probs, order, axis=-1), axis=-1)
    # How many to keep: the first position whose running sum reaches p, plus one. Rounding can leave the full sum
    # a hair under p = 1, hence the cap at the number of tokens with a non-zero probability.
    count = (running < p).sum(axis=-1) + 1
    nonzero = (probs > 0).sum(axis=-1)
    # p = 1 keeps every token: the running sum can reach 1.0 in float64 before a tail of tiny probabilities.
    count = nonzero if p >= 1 else np.minimum(count, nonzero)
    keep_sorted = np.arange(logits.shape[1])[None, :] < count[:, None]
    keep = np.zeros(logits.shape, dtype=bool)
    np.put_along_axis(keep, order, keep_sorted, axis=-1)
    return keep


def filter_logits(
    logits, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None
) -> np.ndarray:
    """Rules 1 to 3: logits ``(batch, vocab_size)`` divided by ``temperature`` (> 0), with ``-inf`` for every token
    that top-k or top-p removes. ``softmax`` of the result is the distribution :func:`sample_next` draws from."""
    logits = _as_logits(logits)
    check_sampling_args(temperature, top_k, top_p)
    if temperature == 0:
        raise ValueError("temperature 0 means greedy decoding, which has no distribution to filter; use argmax")
    scaled = logits / temperature
    if top_k is not None:
        scaled = np.where(top_k_mask(scaled, top_k), scaled, -np.inf)
    if top_p is not None:
        scaled = np.where(top_p_mask(scaled, top_p), scaled, -np.inf)
    return scaled


def make_rng(seed: int | np.random.Generator | None = None) -> np.random.Generator:
    """A NumPy generator: the same ``seed`` gives the same draws; None draws fresh entropy; a Generator is kept."""
    return seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)


def sample_next(
    logits,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    rng: np.random.Generator | int | None = None,
) -> np.ndarray:
    """Pick one next token per row of ``logits`` ``(batch, vocab_size)``; returns int64 ``(batch,)``.

    ``temperature=0`` returns the arg-max of each row (greedy decoding, nothing drawn). Otherwise the logits go
    through :func:`filter_logits` and one token is drawn per row from the renormalised probabilities, by inverse
    transform sampling: one uniform number per row, in row order, from ``rng`` (a Generator or a seed).
    """
    logits = _as_logits(logits)
    check_sampling_args(temperature, top_k, top_p)
    if temperature == 0:
        return logits.argmax(axis=-1).astype(np.int64)
    probs = softmax(filter_logits(logits, temperature, top_k, top_p))  # removed tokens: exactly 0
    running = np.cumsum(probs, axis=-1)  # (batch, vocab)
    u = make_rng(rng).random(logits.shape[0])[:, None] * running[:, -1:]  # uniform in [0, total)
    chosen = (running <= u).sum(axis=-1)  # the first token whose running sum exceeds u: its probability is > 0
    last_possible = logits.shape[1] - 1 - np.argmax(probs[:, ::-1] > 0, axis=-1)  # guards u rounding up to total
    return np.minimum(chosen, last_possible).astype(np.int64)
