"""``Explanation``: what ``minicomp.explain`` returns. It prints as text (``str``) and renders one
self-contained HTML file (``html(path)`` / ``save(path)``)."""
from __future__ import annotations

from pathlib import Path

from .collect import Collected, GraphRun
from .figures import GraphTotals, KernelFigures, graph_totals, kernel_figures


class Explanation:
    def __init__(self, title: str, collected: Collected):
        self.title, self.collected = title, collected
        per_launch = collected.timings.per_launch if collected.timings else None
        self.graphs: list[GraphRun] = collected.graphs
        self.figures: dict[str, list[KernelFigures]] = {
            g.report.graph: kernel_figures(g.report, collected.peaks, per_launch) for g in self.graphs}
        self.totals: dict[str, GraphTotals] = {g.report.graph: graph_totals(g.report) for g in self.graphs}

    @property
    def kernels(self) -> list[KernelFigures]:
        """Every kernel of every graph, in graph and launch order."""
        return [k for g in self.graphs for k in self.figures[g.report.graph]]

    @property
    def measured(self) -> bool:
        return self.collected.timings is not None

    def __str__(self) -> str:
        from .text import render
        return render(self)

    def html(self, path: str | Path | None = None) -> str:
        """The report as one HTML page (no network fetches: CSS, script and SVG inline); written to
        ``path`` if given."""
        from .html import render
        page = render(self)
        if path is not None:
            Path(path).write_text(page, encoding="utf-8")
        return page

    def save(self, path: str | Path) -> Path:
        """Write the HTML page to ``path``."""
        self.html(path)
        return Path(path)
