"""The memory plan (passes/memory_plan.py): names freed after their last use, dead buffers' storage
reused (allocated ones and fallback ops' fresh results), pointwise results written in place over an
input read for the last time. Checked on the Programs of real compiles by a liveness computed here,
apart from the pass and from ``Program.liveness`` (storage epochs: every read must see its storage as
it was when the name was defined); results compared with eager; a kernel that leaves part of a
*reused* buffer unwritten is caught by the poisoning; the planned peak drops on a chain and where a
batch norm writes over a convolution's output."""
from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

import minicomp
from minicomp.graphs import assemble
from minicomp.codegen.wrapper import wrapper_source
from minicomp.frontend.registry import RULES
from minicomp.ir.expr import Var
from minicomp.ir.kernel import Combo, Kernel, Load, Schedule, Store
from minicomp.ir.program import (Allocate, Buffer, ExternArg, ExternCall, Free, Input, KernelLaunch, Program,
                                 ProgramError, Returned, TupleItem, View, WrittenBack, base_of)
from minicomp.passes.memory_plan import plan_memory
from tests.utils import compile_and_compare

aten = torch.ops.aten


# --- an independent check of a planned Program -----------------------------------------------------

def check_plan(program: Program) -> None:
    """Walk the steps with explicit storages: each fresh allocation, fallback result or tuple item
    makes one; a reuse hands the donor's storage on (its epoch goes up); a fallback op's result may
    view its inputs' storages, an item its op's. A read (launch argument, fallback input, item source,
    graph output) must find its name bound and each of its storages at the epoch it had when the name
    was defined (a fallback op's result is fresh only where its ATen schema marks no result as an
    alias); a reuse must take an allocated buffer's or a fresh fallback result's storage of the same
    device, dtype and bytes; inputs, constants and outputs are never dropped. In place, the donor may
    still be read by the launch right after (past allocations), which must load the donor only where
    (and before) it stores the new buffer."""
    ids = itertools.count()
    epoch: dict[int, int] = {}
    views: dict[str, dict[int, int]] = {}  # name -> {storage: its epoch when the name was defined}
    bound, owned = set(), set()
    in_place: dict[str, tuple[str, int]] = {}  # donor -> (the buffer written over it, the allocation's step)
    returned = {base_of(o.value) for o in program.outputs if isinstance(o, Returned)}
    fixed = {i.name for i in program.inputs} | {c.name for c in program.constants}

    def fresh() -> set[int]:
        s = next(ids)
        epoch[s] = 0
        return {s}

    def define(name: str, storages: set[int]) -> None:
        views[name] = {s: epoch[s] for s in storages}
        bound.add(name)

    def read(name: str, where) -> None:
        assert name in bound, f"step {where}: {name} is read after it was dropped"
        for s, e in views[name].items():
            assert epoch[s] == e, f"step {where}: {name} is read after its storage went to another buffer"

    def nbytes(b: Buffer) -> int:
        return torch.empty_strided(b.shape, b.strides, dtype=b.dtype, device="meta").untyped_storage().nbytes()

    for name in fixed:
        define(name, fresh())
    for k, step in enumerate(program.steps):
        if isinstance(step, Allocate) and step.reuses:
            donor, new = program.buffers[step.reuses], program.buffers[step.buffer]
            assert step.reuses in owned and step.reuses in bound, f"step {k}: reuses {step.reuses}"
            assert (donor.device, donor.dtype, nbytes(donor)) == (new.device, new.dtype, nbytes(new)) != \
                (new.device, new.dtype, 0), f"step {k}: {donor} vs {new}"
            (s,) = views[step.reuses]
            epoch[s] += 1
            if step.in_place:
                in_place[step.reuses] = (step.buffer, k)
                views[step.reuses] = {s: epoch[s]}  # readable by the next launch only (see below)
            else:
                bound.discard(step.reuses)
            define(step.buffer, {s})
            owned.add(step.buffer)
        elif isinstance(step, Allocate):
            define(step.buffer, fresh())
            owned.add(step.buffer)
        elif isinstance(step, Free):
            for name in step.names:
                assert name in bound and name not in fixed | returned, f"step {k}: frees {name}"
                bound.discard(name)
        elif isinstance(step, KernelLaunch):
            for a in step.args:
                read(a, k)
            for donor, (buffer, at) in list(in_place.items()):
                assert all(isinstance(t, Allocate) for t in program.steps[at + 1:k]), f"step {k}: {donor} in place"
                _check_elementwise(program, step, donor, buffer)
                (s,) = views[donor]
                epoch[s] += 1  # a later read of the donor's name finds its storage changed
                views[buffer] = {s: epoch[s]}
                del in_place[donor]
        elif isinstance(step, ExternCall):
            reads = [base_of(a.value) for a in step.inputs]
            for name in reads:
                read(name, k)
            schema = getattr(step.target, "_schema", None)  # an ATen op says whether it returns a view
            fresh_result = schema is not None and all(r.alias_info is None for r in schema.returns)
            define(step.result, fresh().union(*([] if fresh_result else [views[n] for n in reads])))
            if fresh_result and step.strides is not None:
                owned.add(step.result)
        elif isinstance(step, TupleItem):
            read(step.source, k)
            define(step.result, fresh() | set(views[step.source]))
    for name in returned:
        read(name, "return")
    assert not in_place, f"written in place but never launched: {in_place}"


