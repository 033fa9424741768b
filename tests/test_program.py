"""The Program between scheduling and codegen: its printed form lists the launches in order with
grids and allocations, ``verify()`` catches a program that uses a buffer before it exists, and the
wrapper prints exactly the Program's steps."""
from __future__ import annotations

import ast
import math
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from torch.fx.experimental.proxy_tensor import make_fx

import minicomp
from minicomp.frontend.lowering import mark_saved_results
from minicomp.graphs import assemble
from minicomp.graphs.compiled import CompiledGraph
from minicomp.graphs.options import Options
from minicomp.ir.expr import Var
from minicomp.ir.kernel import Kernel, Schedule
from minicomp.ir.program import (Allocate, Buffer, EmptyLaunch, ExternArg, ExternCall, Input, KernelLaunch,
                                 Literal, Program, ProgramError, Returned, TupleItem, View, WrittenBack)
from minicomp.runtime.executable import Executable
from tests.utils import small_split_thresholds


def _program_lines(dump: Path) -> list[str]:
    (folder,) = [p for p in dump.iterdir() if p.is_dir()]
    text = (folder / "program.txt").read_text()
    if text.startswith("# inputs"):  # the header naming the inputs, a blank line after it
        text = text.split("\n\n", 1)[1]
    return text.splitlines()


def conv_chain(x, w):
    """A pointwise chain, a fallback op (convolution has no rule) and a reduction of its result."""
    return F.conv2d(torch.relu(x * 2 + 1), w).sum(-1)


def test_printed_program_lists_launches_allocations_and_fallbacks_in_order(tmp_path):
    x, w = torch.randn(1, 2, 6, 7), torch.randn(3, 2, 3, 3)
    expected = conv_chain(x, w)
    actual = minicomp.compile(conv_chain, dump_dir=str(tmp_path))(x, w)
    torch.testing.assert_close(actual, expected)
    report = minicomp.report()
    assert [f.op for f in report.fallbacks] == ["convolution.default"], report.summary()

    lines = _program_lines(tmp_path)
    assert [line.split()[0] for line in lines] == \
        ["program", "input", "input", "alloc", "alloc", "launch", "extern", "free", "alloc", "launch", "free",
         "return", "#"], lines
    launch, conv, reduction = lines[5], lines[6], lines[9]
    # the chain's buffer is allocated with its shape and strides (channels-last: the convolution's
    # input and result, layout_plan; the NCHW input is transposed by a tiled kernel that walks
    # (N, H, W) x C); the weight (a graph input) is copied channels-last by a kernel of its own, run
    # as the second stage of the chain's launch (passes/combos.py): one launch, both grids
    chain = re.match(r"alloc\s+(buf\d+) f32\[1,2,6,7\] strides=\(84, 1, 14, 2\) cpu$", lines[3])
    weight = re.match(r"alloc\s+(buf\d+) f32\[3,2,3,3\] strides=\(18, 1, 6, 2\) cpu$", lines[4])
    assert chain and weight, lines[3:5]
    match = re.match(rf"launch\s+c0_k0_k\d+ grid=\((\d+),\) \(arg0, {chain[1]}, arg1, {weight[1]}\)\s+"
                     r"\[combo of 2: k0_\w+ \(YBLOCK=(\d+) XBLOCK=(\d+)\) \+ k\d+_copy_\w+ \(YBLOCK=(\d+) XBLOCK=(\d+)\)\] ",
                     launch)
    assert match, launch
    y0, x0, y1, x1 = map(int, match.groups()[1:])
    assert int(match[1]) == math.ceil(42 / y0) * math.ceil(2 / x0) + math.ceil(18 / y1) * math.ceil(2 / x1)
    # the fallback reads both; the reduction reads the fallback's result and writes the last allocation
    conv_match = re.match(rf"extern\s+(buf\d+) f32\[1,3,4,5\] strides=\(60, 1, 15, 3\) cpu = "
                          rf"aten\.convolution\.default\({chain[1]}, {weight[1]}\)$", conv)
    assert conv_match, conv
    out = re.match(r"alloc\s+(buf\d+) f32\[1,3,4,1\]", lines[8])
    assert out, lines[8]
    assert re.match(rf"launch\s+k1_\w+ grid=\(\d+,\) \({conv_match[1]}, {out[1]}\)\s+\[reduction persistent\]",
                    reduction), reduction
    # each intermediate is freed after its last reader; the result is not
    assert lines[7] == f"free    {chain[1]}, {weight[1]}" and lines[10] == f"free    {conv_match[1]}", lines
    assert lines[11] == f"return  (as_strided({out[1]}, (1, 3, 4), (0, 4, 1), +0))", lines[11]
    assert lines[12].startswith("# memory plan: allocations 3 (0 reusing"), lines[12]


