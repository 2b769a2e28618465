"""Training-step speed: the companion torch Transformer vs ``torch.nn.Transformer``, in one process.

Both models get the same embeddings, positional encoding and generator (``nn.Transformer`` has none of its own),
the same batch with padding, the same loss and the same optimizer; only the encoder-decoder core differs. One
training step is forward, cross-entropy loss, backward and an Adam step. The two models alternate step by step,
so a busy machine slows both alike, and the ratio of the median step times is printed (goal: <= 1.10).

    python benchmarks/bench_model.py                 # small but representative: d_model 256, 4 heads, 2+2 layers
    python benchmarks/bench_model.py --paper         # the paper's base model: 512, 8 heads, 6+6 layers, d_ff 2048
    python benchmarks/bench_model.py --steps 50 --batch 64 --length 48
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from companion.torch import PositionalEncoding, TokenEmbedding, Transformer, default_device  # noqa: E402
from companion.torch.masking import causal_mask, padding_mask  # noqa: E402

PAD = 0


class TorchNNTransformer(nn.Module):
    """``torch.nn.Transformer`` with the same embeddings, positional encoding and generator as ours.

    ``nn.Transformer`` always ends both stacks with a LayerNorm; for post-LN we remove them, as our post-LN stacks
    (the paper's) have none, so both models do the same arithmetic.
    """

    def __init__(self, vocab: int, d_model: int, num_heads: int, num_layers: int, d_ff: int, dropout: float):
        super().__init__()
        self.src_embed = TokenEmbedding(vocab, d_model)
        self.tgt_embed = TokenEmbedding(vocab, d_model)
        self.positional = PositionalEncoding(d_model, 512, dropout)
        self.core = nn.Transformer(
            d_model, num_heads, num_layers, num_layers, d_ff, dropout, batch_first=True, norm_first=False
        )
        self.core.encoder.norm = None
        self.core.decoder.norm = None
        self.generator = nn.Linear(d_model, vocab)

    def forward(self, src_ids: torch.Tensor, tgt_ids: torch.Tensor) -> torch.Tensor:
        # torch.nn's boolean masks mean "blocked": the negation of ours.
        src_blocked = ~padding_mask(src_ids, PAD)[:, 0, 0]  # (batch, src_len)
        hidden = self.core(
            self.positional(self.src_embed(src_ids)),
            self.positional(self.tgt_embed(tgt_ids)),
            tgt_mask=~causal_mask(tgt_ids.shape[1], tgt_ids.device)[0, 0],  # (tgt_len, tgt_len)
            src_key_padding_mask=src_blocked,
            tgt_key_padding_mask=~padding_mask(tgt_ids, PAD)[:, 0, 0],
            memory_key_padding_mask=src_blocked,
        )
        return self.generator(hidden)


def make_batch(batch: int, length: int, vocab: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """Random ids with a random amount of trailing padding per row (at least half of each row is real)."""
    generator = torch.Generator().manual_seed(0)

    def ids(extra: int) -> torch.Tensor:
        values = torch.randint(1, vocab, (batch, length + extra), generator=generator)
        lengths = torch.randint(length // 2, length + 1, (batch, 1), generator=generator)
        return values.masked_fill(torch.arange(length + extra) >= lengths + extra, PAD)

    src, tgt = ids(0), ids(1)  # target one longer: input tgt[:, :-1], labels tgt[:, 1:]
    return src.to(device), tgt[:, :-1].to(device), tgt[:, 1:].to(device)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: tuple[torch.Tensor, ...]) -> float:
    src, tgt_in, tgt_out = batch
    logits = model(src, tgt_in)  # (batch, tgt_len, vocab)
    loss = nn.functional.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), ignore_index=PAD)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.item()  # also waits for the device to finish


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--paper", action="store_true", help="the paper's base configuration")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=32, help="source and target length")
    parser.add_argument("--vocab", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=30, help="timed steps per model")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per model")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="wall: elapsed time; cpu: this process's CPU time, steadier on a machine shared with other jobs "
        "(use with --threads 1 on CPU)",
    )
    args = parser.parse_args()

    if args.threads:
        torch.set_num_threads(args.threads)
    d_model, num_heads, num_layers, d_ff = (512, 8, 6, 2048) if args.paper else (256, 4, 2, 1024)
    dropout = 0.1
    device = default_device()
    torch.manual_seed(0)
    models = {
        "companion": Transformer(args.vocab, args.vocab, d_model, num_heads, num_layers, d_ff, 512, dropout, PAD),
        "torch.nn": TorchNNTransformer(args.vocab, d_model, num_heads, num_layers, d_ff, dropout),
    }
    sizes = {name: sum(p.numel() for p in model.parameters()) for name, model in models.items()}
    assert sizes["companion"] == sizes["torch.nn"], sizes  # the same network, parameter for parameter
    optimizers = {}
    for name, model in models.items():
        model.to(device).train()
        optimizers[name] = torch.optim.Adam(model.parameters(), lr=1e-4)
    batch = make_batch(args.batch, args.length, args.vocab, device)

    print(
        f"d_model={d_model} heads={num_heads} layers={num_layers}+{num_layers} d_ff={d_ff} vocab={args.vocab} "
        f"batch={args.batch} length={args.length} dropout={dropout} device={device} threads={torch.get_num_threads()}"
        f" parameters={sizes['companion']:,} clock={args.clock}"
    )
    for _ in range(args.warmup):
        for name in models:
            train_step(models[name], optimizers[name], batch)
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    times: dict[str, list[float]] = {name: [] for name in models}
    names = list(models)
    for step in range(args.steps):
        for name in names if step % 2 == 0 else names[::-1]:  # alternate who goes first
            start = clock()
            train_step(models[name], optimizers[name], batch)
            times[name].append(clock() - start)

    medians = {name: statistics.median(values) for name, values in times.items()}
    for name, median in medians.items():
        print(f"{name:>10}: median {median * 1000:8.1f} ms/step  (min {min(times[name]) * 1000:.1f} ms)")
    ratio = medians["companion"] / medians["torch.nn"]
    print(f"ratio companion / torch.nn = {ratio:.3f}  (goal <= 1.10: {'met' if ratio <= 1.10 else 'NOT met'})")


if __name__ == "__main__":
    main()