def _check_elementwise(program: Program, launch: KernelLaunch, donor: str, buffer: str) -> None:
    """``launch`` may write ``buffer`` over ``donor``: a pointwise kernel of one iteration per element
    (alone, or the one stage of a combo that names either), every load of the donor before any store
    of the buffer and at its offset (shapes may differ: the offsets tell)."""
    kernel, args = launch.kernel, launch.args
    if isinstance(kernel, Combo):
        stages, at = [], 0
        for k in kernel.stages:
            stages.append((k, launch.args[at:at + len(k.args)]))
            at += len(k.args)
        ((kernel, args),) = [(k, a) for k, a in stages if buffer in a or donor in a]
    assert buffer in launch.writes and isinstance(kernel, Kernel) and kernel.schedule.template == "pointwise", launch
    b = program.buffers[buffer]  # (bytes, dtype and device: checked at the Allocate)
    assert math.prod(v.size for v in kernel.vars.values()) == math.prod(b.shape), kernel
    role = dict(zip((arg.name for arg in kernel.args), args))
    statements = [s for p in kernel.phases for s in p.outer + p.inner]
    stores = [i for i, s in enumerate(statements) if isinstance(s, Store) and role[s.buffer] == buffer]
    loads = [i for i, s in enumerate(statements) if getattr(s, "buffer", None) and role[s.buffer] == donor]
    assert stores and all(isinstance(statements[i], Load) and i < stores[0] for i in loads), kernel
    assert {statements[i].index for i in stores + loads} == {statements[stores[0]].index}, kernel


def _capture(monkeypatch) -> list[Program]:
    """The Programs the compiles after this call build."""
    programs: list[Program] = []
    build = assemble.build_program

    def recording(*args, **kwargs):
        programs.append(build(*args, **kwargs))
        return programs[-1]
    monkeypatch.setattr(assemble, "build_program", recording)
    return programs


# --- real compiles ---------------------------------------------------------------------------------

def mlp_block(x, w1, b1, w2, b2, g):
    """Two pre-norm MLP blocks with residuals (the same shapes twice: storage to reuse)."""
    for _ in range(2):
        h = F.layer_norm(x, (x.shape[-1],), g)
        x = x + F.linear(F.gelu(F.linear(h, w1, b1)), w2, b2)
    return x


def norm_chain(x):
    for _ in range(3):
        x = F.layer_norm(torch.softmax(x * 1.5, -1), (x.shape[-1],)) + x.amax(0)
    return x


def fallback_view(x, y):
    """``permute`` falls back (its rule is removed): its result views ``a``'s buffer, which must stay
    unreused while the view is read, though ``a`` itself is never read again."""
    a = x.exp()
    p = a.permute(1, 0)
    d = (torch.softmax(y, -1) * 3).cumsum(0)
    return (d + p).sum(0), d.amax(-1)


