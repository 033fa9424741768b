"""Small helpers the generated wrappers call."""
from __future__ import annotations

import torch


def ensure_strides(t: torch.Tensor, strides: tuple[int, ...]) -> torch.Tensor:
    """The kernels were generated for these strides; copy if PyTorch returned another layout."""
    if t.numel() <= 1 or all(a == b for a, b, n in zip(t.stride(), strides, t.shape) if n > 1):
        return t
    out = torch.empty_strided(t.shape, strides, dtype=t.dtype, device=t.device)
    out.copy_(t)
    return out
