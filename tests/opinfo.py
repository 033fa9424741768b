"""PyTorch OpInfo coverage for minicomp.

``check_op(opinfo, max_samples)`` runs an op's float32 CPU sample inputs through
``minicomp.compile`` and compares with eager: the outputs of an inference graph (under no_grad)
and, for ops that support autograd, the outputs and every input's ``.grad`` of a training graph
(float inputs require grad; the outputs are weighted by a random upstream gradient). ``main()``
sweeps torch's whole ``op_db`` and writes ``tests/coverage/opinfo.md``:

    python -m tests.opinfo [--ops add,mul,div.floor_rounding] [--max-samples N] [--limit-seconds S]

Statuses: ``native`` (every sample correct, nothing fell back), ``fallback`` (correct, but some op
or a whole graph ran in PyTorch, or no graph reached minicomp), ``wrong`` (a mismatch), ``crash``
(the compiled call raised where eager did not), ``skipped`` (no float32, random op, no usable
sample). Gradient statuses: ``correct``, ``wrong``, ``crash``, ``n/a`` (no autograd support, no
sample with an output that requires grad, or eager's backward raises).
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import logging
import os
import re
import signal
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

# Every buffer minicomp allocates starts as garbage, so an unwritten element cannot pass as correct.
os.environ.setdefault("MINICOMP_POISON", "1")
# minicomp's own kernels, in Triton's interpreter (on the CPU minicomp otherwise hands graphs to PyTorch:
# every op would read "fallback")
os.environ.setdefault("MINICOMP_CPU", "interpret")

import torch  # noqa: E402
import torch.utils._pytree as pytree  # noqa: E402

import minicomp  # noqa: E402

MAX_ELEMENTS = 4096  # skip samples bigger than this: the Triton interpreter is slow
TOL = dict(equal_nan=True, atol=1e-4, rtol=1e-4, check_dtype=True)
# Gradients sum over more terms (a backward reduces what the forward broadcast) and in another order.
GRAD_TOL = dict(equal_nan=True, atol=1e-3, rtol=1e-3, check_dtype=True)

# Random or uninitialised outputs: eager and compiled cannot be compared.
RANDOM_OPS = {
    "bernoulli", "normal", "multinomial", "uniform", "cauchy", "exponential", "geometric",
    "log_normal", "nn.functional.dropout", "nn.functional.dropout2d", "nn.functional.dropout3d",
    "nn.functional.alpha_dropout", "nn.functional.feature_alpha_dropout", "nn.functional.rrelu",
    "torch._C._nn._test_ambiguous_defaults",
}
RANDOM_PREFIXES = ("rand", "randn", "randint", "empty", "new_empty", "bernoulli", "normal",
                   "nn.functional.dropout")
# Ops OpInfo wraps in ``wrapper_set_seed`` (its manual_seed breaks Dynamo's graph, so nothing would reach
# minicomp) that are deterministic without dropout: called directly, on their samples without dropout.
UNSEEDED = {"nn.functional.scaled_dot_product_attention": torch.nn.functional.scaled_dot_product_attention}


def full_name(opinfo) -> str:
    return f"{opinfo.name}.{opinfo.variant_test_name}" if opinfo.variant_test_name else opinfo.name


def op_by_name(name: str):
    """The OpInfo called ``name`` (``name`` or ``name.variant``)."""
    from torch.testing._internal.common_methods_invocations import op_db
    for op in op_db:
        if full_name(op) == name:
            return op
    raise KeyError(f"no OpInfo named {name!r}")


def _is_random(opinfo) -> bool:
    return opinfo.name in RANDOM_OPS or opinfo.name.startswith(RANDOM_PREFIXES)


def _numel(sample) -> int:
    leaves = pytree.tree_leaves((sample.input, sample.args, sample.kwargs))
    return sum(t.numel() for t in leaves if isinstance(t, torch.Tensor))


def _clone(tree):
    return pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, tree)


def describe(sample) -> str:
    """A short description of a sample: shapes for tensors, values otherwise."""
    def one(x):
        if isinstance(x, torch.Tensor):
            return f"T{tuple(x.shape)}" + ("" if x.dtype == torch.float32 else f":{str(x.dtype)[6:]}")
        if isinstance(x, (list, tuple)):
            inner = ", ".join(one(y) for y in x)
            return f"[{inner}]" if isinstance(x, list) else f"({inner})"
        return repr(x)
    parts = [one(sample.input)] + [one(a) for a in sample.args]
    parts += [f"{k}={one(v)}" for k, v in sample.kwargs.items()]
    return ", ".join(parts)


def _first_line(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()
    # Dynamo wraps backend errors; the useful line is usually the first non-empty one.
    return f"{type(exc).__name__}: {msg[0] if msg else ''}"[:300]


def _compare(expected, actual, tol: dict = TOL) -> None:
    exp_leaves, act_leaves = pytree.tree_leaves(expected), pytree.tree_leaves(actual)
    if len(exp_leaves) != len(act_leaves):
        raise AssertionError(f"{len(act_leaves)} outputs, eager has {len(exp_leaves)}")
    for i, (e, a) in enumerate(zip(exp_leaves, act_leaves)):
        if isinstance(e, torch.Tensor):
            if not isinstance(a, torch.Tensor):
                raise AssertionError(f"output {i}: {type(a).__name__}, eager has a tensor")
            if a.shape != e.shape:
                raise AssertionError(f"output {i}: shape {tuple(a.shape)}, eager {tuple(e.shape)}")
            torch.testing.assert_close(a, e, **tol)
        elif isinstance(e, (int, float, complex)) and not isinstance(e, bool):
            torch.testing.assert_close(a, e, **tol)
        elif a != e:
            raise AssertionError(f"output {i}: {a!r}, eager {e!r}")


class _DynamoFallbacks(logging.Handler):
    """Collects Dynamo's graph-break warnings (e.g. "Backend compiler `minicomp` failed with
    <data-dependent op>. Adding a graph break."): the code then runs eagerly, unseen by minicomp."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.reasons: list[str] = []

    def emit(self, record):
        for line in record.getMessage().splitlines():
            line = line.strip()
            if line.startswith("Explanation:"):
                reason = line[len("Explanation:"):].strip().replace(". Adding a graph break.", "")
                self.reasons.append(re.sub(r"<minicomp\.backend\.Backend object at 0x[0-9a-f]+>", "minicomp", reason))
                return


