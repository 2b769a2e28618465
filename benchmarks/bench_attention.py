"""Speed of the companion MultiHeadAttention against the libraries' own, and the quadratic cost of attention.

    python benchmarks/bench_attention.py                      # ratios, batch 32, length 128, d_model 512, 8 heads
    python benchmarks/bench_attention.py --plot attention.png  # also: time and memory vs sequence length

Each contestant runs one forward + backward pass (gradients for the input and every weight) on the same input,
with the same weights (so the same numbers: checked before timing). Contestants are timed in turn, round after
round, in one process, so a slow-down of the machine hits all of them alike; the ratios use medians.
A ratio of 1.00 means "as fast as the library"; the course's goal is <= 1.10.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere: make `companion` importable

import numpy as np  # noqa: E402
import torch  # noqa: E402


def race(contestants: dict[str, Callable[[], object]], rounds: int, warmup: int = 3) -> dict[str, float]:
    """Median seconds per call of each contestant, timed in turn (order rotated every round)."""
    names = list(contestants)
    for _ in range(warmup):
        for name in names:
            contestants[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            start = time.perf_counter()
            contestants[name]()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


# --- PyTorch --------------------------------------------------------------------------------------------------------


def torch_pair(d_model: int, num_heads: int):
    """The companion MHA and torch.nn.MultiheadAttention with the same weights."""
    from companion.torch import MultiHeadAttention

    ours = MultiHeadAttention(d_model, num_heads)
    theirs = torch.nn.MultiheadAttention(d_model, num_heads, batch_first=True)
    with torch.no_grad():
        theirs.in_proj_weight.copy_(torch.cat([ours.wq.weight, ours.wk.weight, ours.wv.weight]))
        theirs.in_proj_bias.copy_(torch.cat([ours.wq.bias, ours.wk.bias, ours.wv.bias]))
        theirs.out_proj.weight.copy_(ours.wo.weight)
        theirs.out_proj.bias.copy_(ours.wo.bias)
    return ours, theirs


def bench_torch(batch: int, length: int, d_model: int, num_heads: int, rounds: int) -> dict[str, float]:
    ours, theirs = torch_pair(d_model, num_heads)
    x = torch.randn(batch, length, d_model, requires_grad=True)
    lengths = torch.randint(length // 2, length + 1, (batch,))
    keep = torch.arange(length)[None, :] < lengths[:, None]  # (batch, key_len), True = real token
    mask = keep[:, None, None, :]  # ours: (batch, 1, 1, key_len), True = may attend
    blocked = ~keep  # torch.nn.MultiheadAttention: key_padding_mask, True = blocked

    def step(module, **kwargs):
        def run():
            out = module(x, x, x, **kwargs)
            out = out[0] if isinstance(out, tuple) else out
            out.sum().backward()
            x.grad = None
            module.zero_grad(set_to_none=True)

        return run

    with torch.no_grad():  # same numbers before we time anything
        torch.testing.assert_close(ours(x, x, x), theirs(x, x, x, need_weights=False)[0], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(
            ours(x, x, x, mask), theirs(x, x, x, key_padding_mask=blocked, need_weights=False)[0], atol=1e-5, rtol=1e-4
        )
    return race(
        {
            "companion": step(ours),
            "torch.nn.MultiheadAttention": step(theirs, need_weights=False),
            "companion, padding mask": step(ours, mask=mask),
            "torch.nn.MultiheadAttention, padding mask": step(theirs, key_padding_mask=blocked, need_weights=False),
        },
        rounds,
    )


# --- Keras ----------------------------------------------------------------------------------------------------------


def keras_pair(d_model: int, num_heads: int, length: int):
    """The companion Keras MHA and keras.layers.MultiHeadAttention with the same weights."""
    import keras

    from companion.keras import MultiHeadAttention

    ours = MultiHeadAttention(d_model, num_heads)
    theirs = keras.layers.MultiHeadAttention(num_heads, key_dim=d_model // num_heads)
    probe = np.zeros((1, length, d_model), dtype="float32")
    ours(probe, probe, probe)
    theirs(probe, probe, probe)
    d_head = d_model // num_heads
    for mine, other in (("wq", "_query_dense"), ("wk", "_key_dense"), ("wv", "_value_dense")):
        getattr(theirs, other).kernel.assign(np.reshape(getattr(ours, mine).kernel, (d_model, num_heads, d_head)))
        getattr(theirs, other).bias.assign(np.reshape(getattr(ours, mine).bias, (num_heads, d_head)))
    theirs._output_dense.kernel.assign(np.reshape(ours.wo.kernel, (num_heads, d_head, d_model)))
    theirs._output_dense.bias.assign(ours.wo.bias)
    return ours, theirs


def keras_step(layer, x, compiled: bool) -> Callable[[], object]:
    """One forward + backward pass of ``layer(x, x, x)`` on the current Keras backend."""
    import keras

    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        def run(x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                loss = tf.reduce_sum(layer(x, x, x))
            return tape.gradient(loss, [x, *layer.trainable_variables])

        run = tf.function(run) if compiled else run
        x = tf.constant(x)
        return lambda: [g.numpy() for g in run(x)][0]  # .numpy() waits for the result
    if backend == "torch":
        x = torch.tensor(x, requires_grad=True)

        def run_torch():
            layer(x, x, x).sum().backward()
            x.grad = None

        return run_torch
    raise NotImplementedError(f"no benchmark step for the {backend} backend")


def bench_keras(batch: int, length: int, d_model: int, num_heads: int, rounds: int, compiled: bool):
    import keras

    ours, theirs = keras_pair(d_model, num_heads, length)
    x = np.random.default_rng(0).normal(size=(batch, length, d_model)).astype("float32")
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(ours(x, x, x)), keras.ops.convert_to_numpy(theirs(x, x, x)), atol=1e-4
    )
    return race(
        {
            "companion": keras_step(ours, x, compiled),
            "keras.layers.MultiHeadAttention": keras_step(theirs, x, compiled),
        },
        rounds,
    )


# --- cost vs sequence length ----------------------------------------------------------------------------------------

CURVES = {
    "torch-explicit": "torch, explicit (weights materialised)",
    "torch-fused": "torch, fused scaled_dot_product_attention",
    "keras": f"keras ({os.environ.get('KERAS_BACKEND', 'tensorflow')} backend), explicit",
}


def _proc_status_kib(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def reset_peak_rss() -> int:
    """Reset the process's peak resident memory to its current value (Linux) and return that value in KiB.

    Importing the frameworks peaks higher than a small attention step, so without a reset the peak would not move.
    Elsewhere fall back to the lifetime peak (``ru_maxrss``), which under-reports small steps.
    """
    try:
        Path("/proc/self/clear_refs").write_text("5")  # 5 = reset the peak RSS (VmHWM) to the current RSS
        return _proc_status_kib("VmRSS") or 0
    except OSError:
        return _lifetime_peak_kib()


def peak_rss() -> int:
    """Peak resident memory in KiB since the last reset."""
    return _proc_status_kib("VmHWM") or _lifetime_peak_kib()


def _lifetime_peak_kib() -> int:
    import resource  # Unix only, like the rest of the memory measurement

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak // 1024 if sys.platform == "darwin" else peak  # macOS counts bytes, Linux KiB


def probe(curve: str, length: int, batch: int, d_model: int, num_heads: int) -> dict[str, float]:
    """Run in a fresh process: peak RSS growth (MiB) of one forward + backward, then its median time."""
    x = np.random.default_rng(0).normal(size=(batch, length, d_model)).astype("float32")
    if curve == "keras":
        from companion.keras import MultiHeadAttention as KerasMHA

        layer = KerasMHA(d_model, num_heads)
        layer(x[:1, :2], x[:1, :2], x[:1, :2])
        step = keras_step(layer, x, compiled=False)
    else:
        from companion.torch import MultiHeadAttention as TorchMHA

        mha, xt = TorchMHA(d_model, num_heads), torch.tensor(x, requires_grad=True)
        explicit = curve == "torch-explicit"

        def step():
            out = mha(xt, xt, xt, return_weights=explicit)
            (out[0] if explicit else out).sum().backward()

    before = reset_peak_rss()
    step()
    peak = peak_rss()
    seconds = []
    for _ in range(5):
        start = time.perf_counter()
        step()
        seconds.append(time.perf_counter() - start)
    return {"seconds": statistics.median(seconds), "peak_mib": (peak - before) / 1024}


def plot(path: str, lengths: list[int], batch: int, d_model: int, num_heads: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results: dict[str, list[dict[str, float]]] = {curve: [] for curve in CURVES}
    for length in lengths:
        for curve in CURVES:
            command = [sys.executable, __file__, "--probe", curve, "--length", str(length), "--batch", str(batch)]
            command += ["--d-model", str(d_model), "--heads", str(num_heads)]
            result = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
            results[curve].append(result)
            ms, mib = result["seconds"] * 1e3, result["peak_mib"]
            print(f"length {length:5d}  {CURVES[curve]:45s} {ms:9.1f} ms  {mib:8.1f} MiB")
    fig, (ax_time, ax_mem) = plt.subplots(1, 2, figsize=(11, 4.2))
    for curve, label in CURVES.items():
        ax_time.plot(lengths, [r["seconds"] * 1e3 for r in results[curve]], "o-", label=label)
        ax_mem.plot(lengths, [r["peak_mib"] for r in results[curve]], "o-", label=label)
    # A guide proportional to length^2 through the last explicit point: attention's cost is quadratic.
    last = results["torch-explicit"][-1]
    guide = np.array(lengths, dtype=float) ** 2 / lengths[-1] ** 2
    ax_time.plot(lengths, guide * last["seconds"] * 1e3, "k:", label="∝ length²")
    ax_mem.plot(lengths, guide * last["peak_mib"], "k:", label="∝ length²")
    for ax, ylabel in ((ax_time, "forward + backward time (ms)"), (ax_mem, "peak memory growth (MiB, RSS)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(lengths, [str(n) for n in lengths])
        ax.set_yscale("log")
        ax.set_xlabel("sequence length")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    ax_time.legend(fontsize=8)
    fig.suptitle(f"Multi-head self-attention, batch {batch}, d_model {d_model}, {num_heads} heads, CPU float32")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=20, help="timed calls per contestant")
    parser.add_argument("--eager", action="store_true", help="Keras on TensorFlow: do not wrap in tf.function")
    parser.add_argument("--skip-keras", action="store_true")
    parser.add_argument("--plot", metavar="PATH", help="also draw time and memory vs sequence length into PATH")
    parser.add_argument("--plot-lengths", default="64,128,256,512,1024")
    parser.add_argument("--plot-batch", type=int, default=4)
    parser.add_argument("--probe", choices=list(CURVES), help=argparse.SUPPRESS)  # internal: one point of the plot
    args = parser.parse_args()

    if args.probe:
        print(json.dumps(probe(args.probe, args.length, args.batch, args.d_model, args.heads)))
        return
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; float32 on CPU, forward + backward")
    print(f"batch {args.batch}, length {args.length}, d_model {args.d_model}, {args.heads} heads, {args.rounds} rounds")
    shape = (args.batch, args.length, args.d_model, args.heads, args.rounds)
    report(
        "PyTorch",
        bench_torch(*shape),
        [
            ("companion", "torch.nn.MultiheadAttention"),
            ("companion, padding mask", "torch.nn.MultiheadAttention, padding mask"),
        ],
    )
    if not args.skip_keras:
        import keras

        mode = "eager" if args.eager else "tf.function"
        title = f"Keras {keras.__version__} on {keras.backend.backend()}" + (
            f" ({mode})" if keras.backend.backend() == "tensorflow" else ""
        )
        report(title, bench_keras(*shape, compiled=not args.eager), [("companion", "keras.layers.MultiHeadAttention")])
    if args.plot:
        lengths = [int(n) for n in args.plot_lengths.split(",")]
        plot(args.plot, lengths, args.plot_batch, args.d_model, args.heads)


def report(title: str, medians: dict[str, float], pairs: list[tuple[str, str]]) -> None:
    print(f"\n{title}")
    for name, seconds in medians.items():
        print(f"  {name:45s} {seconds * 1e3:8.1f} ms")
    for ours, theirs in pairs:
        ratio = medians[ours] / medians[theirs]
        print(f"  ratio {ours} / {theirs}: {ratio:.2f}  {'ok' if ratio <= 1.10 else 'ABOVE the 1.10 goal'}")


if __name__ == "__main__":
    main()
