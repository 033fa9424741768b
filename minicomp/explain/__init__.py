"""``minicomp.explain(model, *example_inputs)``: how ``model(*example_inputs)`` becomes kernels, and on a
CUDA device where the time goes against the device's roofline.

    report = minicomp.explain(model, x)
    print(report)                     # per kernel: the aten ops and source lines it covers, bytes, FLOPs, ...
    report.save("report.html")        # one self-contained page: the graph, each kernel's IR and Triton
                                      # source on click, a roofline chart

Command line: ``python -m minicomp explain FILE.py [--out report.html]``, where FILE.py defines
``model`` (an ``nn.Module`` or a function) and ``example_inputs`` (a tuple of its arguments, or one
tensor); the file runs as a script would, without its ``if __name__ == "__main__":`` part.

The model is compiled afresh (no graph cache) and run once under ``torch.no_grad()``. On the CPU the
kernels run in Triton's interpreter: the static figures are shown, times and device roofs are not
measured. Modules: ``collect`` (compile, run, measure), ``figures`` (the numbers), ``device_peaks``,
``timing``, ``words`` (the compiler's notes in a reader's words), ``text``, ``html``, ``svg``.
Nothing in minicomp imports this package but ``minicomp/__init__.py`` and ``__main__.py``.
"""
from __future__ import annotations

from typing import Callable

from .collect import collect
from .explanation import Explanation


def explain(model: Callable, *example_inputs, mode: str = "default", **kwargs) -> Explanation:
    """Compile ``model`` with minicomp (``mode`` as ``minicomp.compile``'s), run it once on
    ``example_inputs`` (and ``kwargs``, its keyword arguments) and explain what ran."""
    title = getattr(model, "__name__", None) or type(model).__name__  # a function's name, a module's class
    return Explanation(title, collect(model, example_inputs, kwargs, mode))


__all__ = ["explain", "Explanation"]
