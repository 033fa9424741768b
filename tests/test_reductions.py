"""Reductions and normalizations (softmax, layer norm, RMS norm), each compared with eager; views and data
movement are in test_views.py.

Every compiled function runs on fresh random inputs; ``compile_and_compare`` checks dtype, shape
and values (NaN where eager has NaN) and that nothing fell back to PyTorch.
"""

import re
import warnings

import pytest
import torch
import torch.nn.functional as F

import minicomp
from tests.utils import compile_and_compare

LOW = (torch.float16, torch.bfloat16)


def randint(*shape, low=-50, high=50, dtype=torch.int64):
    return torch.randint(low, high, shape, dtype=dtype)


# =============================================================================================
# 1. Reductions
# =============================================================================================

DIMS = [0, 1, 2, -1, -2, (0, 2), (-1, -3), (1, 2), (0, 1, 2)]


def test_a_long_float_sum_is_as_exact_as_eagers():
    """A sum of 8192 fp32 values with a large mean, in one block: its error against float64 at most
    3x eager's (Triton's interpreter applies a combine function element after element, 70x eager's
    error here, through its own combine function; Triton's ``_sum_combine`` goes to numpy's pairwise
    sum, a tree as on the GPU)."""
    import minicomp
    x = torch.randn(4, 8192, generator=torch.Generator().manual_seed(0)) * 2 + 3
    exact = x.double().sum(1)
    out = minicomp.compile(lambda t: t.sum(1))(x)
    error = ((out.double() - exact).abs() / exact.abs()).max().item()
    eager = ((x.sum(1).double() - exact).abs() / exact.abs()).max().item()
    assert error <= 3 * eager + 1e-9, (error, eager)


@pytest.mark.parametrize("dim", DIMS, ids=str)
def test_sum_mean_amax_amin_over_dims(dim):
    def fn(x):
        return (x.sum(dim), x.sum(dim, keepdim=True), x.mean(dim), x.mean(dim, keepdim=True),
                x.amax(dim), x.amin(dim, keepdim=True), torch.amin(x, dim), torch.amax(x, dim, True))
    compile_and_compare(fn, torch.randn(4, 6, 8))


def test_reductions_over_non_adjacent_dims_of_4d():
    def fn(x):
        return (x.sum((0, 2)), x.amax((1, 3)), x.mean((0, 3), keepdim=True), x.var((1, 2)), x.amin((-4, -1)),
                x.any((0, 2)), x.sum((-3, -1), keepdim=True))
    compile_and_compare(fn, torch.randn(3, 4, 5, 6))


def test_sum_mean_amax_amin_over_all_axes():
    def fn(x):
        return (x.sum(), x.mean(), x.amax(), x.amin(), x.sum(dim=(0, 1, 2), keepdim=True),
                x.mean((-1, 0, 1), keepdim=True), x.amax((0, 1, 2), keepdim=True), torch.sum(x) * 2)
    compile_and_compare(fn, torch.randn(3, 5, 7))


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_max_min_with_dim_values_and_indices(dim):
    def fn(x):
        mx, imx = x.max(dim)
        mn, imn = x.min(dim)
        mxk, imxk = torch.max(x, dim, keepdim=True)
        mnk, imnk = torch.min(x, dim, keepdim=True)
        return mx, imx, mn, imn, mxk, imxk, mnk, imnk
    compile_and_compare(fn, torch.randn(5, 7, 6))


def test_max_min_over_all_elements():
    compile_and_compare(lambda x: (x.max(), x.min(), torch.max(x) - torch.min(x)), torch.randn(6, 9))
    compile_and_compare(lambda x: (x.max(), x.min()), randint(6, 9, dtype=torch.int32))


def test_argmax_argmin_with_and_without_dim():
    def fn(x):
        return (x.argmax(), x.argmin(), x.argmax(1), x.argmin(0), x.argmax(-1, keepdim=True),
                x.argmin(-2, keepdim=True), x.argmax(keepdim=True), torch.argmin(x, dim=None, keepdim=True),
                x.argmax(2), x.argmin(-3))
    compile_and_compare(fn, torch.randn(4, 7, 5))


