"""Tensor types of the IR: shape, dtype and device of every node."""
from __future__ import annotations

from dataclasses import dataclass
import math

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
INT_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
SUPPORTED_DTYPES = FLOAT_DTYPES + INT_DTYPES + (torch.bool,)

_SHORT = {
    torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32", torch.float64: "f64",
    torch.uint8: "u8", torch.int8: "i8", torch.int16: "i16", torch.int32: "i32", torch.int64: "i64",
    torch.bool: "b8",
}


def short_dtype(dtype: torch.dtype) -> str:
    return _SHORT.get(dtype, str(dtype).replace("torch.", ""))


def is_float(dtype: torch.dtype) -> bool:
    return dtype in FLOAT_DTYPES


@dataclass(frozen=True)
class TensorType:
    """The static type of an IR value. Strides are not part of it: the IR is layout-free,
    except for graph inputs and extern results, whose layout is recorded on the node."""
    shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def with_(self, shape=None, dtype=None) -> "TensorType":
        return TensorType(tuple(self.shape if shape is None else shape),
                          self.dtype if dtype is None else dtype, self.device)

    def __str__(self) -> str:
        return f"{short_dtype(self.dtype)}[{','.join(map(str, self.shape))}]"


def contiguous_strides(shape) -> tuple[int, ...]:
    strides, acc = [], 1
    for size in reversed(shape):
        strides.append(acc)
        acc *= max(size, 1)
    return tuple(reversed(strides))
