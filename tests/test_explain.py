"""minicomp.explain: per kernel the aten ops and source lines it covers, its bytes and FLOPs (checked
against hand-computed values), the roofline figures, the fusions not taken in words, the HTML page
(parsed; one roofline with a point per kernel; nothing fetched) and the command line. CPU: static
figures only; the measured path is checked with given roofs and times."""
from __future__ import annotations

import inspect
import re
from html.parser import HTMLParser

import torch
from torch import nn

import minicomp
from minicomp import config
from minicomp.__main__ import main
from minicomp.explain import device_peaks, timing
from minicomp.explain.device_peaks import Peaks
from minicomp.explain.figures import KernelFigures
from minicomp.explain.roofline import chart
from minicomp.explain.words import readable
from minicomp.ir.origin import Origin, Source
from minicomp.report import KernelInfo, Report


def _line_of(fn, text: str) -> str:
    """``test_explain.py:N`` of the line of ``fn`` that contains ``text``."""
    lines, first = inspect.getsourcelines(fn)
    return f"test_explain.py:{first + next(i for i, line in enumerate(lines) if text in line)}"


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 8)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        return self.fc2(h).softmax(-1)


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        return y.mean((2, 3))


def _kernel(e, *ops):
    """The one kernel of the explanation that covers exactly ``ops``."""
    (k,) = [k for k in e.kernels if tuple(str(o).split(".")[0] for o in k.info.covers) == ops]
    return k


def test_mlp_kernels_name_their_ops_and_source_lines():
    e = minicomp.explain(MLP().eval(), torch.randn(4, 16))
    text = str(e)
    first, second = _line_of(MLP.forward, "relu"), _line_of(MLP.forward, "softmax")
    assert [k.info.name for k in e.kernels] and all(k.info.name in text for k in e.kernels)
    gemm = _kernel(e, "addmm", "relu")
    assert [o.source.short for o in gemm.info.covers] == [first, first]
    assert gemm.info.covers[0].source.module == "fc1" and f"{first} (fc1)" in text
    assert f"{second}: return self.fc2(h).softmax(-1)" in text
    assert "kept apart: the kernels of " in text and "%" not in text.split("fusions not taken:")[1].split("decisions:")[0]
    assert "not measured" in text  # the CPU: no roofs, no times
    totals = e.totals[e.graphs[0].report.graph]
    assert totals.eager_kernels == 4 and totals.kernels == 3  # eager: addmm, relu, addmm, softmax


def test_bytes_and_flops_are_the_hand_computed_ones():
    m, k, n, rows, cols = 4, 16, 8, 3, 5

    def fn(x, w, z):
        return (x @ w).softmax(-1), z * 3 + 1
    e = minicomp.explain(fn, torch.randn(m, k), torch.randn(k, n), torch.randn(rows, cols))
    gemm, softmax, pointwise = _kernel(e, "mm"), _kernel(e, "_softmax"), _kernel(e, "mul", "add")
    assert (gemm.info.bytes_read, gemm.info.bytes_written, gemm.flops) == ((m * k + k * n) * 4, m * n * 4, 2 * m * n * k)
    # max and sum: one per input element; subtract, exp and divide: one per element
    assert (softmax.info.bytes_read, softmax.info.bytes_written, softmax.flops) == (m * n * 4, m * n * 4, 5 * m * n)
    assert (pointwise.info.bytes_read, pointwise.info.bytes_written, pointwise.flops) == (rows * cols * 4,) * 2 + (2 * rows * cols,)
    assert pointwise.intensity == 2 * rows * cols / (2 * rows * cols * 4)


def test_a_convolution_as_a_product_counts_its_im2col_terms():
    n, c, h, w, out, kh = 2, 3, 6, 6, 4, 3

    def fn(x, weight):
        return torch.nn.functional.conv2d(x, weight, padding=1)
    with config.patch(conv="ir"):  # the IR's batched matmul over an im2col view (oneDNN's on the CPU otherwise)
        e = minicomp.explain(fn, torch.randn(n, c, h, w), torch.randn(out, c, kh, kh))
    (k,) = e.kernels
    # the product's K is c·kh·kw; the im2col view is read from the input buffer itself
    assert k.flops == 2 * n * out * h * w * c * kh * kh
    assert (k.info.bytes_read, k.info.bytes_written) == ((n * c * h * w + out * c * kh * kh) * 4, n * out * h * w * 4)


class _Page(HTMLParser):
    """What the tests read from the page: its SVGs' classes, the roofline's points, every attribute."""

    def __init__(self):
        super().__init__()
        self.svgs, self.points, self.values = [], 0, []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.values += [v or "" for v in attrs.values()]
        if tag == "svg":
            self.svgs.append(attrs.get("class"))
        if tag == "circle" and attrs.get("class") == "point":
            self.points += 1