def test_argmax_argmin_feeding_gather():
    # the indices are used inside the graph too, to pick the extremal values
    def fn(x):
        i = x.argmax(1)
        j = x.argmin(0, keepdim=True)
        return i, j, x.gather(1, i.unsqueeze(1)).squeeze(1) - x.amax(1), x.gather(0, j) - x.amin(0), x.argmax()
    compile_and_compare(fn, torch.randn(9, 13))  # gather is an indirect load (frontend/rules_index.py)


def test_prod():
    def fn(x):
        return x.prod(), x.prod(1), x.prod(-1, keepdim=True), x.prod(0), torch.prod(x, 0, keepdim=True)
    compile_and_compare(fn, torch.rand(6, 8) + 0.5)
    compile_and_compare(lambda x: (x.prod(1), x.prod()), randint(3, 5, low=-3, high=4))
    compile_and_compare(lambda x: (x.prod(1), x.prod()), randint(3, 5, low=1, high=4, dtype=torch.int32))


@pytest.mark.parametrize("correction", [None, 0, 1])
def test_var_std_corrections(correction):
    kw = {} if correction is None else dict(correction=correction)

    def fn(x):
        return (torch.var(x, 1, **kw), torch.std(x, 1, **kw), torch.var(x, (0, 2), keepdim=True, **kw),
                torch.std(x, -1, keepdim=True, **kw), torch.var(x, **kw), torch.std(x, **kw),
                torch.var(x, (-1, -3), **kw))
    compile_and_compare(fn, torch.randn(4, 6, 8) * 3 + 1)


def test_var_std_unbiased_default_and_flag():
    def fn(x):
        return (x.var(), x.std(), x.var(0), x.std(1), x.var(1, unbiased=False), x.std(0, unbiased=True),
                x.var(unbiased=False))
    compile_and_compare(fn, torch.randn(7, 9) + 2)


def test_var_mean():
    def fn(x):
        v, m = torch.var_mean(x, 1)
        v0, m0 = torch.var_mean(x, (0, 2), correction=0, keepdim=True)
        va, ma = torch.var_mean(x)
        return v, m, v0, m0, va, ma
    compile_and_compare(fn, torch.randn(5, 6, 7) * 2 - 1)


@pytest.mark.parametrize("dtype", [torch.bool, torch.float32, torch.int32], ids=str)
def test_any_all(dtype):
    def fn(x):
        return (x.any(), x.all(), x.any(1), x.all(0), x.any(-1, keepdim=True), x.all(2, keepdim=True),
                torch.any(x, (0, 2)), torch.all(x, (1, 2), keepdim=True))
    if dtype == torch.bool:
        x = torch.rand(4, 5, 6) > 0.3
        x[0] = True        # a slice that is all True
        x[1, :, 0] = False
        x[2] = False       # a slice that is all False
    elif dtype == torch.float32:
        x = torch.randn(4, 5, 6)
        x[x.abs() < 0.5] = 0.0
        x[0] = 1.5
        x[3] = 0.0
        x[1, 2, 3] = float("nan")  # NaN is truthy
    else:
        x = randint(4, 5, 6, low=-1, high=2, dtype=torch.int32)
        x[0] = 7
        x[3] = 0
    compile_and_compare(fn, x)


# --- dtypes ------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", LOW, ids=str)
def test_low_precision_reductions(dtype):
    def fn(x):
        return (x.sum(-1), x.mean(0), x.sum(), x.mean(), x.amax(1), x.amin(0), x.argmax(1),
                x.max(0)[0], x.max(0)[1], x.sum((0, 1), keepdim=True))
    compile_and_compare(fn, torch.randn(8, 40, dtype=dtype))


@pytest.mark.parametrize("dtype", LOW, ids=str)
def test_low_precision_sum_mean_accumulate_in_fp32(dtype):
    # Multiples of 1/64 below 1: every fp32 partial sum is exact, so eager (fp32 accumulation,
    # one rounding at the end) is matched bit for bit only if the kernel accumulates in fp32 too;
    # partial sums kept in fp16/bf16 would lose bits.
    x = (torch.randint(1, 64, (3, 2048)) / 64).to(dtype)
    compile_and_compare(lambda x: (x.sum(1), x.mean(1), x.sum(-1, keepdim=True), x.sum()), x, atol=0, rtol=0)
    compile_and_compare(lambda x: (x.sum(0), x.mean(0)), x[:, :512].t().contiguous(), atol=0, rtol=0)


