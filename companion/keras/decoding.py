"""Decoding for the Keras Transformer: batched greedy decoding, beam search (one sentence at a time or a whole
batch at once) and ``translate`` from strings to strings.

Same names and arguments as ``companion.torch.decoding``. The search itself is framework-free
(``companion.decoding``); these functions supply the model's next-token scores, from a decoder that Keras runs as
one compiled call per step (:func:`next_token_logits`).
"""

from __future__ import annotations

from collections.abc import Sequence

import keras
import numpy as np
from keras import ops

from ..data import decode_ids, encode_sentences
from ..decoding import batch_beam_search_from_scores, beam_search_from_scores
from ..text import Vocabulary, pad_batch
from .device import default_device
from .kv_cache import cached_beam_scorer, cross_attention_cache, decode_cached
from .model import Transformer


class NextTokenLogits(keras.Model):
    """The decoder's scores for the next token only, as a model Keras can compile for decoding.

    ``(generated (batch, steps), memory (batch, src_len, d_model), src_mask (batch, 1, 1, src_len))`` ->
    ``(batch, tgt_vocab)`` float32 logits of the last position. Called through ``predict_on_batch``, Keras runs it
    as one compiled function (a graph on TensorFlow, ``jax.jit`` on JAX) instead of op by op: on TensorFlow
    eagerly, each of the decoder's few hundred small ops costs more Python than arithmetic. No weights of its own.
    """

    def __init__(self, transformer: keras.Model, **kwargs):
        super().__init__(**kwargs)
        self.transformer = transformer

    def build(self, input_shape):
        # Nothing of its own to build; the Transformer's layers build on their first call, as anywhere else.
        self.built = True

    def call(self, inputs):
        generated, memory, src_mask = inputs
        return ops.cast(self.transformer.decode(generated, memory, src_mask)[:, -1], "float32")


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    """log-softmax over the last axis of a float32 NumPy array."""
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def next_token_logits(model: keras.Model):
    """``f(generated, memory, src_mask) -> (batch, tgt_vocab)`` NumPy logits, compiled once per model and reused.

    A model's new shapes are traced again, but TensorFlow generalises to any length after the second one.
    XLA stays off: with lengths that change at every step it would recompile at every step. A model that is not
    the companion's :class:`Transformer` (any object with ``decode``, say a test's scripted model) is called as is.
    """
    if not isinstance(model, Transformer):
        return lambda generated, memory, src_mask: ops.convert_to_numpy(
            ops.cast(model.decode(generated, memory, src_mask)[:, -1], "float32"))
    scorer = getattr(model, "_next_token_scorer", None)
    if scorer is None:
        wrapper = NextTokenLogits(model)
        wrapper.compile(jit_compile=False)

        def scorer(generated, memory, src_mask, wrapper=wrapper) -> np.ndarray:
            return np.asarray(wrapper.predict_on_batch([generated, memory, src_mask]))

        # Kept on the model, so it lives exactly as long as the model. object.__setattr__ keeps Keras from
        # tracking the wrapper as one of the layers of the very model it wraps.
        object.__setattr__(model, "_next_token_scorer", scorer)
    return scorer


def greedy_decode(
    model: keras.Model, src_ids, bos_id: int, eos_id: int, max_len: int | None = None, use_cache: bool = False
):
    """Translate a whole batch at once, picking the most likely next token at every step.

    The source is encoded once. Each step runs the decoder on everything generated so far (one compiled call,
    see :func:`next_token_logits`) and appends the arg-max of the last position. A sentence that has produced
    ``eos_id`` is finished: it gets PAD from then on, and the loop stops as soon as every sentence is finished
    (or after ``max_len`` tokens).

    Args:
        src_ids: ``(batch, src_len)``.
        max_len: most tokens to generate; default ``src_len + 10``, capped by the model's ``max_len - 1``.
        use_cache: keep the decoder's keys and values (``companion.keras.kv_cache``): the cross-attention ones are
            computed once, and each step computes only the new position. Same tokens, less arithmetic, but the
            cached step runs op by op while the plain one is compiled: on a CPU the cache pays only for long
            outputs (``benchmarks/bench_decode.py`` measures both). Off by default: the plain loop is the one
            chapter 7 explains, and it works with any model that has ``encode`` and ``decode``; the cache needs
            the companion Transformer's decoder layers.

    Returns:
        int32 tensor ``(batch, out_len)``: the generated tokens without ``<s>``; a finished row ends with
        ``eos_id`` followed by PAD.
    """
    src = ops.convert_to_tensor(np.asarray(src_ids) if isinstance(src_ids, list | tuple) else src_ids)
    if len(src.shape) != 2:
        raise ValueError(f"src_ids must have shape (batch, src_len); got shape {tuple(src.shape)}")
    src = ops.cast(src, "int32")
    batch = src.shape[0]
    limit = min(max_len if max_len is not None else src.shape[1] + 10, model.max_len - 1)
    memory, src_mask = model.encode(src)
    cross_kv, self_kv = (cross_attention_cache(model, memory) if use_cache else None), None
    next_token = next_token_logits(model)  # the decoder as one compiled call
    # The bookkeeping is NumPy on the host; only the decoder runs in the backend.
    generated = np.full((batch, 1), bos_id, dtype="int32")  # (batch, 1)
    finished = np.zeros((batch,), dtype=bool)
    for _ in range(limit):
        if use_cache:  # logits of the new position only: (batch, 1, vocab)
            logits, self_kv = decode_cached(model, generated, cross_kv, src_mask, self_kv)
            last = ops.convert_to_numpy(logits[:, -1])
        else:
            last = next_token(generated, memory, src_mask)  # (batch, vocab)
        next_ids = np.where(finished, model.pad_id, last.argmax(axis=-1)).astype("int32")  # (batch,)
        generated = np.concatenate([generated, next_ids[:, None]], axis=1)
        finished |= next_ids == eos_id
        if finished.all():
            break
    return ops.convert_to_tensor(generated[:, 1:])


