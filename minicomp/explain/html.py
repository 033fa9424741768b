"""An ``Explanation`` as one self-contained HTML page: CSS, script and SVG inline, nothing fetched (it
works offline; URLs in the compiler's or Dynamo's text are shown without their scheme). The page: the
summary, the roofline chart, then per graph its drawing, a table of its kernels (click a row, a point
or an op: the kernel's IR and Triton source), what runs in PyTorch and the fusions not taken."""
from __future__ import annotations

from typing import TYPE_CHECKING

from . import text
from .drawing import NOTHING, PYTORCH, drawing
from .roofline import chart, key
from .words import SEPARATE, count, esc, op_name, percent, readable, seconds, size

if TYPE_CHECKING:
    from .collect import GraphRun
    from .explanation import Explanation

GOLDEN_ANGLE = 137.508  # degrees: successive kernels' hues stay far apart

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.4em; } h2 { margin-top: 1.6em; border-bottom: 1px solid #ddd; }
pre { background: #f6f6f6; padding: .6em; overflow: auto; font-size: 12px; }
table { border-collapse: collapse; font-size: 13px; } td, th { padding: 2px 8px; border-bottom: 1px solid #eee;
  text-align: left; vertical-align: top; } td.n { text-align: right; white-space: nowrap; }
tr[data-kernel] { cursor: pointer; } tr[data-kernel]:hover { background: #f3f7ff; }
.swatch { display: inline-block; width: .9em; height: .9em; border-radius: 2px; margin-right: .4em; }
.drawing { overflow: auto; max-height: 70vh; border: 1px solid #eee; }
svg text { font: 11px system-ui, sans-serif; } svg .tick { fill: #555; } svg .label { fill: #333; font-size: 12px; }
svg .plot { fill: #fff; stroke: #999; } svg .grid { stroke: #eee; } svg .roof { fill: none; stroke: #c33; stroke-width: 2; }
svg .edge { stroke: #aaa; fill: none; } svg .op rect { stroke: #666; } svg [data-kernel] { cursor: pointer; }
svg .point { stroke: #333; }
.detail { border: 1px solid #cde; padding: .5em 1em; margin: 1em 0; background: #fbfdff; }
"""

SCRIPT = """
document.addEventListener('click', function (event) {
  var el = event.target.closest('[data-kernel]');
  if (!el) return;
  document.querySelectorAll('.detail').forEach(function (d) { d.hidden = true; });
  var detail = document.getElementById('detail-' + el.getAttribute('data-kernel'));
  if (detail) { detail.hidden = false; detail.scrollIntoView({block: 'nearest'}); }
});
"""


def render(e: "Explanation") -> str:
    colours = {key(k): f"hsl({i * GOLDEN_ANGLE % 360:.0f}, 70%, 72%)" for i, k in enumerate(e.kernels)}
    title = f"minicomp explain: {e.title} on {e.collected.device}"
    body = [f"<h1>{esc(title)}</h1>", "<pre>" + esc("\n".join(line.strip() for line in text.header(e))) + "</pre>",
            "<h2>Roofline</h2>", chart(e.kernels, colours), f"<p>{esc(_roofline_caption(e))}</p>"]
    for g in e.graphs:
        body += graph_section(e, g, colours)
    body.append(f"<p>{esc(text.COUNTING)}</p>")
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>'
            f"<style>{STYLE}</style></head>\n<body>\n" + "\n".join(body) + f"\n<script>{SCRIPT}</script>\n</body></html>\n")


def _roofline_caption(e: "Explanation") -> str:
    if e.collected.peaks is None:
        return ("Device roofs and kernel times: not measured (CPU). Each kernel stands at its arithmetic "
                "intensity; hover a point for its name, click it for its code.")
    return ("Every kernel at its arithmetic intensity and achieved FLOP/s, under the memory roof and the compute "
            "roof of its product type (measured on this device). Hover: name, time, share of the roofline limit.")


def graph_section(e: "Explanation", g: "GraphRun", colours: dict[str, str]) -> list[str]:
    rep, t = g.report, e.totals[g.report.graph]
    out = [f"<h2>Graph {esc(rep.graph)}</h2>",
           f"<p>minicomp: {t.kernels} kernel(s) and {t.pytorch_ops} op(s) in PyTorch, moving {esc(size(t.bytes))}; "
           f"eager: {t.eager_kernels} kernel(s) moving {esc(size(t.eager_bytes))}.</p>"]
    if rep.whole_graph_fallback:
        out.append(f"<p><b>The whole graph runs in PyTorch:</b> {esc(rep.whole_graph_fallback.splitlines()[0])}</p>")
    out.append(f'<p class="legend">Each aten op coloured by its kernel (click: the kernel); <span class="swatch" '
               f'style="background:{PYTORCH}"></span>runs in PyTorch; <span class="swatch" style="background:{NOTHING};'
               f'border:1px solid #666"></span>no kernel (folded away). Views and graph inputs are not drawn.</p>'
               f'<div class="drawing">{drawing(rep, colours)}</div>')
    out += kernel_table(e, rep.graph, colours)
    for k in e.figures[rep.graph]:
        out.append(f'<div class="detail" id="detail-{esc(key(k))}" hidden><h3>{esc(k.info.name)}</h3>'
                   f"<h4>IR</h4><pre>{esc(g.ir.get(k.info.name) or 'not dumped')}</pre>"
                   f"<h4>Triton</h4><pre>{esc(g.source.get(k.info.name) or 'not dumped')}</pre></div>")
    notes = [readable(d, rep) for d in rep.decisions]
    out += _list("Runs in PyTorch", [f"{op_name(x.op)} ({getattr(x.op, 'source', None) or 'source not known'}): "
                                     f"{x.reason}" for x in rep.externs])
    out += _list("Fusions not taken", [n.removeprefix(SEPARATE).strip() for n in notes if n.startswith(SEPARATE)])
    out += _list("Other decisions", [n for n in notes if not n.startswith(SEPARATE)])
    return out


def kernel_table(e: "Explanation", graph: str, colours: dict[str, str]) -> list[str]:
    head = ("kernel", "ops (source)", "read", "write", "FLOPs", "FLOP/B", "bound", "time", "GB/s", "TFLOP/s", "% of limit")
    rows = ["<table><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>"]
    for k in e.figures[graph]:
        ops = "<br>".join(f"{esc(op_name(o))} <small>{esc(getattr(o, 'source', None) or '')}</small>"
                          for o in k.info.covers) or esc(", ".join(map(op_name, k.info.ops)) or text.NO_OP)
        cells = [size(k.info.bytes_read), size(k.info.bytes_written), count(k.flops), f"{k.intensity:.3g}",
                 k.bound or text.NOT_MEASURED, seconds(k.seconds) if k.seconds is not None else text.NOT_MEASURED,
                 f"{k.achieved_bandwidth / 1e9:.3g}" if k.achieved_bandwidth else "",
                 f"{k.achieved_flops / 1e12:.3g}" if k.achieved_flops else "",
                 percent(k.share_of_limit) if k.share_of_limit is not None else ""]
        rows.append(f'<tr data-kernel="{esc(key(k))}"><td><span class="swatch" style="background:{colours[key(k)]}">'
                    f"</span>{esc(k.info.name)}<br><small>{esc(k.info.template)}</small></td><td>{ops}</td>"
                    + "".join(f'<td class="n">{esc(c)}</td>' for c in cells) + "</tr>")
    rows.append("</table>")
    return rows


def _list(title: str, items: list[str]) -> list[str]:
    if not items:
        return []
    return [f"<h3>{esc(title)}</h3><ul>"] + [f"<li>{esc(i)}</li>" for i in items] + ["</ul>"]