def test_fp16_mean_does_not_overflow():
    # the fp16 sum of these rows (~120000) overflows, their mean (~60) does not
    x = (torch.rand(2, 2000) * 8 + 56).half()
    compile_and_compare(lambda x: (x.mean(1), x.mean(), x.sum(1)), x)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64], ids=str)
def test_integer_reductions(dtype):
    def fn(x):
        return (x.sum(1), x.sum(), x.sum((0, 2), keepdim=True), x.amax(0), x.amin(-1), x.amax(),
                x.max(), x.min(), x.argmax(1), x.argmin(), x.max(2)[0], x.max(2)[1], x.min(0)[1])
    compile_and_compare(fn, randint(4, 6, 5, low=-1000, high=1000, dtype=dtype))


def test_integer_sum_promotes_to_int64_without_overflow():
    x = torch.randint(2**30, 2**31 - 1, (3, 8), dtype=torch.int32)
    compile_and_compare(lambda x: (x.sum(1), x.sum()), x)


def test_bool_reductions():
    def fn(b):
        return b.sum(), b.sum(1), b.sum(0, keepdim=True), b.any(), b.all(1), b.amax(1), b.amin(0)
    b = torch.rand(6, 9) > 0.5
    b[0] = True
    b[:, 2] = False
    compile_and_compare(fn, b)


def test_reduction_dtype_argument():
    def fn(i, h):
        return (i.sum(1, dtype=torch.float32), i.mean(0, dtype=torch.float32), h.sum(dtype=torch.float32),
                h.mean(1, dtype=torch.float32), i.prod(1, dtype=torch.float64), h.sum(0, dtype=torch.float64))
    compile_and_compare(fn, randint(5, 7, dtype=torch.int32), torch.randn(5, 7, dtype=torch.float16))


def test_small_int_sum_and_mean_of_cast():
    compile_and_compare(lambda x: (x.sum(1), x.float().mean(1), x.to(torch.int32).sum(0)),
                        randint(5, 9, low=-100, high=100, dtype=torch.int8))


# --- special values and shapes -----------------------------------------------------------------

def _with_nans():
    x = torch.randn(6, 10)
    x[1, 3] = float("nan")
    x[4, 0] = float("nan")
    x[4, 7] = float("nan")
    x[5, 9] = float("nan")
    return x


def test_nan_propagates_through_max_min_and_arg():
    def fn(x):
        mx, imx = x.max(1)
        mn, imn = x.min(1)
        return (x.amax(1), x.amin(1), x.argmax(1), x.argmin(1), mx, imx, mn, imn, x.amax(0), x.argmax(0),
                x.max(), x.min(), x.amax(), x.argmax(), x.argmin(), x.sum(1), x.mean(0))
    compile_and_compare(fn, _with_nans())


def test_nan_in_softmax_row_and_inf():
    x = _with_nans()
    x[2, 5] = float("inf")
    x[3, 1] = float("-inf")
    compile_and_compare(lambda x: (x.amax(1), x.amin(1), x.argmax(1), x.argmin(1), x.softmax(-1)), x)


def test_argmax_ties_take_first_index():
    def fn(x):
        return (x.argmax(1), x.argmin(1), x.argmax(0), x.argmin(0), x.max(1)[1], x.min(1)[1],
                x.max(0)[1], x.argmax(), x.argmin(), x.argmax(1, keepdim=True))
    x = torch.randint(0, 3, (8, 16)).float() + 0.5
    x[0] = 2.5  # a row that is all one value
    compile_and_compare(fn, x)
    compile_and_compare(fn, torch.randint(0, 3, (8, 16), dtype=torch.int32))


# Rows longer than 2**14 elements take the looped reduction (several RBLOCK-wide steps); the
# Triton interpreter is slow on them, so few rows and few reductions per test.
LONG = 17000


