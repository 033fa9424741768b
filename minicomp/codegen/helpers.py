"""The ``@triton.jit`` helpers generated kernels call: math that ``tl`` lacks (tanh, log1p, pow,
NaN-propagating max, ...) written with ``tl`` ops, so the same source runs compiled on a GPU and in
Triton's CPU interpreter, and the combine functions of reductions and scans. The two that emit a PTX
instruction (fast 2**x and 1/x) take the plain ``tl`` spelling when ``INTERPRETED``.

A kernel module prints the helpers its kernel uses and, transitively, the ones they call (``uses``,
declared with each helper; a test checks them against the sources).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Helper:
    """One helper: its source (a ``@triton.jit`` function of the same name) and the helpers it calls."""
    source: str
    uses: tuple[str, ...] = ()
    imports: tuple[str, ...] = ()  # module-level imports its source needs


HELPERS: dict[str, Helper] = {
    "_max_nan": Helper('''
@triton.jit
def _max_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)
'''),
    "_min_nan": Helper('''
@triton.jit
def _min_nan(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)
'''),
    "_prod": Helper('''
@triton.jit
def _prod(a, b):
    return a * b
'''),
    "_sum": Helper('''
@triton.jit
def _sum(a, b):
    return a + b
'''),
    "_max_int": Helper('''
@triton.jit
def _max_int(a, b):
    return tl.maximum(a, b)
'''),
    "_min_int": Helper('''
@triton.jit
def _min_int(a, b):
    return tl.minimum(a, b)
'''),
    "_argmax": Helper('''
@triton.jit
def _argmax(v1, i1, v2, i2):
    take = (v1 > v2) | ((v1 != v1) & (v2 == v2)) | (((v1 == v2) | ((v1 != v1) & (v2 != v2))) & (i1 < i2))
    return tl.where(take, v1, v2), tl.where(take, i1, i2)
'''),
    "_argmin": Helper('''
@triton.jit
def _argmin(v1, i1, v2, i2):
    take = (v1 < v2) | ((v1 != v1) & (v2 == v2)) | (((v1 == v2) | ((v1 != v1) & (v2 != v2))) & (i1 < i2))
    return tl.where(take, v1, v2), tl.where(take, i1, i2)
'''),
    # an argmax fed its elements in index order (a window's unrolled taps): the next element replaces
    # the best so far if strictly larger, or if it is the first NaN
    "_argmax_next": Helper('''
@triton.jit
def _argmax_next(best, at, v, i):
    take = (v > best) | ((v != v) & (best == best))
    return tl.where(take, v, best), tl.where(take, i, at)
'''),
    "_tanh": Helper('''
@triton.jit
def _tanh(x, INTERPRETED: tl.constexpr):
    # tanh(|x|) = (1 - e) / (1 + e) with e = exp(-2|x|); a short series near 0 avoids cancellation.
    # 1/(1 + e) to 1 ulp in one MUFU op: an IEEE division made GPT-2's gelu epilogue 2x slower to compile
    ax = tl.abs(x)
    e = tl.exp(-2.0 * ax)
    big = (1.0 - e) * _rcp_approx(1.0 + e, INTERPRETED)
    x2 = x * x
    small = ax * (1.0 - x2 * (0.3333333333333333 - x2 * (0.13333333333333333 - x2 * 0.05396825396825397)))
    t = tl.where(ax < 0.0625, small, big)
    return tl.where(x < 0, -t, tl.where(x == x, t, x))
''', uses=("_rcp_approx",)),
    "_gelu_erf": Helper('''
@triton.jit
def _gelu_erf(x, INTERPRETED: tl.constexpr):
    # x/2 (1 + erf(x/sqrt2)) = max(x, 0) - |x|/2 erfc(|x|/sqrt2), erfc = t p(t) exp(-x^2/2) with
    # t = 1/(1 + 0.3275911 |x|/sqrt2) (Abramowitz & Stegun 7.1.26, |error| < 1.5e-7): no cancellation and
    # two MUFU ops, where libdevice's erf made bf16 gelu compute-bound (1.41x -> 1.14x its floor, H200)
    t = _rcp_approx(1.0 + 0.23164188 * tl.abs(x), INTERPRETED)
    p = 0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429)))
    e = _ex2_approx(x * x * -0.7213475204444817, INTERPRETED)  # exp(-x^2/2)
    y = tl.maximum(x, 0.0) - (tl.abs(0.5 * x) * t) * e * p
    return tl.where(x == float("inf"), x, y)  # inf * 0 above; -inf gives NaN, as eager
''', uses=("_ex2_approx", "_rcp_approx")),
    "_sigmoid": Helper('''
@triton.jit
def _sigmoid(x, INTERPRETED: tl.constexpr):
    return _rcp_approx(1.0 + _ex2_approx(x * -1.4426950408889634, INTERPRETED), INTERPRETED)
''', uses=("_ex2_approx", "_rcp_approx")),
    "_gelu_tanh": Helper('''
@triton.jit
def _gelu_tanh(x, INTERPRETED: tl.constexpr):
    # x/2 (1 + tanh(u)) = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3): no cancellation for x < 0
    return x * _sigmoid(x * (1.5957691216057308 + 0.07135481627159393 * x * x), INTERPRETED)
''', uses=("_sigmoid",)),
    "_log1p": Helper('''
@triton.jit
def _log1p(x):
    # log(u) * x / (u - 1) with u = 1 + x corrects the rounding of u (Goldberg's trick)
    u = 1.0 + x
    d = u - 1.0
    r = tl.where(d == 0.0, x, tl.log(u) * (x / tl.where(d == 0.0, 1.0, d)))
    return tl.where(u == float("inf"), u, r)
'''),
    "_expm1": Helper('''
@triton.jit
def _expm1(x, INTERPRETED: tl.constexpr):
    # libdevice's (as Inductor's) on a GPU: one MUFU op and ~36 instructions an element on sm_90, where
    # the formula below took two and ~63, enough to make a bf16 where(x > 0, x * y, expm1(z)) compute-
    # bound (1.18x Inductor's time, H200). The interpreter has no libdevice: exp(x) - 1 with the
    # rounding of exp(x) corrected (Kahan's trick)
    if INTERPRETED:
        u = tl.exp(x)
        d = u - 1.0
        lu = tl.log(u)
        r = tl.where((d == 0.0) | (lu == 0.0), x, d * (x / tl.where(lu == 0.0, 1.0, lu)))
        y = tl.where(d == -1.0, -1.0, tl.where(u == float("inf"), u, r))
    else:
        y = libdevice.expm1(x)
    return y
''', imports=("from triton.language.extra import libdevice",)),
    "_f32_to_bf16": Helper('''
@triton.jit
def _f32_to_bf16(x, INTERPRETED: tl.constexpr):
    y = x.to(tl.bfloat16)
    if INTERPRETED:  # Triton's interpreter truncates: round to nearest even on the bits
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        y = tl.where(x != x, x, bits.to(tl.float32, bitcast=True)).to(tl.bfloat16)
    return y
'''),
    "_trunc": Helper('''
@triton.jit
def _trunc(x):
    return tl.where(x < 0, tl.math.ceil(x), tl.math.floor(x))
'''),
    "_round": Helper('''
@triton.jit
def _round(x):
    # round half to even, as torch.round
    f = tl.math.floor(x)
    d = x - f
    odd = (f - 2.0 * tl.math.floor(f * 0.5)) != 0.0
    return tl.where((d > 0.5) | ((d == 0.5) & odd), f + 1.0, f)
'''),
    "_pow": Helper('''
@triton.jit
def _pow(a, b):
    # |a|**b through exp2/log2, then the sign for negative bases with integral exponents
    r = tl.exp2(b * tl.log2(tl.abs(a)))
    b_int = tl.math.floor(b) == b
    b_odd = b_int & ((b - 2.0 * tl.math.floor(b * 0.5)) != 0.0)
    negative = (a < 0) | ((a == 0) & (1.0 / a < 0))  # -0.0 counts: (-0.0) ** -1 == -inf
    r = tl.where((a < 0) & (a != float("-inf")) & (b_int == 0), float("nan"), tl.where(negative & b_odd, -r, r))
    return tl.where(b == 0.0, 1.0, tl.where(a == 1.0, 1.0, r))
'''),
    "_floordiv_int": Helper('''
@triton.jit
def _floordiv_int(a, b):
    q = a // b
    r = a - q * b
    return tl.where((r != 0) & ((r < 0) != (b < 0)), q - 1, q)
'''),
    "_remainder_int": Helper('''
@triton.jit
def _remainder_int(a, b):
    r = a % b
    return tl.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)
'''),
    "_check_divisor": Helper('''
@triton.jit
def _check_divisor(b, lanes):
    # interpreted kernels only: the interpreter runs this as Python, and raises what eager raises on
    # the CPU where one of ``lanes`` divides by zero (runtime/eager_errors.py lets it through). Summed
    # by Triton's own combine, which the interpreter hands to numpy (any other: element by element)
    if tl.reduce(((b == 0) & lanes).to(tl.int32), None, tl.standard._sum_combine) != 0:
        raise RuntimeError("ZeroDivisionError")
'''),
    "_remainder_float": Helper('''
@triton.jit
def _remainder_float(a, b):
    r = a - b * tl.math.floor(a / b)
    return r
'''),
    "_fmod_float": Helper('''
@triton.jit
def _fmod_float(a, b):
    q = a / b
    return a - b * tl.where(q < 0, tl.math.ceil(q), tl.math.floor(q))
'''),
    # scans (tl.associative_scan combine functions)
    "_logaddexp": Helper('''
@triton.jit
def _logaddexp(a, b):
    # log(e^a + e^b) as eager's logcumsumexp: max + log1p(exp(min - max)); equal infinities give a
    hi = _max_nan(a, b)
    lo = _min_nan(a, b)
    usual = (lo != hi) | (tl.abs(lo) < float("inf"))
    return tl.where(usual, hi + _log1p(tl.exp(lo - hi)), a)
''', uses=("_max_nan", "_min_nan", "_log1p")),
    "_softmax_step": Helper('''
@triton.jit
def _softmax_step(m, s, x):
    # x joins a lane's running max m and its sum s of exp(. - m) (an online softmax), shifted by 0
    # while the max is -inf (exp(-inf - -inf) would be nan; the sum stays 0)
    m_new = _max_nan(m, x)
    shift = tl.where(m_new == float("-inf"), 0.0, m_new)
    return m_new, s * tl.exp(m - shift) + tl.exp(x - shift)
''', uses=("_max_nan",)),
    "_welford_step": Helper('''
@triton.jit
def _welford_step(mean, m2, n, x, valid):
    # x joins a lane's running mean, centred sum of squares m2 and count n where valid (Welford, 1962)
    n_new = n + valid.to(tl.float32)
    delta = x - mean
    mean_new = tl.where(valid, mean + delta / tl.maximum(n_new, 1.0), mean)
    return mean_new, tl.where(valid, m2 + delta * (x - mean_new), m2), n_new
'''),
    "_welford_combine": Helper('''
@triton.jit
def _welford_combine(mean_a, m2_a, n_a, mean_b, m2_b, n_b):
    # two lanes' (mean, m2, count) as one (Chan, Golub and LeVeque, 1979); an empty lane changes nothing
    n = n_a + n_b
    w = n_b / tl.maximum(n, 1.0)
    delta = mean_b - mean_a
    return mean_a + delta * w, m2_a + m2_b + delta * delta * n_a * w, n
'''),
    "_argmax_scan": Helper('''
@triton.jit
def _argmax_scan(v1, i1, v2, i2):
    # torch.cummax: NaN above everything, equal values to the later index; a total order (associative,
    # whichever side the scan puts first)
    later = i2 > i1
    take = ((v2 != v2) & ((v1 == v1) | later)) | ((v1 == v1) & (v2 == v2) & ((v2 > v1) | ((v2 == v1) & later)))
    return tl.where(take, v2, v1), tl.where(take, i2, i1)
'''),
    "_argmin_scan": Helper('''
@triton.jit
def _argmin_scan(v1, i1, v2, i2):
    later = i2 > i1
    take = ((v2 != v2) & ((v1 == v1) | later)) | ((v1 == v1) & (v2 == v2) & ((v2 < v1) | ((v2 == v1) & later)))
    return tl.where(take, v2, v1), tl.where(take, i2, i1)
'''),
}


def _one_instruction(name: str, ptx: str, plain: str, why: str) -> Helper:
    """A helper that is one PTX instruction when compiled, ``plain`` in the interpreter."""
    return Helper(f'''
@triton.jit
def {name}(x, INTERPRETED: tl.constexpr):
    # {why}
    if INTERPRETED:
        return {plain}
    else:
        return tl.inline_asm_elementwise("{ptx} $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1)
''')


HELPERS["_ex2_approx"] = _one_instruction(
    "_ex2_approx", "ex2.approx.ftz.f32", "tl.exp2(x)",
    "2**x as one MUFU instruction (subnormal results flush to 0); tl.exp2 wraps it in a subnormal fixup")
HELPERS["_rcp_approx"] = _one_instruction(
    "_rcp_approx", "rcp.approx.ftz.f32", "1.0 / x",
    '1/x to 1 ulp as one MUFU instruction; "/" is an IEEE division, about ten instructions')
