"""Errors that eager raises on the values of a call, which a compiled graph raises too.

A kernel may check what eager checks (an integer division by zero on the CPU: ``codegen/spellings.py``)
and raise eager's exception from inside Triton's interpreter, which wraps it (``triton_shims.
raised_in_kernel`` takes it out again; ``Executable`` raises it as it was). A fallback op raises
eager's exception itself. Either is the caller's error, not a failure of the compiled code: the
compiler lets it through instead of running the graph in PyTorch from then on (``is_eager_error``).

``EAGER_ERRORS`` lists them as (type, message pattern); add a check's error here with the check.
"""
from __future__ import annotations

import re

from .triton_shims import raised_in_kernel

EAGER_ERRORS: tuple[tuple[type, str], ...] = (
    (RuntimeError, r"ZeroDivisionError"),  # integer //, %, fmod, div(rounding_mode=...) by zero, CPU
)


def is_eager_error(error: BaseException) -> bool:
    """Whether ``error`` is one eager raises on the call's values (exactly its type and message)."""
    return any(type(error) is kind and re.fullmatch(pattern, str(error)) for kind, pattern in EAGER_ERRORS)


def unwrapped(error: BaseException) -> BaseException:
    """The eager error a kernel raised, where Triton's interpreter wrapped one in ``error``; else ``error``."""
    inner = raised_in_kernel(error)
    return inner if inner is not None and is_eager_error(inner) else error