def fallback_view_returned(x, y):
    """The fallback's view of ``a`` is a graph output: ``a``'s storage is never reused."""
    a = x.exp()
    return a.permute(1, 0), (torch.softmax(y, -1) * 3).cumsum(0).softmax(0) + 1


def views_of_one_buffer(x, y):
    a = torch.relu(x * y) + 1
    b = (a * 2).softmax(-1)
    return a, a.t(), a[1:, ::2], b.sum(0), b * 3


def several_results(x):
    """Sort's results are fresh (no alias in its schema): its input's buffer is free once sort ran."""
    values, indices = torch.sort(torch.softmax(x, -1) * 2, -1)
    return values.softmax(-1) + 1, indices


def zero_size(x, y):
    return (x.exp() + 1).sum(0), torch.softmax(y * 2, -1), x * 3


CASES = {
    "mlp_block": (mlp_block, lambda: (torch.randn(6, 16), torch.randn(32, 16), torch.randn(32),
                                      torch.randn(16, 32), torch.randn(16), torch.randn(16)), True),
    "norm_chain": (norm_chain, lambda: (torch.randn(8, 16),), True),
    "fallback_view": (fallback_view, lambda: (torch.randn(8, 8), torch.randn(8, 8)), False),
    "fallback_view_returned": (fallback_view_returned, lambda: (torch.randn(8, 8), torch.randn(8, 8)), False),
    "views_of_one_buffer": (views_of_one_buffer, lambda: (torch.randn(6, 8), torch.randn(6, 8)), False),
    "several_results": (several_results, lambda: (torch.randn(6, 8),), True),
    "zero_size": (zero_size, lambda: (torch.randn(0, 5), torch.randn(4, 0)), False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_plan_of_real_compiles_frees_and_reuses_nothing_live(case, monkeypatch):
    fn, make, reuses = CASES[case]
    if case.startswith("fallback_view"):
        monkeypatch.delitem(RULES, aten.permute.default)
    programs = _capture(monkeypatch)
    report = compile_and_compare(fn, *make(), fallbacks=None)
    assert programs and any("memory plan:" in d for d in report.decisions), report.summary()
    for program in programs:
        program.verify()
        check_plan(program)
    steps = [s for p in programs for s in p.steps]
    if case != "zero_size":
        assert any(isinstance(s, Free) for s in steps), programs[0]
    if reuses:
        assert any(isinstance(s, Allocate) and s.reuses for s in steps), programs[0]
    if case == "fallback_view":
        (program,) = programs
        (extern,) = [s for s in program.steps if isinstance(s, ExternCall)]
        viewed = base_of(extern.inputs[0].value)
        assert not any(isinstance(s, Allocate) and s.reuses == viewed for s in program.steps), program
        # a plan that ignored the alias would hand `a`'s buffer to the next allocation of its size
        broken = _reuse_first_fit(program, viewed)
        with pytest.raises(ProgramError, match=f"{viewed} is still live"):
            broken.verify()
        with pytest.raises(AssertionError, match="storage went to another buffer"):
            check_plan(broken)
    if case == "fallback_view_returned":
        (program,) = programs
        (extern,) = [s for s in program.steps if isinstance(s, ExternCall)]
        viewed = base_of(extern.inputs[0].value)
        assert program.liveness().death[viewed] == len(program.steps), program
        assert not any(isinstance(s, Allocate) and s.reuses == viewed for s in program.steps), program
    if case == "views_of_one_buffer":  # outputs (and what they view) are neither freed nor reused
        (program,) = programs
        returned = {base_of(o.value) for o in program.outputs if isinstance(o, Returned)}
        dropped = {n for s in program.steps if isinstance(s, Free) for n in s.names} | \
            {s.reuses for s in program.steps if isinstance(s, Allocate) and s.reuses}
        assert returned and not returned & dropped, program


def test_a_training_forward_writes_its_running_statistics_back_in_one_step(monkeypatch):
    """Batch norm's running statistics in training: AOTAutograd leaves their updates in the forward as
    ``copy_``, which the program writes back after its last step (``WrittenBack``; one
    ``write_back`` in the wrapper), not as results AOTAutograd copies one by one. Buffers and
    gradients after two steps equal eager's."""
    import copy
    programs = _capture(monkeypatch)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                torch.nn.Conv2d(8, 4, 1), torch.nn.BatchNorm2d(4))
    eager = copy.deepcopy(model)
    compiled = torch.compile(model, backend="minicomp")
    for _ in range(2):
        x = torch.randn(2, 3, 6, 6)
        compiled(x).square().sum().backward()
        eager(x).square().sum().backward()
    for (name, got), want in zip(model.state_dict().items(), eager.state_dict().values()):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=name)
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4, msg=name)
    forward = next(p for p in programs if any(isinstance(o, WrittenBack) for o in p.outputs))
    written = [o for o in forward.outputs if isinstance(o, WrittenBack)]
    assert len(written) == 6, forward  # running mean, var and num_batches_tracked of each batch norm
    assert wrapper_source(forward).count("write_back((") == 2  # once in call, once in the lean run


