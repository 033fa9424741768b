"""Matrix products (mm, addmm, bmm, baddbmm, matmul, linear) and the fusions around them.

Every compiled function runs on fresh random inputs and is compared with eager by
``compile_and_compare`` (dtype, shape, values, NaN). GEMMs become one ``matmul`` IR node plus
epilogue pointwise ops, accumulated in fp32; on CPU the generated Triton kernels run in Triton's
interpreter, so shapes stay small.
"""
import math
import re
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import minicomp
from tests.utils import compile_and_compare

LOW = (torch.float16, torch.bfloat16)
FLOATS = (torch.float32, torch.float16, torch.bfloat16)
DTYPE_IDS = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}


def rand(*shape, dtype=torch.float32):
    """Random values; low precision inputs are scaled by 1/8 to keep products small."""
    x = torch.randn(shape, dtype=torch.float32)
    if dtype in LOW:
        x = x / 8
    return x.to(dtype)


def rand_t(rows, cols, dtype=torch.float32):
    """A [rows, cols] operand that is a real transposed (column-major) view of a [cols, rows] tensor."""
    x = rand(cols, rows, dtype=dtype).t()
    assert x.shape == (rows, cols) and x.stride() == (1, rows)
    return x


def tol(dtype, k=32):
    """GEMM tolerances: fp32 close to exact, fp16/bf16 about ~3e-2 scaled with the reduction length."""
    if dtype in LOW:
        t = 3e-2 * max(1.0, math.sqrt(k / 32))
        return dict(atol=t, rtol=t)
    return dict(atol=1e-4, rtol=1e-4)


def gemm_kernels(report):
    return [k for k in report.kernels if re.match(r"k\d+_mm", k.name)]


def assert_one_gemm_kernel(report):
    assert len(report.kernels) == 1, report.summary()
    assert report.kernels[0].name.startswith("k0_mm"), report.summary()
    assert report.kernels[0].template.startswith("gemm"), report.summary()


# =============================================================================================
# 1. Transposes: mm with every operand layout, and F.linear
# =============================================================================================

@pytest.mark.parametrize("ta", [False, True], ids=["a", "aT"])
@pytest.mark.parametrize("tb", [False, True], ids=["b", "bT"])
def test_mm_transpose_combinations(ta, tb):
    m, k, n = 19, 37, 23
    a = rand_t(m, k) if ta else rand(m, k)
    b = rand_t(k, n) if tb else rand(k, n)
    r = compile_and_compare(lambda a, b: a @ b, a, b, kernels=1, **tol(torch.float32))
    assert_one_gemm_kernel(r)


@pytest.mark.parametrize("ta", [False, True], ids=["a", "aT"])
@pytest.mark.parametrize("tb", [False, True], ids=["b", "bT"])
def test_mm_transposed_inside_the_function(ta, tb):
    """The transpose is taken inside the compiled graph (a view op, not a strided input)."""
    m, k, n = 18, 29, 21
    a = rand(k, m) if ta else rand(m, k)
    b = rand(n, k) if tb else rand(k, n)

    def fn(a, b):
        return (a.t() if ta else a) @ (b.t() if tb else b)
    compile_and_compare(fn, a, b, kernels=1, **tol(torch.float32))


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("x_shape", [(13, 40), (2, 7, 40)], ids=["2d", "3d"])
def test_linear(bias, x_shape):
    x, w = rand(*x_shape), rand(24, 40)  # weight is [N, K]
    args = (x, w, rand(24)) if bias else (x, w)
    r = compile_and_compare(lambda *a: F.linear(*a), *args, kernels=1, **tol(torch.float32))
    assert_one_gemm_kernel(r)


def test_linear_with_transposed_weight_view():
    """The weight itself is stored transposed ([K, N] memory seen as [N, K]): two transposes cancel."""
    x, w, b = rand(11, 33), rand_t(20, 33), rand(20)
    compile_and_compare(lambda x, w, b: F.linear(x, w, b), x, w, b, kernels=1, **tol(torch.float32))


# =============================================================================================
# 2. Batching, broadcasting, addmm / baddbmm coefficients
# =============================================================================================

def test_bmm():
    a, b = rand(3, 17, 24), rand(3, 24, 9)
    r = compile_and_compare(lambda a, b: torch.bmm(a, b), a, b, kernels=1, **tol(torch.float32))
    assert_one_gemm_kernel(r)


