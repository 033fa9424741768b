"""The roofline chart as inline SVG: arithmetic intensity (FLOP/byte) across, FLOP/s up, both
logarithmic; the memory roof (bandwidth × intensity) and a compute roof per product type in use, and
every kernel a point at its intensity and achieved FLOP/s (hover: its name, time and share of the
limit). Without measurements (the CPU) the points stand on one line at their intensity and no roofs
are drawn."""
from __future__ import annotations

import math

from .figures import KernelFigures
from .words import count, esc, percent, seconds

WIDTH, HEIGHT = 640, 400
LEFT, RIGHT, TOP, BOTTOM = 70, 20, 20, 50  # margins: room for the axes' labels


class _Axes:
    """Decades ``[10**x0, 10**x1]`` by ``[10**y0, 10**y1]`` mapped onto the plot area."""

    def __init__(self, xs: list[float], ys: list[float]):
        self.x0, self.x1 = _decades(xs)
        self.y0, self.y1 = _decades(ys)

    def x(self, v: float) -> float:
        f = (math.log10(max(v, 10 ** self.x0)) - self.x0) / (self.x1 - self.x0)
        return LEFT + f * (WIDTH - LEFT - RIGHT)

    def y(self, v: float) -> float:
        f = (math.log10(max(v, 10 ** self.y0)) - self.y0) / (self.y1 - self.y0)
        return HEIGHT - BOTTOM - f * (HEIGHT - TOP - BOTTOM)


def _decades(values: list[float]) -> tuple[int, int]:
    """The whole decades around the positive ``values`` (at least one decade)."""
    logs = [math.log10(v) for v in values if v > 0] or [0.0]
    lo, hi = math.floor(min(logs)), math.ceil(max(logs))
    return lo, max(hi, lo + 1)


def chart(kernels: list[KernelFigures], colours: dict[str, str]) -> str:
    """``colours``: a kernel's fill by its ``key`` (graph/name)."""
    peaks = next((k.peaks for k in kernels if k.peaks is not None), None)
    timed = [k for k in kernels if k.achieved_flops]
    maths = sorted({k.info.product_math or "float32" for k in kernels} | {"float32"})  # ("": the CUDA cores')
    xs = [k.intensity for k in kernels] + ([peaks.ridge(m) for m in maths] if peaks else [])
    ys = [k.achieved_flops for k in timed] + ([peaks.compute(m) for m in maths] if peaks else [1.0])
    axes = _Axes(xs, ys)
    parts = [f'<svg class="roofline" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" '
             f'role="img" aria-label="roofline chart">', _frame(axes, measured=peaks is not None)]
    if peaks is not None:
        parts += [_roof(axes, peaks, m) for m in maths]
    for k in kernels:
        parts.append(_point(axes, k, colours.get(key(k), "#888"), on_roof=peaks is not None and k.seconds is not None))
    parts.append("</svg>")
    return "\n".join(parts)


def key(k: KernelFigures) -> str:
    return f"{k.graph}/{k.info.name}"


def _frame(axes: _Axes, measured: bool) -> str:
    bottom, right = HEIGHT - BOTTOM, WIDTH - RIGHT
    out = [f'<rect x="{LEFT}" y="{TOP}" width="{right - LEFT}" height="{bottom - TOP}" class="plot"/>']
    for d in range(axes.x0, axes.x1 + 1):
        x = axes.x(10.0 ** d)
        out.append(f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{bottom}" class="grid"/>'
                   f'<text x="{x:.1f}" y="{bottom + 16}" class="tick" text-anchor="middle">{_tick(d)}</text>')
    if measured:
        for d in range(axes.y0, axes.y1 + 1):
            y = axes.y(10.0 ** d)
            out.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}" class="grid"/>'
                       f'<text x="{LEFT - 6}" y="{y + 4:.1f}" class="tick" text-anchor="end">{_tick(d)}</text>')
    y_label = "FLOP/s achieved" if measured else "FLOP/s: not measured"
    out.append(f'<text x="{(LEFT + right) / 2}" y="{HEIGHT - 8}" class="label" text-anchor="middle">'
               f'arithmetic intensity (FLOP/byte)</text>'
               f'<text x="14" y="{(TOP + bottom) / 2}" class="label" text-anchor="middle" '
               f'transform="rotate(-90 14 {(TOP + bottom) / 2})">{y_label}</text>')
    return "\n".join(out)


def _tick(decade: int) -> str:
    return count(10.0 ** decade).replace(" ", "") if decade >= 0 else f"{10.0 ** decade:g}"


def _roof(axes: _Axes, peaks, product_math: str) -> str:
    """The memory roof up to the ridge point, then this product type's compute roof."""
    lo, hi, ridge, top = 10.0 ** axes.x0, 10.0 ** axes.x1, peaks.ridge(product_math), peaks.compute(product_math)
    points = [(lo, peaks.bandwidth * lo), (ridge, top), (hi, top)]
    path = " ".join(f"{axes.x(x):.1f},{axes.y(y):.1f}" for x, y in points)
    name = "float32 (CUDA cores)" if product_math == "float32" else product_math
    return (f'<polyline points="{path}" class="roof"><title>{esc(name)}: {count(top, "FLOP/s")}, '
            f'ridge {ridge:.3g} FLOP/B</title></polyline>'
            f'<text x="{WIDTH - RIGHT - 4}" y="{axes.y(top) - 4:.1f}" class="tick" text-anchor="end">'
            f'{esc(name)} {count(top, "FLOP/s")}</text>')


def _point(axes: _Axes, k: KernelFigures, colour: str, on_roof: bool) -> str:
    x = axes.x(k.intensity) if k.intensity > 0 else LEFT  # (a copy: no FLOPs, at the left edge)
    if not on_roof:
        y = (TOP + HEIGHT - BOTTOM) / 2  # not measured: one line across the middle
    else:
        y = axes.y(k.achieved_flops) if k.achieved_flops else HEIGHT - BOTTOM
    time = seconds(k.seconds) if k.seconds is not None else "time not measured"
    share = f", {percent(k.share_of_limit)} of the limit ({k.bound}-bound)" if k.share_of_limit is not None else ""
    return (f'<circle class="point" cx="{x:.1f}" cy="{y:.1f}" r="6" fill="{colour}" data-kernel="{esc(key(k))}">'
            f'<title>{esc(k.info.name)}: {time}{share}; {k.intensity:.3g} FLOP/B</title></circle>')
