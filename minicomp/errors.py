"""minicomp's own exception (its own module: the compiler and the assembly of its output both raise it)."""


class MinicompError(RuntimeError):
    """minicomp could not compile a graph (raised only under ``MINICOMP_STRICT=1``; otherwise the
    graph runs in PyTorch and the report says why)."""
