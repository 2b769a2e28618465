"""The seed knob: COURSE_SEED is read in one place, checked, and really changes what is drawn."""

import numpy as np
import pytest
import torch

from companion.seed import course_seed, seed_everything


def test_default_is_zero(monkeypatch):
    monkeypatch.delenv("COURSE_SEED", raising=False)
    assert course_seed() == 0
    monkeypatch.setenv("COURSE_SEED", " ")
    assert course_seed() == 0


def test_reads_the_variable(monkeypatch):
    monkeypatch.setenv("COURSE_SEED", "7")
    assert course_seed() == 7
    assert seed_everything(offset=2) == 9


@pytest.mark.parametrize("text", ["abc", "1.5", "-1"])
def test_bad_value_is_a_clear_error(monkeypatch, text):
    monkeypatch.setenv("COURSE_SEED", text)
    with pytest.raises(ValueError, match="COURSE_SEED must be a non-negative integer"):
        course_seed()


def test_other_seeds_draw_other_numbers(monkeypatch):
    draws = {}
    for seed in ("0", "1", "0"):
        monkeypatch.setenv("COURSE_SEED", seed)
        seed_everything()
        draws.setdefault(seed, []).append((np.random.rand(3), torch.rand(3)))
    (np0, t0), (np0_again, t0_again) = draws["0"]
    (np1, t1), = draws["1"]
    np.testing.assert_array_equal(np0, np0_again)
    torch.testing.assert_close(t0, t0_again)
    assert not np.allclose(np0, np1) and not torch.allclose(t0, t1)
