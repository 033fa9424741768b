"""Random programs of pointwise, comparison, cast, reduction, view, matmul and indexing ops (gather,
index_select, embedding, advanced indexing, with random in-range int64 indices as inputs) on inputs of
random dtypes (float32, float16, bfloat16, int32, bool), sizes (some dims of size 0) and layouts
(contiguous, transposed, sliced with a step, expanded, with a storage offset, a window of a larger
tensor: an offset and non-contiguous strides), compiled and compared with eager; a second property runs the
programs with a backward (float inputs require grad, the outputs are weighted by random numbers and
summed) and compares every input's gradient with eager's.

A program is a list of steps, each appending one tensor to a pool; ``Program.source`` prints it as a
self-contained Python module (``f`` and ``make_inputs``), so a failure reads as a reproducer. CI runs
a bounded, derandomized sample; a longer run:

    MINICOMP_FUZZ_EXAMPLES=500 python -m pytest -q tests/test_fuzz.py
    MINICOMP_FUZZ_EXAMPLES=500 MINICOMP_FUZZ_SEED=1 python -m pytest -q tests/test_fuzz.py  # other programs
    MINICOMP_FUZZ_GRAD_EXAMPLES=200 python -m pytest -q tests/test_fuzz.py -k gradients

When the property fails, the minimal (shrunk) program is written to
``tests/regressions/fuzz_<hash>.py`` (``MINICOMP_FUZZ_SAVE=0`` turns that off), where
``tests/test_regressions.py`` replays it from then on. Known, unfixed bugs are listed in
``KNOWN_BUGS``: the generator steers around them (``MINICOMP_FUZZ_KNOWN_BUGS=1`` does not).
"""
from __future__ import annotations

import hashlib
import importlib.util
import math
import os
import re
import textwrap
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
import torch.utils._pytree as pytree
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

import minicomp
from tests.utils import LOW_PRECISION, tolerances

REGRESSIONS = Path(__file__).resolve().parent / "regressions"

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "int32": torch.int32, "bool": torch.bool}
LAYOUTS = ("contiguous", "transposed", "strided", "expanded", "offset", "window")

# Ops by kind. ``EXACT_OPS`` give bit-identical results however they are computed (no rounding
# beyond one final one that eager makes too), so comparisons of their results are stable: a
# comparison or ``where`` condition is only built on such values (a float computed in a different
# order may land on the other side of a comparison, which is not a bug).
UNARY = {"exp": "torch.exp({})", "relu": "torch.relu({})", "neg": "-{}", "abs": "torch.abs({})",
         "sigmoid": "torch.sigmoid({})", "tanh": "torch.tanh({})", "half": "({}).to(torch.bfloat16).float()"}
CAST = {"float": "{}.float()", "f16": "{}.half()", "bf16": "{}.bfloat16()"}
BINARY = {"add": "{} + {}", "mul": "{} * {}", "sub": "{} - {}", "max": "torch.maximum({}, {})"}
COMPARE = {"gt": "{} > {}", "le": "{} <= {}", "eq": "{} == {}", "ne": "{} != {}"}
REDUCE = {"sum": "{}.sum({}, keepdim={})", "amax": "{}.amax({}, keepdim={})", "mean": "{}.mean({}, keepdim={})"}
VIEW = {"t": "{}.transpose(0, -1)", "flat": "{}.reshape(-1)", "unsq": "{}.unsqueeze(0)", "step": "{}[::2]",
        "flip": "{}.flip(0)", "tail": "{}[..., 1:]", "expand": "{}.expand(2, {})"}
# Reads at random in-range indices (``Program.indices``, ``i0, i1, ...``): ``{x}`` the data, ``{d}`` a dim of
# it, ``{i}`` the index tensor, whose shape and value range ``_index_input`` draws for each op
INDEX = {"index_select": "{x}.index_select({d}, {i})", "gather": "torch.gather({x}, {d}, {i})",
         "embedding": "torch.nn.functional.embedding({i}, {x})", "getitem": "{x}[{i}]", "getitem1": "{x}[:, {i}]"}
EXACT_OPS = {"relu", "neg", "abs", "half", "max", "amax", *CAST, *COMPARE, *VIEW, *INDEX, "where"}
KINDS = ("unary", "cast", "binary", "compare", "where", "reduce", "view", "matmul", "index")