def test_bmm_transposed_operands():
    a = rand(3, 24, 17).transpose(1, 2)
    b = rand(3, 9, 24).transpose(1, 2)
    compile_and_compare(lambda a, b: torch.bmm(a, b), a, b, kernels=1, **tol(torch.float32))


@pytest.mark.parametrize("beta,alpha", [(0.5, 1.5), (1, -2.0), (0, 0.75)], ids=str)
def test_baddbmm(beta, alpha):
    c, a, b = rand(3, 17, 9), rand(3, 17, 24), rand(3, 24, 9)
    r = compile_and_compare(lambda c, a, b: torch.baddbmm(c, a, b, beta=beta, alpha=alpha), c, a, b,
                            kernels=1, **tol(torch.float32))
    assert_one_gemm_kernel(r)


@pytest.mark.parametrize("bias_shape", [(9,), (17, 9), (17, 1), (1, 9)], ids=str)
@pytest.mark.parametrize("beta,alpha", [(0.5, 2), (1, 1), (0, 2)], ids=str)
def test_addmm(beta, alpha, bias_shape):
    bias, a, b = rand(*bias_shape), rand(17, 24), rand(24, 9)
    r = compile_and_compare(lambda c, a, b: torch.addmm(c, a, b, beta=beta, alpha=alpha), bias, a, b,
                            kernels=1, **tol(torch.float32))
    assert_one_gemm_kernel(r)


def test_addmm_beta_zero_ignores_nan_bias():
    """beta=0: the bias is not read at all, so NaN/inf in it must not reach the result (as eager)."""
    bias = torch.full((17, 9), float("nan"))
    bias[0, 0] = float("inf")
    a, b = rand(17, 24), rand(24, 9)
    compile_and_compare(lambda c, a, b: torch.addmm(c, a, b, beta=0, alpha=2), bias, a, b,
                        kernels=1, **tol(torch.float32))


# (a shape, b shape, whether a GEMM kernel is expected): matrix-vector products (aten.mv, dot) are
# decomposed by core ATen into mul + sum, so they become one reduction kernel instead.
MATMUL_SHAPES = {
    "BMK@KN": ((3, 17, 24), (24, 9), True),
    "K@KN": ((24,), (24, 9), True),
    "MK@K": ((17, 24), (24,), False),
    "K@K": ((24,), (24,), False),
    "BMK@BKN": ((3, 17, 24), (3, 24, 9), True),
    "2x1MK@3KN-broadcast": ((2, 1, 17, 24), (3, 24, 9), True),
    "BMK@K": ((3, 17, 24), (24,), None),
    "K@BKN": ((24,), (3, 24, 9), None),
}


@pytest.mark.parametrize("shapes", MATMUL_SHAPES.values(), ids=MATMUL_SHAPES.keys())
def test_torch_matmul_shapes(shapes):
    a_shape, b_shape, gemm = shapes
    a, b = rand(*a_shape), rand(*b_shape)
    r = compile_and_compare(lambda a, b: torch.matmul(a, b), a, b, **tol(torch.float32))
    if gemm is not None:
        assert len(gemm_kernels(r)) == int(gemm), r.summary()


@pytest.mark.parametrize("which", ["a", "b"])
def test_batched_matmul_with_expanded_input(which):
    """One operand is a stride-0 expansion of a single matrix, passed in as such."""
    if which == "a":
        a, b = rand(1, 17, 24).expand(3, 17, 24), rand(3, 24, 9)
    else:
        a, b = rand(3, 17, 24), rand(1, 24, 9).expand(3, 24, 9)
    assert 0 in (a.stride(0), b.stride(0))
    r = compile_and_compare(lambda a, b: torch.matmul(a, b), a, b, **tol(torch.float32))
    assert len(gemm_kernels(r)) == 1, r.summary()


def test_batched_matmul_expanded_inside_the_function():
    a, b = rand(1, 17, 24), rand(3, 24, 9)
    r = compile_and_compare(lambda a, b: a.expand(3, 17, 24) @ b, a, b, **tol(torch.float32))
    assert len(gemm_kernels(r)) == 1, r.summary()


# =============================================================================================
# 3. Odd and degenerate sizes
# =============================================================================================

ODD_MNK = [(1, 1, 1), (17, 17, 1), (127, 1, 1), (1, 127, 17), (127, 17, 127), (17, 127, 17),
           (1, 1, 127), (127, 127, 17), (17, 1, 127)]