def test_program_of_a_staged_launch_and_a_multi_result_fallback(tmp_path, monkeypatch):
    """A split reduction's two kernels print as one launch with its counters; a fallback op with two
    results (sort) is called once and its results picked."""
    small_split_thresholds(monkeypatch)

    def fn(x):
        values, indices = torch.sort(x * 2, -1)
        return x.sum(0), values + 1, indices
    x = torch.randn(512, 4)
    expected = fn(x)
    actual = minicomp.compile(fn, dump_dir=str(tmp_path))(x)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e)
    assert len(minicomp.report().fallbacks) == 1, minicomp.report().summary()
    text = "\n".join(_program_lines(tmp_path))
    assert re.search(r"launch\s+p0_k\d+_k\d+ grid=\(\d+,\) \(arg0, .* \+ \d+ counters\)\s+"
                     r"\[split reduction \+ combine: k\d+_\w+ \(XBLOCK=\d+ RBLOCK=\d+\) -> k\d+_\w+ \(XBLOCK=\d+ RBLOCK=\d+\)\]",
                     text), text
    sort = re.search(r"extern\s+(buf\d+) = aten\.sort\.default\((buf\d+)\)\s+\(several results\)", text)
    assert sort, text
    assert re.search(rf"item\s+buf\d+ f32\[512,4\] strides=\(4, 1\) cpu = {sort[1]}\[0\]", text), text
    assert re.search(rf"item\s+buf\d+ i64\[512,4\] strides=\(4, 1\) cpu = {sort[1]}\[1\]", text), text


def test_an_alias_of_a_result_shares_its_memory_a_recomputed_one_does_not():
    """AOTAutograd saves a returned tensor for backward as ``alias(out)``, which in eager shares the
    output's memory: returned without a copy (a copy of the attention output cost 16 us per training
    step at 4x16x4096x128 on the H200). The same value computed twice, which cse merges, stays two
    tensors as in eager."""
    def fn(x):
        y = x * 3
        return y, torch.ops.aten.alias.default(y), x * 3
    x = torch.randn(5, 3)
    graph = CompiledGraph(make_fx(fn)(x), Options(), "inference")
    executable, _, rep = graph._compile([x])
    assert rep.whole_graph_fallback is None, rep.whole_graph_fallback
    out, alias, again = executable([x])
    for got in (out, alias, again):
        torch.testing.assert_close(got, x * 3)
    assert alias.data_ptr() == out.data_ptr() and again.data_ptr() != out.data_ptr()


def test_results_saved_for_the_backward_may_share_a_tensor():
    """Results a forward returns only for its backward (``mark_saved_results``: from position 1 here)
    that cse merges are one tensor, as Inductor returns them (AOTAutograd saves autocast's casts of one
    tensor for Q, K and V: three copies per layer otherwise); a user's result merged with a saved one
    stays its own tensor."""
    x = torch.randn(5, 3)
    for fn, shared in ((lambda x: (x * 2, x.bfloat16(), x.bfloat16()), True),
                       (lambda x: (x.bfloat16(), x.bfloat16()), False)):
        graph = CompiledGraph(mark_saved_results(make_fx(fn)(x), 1), Options(), "forward")
        executable, _, rep = graph._compile([x])
        assert rep.whole_graph_fallback is None, rep.whole_graph_fallback
        results = executable([x])
        for got, want in zip(results, fn(x)):
            torch.testing.assert_close(got, want)
        assert (results[-2].data_ptr() == results[-1].data_ptr()) is shared


