"""A text corpus that needs no download: the course's own chapters and pages, read from the repository.

Framework-free. Chapter 8 trains its tokenizer and its small GPT on this text; the held-out part of every
document measures how well the model predicts text it has not seen.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

#: The repository root (the folder that holds ``notebooks/`` and ``book/``).
ROOT = Path(__file__).resolve().parents[1]


def _strip_front_matter(text: str) -> str:
    """Drop the jupytext header (``---`` ... ``---``) that opens a MyST notebook."""
    if text.startswith("---\n"):
        end = text.find("\n---\n", 4)
        if end != -1:
            return text[end + 5 :].lstrip("\n")
    return text


def course_documents(exclude: Sequence[str] = (), root: Path | str | None = None) -> dict[str, str]:
    """The chapters (``notebooks/*.md``) and prose pages (``book/*.md``) of the course, by file name.

    Args:
        exclude: leave out every file whose name starts with one of these prefixes, e.g. ``("08_",)``.
        root: the repository root; by default the one this package lives in.

    Returns:
        ``{"notebooks/01_text_as_numbers.md": text, ...}`` in sorted order, jupytext headers removed.
    """
    root = Path(root) if root is not None else ROOT
    paths = sorted((root / "notebooks").glob("*.md")) + sorted((root / "book").glob("*.md"))
    if not paths:
        raise FileNotFoundError(f"no notebooks/*.md or book/*.md under {root}: the corpus is read from a checkout")
    documents = {}
    for path in paths:
        if any(path.name.startswith(prefix) for prefix in exclude):
            continue
        documents[path.relative_to(root).as_posix()] = _strip_front_matter(path.read_text(encoding="utf-8"))
    return documents


def split_documents(documents: dict[str, str], valid_fraction: float = 0.1) -> tuple[list[str], list[str]]:
    """Hold out the end of every document: returns ``(train_texts, valid_texts)``.

    Each document is cut at the first line break after ``1 - valid_fraction`` of its characters, so both parts
    cover every chapter (a split by whole documents would test on a topic the model never read about).
    """
    if not 0 < valid_fraction < 1:
        raise ValueError(f"valid_fraction must lie strictly between 0 and 1; got {valid_fraction}")
    train, valid = [], []
    for text in documents.values():
        cut = text.find("\n", int(len(text) * (1 - valid_fraction)))
        cut = len(text) if cut == -1 else cut + 1
        train.append(text[:cut])
        valid.append(text[cut:])
    return train, valid


def lm_windows(
    ids: Sequence[int] | np.ndarray, context: int, stride: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Cut a stream of token ids into language-model examples: inputs and the same windows shifted by one.

    Args:
        ids: the token stream, shape ``(n,)``.
        context: tokens per example.
        stride: distance between the starts of two windows (default ``context``: no overlap).

    Returns:
        ``(inputs, targets)``, int64 arrays of shape ``(num_windows, context)``; ``targets[i, t]`` is the token
        that follows ``inputs[i, t]``.
    """
    ids = np.asarray(ids, dtype=np.int64)
    if ids.ndim != 1:
        raise ValueError(f"ids must have shape (n,); got {ids.shape}")
    if context < 1 or len(ids) < context + 1:
        raise ValueError(f"need context >= 1 and at least context + 1 = {context + 1} ids; got {len(ids)}")
    stride = stride or context
    starts = np.arange(0, len(ids) - context, stride)
    index = starts[:, None] + np.arange(context)[None, :]
    return ids[index], ids[index + 1]


def unigram_perplexity(train_ids: Sequence[int], valid_ids: Sequence[int], vocab_size: int) -> float:
    """Perplexity on ``valid_ids`` of the model that ignores context: p(token) from counts in ``train_ids``.

    Counts get add-one (Laplace) smoothing, so a token never seen in training still has a finite probability.
    This is the baseline a language model has to beat.
    """
    counts = np.bincount(np.asarray(train_ids, dtype=np.int64), minlength=vocab_size).astype(np.float64) + 1.0
    log_probs = np.log(counts / counts.sum())
    return float(np.exp(-log_probs[np.asarray(valid_ids, dtype=np.int64)].mean()))


def global_batches(num_examples: int, batch_size: int, steps: int, seed: int = 0) -> list[np.ndarray]:
    """The example indices of each step's global batch: a seeded shuffle, reshuffled after every pass."""
    if batch_size > num_examples:
        raise ValueError(f"batch_size must be at most the number of examples ({num_examples}); got {batch_size}")
    generator = np.random.default_rng(seed)
    order, batches = np.array([], dtype=np.int64), []
    for _ in range(steps):
        if len(order) < batch_size:
            order = np.concatenate([order, generator.permutation(num_examples)])
        batches.append(order[:batch_size])
        order = order[batch_size:]
    return batches