# Known, unfixed minicomp bugs the generator steers around, so that the CI sample stays green and long
# runs find new bugs; each has a strictly-xfailed case in tests/regressions/. Set
# MINICOMP_FUZZ_KNOWN_BUGS=1 to generate them anyway (e.g. to check a fix).
KNOWN_BUGS: dict = {}  # none open of this kind: the three the fuzzer found are fixed (tests/regressions/)


def _steering() -> bool:
    return os.environ.get("MINICOMP_FUZZ_KNOWN_BUGS", "0") in ("", "0")


def _known_bug(op: str, operands: list, out: torch.Tensor) -> str | None:
    if not _steering():
        return None
    return next((name for name, hit in KNOWN_BUGS.items() if hit(op, operands, out)), None)


# --- programs -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Input:
    """How one input is made: values of ``dtype`` in a base tensor, then a layout transform that
    leaves a view of logical shape ``shape``. ``arg``: the sliced dim (strided), the bit mask of
    broadcast dims (expanded), the storage offset (offset) or the start of the window in every dim
    (window). An index input (``high`` set) holds int64 values in ``[low, high)``."""
    shape: tuple[int, ...]
    dtype: torch.dtype
    layout: str = "contiguous"
    arg: int = 0
    low: int = 0
    high: int | None = None

    def base_shape(self) -> tuple[int, ...]:
        s = self.shape
        if self.layout == "transposed":
            return (s[-1], *s[1:-1], s[0]) if len(s) > 1 else s
        if self.layout == "strided":
            return tuple(2 * n if d == self.arg else n for d, n in enumerate(s))
        if self.layout == "expanded":
            return tuple(1 if self.arg >> d & 1 else n for d, n in enumerate(s))
        if self.layout == "offset":
            return (math.prod(s) + self.arg,)
        if self.layout == "window":
            return tuple(n + self.arg for n in s)
        return s

    def transform(self) -> str:
        s = self.shape
        if self.layout == "transposed" and len(s) > 1:
            return ".transpose(0, -1)"
        if self.layout == "strided":
            return "[" + ", ".join([":"] * self.arg + ["::2"]) + "]"
        if self.layout == "expanded":
            return f".expand({', '.join(map(str, s))})"
        if self.layout == "offset":
            return f"[{self.arg}:].view({', '.join(map(str, s))}{',' if len(s) == 1 else ''})"
        if self.layout == "window":
            return "[" + ", ".join([f"{self.arg}:"] * len(s)) + "]"
        return ""

    def text(self) -> str:
        base = ", ".join(map(str, self.base_shape()))
        if self.high is not None:
            size = f"({base},)" if len(self.base_shape()) == 1 else f"({base})"
            return f"torch.randint({self.low}, {self.high}, {size})" + self.transform()
        if self.dtype == torch.bool:
            values = f"(torch.rand({base}) > 0.5)"
        elif self.dtype.is_floating_point:
            values = f"torch.randn({base})" if self.dtype == torch.float32 else \
                f"torch.randn({base}, dtype={self.dtype})"
        else:
            size = f"({base},)" if len(self.base_shape()) == 1 else f"({base})"
            values = f"torch.randint(-4, 5, {size}, dtype={self.dtype})"
        return values + self.transform()

    def describe(self) -> str:
        values = f" in [{self.low}, {self.high})" if self.high is not None else ""
        return f"{str(self.dtype).replace('torch.', '')} {list(self.shape)} {self.layout}{values}"


