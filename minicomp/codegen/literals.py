"""Triton spellings of dtypes and constants."""
from __future__ import annotations

import math

import torch

from ..ir.types import is_float

TL_DTYPE = {
    torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16", torch.float32: "tl.float32",
    torch.float64: "tl.float64", torch.int8: "tl.int8", torch.int16: "tl.int16", torch.int32: "tl.int32",
    torch.int64: "tl.int64", torch.uint8: "tl.uint8", torch.bool: "tl.int1",
}


def plain_literal(value, dtype: torch.dtype) -> str:
    """A Python literal for ``value`` (as ``tl.full``'s fill value)."""
    if dtype == torch.bool:
        return str(int(bool(value)))
    if is_float(dtype):
        return repr(float(value)) if math.isfinite(value) else f'float("{value}")'
    return str(int(value))


def literal(value, dtype: torch.dtype, block: bool = False, rank: int = 1) -> str:
    """A Triton expression for a constant of ``dtype``: a Python literal where Triton types it right
    (fp32, int32), else (or if ``block``) a block of ones of ``rank`` dimensions, so it broadcasts with
    the kernel's blocks."""
    text = plain_literal(value, dtype)
    typed_right = dtype == torch.float32 or (dtype == torch.int32 and -2**31 <= value < 2**31)
    if typed_right and not block:
        return text
    ones = "[" + ", ".join(["1"] * rank) + "]"
    if dtype == torch.bfloat16:  # made from fp32: triton 3.6's interpreter has no bf16 constants
        return f"tl.full({ones}, {text}, tl.float32).to(tl.bfloat16)"
    return f"tl.full({ones}, {text}, {TL_DTYPE[dtype]})"
