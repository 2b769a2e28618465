"""Training for the PyTorch Transformer: label-smoothed loss, the paper's optimizer and schedule, a
trainer with a loss history. Decoding (greedy, beam search, ``translate``) is in ``.decoding``.

Same names and arguments as ``companion.keras.training``.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from torch import nn

from ..data import iterate_batches
from ..training import (
    progress_bar,
    shift_targets,
    warmup_learning_rate,
)

# Decoding lives in .decoding; its names stay importable from here, where the course first used them.
from .decoding import (  # noqa: F401
    batch_beam_search,
    beam_search,
    greedy_decode,
    translate,
)
from .device import default_device

ADAM_BETAS = (0.9, 0.98)  # section 5.3 of the paper
ADAM_EPSILON = 1e-9


def label_smoothed_cross_entropy(
    logits: torch.Tensor, labels: torch.Tensor, smoothing: float = 0.1, pad_id: int = 0
) -> torch.Tensor:
    """Cross-entropy against a smoothed target, averaged over the non-PAD positions only.

    The target puts ``1 - smoothing`` on the right token and spreads ``smoothing`` evenly over the whole
    vocabulary (the convention of ``torch.nn.CrossEntropyLoss(label_smoothing=...)`` and of Keras):
    ``loss = (1 - smoothing) * (-log p[label]) + smoothing * mean_over_vocab(-log p)``.

    Args:
        logits: ``(batch, tgt_len, vocab)``, before any softmax.
        labels: ``(batch, tgt_len)`` integer ids; positions holding ``pad_id`` add nothing.
        smoothing: in ``[0, 1)``; 0 gives the plain cross-entropy.

    Returns:
        a scalar tensor (0 when every label is PAD).
    """
    if logits.dim() != 3 or labels.shape != logits.shape[:2]:
        raise ValueError(
            f"logits must be (batch, tgt_len, vocab) and labels (batch, tgt_len); got {tuple(logits.shape)} and "
            f"{tuple(labels.shape)}"
        )
    if not 0.0 <= smoothing < 1.0:
        raise ValueError(f"smoothing must lie in [0, 1); got {smoothing}")
    log_probs = torch.log_softmax(logits.float(), dim=-1)  # (batch, tgt_len, vocab)
    nll = -log_probs.gather(-1, labels.long().unsqueeze(-1)).squeeze(-1)  # (batch, tgt_len)
    uniform = -log_probs.mean(dim=-1)  # (batch, tgt_len)
    per_token = (1.0 - smoothing) * nll + smoothing * uniform
    keep = (labels != pad_id).to(per_token.dtype)
    return (per_token * keep).sum() / keep.sum().clamp(min=1.0)


def make_optimizer(
    model: nn.Module, d_model: int, warmup_steps: int = 4000, factor: float = 1.0
) -> tuple[torch.optim.Adam, torch.optim.lr_scheduler.LambdaLR]:
    """Adam with betas (0.9, 0.98) and epsilon 1e-9, and the warm-up schedule as a per-step ``LambdaLR``.

    The base rate is 1 and the scheduler multiplies it by ``warmup_learning_rate(step)``; ``LambdaLR`` counts
    from 0, the schedule from 1, hence the ``+ 1``. Call ``scheduler.step()`` after every ``optimizer.step()``.
    """
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=ADAM_BETAS, eps=ADAM_EPSILON)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda index: warmup_learning_rate(index + 1, d_model, warmup_steps, factor)
    )
    return optimizer, scheduler


class Trainer:
    """Teacher-forcing training of a :class:`companion.torch.Transformer` with a per-step loss history.

    Args:
        model: the Transformer (moved to ``device``).
        warmup_steps, factor: the learning-rate schedule (see ``companion.training.warmup_learning_rate``).
        smoothing: label smoothing of the loss (0.1 in the paper).
        device: where to train; default ``default_device()``.

    ``history`` holds lists: ``step``, ``loss``, ``lr`` (one entry per update) and ``val_step``, ``val_loss``.
    """

    def __init__(
        self,
        model: nn.Module,
        warmup_steps: int = 4000,
        factor: float = 1.0,
        smoothing: float = 0.1,
        device: torch.device | str | None = None,
    ):
        self.device = torch.device(device) if device is not None else default_device()
        self.model = model.to(self.device)
        self.d_model = model.src_embed.d_model
        self.pad_id = model.pad_id
        self.smoothing = smoothing
        self.optimizer, self.scheduler = make_optimizer(model, self.d_model, warmup_steps, factor)
        self.step = 0
        self.history: dict[str, list[float]] = {"step": [], "loss": [], "lr": [], "val_step": [], "val_loss": []}

    def _tensor(self, ids) -> torch.Tensor:
        return torch.as_tensor(np.asarray(ids), dtype=torch.long, device=self.device)

    def train_step(self, src_ids: np.ndarray, tgt_ids: np.ndarray) -> float:
        """One update on a batch: src ``(batch, src_len)``, tgt ``(batch, tgt_len)`` = ``<s> ... </s>`` + PAD.

        Returns the batch loss before the update.
        """
        self.model.train()
        src, tgt = self._tensor(src_ids), self._tensor(tgt_ids)
        decoder_input, labels = shift_targets(tgt)
        logits = self.model(src, decoder_input)  # (batch, tgt_len - 1, vocab)
        loss = label_smoothed_cross_entropy(logits, labels, self.smoothing, self.pad_id)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        value = float(loss.detach())
        for key, item in (("step", self.step), ("loss", value), ("lr", lr)):
            self.history[key].append(item)
        return value

    @torch.no_grad()
    def evaluate(self, src_ids: np.ndarray, tgt_ids: np.ndarray, batch_size: int = 500) -> float:
        """The same label-smoothed loss on held-out pairs (no update, no dropout), averaged over tokens."""
        self.model.eval()
        total, count = 0.0, 0
        for src, tgt in iterate_batches(src_ids, tgt_ids, batch_size, shuffle=False):
            decoder_input, labels = shift_targets(self._tensor(tgt))
            logits = self.model(self._tensor(src), decoder_input)
            tokens = int((labels != self.pad_id).sum())
            total += float(label_smoothed_cross_entropy(logits, labels, self.smoothing, self.pad_id)) * tokens
            count += tokens
        return total / max(count, 1)

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
        """Train for ``epochs`` passes over the pairs, reshuffled each epoch (seed + epoch).

        With ``validation = (src_ids, tgt_ids)`` the validation loss is recorded after every epoch. Returns
        ``history`` (also kept on the trainer); ``history["seconds"]`` is the wall-clock time of this call and
        ``history["first_step_seconds"]`` that of its first update (which includes any tracing or compiling).
        Every batch has ``batch_size`` rows (the pairs left over after the last full batch wait for the next
        epoch's shuffle), as in the Keras trainer, so both see the same batches.
        """
        start = time.perf_counter()
        timing: dict[str, list[float]] = {}
        steps_per_epoch = len(src_ids) // batch_size
        bar = progress_bar(total=epochs * steps_per_epoch, desc="torch", enabled=progress)
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