def _reuse_first_fit(program: Program, donor: str) -> Program:
    """``program`` with the first later allocation of ``donor``'s size taking its storage (and the
    frees of ``donor`` dropped), whatever may still read it."""
    steps, done = [], False
    size = program.buffers[donor]
    for s in program.steps:
        if isinstance(s, Free):
            names = tuple(n for n in s.names if n != donor)
            s = Free(names) if names else None
        elif isinstance(s, Allocate) and not done and s.buffer != donor and s.reuses is None and \
                (program.buffers[s.buffer].shape, program.buffers[s.buffer].dtype) == (size.shape, size.dtype) and \
                any(isinstance(t, Allocate) and t.buffer == donor for t in steps):
            s, done = Allocate(s.buffer, donor), True
        if s is not None:
            steps.append(s)
    assert done, program
    return Program(program.name, program.inputs, program.constants, program.buffers, steps, program.outputs)


def chain(x):
    """Softmax and cumsum do not share a kernel: six launches of one shape, in a chain."""
    for k in range(6):
        x = torch.softmax(x * (k + 1), -1).cumsum(-1)
    return x


def test_planned_peak_is_lower_on_a_chain(monkeypatch):
    programs = _capture(monkeypatch)
    compile_and_compare(chain, torch.randn(8, 32))
    (program,) = programs
    planned, unplanned = program.footprint()
    one = 8 * 32 * 4
    assert unplanned >= 8 * one and planned <= 3 * one, (planned, unplanned, str(program))
    assert sum(isinstance(s, Allocate) and s.reuses is not None for s in program.steps) >= 4, program
    # the same Program, planned otherwise: freeing only never beats reuse's peak; no plan keeps all
    bare = Program(program.name, program.inputs, program.constants, program.buffers,
                   [Allocate(s.buffer) if isinstance(s, Allocate) else s for s in program.steps
                    if not isinstance(s, Free)], program.outputs)
    assert bare.footprint() == (unplanned, unplanned)
    free_only = plan_memory(bare, "free")
    free_only.verify()
    check_plan(free_only)
    assert not any(isinstance(s, Allocate) and s.reuses for s in free_only.steps)
    assert planned <= free_only.footprint()[0] < unplanned
    assert plan_memory(bare, "0") is bare


# --- Programs by hand ------------------------------------------------------------------------------

def _kernel(name: str) -> Kernel:
    return Kernel(name, {"x": Var("x", 8)}, [], [], Schedule("pointwise", {"XBLOCK": 8}), ())


def _launch(name: str, reads: tuple[str, ...], writes: str) -> KernelLaunch:
    return KernelLaunch(_kernel(name), (1,), (*reads, writes), (writes,), {"XBLOCK": 8})


def _buffers(**sizes) -> dict[str, Buffer]:
    return {n: Buffer(n, (size,), torch.float32, (1,), torch.device("cpu")) for n, size in sizes.items()}


def _program(buffers, steps, outputs) -> Program:
    return Program("by_hand", [Input(0, "arg0")], [], buffers, steps, [Returned(o) for o in outputs])


