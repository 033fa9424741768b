"""minicomp: a small, readable ML compiler for PyTorch.

    compiled = minicomp.compile(model)            # or torch.compile(model, backend="minicomp")
    compiled(x)
    print(minicomp.report())                      # kernels, fallbacks and decisions
"""
from __future__ import annotations

from typing import Callable

import torch

from .compiler import MODES, PIPELINE, Options
from .report import Report, report, reports, reports_since

__version__ = "0.1.0"


def compile(model: Callable, *, mode: str = "default", dump_dir: str | None = None) -> Callable:
    """Compile ``model`` (an ``nn.Module`` or a function of tensors) with minicomp.

    ``mode``: ``"default"`` (heuristic schedules) or ``"max-autotune"``.
    ``dump_dir``: write the FX graph, the IR after every pass, the kernels, the wrapper and a
    summary there (also ``MINICOMP_DUMP=dir``).
    """
    if not callable(model):
        raise TypeError(f"minicomp.compile: model must be callable, got {type(model).__name__}")
    from .backend import Backend
    return torch.compile(model, backend=Backend(mode=mode, dump_dir=dump_dir))


def _register_backend() -> None:
    """``torch.compile(model, backend="minicomp")`` after ``import minicomp`` also where the package is
    on ``PYTHONPATH`` but not installed. Where it is installed, its entry point announces it, and
    Dynamo registers it when it loads the entry point (registering it here too would be a duplicate)."""
    from importlib.metadata import entry_points
    if any(e.name == "minicomp" for e in entry_points(group="torch_dynamo_backends")):
        return
    from torch._dynamo import register_backend
    from .backend import minicomp_backend
    register_backend(minicomp_backend, name="minicomp")


_register_backend()

__all__ = ["compile", "report", "reports", "reports_since", "Report", "Options", "PIPELINE", "MODES"]
