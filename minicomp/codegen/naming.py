"""Kernel modules named by their content, so that the same code is one file, one import and one
Triton compile.

A kernel's readable name (``k5_mm_tanh_f32_8x64``) carries its position in the graph, and Triton's
cache keys on the source, which contains the function's name: the steps of an unrolled loop would
each be generated, written, imported and compiled again. The Triton function is therefore named by
what it computes and a hash of its source (``mm_tanh_f32_8x64_1f0c9a2e``): no graph position, so
identical kernels within a graph and across graphs print to the same module. The readable name stays
with the launch (report, wrapper comment, dumps); profiler traces show the content name, whose prefix
still says what the kernel computes.
"""
from __future__ import annotations

import dataclasses
import hashlib
import re

from ..ir.kernel import Kernel, StagedLaunch
from .triton import kernel_source

_LAUNCH = "__minicomp_launch__"
_STAGE = "__minicomp_stage{}__"


def readable_base(name: str) -> str:
    """A kernel's readable name without its graph-position counter (``k5_``)."""
    base = re.sub(r"^k\d+_", "", name)
    return base if base[:1].isalpha() else f"k_{base}"


def _base(kernel: Kernel | StagedLaunch) -> str:
    if isinstance(kernel, StagedLaunch):
        return f"{type(kernel).__name__.lower()}_{readable_base(kernel.stages[0].name)}"
    return readable_base(kernel.name)


def content_named_source(kernel: Kernel | StagedLaunch) -> tuple[str, str]:
    """The Triton function's name and the module's source: printed with placeholder names, hashed,
    then named ``<readable base>_<hash8>`` (a staged launch's stage functions ``<base>_stage<i>``)."""
    stages = kernel.stages if isinstance(kernel, StagedLaunch) else []
    renamed = dataclasses.replace(kernel, name=_LAUNCH)
    if stages:
        renamed.stages = [dataclasses.replace(s, name=_STAGE.format(i)) for i, s in enumerate(stages)]
    source = kernel_source(renamed)
    name = f"{_base(kernel)}_{hashlib.sha256(source.encode()).hexdigest()[:8]}"
    for i, stage in enumerate(stages):
        source = source.replace(_STAGE.format(i), f"{readable_base(stage.name)}_stage{i}")
    return name, source.replace(_LAUNCH, name)
