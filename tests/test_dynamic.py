"""Graphs with symbolic sizes (``minicomp/graphs/dynamic.py``): parts with static sizes compiled once, parts
with symbolic sizes run in PyTorch until a size comes back; every result and gradient as eager's."""
from __future__ import annotations

import operator
import sys

import pytest
import torch
import torch.nn.functional as F

from minicomp.graphs import dynamic
from tests.utils import aot_compiled

Report = sys.modules["minicomp.report"]  # the module (``minicomp.report`` is the function)


@pytest.fixture
def reports():
    """The reports recorded by this test only (a list that fills as the test compiles)."""
    saved = list(Report._reports)
    Report._reports.clear()
    yield Report._reports
    Report._reports[:] = saved


def compiled_parts(reps) -> dict[str, int]:
    """How many times each part of a split graph was compiled (a part's name ends in ``_partK``)."""
    counts: dict[str, int] = {}
    for r in reps:
        if "_part" in r.graph:
            counts[r.graph] = counts.get(r.graph, 0) + 1
    return counts


class Decoder(torch.nn.Module):
    """One decoding step over a key/value cache that grows by one position a call (as transformers'
    DynamicCache): projections, attention over the cache, an MLP."""

    def __init__(self, d: int = 16, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.out = torch.nn.Linear(d, d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 2 * d), torch.nn.GELU(), torch.nn.Linear(2 * d, d))
        self.norm = torch.nn.LayerNorm(d)

    def forward(self, x, k_cache, v_cache):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        k_cache, v_cache = torch.cat([k_cache, k], 2), torch.cat([v_cache, v], 2)
        a = F.scaled_dot_product_attention(q, k_cache, v_cache)
        h = x + self.out(a.transpose(1, 2).reshape(b, t, d))
        return h + self.mlp(self.norm(h)), k_cache, v_cache


def decode(model, steps: int, start: int = 3, b: int = 2, d: int = 16, heads: int = 2):
    """``steps`` calls of ``model`` with caches of ``start``, ``start + 1``, ... positions; each call's
    results against eager's."""
    torch.manual_seed(1)
    k = torch.randn(b, heads, start, d // heads)
    v = torch.randn(b, heads, start, d // heads)
    eager = model._orig_mod if hasattr(model, "_orig_mod") else model
    for _ in range(steps):
        x = torch.randn(b, 1, d)
        with torch.no_grad():
            want = eager(x, k, v)
            got = model(x, k, v)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)
        k, v = want[1], want[2]


def test_a_growing_cache_compiles_its_static_parts_once(reports):
    model = Decoder().eval()
    decode(torch.compile(model, backend="minicomp"), steps=8)
    split = [r for r in reports if any(d.startswith("dynamic shapes: split") for d in r.decisions)]
    assert len(split) == 1, [r.graph for r in reports]
    parts = compiled_parts(reports)
    assert parts and all(n == 1 for n in parts.values()), parts  # none compiled again for a new length
    assert sum(len(r.kernels) for r in reports if r.graph in parts) >= 3  # norm, projections, MLP in kernels
    ops = {f.op for f in split[0].fallbacks}
    assert "cat.default" in ops and all("symbolic sizes" in f.reason for f in split[0].fallbacks), split[0].summary()
    # eight lengths: before the split, eight compiles of the whole graph
    assert len([r for r in reports if r.kernels]) < 8


def test_a_dynamic_part_compiles_for_a_size_that_comes_back(reports, monkeypatch):
    monkeypatch.setattr(dynamic, "MAX_SIZES", 2)

    def fn(x):
        return torch.softmax(x * 2, -1).sum(0) + x.shape[0]
    f = torch.compile(fn, backend="minicomp", dynamic=True)
    monkeypatch.setattr(dynamic, "RECENT", 3)
    sizes = [3, 4, 5, 6, 3, 5, 5, 3, 3, 5, 7, 7, 7, 3]
    for n in sizes:
        x = torch.randn(n, 6)
        torch.testing.assert_close(f(x), fn(x))
    compiled = [r for r in reports if r.kernels]
    # 3 (back after 3 other calls) runs in PyTorch again, compiles at its third call; 5 at its third;
    # 7 not: two sizes at most
    assert len(compiled) == 2, [r.summary() for r in reports]
    assert all(r.whole_graph_fallback is None for r in reports)


def test_a_part_whose_sizes_recur_in_another_layout_gets_its_own_specialization(reports, monkeypatch):
    """``SizedPart`` asks whether sizes recur of the shapes alone; the specialization is still chosen by
    the full signature, so a transposed input of a compiled size is compiled for, never read as the
    first layout."""
    from minicomp.graphs.options import Options
    monkeypatch.setattr(dynamic, "RECENT", 3)

    def fn(x):
        return torch.softmax(x * 2, -1) + x.shape[0]
    gm = aot_graph(fn, torch.randn(5, 6))
    part = dynamic.SizedPart(gm, Options(), "inference", "sized")
    n = next(i for i, node in enumerate(gm.graph.nodes) if node.op == "placeholder" and
             isinstance(node.meta.get("val"), torch.SymInt))
    rows = torch.randn(5, 6)
    columns = torch.randn(6, 5).t()  # the same sizes, strides (1, 5)

    def call(x):
        args = [x if i != n else 5 for i in range(sum(node.op == "placeholder" for node in gm.graph.nodes))]
        return part(args)[0]
    for x in (rows, rows, columns, columns, rows):
        torch.testing.assert_close(call(x), fn(x))
    assert len(part.compiled) == 1 and len(part._specializations) == 2  # one size, two layouts


def test_a_static_shape_view_at_a_symbolic_offset_is_dynamic(reports):
    # the last position of a growing cache: a static shape whose offset moves every call; a part
    # compiled once for it would read the first call's position forever
    w = torch.randn(8)

    def fn(cache, new):
        grown = torch.cat([cache, new], 1)
        return grown[:, -1:] * w, grown
    f = torch.compile(fn, backend="minicomp")
    cache = torch.randn(2, 3, 8)
    for _ in range(6):
        new = torch.randn(2, 1, 8)
        got, want = f(cache, new), fn(cache, new)
        torch.testing.assert_close(got, want)
        cache = want[1]


def test_gradients_through_a_graph_with_symbolic_sizes(reports):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 3))
    f = torch.compile(model, backend="minicomp", dynamic=True)
    for n in (4, 7, 4, 7):
        x = torch.randn(n, 6, requires_grad=True)
        want = model(x)
        gw = torch.autograd.grad(want.square().sum(), [x, *model.parameters()])
        got = f(x)
        gg = torch.autograd.grad(got.square().sum(), [x, *model.parameters()])
        torch.testing.assert_close(got, want)
        for a, b in zip(gg, gw):
            torch.testing.assert_close(a, b)
    assert any(r.kernels for r in reports)  # the sizes that came back were compiled


