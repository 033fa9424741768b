"""Modes and CUDA graphs on the CPU: mode parsing, the static inputs the backend finds, every reason a
graph is not captured, and the runner's bookkeeping (static buffers, outputs, moved parameters) with
a stand-in for the CUDA graph. The captures themselves are checked in tests/test_cuda.py."""
import pytest
import torch
from torch._subclasses import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

import minicomp
from minicomp.graphs.options import MODES, Options
from minicomp.report import Report
from minicomp.runtime import cuda_graphs, support
from minicomp.runtime.cuda_graphs import CudaGraphRunner, GraphFacts, facts_of_fx, ineligible


# ------------------------------------------------------------------------------------------- modes

@pytest.mark.parametrize("mode,autotune,cudagraphs", [
    ("default", False, False), ("reduce-overhead", False, True),
    ("max-autotune", True, True), ("max-autotune-no-cudagraphs", True, False)])
def test_modes_as_torch_compile_names_them(mode, autotune, cudagraphs):
    assert mode in MODES
    opts = Options(mode=mode)
    assert (opts.autotune, opts.cudagraphs) == (autotune, cudagraphs)


def test_an_unknown_mode_is_an_error_naming_it():
    with pytest.raises(ValueError, match="'reduce_overhead'.*reduce-overhead"):
        minicomp.compile(lambda x: x + 1, mode="reduce_overhead")
    f = torch.compile(lambda x: x + 1, backend="minicomp", mode="fastest")
    with pytest.raises(Exception, match="'fastest'"):
        f(torch.randn(3))


@pytest.mark.parametrize("how", ["mode", "options", "minicomp"])
def test_reduce_overhead_reaches_the_backend_and_runs_cpu_tensors_plainly(how):
    def fn(x, y):
        return torch.relu(x) * y + 1, x.sum(-1)
    if how == "mode":
        f = torch.compile(fn, backend="minicomp", mode="reduce-overhead")
    elif how == "options":  # torch.compile takes mode or options, not both
        f = torch.compile(fn, backend="minicomp", options={"mode": "reduce-overhead", "static_outputs": True})
    else:
        f = minicomp.compile(fn, mode="reduce-overhead")
    for _ in range(3):  # fresh values every call
        x, y = torch.randn(5, 7), torch.randn(7)
        for got, want in zip(f(x, y), fn(x, y)):
            torch.testing.assert_close(got, want)
    rep = minicomp.report()
    assert rep.cuda_graph == "not captured: CPU tensors: the kernels run in Triton's interpreter", rep.summary()
    assert "CUDA graph: not captured: CPU tensors" in rep.summary()


def test_default_mode_says_nothing_about_cuda_graphs():
    f = torch.compile(lambda x: x * 2, backend="minicomp")
    f(torch.randn(4))
    f(torch.randn(4))
    assert minicomp.report().cuda_graph is None
    assert "CUDA graph" not in minicomp.report().summary()


def test_graph_cache_hit_reports_the_reason_too():
    def fn(x):
        return torch.tanh(x) + 1
    x = torch.randn(6)
    torch.compile(fn, backend="minicomp", mode="reduce-overhead")(x)  # compiled and stored
    torch._dynamo.reset()
    f = torch.compile(fn, backend="minicomp", mode="reduce-overhead")
    torch.testing.assert_close(f(x), fn(x))
    rep = minicomp.report()
    assert rep.from_cache, rep.summary()
    torch.testing.assert_close(f(x * 2), fn(x * 2))  # the first call ran plainly: now wrap decides
    assert rep.cuda_graph.startswith("not captured: CPU tensors"), rep.summary()


# ---------------------------------------------------------------------------------- static inputs

def _spy_on_wrap(monkeypatch, about) -> list:
    """(``about(report)``, the static inputs, the arguments) of every ``cuda_graphs.wrap`` call."""
    seen, real_wrap = [], cuda_graphs.wrap

    def spy(fn, args, facts, report, static_outputs=False):
        seen.append((about(report), facts.static_inputs, list(args)))
        return real_wrap(fn, args, facts, report, static_outputs)
    monkeypatch.setattr(cuda_graphs, "wrap", spy)
    return seen


