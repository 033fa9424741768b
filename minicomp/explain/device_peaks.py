"""The device's roofs: peak memory bandwidth and peak FLOP/s per product type, measured once per device
and kept in the cache folder (``tuned/``, keyed by the device's name), so a report costs the
measurement once per machine.

* bandwidth: a copy of ``COPY_BYTES`` (far beyond L2, so it streams from memory), bytes read and
  written over the best time of ``REPEATS``;
* FLOP/s: a ``MATMUL_SIZE``-cubed product in fp16, bf16, fp32 with TF32 and fp32 without (cuBLAS).
  fp32 without TF32 runs on the CUDA cores: it is the compute roof of every kernel without a
  tensor-core product (pointwise, reductions), as of fp32 products.

On the CPU nothing is measured (``peaks`` returns None: the report says "not measured").
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from .. import config
from ..runtime import cache
from .timing import event_seconds

COPY_BYTES = 1 << 30        # 1 GiB: 20x the H100/H200 L2
MATMUL_SIZE = 8192          # large enough for cuBLAS to reach its plateau on a Hopper GPU
REPEATS = 10                # best of: the device's rate, not its slowest moment
PRODUCTS = {"float16": (torch.float16, False), "bfloat16": (torch.bfloat16, False),
            "tf32": (torch.float32, True), "float32": (torch.float32, False)}


@dataclass(frozen=True)
class Peaks:
    device: str
    bandwidth: float              # bytes per second
    flops: dict[str, float]       # FLOP/s per product type (``PRODUCTS``; ir/cost.product_math)

    def compute(self, product_math: str = "") -> float:
        """The compute roof of a kernel whose products run on ``product_math`` ("": none: the CUDA cores)."""
        return self.flops.get(product_math or "float32", self.flops["float32"])

    def ridge(self, product_math: str = "") -> float:
        """The arithmetic intensity (FLOP/byte) where the memory roof meets the compute roof."""
        return self.compute(product_math) / self.bandwidth


def peaks(device: torch.device, measure: Callable[[torch.device], dict] | None = None) -> Peaks | None:
    """This device's roofs, measured at the first call on this machine and read from the cache after
    (None on the CPU: not measured)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return cached_peaks(name, lambda: (measure or _measure)(device))


def cached_peaks(name: str, measure: Callable[[], dict]) -> Peaks:
    """The peaks stored for device ``name``, else ``measure()``'s, stored."""
    key = cache.digest(f"device peaks|{name}")
    stored = _valid(cache.load_tuned(key))
    if stored is None:
        stored = measure()
        cache.store_tuned(key, stored)
    return Peaks(name, stored["bandwidth"], dict(stored["flops"]))


def _valid(entry) -> dict | None:
    """A stored entry that is what ``_measure`` writes (positive finite numbers), else None."""
    def rate(x) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0
    if not isinstance(entry, dict) or not rate(entry.get("bandwidth")):
        return None
    flops = entry.get("flops")
    if not isinstance(flops, dict) or set(flops) != set(PRODUCTS) or not all(map(rate, flops.values())):
        return None
    return entry


def _measure(device: torch.device) -> dict:
    src = torch.empty(COPY_BYTES // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    bandwidth = 2 * COPY_BYTES / _best_seconds(lambda: dst.copy_(src))
    del src, dst
    flops = {}
    for name, (dtype, tf32) in PRODUCTS.items():
        with config.patch(cuda_matmul_allow_tf32=tf32):
            a = torch.randn(MATMUL_SIZE, MATMUL_SIZE, dtype=dtype, device=device)
            b = torch.randn_like(a)
            flops[name] = 2 * MATMUL_SIZE ** 3 / _best_seconds(lambda: a @ b)
    return {"bandwidth": bandwidth, "flops": flops}


def _best_seconds(fn: Callable[[], object]) -> float:
    fn()  # warm: cuBLAS's heuristics, the allocator
    return min(event_seconds(fn, REPEATS))
