"""Beam search (``companion.decoding``) against cases whose answer is known without it: greedy decoding for one
beam, an exhaustive search for a beam as wide as every sequence, the review's four-token counterexample, and the
same tokens from PyTorch and Keras models that hold the same weights.

Hugging Face's ``generate`` is the outside reference for whole models: ``tests/test_generate_reference.py``.
"""

import itertools

import keras
import numpy as np
import pytest
import torch
from keras import ops

from companion import decoding
from companion.convert import copy_weights
from companion.keras import Transformer as KerasTransformer
from companion.keras import decoding as keras_decoding
from companion.torch import Transformer as TorchTransformer
from companion.torch import decoding as torch_decoding

BOS, EOS = 0, 1


class RandomScorer:
    """A language model given as a table: each prefix gets its own random next-token log-probabilities."""

    def __init__(self, vocab: int, seed: int, sharpness: float = 2.0):
        self.vocab, self.rng, self.sharpness, self.table = vocab, np.random.default_rng(seed), sharpness, {}

    def log_probs(self, prefix) -> np.ndarray:
        key = tuple(int(t) for t in prefix)
        if key not in self.table:
            logits = self.rng.normal(size=self.vocab) * self.sharpness
            self.table[key] = logits - np.logaddexp.reduce(logits)
        return self.table[key]

    def __call__(self, prefixes: np.ndarray) -> np.ndarray:
        return np.array([self.log_probs(p) for p in prefixes])


def greedy(scorer: RandomScorer, max_len: int) -> list[int]:
    """Greedy decoding written out: append the arg-max until </s> or max_len tokens."""
    prefix = [BOS]
    for _ in range(max_len):
        prefix.append(int(np.argmax(scorer.log_probs(prefix))))
        if prefix[-1] == EOS:
            break
    return prefix[1:]


def exhaustive_best(scorer: RandomScorer, max_len: int, alpha: float) -> list[int]:
    """The best sequence over all of them: every one ending with </s> within max_len tokens, and every max_len
    tokens long without </s> (what a search that ran out of steps returns), by length-normalized score."""
    best, best_score = None, -np.inf
    others = [t for t in range(scorer.vocab) if t != EOS]
    for length in range(1, max_len + 1):
        for body in itertools.product(others, repeat=length - 1):
            for last in [EOS] if length < max_len else range(scorer.vocab):
                tokens = [*body, last]
                score = sum(scorer.log_probs([BOS, *tokens[:i]])[t] for i, t in enumerate(tokens))
                normalized = decoding.length_normalized(score, length, alpha)
                if normalized > best_score:
                    best, best_score = tokens, normalized
    return best


@pytest.mark.parametrize("seed", range(40))
def test_one_beam_is_greedy_decoding(seed):
    scorer = RandomScorer(vocab=6, seed=seed, sharpness=1.0 + seed % 4)
    for alpha in (0.0, 0.6):
        assert decoding.beam_search_from_scores(scorer, BOS, EOS, 1, 12, alpha) == greedy(scorer, 12)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.5])
def test_a_beam_as_wide_as_every_sequence_finds_the_best_one(seed, alpha):
    vocab, max_len = 4, 4  # 3 tokens besides </s>: 3**3 prefixes of 3 tokens, 108 extensions of them
    scorer = RandomScorer(vocab, seed, sharpness=1.5)
    wide = 2 * vocab**max_len  # every extension ranks within the beam, and fewer than `wide` ever finish
    assert decoding.beam_search_from_scores(scorer, BOS, EOS, wide, max_len, alpha) == exhaustive_best(
        scorer, max_len, alpha
    )


def test_an_end_ranked_below_every_live_beam_ends_nothing():
    # The review's counterexample (ids: 1 <s>, 2 </s>, 3 a, 4 b, 5 c). Greedy: a c </s>, log p = -0.51. A search
    # that finished every </s> among the best 2k extensions stopped at once on "</s>" (rank 3 of 4 with k = 2).
    def scorer(prefixes):
        rows = []
        for p in map(list, prefixes):
            probs = {2: 1e-6, 3: 1e-6, 4: 1e-6, 5: 1e-6}
            if p == [1]:
                probs = {3: 0.7, 4: 0.2, 2: 0.06, 5: 0.04}
            elif p == [1, 3]:
                probs = {5: 0.9, 2: 0.05, 3: 0.03, 4: 0.02}
            elif p == [1, 4]:
                probs = {2: 0.5, 5: 0.3, 3: 0.1, 4: 0.1}
            elif p[-1] == 5:
                probs = {2: 0.95, 3: 0.02, 4: 0.02, 5: 0.01}
            row = np.full(6, 1e-9)
            for token, value in probs.items():
                row[token] = value
            rows.append(np.log(row / row.sum()))
        return np.array(rows)

    for k in (1, 2, 3):
        assert decoding.beam_search_from_scores(scorer, 1, 2, beam_size=k, max_len=5, length_penalty=0.0) == [3, 5, 2]


