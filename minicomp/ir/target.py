"""The machine a graph's kernels run on: a CUDA GPU, or Triton's interpreter on the CPU.

Every decision that depends on the device (block sizes, persistent grids, TMA, how a kernel is loaded
and timed) reads one ``Target``. Lowering sets it on the graph (``Graph.target``) from the inputs'
device; passes read it there, and functions that used to take a device or an ``on_gpu`` flag take
the ``Target``. Only fields some decision reads are here.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch


INTERPRETER_NAME = "cpu (Triton interpreter)"


@dataclass(frozen=True)
class Target:
    kind: str                                   # "cuda" | "interpreter"
    device: torch.device                        # where buffers are allocated
    name: str                                   # the GPU's name (keys of tuned schedules), or INTERPRETER_NAME
    sm_count: int = 1                           # multiprocessors: a persistent grid's program count
    compute_capability: tuple[int, int] = (0, 0)
    tma: bool = False                           # Hopper's tensor-memory accelerator (TMA descriptors)

    @property
    def is_cuda(self) -> bool:
        return self.kind == "cuda"

    @property
    def interpreted(self) -> bool:
        """Kernels run in Triton's interpreter (CPU tensors): imported with ``TRITON_INTERPRET=1``,
        with the plain ``tl`` spelling where a GPU takes inline PTX."""
        return self.kind == "interpreter"

    def __str__(self) -> str:
        if self.interpreted:
            return self.name
        major, minor = self.compute_capability
        return f"{self.name} ({self.device}, sm_{major}{minor}, {self.sm_count} SMs{', TMA' if self.tma else ''})"

    @staticmethod
    def for_device(device: torch.device | str) -> "Target":
        """The target of tensors on ``device`` (CUDA, else the interpreter), described once per device."""
        device = torch.device(device)
        if device.type != "cuda":
            return _interpreter()
        index = device.index if device.index is not None else torch.cuda.current_device()
        return _cuda(index)

    @staticmethod
    def for_values(values) -> "Target":
        """A graph's target: CUDA as soon as one tensor of ``values`` is there (CPU scalar tensors may join
        a GPU graph), else the interpreter."""
        return Target.for_device(next((v.device for v in values if isinstance(v, torch.Tensor) and v.is_cuda), "cpu"))


@functools.lru_cache(maxsize=None)
def _interpreter() -> Target:
    return Target("interpreter", torch.device("cpu"), INTERPRETER_NAME)


@functools.lru_cache(maxsize=None)
def _cuda(index: int) -> Target:
    props = torch.cuda.get_device_properties(index)
    capability = (props.major, props.minor)
    return Target("cuda", torch.device("cuda", index), props.name,
                  props.multi_processor_count, capability, tma=capability >= (9, 0))


INTERPRETER = _interpreter()
