"""The object a compiled graph runs as: what ``load`` returns."""
from __future__ import annotations

import threading
from types import ModuleType
from typing import Callable

import torch

from .eager_errors import surfaced
from .support import INTERPRETER_LOCK


class Executable:
    """A loaded graph, ready to call with the graph's arguments (a list).

    Holds the generated wrapper module (``codegen/wrapper.py``), the kernels it launches (launch name
    -> Triton function) and the fallback ops and constants it takes (``externs``, keyed as the wrapper
    names them). ``interpreted``: the kernels run in Triton's interpreter, which patches
    ``triton.language`` while it runs, so calls from several threads take turns.

    On a GPU the first call launches through Triton's own path (which compiles what is not compiled
    yet) and notes each launch's compiled kernel; its launches are then bound once (``wrapper.bind``)
    and later calls on the same current device take that lean path (``lean``; ``lean_failed`` says why
    not, when it could not be bound).

    An error eager would raise on these values that a kernel's check caught (an index out of range,
    an integer division by zero on the CPU) is raised as eager's (``eager_errors.surfaced``), whichever
    way the kernels run (the wrapper's ``INDEX_CHECKS`` names the kernels that check indices)."""

    __slots__ = ("module", "kernels", "externs", "interpreted", "lean", "lean_failed", "_lock")

    def __init__(self, module: ModuleType, kernels: dict[str, Callable], externs: dict[int, object],
                 interpreted: bool):
        self.module, self.kernels, self.externs, self.interpreted = module, kernels, externs, interpreted
        self.lean: Callable | None = None
        self.lean_failed: str | None = None
        self._lock = threading.Lock()

    def __call__(self, args):
        try:
            lean = self.lean
            if lean is not None and torch._C._cuda_getDevice() == self.module.DEVICE_INDEX:
                return lean(args)
            if self.interpreted:
                with INTERPRETER_LOCK:
                    return self.module.call(args, self.kernels, self.externs, {})
            compiled: dict = {}
            out = self.module.call(args, self.kernels, self.externs, compiled)
        except Exception as e:
            found = surfaced(e, getattr(self.module, "INDEX_CHECKS", ()))
            if found is None:
                raise
            # the kernel's own error keeps its traceback; one made from a CUDA error names that
            raise found from (None if found.__traceback__ is not None else e)
        if self.lean is None and self.lean_failed is None and self.module.DEVICE_INDEX is not None:
            self._bind(compiled)
        return out

    def _bind(self, compiled: dict) -> None:
        """Bind every launch to the kernel a complete call compiled (once; threads may race here)."""
        with self._lock:
            if self.lean is not None or self.lean_failed is not None:
                return
            try:
                self.lean = self.module.bind(self.kernels, compiled, self.externs)
            except Exception as e:  # noqa: BLE001 - Triton's own path keeps working
                self.lean_failed = f"{type(e).__name__}: {e}"
                return
            if self.lean is None:
                self.lean_failed = "a launch could not be bound (see runtime/triton_shims.lean_launcher)"

    def __repr__(self) -> str:
        mode = "interpreted" if self.interpreted else "lean" if self.lean else "compiled"
        return f"<Executable: {len(self.kernels)} kernel(s), {len(self.externs)} extern(s), {mode}>"
