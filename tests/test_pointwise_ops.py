"""Elementwise ops lowered natively by minicomp, compared with eager PyTorch.

Every test compiles one function (several ops returned as a tuple, to keep the number of compiles
and interpreter runs small) and checks values, dtypes, shapes and NaNs against eager, and that no op
fell back to PyTorch. Inputs are fresh random tensors (never all zeros: buffers are poisoned).
"""
import pytest
import torch
import torch.nn.functional as F

import minicomp
from tests.utils import compile_and_compare, float64_reference

FLOATS = [torch.float32, torch.float16, torch.bfloat16]
INTS = [torch.int32, torch.int64]
NAN, INF = float("nan"), float("inf")


def _id(v):
    return str(v).replace("torch.", "") if isinstance(v, torch.dtype) else None


def dtypes(*ds):
    return pytest.mark.parametrize("dtype", ds, ids=_id)


def rand(*shape, dtype=torch.float32, positive=False, nonzero=False, low=-20, high=20):
    """Random input of ``dtype``: normal floats (``positive``: in [0.1, ~3]), ints in [low, high)
    (``nonzero``: |v| >= 1 with random signs), or random bools."""
    if dtype == torch.bool:
        return torch.rand(shape) > 0.5
    if dtype.is_floating_point:
        t = torch.randn(shape)
        if positive:
            t = t.abs() + 0.1
        return t.to(dtype)
    if nonzero:
        mag = torch.randint(1, high, shape)
        sign = torch.where(torch.rand(shape) > 0.5, 1, -1)
        return (mag * sign).to(dtype)
    return torch.randint(low, high, shape).to(dtype)


def with_specials(*shape, dtype=torch.float32):
    """Random floats with nan, inf and -inf planted at fixed places."""
    t = torch.randn(shape)
    flat = t.view(-1)
    flat[0], flat[3], flat[7], flat[-1] = NAN, INF, -INF, NAN
    return t.to(dtype)


# --- arithmetic ------------------------------------------------------------------------------

@dtypes(*FLOATS, *INTS)
def test_binary_arithmetic_broadcast(dtype):
    def fn(a, b):
        return (a + b, a - b, a * b, a / b, torch.maximum(a, b), torch.minimum(a, b),
                a + 2, 3 - a, a * -2, a / 4, -a, torch.abs(a))

    # [4,1,5] with [3,1] -> [4,3,5]; divisors are never zero
    compile_and_compare(fn, rand(4, 1, 5, dtype=dtype), rand(3, 1, dtype=dtype, nonzero=True))


def test_arithmetic_with_float_scalars_and_mixed_dtypes():
    def fn(i, x, h):
        return (i + 2.5, i * 0.5, i / 3, 1.5 - i, x + i, h * x, h + 1.25, i - x.to(torch.int64),
                torch.maximum(i, x), torch.minimum(h, x))

    compile_and_compare(fn, rand(3, 4, dtype=torch.int32, nonzero=True), rand(3, 4),
                        rand(4, dtype=torch.float16))


def test_add_sub_alpha():
    def fn(a, b, i, j):
        return torch.add(a, b, alpha=2.5), torch.sub(a, b, alpha=-3), torch.add(i, j, alpha=3), \
            torch.sub(i, j, alpha=2)

    compile_and_compare(fn, rand(4, 5), rand(5), rand(4, 5, dtype=torch.int64), rand(4, 5, dtype=torch.int64))


@dtypes(torch.float32, torch.float16, torch.int32, torch.int64)
def test_div_rounding_modes(dtype):
    def fn(a, b):
        return (torch.div(a, b), torch.div(a, b, rounding_mode="floor"),
                torch.div(a, b, rounding_mode="trunc"), a // b,
                torch.div(a, 3, rounding_mode="floor"), torch.div(a, -3, rounding_mode="trunc"),
                torch.div(a, -2, rounding_mode="floor"))

    if dtype.is_floating_point:
        a, b = rand(6, 7, dtype=dtype) * 10, rand(7, dtype=dtype)
    else:  # negative dividends and divisors, remainders of both signs
        a, b = rand(6, 7, dtype=dtype, low=-50, high=50), rand(7, dtype=dtype, nonzero=True, high=8)
    compile_and_compare(fn, a, b)


