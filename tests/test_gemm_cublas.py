"""Products sent to cuBLAS (``passes/gemm_choice.py``), run on the CPU through aten in Triton's interpreter
(``MINICOMP_GEMM=cublas``): a linear layer's bias in cuBLAS's epilogue, and what keeps ``aten.mm``.
fp32 products here are TF32 ones (the setting where ``addmm`` is taken) unless a test says IEEE."""
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import minicomp
from minicomp.frontend import rules
from minicomp.ir.choice_rows import NOISE
from minicomp.ir.choices import BIAS, PRECISIONS, Product
from tests.test_gemm import DTYPE_IDS, LOW, rand, tol
from tests.utils import H200, compare_gradients, compile_and_compare


@pytest.fixture(autouse=True)
def _cublas_tf32(monkeypatch):
    monkeypatch.setenv("MINICOMP_GEMM", "cublas")
    monkeypatch.setattr(rules, "_matmul_precision", lambda x: "tf32")


def _addmms(report) -> int:
    """How many products went to cuBLAS with their bias (the decision says so)."""
    return sum("aten.addmm" in d for d in report.decisions)


@pytest.mark.parametrize("dtype", [torch.float32, *LOW], ids=DTYPE_IDS.get)
@pytest.mark.parametrize("x_shape", [(16, 24), (2, 8, 24)], ids=["2d", "3d"])
def test_a_bias_after_a_cublas_product_is_its_addmm(dtype, x_shape):
    """A product bound for cuBLAS whose one use is a linear layer's bias: ``aten.addmm`` adds it in
    cuBLAS's epilogue (as eager's ``F.linear`` does), no kernel of its own; 16-bit results rounded once."""
    x, w, b = rand(*x_shape, dtype=dtype), rand(20, 24, dtype=dtype), rand(20, dtype=dtype)
    report = compile_and_compare(lambda x, w, b: F.linear(x, w, b), x, w, b, kernels=0, **tol(dtype, 24))
    assert len(report.externs) == _addmms(report) == 1, report.summary()
    if dtype in LOW:  # exactly eager's addmm: the sum rounded once, not the product and then the sum
        torch.testing.assert_close(minicomp.compile(lambda x, w, b: F.linear(x, w, b))(x, w, b),
                                   F.linear(x, w, b), atol=0, rtol=0)


@pytest.mark.parametrize("switch", ["auto", "addmm"])
def test_a_small_fp32_ieee_product_keeps_its_mm_and_the_bias_joins_a_kernel(monkeypatch, switch):
    """In fp32 IEEE cuBLASLt's bias epilogue ran 1.1-1.9x mm's time on small products (the rule
    ``choices.BIAS``; results/addmm_bias.md): ``mm``, and the bias fused with the GELU after it, unless
    ``MINICOMP_BIAS=addmm`` forces cuBLAS's epilogue."""
    monkeypatch.setattr(rules, "_matmul_precision", lambda x: "ieee")
    monkeypatch.setenv("MINICOMP_BIAS", switch)
    x, w, b = rand(16, 24), rand(20, 24), rand(20)
    report = compile_and_compare(lambda x, w, b: F.gelu(F.linear(x, w, b)), x, w, b,
                                 kernels=1, **tol(torch.float32))
    assert len(report.externs) == 1 and _addmms(report) == (switch == "addmm"), report.summary()
    assert any("[rule bias:" in d for d in report.decisions), report.decisions


def test_what_else_reads_the_biased_sum_runs_after_the_addmm():
    """gelu of the biased sum plus a residual, and the sum itself returned: the addmm, then one kernel."""
    x, w, b, r = rand(16, 24), rand(20, 24), rand(20), rand(16, 20)
    report = compile_and_compare(lambda x, w, b, r: (lambda y: (F.gelu(y) + r, y))(F.linear(x, w, b)),
                                 x, w, b, r, kernels=1, **tol(torch.float32))
    assert _addmms(report) == len(report.externs) == 1, report.summary()


@pytest.mark.parametrize("case", ["product returned", "scaled bias", "bias per row", "bias per row, square",
                                  "bias of another dtype", "bias computed"])
def test_a_product_read_otherwise_keeps_its_mm(case):
    """Nothing but a plain bias add over the rows joins cuBLAS: a product read elsewhere too, a scaled
    bias (``beta``), a bias along the columns, of another dtype or computed in the graph (autocast's cast
    of an fp32 bias: a kernel of its own) keep ``aten.mm`` and a kernel."""
    x, w, b = rand(16, 24), rand(24, 20), rand(20)
    fn, args = {
        "product returned": (lambda x, w, b: (lambda y: (y, y + b))(x @ w), (x, w, b)),
        "scaled bias": (lambda x, w, b: torch.addmm(b, x, w, beta=0.5), (x, w, b)),
        "bias per row": (lambda x, w, b: x @ w + b[:16, None], (x, w, rand(24))),
        "bias per row, square": (lambda x, w, b: x @ w[:, :16] + b[:, None], (x, w, rand(16))),
        "bias of another dtype": (lambda x, w, b: x @ w + b, (x, w, rand(20, dtype=torch.float64))),
        "bias computed": (lambda x, w, b: F.linear(x, w.t(), b.half().float()), (x, w, b)),
    }[case]
    report = compile_and_compare(fn, *args, kernels=1, **tol(torch.float32))
    assert len(report.externs) == 1 and _addmms(report) == 0, report.summary()


