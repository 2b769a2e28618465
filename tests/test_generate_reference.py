"""The course's decoding against Hugging Face's ``generate``, token for token, on the same model.

The course's PyTorch ``Transformer`` (random weights) is copied into a Hugging Face ``MarianMTModel`` by
``tests/marian_bridge.py`` (post-LN, ReLU, embeddings times sqrt(d_model), the sinusoidal table's sin/cos halves
bridged by permuting the hidden coordinates of every weight, the output bias in ``final_logits_bias``; the table
there lists every convention). The two models' logits agree to float32 round-off; then
``companion.torch.decoding.greedy_decode`` must give the tokens of ``generate(num_beams=1, do_sample=False)``, and
``batch_beam_search`` and ``beam_search`` with ``length_penalty=0`` those of
``generate(num_beams=k, early_stopping=True, length_penalty=0.0)``, for k = 1 to 5. ``max_len`` in the course and
``max_new_tokens`` in Hugging Face mean the same: the most tokens generated, ``</s>`` included, ``<s>`` (Hugging
Face's decoder start token) not. The search alone is also compared on random score tables fed to both through a
logits processor, so that a model's round-off cannot hide a difference of rules.

Two adjustments of the model, both in the weights (neither model's code is changed):

* PAD gets a ``-inf`` output bias in both. The course's decoder masks every PAD *key*, the prefix included, while
  Marian's masks none in the target; the two agree as long as PAD is never generated. (Marian in transformers 5.24
  does not forbid PAD itself: it has no logit adjustment of its own, the published checkpoints do it with
  ``bad_words_ids`` in their generation config, and a config built from scratch has none. With
  ``forced_eos_token_id=None`` and nothing else set, ``generate`` applies no logits processor at all:
  ``test_generate_applies_no_logits_processor`` checks that its scores are the plain (log-)softmax of the logits.)
* A random network's ``</s>`` hardly depends on the length (it wins at the first step or never), which would leave
  most of the search's rules untried. So the ``</s>`` row of the output layer is fit by least squares to make the
  log-odds of ``</s>`` grow by 1.5 per generated token: hypotheses finish at different steps, some ``</s>`` rank
  too low to finish, and some sentences reach ``max_len``
  (``test_the_sentences_exercise_every_rule_of_the_search`` counts each).

**Hugging Face's ``early_stopping``** (``generation/utils.py``, ``_beam_search``, ``_check_early_stop_heuristic``,
``_beam_search_has_unfinished_sequences``, ``_update_finished_beams``). Each sentence keeps a pool of the
``num_beams`` best finished hypotheses; an extension ending with ``</s>`` enters it only if it ranks within the best
``num_beams`` of the ``2 * num_beams`` candidates of its step, and at ``max_length`` the best ``num_beams``
candidates enter whatever their last token. The values differ in when a sentence stops:

* ``True``: as soon as the pool holds ``num_beams`` hypotheses; after that nothing enters it. This is the course's
  rule (``companion.decoding``: stop once ``k`` hypotheses have finished).
* ``False`` (``GenerationConfig``'s default): once the pool is full, go on while the best running beam, divided by
  ``(cur_len - decoder_prompt_len) ** length_penalty`` (its *current* length), still beats the worst hypothesis in
  the pool. With ``length_penalty = 0`` this is exact, since a running beam's score can only fall: the search stops
  when no running beam can enter the pool. With ``length_penalty > 0`` it is a heuristic (a longer hypothesis's
  normalized score can still rise).
* ``"never"``: like ``False``, but with ``length_penalty > 0`` the best running score is divided by the largest
  possible length, ``max_length - decoder_prompt_len``: the canonical beam search, which stops only when no running
  beam can improve the pool. With ``length_penalty <= 0`` it is the same as ``False``.

So with ``early_stopping=False`` Hugging Face may keep searching after the course has stopped, and return a
hypothesis with a higher score (one still running when the ``k``-th finished): ``SEARCH_ON_TABLE`` is such a case,
and ``test_early_stopping_false_may_search_on`` counts how often it happens on the model's sentences (informative:
never asserted equal; the longer search's answer is only asserted to score at least as high).

**The one difference found, and fixed.** When a sentence's ``k``-th hypothesis finishes *at* step ``max_len``,
``generate`` ends that step's best ``k`` candidates all at once (its max-length criterion finishes them whatever
their last token), so a live extension ranked above the ``</s>`` that filled the pool competes, and wins if it
beats every finished score. ``companion/decoding.py`` once counted such a sentence as done and returned the best
*finished* hypothesis (2 of 400 random-table sentences differed, widths 2 and 4); it now lets the live beams of a
sentence that took the last step compete. ``generate_rule`` computes ``generate``'s answer from the course's own
trace of the same scores; the tests assert that ``generate`` follows it and that the course gives the same
answer everywhere. ``POOL_FILLS_AT_MAX_LEN`` is the minimal case (two beams, two steps).

**Length penalties.** Hugging Face ranks a finished hypothesis by ``sum_logprobs / length ** length_penalty`` with
``length = cur_len + 1 - decoder_prompt_len``: for an encoder-decoder the decoder prompt is the start token, so the
length counts the generated tokens, ``</s>`` included, the start token excluded (checked below through
``sequences_scores``). The course divides by GNMT's ``((5 + length) / 6) ** alpha``
(``companion.decoding.length_normalized``, Wu et al. 2016) with the same length. Both are 1 at alpha 0, where the
searches agree exactly; with alpha != 0 they can pick different hypotheses from the same pool
(``test_length_penalties_rank_differently_on_a_constructed_table``).
"""

