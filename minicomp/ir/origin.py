"""Provenance: which aten op of the traced FX graph an IR node came from, and the user's source line.

``Node.origin`` lists aten op names (``"addmm.default"``). Lowering makes each an ``Origin``: a
plain string to everything that compares, hashes or prints it (passes copy origins from the node
they replace, kernel names are built from them), which also remembers the FX node it was lowered
from (``fx``: its name in the graph, ``addmm_1``) and where the user wrote it (``source``).
``minicomp.explain`` reads them; nothing in the compiler decides anything by them.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePath


@dataclass(frozen=True)
class Source:
    """A line of the user's program: ``file:line``, the code there and the module it ran in."""
    file: str
    line: int
    code: str = ""
    module: str = ""  # the nn.Module's path inside the model ("layers.0.fc1"); "" at the top

    @property
    def short(self) -> str:
        """``mlp.py:12`` (the file's name without its folder)."""
        return f"{PurePath(self.file).name}:{self.line}"

    def __str__(self) -> str:
        module = f" ({self.module})" if self.module else ""
        return f"{self.short}{module}: {self.code}" if self.code else f"{self.short}{module}"


class Origin(str):
    """An aten op's name that remembers the FX node it came from and its source line."""
    fx: str
    source: Source | None

    def __new__(cls, op: str, fx: str = "", source: Source | None = None) -> "Origin":
        self = super().__new__(cls, op)
        self.fx, self.source = fx, source  # (a pickled copy is rebuilt from the name, then these)
        return self


def provenance(nodes) -> tuple[Origin, ...]:
    """Every FX op behind ``nodes`` (IR nodes) once, in order; origins a pass made without one
    (plain strings) are skipped."""
    seen: dict[tuple[str, str], Origin] = {}
    for n in nodes:
        for o in n.origin:
            if isinstance(o, Origin):
                seen.setdefault((str(o), o.fx), o)
    return tuple(seen.values())
