"""Chapter 7's translation experiments, repeated over several seeds at the chapter's own sizes: the multi-seed
evidence that the chapter's sentences about decoding and about the paper's choices rest on.

For each seed ``s`` the script does what ``notebooks/07_full_model.md`` does with ``COURSE_SEED=s``: the same
corpus (drawn with seed ``s``), the same PyTorch and Keras models (initialised and shuffled with seed ``s``),
300 updates of 100 pairs, then

* greedy decoding of the three test sets (``test``: drawn like the training data; ``longer``: more words than
  any training sentence; ``numbers``: numbers never seen in training), and beam search with 2, 4 and 8 beams
  (length normalization alpha 0.6) and with 4 beams and alpha 0 on the two held-out sets;
* what the chapter reads off the greedy translations: exact match per held-out number, how the models write
  "ninety one", wrong sentences by kind, search versus model errors (PyTorch), and where the last decoder layer's
  cross-attention looks (the alignments the chapter asserts);
* the chapter's comparison of the paper's choices: small models (d_model 32, 180 updates), one per setting
  (baseline, no label smoothing, pre-LN, no positions, shared embeddings) and one more that the chapter does not
  train live, the same peak learning rate without the warm-up.

The results go to ``benchmarks/results/translation_seeds.json`` with their provenance (``evidence.py``); the
chapter reads its multi-seed tables from that file.

    python benchmarks/bench_translation.py --seeds 0 1 2 3 4           # the committed file (both frameworks)
    python benchmarks/bench_translation.py --seeds 0 --no-write          # a quick look at one seed

Times depend on the machine's load, which is printed with them.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("COMPANION_PROGRESS", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402  (torch before TensorFlow)
from evidence import RESULTS, write_evidence  # noqa: E402

from companion import data, errors, training  # noqa: E402

#: The sizes and recipes of notebooks/07_full_model.md.
CORPUS = dict(num_train=6000, num_validation=500, num_test=1000, num_longer=300, num_numbers=300, max_train_tokens=10)
MODEL = dict(d_model=64, num_heads=4, num_layers=2, d_ff=128, max_len=32, dropout=0.1)
RECIPE = dict(warmup_steps=200, factor=0.5, smoothing=0.1)
EPOCHS, BATCH = 5, 100
SMALL = dict(MODEL, d_model=32, d_ff=64)
SMALL_RECIPE = dict(warmup_steps=100, factor=0.5, smoothing=0.1)
SMALL_EPOCHS = 3
SPLITS = ("test", "longer", "numbers")
HELD_OUT = ("longer", "numbers")
DECODINGS = {"2 beams": dict(beam_size=2), "4 beams": dict(beam_size=4), "8 beams": dict(beam_size=8),
             "4 beams, alpha 0": dict(beam_size=4, length_penalty=0.0)}
#: The comparison's settings: changes to the small model's configuration and recipe.
SETTINGS = {
    "baseline": {},
    "no label smoothing": {"smoothing": 0.0},
    "pre-LN": {"norm_first": True},
    "no positions": {"positions": False},
    "shared embeddings": {"shared_embeddings": True},
    # lr = factor' / sqrt(d_model * step) from step 1: the warm-up schedule's peak, reached at once, same decay
    "no warm-up": {"warmup_steps": 1, "factor": SMALL_RECIPE["factor"] / math.sqrt(SMALL_RECIPE["warmup_steps"])},
}
FRAMEWORKS = ("PyTorch", "Keras")
#: The code the results depend on (hashed into the provenance).
CODE = ["benchmarks/bench_translation.py", "companion/data.py", "companion/text.py", "companion/training.py",
        "companion/decoding.py", "companion/errors.py"] + [
    f"companion/{framework}/{name}.py" for framework in ("torch", "keras")
    for name in ("addnorm", "attention", "decoding", "device", "kv_cache", "masking", "model", "multihead",
                 "positional", "text", "training")]


def load() -> str:
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def framework_modules(framework: str):
    """(model package, training module) of one framework."""
    if framework == "PyTorch":
        import companion.torch as ct
        from companion.torch import training as torch_training
        return ct, torch_training
    import companion.keras as ck
    from companion.keras import training as keras_training
    return ck, keras_training


def build(framework: str, vocabs, config: dict, seed: int, positions: bool = True):
    """A Transformer of ``config`` initialised with ``seed``, as the chapter builds it."""
    package, _ = framework_modules(framework)
    if framework == "PyTorch":
        torch.manual_seed(seed)
        model = package.Transformer(len(vocabs[0]), len(vocabs[1]), **config)
        if not positions:
            model.positional = torch.nn.Dropout(config["dropout"])
    else:
        import keras

        keras.utils.set_random_seed(seed)
        model = package.Transformer(len(vocabs[0]), len(vocabs[1]), **config)
        if not positions:
            model.positional = keras.layers.Dropout(config["dropout"])
    return model


def scores(framework: str, model, corpus, vocabs, splits=SPLITS, **decoding):
    """{split: [exact match, BLEU]} and {split: translations} for one model and one decoding setting."""
    _, framework_training = framework_modules(framework)
    rows, outputs = {}, {}
    for split in splits:
        pairs = getattr(corpus, split)
        hypotheses = framework_training.translate(model, [s for s, _ in pairs], *vocabs, **decoding)
        references = [t for _, t in pairs]
        rows[split] = [training.exact_match(hypotheses, references), training.corpus_bleu(hypotheses, references)]
        outputs[split] = hypotheses
    return rows, outputs


def last_layer_cross_attention(framework: str, model, sources, targets, vocabs):
    """Cross-attention of the last decoder layer, mean of the heads, with ``targets`` as the decoder's output:
    ``(num_sentences, tgt_len, src_len)``; row i is the query that produced target token i."""
    src = data.encode_sentences(sources, vocabs[0])
    tgt = data.encode_sentences(targets, vocabs[1])
    if framework == "PyTorch":
        model.eval()
        with torch.no_grad():
            memory, mask = model.encode(torch.as_tensor(src))
            _, _, cross = model.decode(torch.as_tensor(tgt[:, :-1]), memory, mask, return_weights=True)
        return cross[-1].mean(dim=1).numpy()
    from keras import ops

    memory, mask = model.encode(src.astype("int32"))
    _, _, cross = model.decode(tgt[:, :-1].astype("int32"), memory, mask, return_weights=True)
    return ops.convert_to_numpy(ops.mean(cross[-1], axis=1))


def aligned_words(framework, model, sources, targets, vocabs):
    """For each sentence, [(target token, the source token it attends to most)] up to and including </s>."""
    weights = last_layer_cross_attention(framework, model, sources, targets, vocabs)
    out = []
    for row, (source, target) in enumerate(zip(sources, targets, strict=True)):
        src_tokens = ["<s>", *source.split(), "</s>"]
        tgt_tokens = [*target.split(), "</s>"]
        best = weights[row, : len(tgt_tokens), : len(src_tokens)].argmax(axis=1)
        out.append([(t, src_tokens[b]) for t, b in zip(tgt_tokens, best, strict=True)])
    return out


def share(hits: list[bool]) -> float | None:
    return sum(hits) / len(hits) if hits else None


def alignment_shares(framework, model, corpus, vocabs, outputs) -> dict[str, float | None]:
    """How often the last layer's strongest cross-attention lands where the chapter says it does."""
    moving = {row[0]: row for row in data.ADJECTIVES_AFTER}
    noun_of = {word: row for row in data.NOUNS for word in row[:2]}
    sources = [s for s, _ in corpus.test]
    test_aligned = aligned_words(framework, model, sources, outputs["test"], vocabs)
    pas, ne, end, noun_hits, adjective_hits = [], [], [], [], []
    for source, pairs in zip(sources, test_aligned, strict=True):
        words = source.split()
        for target, looked_at in pairs:
            if target == "pas":
                pas.append(looked_at == "not")
            elif target == "ne" and "not" in words:
                ne.append(looked_at in ("not", "does", "do"))
            elif target == "</s>":
                end.append(looked_at in ("<s>", "</s>"))
        for adjective, noun in zip(words, words[1:], strict=False):
            if adjective in moving and noun in noun_of and words.count(adjective) == words.count(noun) == 1:
                tokens = [t for t, _ in pairs]
                at = next((i for i, t in enumerate(tokens[:-1]) if t in noun_of[noun][2:4]
                           and tokens[i + 1] in moving[adjective][1:]), None)
                if at is not None:
                    noun_hits.append(pairs[at][1] == noun)
                    adjective_hits.append(pairs[at + 1][1] == adjective)
    english_numbers = {w for n in data.NUMBERS for w in data.number_words(n, "en")}
    french_numbers = errors.french_number_words()
    number_rows = {"right": [], "wrong": []}
    number_sources = [s for s, _ in corpus.numbers]
    for (_, reference), hypothesis, pairs in zip(
            corpus.numbers, outputs["numbers"], aligned_words(framework, model, number_sources, outputs["numbers"],
                                                              vocabs), strict=True):
        label = "right" if hypothesis == reference else "wrong"
        number_rows[label] += [looked_at in english_numbers for target, looked_at in pairs if target in french_numbers]
    return {"pas -> not": share(pas), "ne -> not/does/do": share(ne), "</s> -> <s> or </s>": share(end),
            "noun -> noun": share(noun_hits), "moved adjective -> adjective": share(adjective_hits),
            "number word -> English number word, right translations": share(number_rows["right"]),
            "number word -> English number word, wrong translations": share(number_rows["wrong"])}