from __future__ import annotations

import marian_bridge
import numpy as np
import pytest
import torch

from companion import decoding
from companion.torch import Transformer
from companion.torch import decoding as torch_decoding
from companion.torch.masking import causal_mask
from companion.torch.positional import sinusoidal_positional_encoding

transformers = pytest.importorskip("transformers")

PAD, BOS, EOS = 0, 2, 3  # companion.text.Vocabulary's order: <pad>, <unk>, <s>, </s>
SRC_VOCAB, TGT_VOCAB, D_MODEL, NUM_HEADS, NUM_LAYERS, D_FF, MAX_LEN = 37, 41, 32, 4, 2, 64, 40
MAX_NEW = 8  # most tokens generated, </s> included: the course's max_len, Hugging Face's max_new_tokens
WIDTHS = [1, 2, 3, 4, 5]
NUM_SENTENCES = 24


def _sources(count: int, seed: int) -> torch.Tensor:
    """``(count, longest)`` random source ids (no special tokens), 3 to 10 real tokens each, PAD after them."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(3, 11, size=count)
    src = np.full((count, lengths.max()), PAD)
    for row, length in enumerate(lengths):
        src[row, :length] = rng.integers(4, SRC_VOCAB, size=length)
    return torch.as_tensor(src)


SRC = _sources(NUM_SENTENCES, seed=0)


@torch.no_grad()
def _course_model() -> Transformer:
    """The course's Transformer with random weights of unit scale, PAD's output bias -inf, and a ``</s>`` row fit
    so that ``</s>`` becomes likely after about 7 tokens (see the module docstring)."""
    torch.manual_seed(0)
    model = Transformer(SRC_VOCAB, TGT_VOCAB, D_MODEL, NUM_HEADS, NUM_LAYERS, D_FF, MAX_LEN, dropout=0.0).eval()
    generator = torch.Generator().manual_seed(1)
    for name, p in model.named_parameters():
        if p.dim() > 1:  # every matrix, fan-in scaled: activations of order 1, logits far from flat
            p.copy_(torch.randn(p.shape, generator=generator) / p.shape[1] ** 0.5)
        elif name.endswith("norm.weight"):  # LayerNorm gamma: not all ones, so the permutation is tested
            p.copy_(1 + 0.3 * torch.randn(p.shape, generator=generator))
        else:  # biases and LayerNorm beta
            p.copy_(0.1 * torch.randn(p.shape, generator=generator))
    model.tgt_embed.embedding.weight.mul_(0.3)  # the positions dominate the decoder's input
    model.generator.weight.mul_(1.5)
    model.generator.bias[PAD] = float("-inf")
    # The </s> row: least squares on teacher-forced random targets, log-odds of </s> = 1.5 * (tokens - 7).
    model.generator.bias[EOS] = float("-inf")
    targets = torch.randint(4, TGT_VOCAB, (NUM_SENTENCES, MAX_NEW), generator=generator)
    targets[:, 0] = BOS
    memory, src_mask = model.encode(SRC)
    hidden = model.decoder(model.positional(model.tgt_embed(targets)), memory, causal_mask(MAX_NEW), src_mask)
    others = torch.logsumexp(model.generator(hidden), dim=-1)  # (batch, steps): every token but </s>
    wanted = others + 1.5 * (torch.arange(1, MAX_NEW + 1) - 7.0)
    # No bias column: a LayerNorm's output already spans the constants. Ridge (a little): weights of order 1.
    features = torch.cat([hidden.reshape(-1, D_MODEL), 0.1 * torch.eye(D_MODEL)]).double()
    goal = torch.cat([wanted.reshape(-1), torch.zeros(D_MODEL)]).double()
    model.generator.weight[EOS] = torch.linalg.lstsq(features, goal[:, None]).solution[:, 0].float()
    model.generator.bias[EOS] = 0.0
    return model


@pytest.fixture(scope="module")
def models():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: more threads only wait for each other (and for other processes)
    ours = _course_model()
    torch.manual_seed(2)  # Marian's own random initialisation, overwritten by the bridge
    theirs = marian_bridge.marian_twin(ours, PAD, BOS, EOS)
    yield ours, theirs
    torch.set_num_threads(threads)


# ---------------------------------------------------------------------------------------------------------------
# Helpers: Hugging Face's calls, and both outputs as lists of tokens
# ---------------------------------------------------------------------------------------------------------------


@torch.no_grad()
def _generate(hf, src: torch.Tensor, num_beams: int, max_new_tokens: int = MAX_NEW, **kwargs):
    if num_beams > 1:
        kwargs.setdefault("early_stopping", True)
        kwargs.setdefault("length_penalty", 0.0)
    return hf.generate(
        input_ids=src, attention_mask=(src != PAD).long(), do_sample=False, num_beams=num_beams,
        max_new_tokens=max_new_tokens, **kwargs,
    )


def _until_eos(tokens: list[int]) -> list[int]:
    """Tokens up to the first ``</s>`` (kept); without one, the tokens less their trailing PAD."""
    if EOS in tokens:
        return tokens[: tokens.index(EOS) + 1]
    while tokens and tokens[-1] == PAD:
        tokens = tokens[:-1]
    return tokens


def course_tokens(ids: torch.Tensor) -> list[list[int]]:
    """The course's output ``(batch, out_len)`` (no ``<s>``; PAD after ``</s>``) -> one list per sentence."""
    return [_until_eos(row) for row in ids.tolist()]


