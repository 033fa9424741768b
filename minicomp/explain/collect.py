"""What an explanation is made of: the model compiled and run once by minicomp (the reports of its
graphs, their kernels' IR and Triton source from a dump folder), Dynamo's graph breaks, and on a CUDA
device the kernels' times and the device's roofs."""
from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .. import config
from ..backend import Backend
from ..report import Report, report, reports_since
from . import device_peaks, timing

# The kernels are what the report explains, so on the CPU the graphs compile to them and run in
# Triton's interpreter (timings are not measured there). Where the CPU default runs PyTorch's kernels
# instead (the ``cpu`` setting), this asks for the interpreter.
CPU_SETTINGS = {"cpu": "interpret"} if "cpu" in config.SETTINGS else {}
# Dynamo's break reasons end with a link to its web page of graph breaks: the report works offline
_LINK = re.compile(r"\s*For more details about this graph break.*|https?://\S+", re.S)


@dataclass
class GraphBreak:
    reason: str      # Dynamo's words, first lines
    where: str       # the user's line the graph ended at (file:line: code)


@dataclass
class GraphRun:
    """One graph minicomp compiled, and the text of its kernels by launch name."""
    report: Report
    ir: dict[str, str] = field(default_factory=dict)       # the kernel's IR (kernels.txt of the dump)
    source: dict[str, str] = field(default_factory=dict)   # its Triton source


@dataclass
class Collected:
    device: torch.device
    graphs: list[GraphRun]
    dynamo_graphs: int
    breaks: list[GraphBreak]
    timings: timing.Timings | None       # None: not measured (CPU)
    peaks: device_peaks.Peaks | None     # None: not measured (CPU)


class _Recorder:
    """A Dynamo backend that notes why each graph ended, then hands the graph to minicomp."""

    def __init__(self, backend: Backend):
        self.backend, self.graphs, self.breaks = backend, 0, []

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        reason = getattr(gm, "compile_subgraph_reason", None)
        if reason is not None and reason.reason != "return_value":
            frame = reason.user_stack[-1] if reason.user_stack else None
            where = f"{Path(frame.filename).name}:{frame.lineno}: {(frame.line or '').strip()}" if frame else ""
            self.breaks.append(GraphBreak(_LINK.sub("", str(reason.reason)).strip(), where))
        return self.backend(gm, example_inputs)


def collect(model, args: tuple, kwargs: dict, mode: str = "default") -> Collected:
    """Compile ``model`` with minicomp (no graph cache: every graph is traced and lowered, so its report
    knows where each op came from), run it once on ``args`` under ``torch.no_grad()``, and measure it
    where it runs on CUDA."""
    device = _device_of(model, args, kwargs)
    before = report()
    with tempfile.TemporaryDirectory(prefix="minicomp-explain-") as dump, torch.no_grad(), \
            config.patch(graph_cache=False, **(CPU_SETTINGS if device.type == "cpu" else {})):
        recorder = _Recorder(Backend(mode=mode, dump_dir=dump, explain=True))
        compiled = torch.compile(model, backend=recorder)
        compiled(*args, **kwargs)
        graphs = [_graph_run(r) for r in reports_since(before)]
        timings = peaks = None
        if device.type == "cuda":
            functions = {k.function for g in graphs for k in g.report.kernels}
            timings = timing.measure(lambda: compiled(*args, **kwargs), functions)
            peaks = device_peaks.peaks(device)
    return Collected(device, graphs, recorder.graphs, recorder.breaks, timings, peaks)


def _device_of(model, args, kwargs) -> torch.device:
    """Where the model runs: its first tensor input's device, else its parameters'."""
    tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
    if not tensors and isinstance(model, torch.nn.Module):
        tensors = list(model.parameters())
    return tensors[0].device if tensors else torch.device("cpu")


def _graph_run(rep: Report) -> GraphRun:
    """The report with its kernels' IR and source read from its dump folder (gone after ``collect``)."""
    run = GraphRun(rep)
    if not rep.dump_dir:
        return run
    folder = Path(rep.dump_dir)
    blocks = _kernel_blocks(folder / "kernels.txt")
    for k in rep.kernels:
        run.ir[k.name] = "\n\n".join(blocks.get(name, "") for name in (k.name, *k.stages)).strip()
        path = folder / f"{k.name}.py"
        run.source[k.name] = path.read_text() if path.is_file() else ""
    return run


def _kernel_blocks(path: Path) -> dict[str, str]:
    """kernels.txt by kernel name: each kernel (``kernel NAME ...``) or staged launch (``pipeline NAME:
    ...``) is a block of lines, blocks apart by a blank line."""
    if not path.is_file():
        return {}
    blocks = {}
    for block in path.read_text().split("\n\n"):
        words = block.split(None, 2)
        if len(words) >= 2:
            blocks[words[1].rstrip(":")] = block.strip()
    return blocks