def test_a_graph_with_an_addmm_is_stored_and_loaded_whole(cache_dir):
    """The graph cache stores the addmm extern by name with its bias among its arguments."""
    model = torch.nn.Sequential(torch.nn.Linear(24, 20), torch.nn.Linear(20, 8)).eval()
    reports = []
    for _ in range(2):
        torch._dynamo.reset()
        x = rand(16, 24)
        with torch.no_grad():
            torch.testing.assert_close(minicomp.compile(model)(x), model(x), **tol(torch.float32))
        reports.append(minicomp.report())
    cold, warm = reports
    assert not cold.from_cache and warm.from_cache, warm.summary()
    assert _addmms(cold) == 2 and not warm.kernels, cold.summary()


LAUNCH_US = 3.0  # under what a bias kernel of its own took on these shapes (3.6 us and up: mm_add_us - mm_us)


@pytest.mark.parametrize("setting", list(PRECISIONS))
def test_the_bias_rule_follows_every_row_of_its_measurement(setting):
    """``choices.BIAS`` against every shape of ``benchmarks/results/addmm_bias.json`` (H200; its table
    ``BIAS_ROWS`` holds some): the side it picks is never slower than the other beyond NOISE (or a
    launch's time), the kernel side counted at its best, mm alone (the bias fused into a kernel that runs
    anyway); and in fp32 IEEE it declines somewhere, where addmm is well beyond mm."""
    rows = json.loads((Path(__file__).parents[1] / "benchmarks/results/addmm_bias.json").read_text())["rows"]
    rows = [r for r in rows if r["setting"] == setting]
    assert len(rows) >= 12, setting
    dtype, _ = PRECISIONS[setting]
    declined = 0
    for r in rows:
        facts = Product(dtype, "ieee" if setting == "fp32-ieee" else "tf32", r["m"], r["n"], r["k"], 1, (), 1)
        choice = BIAS(facts, H200)
        picked, other = (r["mm_us"], r["addmm_us"]) if choice.template else (r["addmm_us"], r["mm_us"])
        assert picked <= max((1 + NOISE) * other, other + LAUNCH_US), (r, choice)
        declined += choice.template
    assert bool(declined) == (setting == "fp32-ieee"), declined


ROWS_AS_STORED = "reads its left operand's rows in the order they are stored"


def _batch_first_projected(x, w):
    """nn.MultiheadAttention's projection of a batch-first input: [B, T, E] -> [T*B, E] rows, then a
    kernel (relu) reads the product."""
    return F.linear(x.transpose(0, 1).reshape(-1, x.shape[-1]), w).relu()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=DTYPE_IDS.get)
def test_a_row_permuted_operand_is_read_as_stored_and_the_result_put_back_by_a_view(dtype):
    """Rows permute through a product: cuBLAS reads x's rows as stored (no copy of the transposed
    input), and the relu kernel reads the product's rows back in (t, b) order."""
    x, w = rand(3, 5, 8, dtype=dtype), rand(12, 8, dtype=dtype)
    report = compile_and_compare(_batch_first_projected, x, w, kernels=1, **tol(dtype, 8))
    assert any(ROWS_AS_STORED in d for d in report.decisions), report.decisions


@pytest.mark.parametrize("case", ["returned", "a slice of the rows", "not a permutation of whole rows", "empty"])
def test_operands_that_are_not_a_row_permutation_read_by_kernels_keep_their_copy(case):
    """The product's result returned as it is (the view would need a copy of the result instead), a
    strict subset of the rows, columns mixed across rows, or no rows at all: the operand is copied as before."""
    x, w = rand(0 if case == "empty" else 3, 5, 8), rand(12, 8)
    fn = {"returned": lambda x, w: F.linear(x.transpose(0, 1).reshape(-1, 8), w),
          "empty": _batch_first_projected,
          "a slice of the rows": lambda x, w: F.linear(x[:2].transpose(0, 1).reshape(-1, 8), w).relu(),
          "not a permutation of whole rows": lambda x, w: F.linear(x.transpose(1, 2).reshape(-1, 5)[:, :4].repeat(1, 2),
                                                                    w).relu()}[case]
    report = compile_and_compare(fn, x, w, **tol(torch.float32, 8))
    assert not any(ROWS_AS_STORED in d for d in report.decisions), report.decisions


def test_a_batch_first_multihead_attention_matches_eager_with_its_gradients():
    """The whole nn.MultiheadAttention (batch-first, averaged weights returned): outputs and every
    gradient as eager's. In inference the projection reads x as stored; a training forward returns the
    projection's input for the backward, x's rows copied in their new order (a view of x as a result
    would alias it), and the projection reads that copy."""
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(16, 4, batch_first=True)
    x = rand(3, 5, 16)
    report = compare_gradients(lambda x: mha(x, x, x), x)[0]
    assert not any(ROWS_AS_STORED in d for d in report.decisions), report.decisions
    with torch.no_grad():
        report = compile_and_compare(lambda x: mha(x, x, x), x, **tol(torch.float32, 16))
    assert any(ROWS_AS_STORED in d for d in report.decisions), report.decisions
