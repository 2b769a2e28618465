"""Peak memory of plain attention against the online softmax (FlashAttention's algorithm) as the length grows,
measured in NumPy with ``tracemalloc`` and in PyTorch with the profiler's record of the CPU allocator.

    python benchmarks/bench_attention_memory.py                 # lengths 256 to 4096, one head of width 64
    python benchmarks/bench_attention_memory.py --lengths 512 1024 --block-size 64

What is measured is the memory a call allocates on top of its inputs, at its highest point: the score matrices,
the weights, the running sums and the output. Bytes depend on the dtype and on how a library sizes its
allocations; the growth with the length does not, and that is what the chapter checks.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from anywhere

from companion import reference  # noqa: E402
from companion import torch as ct  # noqa: E402

LENGTHS = (256, 512, 1024, 2048, 4096)
HEAD_DIM, BLOCK_SIZE = 64, 128


def numpy_peak_bytes(fn: Callable, *args) -> int:
    """Bytes that ``fn(*args)`` holds at its highest point, counted by ``tracemalloc`` (NumPy reports every array
    it allocates to it); the inputs, allocated before, are not counted."""
    tracemalloc.start()
    tracemalloc.reset_peak()
    fn(*args)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


@contextlib.contextmanager
def _stderr_silenced() -> Iterator[None]:
    """Send file descriptor 2 to /dev/null: the profiler's C++ library logs its start and stop there."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "wb") as null:
        os.dup2(null.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def torch_peak_bytes(fn: Callable, *args) -> int:
    """Bytes of CPU memory that ``fn(*args)`` holds at its highest point, from PyTorch's profiler.

    With ``profile_memory=True`` the CPU allocator reports every allocation and every release to the profiler,
    each with the total it holds at that moment. The peak is the largest total minus the total just before the
    first allocation, so tensors that existed before the call (its inputs) are not counted.
    """
    with _stderr_silenced(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as recording:
        fn(*args)
    events, stack = [], list(recording.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        stack.extend(event.children)
        if event.tag == torch._C._profiler._EventType.Allocation and str(event.extra_fields.device) == "cpu":
            events.append((event.start_time_ns, event.extra_fields.alloc_size, event.extra_fields.total_allocated))
    if not events:
        return 0
    events.sort()
    before = events[0][2] - events[0][1]  # the total held just before the first allocation
    return max(total for _, _, total in events) - before


def measure(lengths: tuple[int, ...] = LENGTHS, head_dim: int = HEAD_DIM, block_size: int = BLOCK_SIZE,
            seed: int = 0) -> dict[str, list[int]]:
    """Peak bytes of plain and online-softmax attention, NumPy and PyTorch, for queries as many as keys.

    One head, float64, q, k, v ``(1, 1, length, head_dim)`` drawn from ``seed``. Returns lists, one entry per
    length, under ``numpy plain``, ``numpy online``, ``torch plain``, ``torch online``.
    """
    rng = np.random.default_rng(seed)
    peaks: dict[str, list[int]] = {"numpy plain": [], "numpy online": [], "torch plain": [], "torch online": []}
    for n in lengths:
        q, k, v = (rng.normal(size=(1, 1, n, head_dim)) for _ in range(3))
        peaks["numpy plain"].append(numpy_peak_bytes(reference.scaled_dot_product_attention, q, k, v))
        peaks["numpy online"].append(numpy_peak_bytes(reference.online_softmax_attention, q, k, v, None, block_size))
        q, k, v = (torch.from_numpy(x) for x in (q, k, v))
        peaks["torch plain"].append(torch_peak_bytes(ct.scaled_dot_product_attention, q, k, v))
        peaks["torch online"].append(torch_peak_bytes(ct.online_softmax_attention, q, k, v, None, block_size))
    return peaks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS))
    parser.add_argument("--head-dim", type=int, default=HEAD_DIM)
    parser.add_argument("--block-size", type=int, default=BLOCK_SIZE)
    args = parser.parse_args()
    torch.set_num_threads(1)
    peaks = measure(tuple(args.lengths), args.head_dim, args.block_size)
    print(f"{'length':>7} " + " ".join(f"{name + ' MiB':>17}" for name in peaks))
    for index, n in enumerate(args.lengths):
        print(f"{n:7} " + " ".join(f"{values[index] / 2**20:17.2f}" for values in peaks.values()))


if __name__ == "__main__":
    main()
