"""Checks for chapter 1, "Text as numbers"."""

from __future__ import annotations

import numpy as np

from companion import text
from companion.checks import CheckFailed, call, exercise, expect_close, expect_equal, part, rng, to_numpy, type_name
from companion.checks.tracks import (
    EMBEDDING_SHORTCUTS,
    expect_answer_dict,
    expect_answer_type,
    expect_differentiable,
    expect_type,
)

CHAPTER = "01_text_as_numbers"

_SENTENCE_SETS = [
    text.WORD_BOX_SENTENCES,
    ["the cat sat", "the dog sat down", "a cat and a dog"],
    ["one", "two two", "three three three", "one two three four"],
]


@exercise(CHAPTER, "build_vocabulary", "ids from 1 in order of first appearance; 0 stays for PAD")
def check_build_vocabulary(build_vocabulary) -> None:
    for sentences in _SENTENCE_SETS:
        words = [w for s in sentences for w in s.split()]
        expected = {w: i for i, w in enumerate(dict.fromkeys(words), start=1)}
        answer = call(build_vocabulary, list(sentences))
        expect_answer_type(answer, "dict", "build_vocabulary(...) (a dictionary from each word to its id)")
        expect_equal(
            answer,
            expected,
            f"build_vocabulary({sentences!r})",
            mistakes={
                "the text says: ids start at 1; 0 stays free for PAD": {w: i - 1 for w, i in expected.items()},
                "the text says: ids follow the order in which words first appear; yours follow sorted order": {
                    w: i for i, w in enumerate(sorted(expected), start=1)
                },
                "the text says: a word's id is given when it FIRST appears; a repeated word got a new id": {
                    w: i for i, w in enumerate(words, start=1)
                },
            },
        )


@exercise(CHAPTER, "pad_batch", "pad on the right with 0, truncate on the right, stack into (batch, length)")
def check_pad_batch(pad_batch) -> None:
    generator = rng(1)
    cases = [([[1, 2, 3, 4, 5], [6, 7, 8], [1, 9, 10, 3, 4, 11]], 5, None)]
    for pad_id in (None, 0, 99, None):
        lengths = generator.integers(1, 9, size=generator.integers(1, 5))
        cases.append(([[int(i) for i in generator.integers(1, 50, size=n)] for n in lengths],
                      int(generator.integers(1, 8)), pad_id))
    cases.append(([[3, 1], [5, 6, 7]], 4, 99))  # pad_id matters here: both rows are padded
    for batch, length, pad_id in cases:
        fill = 0 if pad_id is None else pad_id
        expected = np.array([text.pad_or_truncate(s, length, fill) for s in batch])
        arguments = (length,) if pad_id is None else (length, pad_id)
        result = call(pad_batch, [list(s) for s in batch], *arguments)
        answer = to_numpy(result)
        left = np.array([[fill] * (length - len(s[:length])) + list(s[:length]) for s in batch])
        keep_end = np.array([text.pad_or_truncate(s[-length:], length, fill) for s in batch])
        zero_fill = np.array([text.pad_or_truncate(s, length, 0) for s in batch])
        what = f"pad_batch({batch}, {length}{'' if pad_id is None else f', pad_id={pad_id}'})"
        expect_close(
            answer,
            expected,
            what,
            mistakes={
                "the text says: short sequences are filled with pad_id on the RIGHT; yours went on the left": left,
                "the text says: long ones keep their FIRST `length` ids; yours kept the end": keep_end,
                **({"the text says: fill with `pad_id`; yours always fills with 0": zero_fill} if fill else {}),
            },
        )
        if not isinstance(result, np.ndarray):
            raise CheckFailed(f"the text says: return a NumPy integer array; {what} returned {type_name(result)}")
        if not np.issubdtype(answer.dtype, np.integer):
            raise CheckFailed(f"the text says: return a NumPy INTEGER array; got dtype {answer.dtype}")


