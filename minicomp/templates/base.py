"""What a template is: one object that says which fusion groups it runs, how it schedules and builds
their kernel IR, what the autotuner may try, and how its kernels are printed and launched.

The scheduling half (``matches``, ``default_schedule``, ``config_space``, ``build``) works on fusion
groups and the kernel IR; the printing half (``emit_body``, ``statement``, ``store_vars``, ``grid``)
is handed codegen's printer and only spells what the kernel IR says. Neither imports codegen, so
both ``passes`` and ``codegen`` can look templates up (``templates.TEMPLATES``).
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass, field

from ..ir.kernel import Kernel, Schedule
from ..ir.target import INTERPRETER, Target
from ..ir.graph import Group


@dataclass
class Context:
    """What scheduling knows besides the group: the device (``Target``: every device-dependent
    choice reads it), the buffers' strides (``schedule.plan_layouts``) and the GEMM configs fixed per
    matmul node id (``"triton"``, or a config the GEMM tuner measured)."""
    target: Target = INTERPRETER
    layouts: dict = field(default_factory=dict)
    gemm_choices: dict = field(default_factory=dict)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def fill_sms(block: int, numel: int, target: Target, least: int) -> int:
    """``block`` halved, down to ``least``, while a grid of ``numel / block`` programs leaves some of
    ``target``'s multiprocessors without one (a small kernel: a batch-1 convnet's batch norm or pool):
    a few full programs leave most of the GPU idle."""
    while block > least and cdiv(numel, block) < target.sm_count:
        block //= 2
    return block


class Template:
    """A kernel template. Subclasses set ``name`` (the ``Schedule.template`` its kernels carry),
    ``block_of`` (iteration variable -> its block-size constexpr) and ``rank`` (dimensions of its
    blocks: a literal broadcasts with them), and implement the methods below."""
    name: str = ""
    block_of: dict[str, str] = {}
    rank: int = 2

    # --- scheduling -----------------------------------------------------------------------
    def matches(self, group: Group, ctx: Context) -> bool:
        """True if this template runs ``group`` (the scheduler takes the first that does)."""
        raise NotImplementedError

    def default_schedule(self, group: Group, ctx: Context) -> Schedule:
        """The heuristic's schedule (measured on the H200; small blocks in the interpreter)."""
        raise NotImplementedError

    def config_space(self, group: Group, heuristic: Schedule) -> list[Schedule]:
        """The schedules the autotuner measures (max-autotune); the usual space by default."""
        return halved_and_doubled(group, heuristic)

    def tunes(self, kernel: Kernel) -> bool:
        """Whether the ``tune`` pass walks ``config_space`` for this kernel."""
        return True

    def build(self, group: Group, ctx: Context, sched: Schedule) -> Kernel:
        """The group's kernel under ``sched`` (not shared with the caller: building sets fields on it)."""
        raise NotImplementedError

    def kernel(self, group: Group, ctx: Context, sched: Schedule | None = None) -> Kernel:
        """The group's kernel under ``sched``, or the default schedule."""
        sched = self.default_schedule(group, ctx) if sched is None else \
            dataclasses.replace(sched, blocks=dict(sched.blocks))
        return self.build(group, ctx, sched)

    # --- printing (``p`` is codegen's TritonPrinter) ----------------------------------------------
    def emit_body(self, p, pid: str) -> None:
        """Append the kernel's body (after the ``*numel`` lines) to ``p.lines``; ``pid`` is the
        program id's expression."""
        raise NotImplementedError

    def statement(self, p, stmt, indent: str) -> None:
        """Print a statement only this template has (the printer knows the common ones)."""
        raise NotImplementedError(f"template {self.name} has no statement {type(stmt).__name__}")

    def store_vars(self, inner: bool) -> list[str]:
        """The iteration variables a store's pointer block spans (``inner``: one value per element of
        the iteration space, else one per row)."""
        return ["xindex"]

    def grid(self, kernel: Kernel) -> tuple[int, ...]:
        """The launch grid."""
        return (cdiv(kernel.numels["x"], kernel.schedule.blocks["XBLOCK"]),)

    def __repr__(self) -> str:
        return f"<template {self.name}>"


def halved_and_doubled(group: Group, heuristic: Schedule) -> list[Schedule]:
    """The usual config space: the heuristic's blocks halved and doubled, with 4 and 8 warps, between
    128 and 16384 elements a block (a persistent row keeps its whole-row RBLOCK)."""
    rnumel = math.prod(group.shape[d] for d in group.axes) if group.axes else 0
    names = [b for b in heuristic.blocks if not (b == "RBLOCK" and heuristic.persistent and rnumel > 1)]
    out, seen = [], set()
    for factors in itertools.product((1, 0.5, 2), repeat=len(names)):
        blocks = dict(heuristic.blocks)
        for name, f in zip(names, factors):
            blocks[name] = max(1, int(blocks[name] * f))
        elements = math.prod(blocks.values())
        if elements > 16384 or elements < 128:
            continue
        for warps in (4, 8):
            key = (tuple(blocks.items()), warps)
            if key not in seen:
                seen.add(key)
                persistent = heuristic.persistent if "RBLOCK" not in blocks else blocks["RBLOCK"] >= rnumel
                out.append(Schedule(heuristic.template, blocks, warps, heuristic.num_stages, persistent))
    return out
