"""The generated wrapper's lean path (``codegen/wrapper.py``'s ``bind`` -> ``run``) and the runtime
helpers it calls, on the CPU: CUDA's pieces stood in for by recorders."""
from __future__ import annotations

import pytest
import torch

from minicomp.codegen.wrapper import wrapper_source
from minicomp.ir.program import Allocate, Buffer
from minicomp.passes.memory_plan import plan_memory
from minicomp.runtime import support
from tests.test_memory_plan import _launch, _program


@pytest.mark.parametrize("on_its_device", [True, False])
def test_the_lean_path_allocates_through_the_fast_allocator_on_its_device(on_its_device):
    """The bound path (``bind`` -> ``run``) takes its fresh CUDA buffers from ``allocators``' fast
    function while the current device is the graph's, from the any-device one otherwise; a reuse of
    another shape is a ``reinterpret``. Run on the CPU: CUDA's pieces stood in for by recorders."""
    cuda = torch.device("cuda", 0)
    buffers = {n: Buffer(n, (8,), torch.float32, (1,), cuda) for n in ("arg0", "a", "b", "d")}
    buffers["c"] = Buffer("c", (2, 4), torch.float32, (4, 1), cuda)
    program = plan_memory(_program(buffers, [Allocate("a"), _launch("k0", ("arg0",), "a"), Allocate("b"),
                                             _launch("k1", ("a",), "b"), Allocate("c"), _launch("k2", ("b",), "c"),
                                             Allocate("d"), _launch("k3", ("c",), "d")], ["d"]), "1")
    assert Allocate("c", "a") in program.steps, program
    made = []

    def allocator(kind):
        def alloc(shape, strides, dtype):
            made.append(kind)
            return torch.empty_strided(shape, strides, dtype=dtype)
        return alloc
    scope: dict = {}
    exec(compile(wrapper_source(program), "<wrapper>", "exec"), scope)
    scope.update(allocators=lambda index, poison: (allocator("fast"), allocator("any")),
                 current_device=lambda: 0 if on_its_device else 1, raw_stream=lambda index: 0,
                 lean_launcher=lambda fn, kernel, grid, options: lambda stream, *tensors: fn(*tensors))
    kernels = {"k0": lambda x, out: out.copy_(x + 1), "k1": lambda a, out: out.copy_(a * 2),
               "k2": lambda b, out: out.copy_(b.view(2, 4) - 1), "k3": lambda c, out: out.copy_(c.view(8) * 3)}
    run = scope["bind"](kernels, {}, {})
    x = torch.randn(8)
    (d,) = run([x])
    torch.testing.assert_close(d, ((x + 1) * 2 - 1) * 3)
    fresh = [s for s in program.steps if isinstance(s, Allocate) and s.reuses is None]
    assert len(fresh) >= 2 and made == ["fast" if on_its_device else "any"] * len(fresh)


def test_reinterpret_views_past_the_tensors_own_offset():
    """``support.reinterpret`` (PyTorch's C helper where it has one) and its ``as_strided`` stand-in
    agree: sizes and strides as given, ``offset`` elements past the tensor's own start."""
    base = torch.arange(24.0)[5:]
    for view in (support.reinterpret, support._as_strided_past):
        got = view(base, (2, 3), (1, 2), 2)
        assert got.storage_offset() == 7 and got.stride() == (1, 2)
        torch.testing.assert_close(got, torch.tensor([[7.0, 9.0, 11.0], [8.0, 10.0, 12.0]]))


def test_a_fallback_result_contiguous_but_for_a_size_one_dim_takes_the_contiguous_check():
    """SDPA over [B * H, 1, T, D] views returns its result with its own stride for the size-1 dim: the
    wrapper checks such a result with ``ensure_contiguous`` (one C call), not ``ensure_layout``'s stride
    tuple, which that stride failed every call (the Python comparison dim by dim then ran each time);
    other strides keep ``ensure_layout``."""
    from minicomp.ir.program import ExternArg, ExternCall
    cpu = torch.device("cpu")
    buffers = {"arg0": Buffer("arg0", (6, 1, 4, 2), torch.float32, (8, 8, 2, 1), cpu),
               "r": Buffer("r", (6, 1, 4, 2), torch.float32, (8, 2, 2, 1), cpu),
               "t": Buffer("t", (6, 1, 4, 2), torch.float32, (8, 2, 1, 4), cpu)}
    sources = []
    for name in ("r", "t"):
        call = ExternCall(name, 0, torch.ops.aten.clone.default, (ExternArg("arg0"),), None, buffers[name].strides)
        sources.append(wrapper_source(_program(buffers, [call], [name])))
    assert "ensure_contiguous(r)" in sources[0] and "ensure_layout(" not in sources[0], sources[0]
    assert "ensure_layout(t, (8, 2, 1, 4))" in sources[1], sources[1]
    scope: dict = {}
    exec(compile(sources[0], "<wrapper>", "exec"), scope)
    x = torch.randn(6, 1, 4, 2)
    (r,) = scope["call"]([x], {}, {0: lambda a: a.clone()}, {})
    assert torch.equal(r, x)
