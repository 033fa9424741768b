"""Column reductions (neighbouring outputs are neighbours in memory: x.sum(0), a softmax or variance
down dim 1) as scheduled for the H200: tiles narrowed to fill the SMs, splits counted in warps, held
whole where a group reads its input again; and row pipelines' elementwise tiles. Schedules are
checked on the CPU (nothing runs on a GPU); the same schedules then run in Triton's interpreter
against eager.
"""
from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F

import minicomp
from minicomp.ir.kernel import Schedule
from minicomp.passes import split_reductions as split
from minicomp.templates import reduction
from minicomp.templates.pointwise import WIDE_BLOCK_MAX_LOADS
from minicomp.templates.reduction import (ARG_COLUMN_TILE, ARG_MIN_TILE, ARG_NARROW_BLOCK, COLUMN_TILE, COLUMN_WARPS,
                                          COLUMN_WARPS_PER_SM, HELD_COLUMN_RUN_BYTES, MIN_COLUMN_RUN_BYTES,
                                          SHORT_COLUMN_BLOCK)
from tests.test_target import _full_size_traffic, _scheduled
from tests.utils import H200, compile_and_compare

BF16 = torch.bfloat16


def _reductions(fn, *args):
    with torch.no_grad():
        graph, kernels = _scheduled(fn, list(args), H200)
    return graph, [k for k in kernels if k.schedule.template == "reduction"]


