"""Data-parallel training on CPU: two gloo processes end with the same weights as one process on the same batches."""

import numpy as np
import pytest
import torch
from torch import nn

from companion.torch.distributed import (
    global_batches,
    max_parameter_difference,
    train_data_parallel,
    train_single_process,
)


def tiny_language_model():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    return nn.Sequential(nn.Embedding(40, 16), layer, nn.Linear(16, 40))


@pytest.fixture(scope="module")
def data():
    ids = np.random.default_rng(0).integers(0, 40, size=(48, 9))
    return ids[:, :-1], ids[:, 1:]


@pytest.fixture(scope="module")
def single(data):
    return train_single_process(tiny_language_model(), *data, steps=6, batch_size=8)


@pytest.mark.parametrize("use_ddp", [True, False], ids=["DistributedDataParallel", "all_reduce by hand"])
def test_two_processes_end_with_the_weights_of_one(data, single, use_ddp):
    model = tiny_language_model()
    reference, reference_losses = single
    trained, losses = train_data_parallel(model, *data, steps=6, batch_size=8, world_size=2, use_ddp=use_ddp)
    assert max_parameter_difference(reference, model) > 1e-2  # training moved the weights ...
    assert max_parameter_difference(trained, reference) < 1e-5  # ... by the same amount in both set-ups
    np.testing.assert_allclose(losses, reference_losses, rtol=1e-5)
    assert max_parameter_difference(model, tiny_language_model()) == 0.0  # the caller's model is not changed


def test_batches_and_bad_input(data):
    batches = global_batches(10, 4, steps=5, seed=0)
    assert [len(b) for b in batches] == [4] * 5
    assert sorted(np.concatenate(batches[:2]).tolist() + batches[2][:2].tolist()) == list(range(10))
    with pytest.raises(ValueError, match="multiple of world_size"):
        train_data_parallel(tiny_language_model(), *data, steps=1, batch_size=7, world_size=2)
    with pytest.raises(ValueError, match="optimizer must be one of"):
        train_single_process(tiny_language_model(), *data, steps=1, batch_size=8, optimizer="lion")
    with pytest.raises(ValueError, match=r"\(num_examples, seq_len\)"):
        train_single_process(tiny_language_model(), data[0][0], data[1][0], steps=1, batch_size=8)


def test_keras_mirrored_strategy_on_two_logical_cpus_matches_one_device():
    """tf.distribute must split the CPU before TensorFlow starts, hence a fresh process."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root), "TF_CPP_MIN_LOG_LEVEL": "3", "KERAS_BACKEND": "tensorflow"}
    done = subprocess.run([sys.executable, "-m", "companion.keras.distributed"], capture_output=True, text=True,
                          env=env, cwd=root, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["devices"] == ["/cpu:0", "/cpu:1"]
    assert result["moved"] > 1e-2 and result["difference"] < 1e-5
    assert abs(result["single_loss"] - result["mirrored_loss"]) < 1e-5
