"""Where the Keras tensors of the course live: a device string for ``with keras.device(default_device()):``."""

from __future__ import annotations

import os
import re

import keras


def _gpu_available() -> bool:
    if keras.backend.backend() == "torch":
        import torch  # the torch backend has no keras.distribution.list_devices

        return torch.cuda.is_available()
    try:
        return bool(keras.distribution.list_devices("gpu"))
    except Exception:  # a backend without the distribution API: stay on the CPU
        return False


def default_device() -> str:
    """The Keras device string to compute on, ``"cpu:0"`` or ``"gpu:0"``.

    ``COMPANION_DEVICE`` wins when set (``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"gpu:1"``: the torch and Keras
    spellings are both accepted); otherwise the first GPU when there is one, else the CPU.
    """
    name = os.environ.get("COMPANION_DEVICE", "").strip().lower()
    if not name:
        return "gpu:0" if _gpu_available() else "cpu:0"
    match = re.fullmatch(r"(cpu|gpu|cuda)(?::(\d+))?", name)
    if match is None:
        raise ValueError(f"COMPANION_DEVICE={name!r} is not a device such as 'cpu', 'cuda', 'cuda:1' or 'gpu:1'")
    kind, index = match.groups()
    return f"{'cpu' if kind == 'cpu' else 'gpu'}:{index or 0}"
