"""The peak-memory probes of chapter 9 (benchmarks/bench_attention_memory.py) on allocations of known size."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_attention_memory as memory  # noqa: E402

MIB = 2**20


def _one_then_another(empty, size):
    """Two buffers of ``size`` bytes one after the other (the first freed first), then one of twice that, held
    together with a third: the peak is 3 * size."""
    first = empty(size)
    del first
    second = empty(size)
    del second
    both = empty(2 * size), empty(size)
    return len(both)


def test_torch_peak_is_the_highest_total_not_the_sum_of_allocations():
    inputs = torch.zeros(MIB)  # float32, allocated before: not counted
    peak = memory.torch_peak_bytes(_one_then_another, lambda n: torch.empty(n, dtype=torch.uint8), MIB)
    assert peak == 3 * MIB, peak
    assert memory.torch_peak_bytes(lambda x: x.sum(), inputs) < 1024  # a scalar, not the input
    # Summing bytes promotes them to int64: PyTorch makes a temporary copy eight times their size.
    assert memory.torch_peak_bytes(lambda x: x.sum(), inputs.to(torch.uint8)) >= 8 * MIB


def test_numpy_peak_is_the_highest_total_not_the_sum_of_allocations():
    peak = memory.numpy_peak_bytes(_one_then_another, lambda n: np.empty(n, dtype=np.uint8), MIB)
    assert 3 * MIB <= peak < 3 * MIB + 64 * 1024, peak


def test_plain_attention_needs_the_score_matrix_and_online_does_not():
    peaks = memory.measure((512, 1024), head_dim=16, block_size=32)
    for framework in ("numpy", "torch"):
        assert peaks[f"{framework} plain"][1] >= 1024 * 1024 * 8 > 4 * peaks[f"{framework} online"][1], peaks