@dtypes(torch.float32, torch.int32, torch.int64)
def test_remainder_fmod(dtype):
    def fn(a, b):
        return (torch.remainder(a, b), torch.fmod(a, b), a % b, torch.remainder(a, 3),
                torch.remainder(a, -3), torch.fmod(a, 3), torch.fmod(a, -3))

    if dtype.is_floating_point:
        a, b = rand(5, 6) * 10, rand(5, 6) * 3
    else:
        a, b = rand(5, 6, dtype=dtype, low=-50, high=50), rand(5, 6, dtype=dtype, nonzero=True, high=8)
    compile_and_compare(fn, a, b)


INTEGER_DIVISIONS = {
    "floor_divide": lambda a, b: a // b, "remainder": lambda a, b: a % b, "fmod": torch.fmod,
    "div_floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "div_trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "by_a_zero_scalar": lambda a, b: a // 0 + b,
    "summed": lambda a, b: (a % b).sum(-1),                        # in a reduction kernel
    "in_a_cat": lambda a, b: torch.cat([a // b, b]) + 1,
}


@dtypes(torch.int32, torch.uint8)
@pytest.mark.parametrize("op", INTEGER_DIVISIONS)
def test_integer_division_by_zero_raises_like_eager_on_the_cpu(op, dtype):
    # CPU eager raises RuntimeError("ZeroDivisionError"); an interpreted kernel checks the divisor
    # (in the lanes that hold the division's elements) and raises it, without the graph falling
    # back to PyTorch: the next call, with no zero divisor, runs the kernels
    fn = INTEGER_DIVISIONS[op]
    a, b = rand(3, 5, dtype=dtype, low=0, high=50), rand(3, 5, dtype=dtype, low=1, high=8)
    zero = b.clone()
    zero[1, 2] = 0
    compiled = minicomp.compile(fn)
    for args in ((a, zero), (a, b)):
        try:
            expected = fn(*args)
        except RuntimeError as eager:
            with pytest.raises(RuntimeError) as error:
                compiled(*args)
            assert (type(error.value), str(error.value)) == (type(eager), str(eager)) == (RuntimeError, "ZeroDivisionError")
        else:
            torch.testing.assert_close(compiled(*args), expected)
    assert minicomp.report().whole_graph_fallback is None


def test_integer_division_checks_only_the_elements_eager_divides():
    # zeros where the kernel computes a division that eager does not: a cat's other piece, a pad,
    # the masked tail of a block, the padding of a reduction's row; a float division by zero is inf
    def fn(a, b, c):
        return (torch.cat([a[:2] // b[:2], c]), F.pad(a[2:] % b[2:], (3, 0)), (a // b).sum(-1),
                torch.where(b > 3, a // b, 0), a.float() / (b - b).float())
    compile_and_compare(fn, rand(4, 7, dtype=torch.int32), rand(4, 7, dtype=torch.int32, nonzero=True),
                        torch.zeros(3, 7, dtype=torch.int32))


# --- unary math ------------------------------------------------------------------------------

@dtypes(*FLOATS, torch.float64)
def test_unary_math(dtype):
    def fn(x, p):
        return (torch.exp(x), torch.exp2(x), torch.expm1(x), torch.log(p), torch.log2(p), torch.log1p(p),
                torch.sqrt(p), torch.rsqrt(p), torch.sin(x), torch.cos(x), torch.tanh(x), torch.sigmoid(x),
                torch.erf(x), torch.relu(x), F.silu(x), torch.reciprocal(x), torch.sign(x), torch.neg(x),
                torch.abs(x), torch.isnan(x), torch.isinf(x))

    x = rand(6, 8, dtype=dtype) * 3
    compile_and_compare(fn, x, rand(6, 8, dtype=dtype, positive=True))


@dtypes(torch.float32, torch.float64)
def test_unary_math_extreme(dtype):
    """Small and large arguments: log1p/expm1/tanh near 0 (and around 0.0625, where tanh switches
    formulas), sigmoid/tanh/exp saturating."""
    def fn(x, tiny):
        return (torch.log1p(tiny), torch.expm1(tiny), torch.tanh(tiny), torch.tanh(x), torch.sigmoid(x),
                torch.exp(x), F.silu(x), F.gelu(x, approximate="tanh"))

    x = torch.tensor([-100.0, -30.0, -10.0, -0.07, -0.06, -1e-3, 1e-3, 0.05, 0.0624, 0.0626, 0.08, 10.0, 30.0, 80.0])
    x = (x * (1 + 0.01 * torch.rand(14))).to(dtype)
    tiny = (torch.randn(14) * 1e-5).to(dtype)
    compile_and_compare(fn, x, tiny)


@dtypes(*FLOATS, torch.int32)
def test_pow_by_2_3_and_minus_1_is_computed_as_eager_does(dtype):
    """``x ** 2``, ``x ** 3``, ``x ** -1`` are products and a division (eager's own special cases), not
    exp2/log2: the RMSNorm's square and GPT-2's gelu cube. Other exponents keep the general helper."""
    from pathlib import Path
    powers = (2, 3, 2.5) if dtype == torch.int32 else (2, 3, -1, 2.5)
    x = rand(5, 7, dtype=dtype, low=-9, high=9) if dtype == torch.int32 else rand(5, 7, dtype=dtype)
    rep = compile_and_compare(lambda x: tuple(x ** e for e in powers), x)
    (kernel,) = rep.kernels
    assert Path(kernel.source_path).read_text().count("_pow(") == 2  # its definition and 2.5's call


@dtypes(torch.float32, torch.float16)
def test_domain_edges(dtype):
    """Zeros, negatives and infinities at the edges of each op's domain: inf/nan results as eager."""
    def fn(x):
        z = x * 0  # 0, -0 and nan (from inf/nan)
        return (torch.log(x), torch.log2(x), torch.log1p(x), torch.sqrt(x), torch.rsqrt(x), torch.reciprocal(x),
                1 / x, x / z, torch.div(x, z, rounding_mode="floor"), torch.remainder(x, z), torch.fmod(x, z),
                torch.exp(x), torch.exp2(x), torch.expm1(x), torch.tanh(x), torch.sigmoid(x), F.gelu(x),
                x ** -1, x ** 0.5, x ** 2, x ** 3, x ** 0, torch.pow(1.0, x), torch.pow(x, z),
                torch.floor(x), torch.round(x), torch.isinf(x), x.to(torch.bool))

    special = torch.tensor([0.0, -0.0, -1.0, -2.5, 1.0, INF, -INF, NAN])
    x = torch.cat([special, torch.randn(16) * 3]).reshape(4, 6).to(dtype)
    compile_and_compare(fn, x, reference=float64_reference(fn, outputs=(16,)))  # gelu


def test_sign_nan():
    # eager (CPU): sign(nan) == 0
    compile_and_compare(lambda x: torch.sign(x), with_specials(4, 5))


@dtypes(torch.float32, torch.bfloat16)
def test_rounding(dtype):
    def fn(x):
        return torch.floor(x), torch.ceil(x), torch.trunc(x), torch.round(x)

    halves = torch.tensor([-3.5, -2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, -0.49, 0.51])
    x = torch.cat([halves, torch.randn(22) * 5]).reshape(4, 8).to(dtype)
    compile_and_compare(fn, x)


@dtypes(*INTS)
def test_unary_on_ints(dtype):
    """Ops that keep ints (neg, abs, sign, rounding: identity) and ops that promote to float."""
    def fn(i):
        return (-i, torch.abs(i), torch.sign(i), torch.relu(i), torch.floor(i), torch.round(i),
                torch.ceil(i) + 1, torch.trunc(i) * 2, torch.isnan(i), torch.exp(i / 10), torch.sqrt(torch.abs(i)),
                torch.reciprocal(i), torch.sigmoid(i))

    compile_and_compare(fn, rand(5, 6, dtype=dtype, nonzero=True))


@pytest.mark.parametrize("approximate, dtype", [
    ("none", torch.float32), ("tanh", torch.float32), ("none", torch.bfloat16), ("tanh", torch.float16)], ids=_id)
def test_gelu_bias_one_kernel(approximate, dtype):
    compile_and_compare(lambda x, b: F.gelu(x + b, approximate=approximate),
                        rand(8, 16, dtype=dtype) * 3, rand(16, dtype=dtype), kernels=1)


# --- pow -------------------------------------------------------------------------------------

@dtypes(torch.float32, torch.float16)
def test_pow_float(dtype):
    def fn(p, q, n):
        return p ** 2, p ** 0.5, p ** 3, p ** 1.7, p ** -1, p ** q, torch.pow(p, q), 2 ** q, n ** 3, n ** 2

    # p, q > 0; n has negative values (integral exponents only)
    compile_and_compare(fn, rand(4, 6, dtype=dtype, positive=True), rand(6, dtype=dtype, positive=True),
                        rand(4, 6, dtype=dtype))


def test_cube_is_two_multiplications_as_in_eager():
    # eager computes x ** 3 as x*x*x (not pow); so does minicomp, which also keeps gelu-tanh's GEMM
    # epilogue small enough to compile quickly (the pow helper made it a 3 s Triton compile)
    x = rand(5, 7)
    x[0, :4] = torch.tensor([INF, -INF, NAN, -0.0])
    report = compile_and_compare(lambda t: t ** 3, x)
    source = open(report.kernels[0].source_path).read()
    assert "_pow" not in source and source.count(" * ") >= 2


@dtypes(*INTS)
def test_pow_int(dtype):
    def fn(i):
        return i ** 3, i ** 2, i ** 0, i ** 1, torch.pow(i, 5), i * i ** 3

    compile_and_compare(fn, rand(5, 6, dtype=dtype, low=-9, high=9))


def test_pow_int_tensor_float_exponent():
    # an int tensor to a float power is a float tensor, even for integral exponents
    def fn(i):
        return i ** 2.0, i ** 3.0, i ** 0.5, i ** 1.5, i ** -1.0

    compile_and_compare(fn, rand(5, 6, dtype=torch.int32, low=-9, high=9))


# --- min/max/clamp/where ---------------------------------------------------------------------

@dtypes(torch.float32, torch.float16, torch.int32)
def test_clamp(dtype):
    def fn(x, lo, hi):
        return (torch.clamp(x, -1, 1), torch.clamp(x, min=0), torch.clamp(x, max=1), torch.clamp(x, lo, hi),
                torch.clamp(x, min=lo), torch.clamp(x, max=hi), x.clamp_min(-2), x.clamp_max(2),
                torch.clamp(x, 2, -2))  # min > max: everything becomes max

    scale = 3 if dtype.is_floating_point else 1
    x = rand(4, 6, dtype=dtype) * scale
    lo = -rand(6, dtype=dtype, positive=True, nonzero=True).abs()
    hi = rand(4, 1, dtype=dtype, positive=True, nonzero=True).abs()
    compile_and_compare(fn, x, lo, hi)


def test_clamp_promotes_int_with_float_bounds():
    compile_and_compare(lambda i: (torch.clamp(i, min=-2.5, max=3.5), torch.clamp(i, min=0.5)),
                        rand(4, 5, dtype=torch.int64, low=-6, high=6))


@dtypes(torch.float32, torch.float16, torch.int64, torch.bool)
def test_where(dtype):
    def fn(c, a, b):
        return torch.where(c, a, b), torch.where(c, a, 1), torch.where(c, 0, b), torch.where(c > 0, a, b)

    c = rand(4, 1, 6, dtype=torch.bool)
    compile_and_compare(fn, c, rand(3, 6, dtype=dtype), rand(4, 3, 1, dtype=dtype))


def test_where_scalars_and_promotion():
    def fn(c, x, i, h):
        return (torch.where(c, 2.0, -1.0), torch.where(c, 3, 4), torch.where(c, i, 0.5), torch.where(c, h, x),
                torch.where(c, h, 2.5), torch.where(c, i, x))

    c = rand(3, 5, dtype=torch.bool)
    compile_and_compare(fn, c, rand(3, 5), rand(3, 5, dtype=torch.int32), rand(3, 5, dtype=torch.float16))


@dtypes(torch.float32, torch.float16, torch.bfloat16)
def test_nan_inf_propagation(dtype):
    def fn(x, y, c):
        return (torch.maximum(x, y), torch.minimum(x, y), torch.maximum(y, x), torch.minimum(y, x),
                torch.relu(x), torch.clamp(x, -1, 1), torch.clamp(x, min=0.5), torch.clamp(x, max=-0.5),
                torch.clamp(y, x, x + 1), torch.clamp(y, min=x), torch.exp(x), torch.where(c, x, y),
                torch.where(x > 0, x, y), torch.isnan(x), torch.isinf(x), torch.abs(x), torch.sigmoid(x),
                torch.tanh(x), F.gelu(x), x * 0, torch.isnan(x * 0), x.to(torch.bool), x + y)

    x = with_specials(4, 5, dtype=dtype)
    y = rand(4, 5, dtype=dtype)
    y.view(-1)[1] = NAN
    y.view(-1)[7] = INF  # inf vs -inf
    compile_and_compare(fn, x, y, rand(4, 5, dtype=torch.bool), reference=float64_reference(fn, outputs=(18,)))  # gelu


# --- comparisons, logic, bits ----------------------------------------------------------------

@dtypes(torch.float32, torch.float16, torch.int32, torch.int64, torch.bool)
def test_comparisons(dtype):
    def fn(a, b):
        return (a == b, a != b, a < b, a <= b, a > b, a >= b,
                a == 1, a != 0, a < 1, a <= 0, a > -1, a >= 1, torch.eq(a, b), torch.ge(b, a))

    if dtype == torch.bool:
        a, b = rand(4, 1, 5, dtype=dtype), rand(3, 5, dtype=dtype)
    else:  # few distinct values, so == and != see both outcomes
        a = torch.randint(-2, 3, (4, 1, 5)).to(dtype)
        b = torch.randint(-2, 3, (3, 5)).to(dtype)
    compile_and_compare(fn, a, b)


def test_comparisons_int_with_float_scalar():
    def fn(i, x):
        return i < 2.5, i >= -0.5, i == 2.0, x > 1, x == i, i.to(torch.float16) < x

    compile_and_compare(fn, rand(4, 5, dtype=torch.int64, low=-4, high=4), torch.randint(-3, 3, (4, 5)) + 0.5)


@dtypes(torch.bool, torch.int32, torch.float32)
def test_logical(dtype):
    def fn(a, b):
        return (torch.logical_and(a, b), torch.logical_or(a, b), torch.logical_xor(a, b), torch.logical_not(a),
                torch.logical_not(b) & torch.logical_or(a, b))

    if dtype == torch.bool:
        a, b = rand(3, 1, 4, dtype=dtype), rand(5, 4, dtype=dtype)
    else:  # zeros and non-zeros
        a = torch.randint(-1, 2, (3, 1, 4)).to(dtype) * 2
        b = (torch.randint(-1, 2, (5, 4)) * 3).to(dtype)
    compile_and_compare(fn, a, b)


@dtypes(torch.bool, torch.int32, torch.int64, torch.uint8)
def test_bitwise(dtype):
    def fn(a, b):
        k = True if dtype == torch.bool else 6
        return (a & b, a | b, a ^ b, ~a, torch.bitwise_not(b), a & k, a | k, a ^ k,
                torch.bitwise_and(a, b), torch.bitwise_xor(a, b))

    if dtype in (torch.bool, torch.uint8):
        low = 0
    else:
        low = -100
    a = rand(4, 1, 6, dtype=dtype, low=low, high=100)
    b = rand(5, 6, dtype=dtype, low=low, high=100)
    compile_and_compare(fn, a, b)


def test_bool_arithmetic():
    # bool + bool is logical or, bool * bool logical and; with numbers bools promote
    def fn(a, b):
        return (a + b, a * b, torch.maximum(a, b), torch.minimum(a, b), a + 1, a * 1.5, a.float() + b,
                torch.where(a, b, a), torch.sign(a))

    compile_and_compare(fn, rand(4, 1, 5, dtype=torch.bool), rand(3, 5, dtype=torch.bool))


@dtypes(torch.int8, torch.uint8)
def test_small_int_wraparound(dtype):
    def fn(a, b):
        return a + b, a * b, a - b, -a, torch.abs(a), a // b, a % b, a * 3, torch.maximum(a, b), a.float() / 3

    lo = 0 if dtype == torch.uint8 else -128
    a = torch.randint(lo, lo + 256, (4, 6)).to(dtype)
    b = torch.randint(1, 100, (4, 6)).to(dtype)
    compile_and_compare(fn, a, b)


# --- casts and constants ---------------------------------------------------------------------

def test_casts():
    def fn(x, i, c):
        return (x.to(torch.int32), x.to(torch.int64), x.int(), i.to(torch.float32), i.float() / 3,
                x.to(torch.bool), x.bool(), c.to(torch.float32), c.float() * 2 + 1, c.to(torch.int64),
                i.to(torch.bool), i.to(torch.int8), x.to(torch.float64))

    x = rand(5, 6) * 10  # negative fractions: float->int truncates towards 0
    x.view(-1)[0] = 0.0  # one exact zero for float->bool
    compile_and_compare(fn, x, rand(5, 6, dtype=torch.int64, low=-200, high=200), rand(5, 6, dtype=torch.bool))


@pytest.mark.parametrize("low", [torch.float16, torch.bfloat16], ids=_id)
def test_cast_low_precision_round_trip(low):
    def fn(x, h):
        return x.to(low), x.to(low).to(torch.float32), h.to(torch.float32), h.float() * x, (x * 3).to(low) + h

    # values that are not representable in low precision: rounding of the cast matters. A cast
    # (and one low-precision add) rounds to nearest-even in eager: results must be bit-exact.
    x = rand(6, 8) * 100
    compile_and_compare(fn, x, rand(6, 8, dtype=low), atol=0, rtol=0)


def test_full_and_like_constructors():
    def fn(x, i):
        return (torch.full((4, 5), 2.5) + x, torch.full_like(x, 3) * x, torch.zeros_like(x) + x,
                torch.ones_like(x) - x, torch.full((5,), 7, dtype=torch.int32) + i,
                torch.ones_like(i) * i, torch.full_like(x, -1.5, dtype=torch.float16) * x.half(),
                torch.zeros_like(x, dtype=torch.int64) + i, torch.full((), 4.0) * x)

    compile_and_compare(fn, rand(4, 5), rand(4, 5, dtype=torch.int32))


def test_masked_fill():
    def fn(x, m, i, v):
        return (x.masked_fill(m, -INF), x.masked_fill(m, 0.5), i.masked_fill(m, 7), x.masked_fill(~m, v),
                x.masked_fill(m[0], 2.0))

    m = rand(4, 1, dtype=torch.bool) | (torch.rand(1, 6) > 0.5)  # broadcast mask [4,6]
    compile_and_compare(fn, rand(4, 6), m, rand(4, 6, dtype=torch.int64), torch.tensor(3.25))


# --- shapes and layouts ----------------------------------------------------------------------

def _chain(x, y):
    return torch.relu(x) * y + 1, torch.exp(x - y), torch.where(x > y, x, y * 2)


@pytest.mark.parametrize("layout", ["transposed", "sliced", "expanded", "offset"])
def test_noncontiguous_inputs(layout):
    if layout == "transposed":
        x, y = rand(6, 5).t(), rand(5, 6)
    elif layout == "sliced":
        x, y = rand(5, 12)[:, ::2], rand(8, 6)[1:6]
    elif layout == "expanded":
        x, y = rand(5, 1).expand(5, 6), rand(6).expand(5, 6)
    else:  # storage offset and a transposed slice
        x, y = rand(7, 6)[2:], rand(6, 9)[:, 3:8].t()
    assert not x.is_contiguous() or not y.is_contiguous()
    compile_and_compare(_chain, x, y)


def test_views_inside_function():
    def fn(x, y):
        return x.t() + y, x[:, ::2] * 2, x.t().exp() - y

    compile_and_compare(fn, rand(6, 5), rand(5, 6))


def test_zero_size():
    def fn(x, b, i):
        return x + b, torch.relu(x) * 2, x > 0, torch.where(x > b, x, b), i * 3, x.to(torch.int32)

    compile_and_compare(fn, rand(0, 5), rand(5), rand(0, 5, dtype=torch.int64))


def test_size_one_dims():
    def fn(a, b):
        return a + b, a * b - 1, torch.maximum(a, b), torch.where(a > 0, a, b), torch.sigmoid(a) * 0 + a

    compile_and_compare(fn, rand(1, 5, 1), rand(3, 1, 4))


def test_zero_dim_tensors():
    def fn(s, x, t):
        return s * x + 1, torch.exp(s), s + t, torch.maximum(x, s), torch.where(s > 0, x, s), s > x, -t, t * 2.5

    compile_and_compare(fn, rand(), rand(3, 4), rand(dtype=torch.int64, nonzero=True))


def test_python_scalar_arguments():
    def fn(x, s, k):
        return x * s + k, x / s, torch.clamp(x, -s, s), x > s

    compile_and_compare(fn, rand(4, 5), 0.75, 3)


@dtypes(torch.float16, torch.bfloat16)
def test_low_precision_mixed_chain(dtype):
    def fn(x, y, s):
        return (x * y + s, torch.sigmoid(x) * y, x / y, torch.maximum(x, y) - s, (x + 1.5) * 0.25,
                torch.where(x > y, x, s))

    compile_and_compare(fn, rand(6, 7, dtype=dtype), rand(7, dtype=dtype, positive=True), rand(dtype=dtype))


# --- kernel counts ---------------------------------------------------------------------------

def test_chain_one_kernel():
    compile_and_compare(lambda x: torch.relu(x) * 0.5 + 1, rand(8, 16), kernels=1)


def test_long_pointwise_chain_one_kernel():
    def fn(x, b):
        y = torch.sigmoid(x) * torch.tanh(x + b) + torch.exp(-x.abs()).log1p()
        return torch.clamp(y, -0.5, 0.5) * 2 - torch.where(x > 0, x, b).square()

    compile_and_compare(fn, rand(8, 16), rand(16), kernels=1)


def test_broadcast_outputs_one_kernel():
    compile_and_compare(lambda a, b: (a + b) * (a - b), rand(4, 1, 5), rand(3, 1), kernels=1)