@contextlib.contextmanager
def _watch_dynamo():
    handler = _DynamoFallbacks()
    logger = logging.getLogger("torch._dynamo")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


@dataclass
class Result:
    """What ``check_op`` found: ``status``/``detail`` for the outputs of the inference graph,
    ``grad``/``grad_detail`` for the training graph's outputs and input gradients."""
    status: str
    detail: str
    grad: str = "n/a"
    grad_detail: str = ""


def _requiring_grad(tree) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor) and t.requires_grad]


def _fresh_leaves(tree):
    """A copy of ``tree`` whose tensors are new leaves, requiring grad where the originals do."""
    return pytree.tree_map(
        lambda t: t.detach().clone().requires_grad_(t.requires_grad) if isinstance(t, torch.Tensor) else t, tree)


def _mismatch(err: AssertionError) -> str:
    """assert_close's message in one line: how many elements differ and the largest difference."""
    lines = [ln.strip() for ln in str(err).splitlines()]
    return "; ".join(ln for ln in lines if ln.startswith(("Mismatched", "Greatest absolute"))) or _first_line(err)


def _run_backward(fn, args, kwargs, seed: int):
    """``fn(*args, **kwargs)``, then a backward from every output that requires grad, weighted by a
    random upstream gradient (the same for the same ``seed``). Returns the outputs, how many of them
    required grad, and the ``.grad`` of every input that requires grad (None where it got none)."""
    out = fn(*args, **kwargs)
    outs = _requiring_grad(out)
    gen = torch.Generator().manual_seed(seed)
    if outs:  # drawn in single precision, so the float64 reference run gets the same upstream gradient
        single = {torch.float64: torch.float32, torch.complex128: torch.complex64}
        torch.autograd.backward(outs, [torch.randn(o.shape, generator=gen, dtype=single.get(o.dtype, o.dtype))
                                       .to(o.dtype) for o in outs])
    return out, len(outs), [t.grad for t in _requiring_grad((args, kwargs))]


