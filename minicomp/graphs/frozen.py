"""The callable of an inference graph compiled with ``freeze=True`` (``frontend/freeze.py``).

It freezes at the first call (the parameters' values are known only then), compiles the frozen graph,
and checks per call that the parameters baked into constants are unchanged (``Frozen.still_valid``:
one pass over those tensors' identities, versions and data pointers, and a count of optimizer steps,
which fused optimizers need: they leave versions alone). A change freezes and compiles
again from the current values; after ``MAX_REFREEZES`` such changes the graph runs unfrozen. A graph
with symbolic sizes is compiled as the backend compiles one unfrozen (``dynamic.py``).
"""
from __future__ import annotations

import warnings

import torch.fx as fx

from ..frontend.freeze import Frozen, freeze_graph
from .base import GraphCallable
from .dynamic import compiled_graph
from .options import Options

MAX_REFREEZES = 8


class FrozenGraph(GraphCallable):
    """AOTAutograd's inference callable under ``freeze``: same inputs as ``gm``. The first frozen graph
    is compiled under this one's name, each later one under a new name."""

    def __init__(self, gm: fx.GraphModule, options: Options, freezable: list[int], static_inputs=()):
        super().__init__(gm, options, "inference")
        self.freezable, self.static_inputs = freezable, tuple(static_inputs)
        self.frozen: Frozen | None = None
        self.compiled: GraphCallable | None = None  # a CompiledGraph, or a DynamicGraph (symbolic sizes)
        self.freezes = 0

    def call(self, args):
        frozen = self.frozen
        if frozen is None or not frozen.still_valid(args):
            if self.compiled is None or frozen is not None:
                self._freeze(args)
        return self.compiled(args)

    def _freeze(self, args) -> None:
        """(Re)build the frozen graph from ``args``; past ``MAX_REFREEZES`` changes, compile unfrozen."""
        if self.freezes > MAX_REFREEZES:
            note = (f"freeze: off: frozen parameters changed after compiling {self.freezes - 1} times; "
                    f"the graph now reads them as inputs")
            warnings.warn(f"minicomp: {note}")
            self.frozen = None
            self.compiled = compiled_graph(self.gm, self.options, "inference", self.static_inputs, [note])
            return
        frozen = freeze_graph(self.gm, list(args), self.freezable)
        if self.freezes:
            frozen.notes.append(f"freeze: frozen parameters changed after compiling: frozen again "
                                f"({self.freezes} time(s))")
        self.freezes += 1
        self.frozen = frozen if frozen.sources else None
        self.compiled = compiled_graph(frozen.gm, self.options, "inference", self.static_inputs, frozen.notes,
                                       name=None if self.freezes > 1 else self.name)