@pytest.mark.parametrize("m,n,k", ODD_MNK, ids=lambda v: str(v))
def test_odd_sizes(m, n, k):
    bias, a, b = rand(n), rand(m, k), rand(k, n)
    r = compile_and_compare(lambda c, a, b: (a @ b, torch.addmm(c, a, b)), bias, a, b,
                            **tol(torch.float32))
    assert len(gemm_kernels(r)) == len(r.kernels) >= 1, r.summary()


def test_operands_constant_along_k():
    """Both operands are broadcast along K (stride 0): every K lane reads the same element, and only
    K of them (not the whole K block) may be summed."""
    x, y = rand(9, 1), rand(1, 6)
    compile_and_compare(lambda x, y: x.expand(9, 17) @ y.expand(17, 6), x, y, **tol(torch.float32))


def test_empty_k_gives_zeros():
    a, b, bias = rand(4, 0), rand(0, 3), rand(3)

    def fn(a, b, bias):
        return a @ b, torch.addmm(bias, a, b, beta=0.5), torch.addmm(bias, a, b)
    compile_and_compare(fn, a, b, bias)


def test_empty_m():
    a, b = rand(0, 8), rand(8, 5)
    compile_and_compare(lambda a, b: (a @ b).relu(), a, b)


def test_empty_batch_k():
    a, b = rand(2, 5, 0), rand(2, 0, 4)
    compile_and_compare(lambda a, b: torch.bmm(a, b) + 1, a, b)


# =============================================================================================
# 4. dtypes
# =============================================================================================

@pytest.mark.parametrize("dtype", FLOATS, ids=DTYPE_IDS.get)
def test_mm_addmm_bmm_dtypes(dtype):
    a, b, c = rand(19, 70, dtype=dtype), rand(70, 13, dtype=dtype), rand(13, dtype=dtype)
    ba, bb = rand(2, 19, 70, dtype=dtype), rand(2, 70, 13, dtype=dtype)
    compile_and_compare(lambda a, b: a @ b, a, b, kernels=1, **tol(dtype, 70))
    compile_and_compare(lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=2), c, a, b,
                        kernels=1, **tol(dtype, 70))
    compile_and_compare(lambda a, b: torch.bmm(a, b), ba, bb, kernels=1, **tol(dtype, 70))


@pytest.mark.parametrize("dtype", LOW, ids=DTYPE_IDS.get)
@pytest.mark.parametrize("tb", [False, True], ids=["b", "bT"])
def test_low_precision_transposed_linear(dtype, tb):
    x = rand(16, 48, dtype=dtype)
    w = rand_t(20, 48, dtype=dtype) if tb else rand(20, 48, dtype=dtype)
    b = rand(20, dtype=dtype)
    compile_and_compare(lambda x, w, b: F.linear(x, w, b), x, w, b, kernels=1, **tol(dtype, 48))


@pytest.mark.parametrize("dtype", LOW, ids=DTYPE_IDS.get)
def test_low_precision_rounds_once_from_fp32_accumulator(dtype):
    """big + 126 * 1 is exact in fp32 and representable in fp16/bf16, but an fp16/bf16 accumulator
    would stay at ``big`` (each +1 is a tie that rounds back to the even ``big``)."""
    k = 127
    big = 2048.0 if dtype == torch.float16 else 256.0
    a = torch.ones(4, k, dtype=dtype)
    b = torch.ones(k, 3, dtype=dtype)
    b[0] = big
    out = minicomp.compile(lambda a, b: a @ b)(a, b)
    expected = torch.full((4, 3), big + k - 1, dtype=dtype)
    assert out.dtype == dtype
    torch.testing.assert_close(out, expected, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.int64, torch.int32], ids=str)
def test_unsupported_dtypes_fall_back_correctly(dtype):
    if dtype.is_floating_point:
        a, b, c = torch.randn(9, 14, dtype=dtype), torch.randn(14, 6, dtype=dtype), torch.randn(6, dtype=dtype)
    else:
        a, b, c = (torch.randint(-9, 9, s, dtype=dtype) for s in ((9, 14), (14, 6), (6,)))
    r = compile_and_compare(lambda a, b: a @ b, a, b, fallbacks=1, kernels=0)
    assert "mm" in r.fallbacks[0].op, r.summary()
    r = compile_and_compare(lambda c, a, b: torch.addmm(c, a, b), c, a, b, fallbacks=1)
    assert "addmm" in r.fallbacks[0].op, r.summary()