def test_reuse_does_not_hold_a_storage_across_the_peak():
    """``a`` dies before ``s`` is made; ``c``, of ``a``'s size, is allocated while ``s`` lives. ``c``
    may take ``a``'s storage only if holding it meanwhile keeps the free-only plan's peak (``z``, at
    the start, sets it)."""
    def program(s: int) -> Program:
        return _program(_buffers(arg0=8, z=80, a=8, r=1, s=s, c=8),
                        [Allocate("z"), _launch("k0", ("arg0",), "z"), Allocate("a"), _launch("k1", ("z",), "a"),
                         Allocate("r"), _launch("k2", ("a",), "r"), Allocate("s"), _launch("k3", ("r",), "s"),
                         Allocate("c"), _launch("k4", ("s",), "c")], ["c"])
    across_the_peak = plan_memory(program(80), "1")  # a + r + s would top z + a
    assert not any(isinstance(s, Allocate) and s.reuses for s in across_the_peak.steps), across_the_peak
    below_the_peak = plan_memory(program(1), "1")
    assert Allocate("c", "a") in below_the_peak.steps, below_the_peak
    for size, p in ((80, across_the_peak), (1, below_the_peak)):
        p.verify()
        check_plan(p)
        assert p.footprint()[0] == plan_memory(program(size), "free").footprint()[0] == 4 * (max(80, size) + 8), \
            (size, p.footprint())


@pytest.mark.parametrize("shape", [(8,), (2, 4)])
def test_a_graph_output_reuses_only_a_storage_of_its_own_shape(shape):
    """A returned buffer is handed to the caller as a plain tensor, never an ``as_strided`` one."""
    buffers = _buffers(arg0=8, a=8, b=8, c=8)
    buffers["c"] = Buffer("c", shape, torch.float32, (4, 1)[-len(shape):], torch.device("cpu"))
    program = plan_memory(_program(buffers, [Allocate("a"), _launch("k0", ("arg0",), "a"), Allocate("b"),
                                             _launch("k1", ("a",), "b"), Allocate("c"), _launch("k2", ("b",), "c")],
                                   ["c"]), "1")
    program.verify()
    reused = [s.reuses for s in program.steps if isinstance(s, Allocate) and s.buffer == "c"]
    assert reused == (["a"] if shape == (8,) else [None]), program


@pytest.mark.parametrize("case", ["live donor", "live through an item",
                                  "used after free", "freed twice", "output freed", "input freed",
                                  "other size", "fallback result reused", "output reused"])
def test_verify_rejects_broken_plans(case):
    buffers = _buffers(arg0=8, a=8, b=8, c=8, v=8, t=8, i=8)
    write_a = [Allocate("a"), _launch("k0", ("arg0",), "a")]
    view_a = ExternCall("v", 1, "aten.permute.default", (ExternArg("a"),), ((None,), {}), (1,))
    steps, outputs, message = {
        "live donor": (write_a + [Allocate("b", "a"), _launch("k1", ("a",), "b")], ["b"], "a is still live"),
        "live through an item": (
            write_a + [ExternCall("t", 2, "aten.sort.default", (ExternArg(View("a", (8,), (1,), 0)),), ((None,), {}),
                                  None),
                       TupleItem("i", "t", 0, (1,)), Allocate("c", "a"), _launch("k2", ("i",), "c")],
            ["c"], "a is still live .*names that may view it: a, i, t"),
        "used after free": (write_a + [Free(("a",)), Allocate("b"), _launch("k1", ("a",), "b")], ["b"],
                            "uses a after it is freed"),
        "freed twice": (write_a + [Allocate("b"), _launch("k1", ("a",), "b"), Free(("a",)), Free(("a",))], ["b"],
                        "a is not defined here"),
        "output freed": (write_a + [Free(("a",))], ["a"], "a is a graph output"),
        "input freed": (write_a + [Free(("arg0",))], ["a"], "arg0 is an input or a constant"),
        "other size": (write_a + [Allocate("b"), _launch("k1", ("a",), "b"), Allocate("c", "a"),
                                  _launch("k2", ("b",), "c")], ["c"], "differ in device, dtype or storage bytes"),
        "fallback result reused": (write_a + [view_a, Allocate("b", "v"), _launch("k1", ("arg0",), "b")], ["b"],
                                   "only an allocated buffer's storage"),
        "output reused": (write_a + [Allocate("b", "a"), _launch("k1", ("arg0",), "b")], ["a", "b"],
                          "a is still live .*or by an output"),
    }[case]
    if case == "other size":
        buffers["c"] = Buffer("c", (4,), torch.float32, (1,), torch.device("cpu"))
    with pytest.raises(ProgramError, match=message):
        _program(buffers, steps, outputs).verify()