def sentence_log_prob(model, sources, targets, vocabs) -> np.ndarray:
    """PyTorch: sum of log p(token) over each target sentence (its </s> included), given its source."""
    src = torch.as_tensor(data.encode_sentences(sources, vocabs[0]))
    tgt = torch.as_tensor(data.encode_sentences(targets, vocabs[1]))
    model.eval()
    with torch.no_grad():
        log_probs = torch.log_softmax(model(src, tgt[:, :-1]), dim=-1)
    labels = tgt[:, 1:]
    return (log_probs.gather(-1, labels[..., None])[..., 0] * (labels != vocabs[1].pad_id)).sum(dim=1).numpy()


def beam_against_greedy(framework: str, model, pairs, greedy_outputs, beam_outputs, vocabs) -> dict:
    """How one beam setting's translations differ from greedy decoding's on one set: how many differ, and
    (PyTorch) by how much the model's log-probability of the chosen translations rises, and how many wrong ones
    remain search errors (the model scores the reference higher than the output)."""
    row = {"sentences": len(pairs), "differ": sum(g != b for g, b in zip(greedy_outputs, beam_outputs, strict=True)),
           "longer": sum(len(b.split()) > len(g.split()) for g, b in zip(greedy_outputs, beam_outputs, strict=True)),
           "shorter": sum(len(b.split()) < len(g.split()) for g, b in zip(greedy_outputs, beam_outputs, strict=True))}
    if framework == "PyTorch":
        sources = [s for s, _ in pairs]
        gain = sentence_log_prob(model, sources, beam_outputs, vocabs) - sentence_log_prob(
            model, sources, greedy_outputs, vocabs)
        row.update(log_prob_gain=float(gain.mean()), log_prob_lower=int((gain < -1e-4).sum()))
        wrong = [(s, r, h) for (s, r), h in zip(pairs, beam_outputs, strict=True) if r != h]
        if wrong:
            ws, wr, wh = zip(*wrong, strict=True)
            better = sentence_log_prob(model, ws, wr, vocabs) > sentence_log_prob(model, ws, wh, vocabs)
            row["search_errors"] = [int(better.sum()), len(wrong)]
        else:
            row["search_errors"] = [0, 0]
    return row


