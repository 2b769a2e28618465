"""Chapter 8's small GPT trained with several seeds: the evidence behind what the chapter concludes.

The chapter trains its GPT once, with ``COURSE_SEED`` (default 0). This script repeats that training for every
seed given (by default 0 to 9), with the chapter's corpus, tokenizer, model size, batches and 600 updates, and
variants that each change one thing:

* ``chapter``: 2 blocks, d_model 64, 4 heads, AdamW (betas 0.9, 0.999; weight decay 0.01) with the chapter's
  schedule: a linear warm-up to 3e-3 over the first 60 updates, then half a cosine down to a tenth of the peak
  (the shape of Karpathy's build-nanogpt);
* ``constant-lr``: the same with a constant learning rate of 3e-3 (no warm-up, no decay): only the schedule differs;
* ``one-cycle``: the same with ``torch.optim.lr_scheduler.OneCycleLR(max_lr=3e-3, pct_start=0.1,
  cycle_momentum=False)``: its rate from 3e-3/25 up to 3e-3 and down to 3e-3/(25 * 1e4), AdamW's betas fixed;
* ``one-cycle-beta1``: OneCycleLR with its default ``cycle_momentum=True``, which also moves AdamW's beta1 from
  0.95 down to 0.85 and back: against ``one-cycle``, only beta1 differs;
* ``d_model-32``: a smaller model (d_model 32, 2 heads, d_ff 128) with the chapter's schedule.

For each run it records the validation loss every 50 steps, the final perplexity and its ratio to the unigram
baseline's; for each variant, the learning rate and beta1 of every update as the optimizer used them (first seed).
For the ``chapter`` model it also records what the chapter says about generation: whether 60 greedy tokens after
"The decoder" repeat a run of 4 tokens (a loop), the share of made-up words (words that never occur in the
training text) in 16 samples of 40 tokens at temperatures 0.7, 1.0 and 1.5, and how many tokens top-p keeps for
the sampling figure's prompt. The result, with its provenance (the corpus files included: chapter 8 trains on the
course's own pages, so an edit of any page changes its model), goes to ``benchmarks/results/gpt_seeds.json``; the
chapter reads it and shows mean and spread.

    python benchmarks/bench_gpt.py            # every variant with seeds 0-9
    python benchmarks/bench_gpt.py --seeds 0 1 --variants chapter --no-write     # a quick look
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from evidence import RESULTS, write_evidence  # noqa: E402

import companion.torch as ct  # noqa: E402
from companion import sampling  # noqa: E402
from companion.bpe import BPE  # noqa: E402
from companion.corpus import course_documents, lm_windows, split_documents, unigram_perplexity  # noqa: E402
from companion.generation_stats import repeats_itself, unknown_word_share, words  # noqa: E402

#: The recipe of notebooks/08_gpt.md.
VOCAB_SIZE, CONTEXT, STEPS, BATCH, PEAK_LR = 512, 64, 600, 32, 3e-3
WARMUP, FLOOR = 60, 0.1     # the chapter's schedule: warm-up updates, and the final rate as a share of the peak
SMALL, CHAPTER_MODEL = dict(d_model=32, num_heads=2, num_layers=2, d_ff=128), dict(d_model=64, num_heads=4,
                                                                                   num_layers=2, d_ff=256)
VARIANTS = {
    "chapter": dict(model=CHAPTER_MODEL, schedule="warmup-cosine"),
    "constant-lr": dict(model=CHAPTER_MODEL, schedule="constant"),
    "one-cycle": dict(model=CHAPTER_MODEL, schedule="one-cycle"),
    "one-cycle-beta1": dict(model=CHAPTER_MODEL, schedule="one-cycle-beta1"),
    "d_model-32": dict(model=SMALL, schedule="warmup-cosine"),
}
TEMPERATURES = (0.7, 1.0, 1.5)
SAMPLE_PROMPT, FIGURE_PROMPT = "The decoder", "The attention weights of each"
TOP_P = (0.5, 0.9)


#: The modules of companion.torch that chapter 8's GPT, its training and its sampling run.
TORCH_MODULES = ("gpt", "addnorm", "attention", "masking", "multihead", "text", "device")


def prepare() -> dict:
    """The chapter's corpus, tokenizer, token streams, windows and unigram baseline (no randomness)."""
    documents = course_documents(exclude=("08_",))
    train_texts, valid_texts = split_documents(documents, valid_fraction=0.1)
    bpe = BPE.train(train_texts, VOCAB_SIZE)
    train_ids = np.array([i for text in train_texts for i in bpe.encode(text)])
    valid_ids = np.array([i for text in valid_texts for i in bpe.encode(text)])
    inputs, targets = lm_windows(train_ids, CONTEXT, stride=CONTEXT // 2)
    valid_inputs, valid_targets = lm_windows(valid_ids, CONTEXT)
    return dict(documents=sorted(documents), bpe=bpe, known=set(words("".join(train_texts))),
                baseline=unigram_perplexity(train_ids, valid_ids, VOCAB_SIZE), inputs=inputs, targets=targets,
                valid_inputs=torch.as_tensor(valid_inputs), valid_targets=torch.as_tensor(valid_targets))


def warmup_cosine(step: int, warmup: int = WARMUP, total: int = STEPS, floor: float = FLOOR) -> float:
    """The chapter's learning rate of update ``step`` (0, 1, ...) as a share of the peak: linear warm-up over
    ``warmup`` updates, then half a cosine from 1 down to ``floor`` at update ``total`` (build-nanogpt's get_lr)."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / (total - warmup))
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def make_schedule(optimizer: torch.optim.Optimizer, kind: str) -> torch.optim.lr_scheduler.LRScheduler | None:
    """The learning-rate scheduler of a variant (None: a constant rate); call its ``step()`` after every update."""
    if kind == "warmup-cosine":
        return torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine)
    if kind in ("one-cycle", "one-cycle-beta1"):
        return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=PEAK_LR, total_steps=STEPS, pct_start=0.1,
                                                   cycle_momentum=kind == "one-cycle-beta1")
    if kind == "constant":
        return None
    raise ValueError(f"unknown schedule {kind!r}")


def validation_loss(model: ct.GPT, corpus: dict) -> float:
    model.eval()
    with torch.no_grad():
        logits = model(corpus["valid_inputs"])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB_SIZE), corpus["valid_targets"].reshape(-1))
    model.train()
    return float(loss)


def train(corpus: dict, seed: int, variant: str) -> tuple[ct.GPT, dict]:
    """The chapter's training cell with ``COURSE_SEED=seed``: the model and what the run measured."""
    from companion.seed import seed_everything

    os.environ["COURSE_SEED"] = str(seed)
    seed_everything()
    recipe = VARIANTS[variant]
    model = ct.GPT(VOCAB_SIZE, **recipe["model"], max_len=CONTEXT, dropout=0.0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=PEAK_LR, weight_decay=0.01)
    schedule = make_schedule(optimizer, recipe["schedule"])
    batches = np.random.default_rng(seed).integers(0, len(corpus["inputs"]), size=(STEPS, BATCH))
    valid_curve, lr, beta1 = [], [], []
    start = time.perf_counter()
    for step, rows in enumerate(batches, start=1):
        logits = model(torch.as_tensor(corpus["inputs"][rows]))
        loss = F.cross_entropy(logits.reshape(-1, VOCAB_SIZE), torch.as_tensor(corpus["targets"][rows]).reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        lr.append(optimizer.param_groups[0]["lr"])          # what this update uses
        beta1.append(optimizer.param_groups[0]["betas"][0])
        optimizer.step()
        if schedule is not None:
            schedule.step()
        if step % 50 == 0:
            valid_curve.append(validation_loss(model, corpus))
    model.eval()
    perplexity = float(np.exp(valid_curve[-1]))
    return model, {"seconds": round(time.perf_counter() - start, 1), "valid_curve": valid_curve,
                   "perplexity": perplexity, "baseline_ratio": corpus["baseline"] / perplexity,
                   "schedule": {"lr": [float(f"{x:.7g}") for x in lr], "beta1": [float(f"{x:.7g}") for x in beta1]}}


def generation(model: ct.GPT, corpus: dict, seed: int) -> dict:
    """What the chapter's generation cells measure, for the trained ``chapter`` model."""
    bpe = corpus["bpe"]
    prompt = torch.as_tensor([bpe.encode(SAMPLE_PROMPT)])
    greedy = ct.generate(model, prompt, 60, temperature=0)[0, prompt.shape[1]:].tolist()
    made_up = {}
    for temperature in TEMPERATURES:
        out = ct.generate(model, prompt.repeat(16, 1), 40, temperature=temperature, seed=seed + 1)
        made_up[str(temperature)] = unknown_word_share([bpe.decode(row[prompt.shape[1]:].tolist()) for row in out],
                                                       corpus["known"])
    with torch.no_grad():
        last = model(torch.as_tensor([bpe.encode(FIGURE_PROMPT)]))[:, -1].numpy().astype(np.float64)
    return {"greedy_repeats_4_tokens": repeats_itself(greedy, 4), "made_up_share": made_up,
            "top_p_kept": {str(p): int(sampling.top_p_mask(last, p).sum()) for p in TOP_P}}


def summary(values: list[float]) -> dict:
    return {"mean": float(np.mean(values)), "std": float(np.std(values, ddof=1)) if len(values) > 1 else 0.0,
            "min": float(np.min(values)), "max": float(np.max(values))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(10)))
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--variant-seeds", type=int, default=10,
                        help="the variants other than `chapter` train with the first this many seeds only")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)   # as the chapter
    corpus = prepare()
    print(f"corpus: {len(corpus['documents'])} documents; unigram baseline perplexity {corpus['baseline']:.1f}")
    runs: dict[str, dict[str, dict]] = {variant: {} for variant in args.variants}
    schedules: dict[str, dict[str, list[float]]] = {}
    started = time.perf_counter()
    for seed in args.seeds:
        for variant in args.variants:
            if variant != "chapter" and seed not in args.seeds[: args.variant_seeds]:
                continue
            model, run = train(corpus, seed, variant)
            schedule = run.pop("schedule")
            if schedules.setdefault(variant, schedule) != schedule:
                raise RuntimeError(f"{variant}: the schedule differs between seeds")
            if variant == "chapter":
                run |= generation(model, corpus, seed)
            runs[variant][str(seed)] = run
            print(f"seed {seed} {variant:12} perplexity {run['perplexity']:6.2f} "
                  f"({run['baseline_ratio']:.2f}x below the baseline) in {run['seconds']:.0f} s"
                  + (f"; greedy loops: {run['greedy_repeats_4_tokens']}, made-up words "
                     f"{run['made_up_share']}, top-p kept {run['top_p_kept']}" if variant == "chapter" else ""),
                  flush=True)
    table = {variant: {"perplexity": summary([r["perplexity"] for r in by_seed.values()]),
                       "baseline_ratio": summary([r["baseline_ratio"] for r in by_seed.values()])}
             for variant, by_seed in runs.items()}
    for variant, row in table.items():
        print(f"{variant:12} perplexity {row['perplexity']['mean']:.2f} ± {row['perplexity']['std']:.2f} "
              f"(min {row['perplexity']['min']:.2f}, max {row['perplexity']['max']:.2f})")
    print(f"{time.perf_counter() - started:.0f} s in all")
    if not args.no_write:
        code = ["benchmarks/bench_gpt.py", *(f"companion/torch/{name}.py" for name in TORCH_MODULES),
                "companion/bpe.py", "companion/corpus.py", "companion/sampling.py", "companion/generation_stats.py",
                "companion/seed.py"]
        out = write_evidence(RESULTS / "gpt_seeds.json",
                             {"baseline": corpus["baseline"], "steps": STEPS, "batch": BATCH, "table": table,
                              "schedules": schedules, "runs": runs},
                             seeds=args.seeds, code=code, data=list(corpus["documents"]),
                             notes="chapter 8's recipe per seed; data: the course's pages the corpus is made of "
                                   "(recorded, not checked: the chapter's claims must hold for any prose edit)")
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