def test_an_update_of_an_input_is_written_back_and_read_after_it():
    """``copy_`` into a graph input (AOTAutograd's in-graph update of a training forward's buffers) is
    written into the input after the last step, and reads of the input after the update, and the
    copy's own result, see the new value, cast to the input's dtype; a copy into anything else runs
    the graph in PyTorch, so no write is dropped."""
    def update(x, s):
        s.copy_(x * 2)
        return s + 1, x.sum()

    def into_a_temporary(x, s):
        t = s + 0
        t.copy_(x)
        return (t * 3,)
    x, s = torch.randn(5, 3), torch.zeros(5, 3, dtype=torch.float64)
    graph = CompiledGraph(make_fx(update)(x, s.clone()), Options(), "forward")
    executable, _, rep = graph._compile([x, s])
    assert rep.whole_graph_fallback is None, rep.whole_graph_fallback
    after, total = executable([x, s])
    torch.testing.assert_close(s, (x * 2).double())
    torch.testing.assert_close(after, (x * 2).double() + 1)
    torch.testing.assert_close(total, x.sum())
    s = torch.zeros(5, 3)
    graph = CompiledGraph(make_fx(into_a_temporary)(x, s.clone()), Options(), "forward")
    fn, _, rep = graph._compile([x, s])
    assert "copy_ into a value that is not a graph input" in rep.whole_graph_fallback, rep.whole_graph_fallback
    torch.testing.assert_close(fn([x, s])[0], x * 3)


def test_load_returns_an_executable():
    x = torch.randn(5, 3)
    graph = CompiledGraph(make_fx(lambda x: x * 3)(x), Options(), "inference")
    executable, art, rep = graph._compile([x])
    assert rep.whole_graph_fallback is None, rep.whole_graph_fallback
    assert isinstance(executable, Executable) and executable.interpreted and art.interpret
    assert list(executable.kernels) == [k.name for k in art.kernels]
    (result,) = executable([x])
    torch.testing.assert_close(result, x * 3)


# --- verify() on programs built by hand -----------------------------------------------------------

def _kernel(name: str) -> Kernel:
    return Kernel(name, {"x": Var("x", 8)}, [], [], Schedule("pointwise", {"XBLOCK": 8}), ())


def _buffer(name: str) -> Buffer:
    return Buffer(name, (8,), torch.float32, (1,), torch.device("cpu"))


def _program(steps, outputs=None) -> Program:
    buffers = {n: _buffer(n) for n in ("arg0", "buf1", "buf2", "buf3")}
    return Program("by_hand", [Input(0, "arg0")], [], buffers, steps,
                   outputs if outputs is not None else [Returned("buf2")])


def _launch(name: str, reads: str, writes: str, grid=(1,)) -> KernelLaunch:
    return KernelLaunch(_kernel(name), grid, (reads, writes), (writes,), {"XBLOCK": 8})


def test_verify_accepts_a_well_formed_program():
    program = _program([Allocate("buf1"), _launch("k0", "arg0", "buf1"),
                        ExternCall("buf3", 3, "aten.sort.default", (ExternArg("buf1"),), ((None,), {}), None),
                        TupleItem("buf2", "buf3", 0, (1,)), EmptyLaunch(_kernel("k1"))],
                       [Returned("buf2"), Returned(View("buf1", (4,), (2,), 0), copy=True), Literal(3)])
    program.verify()
    text = str(program)
    assert "alloc   buf1 f32[8] strides=(1,) cpu" in text and "launch  k0 grid=(1,) (arg0, buf1)" in text
    assert text.splitlines()[-2] == "return  (buf2, as_strided(buf1, (4,), (2,), +0).clone(), 3)"


def test_verify_catches_a_launch_reading_an_unallocated_buffer():
    program = _program([Allocate("buf2"), _launch("k1", "buf1", "buf2")])  # buf1 is never allocated
    with pytest.raises(ProgramError, match="launch k1 uses buf1 before it is defined"):
        program.verify()


