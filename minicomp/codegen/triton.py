"""Print a Kernel as Triton source. Every decision was made before (schedule); this only spells it.

Math that ``tl`` lacks (tanh, log1p, pow, NaN-propagating max, ...) comes from small helpers written
with ``tl`` ops, so the same source runs compiled on a GPU and in Triton's CPU interpreter; the two
that emit a PTX instruction (fast 2**x and 1/x) take the plain ``tl`` spelling when ``INTERPRETED``.
"""
from __future__ import annotations

import math
import re

import torch

from ..ir.expr import Affine, Range
from ..ir.graph import Scalar
from ..ir.kernel import Compute, IndexValue, Indirect, Kernel, Load, Masked, Pipeline, SplitCombine, StagedLaunch, Store
from ..ir.types import is_float
from ..templates import template_of

TL_DTYPE = {
    torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16", torch.float32: "tl.float32",
    torch.float64: "tl.float64", torch.int8: "tl.int8", torch.int16: "tl.int16", torch.int32: "tl.int32",
    torch.int64: "tl.int64", torch.uint8: "tl.uint8", torch.bool: "tl.int1",
}

HELPERS = {
    "_max_nan": '''
@triton.jit
def _max_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)
''',
    "_min_nan": '''
@triton.jit
def _min_nan(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)
''',
    "_prod": '''
@triton.jit
def _prod(a, b):
    return a * b
''',
    "_sum": '''
@triton.jit
def _sum(a, b):
    return a + b
''',
    "_max_int": '''
@triton.jit
def _max_int(a, b):
    return tl.maximum(a, b)
''',
    "_min_int": '''
@triton.jit
def _min_int(a, b):
    return tl.minimum(a, b)
''',
    "_argmax": '''
@triton.jit
def _argmax(v1, i1, v2, i2):
    take = (v1 > v2) | ((v1 != v1) & (v2 == v2)) | (((v1 == v2) | ((v1 != v1) & (v2 != v2))) & (i1 < i2))
    return tl.where(take, v1, v2), tl.where(take, i1, i2)
''',
    "_argmin": '''
@triton.jit
def _argmin(v1, i1, v2, i2):
    take = (v1 < v2) | ((v1 != v1) & (v2 == v2)) | (((v1 == v2) | ((v1 != v1) & (v2 != v2))) & (i1 < i2))
    return tl.where(take, v1, v2), tl.where(take, i1, i2)
''',
    "_tanh": '''
@triton.jit
def _tanh(x):
    # tanh(|x|) = (1 - e) / (1 + e) with e = exp(-2|x|); a short series near 0 avoids cancellation
    ax = tl.abs(x)
    e = tl.exp(-2.0 * ax)
    big = (1.0 - e) / (1.0 + e)
    x2 = x * x
    small = ax * (1.0 - x2 * (0.3333333333333333 - x2 * (0.13333333333333333 - x2 * 0.05396825396825397)))
    t = tl.where(ax < 0.0625, small, big)
    return tl.where(x < 0, -t, tl.where(x == x, t, x))
''',
    "_gelu_erf": '''
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
''',
    "_sigmoid": '''
@triton.jit
def _sigmoid(x, INTERPRETED: tl.constexpr):
    return _rcp_approx(1.0 + _ex2_approx(x * -1.4426950408889634, INTERPRETED), INTERPRETED)
''',
    "_gelu_tanh": '''
@triton.jit
def _gelu_tanh(x, INTERPRETED: tl.constexpr):
    # x/2 (1 + tanh(u)) = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3): no cancellation for x < 0
    return x * _sigmoid(x * (1.5957691216057308 + 0.07135481627159393 * x * x), INTERPRETED)
''',
    "_log1p": '''
@triton.jit
def _log1p(x):
    # log(u) * x / (u - 1) with u = 1 + x corrects the rounding of u (Goldberg's trick)
    u = 1.0 + x
    d = u - 1.0
    r = tl.where(d == 0.0, x, tl.log(u) * (x / tl.where(d == 0.0, 1.0, d)))
    return tl.where(u == float("inf"), u, r)
''',
    "_expm1": '''
@triton.jit
def _expm1(x):
    u = tl.exp(x)
    d = u - 1.0
    lu = tl.log(u)
    r = tl.where((d == 0.0) | (lu == 0.0), x, d * (x / tl.where(lu == 0.0, 1.0, lu)))
    return tl.where(d == -1.0, -1.0, tl.where(u == float("inf"), u, r))
''',
    "_f32_to_bf16": '''
@triton.jit
def _f32_to_bf16(x, INTERPRETED: tl.constexpr):
    y = x.to(tl.bfloat16)
    if INTERPRETED:  # Triton's interpreter truncates: round to nearest even on the bits
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        y = tl.where(x != x, x, bits.to(tl.float32, bitcast=True)).to(tl.bfloat16)
    return y
''',
    "_trunc": '''
@triton.jit
def _trunc(x):
    return tl.where(x < 0, tl.math.ceil(x), tl.math.floor(x))
''',
    "_round": '''
@triton.jit
def _round(x):
    # round half to even, as torch.round
    f = tl.math.floor(x)
    d = x - f
    odd = (f - 2.0 * tl.math.floor(f * 0.5)) != 0.0
    return tl.where((d > 0.5) | ((d == 0.5) & odd), f + 1.0, f)
''',
    "_pow": '''
@triton.jit
def _pow(a, b):
    # |a|**b through exp2/log2, then the sign for negative bases with integral exponents
    r = tl.exp2(b * tl.log2(tl.abs(a)))
    b_int = tl.math.floor(b) == b
    b_odd = b_int & ((b - 2.0 * tl.math.floor(b * 0.5)) != 0.0)
    negative = (a < 0) | ((a == 0) & (1.0 / a < 0))  # -0.0 counts: (-0.0) ** -1 == -inf
    r = tl.where((a < 0) & (a != float("-inf")) & (b_int == 0), float("nan"), tl.where(negative & b_odd, -r, r))
    return tl.where(b == 0.0, 1.0, tl.where(a == 1.0, 1.0, r))
''',
    "_floordiv_int": '''
@triton.jit
def _floordiv_int(a, b):
    q = a // b
    r = a - q * b
    return tl.where((r != 0) & ((r < 0) != (b < 0)), q - 1, q)
''',
    "_remainder_int": '''
@triton.jit
def _remainder_int(a, b):
    r = a % b
    return tl.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)
''',
    "_remainder_float": '''
@triton.jit
def _remainder_float(a, b):
    r = a - b * tl.math.floor(a / b)
    return r
''',
    "_fmod_float": '''
@triton.jit
def _fmod_float(a, b):
    q = a / b
    return a - b * tl.where(q < 0, tl.math.ceil(q), tl.math.floor(q))
''',
    # scans (tl.associative_scan combine functions)
    "_logaddexp": '''
@triton.jit
def _logaddexp(a, b):
    # log(e^a + e^b) as eager's logcumsumexp: max + log1p(exp(min - max)); equal infinities give a
    hi = _max_nan(a, b)
    lo = _min_nan(a, b)
    usual = (lo != hi) | (tl.abs(lo) < float("inf"))
    return tl.where(usual, hi + _log1p(tl.exp(lo - hi)), a)
''',
    "_argmax_scan": '''
@triton.jit
def _argmax_scan(v1, i1, v2, i2):
    # torch.cummax: NaN above everything, equal values to the later index; a total order (associative,
    # whichever side the scan puts first)
    later = i2 > i1
    take = ((v2 != v2) & ((v1 == v1) | later)) | ((v1 == v1) & (v2 == v2) & ((v2 > v1) | ((v2 == v1) & later)))
    return tl.where(take, v2, v1), tl.where(take, i2, i1)
''',
    "_argmin_scan": '''
@triton.jit
def _argmin_scan(v1, i1, v2, i2):
    later = i2 > i1
    take = ((v2 != v2) & ((v1 == v1) | later)) | ((v1 == v1) & (v2 == v2) & ((v2 < v1) | ((v2 == v1) & later)))
    return tl.where(take, v2, v1), tl.where(take, i2, i1)
''',
}


