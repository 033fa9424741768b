"""Split reductions and online softmax (passes/split_reductions.py), run in Triton's interpreter.

The thresholds are lowered for these tests, so small tensors take the paths that long GPU rows take.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils._pytree as pytree

import minicomp
from minicomp.passes.split_reductions import SOFTMAX_ROWS_PER_SM
from tests.test_target import _scheduled
from tests.utils import H200, compare_gradients, compile_and_compare, small_split_thresholds


@pytest.fixture(autouse=True)
def small_thresholds(monkeypatch):
    small_split_thresholds(monkeypatch)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_online_softmax_of_long_rows(dtype):
    x = torch.randn(3, 300, dtype=dtype) * 4  # 5 chunks of 60 (the last one padded)
    compile_and_compare(lambda x: torch.softmax(x, -1), x, kernels=1)  # 3 kernels, one pipelined launch
    decisions = minicomp.report().decisions
    assert any("online softmax in 5 chunks" in d for d in decisions)
    assert any(d.startswith("pipelined:") and "over 3 rows" in d for d in decisions), decisions


@pytest.fixture
def looped_rows(monkeypatch):
    """The real rule for how many softmax rows loop per row (the interpreter counts one SM), not the
    split that ``small_split_thresholds`` pins."""
    from minicomp.passes import split_reductions as split
    monkeypatch.setattr(split, "SOFTMAX_ROWS_PER_SM", SOFTMAX_ROWS_PER_SM)


def test_online_log_softmax_and_softmax_over_a_middle_axis():
    x = torch.randn(2, 300, 3)
    compile_and_compare(lambda x: (torch.log_softmax(x, 1), torch.softmax(x, 1)), x)
    assert any("online softmax in 5 chunks" in d for d in minicomp.report().decisions)


def test_online_softmax_inf_nan_and_all_masked_chunks():
    x = torch.randn(4, 300)
    x[0, :130] = float("-inf")        # whole chunks of -inf: their max must not poison the sum
    x[1] = float("-inf")              # a row of -inf is nan, as in eager
    x[2, 17] = float("nan")
    x[3, 250] = float("inf")
    compile_and_compare(lambda x: torch.softmax(x, -1), x)


# --- long rows, enough of them: one looped program per row (softmax_rows_split) ---------------------

SOFTMAX_FORMS = {
    "softmax": lambda x: torch.softmax(x, -1),
    "log_softmax": lambda x: torch.log_softmax(x, -1),
    "logsumexp": lambda x: torch.logsumexp(x, -1),
    "x - logsumexp": lambda x: x - torch.logsumexp(x, -1, keepdim=True),
}


def _special_rows(x: torch.Tensor) -> torch.Tensor:
    """Rows of -inf runs longer than a loop step, all -inf (nan in eager's softmax), +1e4 offsets,
    a nan and a +inf: each lane's running max changes between steps."""
    x[0, :9000] = float("-inf")
    x[1] = float("-inf")
    x[2] += 1e4
    x[3, 4000:] -= 1e4
    x[4, 17] = float("nan")
    x[5, 12345] = float("inf")
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("form", SOFTMAX_FORMS)
def test_looped_online_softmax_of_many_long_rows(form, dtype, looped_rows):
    # rows of 20000 > the interpreter's persistent block (2**14): a loop of several steps; 6 rows >= 4
    # per SM of the interpreter's one
    x = _special_rows((torch.randn(6, 20000) * 4).to(dtype))
    compile_and_compare(SOFTMAX_FORMS[form], x, kernels=1)
    report = minicomp.report()
    assert any(d.startswith("online softmax:") and "one looped program per row" in d for d in report.decisions)
    assert "reduction looped" in str(report.kernels[0])


def test_looped_online_softmax_trains(looped_rows):
    x = torch.randn(4, 20000) * 3
    x[1, :5000] += 1e4
    compare_gradients(lambda x: torch.softmax(x, -1) * 2, x)


def test_persistent_softmax_sum_of_a_middle_axis(looped_rows):
    # the rewrite for split's (patched) 256-element limit; 300 elements still fit the template's block
    x = torch.randn(2, 300, 3)
    x[0, :, 1] = float("-inf")
    compile_and_compare(lambda x: (torch.log_softmax(x, 1), torch.softmax(x, 1)), x)
    assert any(d.startswith("online softmax:") for d in minicomp.report().decisions)


@pytest.mark.slow
def test_long_softmax_rows_on_the_h200_loop_per_row_unless_few(monkeypatch):
    """Kernel IR for the H200 (nothing runs): many long rows take one looped program per row whose
    first loop reads x once for both statistics, the second normalizes (3 passes); 64 rows keep the
    split and its pipeline."""
    monkeypatch.undo()  # the real thresholds, not the fixture's
    for shape in ((32768, 32768), (4096, 393216)):
        for form in ("softmax", "x - logsumexp"):
            graph, kernels = _scheduled(SOFTMAX_FORMS[form], [torch.empty(shape)], H200)
            (k,) = kernels
            assert k.schedule.kind == "reduction looped" and k.numels == {"x": shape[0], "r": shape[1]}, str(k)
            first, second = k.phases
            assert sorted(r.fn for r in first.reductions) == ["max", "softmax_sum"]
            assert [s.buffer for s in first.inner if type(s).__name__ == "Load"] == ["in_ptr0"]
            assert k.bytes_moved == 2 * shape[0] * shape[1] * 4  # x and y once each: x is read twice
            assert any(d.startswith("online softmax:") for d in graph.decisions)
    graph, kernels = _scheduled(SOFTMAX_FORMS["softmax"], [torch.empty(64, 1048576)], H200)
    assert any(d.startswith("split:") and "online softmax in 128 chunks" in d for d in graph.decisions)
    assert any(d.startswith("pipelined:") for d in graph.decisions)


def test_short_rows_are_not_split():
    compile_and_compare(lambda x: torch.softmax(x, -1), torch.randn(4, 200), kernels=1)


@pytest.mark.parametrize("fn", [lambda x: x.sum(0), lambda x: x.amax(0), lambda x: x.amin(0),
                                lambda x: x.mean(0), lambda x: x.sum()])
def test_column_and_full_reductions_split_then_combined_in_one_launch(fn):
    x = torch.randn(1000, 5)  # 1000 rows: chunks with a padded tail
    compile_and_compare(fn, x, kernels=1)  # partial and combining kernels, one launch
    decisions = minicomp.report().decisions
    assert any("partial reductions" in d for d in decisions)
    assert any(d.startswith("one launch:") and d.endswith("1 group)") for d in decisions), decisions


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.int32, torch.bool])
def test_split_reductions_keep_the_accumulation_dtype(dtype):
    x = (torch.randn(777, 3) * 50).to(dtype)
    compile_and_compare(lambda x: (x.sum(0), x.amax(0)) if dtype != torch.bool else (x.any(0), x.all(0)), x)


