"""What the compiler did with a graph: kernels, fallbacks, decisions, in a form tests and
people can read."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class KernelInfo:
    name: str
    template: str          # pointwise, tiled, reduction (persistent/looped)
    ops: tuple[str, ...]   # the aten ops it covers
    source_path: str
    bytes_moved: int
    function: str = ""     # the Triton function (named by content: identical kernels share it)
    stages: tuple[str, ...] = ()  # a staged launch (pipeline, split-combine, combo): the kernels it runs
    # for ``minicomp.explain``: its buffers' bytes (what it must read and write at least), its FLOPs and
    # what its products run on (``ir/cost.py``), the FX ops it computes (``ir/origin.Origin``s)
    bytes_read: int = 0
    bytes_written: int = 0
    flops: int = 0
    product_math: str = ""
    covers: tuple[str, ...] = ()

    def __str__(self) -> str:
        function = f"  [{self.function}]" if self.function else ""
        stages = f"  ({' + '.join(self.stages)})" if self.stages else ""
        return f"{self.name:<48} {self.template:<22} {', '.join(self.ops)}{function}{stages}"


@dataclass
class Fallback:
    op: str
    reason: str

    def __str__(self) -> str:
        return f"{self.op}: {self.reason}"


@dataclass
class Report:
    graph: str
    kernels: list[KernelInfo] = field(default_factory=list)
    fallbacks: list[Fallback] = field(default_factory=list)
    decisions: list[str] = field(default_factory=list)
    whole_graph_fallback: str | None = None  # why the graph runs in PyTorch, if it does
    compile_seconds: float = 0.0
    dump_dir: str | None = None
    cache: dict = field(default_factory=dict)
    from_cache: bool = False  # loaded whole from the graph cache (no tracing, no codegen)
    cuda_graph: str | None = None  # reduce-overhead / max-autotune: captured, or why not (one line)
    collectives: list[str] = field(default_factory=list)  # in program order: all_reduce(sum, group 0), wait_tensor
    # for ``minicomp.explain`` (``Options.explain``): the traced graph's aten ops (``frontend/provenance.FxOp``)
    # and what every IR node id came from (``Node.origin``: decisions name nodes by id); always: the ops
    # the compiled graph runs in PyTorch (fallbacks, and the cuBLAS/cuDNN calls passes chose) and why
    fx_ops: list = field(default_factory=list)
    node_origins: dict[int, tuple[str, ...]] = field(default_factory=dict)
    # for ``minicomp.explain``: each graph input's IR node id -> the user's name (``fc1.weight``, ``x``; the
    # dumps' ``argN`` where not known), so notes that name an input say which one
    input_names: dict[int, str] = field(default_factory=dict)
    externs: list[Fallback] = field(default_factory=list)
    # when dumping: each IR pass in order -> whether it changed the IR (``passes/manager.PassDumps``)
    passes: dict[str, bool] = field(default_factory=dict)

    def summary(self) -> str:
        lines = [f"graph {self.graph}: {len(self.kernels)} kernel(s), {len(self.fallbacks)} fallback op(s), "
                 + (f"loaded from the graph cache in {self.compile_seconds:.3f}s" if self.from_cache
                    else f"compiled in {self.compile_seconds:.2f}s")]
        if self.whole_graph_fallback:
            lines.append(f"whole graph runs in PyTorch: {self.whole_graph_fallback}")
        if self.cuda_graph:
            lines.append(f"CUDA graph: {self.cuda_graph}")
        if self.kernels:
            lines.append("kernels:")
            lines += [f"  {k}" for k in self.kernels]
        if self.collectives:
            lines.append(f"collectives (run by PyTorch, in this order): {', '.join(self.collectives)}")
        if self.fallbacks:
            lines.append("fallbacks (run by PyTorch):")
            lines += [f"  {f}" for f in self.fallbacks]
        if self.decisions:
            lines.append("decisions:")
            lines += [f"  {d}" for d in self.decisions]
        if self.passes:
            lines.append(f"passes that changed the IR: {_names(p for p, c in self.passes.items() if c)}")
            lines.append(f"passes that left it as it was: {_names(p for p, c in self.passes.items() if not c)}")
        return "\n".join(lines) + "\n"

    __str__ = summary


def _names(names) -> str:
    return ", ".join(names) or "none"


_reports: list[Report] = []


def record(report: Report) -> None:
    _reports.append(report)
    del _reports[:-100]


def report() -> Report | None:
    """The report of the most recently compiled graph (None before any compile)."""
    return _reports[-1] if _reports else None


def reports() -> list[Report]:
    """Reports of the recently compiled graphs, oldest first."""
    return list(_reports)


def reports_since(before: Report | None) -> list[Report]:
    """The reports of the graphs compiled after ``before`` (``report()`` as it was then; None: all)."""
    for i in range(len(_reports) - 1, -1, -1):
        if _reports[i] is before:
            return _reports[i + 1:]
    return list(_reports)  # before is None (nothing compiled yet) or older than the kept 100
