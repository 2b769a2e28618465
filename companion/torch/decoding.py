"""Decoding for the PyTorch Transformer: batched greedy decoding, beam search (one sentence at a time or a whole
batch at once) and ``translate`` from strings to strings.

Same names and arguments as ``companion.keras.decoding``. The search itself is framework-free
(``companion.decoding``); these functions supply the model's next-token scores.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from ..data import decode_ids, encode_sentences
from ..decoding import batch_beam_search_from_scores, beam_search_from_scores
from ..text import Vocabulary, pad_batch
from .kv_cache import cached_beam_scorer, cross_attention_cache, decode_cached


def _source_and_limit(model: nn.Module, src_ids, max_len: int | None, device: torch.device):
    """The source as a long tensor ``(batch, src_len)`` on ``device``, and the most tokens to generate: ``max_len``,
    by default ``src_len + 10``, capped by the model's ``max_len - 1``."""
    src = torch.as_tensor(np.asarray(src_ids) if not isinstance(src_ids, torch.Tensor) else src_ids, device=device)
    if src.dim() != 2:
        raise ValueError(f"src_ids must have shape (batch, src_len); got shape {tuple(src.shape)}")
    limit = min(max_len if max_len is not None else src.shape[1] + 10, model.max_len - 1)
    return src.long(), limit


@torch.no_grad()
def greedy_decode(
    model: nn.Module,
    src_ids: torch.Tensor | np.ndarray,
    bos_id: int,
    eos_id: int,
    max_len: int | None = None,
    use_cache: bool = False,
) -> torch.Tensor:
    """Translate a whole batch at once, picking the most likely next token at every step.

    The source is encoded once. Each step runs the decoder on everything generated so far and appends the
    arg-max of the last position. A sentence that has produced ``eos_id`` is finished: it gets PAD from then on,
    and the loop stops as soon as every sentence is finished (or after ``max_len`` tokens).

    Args:
        src_ids: ``(batch, src_len)``.
        max_len: most tokens to generate; default ``src_len + 10``, capped by the model's ``max_len - 1``.
        use_cache: keep the decoder's keys and values (``companion.torch.kv_cache``): the cross-attention ones are
            computed once, and each step computes only the new position. Same tokens, less work. Off by default:
            the plain loop is the one chapter 7 explains, and it works with any model that has ``encode`` and
            ``decode``; the cache needs the companion Transformer's decoder layers.

    Returns:
        int64 ``(batch, out_len)``: the generated tokens without ``<s>``; a finished row ends with ``eos_id``
        followed by PAD.
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    src, limit = _source_and_limit(model, src_ids, max_len, device)
    memory, src_mask = model.encode(src)
    cross_kv, self_kv = (cross_attention_cache(model, memory) if use_cache else None), None
    generated = torch.full((src.shape[0], 1), bos_id, dtype=torch.long, device=device)  # (batch, 1)
    finished = torch.zeros(src.shape[0], dtype=torch.bool, device=device)
    for _ in range(limit):
        if use_cache:  # logits of the new position only: (batch, 1, vocab)
            logits, self_kv = decode_cached(model, generated, cross_kv, src_mask, self_kv)
        else:
            logits = model.decode(generated, memory, src_mask)  # (batch, steps, vocab)
        next_ids = logits[:, -1].argmax(dim=-1)  # (batch,)
        next_ids = next_ids.masked_fill(finished, model.pad_id)
        generated = torch.cat([generated, next_ids[:, None]], dim=1)
        finished |= next_ids == eos_id
        if bool(finished.all()):
            break
    model.train(was_training)
    return generated[:, 1:]


@torch.no_grad()
def beam_search(
    model: nn.Module,
    src_ids: torch.Tensor | np.ndarray,
    bos_id: int,
    eos_id: int,
    beam_size: int = 4,
    max_len: int | None = None,
    length_penalty: float = 0.6,
    use_cache: bool = False,
) -> torch.Tensor:
    """Beam search, one source sentence at a time (the beams of a sentence form the batch).

    See ``companion.decoding.beam_search_from_scores`` for the search itself; this function only supplies the
    next-token log-probabilities. Same output layout as :func:`greedy_decode`. With ``use_cache=True`` the scores
    come from ``companion.torch.kv_cache.cached_beam_scorer`` (same numbers, each step computes one position).
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    src, limit = _source_and_limit(model, src_ids, max_len, device)
    results = []
    for row in range(src.shape[0]):
        memory, src_mask = model.encode(src[row : row + 1])

        def next_log_probs(prefixes: np.ndarray, memory=memory, src_mask=src_mask) -> np.ndarray:
            ys = torch.as_tensor(prefixes, device=device).long()  # (beams, steps)
            count = ys.shape[0]
            logits = model.decode(ys, memory.expand(count, -1, -1), src_mask.expand(count, -1, -1, -1))
            return torch.log_softmax(logits[:, -1].float(), dim=-1).cpu().numpy()

        scorer = cached_beam_scorer(model, memory, src_mask) if use_cache else next_log_probs
        results.append(beam_search_from_scores(scorer, bos_id, eos_id, beam_size, limit, length_penalty))
    model.train(was_training)
    return torch.as_tensor(pad_batch(results, pad_id=model.pad_id), device=device)  # int64, PAD after </s>


