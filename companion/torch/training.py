"""Training for the PyTorch Transformer: label-smoothed loss, the paper's optimizer and schedule, a
trainer with a loss history. Decoding (greedy, beam search, ``translate``) is in ``.decoding``.

Same names and arguments as ``companion.keras.training``.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ..data import iterate_batches
from ..training import EpochLoop, shift_targets, warmup_learning_rate

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


class Trainer(EpochLoop):
    """Teacher-forcing training of a :class:`companion.torch.Transformer` with a per-step loss history.

    Args:
        model: the Transformer (moved to ``device``).
        warmup_steps, factor: the learning-rate schedule (see ``companion.training.warmup_learning_rate``).
        smoothing: label smoothing of the loss (0.1 in the paper).
        device: where to train; default ``default_device()``.

    ``history`` holds lists: ``step``, ``loss``, ``lr`` (one entry per update) and ``val_step``, ``val_loss``.
    ``fit`` (the epoch loop) is :class:`companion.training.EpochLoop`'s, the same for the Keras trainer.
    """

    progress_label = "torch"  # the progress bar's name

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