def test_mixed_dtype_operands_via_prologue_cast():
    """fp16 @ fp32 is an error in eager; the common pattern is an explicit cast, fused as a prologue."""
    a, b = rand(15, 40, dtype=torch.float16), rand(40, 12)
    r = compile_and_compare(lambda a, b: a.float() @ b, a, b, kernels=1, **tol(torch.float32))
    assert_one_gemm_kernel(r)


# =============================================================================================
# 5. Epilogues and prologues: one kernel
# =============================================================================================

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=DTYPE_IDS.get)
def test_linear_gelu_residual_is_one_kernel(dtype):
    x, w, b, r = rand(16, 48, dtype=dtype), rand(24, 48, dtype=dtype), rand(24, dtype=dtype), rand(16, 24, dtype=dtype)
    rep = compile_and_compare(lambda x, w, b, r: F.gelu(F.linear(x, w, b)) + r, x, w, b, r,
                              kernels=1, **tol(dtype, 48))
    assert_one_gemm_kernel(rep)


EPILOGUES = {
    "relu": lambda y: torch.relu(y),
    "silu": lambda y: F.silu(y),
    "tanh": lambda y: torch.tanh(y),
    "sigmoid": lambda y: torch.sigmoid(y),
    "gelu_tanh": lambda y: F.gelu(y, approximate="tanh"),
    "scale": lambda y: y * 0.5,
    "div": lambda y: y / 3.0,
    "to_f16": lambda y: y.to(torch.float16),
    "chain": lambda y: torch.sigmoid((y * 0.5 + 1.0).relu() - 0.25) * 2,
}


@pytest.mark.parametrize("epilogue", EPILOGUES.values(), ids=EPILOGUES.keys())
def test_epilogue_is_one_kernel(epilogue):
    a, b = rand(17, 40), rand(40, 21)
    r = compile_and_compare(lambda a, b: epilogue(a @ b), a, b, kernels=1, **tol(torch.float32))
    assert_one_gemm_kernel(r)


@pytest.mark.parametrize("residual_shape", [(17, 21), (21,), (17, 1)], ids=str)
def test_residual_add_is_one_kernel(residual_shape):
    a, b, res = rand(17, 40), rand(40, 21), rand(*residual_shape)
    r = compile_and_compare(lambda a, b, res: a @ b + res, a, b, res, kernels=1, **tol(torch.float32))
    assert_one_gemm_kernel(r)


@pytest.mark.parametrize("dtype", LOW, ids=DTYPE_IDS.get)
def test_low_precision_epilogue_chain(dtype):
    a, b, c, res = (rand(16, 40, dtype=dtype), rand(40, 24, dtype=dtype), rand(24, dtype=dtype),
                    rand(16, 24, dtype=dtype))
    r = compile_and_compare(lambda c, a, b, res: (F.silu(torch.addmm(c, a, b)) * 2 + res).float(),
                            c, a, b, res, kernels=1, **tol(dtype, 40))
    assert_one_gemm_kernel(r)


def test_bmm_epilogue_with_batched_residual():
    a, b, res = rand(2, 12, 30), rand(2, 30, 10), rand(2, 12, 10)
    r = compile_and_compare(lambda a, b, res: torch.tanh(torch.bmm(a, b)) + res, a, b, res,
                            kernels=1, **tol(torch.float32))
    assert_one_gemm_kernel(r)


def test_epilogue_cast_to_half_output():
    a, b = rand(17, 40), rand(40, 21)
    r = compile_and_compare(lambda a, b: ((a @ b) * 0.25).to(torch.float16), a, b, kernels=1, **tol(torch.float16))
    assert_one_gemm_kernel(r)


PROLOGUES = {
    "cast_scale": (lambda a, b: (a.float() * 2) @ b, torch.float16),
    "scale_sub": (lambda a, b: (a * 0.5 - 1.0) @ b, torch.float32),
    "neg_div_b": (lambda a, b: a @ (-b / 4), torch.float32),
}


@pytest.mark.parametrize("case", PROLOGUES.values(), ids=PROLOGUES.keys())
def test_cheap_prologue_is_one_kernel(case):
    fn, a_dtype = case
    a, b = rand(17, 40, dtype=a_dtype), rand(40, 21)
    r = compile_and_compare(fn, a, b, kernels=1, **tol(torch.float32))
    assert_one_gemm_kernel(r)


