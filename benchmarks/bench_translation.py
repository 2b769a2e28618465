"""Chapter 7's translation task, end to end in both frameworks: training time, exact match and BLEU.

Trains the chapter's model (d_model 64, 4 heads, 2 + 2 layers, d_ff 128, dropout 0.1) on the toy corpus
(6000 training pairs, 5 epochs of batches of 100 = 300 updates, warm-up 200, factor 0.5, label smoothing 0.1)
with PyTorch and then with Keras, translates the 1000 test sentences with batched greedy decoding and prints,
per framework, the training seconds (and how much of it the first update took), the decoding seconds, the exact
match and the corpus BLEU. Goal (issue 5): exact match >= 95% in both, training under 3 minutes each on a
2-core CPU.

    python benchmarks/bench_translation.py                   # both frameworks, the chapter's recipe
    python benchmarks/bench_translation.py --framework keras --epochs 3
    COMPANION_DEVICE=cpu python benchmarks/bench_translation.py   # force the CPU on a GPU machine

Timings depend on what else the machine is doing: the load average is printed with them.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

import torch  # noqa: E402  (torch before TensorFlow)

from companion import data, training  # noqa: E402

#: The recipe of notebooks/07_full_model.md.
MODEL = dict(d_model=64, num_heads=4, num_layers=2, d_ff=128, max_len=32, dropout=0.1)
RECIPE = dict(warmup_steps=200, factor=0.5, smoothing=0.1)


def load() -> str:
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def run(framework: str, splits: data.Splits, epochs: int, batch_size: int, seed: int) -> dict[str, float]:
    src_vocab, tgt_vocab = data.build_vocabularies(splits.train)
    train_src, train_tgt = data.encode_pairs(splits.train, src_vocab, tgt_vocab)
    valid_src, valid_tgt = data.encode_pairs(splits.validation, src_vocab, tgt_vocab)
    if framework == "torch":
        import companion.torch as ct
        from companion.torch import training as framework_training

        torch.manual_seed(seed)
        model = ct.Transformer(len(src_vocab), len(tgt_vocab), **MODEL)
    else:
        import keras

        import companion.keras as ck
        from companion.keras import training as framework_training

        keras.utils.set_random_seed(seed)
        model = ck.Transformer(len(src_vocab), len(tgt_vocab), **MODEL)
    trainer = framework_training.Trainer(model, **RECIPE)
    history = trainer.fit(train_src, train_tgt, epochs=epochs, batch_size=batch_size, seed=seed,
                          validation=(valid_src, valid_tgt), progress=False)
    sources, references = [s for s, _ in splits.test], [t for _, t in splits.test]
    start = time.perf_counter()
    hypotheses = framework_training.translate(model, sources, src_vocab, tgt_vocab)
    return {
        "train_s": history["seconds"][0],
        "first_step_s": history["first_step_seconds"][0],
        "steps": trainer.step,
        "decode_s": time.perf_counter() - start,
        "val_loss": history["val_loss"][-1],
        "exact_match": training.exact_match(hypotheses, references),
        "bleu": training.corpus_bleu(hypotheses, references),
        "device": str(trainer.device),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--framework", choices=["both", "torch", "keras"], default="both")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (the chapter uses 1)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    splits = data.toy_corpus(num_train=6000, num_validation=500, num_test=1000, seed=0)
    frameworks = ["torch", "keras"] if args.framework == "both" else [args.framework]
    print(f"toy corpus {splits}; model {MODEL}; {args.epochs} epochs of batches of {args.batch}")
    results = {}
    for framework in frameworks:
        print(f"[{framework}] training ... (load average {load()})", flush=True)
        results[framework] = run(framework, splits, args.epochs, args.batch, args.seed)
        r = results[framework]
        print(
            f"[{framework}] {r['steps']} updates in {r['train_s']:.1f} s (first update {r['first_step_s']:.1f} s) "
            f"on {r['device']}; test: exact match {r['exact_match']:.1%}, BLEU {r['bleu']:.1f}, "
            f"decoded in {r['decode_s']:.1f} s; load average {load()}",
            flush=True,
        )
    print("\nframework  train_s  first_step_s  decode_s  exact_match  BLEU")
    for framework, r in results.items():
        print(f"{framework:9} {r['train_s']:8.1f} {r['first_step_s']:13.1f} {r['decode_s']:9.1f} "
              f"{r['exact_match']:12.1%} {r['bleu']:5.1f}")
    failed = [f for f, r in results.items() if r["exact_match"] < 0.95 or r["train_s"] > 180]
    if failed:
        print(f"goal missed (exact match >= 95%, training <= 180 s) by: {', '.join(failed)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
