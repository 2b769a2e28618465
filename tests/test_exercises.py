"""One source for exercises: the stubs are generated from the solutions, solutions pass, stubs fail."""

from pathlib import Path

import numpy as np
import pytest

from companion.checks import CheckFailed, exercises_for, registry, run_check
from companion.instructor import exercises
from companion.notebook_code import load_definitions

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = sorted((ROOT / "solutions").glob("*.md"))


def test_committed_exercises_match_the_generator():
    expected = exercises.expected_exercises(ROOT / "solutions")
    committed = {p.name: p.read_text(encoding="utf-8") for p in (ROOT / "exercises").glob("*.md")}
    assert sorted(committed) == sorted(expected), "exercises/ and solutions/ hold different notebooks"
    stale = [name for name in expected if committed[name] != expected[name]]
    assert not stale, f"exercises out of date, run `make exercises`: {stale}"


def test_generator_replaces_code_and_prose_blocks():
    solution = (
        "---\njupytext: {}\n---\n\n```{code-cell} ipython3\ndef f(x):\n    ### BEGIN SOLUTION\n    return x\n"
        "    ### END SOLUTION\n```\n<!-- BEGIN SOLUTION -->\nsecret\n<!-- END SOLUTION -->\n"
    )
    stub = exercises.make_exercise(solution, "demo.md")
    assert stub.startswith("---\njupytext: {}\n---\n")
    assert '    raise NotImplementedError("Exercise: replace this line with your code")\n' in stub
    assert "return x" not in stub and "secret" not in stub and "SOLUTION" not in stub
    with pytest.raises(ValueError, match="no solution markers"):
        exercises.make_exercise("plain text", "demo.md")
    with pytest.raises(ValueError, match="unbalanced"):
        exercises.make_exercise("### BEGIN SOLUTION\nx\n", "demo.md")


@pytest.mark.parametrize("solution", SOLUTIONS, ids=lambda p: p.stem)
def test_every_exercise_passes_with_the_solution_and_fails_with_the_stub(solution):
    chapter_exercises = exercises_for(solution.stem)
    assert len(chapter_exercises) >= 3, f"{solution.stem} has fewer than 3 registered exercises"
    answers = load_definitions(solution)
    stubs = load_definitions(ROOT / "exercises" / solution.name)
    for item in chapter_exercises:
        run_check(item.id, answers[item.symbol])
        # a find-the-bug stub holds working-looking code with its bug, which the check names instead
        with pytest.raises(CheckFailed):
            run_check(item.id, stubs[item.symbol])


def test_unknown_exercise_and_missing_answer():
    with pytest.raises(KeyError, match="no exercise called"):
        run_check("no_such_exercise", len)
    with pytest.raises(CheckFailed, match="define `pad_batch` first"):
        run_check("pad_batch", None)
    assert all(e.track in ("numpy", "torch", "keras") for e in registry().values())


# Typical wrong answers for chapter 1, each of which must be named in the message.
def _vocab_from_zero(sentences):
    words = [w for s in sentences for w in s.split()]
    return {w: i for i, w in enumerate(dict.fromkeys(words))}


def _vocab_sorted(sentences):
    return {w: i for i, w in enumerate(sorted({w for s in sentences for w in s.split()}), start=1)}


def _pad_left(batch, length, pad_id=0):
    return np.array([[pad_id] * (length - len(s[:length])) + list(s[:length]) for s in batch])


def _truncate_end(batch, length, pad_id=0):
    return np.array([list(s[-length:]) + [pad_id] * (length - len(s[-length:])) for s in batch])


def _one_hot_short(ids, num_words):
    return np.eye(num_words, dtype=np.float32)[ids]


def _embed_unscaled(ids, table):
    import torch

    return torch.nn.functional.one_hot(ids.long(), table.shape[0]).to(table.dtype) @ table


def _vocab_every_word(sentences):
    return {w: i for i, w in enumerate((w for s in sentences for w in s.split()), start=1)}


def _pad_with_zero(batch, length, pad_id=0):
    return np.array([list(s[:length]) + [0] * (length - len(s[:length])) for s in batch])


def _one_hot_first(ids, num_words):
    return np.moveaxis(np.eye(num_words + 1, dtype=np.float32)[ids], -1, 0)


def _one_hot_clipped(ids, num_words):
    return np.eye(num_words, dtype=np.float32)[np.minimum(ids, num_words - 1)]