def test_split_of_several_reduced_axes_and_a_transposed_input():
    x = torch.randn(600, 4, 5)
    compile_and_compare(lambda x: x.sum((0, 2)), x, kernels=1)
    compile_and_compare(lambda x: x.t().sum(1), torch.randn(3, 900))


def test_cast_of_a_split_result_joins_the_second_kernel():
    compile_and_compare(lambda x: x.sum(0), torch.randn(1000, 5, dtype=torch.bfloat16), kernels=1)  # not a third


ZERO_SIZE = {
    "softmax then column sum": lambda x: x.softmax(-1).sum(0) + x.sum(0),
    "row logsumexp then total": lambda x: x.sum(0) + x.logsumexp(-1).sum(),
    "split column and row reductions": lambda x: (x.sum(0), x.mean(-1), x.prod(0), x.var(0), x.sum(), x.any(0)),
    "row sums then their sum": lambda x: x.sum(-1).sum() + x.exp().sum(),
    "long-row softmax": lambda x: (x.softmax(-1), x.log_softmax(-1).sum(0)),
    "cumsum then sums": lambda x: (x.cumsum(0).sum(0), x.cumsum(-1).sum(-1)),
}


@pytest.mark.parametrize("shape", [(0, 5), (0, 1000), (1000, 0), (0, 0), (2, 0, 300), (0, 256)])
@pytest.mark.parametrize("name", ZERO_SIZE)
def test_zero_size_dims_reduce_like_eager(name, shape, request):
    if shape == (0, 256):  # with the GPU's column tiles: split-combine launches of several groups
        request.getfixturevalue("gpu_tiles")
    # a reduction over no rows writes its identity (x.sum(0) of a 0x5 is zeros) also where it is the
    # combining half of a split-combine launch, whose partial half then has no programs: it must
    # not wait for "the last of 0 partial programs" (before: left unwritten, NaN under poison)
    compile_and_compare(ZERO_SIZE[name], torch.randn(shape))


