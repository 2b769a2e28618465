"""Chapter 7's translation experiments with more training and three seeds: exact match and BLEU per test set,
decoding setting and framework, as mean and spread over the seeds.

The chapter trains each model once, for 300 updates, with seed 0. This script repeats every training with seeds
0, 1, 2 (by default for 600 updates: ``--epochs 10``) and prints, for each framework, a table with one row per
setting and, per test set (``test``: drawn like the training data; ``longer``: more words than any training
sentence; ``numbers``: numbers never seen in training), the mean exact match, its spread (max - min over the
seeds) and the mean BLEU. Settings:

* ``greedy``: the chapter's model, batched greedy decoding;
* ``beam2``, ``beam4``, ``beam8``: the same model, beam search with 2, 4 or 8 beams and length normalization
  (alpha 0.6, as in the paper);
* ``beam4-raw``: the same model, 4 beams, no length normalization (alpha 0);
* ``no-smoothing``: the same recipe with label smoothing 0 instead of 0.1, greedy;
* ``pre-LN``: the same recipe with pre-LN layers (``norm_first=True``) instead of post-LN, greedy;
* ``shared``: the same recipe with one joint vocabulary and ``shared_embeddings=True`` (tied embeddings), greedy;
* ``no-positions``: the same recipe with the positional encoding replaced by dropout alone, greedy.

``--variants`` trains only some of the models (``greedy`` is the one the beam settings decode with).

    python benchmarks/bench_translation.py                          # both frameworks, 3 seeds, 10 epochs
    python benchmarks/bench_translation.py --framework torch --epochs 5 --seeds 0
    python benchmarks/bench_translation.py --variants no-smoothing pre-LN --epochs 1 --seeds 0   # a quick look
    COMPANION_DEVICE=cpu python benchmarks/bench_translation.py     # force the CPU on a GPU machine

Training times are printed too (they depend on what else the machine does: the load average is shown).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("COMPANION_PROGRESS", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

import numpy as np  # noqa: E402
import torch  # noqa: E402  (torch before TensorFlow)

from companion import data, training  # noqa: E402

#: The recipe of notebooks/07_full_model.md.
MODEL = dict(d_model=64, num_heads=4, num_layers=2, d_ff=128, max_len=32, dropout=0.1)
RECIPE = dict(warmup_steps=200, factor=0.5, smoothing=0.1)
SPLITS = ("test", "longer", "numbers")
VARIANTS = ("greedy", "no-smoothing", "pre-LN", "shared", "no-positions")  # one trained model each
BEAMS = {"beam2": dict(beam_size=2), "beam4": dict(beam_size=4), "beam8": dict(beam_size=8),
         "beam4-raw": dict(beam_size=4, length_penalty=0.0)}            # decodings of the ``greedy`` model
SETTINGS = ("greedy", *BEAMS, *VARIANTS[1:])


def load() -> str:
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def train(framework: str, corpus: data.HeldOutSplits, variant: str, epochs: int, seed: int):
    """Train one model; returns (model, src_vocab, tgt_vocab, training module, seconds)."""
    if variant == "shared":
        src_vocab = tgt_vocab = data.build_joint_vocabulary(corpus.train)
    else:
        src_vocab, tgt_vocab = data.build_vocabularies(corpus.train)
    train_src, train_tgt = data.encode_pairs(corpus.train, src_vocab, tgt_vocab)
    config = dict(MODEL, shared_embeddings=variant == "shared", norm_first=variant == "pre-LN")
    if framework == "torch":
        import companion.torch as ct
        from companion.torch import training as framework_training

        torch.manual_seed(seed)
        model = ct.Transformer(len(src_vocab), len(tgt_vocab), **config)
        if variant == "no-positions":
            model.positional = torch.nn.Dropout(MODEL["dropout"])
    else:
        import keras

        import companion.keras as ck
        from companion.keras import training as framework_training

        keras.utils.set_random_seed(seed)
        model = ck.Transformer(len(src_vocab), len(tgt_vocab), **config)
        if variant == "no-positions":
            model.positional = keras.layers.Dropout(MODEL["dropout"])
    recipe = dict(RECIPE, smoothing=0.0) if variant == "no-smoothing" else RECIPE
    trainer = framework_training.Trainer(model, **recipe)
    history = trainer.fit(train_src, train_tgt, epochs=epochs, batch_size=100, seed=seed, progress=False)
    return model, src_vocab, tgt_vocab, framework_training, history["seconds"][0]


def scores(framework_training, model, src_vocab, tgt_vocab, corpus, **decoding) -> dict[str, tuple[float, float]]:
    """{split: (exact match, BLEU)} for one model and one decoding setting."""
    out = {}
    for split in SPLITS:
        pairs = getattr(corpus, split)
        sources, references = [s for s, _ in pairs], [t for _, t in pairs]
        hypotheses = framework_training.translate(model, sources, src_vocab, tgt_vocab, **decoding)
        out[split] = (training.exact_match(hypotheses, references), training.corpus_bleu(hypotheses, references))
    return out


def run_seed(framework: str, corpus, epochs: int, seed: int,
             variants: tuple[str, ...] = VARIANTS) -> dict[str, dict[str, tuple[float, float]]]:
    """{setting: {split: (exact match, BLEU)}} for one framework and one seed."""
    results = {}
    for variant in variants:
        model, src_vocab, tgt_vocab, framework_training, seconds = train(framework, corpus, variant, epochs, seed)
        print(f"  [{framework} seed {seed}] {variant}: trained in {seconds:.0f} s (load {load()})", flush=True)
        results[variant] = scores(framework_training, model, src_vocab, tgt_vocab, corpus)
        if variant == "greedy":
            for setting, decoding in BEAMS.items():
                results[setting] = scores(framework_training, model, src_vocab, tgt_vocab, corpus, **decoding)
    return results


def table(framework: str, per_seed: list[dict]) -> str:
    """Mean exact match (spread over seeds) and mean BLEU, one row per setting, one column group per split."""
    lines = [f"{framework}: exact match % mean (max - min over {len(per_seed)} seeds) / BLEU mean",
             f"{'setting':14}" + "".join(f"{split:>24}" for split in SPLITS)]
    for setting in (s for s in SETTINGS if s in per_seed[0]):
        cells = []
        for split in SPLITS:
            em = np.array([r[setting][split][0] for r in per_seed]) * 100
            bleu = np.array([r[setting][split][1] for r in per_seed])
            cells.append(f"{em.mean():6.1f} ({em.max() - em.min():4.1f}) / {bleu.mean():5.1f}")
        lines.append(f"{setting:14}" + "".join(f"{cell:>24}" for cell in cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--framework", choices=["both", "torch", "keras"], default="both")
    parser.add_argument("--epochs", type=int, default=10, help="passes over the 6000 pairs (5 in the chapter)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS),
                        help="which models to train (all by default)")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    corpus = data.held_out_corpus(num_train=6000, num_validation=500, num_test=1000, num_longer=500,
                                  num_numbers=500, seed=0)
    frameworks = ["torch", "keras"] if args.framework == "both" else [args.framework]
    print(f"{corpus}; model {MODEL}; {args.epochs} epochs of 60 batches of 100; seeds {args.seeds}")
    start = time.perf_counter()
    for framework in frameworks:
        per_seed = []
        for seed in args.seeds:  # the table so far after every seed, so that a long run reports as it goes
            per_seed.append(run_seed(framework, corpus, args.epochs, seed, tuple(args.variants)))
            print("\n" + table(framework, per_seed) + "\n", flush=True)
    print(f"total {time.perf_counter() - start:.0f} s; load average {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
