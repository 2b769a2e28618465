"""Length generalisation: rotary positions against learned and sinusoidal ones, trained on short windows and
evaluated on windows four times longer, over several seeds.

Three models differ only in how they see positions. All three are chapter 9's ``ModernDecoder`` (pre-RMSNorm,
SwiGLU, grouped-query attention, the width, depth and heads of chapter 8's GPT):

* ``rope``: as in the chapter, queries and keys rotated by their position, nothing added to the tokens;
* ``learned``: no rotation; a learned vector per position added to the token vector (chapter 8's GPT), from a
  table as long as the evaluation windows whose rows past the training length are never trained;
* ``sinusoidal``: no rotation; chapter 5's fixed sinusoidal table added to the token vector, times a learned
  scalar that starts at the size of the token vectors (the table has entries of size 1, the tokens of 0.02).

Data: chapter 8's corpus and tokenizer (``bench_modern_decoder.corpus_windows``), cut into training windows of
``TRAIN_LEN`` tokens and validation windows of ``EVAL_LEN`` tokens. Each model trains ``STEPS`` AdamW steps of
``BATCH`` windows with chapter 8's schedule, then the cross-entropy of every position of the long validation
windows is averaged over the windows. A causal model computes positions ``0..TRAIN_LEN-1`` of a long window
exactly as it does a training-length window, so the loss there is its in-distribution loss; the positions after
it are the ones it never saw in training.

    python benchmarks/bench_rope_length.py                    # seeds 0-4, writes the result file
    python benchmarks/bench_rope_length.py --seeds 0 --steps 100 --no-write
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from anywhere
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_modern_decoder as chapter8  # noqa: E402
from evidence import write_evidence  # noqa: E402

from companion.corpus import course_documents, lm_windows  # noqa: E402
from companion.torch import ModernDecoder, sinusoidal_positional_encoding  # noqa: E402

TRAIN_LEN, EVAL_LEN, STEPS, BATCH = 32, 128, 1200, 32
KINDS = ("rope", "learned", "sinusoidal")
#: Position ranges of the long windows the results are reported for: (first, last + 1).
RANGES = {"seen": (0, TRAIN_LEN), "2x": (TRAIN_LEN, 2 * TRAIN_LEN), "4x": (2 * TRAIN_LEN, EVAL_LEN)}
CONFIG = dict(chapter8.MODERN_CONFIG, max_len=EVAL_LEN)
RESULT = ROOT / "benchmarks" / "results" / "rope_length_seeds.json"
CODE = ["benchmarks/bench_rope_length.py", "benchmarks/bench_modern_decoder.py", "companion/bpe.py",
        "companion/corpus.py", "companion/torch/modern_decoder.py", "companion/torch/modern.py",
        "companion/torch/grouped.py", "companion/torch/positional.py"]


class AddedPositionDecoder(ModernDecoder):
    """``ModernDecoder`` without rotary embedding, a position vector added to each token vector instead.

    ``positions="learned"``: a trained table ``position_embed`` ``(max_len, d_model)``, normal with standard
    deviation 0.02 like the token table. ``positions="sinusoidal"``: the fixed table of chapter 5 times the learned
    scalar ``position_scale``, which starts so that the table's root mean square equals 0.02.
    """

    def __init__(self, vocab_size: int, positions: str, **config):
        super().__init__(vocab_size, rope_base=None, **config)
        if positions not in ("learned", "sinusoidal"):
            raise ValueError(f"positions must be 'learned' or 'sinusoidal'; got {positions!r}")
        self.positions = positions
        if positions == "learned":
            self.position_embed = nn.Parameter(torch.randn(self.max_len, self.d_model) * 0.02)
        else:
            self.register_buffer("position_table", sinusoidal_positional_encoding(self.max_len, self.d_model))
            self.position_scale = nn.Parameter(torch.tensor(0.02 * math.sqrt(2.0)))  # the table's RMS is 1/sqrt(2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids ``(batch, length)`` -> logits ``(batch, length, vocab_size)``."""
        self._check(ids)
        length = ids.shape[1]
        table = self.position_embed if self.positions == "learned" else self.position_scale * self.position_table
        x = self.token_embed(ids) + table[:length]  # (batch, length, d_model)
        mask = self.mask(length, 0, ids.device)
        for block in self.blocks:
            x = block(x, mask)
        return self._logits(x)


