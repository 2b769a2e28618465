"""An instructor's extra checks, for `python -m companion.grade ... --extra-checks tests/extra_checks_example.py`.

Such a module is kept away from students (this one is an example, tested by tests/test_grader.py). It runs only in
the grader's trusted process, after an exercise's own check has passed; each function ``check_<exercise id>``
receives the student's object (a proxy: call it like the function) and fails by raising ``AssertionError``. The
report then says "hidden check failed", without the message or any expected value.
"""

import numpy as np


def check_pad_batch(pad_batch):
    """A pad id other than 0, an empty sequence, and a length of 1."""
    for batch, length, pad_id in [([[4, 5], [], [1, 2, 3]], 4, 9), ([[3, 3, 3]], 1, 2)]:
        expected = np.array([(s[:length] + [pad_id] * length)[:length] for s in batch])
        answer = np.asarray(pad_batch([list(s) for s in batch], length, pad_id=pad_id))
        assert answer.shape == expected.shape and (answer == expected).all(), "hidden case"


def check_build_vocabulary(build_vocabulary):
    """Punctuation stays part of a word; an empty list gives an empty vocabulary."""
    assert build_vocabulary([]) == {}
    assert build_vocabulary(["a, b", "a b"]) == {"a,": 1, "b": 2, "a": 3}