def hf_tokens(sequences: torch.Tensor) -> list[list[int]]:
    """``generate``'s output -> one list per sentence: the decoder start token dropped, and whatever fills the row
    after ``</s>`` (PAD in greedy search; in beam search ``</s>`` itself, since 5.24 fills with ``pad_token_id or
    eos_token_id`` and a PAD of 0 is falsy)."""
    assert (sequences[:, 0] == BOS).all()
    return [_until_eos(row[1:]) for row in sequences.tolist()]


def count_differences(ours: list[list[int]], theirs: list[list[int]]) -> tuple[int, int, int]:
    """(sentences that differ, token positions that differ, tokens compared), over the longer of each pair."""
    sentences = tokens = total = 0
    for a, b in zip(ours, theirs, strict=True):
        length = max(len(a), len(b))
        a_, b_ = a + [None] * (length - len(a)), b + [None] * (length - len(b))
        differ = sum(x != y for x, y in zip(a_, b_, strict=True))
        sentences, tokens, total = sentences + (differ > 0), tokens + differ, total + length
    return sentences, tokens, total


def _report(what: str, ours: list[list[int]], theirs: list[list[int]], max_len: int = MAX_NEW) -> tuple[int, int]:
    sentences, tokens, total = count_differences(ours, theirs)
    ended = sum(bool(t) and t[-1] == EOS for t in ours)
    print(f"{what}: {sentences} of {len(ours)} sentences and {tokens} of {total} tokens differ "
          f"({ended} end with </s>, {len(ours) - ended} stop at max_len={max_len})")
    return sentences, tokens


# ---------------------------------------------------------------------------------------------------------------
# The bridge: same weights, same logits
# ---------------------------------------------------------------------------------------------------------------


