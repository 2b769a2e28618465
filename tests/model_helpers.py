"""Helpers shared by the model tests (test_model.py, test_gpt.py, test_kv_cache.py)."""

from __future__ import annotations

import torch
from torch import nn

from companion.convert import as_numpy  # noqa: F401  (the tests import it from here)


def randomize_norms(module: nn.Module, seed: int = 0) -> None:
    """Give every LayerNorm non-trivial gamma and beta, so a misplaced or missing norm cannot go unnoticed."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for norm in (m for m in module.modules() if isinstance(m, nn.LayerNorm)):
            norm.weight.copy_(1 + 0.3 * torch.randn(norm.weight.shape, generator=generator))
            norm.bias.copy_(0.3 * torch.randn(norm.bias.shape, generator=generator))