@pytest.mark.parametrize("case", ["written before allocated", "allocated twice", "zero grid", "output undefined",
                                  "fallback input undefined", "not in the plan"])
def test_verify_catches_broken_programs(case):
    steps = {
        "written before allocated": [_launch("k0", "arg0", "buf2"), Allocate("buf2")],
        "allocated twice": [Allocate("buf2"), Allocate("buf2"), _launch("k0", "arg0", "buf2")],
        "zero grid": [Allocate("buf2"), _launch("k0", "arg0", "buf2", grid=(0,))],
        "output undefined": [Allocate("buf1"), _launch("k0", "arg0", "buf1")],
        "fallback input undefined": [ExternCall("buf2", 2, "aten.abs.default", (ExternArg(View("buf1", (8,), (1,), 0)),),
                                                ((None,), {}), (1,))],
        "not in the plan": [Allocate("buf9"), _launch("k0", "arg0", "buf9")],
    }[case]
    message = {"written before allocated": "launch k0 uses buf2 before", "allocated twice": "already defined",
               "zero grid": "grid", "output undefined": "output 0 uses buf2 before",
               "fallback input undefined": "extern buf2 uses buf1 before", "not in the plan": "not in the buffer plan"}
    with pytest.raises(ProgramError, match=message[case]):
        _program(steps).verify()


def test_wrapper_and_codegen_import_no_pass():
    """The wrapper prints a Program: codegen depends on ``ir`` only, not on a pass (the launch order
    and grids are computed when the Program is built)."""
    codegen = Path(minicomp.__file__).parent / "codegen"
    for path in codegen.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert not (node.module or "").startswith(("passes", ".passes")) and \
                    not (node.level >= 2 and (node.module or "").startswith("passes")), (path.name, node.module)


def test_an_update_minicomp_cannot_write_runs_the_graph_in_pytorch():
    """A ``copy_`` into an input of a dtype minicomp's kernels do not take would be a fallback op that
    nothing reads, which dead-code elimination drops: the graph runs in PyTorch instead, and the
    input is updated."""
    def update(x, s):
        s.copy_(x.to(s.dtype) * 2)
        return (x + 1,)
    x, s = torch.randn(4), torch.zeros(4, dtype=torch.complex64)
    graph = CompiledGraph(make_fx(update)(x, s.clone()), Options(), "forward")
    fn, _, rep = graph._compile([x, s])
    assert "copy_ into a graph input that minicomp's kernels cannot write" in rep.whole_graph_fallback, rep
    torch.testing.assert_close(fn([x, s])[0], x + 1)
    torch.testing.assert_close(s, (x * 2).to(s.dtype))


class _Counting(torch.nn.Module):
    """A module that updates its own buffers in its forward and reads one after the update."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 6)
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))
        self.register_buffer("ema", torch.zeros(6))

    def forward(self, x):
        y = self.lin(x)
        self.calls.add_(1)
        with torch.no_grad():
            self.ema.mul_(0.9).add_(y.mean(0), alpha=0.1)
        return y * self.ema + self.calls


def test_buffers_a_training_forward_updates_and_reads_again_equal_eagers(monkeypatch):
    """A forward that updates its buffers (a counter, an average) and reads them after the update: the
    updates stay in the graph (``WrittenBack``), the reads see them, and buffers, results and
    gradients equal eager's over three steps."""
    import copy
    programs = []
    build = assemble.build_program
    monkeypatch.setattr(assemble, "build_program", lambda *a, **k: programs.append(build(*a, **k)) or programs[-1])
    torch.manual_seed(0)
    model = _Counting()
    eager = copy.deepcopy(model)
    compiled = torch.compile(model, backend="minicomp")
    for _ in range(3):
        x = torch.randn(4, 6)
        got, want = compiled(x), eager(x)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        got.square().sum().backward()
        want.square().sum().backward()
    assert model.calls.item() == 3
    torch.testing.assert_close(model.ema, eager.ema, rtol=1e-5, atol=1e-6)
    assert sum(isinstance(o, WrittenBack) for p in programs for o in p.outputs) == 2, programs
    for p, q in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