def _embed_divided(ids, table):
    import torch

    return torch.nn.functional.one_hot(ids.long(), table.shape[0]).to(table.dtype) @ table / table.shape[1] ** 0.5


def _as_numpy_pair(ids, table):
    from keras import ops

    return ops.convert_to_numpy(ids), ops.convert_to_numpy(table)


def _embed_inferred_classes(ids, table):
    import torch

    return torch.nn.functional.one_hot(ids.long()).to(table.dtype) @ table * table.shape[1] ** 0.5


def _embed_divided_numpy(ids, table):
    ids, table = _as_numpy_pair(ids, table)
    return np.eye(table.shape[0], dtype=table.dtype)[ids] @ table / table.shape[1] ** 0.5


def _embed_numpy(ids, table):
    ids, table = _as_numpy_pair(ids, table)
    return np.eye(table.shape[0], dtype=table.dtype)[ids] @ table * table.shape[1] ** 0.5


def _embed_numpy_unscaled(ids, table):
    ids, table = _as_numpy_pair(ids, table)
    return np.eye(table.shape[0], dtype=table.dtype)[ids] @ table


def _embed_detached(ids, table):
    import torch

    return (torch.nn.functional.one_hot(ids.long(), table.shape[0]).to(table.dtype) @ table.detach()
            * table.shape[1] ** 0.5)


def _embed_keras(scale="multiply", stop=False):
    from keras import ops

    def embed_keras(ids, table):
        rows = ops.take(ops.stop_gradient(table) if stop else table, ids, axis=0)
        d_model = table.shape[-1]
        return {"multiply": rows * d_model**0.5, "divide": rows / d_model**0.5, "none": rows}[scale]

    return embed_keras


def _answers_forgot_pad():
    return {"positions_needed": 11, "id_without_position": 11}


def _answers_zero_has_no_position():
    return {"positions_needed": 12, "id_without_position": 0}


def _answers_as_tuple():
    return (12, 11)


def _gradient_as_list(ids, upstream, vocab_size):
    return _gradient_right(ids, upstream, vocab_size).tolist()


def _gradient_right(ids, upstream, vocab_size):
    grad = np.zeros((vocab_size, upstream.shape[-1]))
    np.add.at(grad, ids, upstream)
    return grad


def _gradient_overwritten(ids, upstream, vocab_size):
    grad = np.zeros((vocab_size, upstream.shape[-1]))
    grad[ids] = upstream
    return grad


def _gradient_scaled(ids, upstream, vocab_size):
    return _gradient_right(ids, upstream, vocab_size) * np.sqrt(upstream.shape[-1])


def _pad_list(batch, length, pad_id=0):
    return [list(s[:length]) + [pad_id] * (length - len(s[:length])) for s in batch]


def _one_hot_pad_empty(ids, num_words):
    return np.eye(num_words + 1, dtype=np.float32)[ids] * (ids != 0)[..., None]


def _one_hot_ints(ids, num_words):
    return np.eye(num_words + 1, dtype=np.int64)[ids]


def _answers_as_floats():
    return {"positions_needed": 12.0, "id_without_position": 11.0}


def _embed_torch_in_numpy(ids, table):
    ids, table = ids.numpy(), table.detach().numpy()
    return np.eye(table.shape[0], dtype=table.dtype)[ids] @ table * table.shape[1] ** 0.5


def _vocab_as_pairs(sentences):
    return list(_vocab_sorted(sentences).items())


def _gradient_rows_of_the_batch(ids, upstream, vocab_size):
    return _gradient_right(ids, upstream, int(ids.max()) + 1)


# The mistake classes of the catalogue (companion.instructor.synthetic.mistake_classes counts them).
NAMED_INPUTS = [
    ("one_hot_batch", _one_hot_pad_empty, "your PAD vectors are all zeros"),
    ("embedding_gradient", _gradient_rows_of_the_batch, "a row only up to the largest id of the batch"),
]
STATED_TYPES = [
    ("one_hot_batch", _one_hot_ints, "the text says: a float array\\).*float dtype; got int64"),
    ("one_hot_answers", _answers_as_floats, "positions_needed \\(a dict of two Python ints\\) is an int; got float"),
    ("pad_batch", _pad_list, "return a NumPy integer array"),
    ("embedding_gradient", _gradient_as_list, "NumPy array"),
    ("build_vocabulary", _vocab_as_pairs, "a dictionary from each word to its id\\) is a dict; got list"),
    ("one_hot_answers", _answers_as_tuple, "return a dict"),
    ("embed_torch", _embed_torch_in_numpy, "should be a torch.Tensor; got ndarray"),
    ("embed_keras", _embed_numpy, "should be a Keras tensor"),
    ("fixed_embed_torch", _embed_torch_in_numpy, "should be a torch.Tensor; got ndarray"),
    ("fixed_embed_keras", _embed_numpy, "Keras tensor"),
]
MISTAKE_CLASSES = {"an input the text names": NAMED_INPUTS, "a type the text states": STATED_TYPES}