def make_model(kind: str, vocab_size: int, seed: int) -> nn.Module:
    """One of ``KINDS``, initialised from ``seed`` (the blocks get the same initial weights in all three)."""
    torch.manual_seed(seed)
    if kind == "rope":
        return ModernDecoder(vocab_size, **CONFIG)
    if kind in ("learned", "sinusoidal"):
        return AddedPositionDecoder(vocab_size, kind, **CONFIG)
    raise ValueError(f"kind must be one of {KINDS}; got {kind!r}")


def length_data() -> dict[str, np.ndarray]:
    """Training windows ``(n, TRAIN_LEN)`` (stride half a window) and validation windows ``(m, EVAL_LEN)``."""
    data = chapter8.corpus_windows()
    inputs, targets = lm_windows(data["train_ids"], TRAIN_LEN, stride=TRAIN_LEN // 2)
    valid_inputs, valid_targets = lm_windows(data["valid_ids"], EVAL_LEN)
    return {"inputs": inputs, "targets": targets, "valid_inputs": valid_inputs[:, :TRAIN_LEN],
            "valid_targets": valid_targets[:, :TRAIN_LEN], "long_inputs": valid_inputs, "long_targets": valid_targets}


def loss_by_position(model: nn.Module, inputs: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Cross-entropy (nats) at each position, averaged over the windows: ``(length,)``."""
    model.eval()
    with torch.no_grad():
        logits = model(torch.as_tensor(inputs))
        losses = F.cross_entropy(logits.transpose(1, 2), torch.as_tensor(targets), reduction="none")
    return losses.mean(0).numpy()


def run(kind: str, data: dict[str, np.ndarray], seed: int, steps: int) -> dict[str, object]:
    """Train one model on the short windows, then its loss on each range of the long ones."""
    model = make_model(kind, chapter8.VOCAB_SIZE, seed)
    start = time.perf_counter()
    chapter8.train(model, data, seed, steps, every=steps)
    seconds = time.perf_counter() - start
    by_position = loss_by_position(model, data["long_inputs"], data["long_targets"])
    return {"seed": seed, "seconds": seconds,
            "loss": {name: float(by_position[a:b].mean()) for name, (a, b) in RANGES.items()},
            "by_position": [round(float(x), 4) for x in by_position]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--no-write", action="store_true", help="print only, do not write the result file")
    args = parser.parse_args()
    torch.set_num_threads(1)
    data = length_data()
    print(f"{len(data['inputs']):,} training windows of {TRAIN_LEN}, {len(data['long_inputs']):,} validation "
          f"windows of {EVAL_LEN}", flush=True)
    runs: dict[str, list[dict[str, object]]] = {kind: [] for kind in KINDS}
    for seed in args.seeds:
        for kind in KINDS:  # the kinds alternate seed by seed, so a busy machine slows all of them alike
            result = run(kind, data, seed, args.steps)
            runs[kind].append(result)
            losses = ", ".join(f"{name} {value:.3f}" for name, value in result["loss"].items())
            print(f"seed {seed} {kind:10}: {losses} ({result['seconds']:.0f} s)", flush=True)
    results = {kind: {"loss": {name: chapter8.summary([r["loss"][name] for r in rows]) for name in RANGES},
                      "growth_4x": chapter8.summary([r["loss"]["4x"] - r["loss"]["seen"] for r in rows]),
                      "runs": rows}
               for kind, rows in runs.items()}
    results["setup"] = {"train_len": TRAIN_LEN, "eval_len": EVAL_LEN, "steps": args.steps, "batch": BATCH,
                        "ranges": RANGES, "model": CONFIG, "vocab_size": chapter8.VOCAB_SIZE,
                        "training_windows": len(data["inputs"]), "validation_windows": len(data["long_inputs"])}
    for kind in KINDS:
        summary = ", ".join(f"{name} {s['mean']:.3f} ± {s['stdev']:.3f}" for name, s in results[kind]["loss"].items())
        print(f"{kind:10}: {summary}")
    if not args.no_write:
        write_evidence(RESULT, results, seeds=args.seeds, code=CODE,
                       data=sorted(course_documents(exclude=("08_", "09_"))),
                       notes="torch, one CPU thread; loss in nats per token, averaged over the positions of each range")
        print(f"wrote {RESULT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
