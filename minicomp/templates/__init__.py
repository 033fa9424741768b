"""The template registry: every kind of kernel minicomp prints, one object per template, one file each.

``TEMPLATES`` is ordered: the ``schedule`` pass gives each fusion group to the first template that
``matches`` it, so a specific template (``tiled``) comes before the general one it refines
(``pointwise``). Kernels carry their template's name (``Schedule.template``); codegen, the wrapper and
the autotuner look the object up with ``template_of``.

Dependencies: ``ir`` (groups and their placements: ``ir/placement.py``) <- ``templates`` <- the passes
(``schedule``, ``tune``, ...) and codegen (which hands its printer to the template's printing
methods). Templates import neither.
"""
from __future__ import annotations

from ..ir.kernel import Kernel
from ..ir.graph import Group
from . import attention, attention_backward, gemm, pointwise, reduction, scan, tiled, window
from .base import Context, Template

TEMPLATES: list[Template] = [
    attention.TEMPLATE,  # one attention node: the flash forward kernel
    attention_backward.DKDV,  # attention_grad nodes: the flash backward's dk/dv and dq kernels
    attention_backward.DQ,
    gemm.TEMPLATE,
    scan.TEMPLATE,
    window.TEMPLATE,     # before reduction: it takes the reductions over a short sliding window
    reduction.TEMPLATE,
    tiled.TEMPLATE,      # before pointwise: it takes the pointwise groups that read across their stores
    pointwise.TEMPLATE,  # last: it matches every elementwise group
]


def template_of(kernel_or_name: Kernel | str) -> Template:
    """The template of a kernel (or of that name)."""
    name = kernel_or_name if isinstance(kernel_or_name, str) else kernel_or_name.schedule.template
    found = next((t for t in TEMPLATES if t.name == name), None)
    if found is None:
        raise KeyError(f"no template named {name!r} in templates.TEMPLATES")
    return found


def choose(group: Group, ctx: Context) -> Template:
    """The first template that runs ``group``."""
    return next(t for t in TEMPLATES if t.matches(group, ctx))


__all__ = ["TEMPLATES", "Context", "Template", "choose", "template_of"]