def aot_graph(fn, x, *rest):
    """AOTAutograd's forward graph of ``fn`` with ``x``'s first dim symbolic."""
    graphs = []
    aot_compiled(fn, [x, *rest], {0: 0}, graphs.append)
    (gm,) = graphs
    return gm


def test_specialize_retraces_a_copy_at_the_call_sizes():
    from minicomp.frontend.specialize import specialize, symbolic, traced_value

    def fn(x):
        return torch.nn.functional.pad(x, (0, 3))[:, :5].t() * 2
    gm = aot_graph(fn, torch.randn(6, 5))
    args = [7 if isinstance(v, torch.SymInt) else torch.randn(7, 5)
            for v in (traced_value(n) for n in gm.graph.nodes if n.op == "placeholder")]
    spec = specialize(gm, args)
    vals = [traced_value(n) for n in spec.graph.nodes if n.op != "output"]
    assert vals and not any(symbolic(v) for v in vals)
    out = [traced_value(n) for n in spec.graph.nodes if n.op == "call_function"][-1]
    assert tuple(out.shape) == (5, 7) and out.stride() == (1, 5)  # the traced layout, at 7 rows
    assert any(symbolic(traced_value(n)) for n in gm.graph.nodes if n.op == "placeholder")  # gm untouched
    torch.testing.assert_close(spec(*args)[0], fn(args[-1]))


def test_parts_alternate_and_values_flow_forward():
    def fn(x, w):
        y = torch.cat([x, x], 0)  # symbolic: 2 * s0 rows
        z = (w @ w.t())[:, 1:]  # static; a view read by the dynamic part below
        y = y[:, 1:] + z[:1]
        top = torch.topk(w, 2)  # a tuple with static items
        return y.sum(0) + z.sum(0) + top.values.sum(), top.indices
    parts = dynamic.split_by_symbols(aot_graph(fn, torch.randn(5, 4), torch.randn(4, 4)))
    assert [p.dynamic for p in parts] == [k % 2 == 1 for k in range(len(parts))] or \
        [p.dynamic for p in parts] == [k % 2 == 0 for k in range(len(parts))]
    for k, p in enumerate(parts):
        for node in p.nodes:  # every input computed in this part or an earlier one
            assert all(any(a in q.nodes for q in parts[:k + 1]) for a in node.all_input_nodes if a.op != "placeholder"), node
            if node.target is operator.getitem:
                assert node.args[0] in p.nodes  # an item stays with its tuple
    assert any(p.dynamic for p in parts) and any(not p.dynamic for p in parts)
    for p in parts:  # views are replayed where they are read: a part hands over tensors, never views
        members = set(p.nodes)
        assert not [a for n in p.nodes for a in n.all_input_nodes if a not in members and dynamic._is_view(a)]


@pytest.mark.slow
def test_transformers_generate_with_a_dynamic_cache(reports):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   hidden_size=32, intermediate_size=64, vocab_size=96,
                                   max_position_embeddings=64, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(1, 96, (2, 5))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    kw = dict(attention_mask=mask, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        want = model.generate(ids, max_new_tokens=9, min_new_tokens=9, **kw)
        model.forward = torch.compile(model.forward, backend="minicomp")
        got = model.generate(ids, max_new_tokens=5, min_new_tokens=5, **kw)
        assert torch.equal(got, want[:, :10])
        # each cache length seen once: nothing with symbolic sizes compiled yet
        assert not [r.graph for r in reports if any("its sizes vary" in d for d in r.decisions)]
        got = model.generate(ids, max_new_tokens=9, min_new_tokens=9, **kw)
    assert torch.equal(got, want)
    static = [r.graph for r in reports if any("compiled once" in d for d in r.decisions)]
    assert static and len(static) == len(set(static)), static  # no static part compiled twice
    assert all(r.whole_graph_fallback is None for r in reports)
    # the masked attention's repeated key/value heads folded away (tests/test_decoding_rewrites.py)
    assert any(d.startswith("grouped heads: 2 ") for r in reports for d in r.decisions)
