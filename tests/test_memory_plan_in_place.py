"""The memory plan (passes/memory_plan.py) writing pointwise results in place over an input read for the last
time: a batch norm over a convolution's output, consumers that read elsewhere than they write kept apart,
hand-built Programs whose in-place writes run and check, and broken in-place plans the verifier rejects."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from minicomp.codegen.wrapper import wrapper_source
from minicomp.ir.expr import Affine, Var
from minicomp.ir.kernel import Kernel, KernelArg, Load, Phase, Schedule, Store
from minicomp.ir.program import (Allocate, Buffer, ExternArg, ExternCall, Free, KernelLaunch, Operand, Program,
                                 ProgramError)
from minicomp.passes.memory_plan import plan_memory
from tests.test_memory_plan import _buffers, _capture, _program, _run, check_plan
from tests.utils import compile_and_compare

aten = torch.ops.aten


# --- in place --------------------------------------------------------------------------------------

def conv_bn_relu(x, w1, w2, mean, var, weight, bias):
    return F.relu(F.batch_norm(F.conv2d(x, w1, padding=1), mean, var, weight, bias, False))


def conv_block(x, w1, w2, mean, var, weight, bias):
    """A residual block as ResNet's: conv -> bn -> relu, conv -> bn -> add -> relu."""
    y = conv_bn_relu(x, w1, w2, mean, var, weight, bias)
    return F.relu(F.batch_norm(F.conv2d(y, w2, padding=1), mean, var, weight, bias, False) + y)


def _conv_args():
    return (torch.randn(2, 4, 5, 5), torch.randn(4, 4, 3, 3), torch.randn(4, 4, 3, 3), torch.randn(4),
            torch.rand(4) + 0.5, torch.randn(4), torch.randn(4))


def _unplanned(program: Program) -> Program:
    return Program(program.name, program.inputs, program.constants, program.buffers,
                   [Allocate(s.buffer) if isinstance(s, Allocate) else s for s in program.steps
                    if not isinstance(s, Free)], program.outputs)


@pytest.mark.parametrize("poison", ["1", "0"])
@pytest.mark.parametrize("fn", [conv_bn_relu, conv_block], ids=lambda fn: fn.__name__)
def test_batch_norm_after_a_conv_writes_over_the_conv_output(fn, poison, monkeypatch):
    """The pointwise kernel after each (fallback) convolution writes its result over the conv's output,
    which it reads for the last time: not poisoned (it is the kernel's input), the donor's name
    dropped after the launch, the planned peak below the free-only plan's."""
    monkeypatch.setenv("MINICOMP_POISON", poison)
    programs = _capture(monkeypatch)
    # a channels-last input: layout_plan stores the convolutions' outputs NHWC, and the graph's result
    # (eager's layout: the input's) can then be written over them
    x, *rest = _conv_args()
    compile_and_compare(fn, x.contiguous(memory_format=torch.channels_last), *rest, fallbacks=None)
    (program,) = programs
    program.verify()
    check_plan(program)
    convs = [s.result for s in program.steps if isinstance(s, ExternCall)]
    in_place = [s for s in program.steps if isinstance(s, Allocate) and s.in_place]
    assert len(convs) == len(in_place) == (1 if fn is conv_bn_relu else 2), program
    assert in_place[0].reuses == convs[0] and f"reuses {convs[0]} in place" in str(program), program
    assert ", 2 in place)" in program.memory_summary() or fn is conv_bn_relu, program.memory_summary()
    lines = wrapper_source(program).splitlines()
    step = in_place[0]
    written = lines.index(f"    {step.buffer} = {step.reuses}  # in place")
    launch = next(i for i, line in enumerate(lines) if i > written and "kernels[" in line)
    dropped = next(i for i, line in enumerate(lines) if i > written and line.startswith("    del ") and
                   step.reuses in line[8:].split(", "))
    assert written < launch < dropped and "fill_garbage" not in lines[written + 1], lines[written:dropped + 1]
    free_only = plan_memory(_unplanned(program), "free")
    assert program.footprint()[0] < free_only.footprint()[0], (program, free_only)


def transposed(x):
    a = (x * 2).cumsum(0)
    return (a.t() + 1).contiguous()  # (``a.t() + 1`` keeps eager's transposed strides: read where it writes)


def flipped(x):
    a = (x * 2).cumsum(0)
    return a.flip(0) + 1


def rolled(x):
    """``roll`` reads the dying ``a`` at an index read from memory, and ``a`` itself again."""
    a = (x * 2).cumsum(0)
    return torch.roll(a, 1, 0) + a


def broadcast(x, y):
    return x.sum(1, keepdim=True) * y


