"""Framework-free training helpers: the warm-up learning-rate schedule, the teacher-forcing shift, metrics,
a progress bar, the epoch loop both trainers share and the parameter count of a configuration.

The framework-specific parts (loss, optimizer, train step) live in ``companion.torch.training`` and
``companion.keras.training``, with the same names in both; decoding is in ``companion.decoding`` and the two
frameworks' ``decoding`` modules.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from .data import iterate_batches
from .text import check_shared_vocabulary


def warmup_learning_rate(
    step: int | np.ndarray, d_model: int, warmup_steps: int = 4000, factor: float = 1.0
) -> float | np.ndarray:
    """The schedule of "Attention Is All You Need": a linear warm-up, then decay with ``1/sqrt(step)``.

    ``lr = factor * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)``

    The two terms are equal at ``step == warmup_steps``, where the rate peaks at
    ``factor * (d_model * warmup_steps)**-0.5``. Steps count from 1 (the first update); step 0 would give 0.

    Args:
        step: the update number, an int or an integer array (then the result is an array).
        d_model: the model width (512 in the paper).
        warmup_steps: length of the warm-up (4000 in the paper).
        factor: a constant multiplier (1 in the paper).
    """
    if d_model < 1 or warmup_steps < 1:
        raise ValueError(f"d_model and warmup_steps must be positive; got {d_model} and {warmup_steps}")
    steps = np.asarray(step, dtype=np.float64)
    if np.any(steps < 1):
        raise ValueError(f"step must be >= 1 (updates count from 1); got {step}")
    rate = factor * d_model**-0.5 * np.minimum(steps**-0.5, steps * warmup_steps**-1.5)
    return float(rate) if rate.ndim == 0 else rate


def shift_targets(tgt_ids: Any) -> tuple[Any, Any]:
    """Teacher forcing: the decoder reads the target without its last token and predicts it without its first.

    ``<s> y1 y2 </s>`` gives the decoder input ``<s> y1 y2`` and the labels ``y1 y2 </s>``: at every position the
    label is the token that *follows* the input token there. Works on NumPy arrays and torch or Keras tensors.

    Args:
        tgt_ids: ``(batch, tgt_len)`` with ``tgt_len >= 2``.

    Returns:
        ``(decoder_input, labels)``, both ``(batch, tgt_len - 1)``.
    """
    shape = tuple(tgt_ids.shape)
    if len(shape) != 2 or (shape[1] is not None and shape[1] < 2):
        raise ValueError(f"tgt_ids must have shape (batch, tgt_len) with tgt_len >= 2; got shape {shape}")
    return tgt_ids[:, :-1], tgt_ids[:, 1:]


def _as_sentences(items: Sequence[str | Sequence[str]], name: str) -> list[str]:
    if isinstance(items, str):
        raise ValueError(f"{name} must be a list of sentences, not one string")
    return [" ".join(item.split()) if isinstance(item, str) else " ".join(item) for item in items]


def _check_pair(hypotheses: Sequence, references: Sequence) -> tuple[list[str], list[str]]:
    hyps, refs = _as_sentences(hypotheses, "hypotheses"), _as_sentences(references, "references")
    if len(hyps) != len(refs) or not hyps:
        raise ValueError(
            f"hypotheses and references must be non-empty and of the same length; got {len(hyps)} and {len(refs)}"
        )
    return hyps, refs


def exact_match(hypotheses: Sequence[str | Sequence[str]], references: Sequence[str | Sequence[str]]) -> float:
    """The fraction of sentences translated exactly (token by token, whitespace ignored), in [0, 1].

    Each item is a sentence string or a list of tokens.
    """
    hyps, refs = _check_pair(hypotheses, references)
    return sum(h == r for h, r in zip(hyps, refs, strict=True)) / len(hyps)


def corpus_bleu(hypotheses: Sequence[str | Sequence[str]], references: Sequence[str | Sequence[str]]) -> float:
    """Corpus BLEU (0 to 100) with sacrebleu's defaults: one reference per sentence, 13a tokenization."""
    import sacrebleu

    hyps, refs = _check_pair(hypotheses, references)
    return float(sacrebleu.corpus_bleu(hyps, [refs]).score)


def progress_bar(
    iterable: Iterable | None = None,
    total: int | None = None,
    desc: str | None = None,
    enabled: bool = True,
    **kwargs,
):
    """A tqdm text bar, redrawn at most once a second.

    In a terminal it goes to standard output. In a Jupyter notebook it lives in one output that each redraw
    replaces, so a saved or executed notebook (and the book) keeps only its final state, not one line per
    redraw. ``enabled=False``, or ``COMPANION_PROGRESS=0`` in the environment, turns the bar off (tests,
    benchmarks). Other keyword arguments go to ``tqdm``.
    """
    from tqdm import tqdm

    disable = not enabled or os.environ.get("COMPANION_PROGRESS", "1") == "0"
    options = {
        "file": _NotebookLine() if not disable and _in_notebook() else sys.stdout,
        "mininterval": 1.0,
        "ncols": 88,
        "disable": disable,
    }
    options.update(kwargs)
    return tqdm(iterable, total=total, desc=desc, **options)


def _in_notebook() -> bool:
    """True inside a Jupyter kernel (where outputs can be replaced), False in a terminal or a script."""
    shell = sys.modules.get("IPython") and sys.modules["IPython"].get_ipython()
    return type(shell).__name__ == "ZMQInteractiveShell"


