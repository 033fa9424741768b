"""How each pointwise op of ``ir/ops.py`` is written in Triton: ``SPELLINGS[fn](operands)``.

A spelling returns an expression, which the printer casts to the result's dtype
(``v = (expr).to(tl.float32)``); a ``Typed`` expression, already of that dtype, printed as it is; or
a list of statements that assign the statement's variable themselves (``cat``). Variants by dtype (an integer
floor division, an fp32-only fast path) live inside an op's spelling; math that ``tl`` lacks calls
a helper of ``codegen/helpers.py`` through ``operands.helper``, which prints it with the kernel.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..ir.graph import Scalar
from ..ir.kernel import Compute
from ..ir.types import is_float
from .literals import TL_DTYPE


class Typed(str):
    """An expression that already has the result's dtype: printed without the closing cast."""


@dataclass
class Operands:
    """What a spelling sees of one ``Compute`` statement."""
    stmt: Compute
    a: list[str]             # the args: variables, or Python literals where Triton types those right
    blocks: list[str]        # the same, constants as blocks (helpers want tensors, not Python numbers)
    in_dtype: torch.dtype    # the dtype the op computes in (its first typed input's)
    printer: Any             # the TritonPrinter: helpers and literals of the kernel's rank

    @property
    def dtype(self) -> torch.dtype:
        return self.stmt.dtype

    @property
    def floating(self) -> bool:
        return is_float(self.in_dtype)

    def helper(self, name: str, args) -> str:
        """A call of helper ``name`` (printed with the kernel)."""
        return self.printer.helper(name, args)

    def lit(self, value, dtype: torch.dtype, block: bool = False) -> str:
        return self.printer.lit(value, dtype, block)


Spelling = Callable[[Operands], "str | Typed | list[str]"]


def statements(s: Compute, printer) -> list[str]:
    """The statements that compute ``s`` into ``s.var``."""
    spell = SPELLINGS.get(s.fn)
    if spell is None:
        raise NotImplementedError(f"no Triton spelling for pointwise {s.fn}")
    in_dt = next((printer.dtypes[x] for x in s.args if isinstance(x, str) and x in printer.dtypes),
                 next((x.dtype for x in s.args if isinstance(x, Scalar)), s.dtype))
    o = Operands(s, [printer.arg(x) for x in s.args], [printer.arg(x, block=True) for x in s.args], in_dt, printer)
    text = spell(o)
    if isinstance(text, list):
        return text
    if isinstance(text, Typed):
        return [f"{s.var} = {text}"]
    return [f"{s.var} = ({text}).to({TL_DTYPE[s.dtype]})"]


def _infix(symbol: str) -> Spelling:
    return lambda o: f"{o.a[0]} {symbol} {o.a[1]}"


def _call(name: str) -> Spelling:
    """``name(x)``: a ``tl`` function of one argument."""
    return lambda o: f"{name}({o.a[0]})"


def _helper(name: str) -> Spelling:
    return lambda o: o.helper(name, o.a)


def _float_or_int(on_float: Spelling, on_int: Spelling) -> Spelling:
    return lambda o: on_float(o) if o.floating else on_int(o)


def _gelu(o: Operands) -> str:
    x, tanh = o.a[0], o.stmt.params.get("approximate", "none") == "tanh"
    if o.in_dtype == torch.float32:
        return o.helper("_gelu_tanh" if tanh else "_gelu_erf", [x, "INTERPRETED"])
    if tanh:
        inner = f"0.7978845608028654 * ({x} + 0.044715 * {x} * {x} * {x})"
        return f"0.5 * {x} * (1.0 + {o.helper('_tanh', [inner, 'INTERPRETED'])})"
    return f"0.5 * {x} * (1.0 + tl.erf({x} * 0.7071067811865476))"