NOT_IN_PLACE = {  # each pointwise consumer reads the dying buffer elsewhere than it stores
    "transposed": (transposed, lambda: (torch.randn(8, 8),), "not one pointwise kernel|another index"),
    "flipped": (flipped, lambda: (torch.randn(8, 8),), "another index"),
    "rolled": (rolled, lambda: (torch.randn(8, 8),), "another index"),
    "broadcast": (broadcast, lambda: (torch.randn(6, 5), torch.randn(6, 7)), "differ in device, dtype or storage"),
}


@pytest.mark.parametrize("case", list(NOT_IN_PLACE))
def test_a_consumer_reading_elsewhere_than_it_writes_is_not_in_place(case, monkeypatch):
    """Not planned in place; and the same Program with the consumer forced in place fails verify."""
    fn, make, reason = NOT_IN_PLACE[case]
    programs = _capture(monkeypatch)
    compile_and_compare(fn, *make())
    (program,) = programs
    program.verify()
    check_plan(program)
    assert not any(isinstance(s, Allocate) and s.reuses for s in program.steps), program
    launches = [s for s in program.steps if isinstance(s, KernelLaunch)]
    assert len(launches) == 2 and launches[1].args[0] == launches[0].writes[0], program
    if case in ("flipped", "rolled"):  # a pointwise kernel of the same layout: only the index tells
        assert launches[1].kernel.schedule.template == "pointwise", program
    dying, out = launches[0].writes[0], launches[1].writes[0]
    forced = Program(program.name, program.inputs, program.constants, program.buffers,
                     [Allocate(out, dying, in_place=True) if isinstance(s, Allocate) and s.buffer == out else s
                      for s in program.steps], program.outputs)
    with pytest.raises(ProgramError, match=reason):
        forced.verify()


# --- in place, by hand -----------------------------------------------------------------------------

def _elementwise(name: str, reads: tuple[str, ...], write: str, template: str = "pointwise",
                 index: Affine | None = None, store_first: bool = False) -> KernelLaunch:
    """A kernel over 8 elements that loads each of ``reads`` (at ``index``; default: where it stores)
    and stores ``write``."""
    x = Var("x", 8)
    at = Affine.of(x)
    args = [KernelArg(f"in_ptr{i}", None, False) for i in range(len(reads))] + [KernelArg("out_ptr0", None, True)]
    loads = [Load(f"v{i}", f"in_ptr{i}", index if index is not None else at, (), torch.float32)
             for i in range(len(reads))]
    store = [Store("out_ptr0", at, "v0", True)]
    kernel = Kernel(name, {"x": x}, args, [Phase(outer=store + loads if store_first else loads + store)],
                    Schedule(template, {"XBLOCK": 8}), ())
    return KernelLaunch(kernel, (1,), (*reads, write), (write,), {"XBLOCK": 8})


def _in_place_program(buffers=None, consumer=None, after=()) -> Program:
    """``a = k0(arg0)``; ``b`` written over ``a`` in place by ``consumer`` (default ``k1(a)``)."""
    return _program(buffers or _buffers(arg0=8, a=8, b=8, c=8),
                    [Allocate("a"), _elementwise("k0", ("arg0",), "a"), Allocate("b", "a", in_place=True),
                     consumer or _elementwise("k1", ("a",), "b"), Free(("a",)), *after], ["c" if after else "b"])


@pytest.mark.parametrize("poison", ["1", "0"])
def test_a_planned_in_place_write_runs_and_checks(poison, monkeypatch):
    monkeypatch.setenv("MINICOMP_POISON", poison)
    bare = _program(_buffers(arg0=8, a=8, b=8), [Allocate("a"), _elementwise("k0", ("arg0",), "a"), Allocate("b"),
                                                  _elementwise("k1", ("a",), "b")], ["b"])
    program = plan_memory(bare, "1")
    assert program.steps == _in_place_program().steps, program
    program.verify()
    check_plan(program)
    assert "alloc   b f32[8] strides=(1,) cpu  reuses a in place" in str(program), program
    assert program.footprint() == (32, 64) and plan_memory(bare, "free").footprint() == (64, 64)
    x = torch.randn(8)
    (b,) = _run(program, {"k0": lambda x, out: out.copy_(x + 1), "k1": lambda a, out: out.copy_(a * 2)}, x)
    torch.testing.assert_close(b, (x + 1) * 2)


@pytest.mark.parametrize("poison", ["1", "0"])
def test_a_transposed_result_in_eagers_strides_is_written_in_place(poison, monkeypatch):
    """``a.t() + 1`` comes back with eager's transposed strides, and its kernel walks memory order: each
    element is read where it is written, so the add runs in place over ``a``, with eager's values."""
    monkeypatch.setenv("MINICOMP_POISON", poison)
    programs = _capture(monkeypatch)

    def fn(x):
        return (x * 2).cumsum(0).t() + 1
    compile_and_compare(fn, torch.randn(8, 8))
    (program,) = programs
    program.verify()
    assert any(isinstance(s, Allocate) and s.in_place for s in program.steps), program


