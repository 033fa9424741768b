"""The pass manager: a pipeline is a list of named passes (data), run in order, each followed by
the verifier and, when dumping, by ``NN_<pass>.txt`` in the dump folder (``PassDumps``).

A pass is ``Graph -> Graph``. One that needs what the graph does not hold (the ``tune`` pass: the
inputs to time with, a way to build a callable) names it in ``needs``, and ``run_pipeline`` hands it
over from its keyword arguments (None where the caller has none)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from ..ir.graph import Graph
from ..ir.verifier import verify


@dataclass(frozen=True)
class Pass:
    name: str
    run: Callable[..., Graph]
    doc: str = ""
    needs: tuple[str, ...] = ()  # keyword arguments ``run`` takes from ``run_pipeline``'s context

    def __str__(self) -> str:
        return f"{self.name}: {self.doc}"


@dataclass
class PassDumps:
    """The IR after every pass, as files in a dump folder: ``00_lowered.txt``, then ``NN_<pass>.txt``.
    A pass that left the IR as it was gets a one-line file naming the last file that holds it, not a
    copy; ``changed`` records, per pass in order, whether it changed the IR (the summary lists them)."""
    folder: Path
    header: str = ""  # the top of every full file: which of the user's inputs the IR's ``argN`` are
    changed: dict[str, bool] = field(default_factory=dict)
    _last: tuple[str, str] = ("", "")  # the last full file: its name and the IR text it holds

    def write(self, stem: str, graph: Graph, pass_name: str | None = None) -> None:
        text, file = str(graph), f"{stem}.txt"
        same = self._last[0] != "" and text == self._last[1]
        if pass_name is not None:
            self.changed[pass_name] = not same
        if same:
            (self.folder / file).write_text(f"unchanged from {self._last[0]}\n")
            return
        (self.folder / file).write_text(self.header + text)
        self._last = (file, text)


def run_pipeline(graph: Graph, pipeline: Sequence[Pass], dumps: PassDumps | None = None,
                 check: Callable[[str, Graph], None] | None = None, **context) -> Graph:
    """Run ``pipeline`` over ``graph``. ``check(pass_name, graph)``, if given, runs after every pass
    (translation validation hooks in here). ``context``: what passes name in ``needs``."""
    verify(graph)
    if dumps is not None:
        dumps.write("00_lowered", graph)
    for k, p in enumerate(pipeline, start=1):
        graph = p.run(graph, **{name: context.get(name) for name in p.needs})
        try:
            verify(graph)
        except AssertionError as e:
            raise AssertionError(f"IR verification failed after pass '{p.name}': {e}") from e
        if dumps is not None:
            dumps.write(f"{k:02d}_{p.name}", graph, p.name)
        if check is not None:
            check(p.name, graph)
    return graph