def main_model(framework: str, corpus, vocabs, arrays, seed: int) -> dict:
    """Train the chapter's model in one framework and measure everything the chapter reads off it."""
    _, framework_training = framework_modules(framework)
    model = build(framework, vocabs, MODEL, seed)
    trainer = framework_training.Trainer(model, **RECIPE)
    history = trainer.fit(*arrays, epochs=EPOCHS, batch_size=BATCH, seed=seed, progress=False)
    greedy, outputs = scores(framework, model, corpus, vocabs)
    result = {"seconds": history["seconds"][0], "first_step_seconds": history["first_step_seconds"][0],
              "steps": trainer.step, "decoding": {"greedy": greedy}}
    result["beam_vs_greedy"] = {}
    for name, decoding in DECODINGS.items():
        result["decoding"][name], beam_outputs = scores(framework, model, corpus, vocabs, HELD_OUT, **decoding)
        result["beam_vs_greedy"][name] = {
            split: beam_against_greedy(framework, model, getattr(corpus, split), outputs[split], beam_outputs[split],
                                        vocabs) for split in HELD_OUT}
    per_number, ninety_one = {}, Counter()
    for number in corpus.held_out_numbers:
        words = " " + " ".join(data.number_words(number)) + " "
        hits = [r == h for (s, r), h in zip(corpus.numbers, outputs["numbers"], strict=True) if words in f" {s} "]
        per_number[str(number)] = share(hits)
    for (source, _), hypothesis in zip(corpus.numbers, outputs["numbers"], strict=True):
        if "ninety one" in source:
            spans = errors.number_spans(hypothesis.split())
            ninety_one[" ".join(spans[0]) if spans else "(none)"] += 1
    result.update(per_number=per_number, ninety_one=dict(ninety_one.most_common()))
    result["error_kinds"] = {}
    for split in HELD_OUT:
        references = [t for _, t in getattr(corpus, split)]
        table = errors.error_table(references, outputs[split])
        result["error_kinds"][split] = {kind: len(rows) for kind, rows in table.items()}
        if split == "numbers":
            result["ninety_one_number_errors"] = sum("ninety one" in corpus.numbers[row][0] for row in table["number"])
    if framework == "PyTorch":
        result["search_errors"] = {}
        for split in HELD_OUT:
            wrong = [(s, r, h) for (s, r), h in zip(getattr(corpus, split), outputs[split], strict=True) if r != h]
            if wrong:
                sources, references, hypotheses = zip(*wrong, strict=True)
                better = sentence_log_prob(model, sources, references, vocabs) > sentence_log_prob(
                    model, sources, hypotheses, vocabs)
                result["search_errors"][split] = [int(better.sum()), len(wrong)]
            else:
                result["search_errors"][split] = [0, 0]
    result["alignment"] = alignment_shares(framework, model, corpus, vocabs, outputs)
    return result