def _one_instruction(name: str, ptx: str, plain: str, why: str) -> str:
    """A helper that is one PTX instruction when compiled, ``plain`` in the interpreter."""
    return f'''
@triton.jit
def {name}(x, INTERPRETED: tl.constexpr):
    # {why}
    if INTERPRETED:
        return {plain}
    else:
        return tl.inline_asm_elementwise("{ptx} $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1)
'''


HELPERS["_ex2_approx"] = _one_instruction(
    "_ex2_approx", "ex2.approx.ftz.f32", "tl.exp2(x)",
    "2**x as one MUFU instruction (subnormal results flush to 0); tl.exp2 wraps it in a subnormal fixup")
HELPERS["_rcp_approx"] = _one_instruction(
    "_rcp_approx", "rcp.approx.ftz.f32", "1.0 / x",
    '1/x to 1 ulp as one MUFU instruction; "/" is an IEEE division, about ten instructions')


def plain_literal(value, dtype: torch.dtype) -> str:
    """A Python literal for ``value`` (as ``tl.full``'s fill value)."""
    if dtype == torch.bool:
        return str(int(bool(value)))
    if is_float(dtype):
        return repr(float(value)) if math.isfinite(value) else f'float("{value}")'
    return str(int(value))


def literal(value, dtype: torch.dtype, block: bool = False, rank: int = 1) -> str:
    """A Triton expression for a constant of ``dtype``: a Python literal where Triton types it right
    (fp32, int32), else (or if ``block``) a block of ones of ``rank`` dimensions, so it broadcasts with
    the kernel's blocks."""
    text = plain_literal(value, dtype)
    typed_right = dtype == torch.float32 or (dtype == torch.int32 and -2**31 <= value < 2**31)
    if typed_right and not block:
        return text
    ones = "[" + ", ".join(["1"] * rank) + "]"
    if dtype == torch.bfloat16:  # made from fp32: triton 3.6's interpreter has no bf16 constants
        return f"tl.full({ones}, {text}, tl.float32).to(tl.bfloat16)"
    return f"tl.full({ones}, {text}, {TL_DTYPE[dtype]})"

