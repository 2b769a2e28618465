"""Where the torch tensors of the course live: one function, so no notebook ever calls ``.cuda()``."""

from __future__ import annotations

import os

import torch


def default_device() -> torch.device:
    """The device to put models and batches on.

    ``COMPANION_DEVICE`` wins when set (``"cpu"``, ``"cuda"``, ``"cuda:1"``; ``"gpu"`` / ``"gpu:1"`` are accepted
    as in Keras); otherwise the first CUDA GPU when there is one, else the CPU.
    """
    name = os.environ.get("COMPANION_DEVICE", "").strip().lower()
    if not name:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("gpu"):
        name = "cuda" + name[len("gpu") :]
    try:
        return torch.device(name)
    except RuntimeError as error:
        raise ValueError(f"COMPANION_DEVICE={name!r} is not a device such as 'cpu', 'cuda' or 'cuda:1'") from error