def test_argmax_ties_across_the_blocks_of_a_looped_row(monkeypatch):
    """The looped reduction carries each row's best value and its first position from block to block
    (4096 elements a block in the interpreter): ties in two blocks, a minimum in the last, partial block
    after an equal one. (Rows this long in few rows are split instead: test_split_reductions.)"""
    from minicomp.templates import reduction
    monkeypatch.setattr(reduction, "persistent_limit", lambda target: 8)
    x = torch.rand(2, 5000)
    x[0, 4500] = x[0, 100] = 5.0
    x[1, 4999] = x[1, 4200] = -3.0
    x[1, 4998] = 2.0
    report = compile_and_compare(lambda x: (x.argmax(1), x.argmin(1)), x)
    assert [k.template for k in report.kernels] == ["reduction looped"], report.summary()


def test_size_one_reduced_dims():
    def fn(x):
        return (x.sum(1), x.amax(1), x.argmax(1), x.max(1)[0], x.max(1)[1], x.mean(1), x.prod(1),
                x.var(1, correction=0), x.sum((1, 3)), x.amin(-1, keepdim=True), x.any(1))
    compile_and_compare(fn, torch.randn(4, 1, 5, 1))
    compile_and_compare(lambda y: (y.sum(0), y.argmin(0), y.mean(0, keepdim=True)), torch.randn(1, 6))


def test_var_with_too_few_elements_is_nan_like_eager():
    # correction 1 over a single element divides 0 by 0: eager gives NaN
    compile_and_compare(lambda x: (x.var(1), x.std(1)), torch.randn(4, 1, 5))


def test_zero_size_non_reduced_dim():
    def fn(x):
        return x.sum(1), x.amax(1), x.mean(1, keepdim=True), x.argmax(1), x.any(1), x.prod(1)
    compile_and_compare(fn, torch.randn(0, 5))
    compile_and_compare(lambda x: (x.sum(-1), x.softmax(-1)), torch.randn(3, 0, 4))


def test_zero_size_reduced_dim():
    def fn(x):
        return (x.sum(1), x.prod(1), x.any(1), x.all(1), x.sum(), x.prod(), x.sum(0), x.mean(1),
                x.sum(1, keepdim=True))
    compile_and_compare(fn, torch.randn(3, 0))


@pytest.mark.parametrize("fn", [lambda x: x.max(), lambda x: x.min(), lambda x: x.max(-1)[0] + 1,
                                lambda x: x.min(-1)[1]])
def test_max_min_over_no_elements_raise_like_eager(fn):
    # no identity: eager raises (Dynamo's meta kernels do not); the op runs in PyTorch to raise it, and
    # eager's error is the caller's: no fallback warning
    x = torch.randn(3, 0)
    with pytest.raises(Exception) as eager:
        fn(x)
    with pytest.raises(type(eager.value), match=re.escape(str(eager.value))), warnings.catch_warnings():
        warnings.simplefilter("error")
        minicomp.compile(fn)(x)
    compile_and_compare(lambda y: (y.max(-1), y.min(-1)[0]), torch.randn(0, 3))  # no empty reduced dim


def test_zero_size_reduced_dim_int():
    fn = lambda x: (x.sum(1), x.prod(1), x.sum())  # noqa: E731
    compile_and_compare(fn, torch.randint(1, 5, (4, 0), dtype=torch.int32))


def test_zero_dim_input():
    def fn(x):
        mx, imx = x.max(0)
        return (x.sum(), x.mean(), x.amax(), x.amin(), x.max(), x.argmax(), x.argmin(), x.sum(0),
                x.sum(-1, keepdim=True), mx, imx, x.prod(), x.any(), x.var(correction=0),
                x.argmax(0, keepdim=True), x.softmax(0))
    compile_and_compare(fn, torch.randn(()) + 3)
    compile_and_compare(lambda x: (x.sum(), x.amax(), x.max()), torch.tensor(-7, dtype=torch.int32))


@pytest.mark.slow
def test_long_rows_looped_reduction():
    x = torch.rand(2, LONG) * 4 - 1
    compile_and_compare(lambda x: (x.sum(1), x.amax(1), x.amin(-1), x.mean(1, keepdim=True) + x), x)