@pytest.mark.parametrize("poison", ["1", "0"])
def test_a_reshaped_consumer_writes_in_place_over_a_buffer_of_another_shape(poison, monkeypatch):
    """``b`` is ``a`` reshaped (2x4 over 8 elements: a product's epilogue, GPT-2's 8192x3072 -> 8x1024x3072)
    and written at the offsets it reads: planned in place over ``a``, reinterpreted at its own shape."""
    monkeypatch.setenv("MINICOMP_POISON", poison)
    buffers = {**_buffers(arg0=8, a=8), "b": Buffer("b", (2, 4), torch.float32, (4, 1), torch.device("cpu"))}
    bare = _program(buffers, [Allocate("a"), _elementwise("k0", ("arg0",), "a"), Allocate("b"),
                              _elementwise("k1", ("a",), "b")], ["b"])
    program = plan_memory(bare, "1")
    assert Allocate("b", "a", in_place=True) in program.steps, program
    program.verify()
    check_plan(program)
    assert "b = reinterpret(a, (2, 4), (4, 1), 0)  # in place" in wrapper_source(program)
    x = torch.randn(8)
    (b,) = _run(program, {"k0": lambda x, out: out.copy_(x + 1), "k1": lambda a, out: out.view(8).copy_(a * 2)}, x)
    assert b.shape == (2, 4)
    torch.testing.assert_close(b, ((x + 1) * 2).view(2, 4))


def test_a_fresh_fallback_result_is_a_donor():
    """``e`` (``aten.exp``: fresh by its schema) dies at ``k0``; ``b``, of its size, takes its storage."""
    exp = ExternCall("e", 1, aten.exp.default, (ExternArg("arg0"),), ((Operand(0),), {}), (1,))
    bare = _program(_buffers(arg0=8, e=8, a=8, b=8),
                    [exp, Allocate("a"), _elementwise("k0", ("e",), "a", "reduction"), Allocate("b"),
                     _elementwise("k1", ("a",), "b", "reduction")], ["b"])
    program = plan_memory(bare, "1")
    assert Allocate("b", "e") in program.steps, program
    program.verify()
    check_plan(program)
    x = torch.randn(8)
    (b,) = _run(program, {"k0": lambda e, out: out.copy_(e + 1), "k1": lambda a, out: out.copy_(a * 2)}, x,
                externs={1: torch.exp})
    torch.testing.assert_close(b, (x.exp() + 1) * 2)


@pytest.mark.parametrize("case", ["not pointwise", "other bytes", "read again later", "read elsewhere",
                                  "read after the store", "read through a view", "storage reused again",
                                  "not the next launch", "stored value not from the donor"])
def test_verify_rejects_broken_in_place_writes(case):
    buffers = _buffers(arg0=8, a=8, b=8, c=8, v=8)
    view_a = ExternCall("v", 1, aten.permute.default, (ExternArg("a"),), ((Operand(0), [0]), {}), (1,))
    flipped = 7 - Affine.of(Var("x", 8))
    program, message = {
        "not pointwise": (_in_place_program(consumer=_elementwise("k1", ("a",), "b", "reduction")),
                          "k1 is not one pointwise kernel"),
        "other bytes": (_in_place_program(buffers={
            **buffers, "b": Buffer("b", (8,), torch.float16, (1,), torch.device("cpu"))}),
            "differ in device, dtype or storage bytes"),
        "read again later": (_in_place_program(after=(Allocate("c"), _elementwise("k2", ("a", "b"), "c"))),
                             "a is not read for the last time by k1"),
        "read elsewhere": (_in_place_program(consumer=_elementwise("k1", ("a",), "b", index=flipped)),
                           "reads a at another index"),
        "read after the store": (_in_place_program(consumer=_elementwise("k1", ("a",), "b", store_first=True)),
                                 "reads a after it stores b"),
        "read through a view": (_program(buffers, [Allocate("a"), _elementwise("k0", ("arg0",), "a"), view_a,
                                                   Allocate("b", "a", in_place=True),
                                                   _elementwise("k1", ("a", "v"), "b")], ["b"]),
                                "another name may view a's storage"),
        "storage reused again": (_in_place_program(after=(Allocate("c", "a"), _elementwise("k2", ("b",), "c"))),
                                 "its storage went to b in place"),
        "not the next launch": (_program(buffers, [Allocate("a"), _elementwise("k0", ("arg0",), "a"),
                                                   Allocate("b", "a", in_place=True), Allocate("c"),
                                                   _elementwise("k2", ("arg0",), "c"), _elementwise("k1", ("a",), "b")],
                                         ["b", "c"]), "the next launch does not write b"),
        "stored value not from the donor": (_in_place_program(consumer=_elementwise("k1", ("arg0", "a"), "b")),
                                            "stores b with a value not computed from a"),
    }[case]
    with pytest.raises(ProgramError, match=message):
        program.verify()
    if case != "stored value not from the donor":  # the checker here does not follow values
        with pytest.raises(AssertionError):
            check_plan(program)
