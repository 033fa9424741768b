"""Row pipelines (passes/pipelines.py): row-local kernel chains run as one launch, in Triton's
interpreter. The split thresholds are lowered so small tensors make the chains long GPU rows make."""
from __future__ import annotations

import pytest
import torch
import torch._dynamo

import minicomp
from minicomp.passes import pipelines
from tests.utils import compile_and_compare, small_split_thresholds


@pytest.fixture(autouse=True)
def small_thresholds(monkeypatch):
    small_split_thresholds(monkeypatch)


def _pipelined(decisions) -> list[str]:
    return [d for d in decisions if d.startswith("pipelined:")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_long_row_softmax_is_one_pipelined_launch(dtype):
    x = torch.randn(5, 300, dtype=dtype) * 3
    report = compile_and_compare(lambda x: torch.softmax(x, -1), x, kernels=1)
    (decision,) = _pipelined(report.decisions)
    assert "over 5 rows" in decision and report.kernels[0].template == "pipeline of 3"


@pytest.mark.parametrize("fn", [lambda x: torch.log_softmax(x, -1), lambda x: x / x.sum(-1, keepdim=True),
                                lambda x: x - x.amax(-1, keepdim=True)])
def test_other_row_chains_are_pipelined(fn):
    x = torch.randn(3, 720) + 0.5  # the sum of a row stays away from 0; the last chunk is partial
    report = compile_and_compare(fn, x, kernels=1)
    assert _pipelined(report.decisions), report.summary()


def test_pipeline_gives_the_same_bits_as_separate_launches(monkeypatch):
    x = torch.randn(4, 500)
    fn = lambda x: torch.softmax(x * 2, -1)  # noqa: E731
    together = minicomp.compile(fn)(x)
    assert _pipelined(minicomp.report().decisions)
    monkeypatch.setattr(pipelines, "_pipeline", lambda *a: None)
    monkeypatch.setattr(pipelines, "_split_combine", lambda *a: None)  # (the chunk statistics and their combine)
    monkeypatch.setenv("MINICOMP_GRAPH_CACHE", "0")  # the patch changes the compiler, not its source
    torch._dynamo.reset()
    apart = minicomp.compile(fn)(x)
    assert len(minicomp.report().kernels) >= 3  # separate launches
    assert torch.equal(together, apart)


def test_a_chain_that_reads_other_rows_is_not_pipelined():
    # row r divides by the sum of row 3 - r: the consumer's row needs another row of the statistics
    x = torch.randn(4, 600) + 0.5
    report = compile_and_compare(lambda x: x / x.sum(-1, keepdim=True).flip(0), x)
    assert not _pipelined(report.decisions)
    assert any(d.startswith("not pipelined:") and "not row-local" in d for d in report.decisions), report.summary()


def test_short_rows_make_no_pipeline():
    report = compile_and_compare(lambda x: torch.softmax(x, -1), torch.randn(4, 200), kernels=1)
    assert not _pipelined(report.decisions) and report.kernels[0].template.startswith("reduction")


def test_nan_inf_and_all_masked_rows_in_a_pipeline():
    x = torch.randn(4, 300)
    x[0, :130] = float("-inf")
    x[1] = float("-inf")
    x[2, 17] = float("nan")
    x[3, 250] = float("inf")
    report = compile_and_compare(lambda x: torch.softmax(x, -1), x, kernels=1)
    assert _pipelined(report.decisions)


@pytest.mark.slow
@pytest.mark.parametrize("fn", [lambda x: torch.softmax(x, -1), lambda x: x / x.sum(-1, keepdim=True)])
def test_kept_counters_count_on_from_the_last_launch(fn, monkeypatch):
    # on a GPU a pipeline's counters are never reset: launch e waits for (e+1) times a row's
    # programs. The interpreter takes fresh ones; keep them here to run the GPU's arithmetic.
    from minicomp.runtime import support
    monkeypatch.setattr(support, "counters", support.kept_counters)
    before = set(support._COUNTERS)
    f = minicomp.compile(fn)
    for trial in range(3):
        x = torch.randn(5, 300) * (trial + 1) + 2 * (trial + 1)  # row sums away from 0
        torch.testing.assert_close(f(x), fn(x))
    assert _pipelined(minicomp.report().decisions)
    (new,) = set(support._COUNTERS) - before
    tickets = support._COUNTERS[new][1][0].item()
    assert tickets > 0 and tickets % 3 == 0

def test_rows_whose_length_cuts_tiles_small_are_not_pipelined():
    # 5 x 2500: the elementwise stage could take only 4-element tiles inside a row (625 programs a
    # row); separate launches keep full blocks (the chunk statistics and their combine still one launch)
    report = compile_and_compare(lambda x: torch.softmax(x, -1), torch.randn(5, 2500) * 3, kernels=2)
    assert not _pipelined(report.decisions)
    assert any(d.startswith("not pipelined:") and "4-element tiles" in d for d in report.decisions), report.decisions


def test_elementwise_stages_alone_make_no_pipeline():
    """Two pointwise kernels that share an input (GPT-J's rotary embeddings of q and k, in training) have
    no rows to follow: any cut is row-local, down to one element a row, and such a pipeline took 2050
    one-element programs (57 s in the interpreter for a tiny GPT-J). They stay two launches."""
    a, b, s = torch.randn(2, 4, 16, 8), torch.randn(2, 16, 4, 8), torch.randn(16, 8)
    report = compile_and_compare(lambda a, b, s: (a * s, b * s.view(16, 1, 8)), a, b, s, kernels=2)
    assert not _pipelined(report.decisions), report.decisions