def translate(
    model: nn.Module,
    sentences: Sequence[str],
    src_vocab: Vocabulary,
    tgt_vocab: Vocabulary,
    batch_size: int = 500,
    beam_size: int | None = None,
    length_penalty: float = 0.6,
) -> list[str]:
    """Translate sentences (strings) with greedy decoding, or beam search when ``beam_size`` is given.

    Beam search runs on whole batches (:func:`batch_beam_search`) and ranks finished hypotheses by their
    log-probability divided by ``((5 + length) / 6) ** length_penalty`` (0: no length normalization).
    """
    device = next(model.parameters()).device
    outputs: list[str] = []
    for start in range(0, len(sentences), batch_size):
        src = torch.as_tensor(encode_sentences(sentences[start : start + batch_size], src_vocab), device=device)
        if beam_size is None:
            ids = greedy_decode(model, src, tgt_vocab.bos_id, tgt_vocab.eos_id)
        else:
            ids = batch_beam_search(model, src, tgt_vocab.bos_id, tgt_vocab.eos_id, beam_size,
                                    length_penalty=length_penalty)
        outputs += decode_ids(ids.cpu().numpy(), tgt_vocab)
    return outputs


@torch.no_grad()
def batch_beam_search(
    model: nn.Module,
    src_ids: torch.Tensor | np.ndarray,
    bos_id: int,
    eos_id: int,
    beam_size: int = 4,
    max_len: int | None = None,
    length_penalty: float = 0.6,
) -> torch.Tensor:
    """Beam search for a whole batch: the same search as :func:`beam_search`, one decoder call per step.

    The source is encoded once; at each step the live prefixes of every unfinished sentence are decoded together,
    each reading its own sentence's memory (see ``companion.decoding.batch_beam_search_from_scores``). Same output
    layout as :func:`greedy_decode`: ``(batch, out_len)`` int64, finished rows end with ``eos_id`` then PAD.
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    src, limit = _source_and_limit(model, src_ids, max_len, device)
    memory, src_mask = model.encode(src)

    def next_log_probs(prefixes: np.ndarray, rows: np.ndarray) -> np.ndarray:
        index = torch.as_tensor(rows, device=device)
        logits = model.decode(torch.as_tensor(prefixes, device=device), memory[index], src_mask[index])
        return torch.log_softmax(logits[:, -1].float(), dim=-1).cpu().numpy()

    results = batch_beam_search_from_scores(
        next_log_probs, src.shape[0], bos_id, eos_id, beam_size, limit, length_penalty
    )
    model.train(was_training)
    return torch.as_tensor(pad_batch(results, pad_id=model.pad_id), device=device)  # int64, PAD after </s>