@pytest.fixture
def gpu_tiles(monkeypatch):
    """The GPU's column tiles (64 outputs per program) in the interpreter: several combine groups."""
    from minicomp.templates import reduction
    choose = reduction.reduction_schedule
    monkeypatch.setattr(reduction, "reduction_schedule", lambda g, target, layouts=None: choose(g, H200, layouts))


@pytest.mark.parametrize("dtype,fn", [(torch.float32, torch.sum), (torch.bfloat16, torch.sum),
                                      (torch.int32, torch.amax)])
def test_split_combine_in_groups_of_columns(gpu_tiles, dtype, fn):
    f = minicomp.compile(lambda x: fn(x, 0))
    for call in range(2):  # the counters carry over from one launch to the next
        x = (torch.randn(256, 128) * 50).to(dtype)
        x[call, 3] = 1000
        torch.testing.assert_close(f(x), fn(x, 0), atol=0.5 if dtype == torch.bfloat16 else 1e-3, rtol=1e-2)
    decisions = minicomp.report().decisions
    assert any(d.startswith("one launch:") and d.endswith("8 partial programs combines; 2 groups)")
               for d in decisions), decisions


def test_split_combine_refused_when_tiles_do_not_line_up(gpu_tiles):
    # 100 columns: the combining kernel's last 64-column tile is partial, outside what is proved
    compile_and_compare(lambda x: x.sum(0), torch.randn(256, 100), kernels=2)
    assert not any(d.startswith("one launch:") for d in minicomp.report().decisions)



# --- one-pass moments ----------------------------------------------------------------------------

# name -> (fn of x, weight, bias; x's shape; the weight's length). With the lowered thresholds (blocks of
# 256) each statistic spans several chunks, most with a padded last one: group norm's groups of 396,
# layer norm's rows of 300, batch norm's channels of 360 (chunked along H), instance norm's 323
MOMENT_NORMS = {
    "group_norm": (lambda x, w, b: F.group_norm(x, 2, w, b), (2, 8, 9, 11), 8),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (300,), w, b), (3, 300), 300),
    "batch_norm": (lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True), (4, 3, 9, 10), 3),
    "instance_norm": (lambda x, w, b: F.instance_norm(x, weight=w, bias=b), (2, 3, 17, 19), 3),
    "var_mean": (lambda x, w, b: torch.var_mean(x * w, -1), (3, 300), 300),
    "std": (lambda x, w, b: (x * w + b).std(1, correction=0), (3, 300), 300),
}


def _far_from_zero(shape, dtype):
    """Rows whose mean is large next to their spread: in fp32 1000 + randn, where a sum of squares
    minus the squared sum would keep none of the variance's digits (1e6 - 1e6); bf16 holds 1000 + randn
    only to within 4, so its rows sit at 8 + randn."""
    return ((1000.0 if dtype == torch.float32 else 8.0) + torch.randn(shape)).to(dtype)


def _one_pass(reports) -> bool:
    return any("moments over" in d and "one pass in" in d for r in reports for d in r.decisions)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MOMENT_NORMS))
def test_norm_statistics_in_one_pass(name):
    """Mean and variance from one read of x per chunk, the chunks combined with Chan's formula: the
    fp32 outputs and every input's gradient match eager's at 1000 + randn (to 1e-3: x's own ulp there,
    6e-5, puts eager's and minicomp's x - mean ~1e-4 from the exact one, times weights ~3)."""
    fn, shape, channels = MOMENT_NORMS[name]
    x, w, b = _far_from_zero(shape, torch.float32), torch.randn(channels) + 1, torch.randn(channels)
    tol = dict(atol=1e-3, rtol=1e-3)
    assert _one_pass([compile_and_compare(fn, x, w, b, **tol)])
    assert _one_pass(compare_gradients(fn, x, w, b, **tol))


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MOMENT_NORMS))
def test_bf16_norm_statistics_in_one_pass(name):
    """bf16 outputs and the gradients of x, weight and bias against the float64 results of the same
    values: each as close to them as eager's bf16 result is (twice its error), or within 2% of their
    largest value (eager's bf16 CPU batch and instance norm are ~0.03 from float64 at 8 + randn)."""
    fn, shape, channels = MOMENT_NORMS[name]
    dtype = torch.bfloat16
    args = [_far_from_zero(shape, dtype), torch.randn(channels, dtype=dtype) + 1, torch.randn(channels, dtype=dtype)]
    results = []
    before = minicomp.report()
    for f, cast in ((minicomp.compile(fn), dtype), (fn, dtype), (fn, torch.float64)):
        inputs = [a.detach().to(cast).requires_grad_() for a in args]  # leaves of their own: every .grad set
        out = pytree.tree_leaves(f(*inputs))
        gen = torch.Generator().manual_seed(1)
        sum((o.double() * torch.randn(o.shape, generator=gen, dtype=torch.float64)).sum() for o in out).backward()
        results.append([t if t is None else t.double() for t in out + [i.grad for i in inputs]])
    reports = minicomp.reports_since(before)
    assert _one_pass(reports)
    assert all(r.whole_graph_fallback is None for r in reports), [(r.graph, r.whole_graph_fallback) for r in reports]
    for k, (ours, eager, exact) in enumerate(zip(*results)):
        assert (ours is None) == (exact is None), k  # an input without a gradient in one and not the other
        if exact is not None:
            error, eager_error = ((t - exact).abs().max().item() for t in (ours, eager))
            assert error <= max(2 * eager_error, 2e-2 * exact.abs().max().item()), (k, error, eager_error)


