"""The pass manager: a pipeline is a list of named passes (data), run in order, each followed by
the verifier and, when dumping, by ``NN_<pass>.txt`` in the dump folder."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from ..ir.graph import Graph
from ..ir.verifier import verify


@dataclass(frozen=True)
class Pass:
    name: str
    run: Callable[[Graph], Graph]
    doc: str = ""

    def __str__(self) -> str:
        return f"{self.name}: {self.doc}"


def run_pipeline(graph: Graph, pipeline: Sequence[Pass], dump_dir: Path | None = None,
                 check: Callable[[str, Graph], None] | None = None) -> Graph:
    """Run ``pipeline`` over ``graph``. ``check(pass_name, graph)``, if given, runs after every pass
    (translation validation hooks in here)."""
    verify(graph)
    if dump_dir is not None:
        (dump_dir / "00_lowered.txt").write_text(str(graph))
    for k, p in enumerate(pipeline, start=1):
        graph = p.run(graph)
        try:
            verify(graph)
        except AssertionError as e:
            raise AssertionError(f"IR verification failed after pass '{p.name}': {e}") from e
        if dump_dir is not None:
            (dump_dir / f"{k:02d}_{p.name}.txt").write_text(str(graph))
        if check is not None:
            check(p.name, graph)
    return graph
