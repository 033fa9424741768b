"""Rewrites of a graph with symbolic sizes before its parts run op by op (``minicomp/frontend/grouped_heads.py``,
``minicomp/frontend/repeated_nodes.py``) and the attention those parts call (``graphs/dynamic.py``): every
result as eager's, at several cache lengths."""
from __future__ import annotations

import operator

import pytest
import torch
import torch.nn.functional as F

from minicomp.frontend.grouped_heads import fold_grouped_heads
from minicomp.frontend.repeated_nodes import merge_repeated_nodes
from minicomp.graphs import dynamic
from tests.utils import aot_compiled

B, H, KV, D = 2, 8, 2, 16  # 8 query heads over 2 key/value heads


def compiled(fn, rewrite, example, dims: dict[int, int]):
    """``fn`` compiled with AOTAutograd's inference graph rewritten by ``rewrite`` (dimension ``dims[i]`` of
    argument ``i`` symbolic), and a list that receives ``(graph, rewrite's count, ops before)``."""
    graphs = []

    def keep(g):
        before = ops(g)
        graphs.append((g, rewrite(g), before))
    return aot_compiled(fn, example, dims, keep), graphs


def ops(gm) -> list:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def repeat_heads(x):
    b, kv, s, d = x.shape
    return x[:, :, None].expand(b, kv, H // kv, s, d).reshape(b, H, s, d)


def step(q, k_cache, k, v_cache, v, mask):
    """A decoding step's attention as transformers writes it with a mask: the cache grows, its heads are
    repeated, SDPA; the output as the next projection reads it."""
    k_cache, v_cache = torch.cat([k_cache, k], 2), torch.cat([v_cache, v], 2)
    out = F.scaled_dot_product_attention(q, repeat_heads(k_cache), repeat_heads(v_cache), attn_mask=mask, scale=0.25)
    return k_cache, v_cache, out.transpose(1, 2).reshape(q.shape[0], q.shape[2], H * D)


def inputs(length: int, rows: int = 1, mask_heads: int = 1, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    mask = torch.rand(B, mask_heads, rows, length + 1, generator=g) < 0.8
    mask[..., 0] = True  # every row attends somewhere
    return [r(B, H, rows, D), r(B, KV, length, D), r(B, KV, 1, D), r(B, KV, length, D), r(B, KV, 1, D), mask]


@pytest.mark.parametrize("mask_heads", [1, H])
def test_one_query_position_attends_to_the_unrepeated_heads(mask_heads):
    """The repeat's copies are gone, and the results are eager's at lengths other than the traced one."""
    f, graphs = compiled(step, fold_grouped_heads, inputs(5, mask_heads=mask_heads), {1: 2, 3: 2, 5: 3})
    ((gm, folded, before),) = graphs
    assert folded == 1 and torch.ops.aten.clone.default in before
    assert torch.ops.aten.clone.default not in ops(gm)
    for length in (5, 9, 2):
        args = inputs(length, mask_heads=mask_heads, seed=length)
        with torch.no_grad():
            for got, want in zip(f(*args), step(*args)):
                torch.testing.assert_close(got, want)
    assert len(graphs) == 1  # (no recompile: the lengths were symbolic)


@pytest.mark.parametrize("case", ["prefill", "causal", "heads not repeated"])
def test_attention_the_fold_would_change_is_left_as_traced(case):
    if case == "prefill":  # several query rows: a group's rows would interleave with its heads
        fn, args = step, inputs(5, rows=3)
    elif case == "causal":  # with one query row, a causal flag keeps the first key only; folded rows would differ
        def fn(q, k_cache, k, v_cache, v, mask):
            k_cache = torch.cat([k_cache, k], 2)
            return F.scaled_dot_product_attention(q, repeat_heads(k_cache), repeat_heads(k_cache), is_causal=True)
        args = inputs(5)
    else:  # each key/value head read by its own query head: nothing to fold
        def fn(q, k_cache, k, v_cache, v, mask):
            k_cache = torch.cat([k_cache, k], 2).repeat(1, H // KV, 1, 1)
            return F.scaled_dot_product_attention(q, k_cache, k_cache, attn_mask=mask)
        args = inputs(5)
    _, ((gm, folded, before),) = compiled(fn, fold_grouped_heads, args, {1: 2, 3: 2, 5: 3})
    assert folded == 0 and ops(gm) == before


def test_repeated_nodes_are_merged_and_random_ones_kept():
    def fn(x, mask):
        a = torch.where(mask, 0.0, float("-inf")) + x  # the same bias made twice: merged
        b = torch.where(mask, 0.0, float("-inf")) * 2
        c = torch.where(mask, 0, 1) + torch.where(mask, 0.0, 1.0)  # an int and a float scalar: kept apart
        noise = torch.rand_like(x) - torch.rand_like(x)  # two draws: kept apart
        return a, b, c, noise
    f, ((gm, merged, before),) = compiled(fn, merge_repeated_nodes, [torch.randn(3, 5), torch.rand(3, 5) < 0.5],
                                         {0: 1, 1: 1})
    assert merged >= 1 and ops(gm).count(torch.ops.aten.where.self) == before.count(torch.ops.aten.where.self) - 1
    assert sum("rand" in str(t) for t in ops(gm)) == sum("rand" in str(t) for t in before) >= 2
    x, mask = torch.randn(3, 7), torch.rand(3, 7) < 0.5
    got, want = f(x, mask), fn(x, mask)
    for g, w in zip(got[:3], want[:3]):
        torch.testing.assert_close(g, w)
    assert got[3].abs().sum() > 0  # two draws, not one


def test_nodes_are_not_merged_across_a_write():
    """The same op on the same input after an in-place update (a static cache's ``index_copy_``, written in
    place by ``reinplace``) reads other values."""
    g = torch.fx.Graph()
    x = g.placeholder("x")
    aten = torch.ops.aten
    before = g.call_function(aten.mul.Tensor, (x, 2.0))
    g.call_function(aten.add_.Tensor, (x, 1.0))
    after = g.call_function(aten.mul.Tensor, (x, 2.0))
    g.output((before, after, g.call_function(aten.mul.Tensor, (x, 2.0))))
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    assert merge_repeated_nodes(gm) == 1  # the last one, into ``after``
    a, b, c = gm(torch.zeros(3))
    assert a.tolist() == [0, 0, 0] and b.tolist() == c.tolist() == [2, 2, 2]


def test_collectives_are_not_merged():
    """Two equal all-reduces are two exchanges between processes: merged on one rank, not on another (a
    graph split elsewhere), they would pair the wrong calls."""
    g = torch.fx.Graph()
    x = g.placeholder("x")
    reduce = torch.ops._c10d_functional.all_reduce.default
    g.output((g.call_function(reduce, (x, "sum", "0")), g.call_function(reduce, (x, "sum", "0"))))
    assert merge_repeated_nodes(torch.fx.GraphModule(torch.nn.Module(), g)) == 0


def _cudnn_attention_graph(read: int, dropout: float = 0.0):
    """A part as Dynamo hands it for a CUDA decoding step: cuDNN's attention with a mask; item ``read`` of
    its results returned (built by hand: the op itself runs on CUDA only)."""
    g = torch.fx.Graph()
    q, k, v, mask = (g.placeholder(name) for name in "qkvm")
    attention = g.call_function(dynamic._CUDNN_ATTENTION, (q, k, v, mask, False, dropout, False, False), {"scale": 0.25})
    g.output((g.call_function(operator.getitem, (attention, read)),))
    return torch.fx.GraphModule(torch.nn.Module(), g)


def test_a_part_in_pytorch_plans_cudnns_attention_only_for_sizes_it_met_before(monkeypatch):
    """cuDNN's attention plans each new shape (about 40 ms a new decoding length on the H200): a part whose
    sizes vary runs PyTorch's SDPA with cuDNN off at sizes new to it, with the same result and the user's
    setting restored, and the graph as traced at sizes it met before."""
    q, k, v = torch.randn(2, 4, 1, 16), torch.randn(2, 4, 7, 16), torch.randn(2, 4, 7, 16)
    mask = torch.randn(2, 1, 1, 7).expand(2, 4, 1, 7)
    monkeypatch.setattr(dynamic, "RECENT", 0)  # (no size comes back soon enough to be compiled)
    part = dynamic.SizedPart(_cudnn_attention_graph(read=0), dynamic.Options(), "inference", "part")
    seen, sdpa = [], F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention",
                        lambda *a, **kw: seen.append(torch.backends.cuda.cudnn_sdp_enabled()) or sdpa(*a, **kw))
    (got,) = part([q, k, v, mask])
    torch.testing.assert_close(got, sdpa(q, k, v, mask, scale=0.25))
    assert seen == [False] and torch.backends.cuda.cudnn_sdp_enabled()
    # in cuDNN's layout, the query's, whatever SDPA's kernel gave (the reading part compiled once)
    q3, unplanned = torch.randn(2, 4, 3, 16), dynamic.without_planned_attention(_cudnn_attention_graph(read=0))
    mask3 = torch.randn(2, 1, 3, 7)
    bshd = lambda t: t.transpose(1, 2).contiguous().transpose(1, 2)  # noqa: E731
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **kw: bshd(sdpa(*a, **kw)))
    for query in (q3, bshd(q3)):
        (got,) = unplanned(query, k, v, mask3)
        assert got.stride() == query.stride()
        torch.testing.assert_close(got, sdpa(q3, k, v, mask3, scale=0.25))
    traced = []
    monkeypatch.setattr(part, "gm", lambda *a: traced.append(a) or ("traced",))
    assert part([q, k, v, mask]) == ("traced",) and len(traced) == 1  # met before: as traced (cuDNN, planned)
    # its log-sum-exp read, or dropout: left as traced
    for other in (_cudnn_attention_graph(read=1), _cudnn_attention_graph(read=0, dropout=0.1)):
        assert dynamic.without_planned_attention(other) is other