def test_verify_rejects_a_reuse_through_a_live_view():
    """``a``'s name is given to the reuse (not freed) while the fallback's view ``v`` of it is read later."""
    buffers = _buffers(arg0=8, a=8, b=8, c=8, v=8)
    steps = [Allocate("a"), _launch("k0", ("arg0",), "a"),
             ExternCall("v", 1, "aten.permute.default", (ExternArg("a"),), ((None,), {}), (1,)),
             Allocate("c", "a"), _launch("k2", ("arg0",), "c"), Allocate("b"), _launch("k1", ("v", "c"), "b")]
    program = _program(buffers, steps, ["b"])
    with pytest.raises(ProgramError, match="a is still live .*names that may view it: a, v"):
        program.verify()
    with pytest.raises(AssertionError, match="v is read after its storage went to another buffer"):
        check_plan(program)


class _Launcher:
    """Stands for a Triton kernel in the wrapper's ``kernels[name][grid](*args, **options)``."""

    def __init__(self, fn):
        self.fn = fn

    def __getitem__(self, grid):
        return lambda *args, **options: self.fn(*args)


def _run(program: Program, kernels: dict, *args, externs: dict | None = None):
    scope: dict = {}
    exec(compile(wrapper_source(program), "<wrapper>", "exec"), scope)
    return scope["call"](list(args), {k: _Launcher(f) for k, f in kernels.items()}, externs or {}, {})


@pytest.mark.parametrize("poison", ["1", "0"])
def test_poisoning_catches_a_kernel_that_skips_part_of_a_reused_buffer(poison, monkeypatch):
    """``c`` takes the storage of ``a``, which held ``2 * x`` — what ``c`` should hold. A kernel that
    writes only half of ``c`` then passes without the poisoning (the stale half is right), and is
    caught with it (NaN)."""
    monkeypatch.setenv("MINICOMP_POISON", poison)
    program = plan_memory(_program(
        _buffers(arg0=8, a=8, b=8, c=8),
        [Allocate("a"), _launch("double", ("arg0",), "a"), Allocate("b"), _launch("add_one", ("a",), "b"),
         Allocate("c"), _launch("double_first_half", ("arg0",), "c")], ["b", "c"]), "1")
    assert Allocate("c", "a") in program.steps, program
    program.verify()
    kernels = {"double": lambda x, out: out.copy_(2 * x), "add_one": lambda a, out: out.copy_(a + 1),
               "double_first_half": lambda x, out: out[:4].copy_(2 * x[:4])}
    x = torch.randn(8)
    b, c = _run(program, kernels, x)
    torch.testing.assert_close(b, 2 * x + 1)
    if poison == "1":
        assert torch.isnan(c[4:]).all() and torch.equal(c[:4], 2 * x[:4])
    else:
        torch.testing.assert_close(c, 2 * x)  # the bug goes unseen: why reused buffers are poisoned


class _WritesHalf:
    """A launcher that runs the real kernel into a scratch buffer and copies back only the first half
    of its output argument ``position`` (a kernel that forgets part of its store)."""

    def __init__(self, kernel, position: int):
        self.kernel, self.position = kernel, position

    def __getitem__(self, grid):
        def launch(*args, **options):
            out = args[self.position]
            scratch = torch.empty_like(out)
            self.kernel[grid](*args[:self.position], scratch, *args[self.position + 1:], **options)
            half = out.numel() // 2
            out.view(-1)[:half].copy_(scratch.view(-1)[:half])
        return launch