def test_prologue_and_epilogue_together():
    a, b, c = rand(17, 40, dtype=torch.bfloat16), rand(40, 21), rand(21)
    r = compile_and_compare(lambda a, b, c: torch.relu(a.float() * 2 @ b + c), a, b, c,
                            kernels=1, **tol(torch.float32))
    assert_one_gemm_kernel(r)


def test_costly_prologue_is_refused():
    a, b = rand(17, 40), rand(40, 21)
    r = compile_and_compare(lambda a, b: torch.exp(a) @ b, a, b, kernels=2, **tol(torch.float32))
    assert any("[gemm-prologue]" in d for d in r.decisions), r.summary()
    assert len(gemm_kernels(r)) == 1, r.summary()


# =============================================================================================
# 6. Fusion refusals
# =============================================================================================

def test_softmax_after_matmul_is_not_fused():
    a, b = rand(17, 40), rand(40, 21)
    r = compile_and_compare(lambda a, b: torch.softmax(a @ b, -1), a, b, kernels=2, **tol(torch.float32))
    assert any("[gemm-reduction]" in d for d in r.decisions), r.summary()
    assert r.kernels[0].name.startswith("k0_mm"), r.summary()
    assert "softmax" in r.kernels[1].name, r.summary()


def test_reduction_feeding_matmul_is_not_fused():
    a, b = rand(17, 40), rand(40, 21)
    r = compile_and_compare(lambda a, b: (a - a.mean(-1, keepdim=True)) @ b, a, b, kernels=2,
                            **tol(torch.float32))
    assert len(gemm_kernels(r)) == 1, r.summary()


def test_chained_matmuls_are_two_kernels():
    a, b, c = rand(17, 40), rand(40, 21), rand(21, 9)
    r = compile_and_compare(lambda a, b, c: (a @ b) @ c, a, b, c, kernels=2, **tol(torch.float32))
    assert [k.name[:5] for k in r.kernels] == ["k0_mm", "k1_mm"], r.summary()
    assert any("[gemm-gemm]" in d for d in r.decisions), r.summary()


def test_two_matmuls_of_one_input_stay_separate():
    x, w1, w2 = rand(17, 40), rand(40, 21), rand(40, 21)
    r = compile_and_compare(lambda x, w1, w2: (x @ w1, x @ w2), x, w1, w2, kernels=2, **tol(torch.float32))
    assert len(gemm_kernels(r)) == 2, r.summary()


def test_matmul_result_also_returned():
    a, b = rand(17, 40), rand(40, 21)

    def fn(a, b):
        y = a @ b
        return y, y.relu(), y * 2
    r = compile_and_compare(fn, a, b, kernels=1, **tol(torch.float32))
    assert_one_gemm_kernel(r)


def test_matmul_result_returned_transposed():
    a, b = rand(17, 40), rand(40, 21)
    compile_and_compare(lambda a, b: ((a @ b).t(), (a @ b).relu()), a, b, **tol(torch.float32))


# =============================================================================================
# 7. Precision
# =============================================================================================

def _sources(report):
    return [Path(k.source_path).read_text() for k in gemm_kernels(report)]


@pytest.mark.parametrize("precision", ["highest", "high"])
def test_fp32_uses_ieee_on_cpu(precision):
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        a, b = torch.randn(33, 127, dtype=torch.float64), torch.randn(127, 29, dtype=torch.float64)
        exact = a @ b
        fn = lambda a, b: a @ b  # noqa: E731
        out = minicomp.compile(fn)(a.float(), b.float())
        r = minicomp.report()
    finally:
        torch.set_float32_matmul_precision(previous)
    # TF32 (10-bit mantissa) would be off by ~1e-3 relative; IEEE fp32 by ~1e-6
    scale = (a.abs() @ b.abs()).float()
    assert ((out - exact.float()).abs() / scale).max() < 1e-5
    torch.testing.assert_close(out, exact.float(), atol=1e-4, rtol=1e-4)
    assert len(r.kernels) == 1 and not r.fallbacks, r.summary()
    (src,) = _sources(r)
    assert 'input_precision="ieee"' in src and "tf32" not in src


# =============================================================================================
# 8. A transformer MLP block
# =============================================================================================