def _float64_grads(fn, args, kwargs, seed: int) -> list | None:
    """Every input's gradient as eager computes it with float32 tensors promoted to float64 (None
    when eager cannot): the reference for gradients that eager's own float32 gets only roughly."""
    def up(t):
        if isinstance(t, torch.Tensor) and t.dtype == torch.float32:
            return t.detach().double().requires_grad_(t.requires_grad)
        return t
    try:
        return _run_backward(fn, *pytree.tree_map(up, _fresh_leaves((args, kwargs))), seed)[2]
    except Exception:  # noqa: BLE001  no float64 kernel or backward for this op
        return None


def _as_close_as_eager(actual: torch.Tensor, expected: torch.Tensor, exact: torch.Tensor) -> float:
    """Check ``actual`` against the float64 gradient ``exact`` with eager's own error as slack:
    GRAD_TOL plus twice the largest finite distance of eager's float32 ``expected`` from ``exact``.

    An ill-conditioned backward formula has float32 rounding error far above GRAD_TOL that depends
    on the order of its operations (logcumsumexp's backward takes exp of differences of the inputs,
    which OpInfo makes 1e4, where a float32 ulp is 1e-3: eager's own result is off by up to 2.5e-3,
    minicomp's tree-shaped scan rounds elsewhere). Both are then judged by the exact value: minicomp
    must be no further from it than eager is, with a factor 2 for a different rounding order of the
    same formula. Returns eager's distance; raises AssertionError like ``assert_close``."""
    exact = exact.to(torch.complex128 if exact.is_complex() else torch.float64)
    gap = (expected.to(exact.dtype) - exact).abs()
    slack = float(torch.where(torch.isfinite(gap), gap, torch.zeros_like(gap)).max()) if gap.numel() else 0.0
    torch.testing.assert_close(actual.to(exact.dtype), exact, equal_nan=True, check_dtype=False,
                               atol=GRAD_TOL["atol"] + 2 * slack, rtol=GRAD_TOL["rtol"])
    return slack


def _check_grad(op, sample, where: str) -> tuple[str, str] | None:
    """Compare a training graph's outputs and input gradients with eager's for one sample: None when
    there is nothing to compare (eager raises, or no output requires grad), else ``(status, detail)``
    with status ``correct``/``wrong``/``crash``; a correct one's detail names what ran in PyTorch as a
    whole (a graph break, a graph minicomp could not compile, no graph at all)."""
    def fn(*a, **k):
        return op(*a, **k)
    seed = zlib.crc32(where.encode())
    args, kwargs = (sample.input, *sample.args), sample.kwargs
    if not _requiring_grad((args, kwargs)):
        return None
    try:
        expected, n_expected, expected_grads = _run_backward(fn, *_fresh_leaves((args, kwargs)), seed)
    except Exception:  # noqa: BLE001  eager has no backward for this sample
        return None
    if n_expected == 0:
        return None
    torch._dynamo.reset()
    before = minicomp.report()
    try:
        with _watch_dynamo() as dynamo:
            actual, n_actual, actual_grads = _run_backward(minicomp.compile(fn), *_fresh_leaves((args, kwargs)), seed)
    except Exception as e:  # noqa: BLE001
        return "crash", f"{_first_line(e)} [{where}]"
    notes = []
    try:
        _compare(expected, actual)
        if n_actual != n_expected:
            raise AssertionError(f"{n_actual} outputs require grad, eager has {n_expected}")
        exact = None
        for i, (e, a) in enumerate(zip(expected_grads, actual_grads)):
            if (e is None) != (a is None):
                raise AssertionError(f"input {i}: grad {'None' if a is None else 'set'}, eager's "
                                     f"{'None' if e is None else 'set'}")
            if e is None:
                continue
            try:
                torch.testing.assert_close(a, e, **GRAD_TOL)
                continue
            except AssertionError as err:
                mismatch = f"grad of input {i}: {_mismatch(err)}"
            exact = exact or _float64_grads(fn, args, kwargs, seed)
            if exact is None or exact[i] is None or a.shape != e.shape:
                raise AssertionError(mismatch)
            try:
                slack = _as_close_as_eager(a, e, exact[i])
            except AssertionError as err:
                raise AssertionError(f"{mismatch}; against float64: {_mismatch(err)}") from None
            notes.append(f"grad of input {i} checked against float64 (eager's float32 is {slack:.1e} off)")
    except Exception as e:  # noqa: BLE001
        return "wrong", f"{_first_line(e)} [{where}]"
    new = minicomp.reports_since(before)
    notes += [f"dynamo: {r}" for r in dynamo.reasons] + [f"whole graph: {r.whole_graph_fallback}"
                                                         for r in new if r.whole_graph_fallback]
    if not new and not dynamo.reasons:
        notes.append("no graph reached minicomp")
    return "correct", ", ".join(dict.fromkeys(notes))