@pytest.mark.slow
@pytest.mark.parametrize("shape", [(2, 8, 4, 4), (2, 8, 9, 11)])
def test_bf16_group_norm_backward_compiles(shape):
    """The backward of a bf16 GroupNorm with bf16 weights compiles (compare_gradients: no graph falls
    back whole) and its gradients are eager's. Its store-narrow had the weight's fp32 cast [C], once the
    first of two chains reading it was recomputed elsewhere, still counted as read by that chain's
    dropped node: the second chain was then recomputed from the cast as if the [N, G, n] reduction
    kernel stored it, which that kernel cannot."""
    fn, _, channels = MOMENT_NORMS["group_norm"]
    reports = compare_gradients(fn, *(torch.randn(s, dtype=torch.bfloat16) for s in (shape, channels, channels)))
    assert any(r.graph.endswith("_backward") for r in reports), [r.graph for r in reports]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_saved_statistics_of_chunked_norms_are_atens(dtype):
    """The mean and rstd the native ops return (their backward reads them), from chunked moments, in
    eager's dtypes (bf16 rows near 0: eager's bf16 statistics are rounded to bf16)."""
    aten = torch.ops.aten

    def rows(*shape):
        return _far_from_zero(shape, dtype) if dtype == torch.float32 else torch.randn(shape, dtype=dtype)
    x, w, b = rows(4, 8, 9, 11), torch.randn(8, dtype=dtype), torch.randn(8, dtype=dtype)
    tol = dict(atol=1e-3, rtol=1e-3) if dtype == torch.float32 else {}
    assert _one_pass([compile_and_compare(lambda x, w, b: aten.native_group_norm(x, w, b, 4, 8, 99, 2, 1e-5),
                                          x, w, b, **tol)])
    y, v = rows(3, 300), torch.randn(300, dtype=dtype)
    assert _one_pass([compile_and_compare(lambda y, v: aten.native_layer_norm(y, (300,), v, v, 1e-5), y, v, **tol)])
    assert _one_pass([compile_and_compare(
        lambda x, w, b: aten._native_batch_norm_legit.no_stats(x, w, b, True, 0.1, 1e-5), x, w, b, **tol)])
    if dtype == torch.float32:  # (bf16: the functional op's new running statistics come back fp32, as before)
        rm, rv = torch.randn(8), torch.rand(8) + 0.5
        assert _one_pass([compile_and_compare(
            lambda x, w, b, rm, rv: aten._native_batch_norm_legit_functional(x, w, b, rm, rv, True, 0.1, 1e-5),
            x, w, b, rm, rv, **tol)])


def test_chunked_moments_keep_nan_and_inf():
    x = torch.randn(4, 300)
    x[1, 7] = float("nan")
    x[2, 290] = float("inf")      # in the padded last chunk (eager's Welford mean of this row is nan, sum / n inf)
    x[3] = 5.0                    # no spread: variance 0, rstd 1/sqrt(eps)
    assert _one_pass([compile_and_compare(lambda x: (torch.var(x, -1), F.layer_norm(x, (300,))), x)])