def beam_search(
    model: keras.Model,
    src_ids,
    bos_id: int,
    eos_id: int,
    beam_size: int = 4,
    max_len: int | None = None,
    length_penalty: float = 0.6,
    use_cache: bool = False,
):
    """Beam search, one source sentence at a time (the beams of a sentence form the batch).

    See ``companion.decoding.beam_search_from_scores`` for the search itself; this function only supplies the
    next-token log-probabilities. Same output layout as :func:`greedy_decode`. With ``use_cache=True`` the scores
    come from ``companion.keras.kv_cache.cached_beam_scorer`` (same numbers, each step computes one position).
    """
    src = np.asarray(ops.convert_to_numpy(src_ids) if not isinstance(src_ids, np.ndarray) else src_ids)
    if src.ndim != 2:
        raise ValueError(f"src_ids must have shape (batch, src_len); got shape {src.shape}")
    src = src.astype("int32")
    limit = min(max_len if max_len is not None else src.shape[1] + 10, model.max_len - 1)
    next_token = next_token_logits(model)
    results = []
    for row in range(src.shape[0]):
        memory, src_mask = model.encode(src[row : row + 1])

        def next_log_probs(prefixes: np.ndarray, memory=memory, src_mask=src_mask) -> np.ndarray:
            count = prefixes.shape[0]
            logits = next_token(prefixes.astype("int32"), ops.repeat(memory, count, axis=0),
                                ops.repeat(src_mask, count, axis=0))
            return _log_softmax(logits)

        scorer = cached_beam_scorer(model, memory, src_mask) if use_cache else next_log_probs
        results.append(beam_search_from_scores(scorer, bos_id, eos_id, beam_size, limit, length_penalty))
    return ops.convert_to_tensor(pad_batch(results, pad_id=model.pad_id).astype("int32"))  # PAD after </s>


def translate(
    model: keras.Model,
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
    outputs: list[str] = []
    with keras.device(default_device()):
        for start in range(0, len(sentences), batch_size):
            src = encode_sentences(sentences[start : start + batch_size], src_vocab).astype("int32")
            if beam_size is None:
                ids = greedy_decode(model, src, tgt_vocab.bos_id, tgt_vocab.eos_id)
            else:
                ids = batch_beam_search(model, src, tgt_vocab.bos_id, tgt_vocab.eos_id, beam_size,
                                        length_penalty=length_penalty)
            outputs += decode_ids(ops.convert_to_numpy(ids), tgt_vocab)
    return outputs


def batch_beam_search(
    model: keras.Model,
    src_ids,
    bos_id: int,
    eos_id: int,
    beam_size: int = 4,
    max_len: int | None = None,
    length_penalty: float = 0.6,
):
    """Beam search for a whole batch: the same search as :func:`beam_search`, one decoder call per step.

    The source is encoded once; at each step the live prefixes of every unfinished sentence are decoded together,
    each reading its own sentence's memory (see ``companion.decoding.batch_beam_search_from_scores``). Same output
    layout as :func:`greedy_decode`: ``(batch, out_len)`` int32, finished rows end with ``eos_id`` then PAD.
    """
    src = np.asarray(ops.convert_to_numpy(src_ids) if not isinstance(src_ids, np.ndarray) else src_ids)
    if src.ndim != 2:
        raise ValueError(f"src_ids must have shape (batch, src_len); got shape {src.shape}")
    src = src.astype("int32")
    limit = min(max_len if max_len is not None else src.shape[1] + 10, model.max_len - 1)
    memory, src_mask = model.encode(src)
    next_token = next_token_logits(model)

    def next_log_probs(prefixes: np.ndarray, rows: np.ndarray) -> np.ndarray:
        index = ops.convert_to_tensor(rows.astype("int32"))
        logits = next_token(prefixes.astype("int32"), ops.take(memory, index, axis=0),
                            ops.take(src_mask, index, axis=0))
        return _log_softmax(logits)

    results = batch_beam_search_from_scores(
        next_log_probs, src.shape[0], bos_id, eos_id, beam_size, limit, length_penalty
    )
    return ops.convert_to_tensor(pad_batch(results, pad_id=model.pad_id).astype("int32"))  # PAD after </s>