@dataclass
class Program:
    inputs: list[Input]
    steps: list[str]  # each a Python expression over v0, v1, ... (earlier pool entries) and i0, i1, ...
    indices: list[Input] = field(default_factory=list)  # the index inputs i0, i1, ..., after the inputs

    def outputs(self) -> list[str]:
        """The step results no later step uses (so no step is dead code), the last one included."""
        first = len(self.inputs)
        used = {int(m) for s in self.steps for m in re.findall(r"\bv(\d+)\b", s)}
        return [f"v{first + k}" for k in range(len(self.steps)) if first + k not in used]

    def function_text(self) -> str:
        args = ", ".join([f"v{k}" for k in range(len(self.inputs))] + [f"i{k}" for k in range(len(self.indices))])
        body = [f"    v{len(self.inputs) + k} = {s}" for k, s in enumerate(self.steps)]
        return f"def f({args}):\n" + "\n".join(body) + f"\n    return {', '.join(self.outputs())}\n"

    def inputs_text(self) -> str:
        made = [f"        {i.text()},  # v{k}: {i.describe()}" for k, i in enumerate(self.inputs)]
        made += [f"        {i.text()},  # i{k}: {i.describe()}" for k, i in enumerate(self.indices)]
        return "def make_inputs():\n    torch.manual_seed(0)\n    return [\n" + "\n".join(made) + "\n    ]\n"

    def source(self) -> str:
        """A self-contained module: ``f`` (the program) and ``make_inputs()`` (its arguments)."""
        return f"import torch\n\n\n{self.function_text()}\n\n{self.inputs_text()}"

    text = source

    def namespace(self) -> dict:
        scope: dict = {}
        exec(compile(self.source(), "<fuzz program>", "exec"), scope)
        return scope


@dataclass
class Entry:
    """A pool entry while generating: a small stand-in tensor (its shape and dtype), whether its
    values are exact (see ``EXACT_OPS``) and whether a reshape is among the steps that made it."""
    like: torch.Tensor
    exact: bool
    reshaped: bool = False


def _try(op: str, expr: str, pool: list[Entry], operands: list[int], indices: dict | None = None):
    """The stand-in result of ``expr`` over the pool, or None where eager rejects it (or where it
    would hit a known bug, see ``KNOWN_BUGS``). ``operands``: the pool entries whose values it uses;
    ``indices``: stand-ins of the index inputs it names."""
    try:
        out = eval(expr, {"torch": torch}, {**{f"v{k}": e.like for k, e in enumerate(pool)}, **(indices or {})})
    except (RuntimeError, TypeError, ValueError, IndexError):
        return None
    if not isinstance(out, torch.Tensor) or _known_bug(op, [pool[k] for k in operands], out):
        return None
    return out


def _choose(draw, table: dict, fill, pool: list[Entry], operands: list[int]) -> tuple[str, str, torch.Tensor] | None:
    """Draw one of ``table``'s ops that eager accepts on these operands."""
    valid = []
    for name in sorted(table):
        expr = fill(table[name])
        out = _try(name, expr, pool, operands)
        if out is not None:
            valid.append((name, expr, out))
    return draw(st.sampled_from(valid)) if valid else None


@st.composite
def inputs(draw) -> Input:
    shape = list(draw(st.lists(st.integers(1, 6), min_size=1, max_size=3)))
    if draw(st.integers(0, 4)) == 4:  # now and then a dim of size 0 (shrinks to none)
        shape[draw(st.integers(0, len(shape) - 1))] = 0
    # float32 and contiguous come first (what inputs shrink to), and twice as often as the others
    dtype = DTYPES[draw(st.sampled_from(["float32", *DTYPES]))]
    return Input(tuple(shape), dtype, *draw(layouts(len(shape))))


@st.composite
def layouts(draw, ndim: int) -> tuple[str, int]:
    """A layout for an input of ``ndim`` dims and its ``arg`` (see ``Input``)."""
    layout = draw(st.sampled_from(["contiguous", *LAYOUTS]))
    arg = 0
    if layout == "transposed" and ndim == 1:
        layout = "contiguous"
    elif layout == "strided":
        arg = draw(st.integers(0, ndim - 1))
    elif layout == "expanded":
        arg = draw(st.integers(1, 2 ** ndim - 1))
    elif layout in ("offset", "window"):
        arg = draw(st.integers(1, 3 if layout == "offset" else 2))
    return layout, arg