def test_sinusoid_tables_differ_by_the_permutation(models):
    _, hf = models
    ours = sinusoidal_positional_encoding(MAX_LEN, D_MODEL)
    perm = marian_bridge.halves_from_interleaved(D_MODEL)
    assert perm.tolist()[:3] == [0, 2, 4] and perm.tolist()[D_MODEL // 2 : D_MODEL // 2 + 3] == [1, 3, 5]
    for table in (hf.model.encoder.embed_positions.weight, hf.model.decoder.embed_positions.weight):
        assert not torch.allclose(table, ours, atol=1e-3)  # interleaved against halves
        torch.testing.assert_close(table, ours[:, perm], atol=1e-6, rtol=0)


def test_every_marian_weight_comes_from_the_course_model(models):
    ours, hf = models
    written = marian_bridge.copy_to_marian(ours, hf)  # the same numbers again
    assert len(written) == len(set(written))
    expected = {n for n, _ in hf.named_parameters() if "embed_positions" not in n} | {"final_logits_bias"}
    assert set(written) == expected
    sizes = dict(hf.named_parameters()) | dict(hf.named_buffers())
    assert sum(sizes[n].numel() for n in written) == sum(p.numel() for p in ours.parameters())


def test_logits_agree_on_a_padded_batch(models):
    ours, hf = models
    assert (SRC == PAD).any()
    words = torch.randint(4, TGT_VOCAB, (NUM_SENTENCES, 8), generator=torch.Generator().manual_seed(3))
    tgt = torch.cat([torch.full((NUM_SENTENCES, 1), BOS), words], dim=1)
    with torch.no_grad():
        expected = ours(SRC, tgt)
        actual = hf(input_ids=SRC, attention_mask=(SRC != PAD).long(), decoder_input_ids=tgt).logits
    finite = torch.isfinite(expected)
    assert torch.equal(finite, torch.isfinite(actual))
    assert not finite[..., PAD].any() and finite[..., [t for t in range(TGT_VOCAB) if t != PAD]].all()
    difference = (expected[finite] - actual[finite]).abs().max().item()
    print(f"max |logit difference| = {difference:.2e} (logits' std {expected[finite].std():.2f})")
    assert difference < 1e-4
    assert expected[finite].std() > 1  # not flat: the argmax is decided by the weights, not by round-off


def test_generate_applies_no_logits_processor(models):
    """``generate``'s scores are the logits themselves (greedy) or their log-softmax (beam search): no forced
    ``</s>``, minimum length, banned words or repetition rule changes a score."""
    _, hf = models
    greedy = _generate(hf, SRC, 1, output_scores=True, output_logits=True, return_dict_in_generate=True)
    for scores, logits in zip(greedy.scores, greedy.logits, strict=True):
        assert torch.equal(scores, logits)
    beams = _generate(hf, SRC, 3, output_scores=True, output_logits=True, return_dict_in_generate=True)
    for scores, logits in zip(beams.scores, beams.logits, strict=True):
        assert torch.equal(scores, torch.log_softmax(logits, dim=-1))


# ---------------------------------------------------------------------------------------------------------------
# Decoding on the model: greedy and beam search
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("use_cache", [False, True], ids=["plain", "cached"])
def test_greedy_decode_equals_generate(models, use_cache):
    ours, hf = models
    expected = hf_tokens(_generate(hf, SRC, 1))
    actual = course_tokens(torch_decoding.greedy_decode(ours, SRC, BOS, EOS, MAX_NEW, use_cache=use_cache))
    assert _report(f"greedy ({'cached' if use_cache else 'plain'})", actual, expected) == (0, 0)


def course_search(scorer, beam_size: int, max_len: int) -> tuple[list[int], list]:
    """``companion.decoding.beam_search_from_scores`` at ``length_penalty=0``, for one sentence, with its trace."""
    trace: list = []
    answer = decoding.beam_search_from_scores(scorer, BOS, EOS, beam_size, max_len, length_penalty=0.0, trace=trace)
    return answer, trace


def generate_rule(trace: list, beam_size: int, max_len: int) -> list[int]:
    """What ``generate(num_beams=beam_size, early_stopping=True, length_penalty=0.0)`` returns, read off the
    course's trace of the same scores: the best of the finished hypotheses and, if the sentence was still open at
    step ``max_len``, of the best ``beam_size`` candidates of that step whatever their last token (Hugging Face's
    ``MaxLengthCriteria`` finishes all of them, and they enter the pool in rank order like ``</s>`` extensions).

    The course differs in one case: when its ``beam_size``-th hypothesis finishes *at* step ``max_len``, the sentence
    counts as done and the live beams of that step do not compete (``companion/decoding.py``:
    ``finished[b] if done[b] else finished[b] + alive[b]``); see ``test_live_beams_compete_at_max_len``."""
    pool = [(score, tokens) for step in trace for score, tokens, fate in step if fate == "finished"]
    if len(trace) == max_len:  # still open at the last step
        pool += [(score, tokens) for score, tokens, fate in trace[-1][:beam_size] if fate != "finished"]
    return max(pool, key=lambda item: item[0])[1][1:]


def model_scorer(model: Transformer, src_row: torch.Tensor):
    """One sentence's next-token log-probabilities from the course model, as ``companion.torch.decoding`` computes
    them: ``prefixes (beams, steps)`` -> ``(beams, vocab)``."""
    with torch.no_grad():
        memory, src_mask = model.encode(src_row[None])

    @torch.no_grad()
    def scores(prefixes: np.ndarray) -> np.ndarray:
        ys = torch.as_tensor(prefixes).long()
        logits = model.decode(ys, memory.expand(len(ys), -1, -1), src_mask.expand(len(ys), -1, -1, -1))
        return torch.log_softmax(logits[:, -1].float(), dim=-1).numpy()

    return scores


def compare_with_rule(
    what: str, ours: list[list[int]], theirs: list[list[int]], rule: list[list[int]], max_len: int = MAX_NEW
) -> int:
    """Asserts Hugging Face's answers are the rule's and the course's are the same. Prints the counts; returns the
    number of sentences where the course differs from the rule (0)."""
    assert count_differences(rule, theirs)[:2] == (0, 0), f"{what}: generate does not follow generate_rule"
    _report(what, ours, theirs, max_len)
    known = [i for i, (a, b) in enumerate(zip(ours, rule, strict=True)) if a != b]
    print(f"{what}: {len(known)} of {len(ours)} sentences differ from generate")
    assert not known and ours == theirs
    return len(known)


@pytest.mark.parametrize("beam_size", WIDTHS)
def test_beam_search_equals_generate_with_early_stopping(models, beam_size):
    ours, hf = models
    theirs = hf_tokens(_generate(hf, SRC, beam_size))
    batched = course_tokens(
        torch_decoding.batch_beam_search(ours, SRC, BOS, EOS, beam_size, MAX_NEW, length_penalty=0.0)
    )
    one_by_one = course_tokens(
        torch_decoding.beam_search(ours, SRC, BOS, EOS, beam_size, MAX_NEW, length_penalty=0.0, use_cache=True)
    )
    traced = [course_search(model_scorer(ours, row), beam_size, MAX_NEW) for row in SRC]
    assert batched == one_by_one == [answer for answer, _ in traced]
    rule = [generate_rule(trace, beam_size, MAX_NEW) for _, trace in traced]
    compare_with_rule(f"beam {beam_size} (batch_beam_search and beam_search)", batched, theirs, rule)


def test_the_sentences_exercise_every_rule_of_the_search(models):
    """Over the widths 2 to 5 the comparison above meets every rule: a ``</s>`` within the best k finishes a
    hypothesis, one ranked lower is dropped, a sentence stops with k finished, another at ``max_len``."""
    ours, _ = models
    finished = dropped = ended = unended = 0
    for beam_size in WIDTHS[1:]:
        for row in SRC:
            answer, trace = course_search(model_scorer(ours, row), beam_size, MAX_NEW)
            fates = [(tokens[-1] == EOS, fate) for step in trace for _, tokens, fate in step]
            finished += fates.count((True, "finished"))
            dropped += fates.count((True, "dropped"))
            ended, unended = ended + (answer[-1] == EOS), unended + (answer[-1] != EOS)
    print(f"widths 2-5: {finished} </s> finished a hypothesis, {dropped} ranked too low and were dropped; "
          f"{ended} answers end with </s>, {unended} stop at max_len")
    assert finished > 0 and dropped > 0 and ended > 0 and unended > 0


@pytest.mark.parametrize("early_stopping", [False, "never"], ids=str)
def test_early_stopping_false_may_search_on(models, early_stopping):
    """Informative: how often ``early_stopping=False`` (or ``"never"``) returns other tokens than ``True``, the
    course's rule. Where they differ, the longer search found a hypothesis with a higher log-probability."""
    _, hf = models
    total = 0
    for beam_size in WIDTHS[1:]:
        stop = _generate(hf, SRC, beam_size, output_scores=True, return_dict_in_generate=True)
        search_on = _generate(hf, SRC, beam_size, early_stopping=early_stopping, output_scores=True,
                              return_dict_in_generate=True)
        sentences, tokens, _ = count_differences(hf_tokens(stop.sequences), hf_tokens(search_on.sequences))
        print(f"early_stopping={early_stopping!r}, beam {beam_size}: {sentences} of {NUM_SENTENCES} sentences "
              f"({tokens} tokens) differ from early_stopping=True")
        total += sentences
        # At length_penalty 0 the pool only gains: the answer can only get better (up to float32 round-off).
        assert (search_on.sequences_scores >= stop.sequences_scores - 1e-4).all()
    print(f"early_stopping={early_stopping!r}: {total} of {NUM_SENTENCES * (len(WIDTHS) - 1)} answers differ")


# ---------------------------------------------------------------------------------------------------------------
# The search alone: score tables fed to both searches
# ---------------------------------------------------------------------------------------------------------------


class TableScores(transformers.LogitsProcessor):
    """Replaces the model's scores by ``table(sentence, prefix)``: Hugging Face's search then runs on the same
    log-probabilities as the course's ``batch_beam_search_from_scores``. Row ``r`` of ``generate``'s batch belongs
    to sentence ``r // num_beams``; its prefix starts with the decoder start token, ``<s>``, as the course's does."""

    def __init__(self, table, num_beams: int):
        self.table, self.num_beams = table, num_beams

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        rows = np.arange(input_ids.shape[0]) // self.num_beams
        return torch.as_tensor(self.table(input_ids.numpy(), rows))


class RandomTable:
    """Random next-token log-probabilities (float32) per sentence and prefix; ``</s>``'s log-odds grow with the
    prefix's length and PAD is impossible, as in the model above."""

    def __init__(self, seed: int):
        self.rng, self.cache = np.random.default_rng(seed), {}

    def row(self, sentence: int, prefix: tuple[int, ...]) -> np.ndarray:
        key = (sentence, prefix)
        if key not in self.cache:
            logits = 2.0 * self.rng.normal(size=TGT_VOCAB)
            logits[EOS] += 1.2 * (len(prefix) - 4)
            logits[PAD] = -np.inf
            self.cache[key] = (logits - np.logaddexp.reduce(logits)).astype(np.float32)
        return self.cache[key]

    def __call__(self, prefixes: np.ndarray, rows: np.ndarray) -> np.ndarray:
        return np.stack([self.row(int(r), tuple(int(t) for t in p)) for p, r in zip(prefixes, rows, strict=True)])


@pytest.mark.parametrize("beam_size", WIDTHS)
def test_search_alone_equals_generate_on_random_tables(models, beam_size):
    _, hf = models
    count, max_new = 80, 7
    table = RandomTable(seed=beam_size)
    src = _sources(count, seed=100 + beam_size)  # what Marian encodes: its scores are replaced anyway
    theirs = hf_tokens(_generate(hf, src, beam_size, max_new_tokens=max_new,
                                 logits_processor=transformers.LogitsProcessorList([TableScores(table, beam_size)])))
    ours = decoding.batch_beam_search_from_scores(table, count, BOS, EOS, beam_size, max_new, length_penalty=0.0)
    traced = [course_search(lambda p, s=s: table(p, np.full(len(p), s)), beam_size, max_new) for s in range(count)]
    assert ours == [answer for answer, _ in traced]
    rule = [generate_rule(trace, beam_size, max_new) for _, trace in traced]
    known = compare_with_rule(f"random tables, beam {beam_size}", ours, theirs, rule, max_new)
    search_on = hf_tokens(_generate(hf, src, beam_size, max_new_tokens=max_new, early_stopping=False,
                                    logits_processor=transformers.LogitsProcessorList([TableScores(table, beam_size)])))
    print(f"random tables, beam {beam_size}: early_stopping=False changes {count_differences(theirs, search_on)[0]} "
          f"of {count} answers (informative)")
    assert 0 < sum(t[-1] == EOS for t in ours) < count
    if beam_size == 1:
        assert known == 0  # one beam: the pool is full as soon as one hypothesis finishes


A, B, C, D = 4, 5, 6, 7  # four ordinary target tokens


def _table_from(probabilities: dict[tuple[int, ...], dict[int, float]]):
    """A score table from the probabilities of a few tokens after a few prefixes; the rest of each row's mass is
    spread evenly over the other tokens but PAD, and an unlisted prefix gets ``</s>`` with probability 0.5."""

    def table(prefixes: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        out = np.empty((len(prefixes), TGT_VOCAB), dtype=np.float32)
        for i, prefix in enumerate(prefixes):
            given = probabilities.get(tuple(int(t) for t in prefix), {EOS: 0.5})
            rest = [t for t in range(TGT_VOCAB) if t not in given and t != PAD]
            p = np.zeros(TGT_VOCAB)
            p[list(given)] = list(given.values())
            p[rest] = (1 - sum(given.values())) / len(rest)
            with np.errstate(divide="ignore"):
                out[i] = np.log(p)
        return out

    return table


# Two beams. Step 1: A (0.50) lives, </s> (0.30, second) finishes [</s>] at -1.20, B (0.10) lives. Step 2: A C
# (-0.80) lives, B </s> (-2.41) ranks second and fills the pool: early_stopping=True stops with [</s>]. With False,
# A C still beats the worst finished score (-2.41), so the search goes on: A C </s> (-0.91) enters and wins.
SEARCH_ON_TABLE = _table_from({(BOS,): {A: 0.50, EOS: 0.30, B: 0.10}, (BOS, A): {C: 0.90, EOS: 0.01},
                               (BOS, B): {EOS: 0.90}, (BOS, A, C): {EOS: 0.90}})


@pytest.mark.parametrize("early_stopping", [False, "never"], ids=str)
def test_early_stopping_false_searches_on_on_a_constructed_table(models, early_stopping):
    _, hf = models
    processors = transformers.LogitsProcessorList([TableScores(SEARCH_ON_TABLE, 2)])
    stop = _generate(hf, SRC[:1], 2, max_new_tokens=5, logits_processor=processors)
    search_on = _generate(hf, SRC[:1], 2, max_new_tokens=5, early_stopping=early_stopping, logits_processor=processors)
    assert hf_tokens(stop) == [[EOS]] == [decoding.beam_search_from_scores(SEARCH_ON_TABLE, BOS, EOS, 2, 5, 0.0)]
    assert hf_tokens(search_on) == [[A, C, EOS]]


# Two beams, two steps. Step 1: A (0.60) lives, </s> (0.30, second) finishes [</s>] at -1.20, B (0.05) lives.
# Step 2, the last: A C (-0.56) ranks first, B </s> (-3.10) second: it finishes within the best two, so the pool
# holds two hypotheses. Hugging Face: at max_length the best two candidates all end, A C included: [A C] (-0.56)
# wins over [</s>] (-1.20). The course lets the live beams of the last step compete too.
POOL_FILLS_AT_MAX_LEN = _table_from({(BOS,): {A: 0.60, EOS: 0.30, B: 0.05}, (BOS, A): {C: 0.95, EOS: 0.01},
                                     (BOS, B): {EOS: 0.90}})


def test_generate_lets_live_beams_compete_at_max_len(models):
    """The minimal case of the one difference found: ``generate`` returns the unfinished ``[A C]``, the better
    hypothesis; ``generate_rule`` predicts it; so does the course (it once returned ``[</s>]``)."""
    _, hf = models
    out = _generate(hf, SRC[:1], 2, max_new_tokens=2, output_scores=True, return_dict_in_generate=True,
                    logits_processor=transformers.LogitsProcessorList([TableScores(POOL_FILLS_AT_MAX_LEN, 2)]))
    assert hf_tokens(out.sequences) == [[A, C]]
    assert out.sequences_scores.item() == pytest.approx(np.log(0.60) + np.log(0.95), abs=1e-5)
    answer, trace = course_search(POOL_FILLS_AT_MAX_LEN, 2, 2)
    assert generate_rule(trace, 2, 2) == [A, C]
    assert [fate for _, _, fate in trace[-1][:2]] == ["live", "finished"]
    assert answer == [A, C]
    # One step more and both stop at step 2 with the pool full: the same [</s>].
    longer = _generate(hf, SRC[:1], 2, max_new_tokens=3,
                       logits_processor=transformers.LogitsProcessorList([TableScores(POOL_FILLS_AT_MAX_LEN, 2)]))
    assert hf_tokens(longer) == [[EOS]] == [course_search(POOL_FILLS_AT_MAX_LEN, 2, 3)[0]]


def test_live_beams_compete_at_max_len():
    assert decoding.beam_search_from_scores(POOL_FILLS_AT_MAX_LEN, BOS, EOS, 2, 2, length_penalty=0.0) == [A, C]


# ---------------------------------------------------------------------------------------------------------------
# Length penalties
# ---------------------------------------------------------------------------------------------------------------

# Two beams. Step 1: </s> (0.40) finishes the short hypothesis [</s>], log-prob -0.92; A (0.35) and B (0.20) live
# on. Step 2: A C (-1.16) and B D (-1.71) are the beams (A </s> ranks third: dropped). Step 3: A C </s> ranks first
# and finishes the long hypothesis, log-prob -1.95, 3 tokens; two finished: the search stops.
LENGTH_PENALTY_TABLE = _table_from({(BOS,): {EOS: 0.40, A: 0.35, B: 0.20}, (BOS, A): {C: 0.90, EOS: 0.02},
                                    (BOS, B): {D: 0.90, EOS: 0.02}, (BOS, A, C): {EOS: 0.45},
                                    (BOS, B, D): {EOS: 0.05}})


def test_length_penalties_rank_differently_on_a_constructed_table(models):
    """Same search, same finished pool ``{[</s>]: -0.92, [A C </s>]: -1.95}``; at alpha 1 Hugging Face divides by
    the length (-0.92 against -0.65: the long one wins), GNMT by (5 + length) / 6 (-0.92 against -1.47: the short
    one wins). At alpha 0 both return the short one."""
    _, hf = models
    short, long = [EOS], [A, C, EOS]
    short_score, long_score = np.log(0.40), np.log(0.35) + np.log(0.90) + np.log(0.45)
    src = SRC[:1]
    for alpha, hf_answer, course_answer in [(0.0, short, short), (1.0, long, short)]:
        out = _generate(hf, src, 2, length_penalty=alpha, output_scores=True, return_dict_in_generate=True,
                        logits_processor=transformers.LogitsProcessorList([TableScores(LENGTH_PENALTY_TABLE, 2)]))
        assert hf_tokens(out.sequences) == [hf_answer]
        ours = decoding.beam_search_from_scores(LENGTH_PENALTY_TABLE, BOS, EOS, 2, MAX_NEW, length_penalty=alpha)
        assert ours == course_answer
        # Hugging Face's score: the length is 3 generated tokens (</s> in, the decoder start token out), not 4.
        hf_score = (long_score / 3**alpha) if hf_answer == long else short_score
        assert out.sequences_scores.item() == pytest.approx(hf_score, abs=1e-5)
    at_one = {name: decoding.length_normalized(score, length, 1.0)
              for name, score, length in [("short", short_score, 1), ("long", long_score, 3)]}
    assert at_one["short"] > at_one["long"]  # GNMT at alpha 1 keeps the short one
    assert short_score / 1 < long_score / 3  # Hugging Face's division prefers the long one


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0, 1.5])
def test_length_normalized_is_gnmt(alpha):
    """Wu et al. (2016): ``lp(Y) = (5 + |Y|)**alpha / (5 + 1)**alpha``; the course divides the log-probability by
    it. Hugging Face's ``|Y|**alpha`` grows faster: 3.98 against 1.73 at alpha 0.6 and 10 tokens."""
    for length in range(1, 31):
        for score in (-0.5, -3.0, -12.25):
            gnmt = (5 + length) ** alpha / (5 + 1) ** alpha
            assert decoding.length_normalized(score, length, alpha) == pytest.approx(score / gnmt, rel=1e-12)
    if alpha == 0.6:  # (15 / 6) ** 0.6 = 1.73; length_normalized's docstring says 1.63
        assert round(-1.0 / decoding.length_normalized(-1.0, 10, alpha), 2) == 1.73
        assert round(10**alpha, 2) == 3.98
