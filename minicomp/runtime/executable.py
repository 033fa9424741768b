"""The object a compiled graph runs as: what ``load`` returns."""
from __future__ import annotations

from typing import Callable

from .support import INTERPRETER_LOCK


class Executable:
    """A loaded graph, ready to call with the graph's arguments (a list).

    Holds the generated wrapper's ``call``, the kernels it launches (launch name -> Triton function),
    and the fallback ops and constants it takes (``externs``, keyed as the wrapper names them).
    ``interpreted``: the kernels run in Triton's interpreter, which patches ``triton.language`` while
    it runs, so calls from several threads take turns. This is where static buffers and a captured CUDA
    graph would live (issue 16)."""

    __slots__ = ("call", "kernels", "externs", "interpreted")

    def __init__(self, call: Callable, kernels: dict[str, Callable], externs: dict[int, object],
                 interpreted: bool):
        self.call, self.kernels, self.externs, self.interpreted = call, kernels, externs, interpreted

    def __call__(self, args):
        if self.interpreted:
            with INTERPRETER_LOCK:
                return self.call(args, self.kernels, self.externs)
        return self.call(args, self.kernels, self.externs)

    def __repr__(self) -> str:
        mode = "interpreted" if self.interpreted else "compiled"
        return f"<Executable: {len(self.kernels)} kernel(s), {len(self.externs)} extern(s), {mode}>"
