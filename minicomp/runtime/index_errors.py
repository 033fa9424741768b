"""The error a compiled graph raises for an index out of range, as eager raises an ``IndexError``.

Kernels check the indices they read (``IndexCheck``, ``codegen/triton.py``). In Triton's interpreter
the check raises ``IndexOutOfRange`` inside the kernel, which the interpreter wraps in its own error;
on a GPU it is a device-side assert, which surfaces as a CUDA error at the next launch or
synchronization: ``surfaced`` turns either, where it reaches minicomp's runtime, back into an
``IndexOutOfRange``. (A device-side assert leaves the CUDA context unusable, as eager's does.)
"""
from __future__ import annotations

from .triton_shims import interpreted_int


class IndexOutOfRange(IndexError, RuntimeError):
    """An index out of range in a compiled graph's gather or scatter. Not a compile failure: the graph
    stays compiled, and the next call with valid indices runs it. An ``IndexError``, as eager raises
    for embedding, index_select and indexing, and a ``RuntimeError``, as it raises for gather and
    scatter (and for a device-side assert)."""

    def __init__(self, message: str, lo: int | None = None, low=None, high=None):
        """``low``/``high``: the smallest and largest offending values a kernel found (the first
        names the error where it is below ``lo``)."""
        if low is not None:
            low, high = interpreted_int(low), interpreted_int(high)
            value = low if lo is not None and low < lo else high
            message = f"index out of range in self: index {value}: {message}"
        super().__init__(message)


def surfaced(error: BaseException, checking: tuple[str, ...]) -> IndexOutOfRange | None:
    """The ``IndexOutOfRange`` that ``error`` (raised while a graph ran) stands for, or None: the
    interpreter's error around one, or a device-side assert where the graph has kernels that check
    indices (``checking``: their names)."""
    seen = error
    while seen is not None:
        if isinstance(seen, IndexOutOfRange):
            return seen
        seen = seen.__cause__  # the interpreter raises its error from the kernel's
    if checking and isinstance(error, RuntimeError) and "device-side assert" in str(error):
        return IndexOutOfRange(f"a device-side assert fired while the graph ran: an index out of range in one of "
                               f"the kernels that check indices ({', '.join(checking)}), as eager would raise "
                               f"(the CUDA context is unusable from now on; CUDA_LAUNCH_BLOCKING=1 names the "
                               f"kernel): {str(error).splitlines()[0]}")
    return None