def test_the_search_stops_once_beam_size_hypotheses_finish():
    calls = []
    scorer = RandomScorer(vocab=5, seed=3)

    def counting(prefixes):
        calls.append(len(prefixes))
        return scorer(prefixes)

    # From every prefix, </s> is by far the likeliest: two beams finish at the first and second steps.
    for key in [(BOS,), *[(BOS, t) for t in range(5)]]:
        row = np.full(5, -8.0)
        row[EOS] = -1e-3
        scorer.table[key] = row
    decoding.beam_search_from_scores(counting, BOS, EOS, beam_size=2, max_len=10, length_penalty=0.0)
    assert len(calls) == 2


@pytest.mark.parametrize("framework", ["torch", "keras"])
def test_one_beam_is_greedy_on_a_model(framework):
    src = np.array([[2, 5, 6, 7, 3], [2, 8, 3, 0, 0], [2, 9, 10, 11, 3]])
    config = dict(d_model=16, num_heads=2, num_layers=1, d_ff=16, max_len=12, dropout=0.0)
    for seed in range(4):
        if framework == "torch":
            torch.manual_seed(seed)
            model = TorchTransformer(12, 12, **config)
            greedy_ids = torch_decoding.greedy_decode(model, src, 2, 3, max_len=8).numpy()
            beam_ids = torch_decoding.batch_beam_search(model, src, 2, 3, beam_size=1, max_len=8).numpy()
        else:
            keras.utils.set_random_seed(seed)
            model = KerasTransformer(12, 12, **config)
            greedy_ids = ops.convert_to_numpy(keras_decoding.greedy_decode(model, src, 2, 3, max_len=8))
            beam_ids = ops.convert_to_numpy(keras_decoding.batch_beam_search(model, src, 2, 3, beam_size=1, max_len=8))
        width = max(greedy_ids.shape[1], beam_ids.shape[1])
        padded = [np.pad(a, ((0, 0), (0, width - a.shape[1]))) for a in (greedy_ids, beam_ids)]
        np.testing.assert_array_equal(padded[0], padded[1])


def test_pytorch_and_keras_find_the_same_tokens():
    src = np.array([[2, 5, 6, 7, 3], [2, 8, 3, 0, 0], [2, 9, 10, 11, 3], [2, 4, 4, 3, 0]])
    config = dict(d_model=16, num_heads=2, num_layers=2, d_ff=32, max_len=16, dropout=0.0)
    torch.manual_seed(5)
    torch_model = TorchTransformer(13, 13, **config).eval()
    keras_model = KerasTransformer(13, 13, **config)
    keras_model(np.zeros((1, 4), "int64"), np.zeros((1, 4), "int64"))  # build the weights
    copy_weights(torch_model, keras_model)
    for beam_size, alpha in [(1, 0.0), (2, 0.6), (3, 0.0), (5, 1.0)]:
        torch_ids = torch_decoding.batch_beam_search(model=torch_model, src_ids=src, bos_id=2, eos_id=3,
                                                     beam_size=beam_size, max_len=10, length_penalty=alpha)
        keras_ids = keras_decoding.batch_beam_search(keras_model, src, 2, 3, beam_size=beam_size, max_len=10,
                                                     length_penalty=alpha)
        np.testing.assert_array_equal(torch_ids.numpy(), ops.convert_to_numpy(keras_ids))


@pytest.mark.parametrize("seed", range(6))
def test_the_trace_records_the_search_without_changing_it(seed):
    scorer = RandomScorer(vocab=7, seed=seed, sharpness=1.5)
    trace = []
    found = decoding.beam_search_from_scores(scorer, BOS, EOS, 3, 8, 0.6, trace=trace)
    assert found == decoding.beam_search_from_scores(scorer, BOS, EOS, 3, 8, 0.6)
    for step in trace:
        scores = [score for score, _, _ in step]
        assert len(step) == 6 and scores == sorted(scores, reverse=True)        # the best 2k, best first
        fates = [fate for _, _, fate in step]
        assert fates.count("live") == 3
        assert all(rank < 3 for rank, (_, tokens, fate) in enumerate(step) if fate == "finished")
        assert all(tokens[-1] == EOS for _, tokens, fate in step if fate == "finished")
    finished = [(score, tokens) for step in trace for score, tokens, fate in step if fate == "finished"]
    best = max(finished, key=lambda item: decoding.length_normalized(item[0], len(item[1]) - 1, 0.6))
    assert len(finished) >= 3 or len(trace) == 8
    if len(finished) >= 3:
        assert best[1][1:] == found
    with pytest.raises(ValueError, match="one sentence"):
        decoding.batch_beam_search_from_scores(lambda p, r: scorer(p), 2, BOS, EOS, trace=[])


def test_the_beam_tree_draws_every_candidate():
    import matplotlib

    matplotlib.use("Agg")
    from companion import search_plots

    scorer = RandomScorer(vocab=6, seed=1)
    trace = []
    found = decoding.beam_search_from_scores(scorer, BOS, EOS, 2, 6, 0.6, trace=trace)
    ax = search_plots.beam_tree(trace, lambda i: f"w{i}", chosen=found)
    labels = [t.get_text() for t in ax.texts]
    assert len(labels) == 1 + sum(len(step) for step in trace)                # <s> and every candidate read
    assert sum(label.count("(") for label in labels) == sum(f == "finished" for s in trace for *_, f in s)
    with pytest.raises(ValueError, match="trace"):
        search_plots.beam_tree([], str)