class MLPBlock(nn.Module):
    def __init__(self, d=32, hidden=128):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, hidden)
        self.act = nn.GELU(approximate="tanh")
        self.down = nn.Linear(hidden, d)

    def forward(self, x):
        return x + self.down(self.act(self.up(self.norm(x))))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=DTYPE_IDS.get)
def test_mlp_block(dtype):
    block = MLPBlock().to(dtype).eval()
    x = torch.randn(1, 16, 32).to(dtype)
    with torch.no_grad():
        r = compile_and_compare(block, x, kernels=3, **tol(dtype, 128))
    names = [k.name for k in r.kernels]
    assert "layer_norm" in names[0] and not names[0].startswith("k0_mm"), r.summary()
    assert names[1].startswith("k1_mm") and "gelu" in names[1], r.summary()
    assert names[2].startswith("k2_mm") and "add" in names[2], r.summary()


def _tf32_rounded(t: torch.Tensor) -> torch.Tensor:
    """``t`` (fp32) rounded to the nearest TF32 value (10 mantissa bits; halfway away from zero)."""
    bits = t.view(torch.int32).to(torch.int64)
    return (((bits + 0x1000) & 0xFFFFE000) & 0xFFFFFFFF).to(torch.uint32).view(torch.float32)


def test_tf32_products_round_their_operands_to_nearest(monkeypatch):
    """An fp32 product in TF32 (``tl.dot(..., input_precision="tf32")``) gets operands rounded to the
    nearest TF32 value first, as cuBLAS and cuDNN round: Triton hands the tensor cores fp32 bits, and
    the hardware drops the low 13, which doubles the error bound (triton-lang/triton#4574). The
    interpreter multiplies exactly what it is given, so the result equals the product of the rounded
    operands, not of the original ones."""
    from minicomp.frontend import rules
    monkeypatch.setattr(rules, "_matmul_precision", lambda x: "tf32")
    a, b = torch.randn(19, 37), torch.randn(37, 23)
    out = minicomp.compile(lambda a, b: a @ b)(a, b)
    rounded = (_tf32_rounded(a).double() @ _tf32_rounded(b).double()).float()
    torch.testing.assert_close(out, rounded, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(out, a @ b, rtol=1e-5, atol=1e-5)


def test_tf32_rounding_keeps_nans_and_infinities(monkeypatch):
    """Rounding adds 0x1000 to the bits: a NaN with a large payload (the GPU's own NaN is 0x7FFFFFFF)
    would carry into the sign bit and become -0.0, a silently finite product. NaN and inf operands must
    give eager's NaNs and infinities."""
    from minicomp.frontend import rules
    monkeypatch.setattr(rules, "_matmul_precision", lambda x: "tf32")
    a, b = torch.rand(9, 16) + 0.5, torch.rand(16, 7) + 0.5
    a.view(torch.int32)[0, 3] = 0x7FFFFFFF  # NaN, payload all ones
    a.view(torch.int32)[1, 5] = -1  # 0xFFFFFFFF: negative NaN, payload all ones
    a[2, 0] = float("inf")
    b[4, 6] = float("-inf")
    out = minicomp.compile(lambda a, b: a @ b)(a, b)
    expected = a @ b
    assert torch.equal(out.isnan(), expected.isnan()) and torch.equal(out.isinf(), expected.isinf())
    finite = expected.isfinite()
    torch.testing.assert_close(out[finite], expected[finite], rtol=2e-3, atol=1e-3)


def test_an_eval_batch_norms_per_channel_scale_runs_in_the_epilogue_not_on_the_operand():
    """``weight / sqrt(var + eps)`` of 96 channels feeds only the epilogue: the GEMM computes it on its
    tile's per-column loads (it was a launch of its own). The same ``rsqrt`` feeding an operand stays
    a kernel of its own: recomputed on every tile of the product."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 96, bias=False), nn.BatchNorm1d(96), nn.ReLU()).eval()
    with torch.no_grad():
        model[1].running_var.uniform_(0.5, 2)
        model[1].running_mean.normal_()
        model[1].weight.normal_()
        report = compile_and_compare(model, rand(128, 64), kernels=1, atol=1e-4, rtol=1e-4)
    assert "sqrt" in Path(report.kernels[0].source_path).read_text()
    v = torch.rand(64) + 0.5
    report = compile_and_compare(lambda x, v: x @ torch.rsqrt(v)[:, None].expand(64, 96), rand(128, 64), v, kernels=2)
    assert any("[gemm-prologue]" in d for d in report.decisions), report.decisions
