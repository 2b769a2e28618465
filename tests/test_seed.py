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


def test_claim_says_what_failed(monkeypatch):
    from companion.seed import claim

    monkeypatch.delenv("COURSE_CLAIMS_LOG", raising=False)
    monkeypatch.setenv("COURSE_SEED", "4")
    claim(True, "beam search helps", "beam 91.0, greedy 90.0")
    with pytest.raises(AssertionError) as failure:
        claim(False, "beam search helps", "beam 89.0, greedy 90.0")
    message = str(failure.value)
    assert "beam search helps" in message and "beam 89.0, greedy 90.0" in message and "COURSE_SEED=4" in message


def test_claims_are_logged_instead_of_raised(monkeypatch, tmp_path):
    import json

    from companion.seed import claim

    log = tmp_path / "claims.jsonl"
    monkeypatch.setenv("COURSE_CLAIMS_LOG", str(log))
    monkeypatch.setenv("COURSE_SEED", "2")
    claim(False, "a wider beam can do worse", "beam 8: 90.1")
    claim(True, "greedy is fast", "2 s")
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(r["claim"], r["holds"], r["seed"]) for r in records] == [
        ("a wider beam can do worse", False, 2), ("greedy is fast", True, 2)]