@pytest.mark.slow
@pytest.mark.parametrize("poison", ["1", "0"])
def test_poisoning_reaches_reused_buffers_of_a_compiled_graph(poison, monkeypatch):
    """The generated wrapper poisons a reused buffer: a kernel writing half of one leaves NaN (and
    stale finite values without the poisoning)."""
    monkeypatch.setenv("MINICOMP_POISON", poison)
    monkeypatch.setenv("MINICOMP_GRAPH_CACHE", "0")
    programs = _capture(monkeypatch)
    load = assemble.load
    broken = []

    def loading(art, stored=False):
        executable = load(art, stored)
        (program,) = programs
        reused = {s.buffer for s in program.steps if isinstance(s, Allocate) and s.reuses}
        launch = next(s for s in program.steps if isinstance(s, KernelLaunch) and reused & set(s.writes))
        position = launch.args.index(next(w for w in launch.writes if w in reused))
        executable.kernels[launch.name] = _WritesHalf(executable.kernels[launch.name], position)
        broken.append(launch.name)
        return executable
    monkeypatch.setattr(assemble, "load", loading)

    out = minicomp.compile(chain)(torch.randn(8, 32))
    assert broken and minicomp.report().whole_graph_fallback is None
    assert torch.isnan(out).any() == (poison == "1"), out


def test_only_a_schema_without_aliases_makes_a_fallback_result_fresh():
    def call(target) -> ExternCall:
        return ExternCall("r", 1, target, (ExternArg("a"),), ((None,), {}), None)
    assert call(aten.permute.default).may_view_inputs and call(aten.t.default).may_view_inputs
    assert not call(aten.sort.default).may_view_inputs and not call(aten.convolution.default).may_view_inputs
    # a name (as tests write it) or a Python callable may return anything
    assert call("aten.sort.default").may_view_inputs and call(lambda a: a).may_view_inputs


def test_a_reuse_of_another_shape_reinterprets_the_storage():
    """``c`` (2x4) takes the storage of ``a`` (8): the wrapper reinterprets it (``reinterpret``)."""
    buffers = _buffers(arg0=8, a=8, b=8, d=2)
    buffers["c"] = Buffer("c", (2, 4), torch.float32, (4, 1), torch.device("cpu"))
    program = plan_memory(_program(buffers, [Allocate("a"), _launch("k0", ("arg0",), "a"), Allocate("b"),
                                             _launch("k1", ("a",), "b"), Allocate("c"), _launch("k2", ("b",), "c"),
                                             Allocate("d"), _launch("k3", ("c",), "d")], ["d"]), "1")
    assert Allocate("c", "a") in program.steps, program
    program.verify()
    check_plan(program)
    assert "c = reinterpret(a, (2, 4), (4, 1), 0)" in wrapper_source(program)
    kernels = {"k0": lambda x, out: out.copy_(x + 1), "k1": lambda a, out: out.copy_(a * 2),
               "k2": lambda b, out: out.copy_(b.view(2, 4) - 1), "k3": lambda c, out: out.copy_(c.sum(1))}
    x = torch.randn(8)
    (d,) = _run(program, kernels, x)
    torch.testing.assert_close(d, ((x + 1) * 2 - 1).view(2, 4).sum(1))


@pytest.mark.gpu
def test_cuda_peak_memory_of_a_chain_is_at_most_eagers(monkeypatch):
    """On the GPU, through PyTorch's caching allocator: the planned chain's peak (free and reuse, or
    free only) is at most eager's and below the unplanned one's."""
    x = torch.randn(256, 4096, device="cuda")  # 4 MiB per buffer

    def peak(fn) -> int:
        fn(x)  # compiles
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        out = fn(x)
        torch.cuda.synchronize()
        del out
        return torch.cuda.max_memory_allocated() - base

    eager = peak(chain)
    peaks = {}
    for mode in ("1", "free", "0"):
        monkeypatch.setenv("MINICOMP_MEMORY_PLAN", mode)
        torch._dynamo.reset()
        compiled = minicomp.compile(chain)
        torch.testing.assert_close(compiled(x), chain(x), atol=1e-4, rtol=1e-4)
        peaks[mode] = peak(compiled)
    assert peaks["1"] <= eager and peaks["free"] <= eager and peaks["0"] > peaks["1"], (peaks, eager)
