"""Beam search, framework-free: the search runs on NumPy log-probabilities that a model supplies.

``companion.torch.decoding`` and ``companion.keras.decoding`` wrap their models' next-token scores in a function
and call the search here, so both frameworks search the same way and give the same tokens for the same scores.

The search is the one of fairseq and of Hugging Face's ``generate(num_beams=k, early_stopping=True)``:

* each step ranks every extension of the ``k`` live prefixes by summed log-probability and reads the best ``2k``;
* an extension that ends with ``</s>`` is finished only if it ranks among the best ``k`` (an ``</s>`` ranked lower
  is dropped, so it can neither end the search nor be chosen);
* the other extensions, best first, refill the ``k`` live beams (``2k`` candidates hold at least ``k`` of them);
* a sentence's search stops once ``k`` hypotheses have finished, or after ``max_len`` tokens, when the live beams
  join the finished ones;
* the answer is the finished hypothesis with the best length-normalized score (Wu et al., 2016).

With ``k = 1`` this is exactly greedy decoding: the single best extension is either ``</s>`` (finished, and the
search stops) or the next live prefix.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

Hypothesis = tuple[float, list[int]]  # (summed log-probability, token ids starting with <s>)


def length_normalized(score: float, length: int, length_penalty: float) -> float:
    """GNMT's length normalization (Wu et al., 2016): ``score / ((5 + length) / 6) ** length_penalty``.

    ``length`` counts the generated tokens, ``</s>`` included; ``length_penalty`` (alpha) 0 means none. Hugging
    Face's ``generate`` divides by ``length ** length_penalty`` instead: both are 1 at alpha 0 and grow with the
    length, GNMT's more slowly (at alpha 0.6 and 10 tokens: 1.73 against 3.98).
    """
    return score / ((5.0 + length) / 6.0) ** length_penalty


def _extend(
    alive: list[Hypothesis],
    totals: np.ndarray,
    beam_size: int,
    eos_id: int,
    finished: list[Hypothesis],
    step_trace: list[tuple[float, list[int], str]] | None = None,
) -> list[Hypothesis]:
    """One step of one sentence's search: the best extensions of ``alive`` by the scores ``totals``
    ``(beams, vocab)``. An extension ending with ``eos_id`` that ranks within the best ``beam_size`` goes to
    ``finished`` (one ranked lower is dropped); the best ``beam_size`` others are returned as the next live beams.
    ``step_trace``, if given, receives every extension read, best first, as (score, tokens, what became of it)."""
    order = np.argsort(-totals, axis=None, kind="stable")
    alive_next: list[Hypothesis] = []
    for rank, flat in enumerate(order[: 2 * beam_size]):  # at most beam_size are </s>, so enough stay alive
        beam, token = divmod(int(flat), totals.shape[1])
        candidate = (float(totals[beam, token]), alive[beam][1] + [token])
        if token != eos_id:
            fate = "live" if len(alive_next) < beam_size else "dropped"
            if fate == "live":
                alive_next.append(candidate)
        elif rank < beam_size:  # an </s> ranked below the best beam_size finishes nothing
            fate = "finished"
            finished.append(candidate)
        else:
            fate = "dropped"
        if step_trace is not None:
            step_trace.append((*candidate, fate))
        if len(alive_next) == beam_size and step_trace is None:
            break
    return alive_next


def _best(pool: list[Hypothesis], length_penalty: float) -> list[int]:
    """The tokens after ``<s>`` of the hypothesis with the best length-normalized score (the first of equals)."""
    _, best = max(pool, key=lambda item: length_normalized(item[0], len(item[1]) - 1, length_penalty))
    return best[1:]


def beam_search_from_scores(
    next_log_probs: Callable[[np.ndarray], np.ndarray],
    bos_id: int,
    eos_id: int,
    beam_size: int = 4,
    max_len: int = 50,
    length_penalty: float = 0.6,
    trace: list[list[tuple[float, list[int], str]]] | None = None,
) -> list[int]:
    """Beam search for one sentence, given a function that scores the next token of several prefixes at once.

    Keep the ``beam_size`` best unfinished prefixes (by summed log-probability). At each step extend every one by
    every token and rank the extensions; an extension that ends with ``eos_id`` and ranks within the best
    ``beam_size`` is set aside as finished, and the best ``beam_size`` other extensions are the next live
    prefixes. Stop when ``beam_size`` hypotheses are finished, or after ``max_len`` tokens (the live prefixes then
    compete too), and return the one with the best *length-normalized* score
    ``log_prob / ((5 + length) / 6) ** alpha`` (Wu et al., 2016; ``alpha = length_penalty``, 0 means none).
    Without normalization, short outputs win, because every extra token adds a negative log-probability.

    Args:
        next_log_probs: ``prefixes (beams, steps)`` int array, starting with ``bos_id`` -> ``(beams, vocab)``
            log-probabilities of the next token.
        beam_size: how many prefixes to keep; 1 is greedy decoding.
        trace: if a list, it receives one list per step: the ``2 * beam_size`` best extensions read at that step,
            best first, as ``(summed log-probability, tokens from <s>, fate)`` with fate ``"live"`` (kept),
            ``"finished"`` (an ``</s>`` within the best ``beam_size``) or ``"dropped"``.

    Returns:
        the best token ids after ``<s>``, ending with ``eos_id`` unless ``max_len`` was reached first.
    """
    if beam_size < 1 or max_len < 1:
        raise ValueError(f"beam_size and max_len must be positive; got {beam_size} and {max_len}")
    return batch_beam_search_from_scores(
        lambda prefixes, rows: next_log_probs(prefixes), 1, bos_id, eos_id, beam_size, max_len, length_penalty,
        trace=trace,
    )[0]


def batch_beam_search_from_scores(
    next_log_probs: Callable[[np.ndarray, np.ndarray], np.ndarray],
    batch_size: int,
    bos_id: int,
    eos_id: int,
    beam_size: int = 4,
    max_len: int = 50,
    length_penalty: float = 0.6,
    trace: list[list[tuple[float, list[int], str]]] | None = None,
) -> list[list[int]]:
    """:func:`beam_search_from_scores` for ``batch_size`` sentences at once: one model call per step for all.

    Every sentence keeps its own beams, finished hypotheses and stopping rule, exactly as in the one-sentence
    version, so the results are the same; only the scoring is batched: at each step the live prefixes of all
    unfinished sentences (they all have the same length) go to the model together.

    Args:
        next_log_probs: ``(prefixes (n, steps) int array, rows (n,) int array)`` -> ``(n, vocab)`` next-token
            log-probabilities, where ``rows[i]`` is the sentence (0 to ``batch_size - 1``) prefix ``i`` belongs to.
        batch_size: number of sentences.
        trace: as in :func:`beam_search_from_scores`, for a batch of one sentence.

    Returns:
        per sentence, the best token ids after ``<s>`` (see :func:`beam_search_from_scores`).
    """
    if beam_size < 1 or max_len < 1 or batch_size < 1:
        raise ValueError(
            f"batch_size, beam_size and max_len must be positive; got {batch_size}, {beam_size}, {max_len}"
        )
    if trace is not None and batch_size != 1:
        raise ValueError(f"trace records the search of one sentence; got batch_size={batch_size}")
    alive: list[list[Hypothesis]] = [[(0.0, [bos_id])] for _ in range(batch_size)]
    finished: list[list[Hypothesis]] = [[] for _ in range(batch_size)]
    done = [False] * batch_size
    open_rows: list[int] = []
    for _ in range(max_len):
        open_rows = [b for b in range(batch_size) if not done[b]]
        if not open_rows:
            break
        rows = np.array([b for b in open_rows for _ in alive[b]], dtype=np.int64)
        prefixes = np.array([tokens for b in open_rows for _, tokens in alive[b]], dtype=np.int64)
        log_probs = np.asarray(next_log_probs(prefixes, rows))
        if log_probs.ndim != 2 or log_probs.shape[0] != len(rows):
            raise ValueError(f"next_log_probs must return (prefixes={len(rows)}, vocab); got {log_probs.shape}")
        start = 0
        for b in open_rows:
            count = len(alive[b])
            totals = np.array([score for score, _ in alive[b]])[:, None] + log_probs[start : start + count]
            start += count
            step_trace = None if trace is None else []
            alive[b] = _extend(alive[b], totals, beam_size, eos_id, finished[b], step_trace)
            if trace is not None:
                trace.append(step_trace)
            done[b] = len(finished[b]) >= beam_size or not alive[b]
    # open_rows now holds the sentences that took the last of the max_len steps (none if the loop ended early):
    # their live prefixes compete with their finished hypotheses, also when the last of those finished at that
    # very step (as in Hugging Face's generate).
    took_last_step = set(open_rows)
    pools = [finished[b] + alive[b] if b in took_last_step else finished[b] for b in range(batch_size)]
    return [_best(pool, length_penalty) for pool in pools]
