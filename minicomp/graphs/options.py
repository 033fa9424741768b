"""How a graph is compiled: ``Options`` (a mode, a dump folder, the pass pipeline, ...), the modes
torch.compile names, and the default pipeline (a list of named passes: print it, skip one, insert one).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .. import config
from ..passes.attention import attention
from ..passes.combos import combos
from ..passes.concat_chains import concat_chains
from ..passes.conv_lowering import conv_lowering
from ..passes.fusion import fusion
from ..passes.gemm_choice import gemm_backend, plain_gemms
from ..passes.index_checks import index_checks
from ..passes.layout_plan import layout_plan
from ..passes.manager import Pass
from ..passes.schedule import schedule
from ..passes.pipelines import row_pipelines, split_combines
from ..passes.split_reductions import split_reductions
from ..passes.split_scans import split_scans
from ..passes.simplify import (algebraic_simplification, constant_folding, cse, dce, one_element_reductions,
                               view_folding)
from ..passes.tune import tune

PIPELINE: list[Pass] = [
    Pass("dce", dce, "drop nodes nothing uses"),
    Pass("cse", cse, "merge nodes that compute the same thing"),
    Pass("constant_folding", constant_folding, "evaluate ops on constant fills"),
    Pass("algebraic_simplification", algebraic_simplification, "drop copies and round-trip casts"),
    Pass("concat_chains", concat_chains, "a cat that extends an earlier cat's inputs reads that cat"),
    Pass("view_folding", view_folding, "compose view chains into one index map"),
    Pass("index_checks", index_checks, "drop index checks proved to hold (arange, clamp, ...), and wraps of "
                                       "indices never negative"),
    Pass("attention", attention, "softmax(q @ kᵀ * scale + mask) @ v written out -> one attention node"),
    Pass("one_element_reductions", one_element_reductions, "a sum, product, max or min of one element -> the element"),
    Pass("split_reductions", split_reductions, "online softmax for long rows; chunked reductions with few outputs"),
    Pass("split_scans", split_scans, "long scans over few rows: chunked scans offset by the chunks before"),
    Pass("conv_lowering", conv_lowering, "rewrite chosen convolutions into matmuls over im2col views / window sums"),
    Pass("gemm_backend", gemm_backend, "choose the Triton GEMM template or cuBLAS for each matmul"),
    Pass("fusion", fusion, "group compute nodes into kernels"),
    Pass("plain_gemms", plain_gemms, "a matrix product nothing fused into: cuBLAS or the template (rule plain_gemm)"),
    Pass("layout_plan", layout_plan, "store the 4-D buffers around convolutions channels-last"),
    Pass("schedule", schedule, "choose templates and block sizes, build kernels"),
    Pass("pipelines", row_pipelines, "run row-local kernel chains that re-read an input as one launch"),
    Pass("split_combines", split_combines, "run a split reduction's partial and combining kernels as one launch"),
    Pass("tune", tune, "use stored tuned schedules; in max-autotune, measure each kernel's config space",
         needs=("tuning",)),
    Pass("combos", combos, "run each layout copy of a graph input in the launch before it"),
]

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
"""torch.compile's names: ``reduce-overhead`` captures CUDA graphs, ``max-autotune`` tunes and captures,
``max-autotune-no-cudagraphs`` only tunes (``Options.autotune``, ``Options.cudagraphs``)."""


@dataclass
class Options:
    mode: str = "default"
    dump_dir: str | None = None
    pipeline: list[Pass] = field(default_factory=lambda: list(PIPELINE))
    static_outputs: bool = False  # CUDA graphs: return the graph's own output buffers (see cuda_graphs.py)
    freeze: bool = False  # inference: parameters are constants, batch norm folded (frontend/freeze.py)
    cpu: str | None = None  # CPU tensors: "pytorch" or "interpret" (None: ``config.cpu``, MINICOMP_CPU)
    # minicomp.explain: reports also list the traced graph's aten ops and every IR node's origin
    explain: bool = False

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"minicomp: unknown mode {self.mode!r}; the modes are {', '.join(MODES)}")
        cpu_choices = config.SETTINGS["cpu"].choices
        if self.cpu is not None and self.cpu not in cpu_choices:
            raise ValueError(f"minicomp: unknown cpu {self.cpu!r}; one of {', '.join(cpu_choices)}")
        self.dump_dir = self.dump_dir or (str(config.dump) if config.dump else None)

    @property
    def autotune(self) -> bool:
        """Measure schedules and GEMM backends at compile time (``max-autotune*``)."""
        return self.mode in ("max-autotune", "max-autotune-no-cudagraphs")

    @property
    def cudagraphs(self) -> bool:
        """Run each CUDA specialization as a captured CUDA graph (``reduce-overhead``, ``max-autotune``)."""
        return self.mode in ("reduce-overhead", "max-autotune")

    @property
    def cpu_runs(self) -> str:
        """What runs a graph on CPU tensors: ``"pytorch"`` or ``"interpret"`` (this option, else the setting)."""
        return self.cpu or config.cpu

    @property
    def strict(self) -> bool:
        return config.strict
