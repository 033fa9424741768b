"""Scans (cumsum, cumprod, logcumsumexp, cummax, cummin) lowered natively: the scan node, its fusion
and the scan template, persistent and looped, against eager."""
from __future__ import annotations

import pytest
import torch

import minicomp
from minicomp.ir import interpreter
from minicomp.ir.graph import Graph
from minicomp.ir.types import TensorType
from minicomp.ir.verifier import VerificationError, verify
from minicomp.templates import scan as scan_template
from tests.utils import compile_and_compare


@pytest.fixture
def looped(monkeypatch):
    """Rows longer than 8 loop over blocks of 8 (the path long GPU rows take), carrying the totals."""
    monkeypatch.setattr(scan_template, "scan_block_limit", lambda target: 8)


def _template(report) -> list[str]:
    return [k.template for k in report.kernels]


# --- dtypes, as eager ------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.int8, torch.uint8])
def test_cumsum_of_integers_is_int64(dtype):
    # int32 values whose sums leave int32: the accumulation is int64, as eager's result dtype
    high = 2**30 if dtype in (torch.int32, torch.int64) else 100
    x = torch.randint(0 if dtype == torch.uint8 else -high, high, (3, 9), dtype=dtype)
    compile_and_compare(lambda x: torch.cumsum(x, 1), x, kernels=1)


def test_cumsum_of_bool_is_int64():
    compile_and_compare(lambda x: torch.cumsum(x > 0, -1), torch.randn(4, 9), kernels=1)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_types_accumulate_in_fp32_and_round_per_element(dtype):
    # a long row: each element is the exact running sum rounded once, within an ulp of the half type
    # (eager's CPU kernel keeps a float running total too; CUDA's keeps it in the half type and drifts)
    x = torch.randn(3, 300).to(dtype)
    expected = torch.cumsum(x.double(), 1)
    actual = minicomp.compile(lambda x: torch.cumsum(x, 1))(x)
    assert actual.dtype == dtype
    ulp = 2.0 ** (-10 if dtype == torch.float16 else -7)
    torch.testing.assert_close(actual.double(), expected, rtol=ulp, atol=ulp)
    compile_and_compare(lambda x: torch.cumsum(x, 1), x, kernels=1)


@pytest.mark.parametrize("src, dtype", [(torch.float16, torch.float32), (torch.float32, torch.float16),
                                        (torch.int64, torch.int32), (torch.int32, torch.float64)])
def test_dtype_argument(src, dtype):
    x = torch.randn(3, 9).mul(4).to(src)
    compile_and_compare(lambda x: torch.cumsum(x, 1, dtype=dtype), x, kernels=1)
    compile_and_compare(lambda x: torch.cumprod(x, 0, dtype=dtype), x, kernels=1)


def test_cumprod_dtypes():
    compile_and_compare(lambda x: torch.cumprod(x, 1), torch.randn(3, 9), kernels=1)
    compile_and_compare(lambda x: torch.cumprod(x, 0), torch.randint(-3, 4, (7, 2), dtype=torch.int8), kernels=1)
    compile_and_compare(lambda x: torch.cumprod(x > 0, 1), torch.randn(3, 9), kernels=1)
    compile_and_compare(lambda x: torch.cumprod(x, 1), torch.randn(3, 9, dtype=torch.bfloat16), kernels=1)


# --- axes and shapes ---------------------------------------------------------------------------

@pytest.mark.parametrize("dim", [0, 1, 2, -1, -2, -3])
def test_any_axis(dim):
    compile_and_compare(lambda x: torch.cumsum(x, dim), torch.randn(3, 5, 4), kernels=1)


def test_non_contiguous_inputs():
    x = torch.randn(6, 5)
    compile_and_compare(lambda x: torch.cumsum(x.t(), 1), x, kernels=1)
    compile_and_compare(lambda x: torch.cumsum(x, 1), x.t(), kernels=1)
    compile_and_compare(lambda x: torch.cumsum(x, 0), torch.randn(12, 5)[::2, 1:], kernels=1)
    compile_and_compare(lambda x: torch.cumsum(x.expand(4, 5), 0), torch.randn(1, 5), kernels=1)


def test_result_keeps_eager_strides():
    x = torch.randn(5, 6).t()
    out = minicomp.compile(lambda x: torch.cumsum(x, 0))(x)
    assert out.stride() == torch.cumsum(x, 0).stride()


@pytest.mark.parametrize("shape, dim", [((), 0), ((), -1), ((4, 1), 1), ((1, 4), 0), ((0, 4), 1), ((0, 4), 0),
                                        ((3, 0), 1)])