def test_convnet_page_is_self_contained_with_one_roofline_point_per_kernel(tmp_path):
    e = minicomp.explain(ConvNet().eval(), torch.randn(2, 3, 6, 6))
    text = str(e)
    assert f"convolution ({_line_of(ConvNet.forward, 'relu')} (conv)" in text  # oneDNN on the CPU: in PyTorch
    page = e.save(tmp_path / "report.html").read_text()
    parsed = _Page()
    parsed.feed(page)
    assert parsed.svgs.count("roofline") == 1 and parsed.svgs.count("graph") == 1
    assert parsed.points == len(e.kernels) > 0
    assert "http://" not in page and "https://" not in page
    assert not any(v.startswith(("http", "//")) for v in parsed.values)  # no src/href outside the page
    for k in e.kernels:
        assert f'id="detail-{k.graph}/{k.info.name}"' in page and "@triton.jit" in e.graphs[0].source[k.info.name]


def test_command_line_writes_the_page(tmp_path, capsys):
    model = tmp_path / "model.py"
    model.write_text("import torch\nmodel = lambda x: (x * 2).relu()\nexample_inputs = torch.randn(8)\n")
    out = tmp_path / "out.html"
    assert main(["explain", str(model), "--out", str(out)]) == 0
    assert out.read_text().startswith("<!DOCTYPE html>") and "model.py:2" in capsys.readouterr().out


def test_graph_breaks_are_reported_where_they_happen():
    def fn(x):
        y = x.relu()
        print("", end="")
        return y * 2
    e = minicomp.explain(fn, torch.randn(8))
    assert e.collected.dynamo_graphs == 2
    (brk,) = e.collected.breaks
    assert brk.where.startswith(_line_of(fn, "print")) and "http" not in brk.reason
    assert "1 graph break(s)" in str(e)


def test_fusions_not_taken_read_as_ops_and_lines():
    rep = Report("g", node_origins={3: (Origin("addmm.default", "addmm", Source("net.py", 7, "y = f(x)")),),
                                    5: (Origin("_softmax.default", "_softmax", Source("net.py", 8)),)})
    words = readable("not fused: %3 -> %5 [cycle] another kernel or fallback op sits between them", rep)
    assert words.startswith("kept apart: the kernels of addmm (net.py:7) and of _softmax (net.py:8): something else")
    assert "%" not in readable("gemm %3 [4, 8]: Triton template", rep)


def test_notes_name_graph_inputs_by_the_users_names():
    rep = Report("g", node_origins={3: (Origin("mul.Tensor", "mul", Source("net.py", 4)),)},
                 input_names={0: "fc1.weight", 1: "x"})
    assert readable("store-narrow: %3.. recomputes %3 (torch.float32) from %0, %1", rep) == \
        "store-narrow: mul (net.py:4).. recomputes mul (net.py:4) (torch.float32) from fc1.weight, x"


class Transposed(nn.Module):
    """Its scaled weight feeds a scan and a reduction: the fusion pass recomputes it from the weight."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(8, 16))

    def forward(self, x):
        y = self.weight.t() * 2
        return y.cumsum(0) + y.sum(0) + x


def test_explained_notes_name_no_ir_node():
    text = str(minicomp.explain(Transposed(), torch.randn(16, 8)))
    notes = text.split("fusions not taken:")[1]
    assert not re.search(r"%\d", notes) and "from weight" in notes


def _figures(flops: int, read: int, written: int, seconds: float | None, math: str = "") -> KernelFigures:
    info = KernelInfo("k0", "pointwise", ("add.default",), "", read + written, "fn0", bytes_read=read,
                      bytes_written=written, flops=flops, product_math=math)
    return KernelFigures(info, "g", PEAKS, seconds)


PEAKS = Peaks("test GPU", 1e12, {"float16": 1e15, "bfloat16": 1e15, "tf32": 4e14, "float32": 5e13})


def test_roofline_figures_from_given_roofs_and_times():
    copy = _figures(flops=1_000_000, read=4_000_000, written=4_000_000, seconds=16e-6)
    assert copy.bound == "memory" and copy.limit_seconds == 8e-6 and copy.share_of_limit == 0.5
    assert copy.achieved_bandwidth == 5e11
    gemm = _figures(flops=2 * 4096 ** 3, read=2 * 4096 ** 2 * 2, written=4096 ** 2 * 2, seconds=None, math="float16")
    assert gemm.bound == "compute" and gemm.limit_seconds == 2 * 4096 ** 3 / 1e15 and gemm.share_of_limit is None
    svg = chart([copy, gemm], {})
    assert svg.count('class="point"') == 2 and svg.count('class="roof"') == 2  # float16's and the CUDA cores'


def test_device_peaks_are_measured_once_and_validated(tmp_path):
    measured = []

    def measure():
        measured.append(1)
        return {"bandwidth": PEAKS.bandwidth, "flops": dict(PEAKS.flops)}
    assert device_peaks.cached_peaks("test GPU", measure) == PEAKS
    assert device_peaks.cached_peaks("test GPU", measure) == PEAKS and len(measured) == 1
    assert device_peaks._valid({"bandwidth": -1, "flops": PEAKS.flops}) is None
    assert device_peaks.peaks(torch.device("cpu")) is None


def test_profiled_kernels_are_matched_by_function_name():
    events = [("fn_a", 2e-6), ("fn_b", 1e-6), ("fn_a", 4e-6), ("sm90_gemm", 5e-6)] * 2
    per_launch, others = timing.per_function(events, {"fn_a", "fn_b"}, calls=2)
    assert per_launch == {"fn_a": 3e-6, "fn_b": 1e-6} and others == 5e-6
