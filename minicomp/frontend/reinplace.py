"""Updates of an inference graph's mutated inputs, written in place.

AOTAutograd functionalizes a graph that writes into one of its inputs (a static key/value cache's
``index_copy_``): the graph computes the updated input out of place — ``index_put(cache, idx, rows)``,
a copy of the whole cache — returns it, and AOTAutograd's runtime copies it back into the input: two
copies of the whole tensor per call where eager writes a few rows. Where the returned update is such an
op on the input itself and nothing else in the graph reads that input, ``reinplace`` makes the op write
the input in place and return it; the copy back is then a copy onto itself, which PyTorch skips.

Only updates that overwrite (``index_copy``, ``index_put`` without ``accumulate``): running one twice
(a first run that fails half-way and then runs in PyTorch) writes the same values again.
"""
from __future__ import annotations

import torch
import torch.fx as fx

aten = torch.ops.aten
IN_PLACE = {aten.index_put.default: aten.index_put_.default, aten.index_copy.default: aten.index_copy_.default}




def reinplace(gm: fx.GraphModule, mutated: list[int]) -> list[str]:
    """Rewrite the updates of ``mutated`` inputs that qualify (see the module's docstring) in place;
    the decisions, for the report."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    results = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    notes = []
    for update, i in zip(results, mutated):
        target = getattr(update, "target", None)
        if target not in IN_PLACE or i >= len(placeholders):
            continue
        source = placeholders[i]
        accumulate = target is aten.index_put.default and \
            bool(update.kwargs.get("accumulate", update.args[3] if len(update.args) > 3 else False))
        if update.args[0] is source and set(source.users) == {update} and not accumulate:
            update.target = IN_PLACE[target]
            notes.append(f"reinplace: {target.__name__} updates input {source.name} in place "
                         f"(was: a copy of it, copied back)")
    if notes:
        gm.recompile()
    return notes