def test_trivial_shapes(shape, dim):
    x = torch.randn(shape)
    compile_and_compare(lambda x: torch.cumsum(x, dim) + 1, x)
    compile_and_compare(lambda x: torch.cumprod(x, dim), x)
    compile_and_compare(lambda x: torch.cummax(x, dim), x)
    compile_and_compare(lambda x: torch.logcumsumexp(x, dim), x)


# --- the other scans ---------------------------------------------------------------------------

def test_logcumsumexp_with_infinities_and_nan():
    x = torch.randn(4, 9)
    x[0, :3] = float("-inf")
    x[1, 2] = float("inf")
    x[1, 5] = float("inf")
    x[2, 4] = float("nan")
    x[3, :] = float("-inf")
    compile_and_compare(lambda x: torch.logcumsumexp(x, 1), x, kernels=1)
    compile_and_compare(lambda x: torch.logcumsumexp(x, 0), x.to(torch.float16), kernels=1)


@pytest.mark.parametrize("op", [torch.cummax, torch.cummin])
def test_cummax_ties_and_nan_take_the_later_index(op):
    x = torch.randint(0, 3, (4, 9)).float()  # many ties
    x[1, 3] = float("nan")
    x[1, 6] = float("nan")
    x[2, 0] = float("nan")
    compile_and_compare(lambda x: op(x, 1), x, kernels=1)
    compile_and_compare(lambda x: op(x, 0), x.to(torch.bfloat16), kernels=1)
    compile_and_compare(lambda x: op(x, -1), torch.randint(-2, 2, (3, 9), dtype=torch.int32), kernels=1)
    compile_and_compare(lambda x: op(x > 0, 1), torch.randn(3, 9), kernels=1)


# --- long rows: the looped template ------------------------------------------------------------

def test_looped_scans_carry_between_blocks(looped):
    x = torch.randn(3, 21)
    x[1, 11] = float("nan")
    for fn in (lambda x: torch.cumsum(x, 1), lambda x: torch.cumprod(x * 0.5 + 1, 1),
               lambda x: torch.logcumsumexp(x, 1), lambda x: torch.cummax(x, 1), lambda x: torch.cummin(x, 1)):
        report = compile_and_compare(fn, x, kernels=1)
        assert _template(report) == ["scan looped"], report.summary()
    compile_and_compare(lambda x: torch.cumsum(x, 1), torch.randint(-9, 9, (2, 21), dtype=torch.int32), kernels=1)
    compile_and_compare(lambda x: torch.cumsum(x, 1), x.to(torch.float16), kernels=1)


def test_looped_scan_down_columns(monkeypatch):
    # blocks of 16 rows by 4 neighbouring columns (6 columns: the second block is partly masked)
    monkeypatch.setattr(scan_template, "scan_block_limit", lambda target: 64)
    x = torch.randn(70, 3, 2)
    report = compile_and_compare(lambda x: torch.cumsum(x, 0), x, kernels=1)
    assert _template(report) == ["scan looped"], report.summary()
    assert "XBLOCK=4 RBLOCK=16" in open(report.kernels[0].source_path).read()
    compile_and_compare(lambda x: torch.cummax(x, 0), x, kernels=1)


def test_persistent_rows_pack_several_per_program():
    report = compile_and_compare(lambda x: torch.cumsum(x, 1), torch.randn(5, 7), kernels=1)
    assert _template(report) == ["scan persistent"], report.summary()


# --- fusion ------------------------------------------------------------------------------------

def test_prologue_and_epilogue_fuse():
    x, y = torch.randn(4, 9), torch.randn(9)
    compile_and_compare(lambda x, y: torch.exp(torch.cumsum(x * y + 1, -1)) - x, x, y, kernels=1)


def test_position_ids_from_an_attention_mask():
    # Llama/BERT-style position ids: cumsum over the mask, shifted, padding positions set to 1
    mask = (torch.rand(3, 10) > 0.3).long()
    fn = lambda m: (torch.cumsum(m, -1) - 1).masked_fill(m == 0, 1)  # noqa: E731
    compile_and_compare(fn, mask, kernels=1)


def test_mamba_style_decay(looped):
    dt, a = torch.rand(2, 3, 20), torch.randn(3, 1)
    compile_and_compare(lambda dt, a: torch.exp(torch.cumsum(dt * a, dim=-1)), dt, a, kernels=1)


def test_chained_and_sibling_scans_share_a_kernel(looped):
    x = torch.randn(3, 19)
    compile_and_compare(lambda x: torch.cumsum(torch.cumsum(x, 1) * 0.5, 1), x, kernels=1)
    compile_and_compare(lambda x: (torch.cumsum(x, 1), torch.cummax(x, 1)), x, kernels=1)


