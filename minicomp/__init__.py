"""minicomp: a small, readable ML compiler for PyTorch.

    compiled = minicomp.compile(model)            # or torch.compile(model, backend="minicomp")
    compiled(x)
    print(minicomp.report())                      # kernels, fallbacks and decisions
    minicomp.explain(model, x).save("report.html")  # per kernel: source lines, bytes, FLOPs, roofline
"""
from __future__ import annotations

from typing import Callable

import torch

from .graphs.options import MODES, PIPELINE, Options
from .explain import Explanation, explain  # (the function named like its package: minicomp.explain is it)
from .report import Report, report, reports, reports_since

__version__ = "0.1.0"


def compile(model: Callable, *, mode: str = "default", dump_dir: str | None = None,
            static_outputs: bool = False, freeze: bool = False, cpu: str | None = None) -> Callable:
    """Compile ``model`` (an ``nn.Module`` or a function of tensors) with minicomp.

    ``mode``, as torch.compile names them:
      * ``"default"``: heuristic schedules (and tuned ones stored earlier), plain kernel launches;
      * ``"reduce-overhead"``: each CUDA graph specialization captured in a CUDA graph and replayed
        (inputs copied into static buffers, parameters and buffers not; ``report()`` says per graph
        whether it was captured or why not);
      * ``"max-autotune"``: schedules and GEMM backends measured on the GPU, and CUDA graphs;
      * ``"max-autotune-no-cudagraphs"``: measured, plain launches.
    ``dump_dir``: write the FX graph, the IR after every pass, the kernels, the wrapper and a
    summary there (also ``MINICOMP_DUMP=dir``).
    ``static_outputs`` (CUDA graphs only): return the graph's own output buffers instead of copies:
    faster, but the next call of the same graph overwrites the results of the previous one.
    ``freeze`` (inference: under ``torch.no_grad()``/``inference_mode()``): parameters that
    convolutions read become constants taken at the first call, batch norm after a convolution is
    folded into its weights (fp32; half precision: an fp32 scale and shift after the unrounded
    weights), weights are converted to channels-last once; a per-call check of those parameters'
    versions compiles again when they change in place (``frontend/freeze.py``). Ignored, and
    reported, where a backward may follow.
    ``cpu``: what runs a graph whose tensors are all on the CPU: ``"pytorch"`` (PyTorch's own CPU
    kernels, the whole graph, said once per process and in the report) or ``"interpret"``
    (minicomp's Triton kernels in Triton's interpreter: to see and test them, ~1,000x slower than
    eager). Default: ``MINICOMP_CPU``, else ``"pytorch"``.
    """
    if not callable(model):
        raise TypeError(f"minicomp.compile: model must be callable, got {type(model).__name__}")
    from .backend import Backend
    return torch.compile(model, backend=Backend(mode=mode, dump_dir=dump_dir, static_outputs=static_outputs,
                                                freeze=freeze, cpu=cpu))


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

__all__ = ["compile", "explain", "Explanation", "report", "reports", "reports_since", "Report", "Options", "PIPELINE", "MODES"]
