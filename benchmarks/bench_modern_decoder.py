"""Chapter 8's GPT against chapter 9's ModernDecoder on the same corpus, tokenizer, windows and training budget,
over several seeds: validation loss, parameters, training time, and key/value cache bytes per token.

The data is chapter 8's: a byte-level BPE of 512 tokens trained on the course's pages (chapters 8 and 9 left out,
so that neither model reads the pages that evaluate it), windows of 64 tokens, 600 AdamW steps of 32 windows with
a one-cycle learning rate peaking at 3e-3, one CPU thread. Each seed initialises both models and draws both
batch orders from the same seed; the two models alternate seed by seed, so a busy machine slows both alike.

    python benchmarks/bench_modern_decoder.py                      # seeds 0-4, writes the result file
    python benchmarks/bench_modern_decoder.py --seeds 0 1 --steps 100 --no-write
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from anywhere
sys.path.insert(0, str(ROOT / "benchmarks"))

from evidence import write_evidence  # noqa: E402

from companion.bpe import BPE  # noqa: E402
from companion.corpus import course_documents, lm_windows, split_documents  # noqa: E402
from companion.reference import kv_cache_bytes  # noqa: E402
from companion.torch import GPT, ModernDecoder  # noqa: E402

VOCAB_SIZE, CONTEXT, STEPS, BATCH, LEARNING_RATE = 512, 64, 600, 32, 3e-3
GPT_CONFIG = dict(d_model=64, num_heads=4, num_layers=2, d_ff=256, max_len=CONTEXT, dropout=0.0)
MODERN_CONFIG = dict(d_model=64, num_heads=4, num_kv_heads=2, num_layers=2, d_ff=192, max_len=CONTEXT)
RESULT = ROOT / "benchmarks" / "results" / "modern_decoder_seeds.json"
CODE = ["benchmarks/bench_modern_decoder.py", "companion/bpe.py", "companion/corpus.py", "companion/torch/gpt.py",
        "companion/torch/multihead.py", "companion/torch/addnorm.py", "companion/torch/modern_decoder.py",
        "companion/torch/modern.py", "companion/torch/grouped.py"]


def corpus_windows(exclude: tuple[str, ...] = ("08_", "09_")) -> dict[str, np.ndarray]:
    """Chapter 8's data: ``inputs``/``targets`` ``(num_windows, 64)`` with stride 32, the validation windows, and
    the token streams ``train_ids``, ``valid_ids`` they were cut from."""
    train_texts, valid_texts = split_documents(course_documents(exclude=exclude), valid_fraction=0.1)
    bpe = BPE.train(train_texts, VOCAB_SIZE)
    train_ids = np.array([i for text in train_texts for i in bpe.encode(text)])
    valid_ids = np.array([i for text in valid_texts for i in bpe.encode(text)])
    inputs, targets = lm_windows(train_ids, CONTEXT, stride=CONTEXT // 2)
    valid_inputs, valid_targets = lm_windows(valid_ids, CONTEXT)
    return {"inputs": inputs, "targets": targets, "valid_inputs": valid_inputs, "valid_targets": valid_targets,
            "train_ids": train_ids, "valid_ids": valid_ids}


def make_model(kind: str, seed: int) -> torch.nn.Module:
    """``"gpt"`` (chapter 8's configuration) or ``"modern"`` (the same width, depth and heads, about the same
    parameter count), initialised from ``seed``."""
    torch.manual_seed(seed)
    if kind == "gpt":
        return GPT(VOCAB_SIZE, **GPT_CONFIG)
    if kind == "modern":
        return ModernDecoder(VOCAB_SIZE, **MODERN_CONFIG)
    raise ValueError(f"kind must be 'gpt' or 'modern'; got {kind!r}")


def validation_loss(model: torch.nn.Module, data: dict[str, np.ndarray]) -> float:
    """Mean cross-entropy (nats per token) over every validation window."""
    was_training = model.training
    model.eval()
    with torch.no_grad():
        logits = model(torch.as_tensor(data["valid_inputs"]))
        loss = F.cross_entropy(logits.reshape(-1, VOCAB_SIZE), torch.as_tensor(data["valid_targets"]).reshape(-1))
    model.train(was_training)
    return float(loss)


def train(model: torch.nn.Module, data: dict[str, np.ndarray], seed: int, steps: int = STEPS,
          every: int = 50) -> dict[str, object]:
    """Chapter 8's training run: AdamW (weight decay 0.01), one-cycle schedule, batches drawn from ``seed``.

    Returns the final validation loss, the validation curve ``[(step, loss), ...]`` every ``every`` steps, the
    training losses and the seconds spent in training steps.
    """
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=LEARNING_RATE, total_steps=steps, pct_start=0.1)
    batches = np.random.default_rng(seed).integers(0, len(data["inputs"]), size=(steps, BATCH))
    model.train()
    curve, train_losses, seconds = [], [], 0.0
    for step, rows in enumerate(batches, start=1):
        start = time.perf_counter()
        logits = model(torch.as_tensor(data["inputs"][rows]))
        loss = F.cross_entropy(logits.reshape(-1, VOCAB_SIZE), torch.as_tensor(data["targets"][rows]).reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        seconds += time.perf_counter() - start
        train_losses.append(loss.item())
        if step % every == 0 or step == steps:
            curve.append((step, validation_loss(model, data)))
    model.eval()
    return {"valid_loss": curve[-1][1], "curve": curve, "train_losses": train_losses, "seconds": seconds}


def cache_bytes_per_token(kind: str) -> int:
    """float32 key/value cache bytes per token of one sequence: every block keeps a key and a value per kv head."""
    if kind == "gpt":
        heads, head_dim = GPT_CONFIG["num_heads"], GPT_CONFIG["d_model"] // GPT_CONFIG["num_heads"]
        return kv_cache_bytes(GPT_CONFIG["num_layers"], heads, head_dim, 1, bytes_per_number=4)
    head_dim = MODERN_CONFIG["d_model"] // MODERN_CONFIG["num_heads"]
    return kv_cache_bytes(MODERN_CONFIG["num_layers"], MODERN_CONFIG["num_kv_heads"], head_dim, 1, bytes_per_number=4)


def summary(values: list[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(values), "stdev": statistics.stdev(values) if len(values) > 1 else 0.0,
            "min": min(values), "max": max(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--no-write", action="store_true", help="print only, do not write the result file")
    args = parser.parse_args()
    torch.set_num_threads(1)
    data = corpus_windows()
    runs: dict[str, list[dict[str, float]]] = {"gpt": [], "modern": []}
    for seed in args.seeds:
        for kind in runs:
            model = make_model(kind, seed)
            result = train(model, data, seed, args.steps)
            runs[kind].append({"seed": seed, "valid_loss": result["valid_loss"], "seconds": result["seconds"]})
            print(f"seed {seed} {kind:6}: validation loss {result['valid_loss']:.4f}, {result['seconds']:.1f} s",
                  flush=True)
    results = {
        kind: {"parameters": sum(p.numel() for p in make_model(kind, 0).parameters()),
               "cache_bytes_per_token": cache_bytes_per_token(kind),
               "valid_loss": summary([r["valid_loss"] for r in rows]),
               "seconds": summary([r["seconds"] for r in rows]), "runs": rows}
        for kind, rows in runs.items()
    }
    differences = [m["valid_loss"] - g["valid_loss"] for g, m in zip(runs["gpt"], runs["modern"], strict=True)]
    results["difference"] = {"modern_minus_gpt": summary(differences), "per_seed": differences,
                             "modern_better_in": sum(d < 0 for d in differences)}
    results["setup"] = {"vocab_size": VOCAB_SIZE, "context": CONTEXT, "steps": args.steps, "batch": BATCH,
                        "learning_rate": LEARNING_RATE, "gpt": GPT_CONFIG, "modern": MODERN_CONFIG,
                        "training_windows": len(data["inputs"]), "validation_windows": len(data["valid_inputs"])}
    for kind in ("gpt", "modern"):
        loss = results[kind]["valid_loss"]
        print(f"{kind:6}: {results[kind]['parameters']:,} parameters, validation loss {loss['mean']:.4f} "
              f"± {loss['stdev']:.4f} over {len(args.seeds)} seeds")
    diff = results["difference"]["modern_minus_gpt"]
    print(f"modern - gpt: {diff['mean']:+.4f} ± {diff['stdev']:.4f}; modern better in "
          f"{results['difference']['modern_better_in']} of {len(args.seeds)} seeds")
    if not args.no_write:
        write_evidence(RESULT, results, seeds=args.seeds, code=CODE,
                       data=sorted(course_documents(exclude=("08_", "09_"))),
                       notes="torch, one CPU thread; seconds are training-step time on a possibly shared machine")
        print(f"wrote {RESULT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