def _index_step(draw, x: str, shape: tuple[int, ...], pool: list[Entry], k: int, indices: list[Input]):
    """A read of ``x`` (pool entry ``k``) at random in-range indices, and the index input it reads them
    from (appended to ``indices`` when eager accepts the op)."""
    op = draw(st.sampled_from(sorted(INDEX)))
    if op == "getitem1" and len(shape) < 2:
        return None
    if op == "embedding" and len(shape) != 2:  # a table of rows: the entry's leading dims flattened
        shape = (math.prod(shape[:-1]), shape[-1]) if len(shape) > 2 else (shape[0], 1)
        x = f"{x}.reshape({shape[0]}, {shape[1]})"
    fixed = {"embedding": 0, "getitem": 0, "getitem1": 1}  # the dim each of these indexes
    d = fixed[op] if op in fixed else draw(st.integers(0, len(shape) - 1))
    n = shape[d]
    m = draw(st.integers(0, 5)) if n else 0  # an index into a dim of size 0 must be empty
    if op == "gather":
        ishape = tuple(m if a == d else s for a, s in enumerate(shape))
    elif op == "embedding":
        ishape = (m, *draw(st.lists(st.integers(0, 4), max_size=1)))
    else:
        ishape = (m,)
    low = -n if op.startswith("getitem") else 0  # advanced indexing wraps negative indices; the others raise
    index = Input(ishape, torch.int64, *draw(layouts(len(ishape))), low=low, high=max(n, 1))
    name = f"i{len(indices)}"
    expr = INDEX[op].format(x=x, d=d, i=name)
    out = _try(op, expr, pool, [k], {name: torch.zeros(ishape, dtype=torch.int64)})
    if out is None:
        return None
    indices.append(index)
    return op, expr, out


@st.composite
def programs(draw) -> Program:
    ins = [draw(inputs()) for _ in range(draw(st.integers(1, 2)))]
    pool = [Entry(torch.zeros(i.shape, dtype=i.dtype), True) for i in ins]
    steps, indices = [], []
    for _ in range(draw(st.integers(1, 6))):
        k = len(pool) - 1 - draw(st.integers(0, len(pool) - 1))  # shrinks to the latest entry: chains
        x, shape = f"v{k}", tuple(pool[k].like.shape)
        kind = draw(st.sampled_from(KINDS))
        partners = [j for j, e in enumerate(pool) if _broadcastable(tuple(e.like.shape), shape)]
        j = draw(st.sampled_from(partners))
        exact = pool[k].exact and pool[j].exact
        chosen = None
        if kind in ("unary", "cast"):
            chosen = _choose(draw, UNARY if kind == "unary" else CAST, lambda t: t.format(x), pool, [k])
        elif kind in ("binary", "compare") and (kind == "binary" or exact):
            chosen = _choose(draw, BINARY if kind == "binary" else COMPARE, lambda t: t.format(x, f"v{j}"), pool,
                             [k, j])
        elif kind == "where" and exact:
            conds = [c for c, e in enumerate(pool) if e.exact and _broadcastable(tuple(e.like.shape), shape)]
            c = draw(st.sampled_from(conds))
            cond = f"v{c}" if pool[c].like.dtype == torch.bool else f"v{c} > 0"
            expr = f"torch.where({cond}, {x}, v{j})"
            out = _try("where", expr, pool, [k, j])
            chosen = ("where", expr, out) if out is not None else None
        elif kind == "reduce":
            dim = draw(st.integers(-len(shape), len(shape) - 1))
            keep = draw(st.booleans())
            chosen = _choose(draw, REDUCE, lambda t: t.format(x, dim, keep), pool, [k])
            if chosen is not None and chosen[2].dim() == 0:
                chosen = (chosen[0], f"({chosen[1]}).reshape(1)", chosen[2].reshape(1))
        elif kind == "view":
            chosen = _choose(draw, VIEW, lambda t: t.format(x, ", ".join(map(str, shape))), pool, [k])
        elif kind == "matmul":
            n = draw(st.integers(1, 6))
            expr = f"{x}.reshape(-1, {shape[-1]}) @ torch.ones({shape[-1]}, {n}).cumsum(0).to({x}.dtype)"
            out = _try("matmul", expr, pool, [k])
            chosen = ("matmul", expr, out) if out is not None else None
        elif kind == "index":
            chosen = _index_step(draw, x, shape, pool, k, indices)
        if chosen is None:  # not valid for these operands (e.g. -bool, mean of int32): a view
            chosen = _choose(draw, VIEW, lambda t: t.format(x, ", ".join(map(str, shape))), pool, [k]) or \
                ("view", f"{x}.clone()", pool[k].like.clone())
        name, expr, out = chosen
        operands_exact = exact if name in BINARY or name in COMPARE or name == "where" else pool[k].exact
        steps.append(expr)
        used = [pool[int(m)] for m in re.findall(r"\bv(\d+)\b", expr)]
        pool.append(Entry(torch.zeros_like(out, memory_format=torch.contiguous_format),
                          operands_exact and (name in EXACT_OPS or not out.is_floating_point()),
                          "reshape(" in expr or any(e.reshaped for e in used)))
    return Program(ins, steps, indices)