def test_reads_elsewhere_than_the_scanned_positions_are_separate_kernels():
    x = torch.randn(4, 9)
    compile_and_compare(lambda x: torch.cumsum(x, 1)[:, 1:] * 2, x, kernels=2)
    compile_and_compare(lambda x: torch.cumsum(x, 1).flip(0) + 1, x, kernels=2)
    report = compile_and_compare(lambda x: torch.cumsum(x, 1).sum(1), x, kernels=2)
    assert "scan-reduction" in str(report.decisions), report.summary()
    compile_and_compare(lambda x: torch.cumsum(x, 0) + torch.cumsum(x, 1), x, kernels=2)


def test_reversed_cumsum_is_one_kernel(looped):
    x = torch.randn(3, 20)
    report = compile_and_compare(lambda x: torch.cumsum(x.flip(1), 1).flip(1) * 2, x, kernels=1)
    assert _template(report) == ["scan looped"], report.summary()
    compile_and_compare(lambda x: torch.logcumsumexp(x.flip(-1), -1).flip(-1), x, kernels=1)
    compile_and_compare(lambda x: torch.cumprod(x.flip(0), 0).flip(0), torch.randn(11, 3), kernels=1)
    # forward and reversed scans of one input do not share a (looped) kernel
    report = compile_and_compare(lambda x: (torch.cumsum(x, 1), torch.cumsum(x.flip(1), 1).flip(1)), x, kernels=2)
    assert "scan-direction" in str(report.decisions), report.summary()
    # a scan of a flipped input that is not flipped back reads its input flipped: one kernel
    compile_and_compare(lambda x: torch.cumsum(x.flip(1), 1), x, kernels=1)


# --- gradients ---------------------------------------------------------------------------------

def _check_grad(fn, x, fallbacks=0):
    xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    ye = fn(xe)
    g = torch.randn_like(ye)
    (ye * g).sum().backward()
    yc = minicomp.compile(fn)(xc)
    torch.testing.assert_close(yc, ye)
    (yc * g).sum().backward()
    report = minicomp.report()
    torch.testing.assert_close(xc.grad, xe.grad)
    assert report.whole_graph_fallback is None and len(report.fallbacks) == fallbacks, report.summary()
    return report


def test_cumsum_gradient_is_one_reversed_scan(looped):
    report = _check_grad(lambda x: torch.cumsum(x * 2, 1).sin(), torch.randn(3, 20))
    assert len(report.kernels) == 1, report.summary()
    report = _check_grad(lambda x: torch.cumsum(x, 0, dtype=torch.float32), torch.randn(11, 3).half())
    assert len(report.kernels) == 1, report.summary()


def test_other_scan_gradients():
    _check_grad(lambda x: torch.logcumsumexp(x, -1), torch.randn(3, 9))
    # cumprod's backward scatters a value at one index per row around its scans, and gathers: all native
    _check_grad(lambda x: torch.cumprod(x, 1), torch.randn(3, 9))


# --- the IR ------------------------------------------------------------------------------------

def _graph_with_scan(fn, shape=(3, 5), axis=1, reverse=False):
    g = Graph()
    x = g.input(0, TensorType(shape, torch.float32, torch.device("cpu")), (shape[1], 1))
    s = g.scan(fn, x, axis, torch.float32, reverse)
    g.add("output", [s], None, spec=[("node", 0)])
    return g, s


@pytest.mark.parametrize("fn, reverse", [(fn, False) for fn in ("sum", "prod", "logsumexp", "max", "min", "argmax",
                                                                  "argmin")]
                         + [(fn, True) for fn in ("sum", "prod", "logsumexp")])  # only these are reversed
def test_interpreter_and_printer(fn, reverse):
    g, s = _graph_with_scan(fn, reverse=reverse)
    verify(g)
    assert "scan" in str(s) and f"{fn}(%0) axis=1" in str(s) and ("reversed" in str(s)) == reverse
    x = torch.randn(3, 5)
    (out,) = interpreter.run(g, [x])
    ref = {"sum": torch.cumsum, "prod": torch.cumprod, "logsumexp": torch.logcumsumexp,
           "max": lambda x, d: torch.cummax(x, d).values, "min": lambda x, d: torch.cummin(x, d).values,
           "argmax": lambda x, d: torch.cummax(x, d).indices, "argmin": lambda x, d: torch.cummin(x, d).indices}[fn]
    expected = ref(x.flip(1), 1).flip(1) if reverse else ref(x, 1)
    torch.testing.assert_close(out, expected)


def test_verifier_rejects_a_bad_scan():
    g, s = _graph_with_scan("sum")
    s.attrs["fn"] = "mean"
    with pytest.raises(VerificationError, match="unknown scan"):
        verify(g)
    g, s = _graph_with_scan("sum")
    s.type = s.type.with_(shape=(3, 1))
    with pytest.raises(VerificationError, match="scan shape"):
        verify(g)


