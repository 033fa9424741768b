"""Errors that eager raises on the values of a call, which a compiled graph raises too.

Kernels check what eager checks: the indices of gathers and scatters (``IndexCheck``,
``codegen/triton.py``) and, on the CPU, integer divisions by zero (``codegen/helpers.py``'s
``_check_divisor``). In Triton's interpreter a check raises eager's exception inside the kernel, which
the interpreter wraps (as the cause of its own error); on a GPU an index check
is a device-side assert, which surfaces as a CUDA error at the next launch or synchronization (a
device-side assert leaves the CUDA context unusable, as eager's does). ``surfaced`` turns either,
where it reaches minicomp's runtime, back into eager's error. A fallback op raises eager's exception
itself. Any of them is the caller's error, not a failure of the compiled code: the compiler lets it
through instead of running the graph in PyTorch from then on (``is_eager_error``).

``EAGER_ERRORS`` lists the errors a check raises other than ``IndexOutOfRange``, as (type, message
pattern); add a check's error here with the check.
"""
from __future__ import annotations

import re

from .triton_shims import interpreted_int

EAGER_ERRORS: tuple[tuple[type, str], ...] = (
    (RuntimeError, r"ZeroDivisionError"),  # integer //, %, fmod, div(rounding_mode=...) by zero, CPU
)


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


def is_eager_error(error: BaseException) -> bool:
    """Whether ``error`` is one eager raises on the call's values (an index out of range, or exactly the
    type and message of one of ``EAGER_ERRORS``)."""
    return isinstance(error, IndexOutOfRange) or any(
        type(error) is kind and re.fullmatch(pattern, str(error)) for kind, pattern in EAGER_ERRORS)


def same_as_eager(error: BaseException, eager: BaseException) -> bool:
    """Whether ``eager``, raised by the graph in PyTorch on the values a compiled graph's first run failed
    on, is that run's ``error``: the same type and message (a float64 input into a float32 model, which
    the compiled graph's fallback op and eager reject alike). Never a CUDA error: once a kernel faults,
    every later launch raises the same one, eager's too."""
    return type(error) is type(eager) and str(error) == str(eager) and "CUDA error" not in str(error)


def surfaced(error: BaseException, checking: tuple[str, ...]) -> BaseException | None:
    """The eager error that ``error`` (raised while a graph ran) stands for, or None: one a kernel raised
    inside the interpreter's error around it, or a device-side assert where the graph has kernels that
    check indices (``checking``: their names)."""
    seen = error
    while seen is not None:  # the interpreter re-raises a kernel's exception as its own error, caused by it
        if is_eager_error(seen):
            return seen
        seen = seen.__cause__
    if checking and isinstance(error, RuntimeError) and "device-side assert" in str(error):
        return IndexOutOfRange(f"a device-side assert fired while the graph ran: an index out of range in one of "
                               f"the kernels that check indices ({', '.join(checking)}), as eager would raise "
                               f"(the CUDA context is unusable from now on; CUDA_LAUNCH_BLOCKING=1 names the "
                               f"kernel): {str(error).splitlines()[0]}")
    return None