@exercise(CHAPTER, "one_hot_batch", "ids (batch, length) of a vocabulary of n words -> (batch, length, n + 1)")
def check_one_hot_batch(one_hot_batch) -> None:
    generator = rng(2)
    hint = ("the text says: words are numbered 1 to num_words with 0 for PAD, so there are num_words + 1 ids and "
            "the depth is num_words + 1; your vectors are one position short")
    for shape, num_words in [((3, 5), 11), ((2, 4), 6), ((1, 1), 2)]:
        ids = generator.integers(0, num_words + 1, size=shape)
        ids_without_largest = np.minimum(ids, num_words - 1)
        # The off-by-one depth shows in two ways: an index error on the largest id, or a short last axis.
        try:
            short = call(one_hot_batch, ids_without_largest.copy(), num_words)
        except CheckFailed as failure:
            short = None
            if "IndexError" not in str(failure):
                raise
        if short is not None and to_numpy(short).shape[-1:] == (num_words,):
            raise CheckFailed(f"one_hot_batch(ids of shape {shape}, num_words={num_words}) has shape "
                              f"{tuple(to_numpy(short).shape)}, expected {(*shape, num_words + 1)}. Likely: {hint}")
        ids.flat[0] = num_words  # the largest id must fit
        ids.flat[-1] = 0  # and PAD, which has a vector like any other id
        expected = text.one_hot(ids, num_words + 1)
        try:
            answer = call(one_hot_batch, ids.copy(), num_words)
        except CheckFailed as failure:
            raise CheckFailed(f"{failure}. Likely: {hint}" if "IndexError" in str(failure) else str(failure)) from None
        what = f"one_hot_batch(ids of shape {shape}, num_words={num_words})"
        expect_close(
            answer,
            expected,
            what,
            mistakes={"the text says: the shape is (batch, seq_len, depth): the one-hot axis goes last":
                      np.moveaxis(expected, -1, 0),
                      "the text says: a single 1 per vector, PAD (0) included; your PAD vectors are all zeros (PAD "
                      "has its 1 at position 0)": expected * (ids != 0)[..., None]},
        )
        expect_type(answer, "numpy", f"the result of {what} (the text says: a float array)", "float")


SCALE_MISSING = "the text says: scale the result by sqrt(d_model), as the Transformer does; the factor is missing"
SCALE_DIVIDED = "the text says: the result is MULTIPLIED by sqrt(d_model); you divided"


def _embedding_cases(seed: int):
    generator = rng(seed)
    for batch, length, vocab, d_model in [(2, 5, 12, 4), (3, 7, 20, 8), (1, 1, 5, 3)]:
        ids = generator.integers(0, vocab, size=(batch, length))
        table = generator.standard_normal((vocab, d_model)).astype(np.float32)
        yield ids, table


def _check_embedding(embed, to_framework, name: str, track: str = "numpy") -> None:
    for ids, table in _embedding_cases(3):
        vocab, d_model = table.shape
        expected = table[ids] * np.sqrt(d_model)
        answer = call(embed, *to_framework(ids, table))
        expect_close(
            answer,
            expected,
            f"{name}(ids of shape {ids.shape}, table of shape {table.shape})",
            mistakes={
                SCALE_MISSING: table[ids],
                SCALE_DIVIDED: table[ids] / np.sqrt(d_model),
            },
        )
        expect_type(answer, track, f"the result of {name}", "float")
        if track in ("torch", "keras"):
            expect_differentiable(embed, to_framework(ids, table), f"{name}(ids, table)", (1,), track=track)


@exercise(CHAPTER, "embed_torch", "embedding as one-hot @ table, times sqrt(d_model), in PyTorch", track="torch",
          shortcuts=EMBEDDING_SHORTCUTS)
def check_embed_torch(embed_torch) -> None:
    import torch

    _check_embedding(embed_torch, lambda i, t: (torch.as_tensor(i), torch.as_tensor(t)), "embed_torch", "torch")


@exercise(CHAPTER, "embed_keras", "embedding as one-hot @ table, times sqrt(d_model), in Keras", track="keras",
          shortcuts=EMBEDDING_SHORTCUTS)
def check_embed_keras(embed_keras) -> None:
    from keras import ops

    _check_embedding(embed_keras, lambda i, t: (ops.convert_to_tensor(i), ops.convert_to_tensor(t)), "embed_keras",
                     "keras")


# ---------------------------------------------------------------------------------------------------------------
# A graded question, find-the-bug in both tracks, a stretch
# ---------------------------------------------------------------------------------------------------------------