# the other helpers each helper calls (read off its source)
HELPER_USES = {name: [h for h in HELPERS if h != name and re.search(rf"\b{h}\(", src)] for name, src in HELPERS.items()}


class TritonPrinter:
    """Prints one Kernel: the statements every template shares; the kernel's template
    (``templates.template_of``) prints the body around them and the statements only it has."""

    def __init__(self, kernel: Kernel):
        self.k = kernel
        self.template = template_of(kernel)  # spells the kernel's body and its own statements
        self.dtypes: dict[str, torch.dtype] = {}
        self.helpers: set[str] = set()
        self.lines: list[str] = []
        self.descriptors: dict[str, str] = {}  # TMA descriptors, made once at the top of the kernel
        self.evict: dict[str, str] = {}  # buffer -> L2 eviction policy of its loads in a reduction loop
        self.stage_evict: dict[str, str] = {}  # the same, from the pipeline the kernel is a stage of

    def k_dtype(self, buffer: str) -> torch.dtype:
        return next(a.node.dtype for a in self.k.args if a.name == buffer)

    # --- expressions --------------------------------------------------------------------
    def index(self, e: Affine) -> str:
        return str(e)

    def needs_mask(self, var: str) -> bool:
        """A variable needs a bounds mask unless its blocks tile its range exactly."""
        block = self.k.schedule.blocks.get(self.template.block_of.get(var, ""), 1)
        size = next(v.size for v in self.k.vars.values() if v.name == var)
        return size == 0 or size % block != 0

    def mask(self, exprs, extra: tuple[Range, ...] = (), names=()) -> str:
        """The bounds masks of the variables used (where needed), and a view's validity ranges."""
        used = set(names)
        for e in exprs:
            used |= {v.name for v in e.vars()}
        for r in extra:
            used |= {v.name for v in r.expr.vars()}
        order = ("yindex", "xindex", "rindex", "mindex", "nindex", "kaindex", "kbindex")
        parts = [v.replace("index", "mask") for v in order if v in used and self.needs_mask(v)]
        parts += [f"({r})" for r in extra]
        return " & ".join(parts)

    def arg(self, a, block: bool = False) -> str:
        return self.lit(a.value, a.dtype, block) if isinstance(a, Scalar) else a

    def lit(self, value, dtype: torch.dtype, block: bool = False) -> str:
        return literal(value, dtype, block, rank=self.template.rank)

    @staticmethod
    def tl_type(dtype: torch.dtype) -> str:
        return TL_DTYPE[dtype]

    @staticmethod
    def full(shape: str, value, dtype: torch.dtype) -> str:
        """A block of ``shape`` (spelled, e.g. ``"[XBLOCK, 1]"``) filled with ``value``."""
        return f"tl.full({shape}, {plain_literal(value, dtype)}, {TL_DTYPE[dtype]})"

    def compute(self, s: Compute) -> str:
        fn, dt = s.fn, s.dtype
        a = [self.arg(x) for x in s.args]
        blocks = [self.arg(x, block=True) for x in s.args]  # helpers want tensors, not Python numbers
        in_dt = next((self.dtypes[x] for x in s.args if isinstance(x, str) and x in self.dtypes),
                     next((x.dtype for x in s.args if isinstance(x, Scalar)), dt))
        flt = is_float(in_dt)
        binary = {"add": "+", "sub": "-", "mul": "*", "bitwise_and": "&", "bitwise_or": "|",
                  "bitwise_xor": "^", "eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
        if fn in binary:
            expr = f"{a[0]} {binary[fn]} {a[1]}"
        elif fn == "truediv":
            expr = f"{a[0]} / {a[1]}"
        elif fn == "floordiv":
            expr = f"tl.math.floor({a[0]} / {a[1]})" if flt else self.helper("_floordiv_int", blocks)
        elif fn == "truncdiv":
            expr = self.helper("_trunc", [f"{a[0]} / {a[1]}"]) if flt else f"{a[0]} // {a[1]}"
        elif fn == "remainder":
            expr = self.helper("_remainder_float" if flt else "_remainder_int", blocks)
        elif fn == "fmod":
            expr = self.helper("_fmod_float", blocks) if flt else f"{a[0]} % {a[1]}"
        elif fn == "pow":
            expr = self.helper("_pow", blocks)
        elif fn in ("maximum", "minimum"):
            if flt:
                expr = self.helper("_max_nan" if fn == "maximum" else "_min_nan", blocks)
            else:
                expr = f"tl.{fn}({a[0]}, {a[1]})"
        elif fn == "neg":
            expr = f"-{a[0]}"
        elif fn == "abs":
            expr = f"tl.abs({a[0]})"
        elif fn == "reciprocal":
            expr = f"1.0 / {a[0]}"
        elif fn == "sign":
            expr = f"({a[0]} > 0).to({TL_DTYPE[dt]}) - ({a[0]} < 0).to({TL_DTYPE[dt]})"
        elif fn in ("floor", "ceil"):
            expr = f"tl.math.{fn}({a[0]})"
        elif fn in ("trunc", "round", "tanh", "log1p", "expm1"):
            expr = self.helper("_" + fn, a)
        elif fn in ("exp", "exp2", "log", "log2", "sin", "cos", "rsqrt", "erf"):
            expr = f"tl.{fn}({a[0]})"
        elif fn == "sqrt":
            expr = f"tl.sqrt_rn({a[0]})" if in_dt == torch.float32 else f"tl.sqrt({a[0]})"
        elif fn == "sigmoid":
            expr = (self.helper("_sigmoid", [a[0], "INTERPRETED"]) if in_dt == torch.float32
                    else f"1.0 / (1.0 + tl.exp(-{a[0]}))")
        elif fn == "relu":
            expr = f"tl.where({a[0]} < 0, 0, {a[0]})"
        elif fn == "gelu":
            tanh = s.params.get("approximate", "none") == "tanh"
            if in_dt == torch.float32:
                expr = self.helper("_gelu_tanh" if tanh else "_gelu_erf", [a[0], "INTERPRETED"])
            elif tanh:
                inner = f"0.7978845608028654 * ({a[0]} + 0.044715 * {a[0]} * {a[0]} * {a[0]})"
                expr = f"0.5 * {a[0]} * (1.0 + {self.helper('_tanh', [inner])})"
            else:
                expr = f"0.5 * {a[0]} * (1.0 + tl.erf({a[0]} * 0.7071067811865476))"
        elif fn == "isnan":
            expr = f"{a[0]} != {a[0]}"
        elif fn == "isinf":
            expr = f'tl.abs({a[0]}) == float("inf")'
        elif fn in ("logical_and", "logical_or", "logical_xor"):
            op = {"logical_and": "&", "logical_or": "|", "logical_xor": "^"}[fn]
            expr = f"({a[0]} != 0) {op} ({a[1]} != 0)"
        elif fn == "logical_not":
            expr = f"{a[0]} == 0"
        elif fn == "bitwise_not":
            # xor with all ones (triton 3.6's interpreter cannot apply ~ to unsigned ints)
            ones = (1 << (8 * in_dt.itemsize)) - 1 if in_dt == torch.uint8 else -1
            expr = f"{a[0]} == 0" if in_dt == torch.bool else f"{a[0]} ^ {self.lit(ones, in_dt)}"
        elif fn == "where":
            expr = f"tl.where({a[0]}, {a[1]}, {a[2]})"
        elif fn == "cast":
            if dt == torch.bool:
                expr = f"{a[0]} != 0"
            elif dt == torch.bfloat16 and in_dt != torch.bfloat16:
                # through fp32 (exact from fp16/ints up to 2^24; eager also converts via float), then
                # the rounding helper: the interpreter truncates fp16 -> bf16 and reads ints as bits
                src = a[0] if in_dt == torch.float32 else f"{a[0]}.to(tl.float32)"
                expr = self.helper("_f32_to_bf16", [src, "INTERPRETED"])
            else:
                expr = f"{a[0]}.to({TL_DTYPE[dt]})"
        elif fn == "identity" and isinstance(s.args[0], Scalar):
            return self.lit(s.args[0].value, dt, block=True)
        elif fn == "identity":
            expr = a[0]
        elif fn == "iota":
            expr = a[-1]
        else:
            raise NotImplementedError(f"no Triton spelling for pointwise {fn}")
        return f"({expr}).to({TL_DTYPE[dt]})"

    def eviction(self, buffer: str) -> str | None:
        """A load's L2 policy: kept (``evict_last``) if this kernel's later loop or a later pipeline
        stage reads the buffer again; else ``evict_first`` if either knows it is streamed."""
        hints = {self.evict.get(buffer), self.stage_evict.get(buffer)} - {None}
        return "evict_last" if "evict_last" in hints else next(iter(hints), None)

    def helper(self, name: str, args) -> str:
        self.use_helper(name)
        return f"{name}({', '.join(args)})"

    def use_helper(self, name: str) -> None:
        """Print ``name`` and, transitively, the helpers it calls."""
        if name not in self.helpers:
            self.helpers.add(name)
            for dep in HELPER_USES[name]:
                self.use_helper(dep)

    # --- statements ---------------------------------------------------------------------
    def emit(self, s, indent: str) -> None:
        out = self.lines.append
        if isinstance(s, Load):
            m = self.mask([s.index], s.mask)
            mask = f", {m}, other=0" if m else ""
            index = self.index(s.index)
            # the pointer block must cover the mask's variables too; one element is a block of one
            mask_vars = {v.name for r in s.mask for v in r.expr.vars()} - {v.name for v in s.index.vars()}
            index += "".join(f" + 0 * {v}" for v in sorted(mask_vars))
            if s.index.is_const and not mask_vars:
                ones = "[" + ", ".join(["1"] * self.template.rank) + "]"  # the blocks' rank
                index = f"tl.full({ones}, {index}, tl.{self.k.schedule.index_dtype})"
            policy = self.eviction(s.buffer)
            policy = f', eviction_policy="{policy}"' if policy else ""
            out(f"{indent}{s.var} = tl.load({s.buffer} + ({index}){mask}{policy})")
            self.dtypes[s.var] = s.dtype
        elif isinstance(s, Compute) and s.fn == "cat":
            # one statement per piece, not one nested tl.where: a cat of many inputs would otherwise
            # exceed Python's 200 levels of nested parentheses
            *pieces, pos = [self.arg(x, block=True) for x in s.args]
            out(f"{indent}{s.var} = {pieces[-1]}")
            for piece, (_, hi) in reversed(list(zip(pieces[:-1], s.params["bounds"][:-1]))):
                out(f"{indent}{s.var} = tl.where({pos} < {hi}, {piece}, {s.var})")
            out(f"{indent}{s.var} = {s.var}.to({TL_DTYPE[s.dtype]})")
            self.dtypes[s.var] = s.dtype
        elif isinstance(s, Compute):
            out(f"{indent}{s.var} = {self.compute(s)}")
            self.dtypes[s.var] = s.dtype
        elif isinstance(s, IndexValue):
            out(f"{indent}{s.var} = {self.index(s.expr)}")
            self.dtypes[s.var] = torch.int64
        elif isinstance(s, Indirect):
            value = f"tl.where({s.value} < 0, {s.value} + {s.size}, {s.value})"
            m = self.mask(s.at)
            if m:  # lanes past the bounds address element 0, whatever their index value
                value = f"tl.where({m}, {value}, 0)"
            out(f"{indent}{s.var} = ({value}).to({TL_DTYPE[s.dtype]})")
            self.dtypes[s.var] = s.dtype
        elif isinstance(s, Masked):
            fill = self.lit(s.fill.value, s.fill.dtype)
            out(f"{indent}{s.var} = tl.where({self.mask([], s.mask) or 'True'}, {s.value}, {fill})")
            self.dtypes[s.var] = s.fill.dtype
        elif isinstance(s, Store):
            # the pointer block must have the value's shape: add the iteration variables it lacks
            used = {v.name for v in s.index.vars()}
            pad = [v for v in self.template.store_vars(s.inner) if v not in used]
            index = self.index(s.index) + "".join(f" + 0 * {v}" for v in pad)
            m = self.mask([s.index], names=pad)
            out(f"{indent}tl.store({s.buffer} + ({index}), {s.value}{', ' + m if m else ''})")
        else:  # a statement of the template's own (a scan, a TMA tile load)
            self.template.statement(self, s, indent)

    # --- the kernel ---------------------------------------------------------------------
    def function(self, stage: bool = False) -> str:
        """The kernel's ``@triton.jit`` function; a pipeline ``stage`` takes its program id as ``pid``."""
        k, sch = self.k, self.k.schedule
        params = [a.name for a in k.args] + (["pid"] if stage else []) + \
            [f"{b}: tl.constexpr" for b in (*sch.blocks, "INTERPRETED")]
        pid = "pid" if stage else "tl.program_id(0)"
        pid += ".to(tl.int64)" if sch.index_dtype == "int64" else ""
        for name, var in k.vars.items():
            self.lines.append(f"    {var.name.replace('index', '')}numel = {var.size}")
        self.template.emit_body(self, pid)
        body = [*self.lines[:len(k.vars)], *self.descriptors.values(), *self.lines[len(k.vars):]]
        return f"@triton.jit\ndef {k.name}({', '.join(params)}):\n" + "\n".join(body) + "\n"

    def source(self) -> str:
        function = self.function()
        header = f"# {self.k.name}: {', '.join(self.k.origins)}\n# schedule: {self.k.schedule}\n"
        return module_source(header, self.helpers, [function])

    def emit_phases(self, indent: str = "    ") -> None:
        """Every phase's statements in order (the body of a kernel without reductions)."""
        for phase in self.k.phases:
            for s in phase.outer + phase.inner:
                self.emit(s, indent)


def module_source(header: str, helpers: set[str], functions: list[str]) -> str:
    return (header + "import triton\nimport triton.language as tl\n" + "".join(HELPERS[h] for h in sorted(helpers))
            + "".join("\n\n" + f for f in functions))


def kernel_source(kernel: Kernel | StagedLaunch) -> str:
    """The Triton module of a kernel, or of a staged launch: its stages as functions and the kernel
    that runs them (a ``Pipeline`` hands out tickets; a ``SplitCombine`` counts partials done)."""
    if isinstance(kernel, Kernel):
        return TritonPrinter(kernel).source()
    p, helpers, functions = kernel, set(), []
    loads = [k.inputs for k in p.stages]
    for i, k in enumerate(p.stages):
        printer = TritonPrinter(k)
        # an input a later stage reads again stays in L2 for it; its last reader lets it go
        later, earlier = set().union(*loads[i + 1:]), set().union(*loads[:i])
        printer.stage_evict = {a.name: "evict_last" if a.node in later else "evict_first"
                               for a in k.args if a.node in later | earlier and not a.is_output}
        functions.append(printer.function(stage=True))
        helpers |= printer.helpers
    params = [f"s{i}_{a.name}" for i, k in enumerate(p.stages) for a in k.args]
    head = f"@triton.jit\ndef {p.name}({', '.join(params)}, sync, INTERPRETED: tl.constexpr):"
    body = _split_combine_body(p) if isinstance(p, SplitCombine) else _pipeline_body(p)
    functions.append("\n".join([head, *body]) + "\n")
    return module_source(f"# {p}\n", helpers, functions)


def _stage_call(p: StagedLaunch, i: int, pid: str) -> str:
    k = p.stages[i]
    args = ", ".join(f"s{i}_{a.name}" for a in k.args)
    blocks = ", ".join(f"{b}={v}" for b, v in k.schedule.blocks.items())
    return f"{k.name}({args}, {pid}, {blocks}, INTERPRETED=INTERPRETED)"


def _pipeline_body(p: Pipeline) -> list[str]:
    total = sum(p.tiles)
    body = ["    # sync[0]: tickets drawn by all launches so far; sync[1 + k * rows + row]: programs of stage k",
            f"    # done on row, in all launches. Never reset: launch e draws tickets e*{p.programs} and up",
            "    ticket = tl.atomic_add(sync, 1)",
            f"    epoch = ticket // {p.programs}",
            f"    ticket = (ticket - epoch * {p.programs}).to(tl.int32)",
            f"    step = ticket // {total}",
            f"    slot = ticket % {total}"]
    first = 0
    for i, tiles in enumerate(p.tiles):
        body += [f"    if (slot >= {first}) & (slot < {first + tiles}):",
                 f"        row = step - {i * p.lag}",
                 f"        if (row >= 0) & (row < {p.rows}):"]
        if i > 0:  # wait for the previous stage's programs on this row (all hold smaller tickets)
            body += [f"            while tl.atomic_add(sync + {1 + (i - 1) * p.rows} + row, 0, sem=\"acquire\") "
                     f"< (epoch + 1) * {p.tiles[i - 1]}:",
                     "                pass",
                     "            tl.debug_barrier()"]
        body.append(f"            {_stage_call(p, i, f'row * {tiles} + slot - {first}')}")
        if i < len(p.stages) - 1:  # every thread's stores first, then one release of the row
            body += ["            tl.debug_barrier()",
                     f"            tl.atomic_add(sync + {1 + i * p.rows} + row, 1, sem=\"release\")"]
        first += tiles
    return body


def _split_combine_body(p: SplitCombine) -> list[str]:
    return ["    # sync[g]: partial programs of group g done, in all launches (never reset)",
            "    pid = tl.program_id(0)",
            f"    {_stage_call(p, 0, 'pid')}",
            "    tl.debug_barrier()  # every thread's partials stored, then one release",
            f"    group = (pid % {p.span}) // {p.width}",
            f"    if tl.atomic_add(sync + group, 1, sem=\"acq_rel\") % {p.per_group} == {p.per_group - 1}:",
            "        tl.debug_barrier()  # the last of its group: all of the group's partials are there",
            f"        {_stage_call(p, 1, 'group')}"]