def _broadcastable(a, b) -> bool:
    try:
        torch.broadcast_shapes(a, b)
        return True
    except RuntimeError:
        return False


# --- checking -------------------------------------------------------------------------------------

def _upcast(a):
    return a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a


def assert_matches(actual: torch.Tensor, expected: torch.Tensor, reference=None, computed_in=None) -> None:
    """``actual`` (minicomp) must equal ``expected`` (eager): same dtype and shape, values within
    ``tolerances(dtype)`` (of ``computed_in`` where that is coarser: a float32 gradient through a
    float16 cast holds float16's precision), NaN where eager has NaN. Where they differ by more,
    ``reference()`` (the program run in float64) decides: minicomp passes if it is at most twice as far
    from it as eager is (plus the tolerance), because eager rounds every intermediate to
    float16/bfloat16 and minicomp, like Inductor, keeps fused intermediates in float32."""
    assert actual.dtype == expected.dtype, f"dtype {actual.dtype} != eager {expected.dtype}"
    assert actual.shape == expected.shape, f"shape {tuple(actual.shape)} != eager {tuple(expected.shape)}"
    coarser = computed_in is not None and expected.is_floating_point() and \
        torch.finfo(computed_in).eps > torch.finfo(expected.dtype).eps
    tol = tolerances(computed_in if coarser else expected.dtype)
    try:
        torch.testing.assert_close(actual, expected, equal_nan=True, **tol)
        return
    except AssertionError as e:
        first = e
        if expected.numel() <= 16:
            first = AssertionError(f"{e}\nminicomp: {actual.tolist()}\neager:    {expected.tolist()}")
        if reference is None or not expected.is_floating_point():
            raise first from None
    ref = reference().double()
    a, x = actual.double(), expected.double()
    bound = 2 * (x - ref).abs() + tol["atol"] + tol["rtol"] * ref.abs()
    ok = ((a - ref).abs() <= bound) | (a == x) | (a.isnan() & x.isnan())
    if expected.dtype in LOW_PRECISION:  # the float64 value overflows the dtype: inf or max both fine
        ok |= (ref.abs() >= torch.finfo(expected.dtype).max) & (a.abs() >= torch.finfo(expected.dtype).max)
    if not bool(ok.all()):
        raise AssertionError(f"{first}\n(also further than twice eager's error from the float64 result)")


def check_against_eager(fn, make_inputs) -> None:
    """Compile ``fn`` with minicomp; its results on ``make_inputs()`` must match eager's (see
    ``assert_matches``), with no graph falling back to PyTorch as a whole."""
    torch._dynamo.reset()
    args = make_inputs()
    expected = fn(*args)
    earlier = minicomp.reports()  # kept alive, so that their ids are not reused
    before = {id(r) for r in earlier}
    actual = minicomp.compile(fn)(*args)
    for r in minicomp.reports():
        assert id(r) in before or r.whole_graph_fallback is None, f"whole graph fell back: {r.whole_graph_fallback}"
    exp_leaves, act_leaves = pytree.tree_leaves(expected), pytree.tree_leaves(actual)
    assert len(exp_leaves) == len(act_leaves), (len(act_leaves), len(exp_leaves))
    references = None
    for i, (a, e) in enumerate(zip(act_leaves, exp_leaves)):
        def reference(i=i):
            nonlocal references
            if references is None:
                references = pytree.tree_leaves(fn(*[_upcast(x) for x in make_inputs()]))
            return references[i]
        try:
            assert_matches(a, e, reference)
        except AssertionError as error:
            raise AssertionError(f"output {i}: {error}") from None