@exercise(CHAPTER, "one_hot_answers", "graded: the one-hot length an 11-word vocabulary with PAD needs")
def check_one_hot_answers(one_hot_answers) -> None:
    answer = expect_answer_dict(call(one_hot_answers), ("positions_needed", "id_without_position"),
                                "one_hot_answers()")
    with part("positions_needed"):  # each answer is a part: partial credit where the instructor allows it
        expect_equal(answer["positions_needed"], 12, "positions_needed", mistakes={
            "the text says: ids 1 to 11 AND PAD (0) each need a position": 11})
    with part("id_without_position"):
        expect_equal(answer["id_without_position"], 11, "id_without_position", mistakes={
            "vectors of length 11 have positions 0 to 10; PAD (0) has one, the largest id does not": 0})
    for key in ("positions_needed", "id_without_position"):
        expect_answer_type(answer[key], "int", f"{key} (a dict of two Python ints)")


ONE_HOT_HINT = ("the text says: the one-hot vectors are vocab_size long; one_hot without num_classes makes them "
                "only as long as the largest id in the batch plus one, so pass num_classes=vocab_size")


@exercise(CHAPTER, "fixed_embed_torch", "find the bug: embedding as one-hot @ table, in PyTorch", track="torch",
          shortcuts=EMBEDDING_SHORTCUTS)
def check_fixed_embed_torch(fixed_embed_torch) -> None:
    import torch

    ids = np.array([[1, 2, 0], [3, 1, 2]])  # the largest id (3) is below vocab_size - 1
    table = rng(4).standard_normal((6, 4)).astype(np.float32)
    try:
        answer = call(fixed_embed_torch, torch.as_tensor(ids), torch.as_tensor(table))
    except CheckFailed as failure:
        raise CheckFailed(f"{failure}. Likely: {ONE_HOT_HINT}") from None
    expect_close(answer, table[ids] * 2.0, "fixed_embed_torch(ids whose largest id is 3, table (6, 4))", mistakes={
        SCALE_MISSING: table[ids], SCALE_DIVIDED: table[ids] / 2.0})
    _check_embedding(fixed_embed_torch, lambda i, t: (torch.as_tensor(i), torch.as_tensor(t)), "fixed_embed_torch",
                     "torch")


@exercise(CHAPTER, "fixed_embed_keras", "find the bug: embedding as one-hot @ table, in Keras", track="keras",
          shortcuts=EMBEDDING_SHORTCUTS)
def check_fixed_embed_keras(fixed_embed_keras) -> None:
    from keras import ops

    _check_embedding(fixed_embed_keras, lambda i, t: (ops.convert_to_tensor(i), ops.convert_to_tensor(t)),
                     "fixed_embed_keras", "keras")


@exercise(CHAPTER, "embedding_gradient", "stretch: the gradient of an embedding table, rows that repeat add up")
def check_embedding_gradient(embedding_gradient) -> None:
    generator = rng(5)
    for batch, length, vocab, d_model in [(2, 5, 6, 3), (1, 4, 3, 2), (3, 6, 10, 4), (2, 3, 9, 2)]:
        ids = generator.integers(0, vocab, size=(batch, length))
        ids[0, :2] = ids[0, 2]  # a repeated id
        if vocab == 9:  # a batch that lacks the largest ids: the table still has vocab_size rows
            ids = np.minimum(ids, vocab - 4)
        upstream = generator.standard_normal((batch, length, d_model))
        expected = np.zeros((vocab, d_model))
        np.add.at(expected, ids, upstream)
        overwritten = np.zeros((vocab, d_model))
        overwritten[ids] = upstream
        what = f"embedding_gradient(ids {ids.shape}, upstream {upstream.shape}, vocab_size={vocab})"
        answer = call(embedding_gradient, ids.copy(), upstream.copy(), vocab)
        expect_close(answer, expected, what, mistakes={
            "the text says: an id that occurs several times collects the SUM of its upstream gradients; "
            "grad[ids] = upstream keeps only the last one (np.add.at adds them all)": overwritten,
            "the text says: the loss uses table[ids] without the sqrt(d_model) factor": expected * np.sqrt(d_model),
            "the text says: the gradient has shape (vocab_size, d_model), a row for every word, used or not; yours "
            "has a row only up to the largest id of the batch": expected[: ids.max() + 1],
        })
        expect_type(answer, "numpy", f"the result of {what} (the text says: a NumPy array)", "float")
