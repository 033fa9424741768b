"""The numbers of an explanation, per kernel and per graph.

Per kernel: bytes read and written are its buffers' sizes, each once (the compulsory traffic: what it
must move at least; re-reads from cache and spills are not counted); FLOPs by ``ir/cost.py``'s rule;
arithmetic intensity = FLOPs / bytes. With the device's roofs (``device_peaks``), its limit is the
roofline's: ``max(bytes / bandwidth, FLOPs / compute peak)`` seconds, memory-bound where the intensity
is below the ridge point, compute-bound above; with a measured time, the achieved GB/s and TFLOP/s and
the share of that limit reached (100 %: on the roof).

Per graph, against eager PyTorch: eager launches one kernel per aten op that is not a view and moves
each such op's inputs and results (``frontend/provenance.FxOp``); minicomp launches its kernels and the
ops it leaves to PyTorch (``Report.externs``).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..report import KernelInfo, Report
from .device_peaks import Peaks


@dataclass
class KernelFigures:
    info: KernelInfo
    graph: str
    peaks: Peaks | None = None
    seconds: float | None = None  # measured, per launch

    @property
    def bytes(self) -> int:
        return self.info.bytes_read + self.info.bytes_written

    @property
    def flops(self) -> int:
        return self.info.flops

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes if self.bytes else 0.0

    @property
    def compute_peak(self) -> float | None:
        return self.peaks.compute(self.info.product_math) if self.peaks else None

    @property
    def bound(self) -> str | None:
        """"memory" or "compute" at this device's ridge point (None: no roofs measured)."""
        if self.peaks is None:
            return None
        return "compute" if self.intensity >= self.peaks.ridge(self.info.product_math) else "memory"

    @property
    def limit_seconds(self) -> float | None:
        """The roofline's shortest time for this kernel's bytes and FLOPs."""
        if self.peaks is None:
            return None
        return max(self.bytes / self.peaks.bandwidth, self.flops / self.compute_peak)

    @property
    def attainable_flops(self) -> float | None:
        """The roof above this kernel's intensity (FLOP/s)."""
        if self.peaks is None:
            return None
        return min(self.compute_peak, self.intensity * self.peaks.bandwidth)

    @property
    def achieved_bandwidth(self) -> float | None:
        return self.bytes / self.seconds if self.seconds else None

    @property
    def achieved_flops(self) -> float | None:
        return self.flops / self.seconds if self.seconds else None

    @property
    def share_of_limit(self) -> float | None:
        """The measured time's share of the roofline limit (1.0: on the roof)."""
        if self.seconds is None or self.limit_seconds is None:
            return None
        return self.limit_seconds / self.seconds


def kernel_figures(rep: Report, peaks: Peaks | None, per_launch: dict[str, float] | None) -> list[KernelFigures]:
    times = per_launch or {}
    return [KernelFigures(k, rep.graph, peaks, times.get(k.function)) for k in rep.kernels]


@dataclass
class GraphTotals:
    eager_kernels: int
    eager_bytes: int
    kernels: int          # minicomp's launches
    pytorch_ops: int      # ops it leaves to PyTorch (fallbacks, cuBLAS/cuDNN calls)
    bytes: int            # its kernels' compulsory traffic and the PyTorch ops' eager traffic


def graph_totals(rep: Report) -> GraphTotals:
    computing = [op for op in rep.fx_ops if not op.is_view]
    moved = {op.name: op.bytes for op in computing}
    extern_bytes = sum(moved.get(getattr(e.op, "fx", ""), 0) for e in rep.externs)
    return GraphTotals(len(computing), sum(moved.values()), len(rep.kernels), len(rep.externs),
                       sum(k.bytes_read + k.bytes_written for k in rep.kernels) + extern_bytes)