def check_program(program: Program) -> None:
    scope = program.namespace()
    check_against_eager(scope["f"], scope["make_inputs"])


class _Precisions(TorchDispatchMode):
    """The floating dtypes of every tensor the ops under it make."""

    def __init__(self):
        super().__init__()
        self.dtypes: set = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.dtypes.update(t.dtype for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.is_floating_point())
        return out


def _coarsest(dtypes) -> torch.dtype | None:
    return max(dtypes, key=lambda d: torch.finfo(d).eps, default=None)


def _backward(fn, inputs: list, upcast: bool = False) -> tuple[list, list]:
    """Float ``inputs`` become leaves that require grad (``detach`` keeps their layout: strides,
    offset, broadcast dims); every output that requires grad is weighted by random numbers (seeded:
    the same for eager, minicomp and the float64 run) and the sum backpropagated. Returns the outputs
    and each float input's ``.grad`` (None where no gradient reached it). ``upcast``: float inputs
    in float64."""
    leaves = [(_upcast(x) if upcast else x).detach().requires_grad_() if x.is_floating_point() else x
              for x in inputs]
    outputs = pytree.tree_leaves(fn(*leaves))
    outs = [o for o in outputs if isinstance(o, torch.Tensor) and o.requires_grad]
    gen = torch.Generator().manual_seed(0)
    weights = [torch.randn(o.shape, generator=gen) for o in outs]
    if outs:
        sum((o.double() * w).sum() for o, w in zip(outs, weights)).backward()
    return [o.detach() for o in outputs], [x.grad for x in leaves if x.is_floating_point()]


def check_gradients_against_eager(fn, make_inputs) -> None:
    """``fn`` with a backward (see ``_backward``), compiled with minicomp: its outputs and every float
    input's gradient must match eager's (see ``assert_matches``; a float64 run decides differences
    beyond the tolerance), with no graph falling back to PyTorch as a whole."""
    torch._dynamo.reset()
    with _Precisions() as made:  # eager's float16 backward kernels on the CPU round more often than its
        expected, expected_grads = _backward(fn, make_inputs())  # CUDA ones and minicomp: float16's tolerance
    earlier = minicomp.reports()  # kept alive, so that their ids are not reused
    before = {id(r) for r in earlier}
    actual, actual_grads = _backward(minicomp.compile(fn), make_inputs())
    for r in minicomp.reports():
        assert id(r) in before or r.whole_graph_fallback is None, f"whole graph fell back: {r.whole_graph_fallback}"
    assert len(actual) == len(expected), (len(actual), len(expected))
    references = None

    def reference(i: int):
        nonlocal references
        if references is None:
            outs, grads = _backward(fn, make_inputs(), upcast=True)
            references = outs + grads
        return references[i]
    labels = [f"output {i}" for i in range(len(expected))] + [f"gradient of input {i}" for i in range(len(expected_grads))]
    for i, (a, e, label) in enumerate(zip(actual + actual_grads, expected + expected_grads, labels)):
        try:
            assert (a is None) == (e is None), f"{'no' if a is None else 'a'} gradient, eager {'none' if e is None else 'one'}"
            if e is not None:
                assert_matches(a, e, lambda i=i: reference(i), _coarsest(made.dtypes))
        except AssertionError as error:
            raise AssertionError(f"{label}: {error}") from None


def check_program_gradients(program: Program) -> None:
    scope = program.namespace()
    check_gradients_against_eager(scope["f"], scope["make_inputs"])


# --- saving shrunk failures -------------------------------------------------------------------------

def _is_final_example() -> bool:
    """True during Hypothesis's last replay of a (shrunk) failing example, the one it reports."""
    from hypothesis.control import current_build_context
    return bool(getattr(current_build_context(), "is_final", False))