def test_backend_marks_parameters_and_buffers_static_in_forward_and_backward(monkeypatch):
    seen = _spy_on_wrap(monkeypatch, lambda report: report.graph)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.BatchNorm1d(6), torch.nn.ReLU(), torch.nn.Linear(6, 3))
    f = torch.compile(model, backend="minicomp", mode="reduce-overhead")
    x = torch.randn(5, 4, requires_grad=True)
    f(x).sum().backward()
    params = {id(p) for p in model.parameters()} | {id(b) for b in model.buffers()}
    forward = next((s, a) for g, s, a in seen if g.endswith("forward"))
    backward = next((s, a) for g, s, a in seen if g.endswith("backward"))
    for static, args in (forward, backward):
        assert static, "no static input found"
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor) and a is not x:
                # every parameter and buffer is static; x and the saved activations are not
                assert (i in static) == (id(a) in params or isinstance(a, torch.nn.Parameter)), (i, static)
        assert not any(args[i] is x for i in static)
    assert len([i for i, a in enumerate(forward[1]) if id(a) in params]) == len(params)
    assert any(isinstance(forward[1][i], torch.nn.Parameter) for i in forward[0])


def test_graph_cache_hit_marks_parameters_and_buffers_static(monkeypatch):
    seen = _spy_on_wrap(monkeypatch, lambda report: report.from_cache)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.BatchNorm1d(6)).eval()
    x = torch.randn(3, 4)
    with torch.no_grad():
        torch.compile(model, backend="minicomp", mode="reduce-overhead")(x)
        torch._dynamo.reset()
        f = torch.compile(model, backend="minicomp", mode="reduce-overhead")
        f(x)
        f(x)
    from_cache, static, args = seen[-1]
    assert from_cache
    params = {id(t) for t in (*model.parameters(), *model.buffers())}
    # the Linear's and the BatchNorm's tensors (not its counter: unused in eval)
    assert static == {i for i, a in enumerate(args) if id(a) in params} and len(static) >= 4


# ------------------------------------------------------------------------------- fallback reasons

def _cuda(*shape):
    with FakeTensorMode():
        return torch.empty(*shape, device="cuda")