def test_long_rows_var():
    compile_and_compare(lambda x: x.var(1), torch.rand(2, LONG) * 4 - 1)


@pytest.mark.slow
def test_long_rows_softmax():
    x = torch.randn(2, LONG) * 4
    # softmax values are tiny: compare relatively so a wrong normalizer cannot pass
    compile_and_compare(lambda x: (x.softmax(-1), x.log_softmax(-1)), x, atol=1e-9, rtol=1e-4)


@pytest.mark.slow
def test_long_rows_sum_of_ints():
    compile_and_compare(lambda x: (x.sum(1), x.amax(1)), randint(2, LONG, low=-1000, high=1000, dtype=torch.int32))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", LOW, ids=str)
def test_long_rows_low_precision(dtype):
    compile_and_compare(lambda x: (x.amax(1), x.sum(1)), torch.randn(2, LONG, dtype=dtype))


_HEAD = (2, 3, 37)  # batch, tokens, words


def _head_backward(logp, g, tangent):
    """log-softmax's gradient over [B*T, V] rows plus the logits' own [B, T, V] gradient."""
    grad = g - torch.exp(logp) * g.sum(1, keepdim=True)
    return tangent + grad.view(*_HEAD)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_a_row_reduction_stores_its_space_reshaped(dtype):
    """A language model head's cross-entropy backward: log-softmax's gradient over [B*T, V] rows plus the
    logits' own [B, T, V] gradient (autograd's zeros when only the loss is differentiated; random here):
    one kernel, the [B, T, V] sum stored per element as the reshape of the rows it is (it was a second
    pass over the logits: BERT's MLM head)."""
    b, t, v = _HEAD
    logp = torch.randn(b * t, v).log_softmax(1).to(dtype)
    compile_and_compare(_head_backward, logp, torch.randn(b * t, v, dtype=dtype), torch.randn(b, t, v, dtype=dtype),
                        kernels=1)
    tangent = torch.randn(v, t, b, dtype=dtype).permute(2, 1, 0)  # non-contiguous
    compile_and_compare(_head_backward, logp, torch.randn(b * t, v, dtype=dtype), tangent, kernels=1)


def test_a_looped_row_reduction_stores_its_space_reshaped(monkeypatch):
    """As above with rows longer than a block (the GPU's 30522-word rows): the reshaped result is
    stored in the loop's second pass, block by block."""
    from minicomp.templates import reduction
    monkeypatch.setattr(reduction, "persistent_limit", lambda target: 8)
    b, t, v = _HEAD
    report = compile_and_compare(_head_backward, torch.randn(b * t, v).log_softmax(1), torch.randn(b * t, v),
                                 torch.randn(b, t, v), kernels=1)
    assert report.kernels[0].template == "reduction looped"


def test_a_reshape_that_mixes_the_reduced_axis_with_the_rows_is_its_own_kernel():
    """A row reduction's kernel stores a reshape of its space only where the rows are regrouped and the
    reduced axis kept whole: ``[6, 8]`` seen as ``[8, 6]`` is not (a value would be computed at two
    positions of the space), and is still right."""
    def fn(x, y):
        return (x - x.amax(1, keepdim=True)).reshape(8, 6) * y

    compile_and_compare(fn, torch.randn(6, 8), torch.randn(8, 6), kernels=2)


def test_column_reductions():
    def fn(x):
        return (x.sum(0), x.amax(0), x.argmax(0), x.mean(0), x.sum(0, keepdim=True), x.var(0), x.amin(0),
                x.min(0)[1])
    compile_and_compare(fn, torch.randn(70, 9))
    compile_and_compare(lambda x: (x.sum(0), x.prod(0)), torch.rand(70, 9) * 0.2 + 0.95)
    compile_and_compare(lambda x: (x.sum(0), x.amax(0)), torch.randn(600, 3))


