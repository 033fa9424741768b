"""An ``Explanation`` as plain text: per graph, each kernel with the ops it covers and their source
lines, its traffic, FLOPs, intensity and (on CUDA) its time against the roofline; then what runs in
PyTorch, the fusions not taken and the other decisions, in a reader's words."""
from __future__ import annotations

from typing import TYPE_CHECKING

from .figures import KernelFigures
from .words import SEPARATE, count, op_name, percent, readable, seconds, size

if TYPE_CHECKING:
    from .collect import GraphRun
    from .explanation import Explanation

NOT_MEASURED = "not measured"
NO_OP = "no op of the model: copies minicomp adds (a layout change)"
COUNTING = ("Bytes are the compulsory traffic: each buffer a kernel reads or writes, counted once. FLOPs: "
            "2·M·N·K per matrix product, one per element per pointwise op, one per input element per "
            "reduction (minicomp/ir/cost.py).")


def render(e: "Explanation") -> str:
    lines = [f"minicomp explain: {e.title} on {e.collected.device}"] + header(e)
    for g in e.graphs:
        lines += [""] + graph_lines(e, g)
    lines += ["", COUNTING]
    return "\n".join(lines) + "\n"


def header(e: "Explanation") -> list[str]:
    c = e.collected
    if c.peaks is None:
        lines = [f"  device roofs: {NOT_MEASURED}; kernel times: {NOT_MEASURED}"
                 + (" (CPU: the kernels run in Triton's interpreter)" if c.device.type == "cpu" else "")]
    else:
        p = c.peaks
        roofs = ", ".join(f"{name} {count(v, 'FLOP/s')}" for name, v in p.flops.items())
        lines = [f"  device: {p.device}: {size(p.bandwidth)}/s; {roofs} (measured once, cached)"]
    if c.timings is not None:
        t = c.timings
        ours = sum(k.seconds or 0 for k in e.kernels)
        lines.append(f"  one call: {seconds(t.call)}; minicomp's kernels {seconds(ours)}, PyTorch's kernels "
                     f"{seconds(t.others)} (device time, torch.profiler)")
    breaks = c.breaks
    lines.append(f"  Dynamo: {c.dynamo_graphs} graph(s), " + (f"{len(breaks)} graph break(s):" if breaks else "no graph breaks"))
    lines += [f"    at {b.where}: {_first_lines(b.reason)}" for b in breaks]
    return lines


def graph_lines(e: "Explanation", g: "GraphRun") -> list[str]:
    rep, t = g.report, e.totals[g.report.graph]
    lines = [f"graph {rep.graph}: {t.kernels} kernel(s) and {t.pytorch_ops} op(s) in PyTorch moving {size(t.bytes)}; "
             f"eager: {t.eager_kernels} kernel(s) moving {size(t.eager_bytes)}"]
    if rep.whole_graph_fallback:
        lines.append(f"  the whole graph runs in PyTorch: {rep.whole_graph_fallback.splitlines()[0]}")
    for k in e.figures[rep.graph]:
        lines += kernel_lines(k)
    if rep.externs:
        lines.append("  runs in PyTorch:")
        lines += [f"    {op_name(x.op)}{_at(x.op)}: {x.reason}" for x in rep.externs]
    notes = [readable(d, rep) for d in rep.decisions]
    separate = [n for n in notes if n.startswith(SEPARATE)]
    if separate:
        lines.append("  fusions not taken:")
        lines += [f"    {n}" for n in separate]
    others = [n for n in notes if n not in separate]
    if others:
        lines.append("  decisions:")
        lines += [f"    {n}" for n in others]
    return lines


def kernel_lines(k: KernelFigures) -> list[str]:
    lines = [f"  {k.info.name}  ({k.info.template})"]
    width = max((len(op_name(o)) for o in k.info.covers), default=0)
    lines += [f"      {op_name(o):<{width}}  {getattr(o, 'source', None) or 'source not known'}" for o in k.info.covers]
    if not k.info.covers:
        lines.append(f"      {', '.join(map(op_name, k.info.ops)) or NO_OP}")
    lines.append(f"      read {size(k.info.bytes_read)}, write {size(k.info.bytes_written)}; {count(k.flops, 'FLOP')}; "
                 f"{k.intensity:.3g} FLOP/B")
    lines.append(f"      {roofline_words(k)}")
    return lines


def roofline_words(k: KernelFigures) -> str:
    """Where the kernel stands against the roofline, in one line."""
    if k.bound is None:
        return f"bound: {NOT_MEASURED}; time: {NOT_MEASURED}"
    ridge = k.peaks.ridge(k.info.product_math)
    words = f"{k.bound}-bound (ridge {ridge:.3g} FLOP/B); limit {seconds(k.limit_seconds)}"
    if k.seconds is None:
        return words + f"; time: {NOT_MEASURED}"
    return (words + f"; time {seconds(k.seconds)}: {size(k.achieved_bandwidth)}/s, {count(k.achieved_flops, 'FLOP/s')}, "
            f"{percent(k.share_of_limit)} of the limit")


def _at(origin) -> str:
    source = getattr(origin, "source", None)
    return f" ({source})" if source else ""


def _first_lines(reason: str) -> str:
    """Dynamo's reason: its headline and its explanation, on one line."""
    kept = [line.strip() for line in reason.splitlines() if line.strip() and not line.strip().startswith("Hint")]
    return " ".join(kept[:2])