def _pow(o: Operands) -> str:
    """The exponents eager's pow computes without exp/log (2, 3, -1), the same way; others through
    exp2/log2 with the sign rules (the ``_pow`` helper). (0.5 is a square root in eager for some
    dtypes and devices only: pow(-inf, 0.5) is inf on the CPU in fp16, nan in fp32.)"""
    x, e = o.a[0], o.stmt.args[1]
    exponent = e.value if isinstance(e, Scalar) and type(e.value) in (int, float) else None
    if exponent == 2:
        return f"{x} * {x}"
    if exponent == 3:
        return f"{x} * {x} * {x}"
    if o.floating and exponent == -1:
        return f"1.0 / {x}"
    return o.helper("_pow", o.blocks)


def _sign(o: Operands) -> str:
    x, to = o.a[0], TL_DTYPE[o.dtype]
    return f"({x} > 0).to({to}) - ({x} < 0).to({to})"


def _bitwise_not(o: Operands) -> str:
    # xor with all ones (triton 3.6's interpreter cannot apply ~ to unsigned ints)
    if o.in_dtype == torch.bool:
        return f"{o.a[0]} == 0"
    ones = (1 << (8 * o.in_dtype.itemsize)) - 1 if o.in_dtype == torch.uint8 else -1
    return f"{o.a[0]} ^ {o.lit(ones, o.in_dtype)}"


def _cast(o: Operands) -> str:
    x, dt, in_dt = o.a[0], o.dtype, o.in_dtype
    if dt == torch.bool:
        return f"{x} != 0"
    if dt == torch.bfloat16 and in_dt != torch.bfloat16:
        # through fp32 (exact from fp16/ints up to 2^24; eager also converts via float), then the
        # rounding helper: the interpreter truncates fp16 -> bf16 and reads ints as bits
        return o.helper("_f32_to_bf16", [x if in_dt == torch.float32 else f"{x}.to(tl.float32)", "INTERPRETED"])
    return f"{x}.to({TL_DTYPE[dt]})"


def _identity(o: Operands) -> str:
    first = o.stmt.args[0]
    if isinstance(first, Scalar):  # a fill: a block of the constant, of the kernel's rank
        return Typed(o.lit(first.value, o.dtype, block=True))
    return o.a[0]


def _divides(spell: Spelling) -> Spelling:
    """An integer division (``OpDef.divides``). In an interpreted kernel a check comes first, which
    raises eager's CPU error where a lane that holds one of the node's elements (``Compute.at``,
    ``Compute.mask``) divides by zero. Compiled kernels divide without a check, as CUDA eager does,
    and give its values (the GPU's integer division: int32 ``7 // 0``, ``7 % 0`` and ``-7 // 0`` are -1,
    -1 and -2; the same for int8 to int64 and every rounding mode, compared on an H200)."""
    def spelled(o: Operands):
        text, divisor = spell(o), o.stmt.args[1]
        if o.floating or not o.printer.k.schedule.interpreted or (isinstance(divisor, Scalar) and divisor.value):
            return text
        lanes = o.printer.mask(o.stmt.at, o.stmt.mask) or "True"
        return [o.helper("_check_divisor", [o.blocks[1], lanes]), f"{o.stmt.var} = ({text}).to({TL_DTYPE[o.dtype]})"]
    return spelled


def _cat(o: Operands) -> list[str]:
    # one statement per piece, not one nested tl.where: a cat of many inputs would otherwise exceed
    # Python's 200 levels of nested parentheses. The last arg is the coordinate along the cat's dim.
    v, (*pieces, pos) = o.stmt.var, o.blocks
    lines = [f"{v} = {pieces[-1]}"]
    for piece, (_, hi) in reversed(list(zip(pieces[:-1], o.stmt.params["bounds"][:-1]))):
        lines.append(f"{v} = tl.where({pos} < {hi}, {piece}, {v})")
    return lines + [f"{v} = {v}.to({TL_DTYPE[o.dtype]})"]


def _isnan(o: Operands) -> str:
    """``x != x``; of bf16 in fp32 (exact): Triton's interpreter compares bf16 as bits, NaN equal to itself."""
    x = f"{o.a[0]}.to(tl.float32)" if o.in_dtype == torch.bfloat16 else o.a[0]
    return f"{x} != {x}"