class _NotebookLine:
    """A write-only text "file" for tqdm that shows only the latest line, in one replaceable notebook output."""

    encoding = "utf-8"  # tqdm draws its bar with block characters only on a stream that declares UTF-8

    def __init__(self):
        from IPython.display import display

        self.handle = display({"text/plain": ""}, raw=True, display_id=True)

    def write(self, text: str) -> int:
        line = text.split("\r")[-1].strip("\n").rstrip()
        if line:
            self.handle.update({"text/plain": line}, raw=True)
        return len(text)

    def flush(self) -> None:
        pass


class EpochLoop:
    """The epoch loop of ``companion.torch.training.Trainer`` and ``companion.keras.training.Trainer``.

    A subclass supplies ``train_step(src_ids, tgt_ids) -> float``, ``evaluate(src_ids, tgt_ids) -> float``, the
    update counter ``step``, the ``history`` dict and ``progress_label``, the name its progress bar shows.
    """

    progress_label = "train"
    step: int
    history: dict[str, list[float]]

    def fit(
        self,
        src_ids: np.ndarray,
        tgt_ids: np.ndarray,
        epochs: int = 1,
        batch_size: int = 64,
        seed: int = 0,
        validation: tuple[np.ndarray, np.ndarray] | None = None,
        progress: bool = True,
    ) -> dict[str, list[float]]:
        """Train for ``epochs`` passes over the pairs ``src_ids`` ``(num_pairs, src_len)`` and ``tgt_ids``
        ``(num_pairs, tgt_len)``, reshuffled each epoch (seed + epoch).

        With ``validation = (src_ids, tgt_ids)`` the validation loss is recorded after every epoch. Returns
        ``history`` (also kept on the trainer); ``history["seconds"]`` is the wall-clock time of this call and
        ``history["first_step_seconds"]`` that of its first update (which includes any tracing or compiling).
        Every batch has the same shape (full width, ``batch_size`` rows; the pairs left over after the last full
        batch wait for the next epoch's shuffle), so both frameworks see the same batches, and Keras traces its
        compiled step once: a new shape would trace it again, which costs far more than a step.
        """
        start = time.perf_counter()
        timing: dict[str, list[float]] = {}
        steps_per_epoch = len(src_ids) // batch_size
        bar = progress_bar(total=epochs * steps_per_epoch, desc=self.progress_label, enabled=progress)
        for epoch in range(epochs):
            batches = iterate_batches(src_ids, tgt_ids, batch_size, shuffle=True, seed=seed + epoch, drop_last=True)
            for src, tgt in batches:
                loss = self.train_step(src, tgt)
                if "first_step_seconds" not in timing:
                    timing["first_step_seconds"] = [time.perf_counter() - start]
                bar.update()
                bar.set_postfix(epoch=epoch + 1, loss=f"{loss:.3f}", refresh=False)
            if validation is not None:
                self.history["val_step"].append(self.step)
                self.history["val_loss"].append(self.evaluate(*validation))
                bar.set_postfix(epoch=epoch + 1, loss=f"{loss:.3f}", val=f"{self.history['val_loss'][-1]:.3f}")
        bar.close()
        self.history["seconds"] = [time.perf_counter() - start]
        self.history.update(timing)
        return self.history


def transformer_parameter_count(
    src_vocab_size: int,
    tgt_vocab_size: int,
    d_model: int = 512,
    num_layers: int = 6,
    d_ff: int = 2048,
    norm_first: bool = False,
    shared_embeddings: bool = False,
) -> int:
    """Trainable parameters of ``companion.torch.Transformer`` / ``companion.keras.Transformer``, by formula.

    Counted per part (every ``Linear`` / ``Dense`` has a bias, every LayerNorm a scale and a shift):

    * embeddings: ``(src_vocab_size + tgt_vocab_size) * d_model`` (the sinusoidal table has no weights);
    * one multi-head attention: four ``d_model x d_model`` projections with biases, ``4 * (d_model**2 + d_model)``
      (the number of heads does not matter: the heads split ``d_model``);
    * the feed-forward network: ``2 * d_model * d_ff + d_ff + d_model``;
    * a LayerNorm: ``2 * d_model``;
    * an encoder layer = 1 attention + FFN + 2 LayerNorms; a decoder layer = 2 attentions + FFN + 3 LayerNorms;
    * pre-LN stacks end with one more LayerNorm each;
    * the output projection: ``d_model * tgt_vocab_size + tgt_vocab_size``.

    With ``shared_embeddings`` (one joint vocabulary, ``src_vocab_size == tgt_vocab_size``) the two embeddings
    and the output projection's weight are one ``vocab_size x d_model`` table, counted once; the output layer
    keeps only its bias.
    """
    for name, value in {"src_vocab_size": src_vocab_size, "tgt_vocab_size": tgt_vocab_size, "d_model": d_model,
                        "num_layers": num_layers, "d_ff": d_ff}.items():
        if value < 1:
            raise ValueError(f"{name} must be a positive integer; got {value}")
    attention = 4 * (d_model * d_model + d_model)
    ffn = 2 * d_model * d_ff + d_ff + d_model
    norm = 2 * d_model
    encoder_layer = attention + ffn + 2 * norm
    decoder_layer = 2 * attention + ffn + 3 * norm
    final_norms = 2 * norm if norm_first else 0
    check_shared_vocabulary(shared_embeddings, src_vocab_size, tgt_vocab_size)
    if shared_embeddings:
        embeddings, generator = src_vocab_size * d_model, tgt_vocab_size
    else:
        embeddings = (src_vocab_size + tgt_vocab_size) * d_model
        generator = d_model * tgt_vocab_size + tgt_vocab_size
    return embeddings + num_layers * (encoder_layer + decoder_layer) + final_norms + generator