def test_reductions_of_non_contiguous_inputs():
    def fn(x):
        return x.sum(1), x.amax(0), x.argmax(1), x.mean(), x.softmax(-1), x.var(0)
    compile_and_compare(fn, torch.randn(12, 8).t())                 # transposed
    compile_and_compare(fn, torch.randn(6, 21)[:, ::3])             # strided slice
    compile_and_compare(fn, torch.randn(10, 9)[2:8, 1:])            # storage offset
    compile_and_compare(fn, torch.randn(1, 7).expand(5, 7))         # zero stride
    compile_and_compare(lambda x: (x.sum((0, 2)), x.amax(1), x.argmin(2)), torch.randn(5, 7, 9).permute(2, 0, 1))


def test_reductions_of_non_contiguous_intermediates():
    def fn(x):
        y = x * 2
        return y.t().sum(1), y.t().argmax(0), y[:, ::2].amax(1), y.flip(1).argmax(1), y.t().softmax(0)
    compile_and_compare(fn, torch.randn(6, 10))


# =============================================================================================
# 3. Softmax and normalizations
# =============================================================================================

@pytest.mark.parametrize("dim", [-1, 0])
def test_softmax_log_softmax(dim):
    def fn(x):
        return x.softmax(dim), x.log_softmax(dim), F.softmax(x * 3, dim=dim)
    compile_and_compare(fn, torch.randn(7, 33) * 2)
    compile_and_compare(lambda x: (x.softmax(dim), x.log_softmax(dim)), torch.randn(6, 20, dtype=torch.bfloat16))
    compile_and_compare(lambda x: (x.softmax(dim), F.softmax(x, dim=dim, dtype=torch.float32)),
                        torch.randn(6, 20, dtype=torch.float16))


def test_softmax_3d_middle_dim():
    compile_and_compare(lambda x: (x.softmax(1), x.log_softmax(-2)), torch.randn(3, 9, 5))


@pytest.mark.parametrize("shape", [(20,), (4, 20)], ids=str)
def test_layer_norm(shape):
    x = torch.randn(3, 4, 20) * 2 + 1
    w, b = torch.randn(shape), torch.randn(shape)
    compile_and_compare(lambda x, w, b: (F.layer_norm(x, shape, w, b), F.layer_norm(x, shape),
                                         F.layer_norm(x, shape, w), F.layer_norm(x, shape, None, b, eps=1e-3)),
                        x, w, b)


def test_layer_norm_module_bf16():
    ln = torch.nn.LayerNorm(16, dtype=torch.bfloat16)
    with torch.no_grad():
        ln.weight.copy_(torch.randn(16))
        ln.bias.copy_(torch.randn(16))
    compile_and_compare(lambda x: ln(x), torch.randn(5, 16, dtype=torch.bfloat16))


def _rms_norm(x, w):
    return (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_rms_norm(dtype):
    compile_and_compare(_rms_norm, torch.randn(4, 7, 32, dtype=dtype), torch.randn(32, dtype=dtype))


def test_normalize_by_row_sum():
    compile_and_compare(lambda x: x / x.sum(-1, keepdim=True), torch.rand(6, 17) + 0.1)
    compile_and_compare(lambda x: x / x.sum(0, keepdim=True), torch.rand(6, 17) + 0.1)
    compile_and_compare(lambda x: x / x.sum(-1, keepdim=True), (torch.rand(6, 17) + 0.1).half())


def test_index_dtype_follows_what_the_index_arithmetic_reaches(monkeypatch):
    """int64 only where a buffer, an iteration variable or an index expression passes half the int32
    range (here lowered to 4096), not where the iteration space does: avg_pool1d's windows (4 x 1001
    outputs x 8 taps) stay int32 (int64 division measured 4x slower on the H200), a 5000-element
    buffer does not."""
    from minicomp.templates import emitter
    from tests.test_target import _scheduled
    from tests.utils import H200
    monkeypatch.setattr(emitter, "INT32_LIMIT", 2**13 - 1)
    pool = lambda x: F.avg_pool1d(x, 8, 1, 4)  # noqa: E731
    for shape, dtype in (((1, 4, 1000), "int32"), ((1, 5, 1000), "int64")):
        _, kernels = _scheduled(pool, [torch.randn(shape)], H200)
        assert [k.schedule.index_dtype for k in kernels] == [dtype], (shape, [str(k.schedule) for k in kernels])
        compile_and_compare(pool, torch.randn(shape))
