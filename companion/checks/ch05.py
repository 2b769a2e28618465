"""Checks for chapter 5, "Positional encoding"."""

from __future__ import annotations

import numpy as np

from companion.checks import CheckFailed, call, exercise, expect_close, rng, to_numpy
from companion.checks.tracks import expect_answer_type, expect_differentiable, expect_type
from companion.reference.positional import sinusoidal_positional_encoding

CHAPTER = "05_positional_encoding"


def encoding_at(positions: np.ndarray, d_model: int, exponent: str = "2i/d") -> np.ndarray:
    """The sinusoidal encoding at arbitrary (even negative) positions, float64: ``(len(positions), d_model)``.

    ``exponent`` builds the variants that typical mistakes produce: "2i/d" is right, "i/d" uses the pair index
    without the factor 2.
    """
    positions = np.asarray(positions, dtype=np.float64)[:, None]
    pair = np.arange(d_model // 2, dtype=np.float64)
    power = {"2i/d": 2 * pair / d_model, "i/d": pair / d_model}[exponent]
    angle = positions / 10000.0**power
    pe = np.empty((positions.shape[0], d_model))
    pe[:, 0::2], pe[:, 1::2] = np.sin(angle), np.cos(angle)
    return pe


def _table_mistakes(max_len: int, d_model: int) -> dict[str, np.ndarray]:
    """What the usual wrong versions of the table look like."""
    pos = np.arange(max_len, dtype=np.float64)[:, None]
    right = encoding_at(np.arange(max_len), d_model)
    column = np.arange(d_model, dtype=np.float64)
    pair = np.arange(d_model // 2, dtype=np.float64)

    swapped = np.empty_like(right)
    swapped[:, 0::2], swapped[:, 1::2] = right[:, 1::2], right[:, 0::2]
    per_column = np.empty_like(right)  # exponent j / d_model with j the column index
    per_column[:, 0::2] = np.sin(pos / 10000.0 ** (column[0::2] / d_model))
    per_column[:, 1::2] = np.cos(pos / 10000.0 ** (column[1::2] / d_model))
    doubled_column = np.empty_like(right)  # exponent 2j / d_model with j the column index
    doubled_column[:, 0::2] = np.sin(pos / 10000.0 ** (2 * column[0::2] / d_model))
    doubled_column[:, 1::2] = np.cos(pos / 10000.0 ** (2 * column[1::2] / d_model))
    multiplied = np.empty_like(right)
    multiplied[:, 0::2] = np.sin(pos * 10000.0 ** (2 * pair / d_model))
    multiplied[:, 1::2] = np.cos(pos * 10000.0 ** (2 * pair / d_model))
    return {
        "the text says: column 2i holds the sine and column 2i + 1 the cosine; in yours sine and cosine are "
        "swapped": swapped,
        "the text says: column 2i holds the sine and column 2i + 1 the cosine of the same angle; yours puts the "
        "sines and cosines in two halves ([sin ... sin, cos ... cos]) instead of interleaving them": np.concatenate(
            [right[:, 0::2], right[:, 1::2]], axis=1
        ),
        "the text says: the angle is pos / 10000**(2i / d_model); in yours the exponent is i / d_model (the factor "
        "2 is missing)": encoding_at(np.arange(max_len), d_model, exponent="i/d"),
        "the text says: columns 2i and 2i + 1 share the angle pos / 10000**(2i / d_model); in yours every column "
        "got its own frequency (exponent j / d_model, j the column index)": per_column,
        "the text says: columns 2i and 2i + 1 use the exponent 2i / d_model; yours used 2j / d_model with j the "
        "column index (use the pair index i = j // 2)": doubled_column,
        "the text says: row pos is position pos, starting at 0; in yours the positions start at 1 (the first row "
        "should be sin 0 = 0, cos 0 = 1)": encoding_at(np.arange(1, max_len + 1), d_model),
        "the text says: sin(pos / 10000**(2i / d_model)); yours multiplied the position by 10000**(2i / d_model)":
            multiplied,
        "the text says: shape (max_len, d_model), row pos for position pos; yours is transposed": right.T,
    }


@exercise(CHAPTER, "positional_encoding", "the sinusoidal table (max_len, d_model): sin in column 2i, cos in 2i + 1")
def check_positional_encoding(positional_encoding) -> None:
    for max_len, d_model in [(10, 4), (50, 16), (7, 6), (40, 64)]:
        result = call(positional_encoding, max_len, d_model)
        expect_close(
            to_numpy(result),
            sinusoidal_positional_encoding(max_len, d_model),
            f"positional_encoding({max_len}, {d_model})",
            mistakes=_table_mistakes(max_len, d_model),
        )
        expect_type(result, "numpy", f"the result of positional_encoding({max_len}, {d_model}) (the text says: a "
                                     "NumPy array)", "float")


@exercise(CHAPTER, "shift_encoding", "move encodings by k positions: rotate each (sin, cos) pair by omega_i * k")
def check_shift_encoding(shift_encoding) -> None:
    generator = rng(5)
    for d_model, k in [(8, 1), (16, 3), (32, 7), (16, -4), (64, 25)]:
        positions = generator.integers(0, 200, size=int(generator.integers(2, 6)))
        pe = encoding_at(positions, d_model)
        answer = call(shift_encoding, pe.copy(), k)
        # A rotation with the i/d frequencies applied to the right rows (not a table of its own):
        omega = 10000.0 ** (-np.arange(d_model // 2) / d_model)
        c, s = np.cos(omega * k), np.sin(omega * k)
        wrong_frequency = np.empty_like(pe)
        wrong_frequency[:, 0::2] = pe[:, 0::2] * c + pe[:, 1::2] * s
        wrong_frequency[:, 1::2] = pe[:, 1::2] * c - pe[:, 0::2] * s
        pe_k = encoding_at(np.array([k]), d_model)
        expect_close(
            answer,
            encoding_at(positions + k, d_model),
            f"shift_encoding(PE at positions {positions.tolist()}, k={k})",
            mistakes={
                "the text says: return the encodings of the positions k further on; you got PE[pos - k]: the "
                "rotation turns the wrong way (check the signs of the sin(omega_i k) terms, and that column 2i is "
                "the sine)": encoding_at(positions - k, d_model),
                "the text says: rotate each (sine, cosine) pair by the angle omega_i k; adding PE[k] does not move "
                "an encoding": pe + pe_k,
                "the text says: rotate each (sine, cosine) pair by the angle omega_i k; multiplying by PE[k] entry "
                "by entry does not move an encoding": pe * pe_k,
                "the text says: omega_i = 10000**(-2i / d_model); your rotation angle used "
                "omega_i = 10000**(-i / d_model)": wrong_frequency,
                "the text says: return the encodings of the positions k further on; yours came back unchanged": pe,
            },
            atol=1e-5,
        )


def _encoder_input_cases():
    generator = rng(6)
    for batch, seq_len, vocab, d_model in [(2, 5, 12, 4), (3, 9, 30, 16), (1, 1, 5, 8), (2, 20, 25, 32)]:
        ids = generator.integers(0, vocab, size=(batch, seq_len))
        table = generator.standard_normal((vocab, d_model)).astype(np.float32)
        yield ids, table


def _check_encoder_input(encoder_input, to_framework, name: str, track: str = "numpy") -> None:
    for ids, table in _encoder_input_cases():
        vocab, d_model = table.shape
        seq_len = ids.shape[1]
        words = table[ids].astype(np.float64)
        pe = encoding_at(np.arange(seq_len), d_model)
        answer = call(encoder_input, *to_framework(ids, table))
        expect_close(
            answer,
            words * np.sqrt(d_model) + pe,
            f"{name}(ids of shape {ids.shape}, table of shape {table.shape})",
            mistakes={
                "the text says: multiply by sqrt(d_model); in yours the sqrt(d_model) factor is missing": words + pe,
                "the text says: MULTIPLY the embeddings by sqrt(d_model); you divided": words / np.sqrt(d_model) + pe,
                "the text says: add the positional encoding; in yours the positional encoding is missing": (
                    words * np.sqrt(d_model)
                ),
                "the text says: multiply the looked-up embeddings by sqrt(d_model), then add the encoding; in yours "
                "the positional encoding was scaled too": (words + pe) * np.sqrt(d_model),
                "the text says: the encoding of positions 0, ..., seq_len - 1; in yours the positions start at 1 (the "
                "first token gets PE[0])": words * np.sqrt(d_model) + encoding_at(np.arange(1, seq_len + 1), d_model),
                "the text says: the encoding of positions 0, ..., seq_len - 1, the same for every sentence; yours was "
                "looked up by token id": words * np.sqrt(d_model)
                + encoding_at(ids.reshape(-1), d_model).reshape(words.shape),
            },
            atol=1e-4,
        )
        expect_type(answer, track, f"the result of {name}", "float")
        if track in ("torch", "keras"):  # the embedding table is trained through this: its gradient must reach it
            expect_differentiable(encoder_input, to_framework(ids, table), f"{name}(ids, table)", (1,), track=track)


@exercise(CHAPTER, "encoder_input_torch", "embedding * sqrt(d_model) + PE[:seq_len], in PyTorch", track="torch")
def check_encoder_input_torch(encoder_input_torch) -> None:
    import torch

    _check_encoder_input(
        encoder_input_torch, lambda i, t: (torch.as_tensor(i), torch.as_tensor(t)), "encoder_input_torch", "torch"
    )


@exercise(CHAPTER, "encoder_input_keras", "embedding * sqrt(d_model) + PE[:seq_len], in Keras", track="keras")
def check_encoder_input_keras(encoder_input_keras) -> None:
    from keras import ops

    _check_encoder_input(
        encoder_input_keras,
        lambda i, t: (ops.convert_to_tensor(i), ops.convert_to_tensor(t)),
        "encoder_input_keras",
        "keras",
    )



# ---------------------------------------------------------------------------------------------------------------
# Warm-up, find-the-bug, stretch and graded prediction
# ---------------------------------------------------------------------------------------------------------------


@exercise(CHAPTER, "angular_frequencies", "omega_i = 10000**(-2i / d_model) for every pair i, shape (d_model / 2,)")
def check_angular_frequencies(angular_frequencies) -> None:
    for d_model in (2, 8, 6, 64, 512):
        answer = call(angular_frequencies, d_model)
        pair = np.arange(d_model // 2, dtype=np.float64)
        column = np.arange(d_model, dtype=np.float64)
        expect_close(
            answer,
            10000.0 ** (-2 * pair / d_model),
            f"angular_frequencies({d_model})",
            mistakes={
                "the text says: omega_i = 10000**(-2i / d_model) with i the pair index; your exponent used "
                "i / d_model": 10000.0 ** (-pair / d_model),
                "the text says: 10000**(-2i / d_model), so the first value is 1 and the last close to 1/10000; in "
                "yours the sign of the exponent is flipped": 10000.0 ** (2 * pair / d_model),
                "the text says: one frequency per pair, shape (d_model / 2,); you gave one per column": (
                    10000.0 ** (-2 * (column // 2) / d_model)
                ),
                "the text says: the exponent is 2i / d_model with i the PAIR index; yours doubled the column index "
                "2i (giving 4i / d_model)": 10000.0 ** (-column[0::2] * 2 / d_model),
                "the text says: the angular frequency omega_i of every pair; these are wavelengths (2 pi / omega)": (
                    2 * np.pi * 10000.0 ** (2 * pair / d_model)
                ),
            },
            atol=1e-7,
            rtol=1e-5,
        )
        expect_type(answer, "numpy", f"the result of angular_frequencies({d_model})", "float")


def _check_add_positions(add_positions, track: str) -> None:
    """Find-the-bug of exercise 5: x + PE[:seq_len] with the frequencies 10000**(-2i / d_model)."""
    from companion.checks.tracks import converter, tolerance

    generator = rng(51)
    name = f"add_positions_{track}"
    # A batch larger than seq_len catches a table sliced by the batch axis; long sequences make the exponent matter.
    for batch, seq_len, d_model in [(2, 30, 16), (5, 3, 8), (1, 1, 4), (3, 50, 32)]:
        x = generator.standard_normal((batch, seq_len, d_model)).astype(np.float32)
        right = encoding_at(np.arange(seq_len), d_model)
        answer = call(add_positions, *converter(track)(x))
        expect_close(
            answer,
            x + right,
            f"{name}(x of shape {x.shape})",
            mistakes={
                "the text says: the frequencies omega_i = 10000**(-2i / d_model) of the chapter; in yours the "
                "exponent is still i / d_model (the colleague's bug: pair index without the factor 2)": (
                    x + encoding_at(np.arange(seq_len), d_model, exponent="i/d")
                ),
                "the text says: return x plus the encoding; in yours the positional encoding is missing": x,
                "the text says: return x plus the encoding; in yours the encoding replaced x": np.broadcast_to(
                    right, x.shape
                ),
                "the text says: the encoding of positions 0, ..., seq_len - 1; in yours the positions start at 1": x
                + encoding_at(np.arange(1, seq_len + 1), d_model),
            },
            **tolerance(track),
        )
        expect_type(answer, track, f"the result of {name}", "float")
        if to_numpy(answer).dtype != np.float32:
            raise CheckFailed(f"the text says: the result keeps the shape and dtype of x; {name} should keep the "
                              f"dtype of x (float32), got {to_numpy(answer).dtype} (cast the encoding to x.dtype)")


@exercise(CHAPTER, "add_positions_torch", "find the bug: x + PE[:seq_len] with 10000**(-2i / d_model), in PyTorch",
          track="torch")
def check_add_positions_torch(add_positions_torch) -> None:
    _check_add_positions(add_positions_torch, "torch")


@exercise(CHAPTER, "add_positions_keras", "find the bug: x + PE[:seq_len] with 10000**(-2i / d_model), in Keras",
          track="keras")
def check_add_positions_keras(add_positions_keras) -> None:
    _check_add_positions(add_positions_keras, "keras")


@exercise(CHAPTER, "offset_similarity", "PE[pos] . PE[pos + k] from the frequencies alone: sum_i cos(omega_i k)")
def check_offset_similarity(offset_similarity) -> None:
    generator = rng(52)
    for d_model, offsets in [(8, [0, 1, 2, 5]), (16, [3, -3, 10]), (64, [0, 7, -20, 100, 1]), (6, [4])]:
        offsets = np.array(offsets)
        answer = call(offset_similarity, d_model, offsets.copy())
        starts = generator.integers(0, 300, size=3)
        # The ground truth: dot products of real encodings, at several starting positions.
        truth = np.array([[encoding_at(np.array([p]), d_model)[0] @ encoding_at(np.array([p + k]), d_model)[0]
                           for k in offsets] for p in starts])
        omega = 10000.0 ** (-2 * np.arange(d_model // 2) / d_model)
        expect_close(
            answer,
            truth[0],
            f"offset_similarity({d_model}, offsets={offsets.tolist()})",
            mistakes={
                "the text says: from the frequencies omega_i = 10000**(-2i / d_model) of exercise 1; yours used the "
                "exponent i / d_model": np.cos(
                    offsets[:, None] * 10000.0 ** (-np.arange(d_model // 2) / d_model)
                ).sum(-1),
                "the text says: the dot product PE_pos . PE_pos+k, which sums over all d_model / 2 pairs; this is "
                "the mean over pairs": np.cos(offsets[:, None] * omega).mean(-1),
                "the text says: each pair contributes sin a sin b + cos a cos b, which is cos(a - b), not sin: sum "
                "cos(omega_i k)": np.sin(offsets[:, None] * omega).sum(-1),
                "the text says: each pair contributes sin a sin b + cos a cos b once; yours counted every pair "
                "twice": 2 * np.cos(offsets[:, None] * omega).sum(-1),
            },
            atol=1e-6,
        )
        assert np.allclose(truth, truth[0], atol=1e-6)  # the property itself: independent of the start
        expect_type(answer, "numpy", "the result of offset_similarity", "float")


@exercise(CHAPTER, "learned_table_outcome", "predict: a learned position table meets a longer sentence")
def check_learned_table_outcome(learned_table_outcome) -> None:
    cases = [(30, 40, 64), (40, 40, 64), (50, 40, 64), (64, 40, 64), (65, 40, 64), (70, 40, 64), (1, 1, 1),
             (2, 1, 1), (10, 5, 10), (11, 10, 10), (6, 5, 10)]
    for seq_len, trained_len, rows in cases:
        answer = call(learned_table_outcome, seq_len, trained_len, rows)
        if seq_len > rows:
            expected, sentence = "error", "some position has no row at all"
        elif seq_len > trained_len:
            expected, sentence = "untrained", "the lookup works, but some rows never received a gradient"
        else:
            expected, sentence = "trained", "every position used has a trained row"
        expect_answer_type(answer, "str", f"learned_table_outcome({seq_len}, {trained_len}, {rows}) (one of the "
                                          "strings 'trained', 'untrained', 'error')")
        if answer not in ("trained", "untrained", "error"):
            raise CheckFailed(f"the text says: return one of the strings 'trained', 'untrained', 'error'; "
                              f"learned_table_outcome({seq_len}, {trained_len}, {rows}) returned {answer!r}")
        if answer != expected:
            hint = ""
            if seq_len == rows and answer == "error":
                hint = " Positions run from 0 to seq_len - 1, so a table of `rows` rows holds seq_len == rows."
            if seq_len == trained_len and answer == "untrained":
                hint = " Training on sentences of trained_len tokens trains positions 0 .. trained_len - 1."
            raise CheckFailed(f"the text says: {expected!r} when {sentence}; learned_table_outcome(seq_len="
                              f"{seq_len}, trained_len={trained_len}, rows={rows}) should be {expected!r}, got "
                              f"{answer!r}.{hint}")