def check_op(opinfo, max_samples: int = 3, grad_samples: int | None = None) -> Result:
    """Run ``opinfo``'s float32 CPU samples through minicomp (``max_samples`` of them; the first
    ``grad_samples`` of those, default all, also with gradients when the op supports autograd)."""
    if _is_random(opinfo):
        return Result("skipped", "random/nondeterministic op")
    try:
        if torch.float32 not in opinfo.supported_dtypes("cpu"):
            return Result("skipped", "no float32 support on CPU")
    except Exception as e:  # noqa: BLE001
        return Result("skipped", f"dtypes: {_first_line(e)}")
    grad_samples = max_samples if grad_samples is None else grad_samples
    with_grad = bool(opinfo.supports_autograd) and grad_samples > 0
    try:
        samples = opinfo.sample_inputs("cpu", torch.float32, requires_grad=with_grad)
    except Exception as e:  # noqa: BLE001
        return Result("skipped", f"sample_inputs failed: {_first_line(e)}")

    ran, fell_back, n_seen = 0, [], 0
    grads: list[tuple[str, str]] = []
    op = UNSEEDED.get(full_name(opinfo), opinfo.op)
    try:
        for sample in samples:
            if ran >= max_samples:
                break
            n_seen += 1
            if _numel(sample) > MAX_ELEMENTS or (op is not opinfo.op and sample.kwargs.get("dropout_p")):
                continue
            fn = lambda *a, _s=sample: op(*a, **_s.kwargs)  # noqa: E731
            args = (sample.input, *sample.args)
            with torch.no_grad():
                try:
                    expected = fn(*_clone(args))
                except Exception:  # noqa: BLE001  eager rejects the sample: not minicomp's problem
                    continue
                ran += 1
                where = f"sample {n_seen - 1} ({describe(sample)})"
                torch._dynamo.reset()
                before = minicomp.report()
                try:
                    with _watch_dynamo() as dynamo:
                        actual = minicomp.compile(fn)(*_clone(args))
                except Exception as e:  # noqa: BLE001
                    return Result("crash", f"{_first_line(e)} [{where}]")
                new = minicomp.reports_since(before)
            try:
                _compare(expected, actual)
            except Exception as e:  # noqa: BLE001
                return Result("wrong", f"{_first_line(e)} [{where}]")
            fell_back += [f"dynamo: {r}" for r in dynamo.reasons]
            if not new and not dynamo.reasons:
                fell_back.append("no graph reached minicomp")
            for r in new:
                if r.whole_graph_fallback:
                    fell_back.append(f"whole graph: {r.whole_graph_fallback}")
                fell_back += [f.op for f in r.fallbacks]
            if with_grad and ran <= grad_samples:
                grads += [g for g in [_check_grad(op, sample, where)] if g]
    except Exception as e:  # noqa: BLE001  a failing sample generator
        if ran == 0:
            return Result("skipped", f"sample_inputs failed: {_first_line(e)}")
    finally:
        torch._dynamo.reset()
    if ran == 0:
        return Result("skipped", "no usable float32 sample (none, too large, or eager rejects them)")
    grad, grad_detail = _grad_summary(grads)
    if fell_back:
        return Result("fallback", ", ".join(dict.fromkeys(fell_back))[:300], grad, grad_detail)
    return Result("native", f"{ran} sample(s)", grad, grad_detail)


def _grad_summary(grads: list[tuple[str, str]]) -> tuple[str, str]:
    """The op's gradient status: its first crash or mismatch, else correct (or n/a: none checked)."""
    for status in ("crash", "wrong"):
        bad = [d for s, d in grads if s == status]
        if bad:
            return status, bad[0]
    if not grads:
        return "n/a", ""
    notes = ", ".join(dict.fromkeys(d for _, d in grads if d))
    return "correct", (f"{len(grads)} sample(s)" + (f"; {notes}" if notes else ""))[:300]


class _Timeout(BaseException):
    pass