def _warps(k) -> int:
    return -(-k.vars["x"].size // k.schedule.blocks["XBLOCK"]) * k.schedule.num_warps


def _run_bytes(k, itemsize: int) -> int:
    return k.schedule.blocks["XBLOCK"] * itemsize


# --- schedules for the H200 ------------------------------------------------------------------------

def test_a_column_sum_with_few_outputs_narrows_its_tile_to_fill_the_sms():
    """x.sum(0) of 16384 columns: 256 programs of 64 columns left 8 warps an SM (H200, 4096x16384 fp32:
    0.105 ms, Inductor's 1024 programs of 16 columns 0.068); narrowed, every SM gets its warps and each
    row is still read in runs of 64 bytes."""
    _, (k,) = _reductions(lambda x: x.sum(0), torch.empty(256, 16384))
    assert k.schedule.blocks["XBLOCK"] < COLUMN_TILE, k.schedule
    assert _run_bytes(k, 4) >= MIN_COLUMN_RUN_BYTES, k.schedule
    assert _warps(k) >= COLUMN_WARPS_PER_SM * H200.sm_count, k.schedule


def test_a_column_sum_with_outputs_enough_keeps_the_measured_block():
    _, (k,) = _reductions(lambda x: x.sum(1), torch.empty(4, 512, 16384))
    assert (k.schedule.blocks, k.schedule.num_warps) == ({"XBLOCK": 64, "RBLOCK": 64}, 4), k.schedule


def test_a_column_of_few_rows_takes_wide_tiles():
    """ResNeSt's split attention sums two radix halves, [N, 2, C, H, W] over dim 1: tiles of 64 outputs
    are programs of 128 values (0.12 ms a call over 25.7 MB, bf16 B32 on the H200); the tile widens to
    ``SHORT_COLUMN_BLOCK`` 16-bit values (a quarter of it in fp32, or with more loads than a wide block
    holds), still filling the SMs. Its warps are as many as its outputs fill with 16-byte loads, each thread
    holding its columns whole (``LOAD_VECTOR_BYTES``: [512, 2] bf16 tiles of 4 warps ran 5x slower than
    of 2 on the H200, their values replicated)."""
    x = torch.empty(32, 2, 64, 56, 56, dtype=BF16)
    _, (k,) = _reductions(lambda x: x.sum(1), x)
    assert k.schedule.blocks == {"XBLOCK": SHORT_COLUMN_BLOCK // 2, "RBLOCK": 2}, k.schedule
    assert k.schedule.num_warps == COLUMN_WARPS, k.schedule  # 2048 outputs: 8 bf16 values a thread, 4 warps
    assert _warps(k) >= COLUMN_WARPS_PER_SM * H200.sm_count, k.schedule
    ws = [torch.empty(1, 1, 64, 1, 1, dtype=BF16) for _ in range(WIDE_BLOCK_MAX_LOADS)]
    _, (k,) = _reductions(lambda x, *ws: sum(x * w for w in ws).sum(1), x, *ws)
    assert (k.schedule.blocks, k.schedule.num_warps) == ({"XBLOCK": SHORT_COLUMN_BLOCK // 8, "RBLOCK": 2}, 2)
    _, (k,) = _reductions(lambda x: x.sum(1), x.float())
    assert (k.schedule.blocks, k.schedule.num_warps) == ({"XBLOCK": SHORT_COLUMN_BLOCK // 8, "RBLOCK": 2}, 4)


def test_a_column_sum_too_narrow_to_fill_the_sms_splits_its_rows():
    """bf16 columns are narrowed to 32 (64 bytes): 2048 of them are 64 programs, so the 8192 rows are
    split into chunks until every SM has its warps (16 chunks of 512 rows) and the combine runs in the
    same launch."""
    graph, (partial, total) = _reductions(lambda x: x.sum(0), torch.empty(8192, 2048, dtype=BF16))
    assert any("16 partial reductions" in d for d in graph.decisions), graph.decisions
    assert _run_bytes(partial, 2) == MIN_COLUMN_RUN_BYTES, partial.schedule
    assert _warps(partial) == 16 * 2048 // 32 * partial.schedule.num_warps, partial.schedule
    assert _warps(partial) >= COLUMN_WARPS_PER_SM * H200.sm_count, partial.schedule
    assert [p.kind for p in graph.staged_launches] == ["split reduction + combine"], graph.staged_launches


def test_a_weight_gradient_over_4096_tokens_splits_its_rows():
    """RMSNorm's weight gradient of Llama's 1024 bf16 channels over B8 T512 tokens: unsplit, 32
    programs of 32 columns (H200: 160 us a call, ~40x the memory floor); split into chunks of
    ``MIN_COLUMN_CHUNK`` rows or more until every SM has its warps."""
    graph, (partial, total) = _reductions(lambda g, x: (g * x).sum(0), *(torch.empty(4096, 1024, dtype=BF16),) * 2)
    assert any("32 partial reductions" in d for d in graph.decisions), graph.decisions
    assert _warps(partial) >= COLUMN_WARPS_PER_SM * H200.sm_count, partial.schedule


def test_an_argmax_down_few_columns_narrows_its_index_carrying_block():
    """argmax over dim 1 of 4x1024x1023, fp32 and bf16: tiles of ``ARG_MIN_TILE`` (16) columns stepping
    ``ARG_NARROW_BLOCK`` elements (on the H200 16x4096x1023 ran [16, 64] 0.110 / 0.090 ms fp32 / bf16,
    Inductor's [16, 32] 0.116 / 0.097, our former [64, 8] 0.448); an argmax cannot split, so 16 columns
    is as far as it goes. Many columns keep [64, 8] (``ARG_COLUMN_TILE``)."""
    for dtype in (torch.float32, torch.bfloat16):
        _, (k,) = _reductions(lambda x: x.argmax(1), torch.empty(4, 1024, 1023, dtype=dtype))
        assert k.schedule.blocks == {"XBLOCK": ARG_MIN_TILE, "RBLOCK": ARG_NARROW_BLOCK // ARG_MIN_TILE}, k.schedule
    _, (k,) = _reductions(lambda x: x.argmax(1), torch.empty(128, 512, 4095))
    assert k.schedule.blocks == {"XBLOCK": 64, "RBLOCK": ARG_COLUMN_TILE // 64}, k.schedule


@pytest.mark.parametrize("fn", [lambda x: torch.softmax(x, 1), lambda x: torch.std(x, 1)], ids=["softmax", "std"])
def test_a_column_group_that_rereads_its_input_is_held_whole_in_sector_runs(fn):
    """A softmax or a variance down 1000 rows of fp32 columns: one program holds two sectors (16
    columns) of every row in 16 warps, so x is read once (looped over [64, 64] blocks, softmax dim 1 of
    64x1000x1024 read x three times: 0.28 ms on the H200, Inductor 0.21; held in one-sector [8, 1024]
    blocks of 8 warps 0.183, in [16, 1024] of 16 warps 0.142)."""
    x = torch.empty(4, 1000, 256)
    _, (k,) = _reductions(fn, x)
    assert k.schedule.persistent and k.schedule.blocks == {"XBLOCK": 16, "RBLOCK": 1024}, k.schedule
    assert k.schedule.num_warps == 16, k.schedule
    assert _run_bytes(k, 4) == HELD_COLUMN_RUN_BYTES
    assert _full_size_traffic([k], x.numel())[0] == 1


def test_a_bf16_column_softmax_too_long_to_hold_is_an_online_softmax():
    """bf16 holds 512 rows in sector runs: 1000 rows are looped, with the max and the rescaled sum of
    exp in one loop (online softmax), so x is read twice, not three times."""
    x = torch.empty(4, 1000, 256, dtype=BF16)
    graph, (k,) = _reductions(lambda x: torch.softmax(x, 1), x)
    assert any(d.startswith("online softmax:") for d in graph.decisions), graph.decisions
    assert not k.schedule.persistent and _full_size_traffic([k], x.numel()) == (2, 1)


def test_a_bf16_column_variance_too_long_to_hold_is_chunked_moments():
    x = torch.empty(4, 1024, 256, dtype=BF16)
    graph, (chunks, combine) = _reductions(lambda x: torch.std(x, 1), x)
    assert any(re.search(r"one pass in \d+ chunks", d) for d in graph.decisions), graph.decisions
    assert chunks.schedule.persistent and _full_size_traffic([chunks, combine], x.numel())[0] == 1


def test_a_column_sum_neither_rereads_nor_is_held_whole():
    x = torch.empty(4, 1000, 256)
    _, (k,) = _reductions(lambda x: x.sum(1) / 1000, x)
    assert not k.schedule.persistent and k.schedule.num_warps == 4, k.schedule


def test_a_row_pipelines_elementwise_stage_holds_no_more_values_a_thread_than_its_chunks():
    """GroupNorm(32) over 16x512x32x32 fp32: chunk statistics, their combine and the normalization in
    one pipelined launch; the normalization's tiles hold STAGE_VALUES_PER_THREAD values a thread (16384
    at 8 warps took 138 registers on sm_90: one program an SM)."""
    from minicomp.passes.pipelines import STAGE_VALUES_PER_THREAD
    x, w, b = torch.empty(16, 512, 32, 32), torch.empty(512), torch.empty(512)
    graph, _ = _reductions(lambda x, w, b: F.group_norm(x, 32, w, b), x, w, b)
    (p,) = graph.staged_launches
    (pointwise,) = [k for k in p.stages if k.schedule.template == "pointwise"]
    assert pointwise.schedule.blocks["XBLOCK"] == STAGE_VALUES_PER_THREAD * 32 * p.num_warps, p


# --- the same schedules in the interpreter, against eager --------------------------------------------

@pytest.fixture
def h200_columns(monkeypatch):
    """The H200's column schedules and split decisions in the interpreter, with blocks small enough
    that small tensors loop (blocks of 256, persistent blocks of 256: 32 fp32 rows held whole) and
    split (from 256 rows, in chunks of 32 or more)."""
    choose, limit, factor, welford = (reduction.reduction_schedule, split.whole_limit, split._split_factor,
                                      split._welford_columns)
    monkeypatch.setattr(reduction, "reduction_schedule", lambda g, target, layouts=None: choose(g, H200, layouts))
    monkeypatch.setattr(reduction, "persistent_limit", lambda target: 256)
    monkeypatch.setattr(split, "persistent_limit", lambda target: 256)
    monkeypatch.setattr(reduction, "COLUMN_BLOCK", 256)
    monkeypatch.setattr(split, "SPLIT_MIN_REDUCED", 256)
    monkeypatch.setattr(split, "MIN_CHUNK", 32)
    monkeypatch.setattr(split, "COLUMN_SPLIT_MIN_REDUCED", 256)
    monkeypatch.setattr(split, "MIN_COLUMN_CHUNK", 32)
    monkeypatch.setattr(split, "whole_limit", lambda x, axes, target: limit(x, axes, H200))
    monkeypatch.setattr(split, "_split_factor", lambda r, target, pooled=False: factor(r, H200, pooled))
    monkeypatch.setattr(split, "_welford_columns", lambda s, target: welford(s, H200))


def _decided(text: str) -> bool:
    return any(text in d for d in minicomp.report().decisions)


@pytest.mark.parametrize("shape", [(200, 70), (257, 33), (1, 50), (300, 1), (40, 1, 3)])  # looped, split, ...
@pytest.mark.parametrize("dtype", [torch.float32, BF16])
def test_narrowed_column_sums_match_eager(h200_columns, shape, dtype):
    x = torch.randn(shape).to(dtype)
    compile_and_compare(lambda x: (x.sum(0), x.amax(0)), x)


def test_a_split_narrowed_column_sum_matches_eager(h200_columns):
    x = torch.randn(600, 40)
    compile_and_compare(lambda x: x.sum(0), x)
    assert _decided("16 partial reductions"), minicomp.report().decisions  # chunks of 38 rows


@pytest.mark.parametrize("fn", [torch.argmax, torch.argmin])
def test_narrowed_column_argmax_matches_eager(h200_columns, fn):
    x = torch.randint(-3, 4, (2, 300, 37)).float()  # ties: the first index wins, as in eager
    x[1, 7, 5] = float("nan")
    compile_and_compare(lambda x: fn(x, 1), x)


@pytest.mark.parametrize("rows", [20, 50, 1])
@pytest.mark.parametrize("dtype", [torch.float32, BF16])
@pytest.mark.parametrize("fn", [torch.softmax, torch.log_softmax])
def test_column_softmax_held_whole_or_online_matches_eager(h200_columns, rows, dtype, fn):
    """20 rows are held whole in fp32 (32 fit), looped online in bf16 (16 fit); 50 are looped online; one is
    no reduction (single-element-reduce)."""
    x = (torch.randn(2, rows, 37) * 4).to(dtype)
    x[1, 0, 3] = float("-inf")
    report = compile_and_compare(lambda x: fn(x, 1), x)
    online = rows == 50 or (rows == 20 and dtype == BF16)
    assert _decided("online softmax") == online, report.decisions
    held = "pointwise" if rows == 1 else "reduction persistent"
    assert [k.template for k in report.kernels] == ["reduction looped" if online else held], report


@pytest.mark.parametrize("chunk", [8192, 16])
def test_a_column_softmax_with_few_outputs_matches_eager(h200_columns, monkeypatch, chunk):
    """Few outputs (SOFTMAX_ROWS_PER_SM): a column longer than a chunk is split into online-softmax
    chunks (4 of 16 rows, the last padded); one no longer than a chunk is looped online, not cut into
    a single chunk."""
    monkeypatch.setattr(split, "SOFTMAX_ROWS_PER_SM", 1000)
    monkeypatch.setattr(split, "SOFTMAX_CHUNK", chunk)
    x = torch.randn(2, 50, 37) * 4
    compile_and_compare(lambda x: torch.softmax(x, 1), x)
    assert _decided("online softmax in 4 chunks") == (chunk == 16), minicomp.report().decisions
    assert _decided("online softmax:") == (chunk == 8192), minicomp.report().decisions


@pytest.mark.parametrize("rows", [20, 50, 1])
@pytest.mark.parametrize("dtype", [torch.float32, BF16])
def test_column_variance_held_whole_or_chunked_matches_eager(h200_columns, rows, dtype):
    """Values far from zero (1000 + randn in fp32): a variance from a sum of squares would keep none
    of their digits (to 1e-3: x's own ulp there, 6e-5, puts eager's and our x - mean ~1e-4 from the
    exact one). A single row: std's correction makes it nan, as in eager."""
    x = ((1000.0 if dtype == torch.float32 else 8.0) + torch.randn(3, rows, 37)).to(dtype)
    tol = dict(atol=1e-3, rtol=1e-3) if dtype == torch.float32 else {}
    compile_and_compare(lambda x: (torch.std(x, 1), torch.var_mean(x, 1, correction=0)), x, **tol)
    looped = rows == 50 or (rows == 20 and dtype == BF16)
    assert _decided("down columns -> one looped kernel, Welford states") == looped, minicomp.report().decisions


@pytest.mark.parametrize("held", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, BF16, torch.float16])
def test_a_long_column_variance_keeps_welford_states_per_lane(h200_columns, monkeypatch, dtype, held):
    """300 rows loop in several steps, the last one masked; a variance and var_mean share the loop with
    the sum (one kernel, one read). Far from zero as above; a NaN poisons only its column. Few outputs
    would split (chunked moments): here they are taken to fill the GPU. ``held``: the same reduction
    given a persistent block (rows padded to 512) takes two passes over registers instead."""
    monkeypatch.setattr(split, "_split_factor", lambda r, target, pooled=False: 1)
    if held:
        monkeypatch.setattr(reduction, "reduction_schedule",
                            lambda g, target, layouts=None: Schedule("reduction", {"XBLOCK": 16, "RBLOCK": 512}, 4))
    x = ((1000.0 if dtype == torch.float32 else 8.0) + torch.randn(2, 300, 37)).to(dtype)
    x[1, 7, 5] = float("nan")
    tol = dict(atol=1e-3, rtol=1e-3) if dtype == torch.float32 else {}
    report = compile_and_compare(lambda x: (torch.std(x, 1), torch.var_mean(x, 1, correction=0)), x, **tol)
    assert _decided("Welford states per lane") and not _decided("moments over"), report.decisions
    assert [k.template for k in report.kernels] == [f"reduction {'persistent' if held else 'looped'}"], report


def test_column_batch_norm_statistics_match_eager(h200_columns):
    x, w, b = torch.randn(300, 24) * 3 + 5, torch.randn(24), torch.randn(24)
    compile_and_compare(lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True), x, w, b)


def test_rereads_sees_a_second_pass_not_an_epilogue():
    """``rereads``: a variance and a softmax compute over every element after a reduction; a mean
    (a sum's epilogue) does not."""
    for fn, expected in ((lambda x: torch.std(x, 1), True), (lambda x: torch.softmax(x, 1), True),
                         (lambda x: x.sum(1) / 7, False)):
        graph, _ = _reductions(fn, torch.empty(2, 7, 9))
        (group,) = [g for g in graph.groups if g.axes]
        assert reduction.rereads(group) == expected, group


def test_read_itemsize_counts_a_cast_input_as_its_own_dtype():
    graph, _ = _reductions(lambda x: x.float().sum(0), torch.empty(300, 70, dtype=BF16))
    (group,) = [g for g in graph.groups if g.axes]
    assert reduction.read_itemsize(group) == 2
    assert math.prod(group.shape) == 300 * 70