@pytest.fixture
def gpu_present(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


def test_reason_cpu_tensors_and_no_cuda_inputs():
    assert ineligible([torch.randn(3)], GraphFacts()) == "CPU tensors: the kernels run in Triton's interpreter"
    assert ineligible([2, 3.0], GraphFacts()) == "no CUDA tensor among the inputs"


def test_reason_cpu_scalar_tensor_read_by_a_cuda_graph(gpu_present):
    assert ineligible([_cuda(4), torch.tensor(1.5)], GraphFacts()).startswith("reads CPU tensor input(s) [1]")


def test_reason_dynamic_shapes(gpu_present):
    gm = make_fx(lambda x: x * x.shape[0], tracing_mode="symbolic")(torch.randn(5, 3))
    facts = facts_of_fx(gm)
    assert facts.symbolic_inputs, gm.graph
    assert ineligible([_cuda(5, 3)], facts).startswith("dynamic shapes: symbolic sizes in ")
    assert ineligible([_cuda(5, 3), 5], GraphFacts()) == "dynamic shapes: number input(s) [1]"


def test_reason_graph_writes_an_input(gpu_present):
    gm = make_fx(lambda x, y: (y.add_(1), x * 2))(torch.randn(3), torch.randn(3))
    facts = facts_of_fx(gm)
    assert facts.mutated_inputs == (1,), gm.graph
    assert ineligible([_cuda(3), _cuda(3)], facts).startswith("writes input(s) [1] inside the graph")
    # a functional graph writes nothing
    assert facts_of_fx(make_fx(lambda x: x + 1)(torch.randn(3))).mutated_inputs == ()


def _item_graph() -> torch.fx.GraphModule:
    """x * x.sum().item(), as Dynamo hands it over with capture_scalar_outputs (make_fx refuses it)."""
    g = torch.fx.Graph()
    x = g.placeholder("x")
    total = g.call_function(torch.ops.aten.sum.default, (x,))
    s = g.call_function(torch.ops.aten._local_scalar_dense.default, (total,))
    g.output((g.call_function(torch.ops.aten.mul.Tensor, (x, s)),))
    return torch.fx.GraphModule({}, g)


@pytest.mark.parametrize("fn,op", [
    (lambda x: x.nonzero(), "nonzero"),
    (lambda x: x[x > 0], "index"),  # boolean indexing: nonzero underneath, or index with a mask
    (None, "_local_scalar_dense"),
    (lambda x: torch.unique(x), "unique"),
    (lambda x: torch.masked_select(x, x > 0), "masked_select"),
])
def test_reason_uncapturable_ops(gpu_present, fn, op):
    facts = facts_of_fx(make_fx(fn)(torch.randn(8)) if fn else _item_graph())
    reason = ineligible([_cuda(8)], facts)
    assert reason is not None and reason.startswith("ops that synchronize or have data-dependent shapes"), facts
    if op != "index":
        assert op in reason, reason


def test_reason_uncapturable_op_of_a_graph_cache_entry(gpu_present):
    facts = cuda_graphs.facts_of_ops(["nonzero.default", "convolution.default"])
    assert ineligible([_cuda(3)], facts) == "ops that synchronize or have data-dependent shapes: nonzero"
    assert ineligible([_cuda(3)], cuda_graphs.facts_of_ops(["convolution.default"])) is None


def test_wrap_hands_back_the_plain_callable_with_the_reason():
    rep = Report("g")

    def fn(args):
        return (args[0] + 1,)
    assert cuda_graphs.wrap(fn, [torch.randn(2)], GraphFacts(), rep) is fn
    assert rep.cuda_graph == "not captured: CPU tensors: the kernels run in Triton's interpreter"


# ------------------------------------------------------------- the runner, with a stand-in capture

class _StandIn:
    """Replays like a CUDA graph: runs the function on the static arguments and writes the results
    into the buffers the capture returned (so earlier outputs are overwritten, as on the GPU)."""

    def __init__(self, fn, static_args, outputs):
        self.fn, self.static_args, self.outputs, self.replays = fn, static_args, outputs, 0

    def replay(self):
        self.replays += 1
        for out, new in zip(self.outputs, self.fn(list(self.static_args))):
            if isinstance(out, torch.Tensor) and out.numel() and out.data_ptr() != new.data_ptr():
                with torch.inference_mode():  # a replay writes memory; Python would refuse an inference tensor
                    out.copy_(new)


@pytest.fixture
def stand_in(monkeypatch):
    """CudaGraphRunner on CPU tensors: captures are stand-ins, streams are not ordered."""
    captures = []

    def capture(self, args, static_args):
        self._copy_inputs(args)
        outputs = self.fn(list(static_args))  # the warm-up's outputs stand for the captured buffers
        if getattr(self, "fail", None):
            raise RuntimeError(self.fail)
        captures.append(_StandIn(self.fn, static_args, outputs))
        return captures[-1], outputs
    monkeypatch.setattr(CudaGraphRunner, "_capture", capture)
    monkeypatch.setattr(CudaGraphRunner, "_after_previous_call", lambda self: None)
    return captures


def _graph(w):
    calls = []

    def fn(args):  # what a wrapper does: fresh buffers, a view of an input, a parameter returned as is
        x, w_ = args
        calls.append([a.data_ptr() for a in args])
        y = x @ w_
        both = torch.empty(2 * y.numel())
        both[:y.numel()] = y.flatten()
        both[y.numel():] = (y * 2).flatten()
        return y.relu(), x.t(), w_, both[:y.numel()].view(y.shape), both[y.numel():].view(y.shape), 7
    return fn, calls


@pytest.mark.parametrize("static_outputs", [False, True])
def test_runner_copies_inputs_not_parameters_and_keeps_earlier_results(stand_in, static_outputs):
    w = torch.nn.Parameter(torch.randn(3, 4), requires_grad=False)
    fn, calls = _graph(w)
    rep = Report("g")
    runner = CudaGraphRunner(fn, [torch.randn(2, 3), w], frozenset({1}), rep, static_outputs)
    results = []
    for k in range(3):
        x = torch.randn(2, 3)
        got = runner([x, w])
        want = fn([x, w])
        for g, e in zip(got, want):
            if isinstance(g, torch.Tensor):
                torch.testing.assert_close(g, e)
                assert g.stride() == e.stride()
            else:
                assert g == e
        assert got[1]._base is x or got[1].data_ptr() == x.data_ptr()  # a view of this call's input
        assert got[2] is w                                               # the parameter, not a copy
        assert got[3].untyped_storage().data_ptr() == got[4].untyped_storage().data_ptr()  # views of one buffer
        results.append((x, [g.clone() if isinstance(g, torch.Tensor) else g for g in got], got))
    assert len(stand_in) == 1 and stand_in[0].replays == 3
    assert rep.cuda_graph.startswith("captured: 1 input(s) copied per call, 1 static"), rep.cuda_graph
    graph_w = [c[1] for c in calls]
    assert len(set(graph_w)) == 1 and graph_w[0] == w.data_ptr()  # the graph always read w itself
    first_then, first_now = results[0][1][0], results[0][2][0]
    if static_outputs:  # the next replay overwrote it
        assert rep.cuda_graph.endswith("the graph's own buffers (overwritten by the next call)")
        torch.testing.assert_close(first_now, results[-1][1][0])
    else:
        torch.testing.assert_close(first_now, first_then)
        assert first_now.data_ptr() != results[1][2][0].data_ptr()


def test_runner_records_again_when_a_parameter_moves_and_gives_up_after_the_bound(stand_in):
    w = torch.nn.Parameter(torch.randn(3, 4), requires_grad=False)
    fn, _ = _graph(w)
    rep = Report("g")
    runner = CudaGraphRunner(fn, [torch.randn(2, 3), w], frozenset({1}), rep, False)
    x = torch.randn(2, 3)
    runner([x, w])
    w2 = torch.nn.Parameter(torch.randn(3, 4), requires_grad=False)  # swapped for another tensor
    torch.testing.assert_close(runner([x, w2])[0], (x @ w2).relu())
    assert len(stand_in) == 2 and "re-recorded 1 time(s)" in rep.cuda_graph
    for k in range(cuda_graphs.MAX_RECORDINGS):
        wk = torch.randn(3, 4)
        torch.testing.assert_close(runner([x, wk])[0], (x @ wk).relu())
    assert len(stand_in) == cuda_graphs.MAX_RECORDINGS
    assert rep.cuda_graph == (f"not captured: static inputs moved: recorded {cuda_graphs.MAX_RECORDINGS} "
                              "times, plain launches since")


def test_runner_falls_back_with_the_capture_error(stand_in):
    fn, _ = _graph(None)
    rep = Report("g")
    runner = CudaGraphRunner(fn, [torch.randn(2, 3), torch.randn(3, 4)], frozenset(), rep, False)
    runner.fail = "operation not permitted when stream is capturing"
    x, w = torch.randn(2, 3), torch.randn(3, 4)
    torch.testing.assert_close(runner([x, w])[0], (x @ w).relu())
    assert rep.cuda_graph == "not captured: RuntimeError: operation not permitted when stream is capturing"
    torch.testing.assert_close(runner([w.t(), w])[0], (w.t() @ w).relu())  # plain from now on
    assert not stand_in


def test_runner_copies_a_broadcast_input_as_one_slice(stand_in):
    def fn(args):
        return (args[0] * 2 + args[1],)
    b = torch.randn(5).expand(4, 5)
    runner = CudaGraphRunner(fn, [b, torch.randn(4, 5)], frozenset(), Report("g"), False)
    for _ in range(2):
        b, y = torch.randn(1, 5).expand(4, 5), torch.randn(4, 5)
        torch.testing.assert_close(runner([b, y])[0], b * 2 + y)
    assert runner.buffers[0].stride() == (0, 1) and runner.targets[0].shape == (1, 5)


def test_own_counters_keep_a_graphs_counters_apart():
    kernel = object()
    kept = support.kept_counters(kernel, 3, "cpu")
    store = {}
    with support.own_counters(store):
        own = support.kept_counters(kernel, 3, "cpu")
        assert support.kept_counters(kernel, 3, "cpu") is own
        with support.own_counters({}):
            assert support.kept_counters(kernel, 3, "cpu") is not own
        assert support.kept_counters(kernel, 3, "cpu") is own
    assert own is not kept and support.kept_counters(kernel, 3, "cpu") is kept
    assert list(store.values())[0][1] is own
    # a lean wrapper's keeper, which remembers a stream's counters after its first launch, too
    keeper = support.counter_keeper(kernel, 3, "cpu")
    assert keeper(0) is kept
    with support.own_counters(store):
        assert keeper(0) is own
    assert keeper(0) is kept and support._RECORDING == 0


def test_replay_check_compares_like_a_plain_run():
    # a recording is checked by one replay against the warm-up: equal up to rounding, NaN where NaN
    x = torch.randn(4, 5)
    assert cuda_graphs._close(x, x.clone()) and cuda_graphs._close(x[:0], x[:0])
    assert not cuda_graphs._close(x, torch.zeros_like(x)) and not cuda_graphs._close(x, x.t())
    y = x.clone()
    y[1, 2] = x[1, 2] = float("nan")
    assert cuda_graphs._close(x, y)
    b = x.bfloat16()
    assert cuda_graphs._close(b, b * (1 + 2 ** -8)) and not cuda_graphs._close(b, b * 1.5)
    assert cuda_graphs._close(torch.tensor([True, False]), torch.tensor([True, False]))


def test_random_ops_are_not_replay_checked():
    assert facts_of_fx(make_fx(lambda x: torch.rand_like(x) + x)(torch.randn(3))).random
    assert not facts_of_fx(make_fx(lambda x: x + 1)(torch.randn(3))).random
    assert cuda_graphs.facts_of_ops(["native_dropout.default"]).random


def test_runner_recorded_in_inference_mode_serves_calls_outside_it(stand_in):
    def fn(args):
        return (args[0] * 2,)
    with torch.inference_mode():
        x = torch.randn(3)
        runner = CudaGraphRunner(fn, [x], frozenset(), Report("g"), False)
        torch.testing.assert_close(runner([x])[0], x * 2)
    y = torch.randn(3)
    torch.testing.assert_close(runner([y])[0], y * 2)  # copies into the static buffer outside the mode