def test_an_elementwise_reader_recomputes_a_transcendental_epilogue_instead_of_reading_it():
    """A GroupNorm after a sigmoid epilogue (issue 41's row 7), its statistics split on the H200: the
    statistics' kernel computes ``sigmoid(x * s + b)`` from ``x`` (``shared-prologue``), the
    normalisation recomputes it (per-channel parameters cost nothing per element), and no kernel
    stores it; results as eager's on the CPU."""
    gn = torch.nn.GroupNorm(2, 8)
    b, s = torch.randn(8, 1, 1), torch.randn(8, 1, 1)
    fn = lambda x: gn(torch.sigmoid(x * s + b))  # noqa: E731
    with torch.no_grad():  # (in training the sigmoid's result is saved for the backward: stored anyway)
        graph, _ = _scheduled(fn, [torch.empty(1, 8, 48, 48)], H200)
        compile_and_compare(fn, torch.randn(2, 8, 5, 7))
    recomputed = [d for d in graph.decisions if "recomputes" in d and "3 ops" in d]
    assert len(recomputed) == 1 and any(d.startswith("shared-prologue: the reductions") for d in graph.decisions)
    sigmoid = next(n for g in graph.groups for n in g.nodes if n.attrs.get("fn") == "sigmoid")
    assert not any(sigmoid in g.stores for g in graph.groups)


@pytest.mark.parametrize("nhwc", [True, False])
def test_batch_norm_backward_sums_share_one_chunked_kernel(nhwc):
    """A training batch norm + SiLU: its backward's two column sums (split in chunks) take the
    pointwise ops that feed them into one kernel (``shared-prologue``), the input gradient recomputes
    them, and the chunks' second steps are one kernel; values and every gradient as eager's."""
    x = torch.randn(8, 16, 6, 6)
    x = x.contiguous(memory_format=torch.channels_last) if nhwc else x
    w, b = torch.rand(16) + 0.5, torch.randn(16)

    def fn(x, w, b):
        y = F.batch_norm(x, None, None, w, b, training=True)
        return F.silu(y)
    reports = compare_gradients(fn, x, w, b, atol=1e-4, rtol=1e-4)
    backward = reports[-1]
    if nhwc:  # (NCHW rows of 288 values each fit one persistent block: one kernel, nothing split)
        assert any(d.startswith("split:") for d in backward.decisions)
        assert len(backward.kernels) <= 3, [k.name for k in backward.kernels]
        assert any(d.startswith("shared-prologue: the reductions") for d in backward.decisions)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32, torch.uint8])
def test_argmax_and_argmin_of_few_long_rows_split(dtype):
    """Chunks' max and first position, then the first chunk holding the row's max: ties across chunks,
    NaN (the largest, as eager has it), -inf rows, a padded last chunk, and a whole-tensor argmax."""
    x = (torch.randn(3, 1001) * 4).round().to(dtype)  # rounded: many ties, across chunks
    if dtype.is_floating_point:
        x[1, 700] = x[1, 900] = float("nan")
        x[2] = float("-inf")
    compile_and_compare(lambda x: (x.argmax(-1), x.argmin(-1), x.argmax(), torch.max(x, 1)), x)
    assert sum("first position" in d for d in minicomp.report().decisions) >= 3, minicomp.report().decisions


def test_argmax_of_long_rows_splits_on_the_h200_and_down_columns_does_not():
    for x, splits in ((torch.empty(64, 1 << 20), 1), (torch.empty(1 << 20), 1), (torch.empty(4, 1024, 1023), 0)):
        graph, _ = _scheduled(lambda x: x.argmax(-1 if x.dim() < 3 else 1), [x], H200)
        assert sum("first position" in d for d in graph.decisions) == splits, (x.shape, graph.decisions)


@pytest.mark.parametrize("nhwc", [False, True], ids=["nchw", "channels-last"])
def test_training_statistics_of_returned_activations_read_them_in_their_layout(nhwc):
    """A training forward returns its convolution's result (saved for the backward) in eager's strides,
    which the layout plan keeps: given NCHW images, the batch norm's statistics are one-pass moments
    over NCHW memory (they were split in two passes for channels-last memory that never came); given
    channels-last ones, the pooled split stays. Values and gradients as eager's."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
    x = torch.randn(4, 3, 16, 16)
    x = x.contiguous(memory_format=torch.channels_last) if nhwc else x
    params = [p.detach() for p in model.parameters()]

    def fn(x, *ps):
        return torch.func.functional_call(model, dict(zip([n for n, _ in model.named_parameters()], ps)), (x,))
    reports = compare_gradients(fn, x, *params, atol=1e-4, rtol=1e-4)
    one_pass = any("moments over 1024 elements -> one pass" in d for d in reports[0].decisions)
    assert one_pass != nhwc, reports[0].decisions