@pytest.mark.parametrize(
    "exercise_id, wrong, message",
    [
        ("build_vocabulary", _vocab_from_zero, "ids start at 1; 0 stays free for PAD"),
        ("build_vocabulary", _vocab_sorted, "order in which words first appear"),
        ("build_vocabulary", _vocab_every_word, "repeated word got a new id"),
        ("pad_batch", _pad_left, "yours went on the left"),
        ("pad_batch", _truncate_end, "yours kept the end"),
        ("pad_batch", _pad_with_zero, "yours always fills with 0"),
        ("one_hot_batch", _one_hot_short, "one position short"),
        ("one_hot_batch", _one_hot_first, "one-hot axis goes last"),
        ("one_hot_batch", _one_hot_clipped, "one position short"),
        ("embed_torch", _embed_unscaled, "sqrt"),
        ("embed_torch", _embed_divided, "MULTIPLIED by sqrt\\(d_model\\); you divided"),
        ("embed_torch", _embed_detached, "no gradient reaches argument 2"),
        ("embed_keras", _embed_keras("none"), "sqrt"),
        ("embed_keras", _embed_keras("divide"), "MULTIPLIED by sqrt\\(d_model\\); you divided"),
        ("embed_keras", _embed_keras(stop=True), "no gradient reaches argument 2.*stop_gradient"),
        # a graded question, find-the-bug in both tracks, a stretch
        ("one_hot_answers", _answers_forgot_pad, "AND PAD"),
        ("one_hot_answers", _answers_zero_has_no_position, "the largest id does not"),
        ("fixed_embed_torch", _embed_inferred_classes, "num_classes=vocab_size"),   # the bug as handed out
        ("fixed_embed_torch", _embed_unscaled, "sqrt"),
        ("fixed_embed_torch", _embed_divided_numpy, "you divided"),
        ("fixed_embed_torch", _embed_detached, "no gradient reaches"),
        ("fixed_embed_keras", _embed_divided_numpy, "you divided"),                 # the bug as handed out
        ("fixed_embed_keras", _embed_numpy_unscaled, "sqrt"),
        ("embedding_gradient", _gradient_overwritten, "SUM of its upstream"),
        ("embedding_gradient", _gradient_scaled, "without the sqrt"),
    ] + NAMED_INPUTS + STATED_TYPES,
)
def test_typical_mistakes_are_named(exercise_id, wrong, message):
    with pytest.raises(CheckFailed, match=message):
        run_check(exercise_id, wrong)


def test_a_crashing_answer_is_reported_not_raised():
    def broken(batch, length, pad_id=0):
        return 1 / 0

    with pytest.raises(CheckFailed, match="ZeroDivisionError"):
        run_check("pad_batch", broken)


def test_a_find_the_bug_stub_holds_the_buggy_code_uncommented():
    solution = (
        "```{code-cell} ipython3\ndef f(x):\n    ### BEGIN SOLUTION\n    return x + 1\n    ### STUB\n"
        "    # y = x  # kept\n    #\n    # return y - 1\n    ### END SOLUTION\n```\n"
    )
    stub = exercises.make_exercise(solution, "t.md")
    assert "def f(x):\n    y = x  # kept\n\n    return y - 1\n```" in stub
    assert "x + 1" not in stub and "STUB" not in stub and "NotImplementedError" not in stub
    assert exercises.find_the_bug_symbols(solution + solution.replace("def f(", "def g(")) == {"f", "g"}
    assert exercises.find_the_bug_symbols(solution.replace("    ### STUB\n", "").replace("    # ", "    ")) == set()
    with pytest.raises(ValueError, match="commented out"):
        exercises.make_exercise(solution.replace("    # return y - 1", "    return y - 1"), "t.md")