SPELLINGS: dict[str, Spelling] = {
    # arithmetic
    "add": _infix("+"), "sub": _infix("-"), "mul": _infix("*"), "truediv": _infix("/"),
    "floordiv": _divides(_float_or_int(lambda o: f"tl.math.floor({o.a[0]} / {o.a[1]})",
                                       lambda o: o.helper("_floordiv_int", o.blocks))),
    "truncdiv": _divides(_float_or_int(lambda o: o.helper("_trunc", [f"{o.a[0]} / {o.a[1]}"]), _infix("//"))),
    "remainder": _divides(lambda o: o.helper("_remainder_float" if o.floating else "_remainder_int", o.blocks)),
    "fmod": _divides(_float_or_int(lambda o: o.helper("_fmod_float", o.blocks), _infix("%"))),
    "pow": _pow,
    "maximum": _float_or_int(lambda o: o.helper("_max_nan", o.blocks), lambda o: f"tl.maximum({o.a[0]}, {o.a[1]})"),
    "minimum": _float_or_int(lambda o: o.helper("_min_nan", o.blocks), lambda o: f"tl.minimum({o.a[0]}, {o.a[1]})"),
    "neg": lambda o: f"-{o.a[0]}", "abs": _call("tl.abs"), "reciprocal": lambda o: f"1.0 / {o.a[0]}",
    "sign": _sign, "floor": _call("tl.math.floor"), "ceil": _call("tl.math.ceil"),
    "trunc": _helper("_trunc"), "round": _helper("_round"),
    # transcendental
    "exp": _call("tl.exp"), "exp2": _call("tl.exp2"), "log": _call("tl.log"),
    "expm1": lambda o: o.helper("_expm1", [o.a[0], "INTERPRETED"]),
    "log2": _call("tl.log2"), "log1p": _helper("_log1p"), "rsqrt": _call("tl.rsqrt"),
    "sqrt": lambda o: f"tl.sqrt_rn({o.a[0]})" if o.in_dtype == torch.float32 else f"tl.sqrt({o.a[0]})",
    "sin": _call("tl.sin"), "cos": _call("tl.cos"), "tan": lambda o: f"tl.sin({o.a[0]}) / tl.cos({o.a[0]})",
    "tanh": lambda o: o.helper("_tanh", [o.a[0], "INTERPRETED"]), "erf": _call("tl.erf"),
    "sigmoid": lambda o: (o.helper("_sigmoid", [o.a[0], "INTERPRETED"]) if o.in_dtype == torch.float32
                          else f"1.0 / (1.0 + tl.exp(-{o.a[0]}))"),
    "relu": lambda o: f"tl.where({o.a[0]} < 0, 0, {o.a[0]})", "gelu": _gelu,
    # comparisons and logic
    "eq": _infix("=="), "ne": _infix("!="), "lt": _infix("<"), "le": _infix("<="), "gt": _infix(">"),
    "ge": _infix(">="), "isnan": lambda o: _isnan(o),
    "isinf": lambda o: f'tl.abs({o.a[0]}) == float("inf")',
    "logical_and": lambda o: f"({o.a[0]} != 0) & ({o.a[1]} != 0)",
    "logical_or": lambda o: f"({o.a[0]} != 0) | ({o.a[1]} != 0)",
    "logical_xor": lambda o: f"({o.a[0]} != 0) ^ ({o.a[1]} != 0)",
    "logical_not": lambda o: f"{o.a[0]} == 0",
    "bitwise_and": _infix("&"), "bitwise_or": _infix("|"), "bitwise_xor": _infix("^"), "bitwise_not": _bitwise_not,
    # selection and conversion
    "where": lambda o: f"tl.where({o.a[0]}, {o.a[1]}, {o.a[2]})", "cast": _cast, "identity": _identity,
    "cat": _cat,
    "iota": lambda o: o.a[-1],  # schedule passes the coordinate as the (only) arg
}