def test_translation_validation_passes(monkeypatch):
    monkeypatch.setenv("MINICOMP_VERIFY", "1")
    compile_and_compare(lambda x: torch.cummax(torch.cumsum(x, 0).flip(0), 1), torch.randn(4, 6))


def test_no_fallbacks_and_the_dump(tmp_path):
    report = compile_and_compare(lambda x: torch.cumsum(x, 1) * 2, torch.randn(4, 6), kernels=1)
    assert report.kernels[0].ops == ("cumsum.default", "mul.Tensor")
    minicomp.compile(lambda x: torch.cumsum(x, 1) * 2, dump_dir=str(tmp_path))(torch.randn(4, 6))
    lowered = next(tmp_path.rglob("00_lowered.txt")).read_text()
    assert "scan" in lowered and "sum(%" in lowered and "axis=1" in lowered
    kernels = next(tmp_path.rglob("kernels.txt")).read_text()
    assert "scan.sum(" in kernels


def test_max_autotune_measures_the_scan_and_reuses_the_winner(cache_dir, looped, tuning_in_the_interpreter):
    fn = lambda x: torch.cumsum(x, 1) * 2  # noqa: E731
    x = torch.randn(4, 40)
    torch.testing.assert_close(minicomp.compile(fn, mode="max-autotune")(x), fn(x))
    assert list((cache_dir / "tuned").glob("*.json"))
    torch._dynamo.reset()
    x = torch.randn(4, 40)
    torch.testing.assert_close(minicomp.compile(fn)(x), fn(x))
    assert any(d.startswith("tuned: k0_cumsum_mul_f32_row40 scan") for d in minicomp.report().decisions)


# --- split scans (passes/split_scans.py) ------------------------------------------------------

@pytest.fixture
def short_split(monkeypatch, looped):
    """Scans of 64 elements and more split into chunks of at least 8 (on the GPU: 65,536 and 4,096)."""
    from minicomp.passes import split_scans
    monkeypatch.setattr(split_scans, "SPLIT_MIN_SCANNED", 64)
    monkeypatch.setattr(split_scans, "MIN_SCAN_CHUNK", 8)


@pytest.mark.parametrize("case", ["cumsum 1-D", "cumsum rows", "cumsum columns", "cumsum odd length int64",
                                  "cumprod", "cummax", "cummin", "cumsum bf16"])
def test_a_long_scan_over_few_rows_splits_into_chunks_with_carries(short_split, case):
    """A cumsum over one long row was one program walking every block in turn (16M elements, H200:
    12.4 ms; Inductor 0.16): the chunks scan at once and each adds the running total of those before
    (padding the last chunk with the identity); the result equals eager's."""
    g = torch.Generator().manual_seed(0)
    fn, x = {
        "cumsum 1-D": (lambda x: x.cumsum(0), torch.randn(1000, generator=g)),
        "cumsum rows": (lambda x: x.cumsum(1), torch.randn(3, 300, generator=g)),
        "cumsum columns": (lambda x: x.cumsum(0), torch.randn(300, 3, generator=g)),
        "cumsum odd length int64": (lambda x: x.cumsum(0), torch.randint(-9, 9, (997,), generator=g)),
        "cumprod": (lambda x: x.cumprod(0), 1 + 0.01 * torch.randn(500, generator=g)),
        "cummax": (lambda x: x.cummax(0).values, torch.randn(999, generator=g)),
        "cummin": (lambda x: x.cummin(0).values, torch.randn(999, generator=g)),
        "cumsum bf16": (lambda x: x.cumsum(-1), torch.randn(2, 640, generator=g).bfloat16()),
    }[case]
    report = compile_and_compare(fn, x, rtol=1e-4, atol=1e-4) if x.dtype == torch.float32 else compile_and_compare(fn, x)
    assert any(d.startswith("split scan:") for d in report.decisions), report.decisions


def test_on_the_h200_only_long_scans_over_few_rows_split():
    """Scheduled for the H200 (nothing runs): one row of 2^24 splits into 1024 chunks of 16,384 (1024 row
    programs' worth: TARGET_PROGRAMS, chunks of at least MIN_SCAN_CHUNK); 512 rows or a row of 4096 do not."""
    from tests.test_target import _scheduled
    from tests.utils import H200
    cases = (((1 << 24,), 0, True), ((512, 100000), 1, False), ((4, 4096), 1, False))
    for shape, dim, splits in cases:
        graph, _ = _scheduled(lambda x: x.cumsum(dim), [torch.empty(shape)], H200)
        split = [d for d in graph.decisions if d.startswith("split scan:")]
        assert bool(split) == splits, (shape, graph.decisions)
