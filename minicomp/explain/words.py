"""The compiler's notes in a reader's words: IR node numbers (``%14``) become the aten op and the user's
source line they came from (a graph input: the user's name for it, ``fc1.weight``), fusion rule tags
(``[cycle]``) become sentences, and numbers get units."""
from __future__ import annotations

import html
import re

from ..ir.placement import MAX_PLACEMENTS
from ..passes.fusion import RULES
from ..report import Report

# Why two kernels stayed apart, by the tag passes/fusion.py (and fusion_attention.py) records
REFUSALS = {
    "cycle": "something else runs between them (another kernel or a PyTorch op that needs the first and "
             "feeds the second), so one kernel for both would wait on itself",
    "gemm-gemm": "two matrix products never share a kernel",
    "gemm-reduction": "a matrix product is computed tile by tile and a reduction needs whole rows, so they "
                      "do not share a kernel",
    "gemm-horizontal": "a matrix product is not merged with independent kernels beside it",
    "gemm-prologue": "the operand's producer is too costly to recompute for every tile of the product",
    "reduction-space": "the two reductions run over different rows or axes",
    "scan-space": "the two scans run along different axes",
    "scan-reduction": "a scan (cumsum, ...) and a reduction do not share a kernel",
    "scan-direction": "a forward and a reversed scan do not share a kernel",
    "store-shape": "a result that must be stored has another shape than the space the kernel iterates over",
    "indexing": "the reader needs the result at other positions than the kernel computes it at",
    "recompute": f"the value would be recomputed at more than {MAX_PLACEMENTS} positions per element",
    "attention": "the attention kernel takes in only the producers of its q, k, v and mask",
    "attention-prologue": "only cheap pointwise ops run on the attention kernel's loaded tiles",
}
FUSIONS = dict(RULES)
SEPARATE = "kept apart:"  # the opening of a fusion not taken  # what each fusion rule fuses, in passes/fusion.py's words

_NODE = re.compile(r"%(\d+)")
_SCHEME = re.compile(r"\bhttps?://", re.I)
_FUSION_NOTE = re.compile(r"(not fused|fused): %(\d+) -> %(\d+) \[([\w-]+)\] ?(.*)", re.S)


def op_name(origin: str) -> str:
    """``addmm`` for ``addmm.default``."""
    return str(origin).split(".")[0]


def where(origin) -> str:
    """``mlp.py:12`` for an origin that knows its source line, else ""."""
    source = getattr(origin, "source", None)
    return source.short if source else ""


def node_words(node_id: int, rep: Report) -> str:
    """IR node ``node_id`` as the aten op it came from and where: ``relu (mlp.py:12)``; a graph input as
    the user's name for it (``fc1.weight``, ``x``)."""
    if node_id in rep.input_names:
        return rep.input_names[node_id]
    origins = rep.node_origins.get(node_id)
    if not origins:  # not known, or made by minicomp (a layout copy): the note says what
        return f"%{node_id}"
    line = where(origins[0])
    return f"{op_name(origins[0])} ({line})" if line else op_name(origins[0])


def readable(decision: str, rep: Report) -> str:
    """One of the report's decisions in a reader's words."""
    m = _FUSION_NOTE.fullmatch(decision)
    if m is None:
        return _NODE.sub(lambda n: node_words(int(n[1]), rep), decision)
    what, a, b, rule, detail = m.groups()
    first, second = node_words(int(a), rep), node_words(int(b), rep)
    specific = _NODE.search(detail)  # the pass's note names nodes: it says more than the rule's sentence
    detail = _NODE.sub(lambda n: node_words(int(n[1]), rep), detail).strip()
    if what == "fused":
        return f"{first} joined the kernel of {second} ({FUSIONS.get(rule, rule)}) {detail}".strip()
    why = REFUSALS.get(rule, detail or f"rule {rule}")
    return f"{SEPARATE} the kernels of {first} and of {second}: {why}" + (f" ({detail})" if specific else "")


def size(n: float) -> str:
    """Bytes with an SI unit: ``2.4 kB``."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{int(n)} B"


def count(n: float, unit: str = "") -> str:
    """A count with an SI prefix: ``4.35 kFLOP``, ``1.2 TFLOP/s``."""
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {prefix}{unit}"
    return f"{n:.3g} {unit}".strip()


def seconds(s: float) -> str:
    if s >= 1:
        return f"{s:.3g} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    if s >= 1e-6:
        return f"{s * 1e6:.3g} µs"
    return f"{s * 1e9:.3g} ns"


def percent(share: float) -> str:
    """``41%``; a share under 1% keeps two digits (``0.025%``: a launch far from its roof)."""
    return f"{share:.0%}" if share >= 0.01 else f"{share * 100:.2g}%"


def esc(value) -> str:
    """Text for the HTML page: escaped, and without URL schemes (the page refers to nothing outside itself)."""
    return html.escape(_SCHEME.sub("", str(value)))
