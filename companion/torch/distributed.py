"""Data-parallel training with ``torch.distributed``: several processes, one model copy each, one global batch.

Every process (a *rank*) holds the same model, takes its own slice of each global batch, computes gradients on
it, and then the ranks average their gradients (an *all-reduce*), so every copy applies the same update and the
copies stay identical. With equal slices, the average of the per-slice mean losses is the mean loss over the
global batch: the result equals one process training on the whole batch, up to float round-off.

On a CPU the ranks talk through the ``gloo`` backend; on GPUs one uses ``nccl`` with one process per GPU (see
chapter 8). The processes are started with ``torch.multiprocessing.spawn``; ``torchrun`` would start the same
worker with ``RANK`` and ``WORLD_SIZE`` in the environment instead.
"""

from __future__ import annotations

import copy
import io
import os
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn import functional as F

from ..corpus import global_batches

__all__ = [
    "average_gradients",
    "global_batches",
    "lm_loss",
    "max_parameter_difference",
    "train_data_parallel",
    "train_single_process",
]


def lm_loss(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of a language model: inputs, targets ``(batch, seq_len)``."""
    logits = model(inputs)  # (batch, seq_len, vocab_size)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def average_gradients(model: nn.Module) -> None:
    """Replace every gradient by its mean over all ranks (what DistributedDataParallel does, bucket by bucket)."""
    world_size = dist.get_world_size()
    for parameter in model.parameters():
        if parameter.grad is not None:
            dist.all_reduce(parameter.grad, op=dist.ReduceOp.SUM)
            parameter.grad /= world_size


OPTIMIZERS = {
    "sgd": lambda parameters, lr: torch.optim.SGD(parameters, lr=lr, momentum=0.9),
    "adamw": lambda parameters, lr: torch.optim.AdamW(parameters, lr=lr),
}


def _train(model, inputs, targets, batches, lr, optimizer="sgd", rank=0, world_size=1, use_ddp=False):
    """The training loop shared by one process and by each rank; returns the loss of every global batch."""
    trained = nn.parallel.DistributedDataParallel(model) if use_ddp else model
    optimizer = OPTIMIZERS[optimizer](model.parameters(), lr)
    losses = []
    for batch in batches:
        mine = np.array_split(batch, world_size)[rank]  # this rank's slice of the global batch
        loss = lm_loss(trained, torch.as_tensor(inputs[mine]), torch.as_tensor(targets[mine]))
        optimizer.zero_grad()
        loss.backward()  # with DDP, the gradients are averaged across ranks during this call
        if world_size > 1 and not use_ddp:
            average_gradients(model)
        optimizer.step()
        if world_size > 1:  # the loss of the global batch, for the record
            loss = loss.detach().clone()
            dist.all_reduce(loss, op=dist.ReduceOp.SUM)
            loss /= world_size
        losses.append(loss.item())
    return losses


def _worker(rank, world_size, rendezvous, model_bytes, inputs, targets, batches, lr, optimizer, use_ddp, result_path):
    """One rank: join the group, train, and let rank 0 write the result."""
    torch.set_num_threads(1)  # the ranks share the machine's cores
    model = torch.load(io.BytesIO(model_bytes), weights_only=False)  # this rank's own copy
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world_size)
    try:
        losses = _train(model, inputs, targets, batches, lr, optimizer, rank, world_size, use_ddp)
        if rank == 0:
            torch.save({"state": model.state_dict(), "losses": losses}, result_path)
    finally:
        dist.destroy_process_group()


def _check(inputs: np.ndarray, targets: np.ndarray, batch_size: int, world_size: int, optimizer: str) -> None:
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {sorted(OPTIMIZERS)}; got {optimizer!r}")
    if inputs.ndim != 2 or inputs.shape != targets.shape:
        raise ValueError(
            f"inputs and targets must both have shape (num_examples, seq_len); got {inputs.shape} and {targets.shape}"
        )
    if world_size < 1 or batch_size % world_size:
        raise ValueError(f"batch_size ({batch_size}) must be a multiple of world_size ({world_size})")


def train_single_process(
    model: nn.Module, inputs: np.ndarray, targets: np.ndarray, steps: int, batch_size: int, lr: float = 0.1,
    optimizer: str = "sgd", seed: int = 0,
) -> tuple[nn.Module, list[float]]:
    """Train a copy of ``model`` for ``steps`` optimizer steps on global batches of ``batch_size`` examples.

    Args:
        model: a module mapping ids ``(batch, seq_len)`` to logits ``(batch, seq_len, vocab_size)``; it is not
            changed. Use dropout 0 to compare with :func:`train_data_parallel`.
        inputs, targets: int arrays of shape ``(num_examples, seq_len)``.
        optimizer: ``"sgd"`` (with momentum 0.9) or ``"adamw"``. Adam divides each gradient by its running size,
            so a gradient that is pure round-off (the key bias of attention gets exactly zero gradient in exact
            arithmetic) becomes a full-size step there: compare processes with SGD.

    Returns:
        the trained copy and the loss of every step.
    """
    _check(inputs, targets, batch_size, 1, optimizer)
    model = copy.deepcopy(model)
    losses = _train(model, inputs, targets, global_batches(len(inputs), batch_size, steps, seed), lr, optimizer)
    return model, losses


def train_data_parallel(
    model: nn.Module, inputs: np.ndarray, targets: np.ndarray, steps: int, batch_size: int, lr: float = 0.1,
    optimizer: str = "sgd", seed: int = 0, world_size: int = 2, use_ddp: bool = True,
) -> tuple[nn.Module, list[float]]:
    """The same training as :func:`train_single_process`, split over ``world_size`` CPU processes (gloo).

    Each rank receives a copy of ``model`` and ``batch_size // world_size`` examples of every global batch.
    ``use_ddp=True`` wraps the model in ``DistributedDataParallel``; ``False`` averages the gradients by hand
    with :func:`average_gradients`. Both give the same numbers.

    Returns:
        a trained copy of ``model`` (rank 0's; all ranks hold the same) and the loss of every global batch.
    """
    _check(inputs, targets, batch_size, world_size, optimizer)
    batches = global_batches(len(inputs), batch_size, steps, seed)
    # A module handed to mp.spawn travels through shared memory, so every rank would update one and the same set
    # of weights. Bytes give each rank a private copy.
    buffer = io.BytesIO()
    torch.save(model, buffer)
    with tempfile.TemporaryDirectory() as folder:
        rendezvous, result_path = Path(folder) / "rendezvous", Path(folder) / "result.pt"
        mp.spawn(
            _worker,
            args=(world_size, os.fspath(rendezvous), buffer.getvalue(), inputs, targets, batches, lr, optimizer,
                  use_ddp, os.fspath(result_path)),
            nprocs=world_size,
            join=True,
        )
        result = torch.load(result_path)
    trained = copy.deepcopy(model)
    trained.load_state_dict(result["state"])
    return trained, result["losses"]


def max_parameter_difference(a: nn.Module, b: nn.Module) -> float:
    """The largest absolute difference between corresponding parameters of two models of the same shape."""
    return max(float((p - q).detach().abs().max()) for p, q in zip(a.parameters(), b.parameters(), strict=True))