def _alarm(signum, frame):
    raise _Timeout()


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ").replace("`", "'")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", help="comma-separated op names (name or name.variant); default: all of op_db")
    parser.add_argument("--max-samples", type=int, default=3)
    parser.add_argument("--grad-samples", type=int, default=None,
                        help="how many of those samples also check gradients (default: all; 0: none)")
    parser.add_argument("--limit-seconds", type=float, default=None, help="stop the sweep after this long")
    parser.add_argument("--op-timeout", type=int, default=120, help="seconds per op before it counts as a crash")
    parser.add_argument("--out", default=str(Path(__file__).parent / "coverage" / "opinfo.md"))
    args = parser.parse_args(argv)

    from torch.testing._internal.common_methods_invocations import op_db
    ops = [op_by_name(n.strip()) for n in args.ops.split(",")] if args.ops else list(op_db)

    start = time.time()
    rows: list[tuple[str, Result]] = []
    signal.signal(signal.SIGALRM, _alarm)
    stopped_early = False
    for i, op in enumerate(ops):
        if args.limit_seconds is not None and time.time() - start > args.limit_seconds:
            stopped_early = True
            break
        t0 = time.time()
        signal.alarm(args.op_timeout)
        try:
            result = check_op(op, args.max_samples, args.grad_samples)
        except _Timeout:
            result = Result("crash", f"timeout: more than {args.op_timeout}s")
        except Exception as e:  # noqa: BLE001
            result = Result("crash", _first_line(e))
        finally:
            signal.alarm(0)
        torch._dynamo.reset()
        rows.append((full_name(op), result))
        grad = result.grad_detail if result.grad in ("wrong", "crash") else ""
        print(f"[{i + 1}/{len(ops)}] {full_name(op):<40} {result.status:<8} grad {result.grad:<7} "
              f"{time.time() - t0:6.1f}s  {result.detail[:100]}" + (f"  grad: {grad[:150]}" if grad else ""),
              flush=True)

    counts = {s: sum(r.status == s for _, r in rows) for s in ("native", "fallback", "wrong", "crash", "skipped")}
    attempted = len(rows) - counts["skipped"]
    correct = counts["native"] + counts["fallback"]
    pct = 100.0 * correct / attempted if attempted else 0.0
    grads = {s: sum(r.grad == s for _, r in rows) for s in ("correct", "wrong", "crash", "n/a")}
    grad_checked = grads["correct"] + grads["wrong"] + grads["crash"]
    grad_pct = 100.0 * grads["correct"] / grad_checked if grad_checked else 0.0
    command = "python -m tests.opinfo " + " ".join(argv if argv is not None else sys.argv[1:])
    lines = [
        "# minicomp OpInfo coverage",
        "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- torch {torch.__version__}, triton {_triton_version()}, CPU (Triton interpreter), float32",
        f"- command: `{command.strip()}`",
        f"- ops: {len(rows)} of {len(ops)}" + (" (stopped early: --limit-seconds)" if stopped_early else "")
        + f", {time.time() - start:.0f}s",
        "",
        "| result | ops |",
        "|---|---|",
        f"| correct, native | {counts['native']} |",
        f"| correct, through fallback | {counts['fallback']} |",
        f"| wrong | {counts['wrong']} |",
        f"| crash | {counts['crash']} |",
        f"| skipped | {counts['skipped']} |",
        f"| **correct of attempted** | **{correct}/{attempted} ({pct:.1f}%)** |",
        "",
        "Gradients (training graphs: outputs and every input's `.grad` against eager, random upstream "
        "gradient):",
        "",
        "| gradients | ops |",
        "|---|---|",
        f"| correct | {grads['correct']} |",
        f"| wrong | {grads['wrong']} |",
        f"| crash | {grads['crash']} |",
        f"| not checked (no autograd, no differentiable sample, skipped op) | {grads['n/a']} |",
        f"| **correct of checked** | **{grads['correct']}/{grad_checked} ({grad_pct:.1f}%)** |",
        "",
        "| op | status | detail | gradients | gradient detail |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {_cell(n)} | {r.status} | {_cell(r.detail)} | {r.grad} | {_cell(r.grad_detail)} |"
              for n, r in rows]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print(f"\n{counts}; correct {correct}/{attempted} ({pct:.1f}%); gradients {grads}; wrote {out}")
    return 0


def _triton_version() -> str:
    try:
        import triton
        return triton.__version__
    except Exception:  # noqa: BLE001
        return "not installed"


if __name__ == "__main__":
    sys.exit(main())