def small_models(framework: str, corpus, seed: int) -> dict:
    """{setting: {split: [exact match, BLEU]}}: the chapter's comparison of the paper's choices."""
    _, framework_training = framework_modules(framework)
    separate = data.build_vocabularies(corpus.train)
    joint = data.build_joint_vocabulary(corpus.train)
    rows = {}
    for setting, options in SETTINGS.items():
        options = dict(options)
        vocabs = (joint, joint) if options.get("shared_embeddings") else separate
        config = dict(SMALL, norm_first=options.pop("norm_first", False),
                      shared_embeddings=options.pop("shared_embeddings", False))
        model = build(framework, vocabs, config, seed, positions=options.pop("positions", True))
        trainer = framework_training.Trainer(model, **(SMALL_RECIPE | options))
        trainer.fit(*data.encode_pairs(corpus.train, *vocabs), epochs=SMALL_EPOCHS, batch_size=BATCH, seed=seed,
                    progress=False)
        rows[setting] = scores(framework, model, corpus, vocabs)[0]
    return rows


def run_framework(framework: str, corpus, seed: int) -> dict:
    start = time.perf_counter()
    vocabs = data.build_vocabularies(corpus.train)
    arrays = data.encode_pairs(corpus.train, *vocabs)
    result = main_model(framework, corpus, vocabs, arrays, seed)
    result["small"] = small_models(framework, corpus, seed)
    print(f"  [seed {seed}] {framework}: {time.perf_counter() - start:.0f} s (load {load()})", flush=True)
    return result


def run_seed(seed: int) -> dict:
    """Everything for one seed; the two frameworks train side by side, one per thread, as in the chapter."""
    corpus = data.held_out_corpus(**CORPUS, seed=seed)
    with ThreadPoolExecutor(max_workers=1) as pool:
        torch_result = pool.submit(run_framework, "PyTorch", corpus, seed)
        keras_result = run_framework("Keras", corpus, seed)
        return {"seed": seed, "PyTorch": torch_result.result(), "Keras": keras_result}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--out", default="translation_seeds.json", help="file name in benchmarks/results/")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)                        # as in the chapter: PyTorch on one thread, Keras beside it
    start, runs = time.perf_counter(), []
    print(f"model {MODEL}, {EPOCHS} epochs; small {SMALL}, {SMALL_EPOCHS} epochs; seeds {args.seeds}", flush=True)
    for seed in args.seeds:
        runs.append(run_seed(seed))
        for framework in FRAMEWORKS:
            row = runs[-1][framework]
            print(f"  [seed {seed}] {framework} greedy exact match: "
                  + ", ".join(f"{split} {row['decoding']['greedy'][split][0]:.1%}" for split in SPLITS), flush=True)
        if not args.no_write:                      # the file so far after every seed, so a long run reports
            write_evidence(RESULTS / args.out, {"runs": runs}, seeds=[r["seed"] for r in runs], code=CODE,
                           notes=f"{len(runs)} of {len(args.seeds)} seeds done; PyTorch on 1 thread, "
                                 "TensorFlow with its defaults; times depend on the load")
    print(f"total {time.perf_counter() - start:.0f} s; load average {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