def regression_source(program: Program, error: BaseException, gradients: bool = False) -> str:
    message = f"{type(error).__name__}: {error}".strip()
    if len(message) > 2000:
        message = message[:2000] + " ..."
    header = ("# A minimal program on which minicomp differed from eager, found and shrunk by\n"
              "# tests/test_fuzz.py; replayed by tests/test_regressions.py. When it is a known,\n"
              "# unfixed bug, set XFAIL = \"<reason>\" to expect the failure (strictly).\n"
              "#\n# Failure when saved:\n" + textwrap.indent(message, "#   ", lambda _: True) + "\n")
    main = ('\n\nif __name__ == "__main__":\n'
            '    import minicomp\n'
            '    args = make_inputs()\n'
            '    torch.testing.assert_close(minicomp.compile(f)(*args), f(*args), equal_nan=True)\n'
            '    print("minicomp matches eager")\n')
    if gradients:  # the replay checks the backward too; a standalone run needs the fuzzer's checker
        header += "GRADIENTS = True  # a failure of the backward: replayed with check_gradients_against_eager\n"
        main = ('\n\nif __name__ == "__main__":\n'
                '    from tests.test_fuzz import check_gradients_against_eager\n'
                '    check_gradients_against_eager(f, make_inputs)\n'
                '    print("minicomp\'s outputs and gradients match eager\'s")\n')
    return header + program.source() + main


def save_regression(program: Program, error: BaseException, folder: Path = REGRESSIONS,
                    gradients: bool = False) -> Path:
    """Write ``program`` with its failure as ``folder/fuzz_<hash>.py`` (named by the program and
    whether its backward failed)."""
    digest = hashlib.sha256((program.source() + ("grad" if gradients else "")).encode()).hexdigest()[:12]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"fuzz_{digest}.py"
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(regression_source(program, error, gradients))
    os.replace(tmp, path)
    return path


def saving_enabled() -> bool:
    return os.environ.get("MINICOMP_FUZZ_SAVE", "1") not in ("", "0")


class GeneratedCodeError(AssertionError):
    """An exception raised inside minicomp's generated code (wrapper or kernel files)."""


def _in_generated_code(error: BaseException) -> bool:
    """Whether ``error`` (or one it chains to) was raised in a file of minicomp's cache. Those files are
    named by their content, which holds per-process names (``graph12_forward``), so the same bug raises
    from a different file on every compile: Hypothesis would see a new bug each time it replays."""
    from minicomp.runtime import cache
    root = cache.cache_dir().resolve()
    while error is not None:
        frames = traceback.extract_tb(error.__traceback__)
        if frames and Path(frames[-1].filename).resolve().is_relative_to(root):
            return True
        error = error.__context__
    return False


def run_property(program: Program, check=check_program, folder: Path = REGRESSIONS) -> None:
    """The fuzz property: ``check(program)``; when it fails on the final, shrunk example, save the
    program as a regression test first."""
    error = None
    try:
        check(program)
    except Exception as e:
        error = e
    if error is None:
        return
    if _in_generated_code(error):  # the same place every time (raised outside ``except``: no context)
        frame = traceback.extract_tb(error.__traceback__)[-1]
        error = GeneratedCodeError(f"{type(error).__name__} in generated code: {error}\n"
                                   f"  {Path(frame.filename).parent.name}/...: {frame.line}")
    if saving_enabled() and _is_final_example():
        path = save_regression(program, error, folder, gradients=check is check_program_gradients)
        if hasattr(error, "add_note"):  # Python 3.11+
            error.add_note(f"saved as {path}")
    raise error


# --- tests ------------------------------------------------------------------------------------------

_SEED = os.environ.get("MINICOMP_FUZZ_SEED")  # another fixed sample than CI's (derandomized) one


@pytest.mark.slow
@settings(max_examples=int(os.environ.get("MINICOMP_FUZZ_EXAMPLES", "25")), derandomize=_SEED is None,
          deadline=None, database=None, suppress_health_check=list(HealthCheck))
@(seed(int(_SEED)) if _SEED else lambda test: test)  # a seed would override derandomize
@given(programs())
def test_random_programs_match_eager(program: Program):
    run_property(program)


@pytest.mark.slow
@settings(max_examples=int(os.environ.get("MINICOMP_FUZZ_GRAD_EXAMPLES", "12")), derandomize=_SEED is None,
          deadline=None, database=None, suppress_health_check=list(HealthCheck))
@(seed(int(_SEED)) if _SEED else lambda test: test)
@given(programs())
def test_random_programs_gradients_match_eager(program: Program):
    run_property(program, check_program_gradients)


def load_module(path: Path):
    spec = importlib.util.spec_from_file_location(f"minicomp_regression_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
