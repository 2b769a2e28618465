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
    assert seed_everything(offset=2, deterministic=False) == 9


@pytest.mark.parametrize("text", ["abc", "1.5", "-1"])
def test_bad_value_is_a_clear_error(monkeypatch, text):
    monkeypatch.setenv("COURSE_SEED", text)
    with pytest.raises(ValueError, match="COURSE_SEED must be a non-negative integer"):
        course_seed()


def test_other_seeds_draw_other_numbers(monkeypatch):
    draws = {}
    for seed in ("0", "1", "0"):
        monkeypatch.setenv("COURSE_SEED", seed)
        seed_everything(deterministic=False)
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


_TRAIN_TWICE = """
import json, sys
import keras, numpy as np, torch
from companion.seed import seed_everything

def train_torch():
    seed_everything()
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(32, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    x, y = torch.randn(64, 8), torch.randn(64, 1)
    for _ in range(20):
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return float(loss)

def train_keras():
    seed_everything()
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dropout(0.2),
                              keras.layers.Dense(1)])
    model.compile(keras.optimizers.Adam(1e-2), "mse")
    x, y = np.random.normal(size=(64, 8)), np.random.normal(size=(64, 1))
    return float(model.fit(x, y, epochs=5, batch_size=16, verbose=0).history["loss"][-1])

print(json.dumps([train_torch(), train_torch(), train_keras(), train_keras(),
                  torch.are_deterministic_algorithms_enabled()]))
"""


def _train_twice(seed: str) -> list:
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "COURSE_SEED": seed, "PYTHONPATH": str(root), "TF_CPP_MIN_LOG_LEVEL": "3",
           "KERAS_BACKEND": "tensorflow"}
    run = subprocess.run([sys.executable, "-c", _TRAIN_TWICE], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_same_seed_same_training_other_seed_other_training():
    # In a fresh process (op determinism and deterministic algorithms are process-wide settings).
    torch_a, torch_b, keras_a, keras_b, deterministic = _train_twice("0")
    assert deterministic
    assert torch_a == torch_b and keras_a == keras_b   # bit for bit, same seed, same machine
    torch_c, _, keras_c, _, _ = _train_twice("1")
    assert torch_c != torch_a and keras_c != keras_a
