"""The pass manager: a pipeline is a list of named passes (data), run in order, each followed by
the verifier and, when dumping, by ``NN_<pass>.txt`` in the dump folder.

A pass is ``Graph -> Graph``. One that needs what the graph does not hold (the ``tune`` pass: the
inputs to time with, a way to build a callable) names it in ``needs``, and ``run_pipeline`` hands it
over from its keyword arguments (None where the caller has none)."""
from __future__ import annotations

from dataclasses import dataclass
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


def run_pipeline(graph: Graph, pipeline: Sequence[Pass], dump_dir: Path | None = None,
                 check: Callable[[str, Graph], None] | None = None, **context) -> Graph:
    """Run ``pipeline`` over ``graph``. ``check(pass_name, graph)``, if given, runs after every pass
    (translation validation hooks in here). ``context``: what passes name in ``needs``."""
    verify(graph)
    if dump_dir is not None:
        (dump_dir / "00_lowered.txt").write_text(str(graph))
    for k, p in enumerate(pipeline, start=1):
        graph = p.run(graph, **{name: context.get(name) for name in p.needs})
        try:
            verify(graph)
        except AssertionError as e:
            raise AssertionError(f"IR verification failed after pass '{p.name}': {e}") from e
        if dump_dir is not None:
            (dump_dir / f"{k:02d}_{p.name}.txt").write_text(str(graph))
        if check is not None:
            check(p.name, graph)
    return graph
