"""The whole-graph cache: a warm compile loads the stored kernels and wrapper without tracing; a graph
it cannot prove plain compiles the normal way; a damaged entry costs a recompile, never a wrong result."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn as nn

import minicomp
from minicomp.graphs import cached
from minicomp.backend import Backend
from minicomp.runtime import cache


def check(actual, expected):
    for a, e in zip(actual if isinstance(actual, tuple) else (actual,),
                    expected if isinstance(expected, tuple) else (expected,)):
        assert a.dtype == e.dtype and a.shape == e.shape and a.stride() == e.stride()
        torch.testing.assert_close(a, e, equal_nan=True)


def cold_then_warm(fn, make_inputs):
    """Compile ``fn`` twice with Dynamo reset in between (the second compile is what a new process
    does), each on fresh random inputs, both compared with eager; the two reports."""
    reports = []
    for _ in range(2):
        torch._dynamo.reset()
        args = make_inputs()
        with torch.no_grad():
            expected = fn(*[a.clone() for a in args])  # clones: fn may mutate its inputs
            check(minicomp.compile(fn)(*args), expected)
        reports.append(minicomp.report())
    return reports


def entries(cache_dir):
    return sorted((cache_dir / "graphs").glob("*.json")) if (cache_dir / "graphs").exists() else []


def with_fallback(x, w):
    return torch.softmax(x * w, -1) + torch.sort(x, 0).values  # sort runs in PyTorch


def test_warm_compile_loads_the_stored_graph(cache_dir):
    cold, warm = cold_then_warm(with_fallback, lambda: (torch.randn(6, 33), torch.randn(33)))
    assert not cold.from_cache and warm.from_cache, warm.summary()
    assert len(entries(cache_dir)) == 1
    assert [k.name for k in warm.kernels] == [k.name for k in cold.kernels]
    assert [f.op for f in warm.fallbacks] == ["sort.default"] == [f.op for f in cold.fallbacks]
    assert warm.decisions == cold.decisions
    assert warm.cache["written"] == 0 and warm.cache["graphs_reused"] == 1, warm.cache
    assert "loaded from the graph cache" in warm.summary()


def test_module_parameters_and_low_precision(cache_dir):
    model = nn.Sequential(nn.LayerNorm(32), nn.Linear(32, 16), nn.GELU()).to(torch.bfloat16).eval()
    cold, warm = cold_then_warm(model, lambda: (torch.randn(5, 32, dtype=torch.bfloat16),))
    assert warm.from_cache and len(warm.kernels) == len(cold.kernels)


def mutates_input(x):
    x.mul_(2)
    return x + 1


@pytest.mark.parametrize("fn", [mutates_input, lambda x: (x.t(), x.sin())],
                         ids=["input mutation", "output is a view of an input"])
def test_graphs_aotautograd_wraps_are_not_stored(cache_dir, fn):
    cold, warm = cold_then_warm(fn, lambda: (torch.randn(4, 5),))
    assert not warm.from_cache and not entries(cache_dir)


def test_outputs_that_alias_each_other_stay_views(cache_dir):
    fn = lambda x: (lambda y: (y, y.t()))(x.sin())  # noqa: E731
    cold, warm = cold_then_warm(fn, lambda: (torch.randn(4, 5),))
    assert warm.from_cache
    with torch.no_grad():
        y, t = minicomp.compile(fn)(torch.randn(4, 5))
    assert t.untyped_storage().data_ptr() == y.untyped_storage().data_ptr()


def test_training_graphs_are_not_stored(cache_dir):
    model = nn.Linear(8, 4)
    for _ in range(2):
        torch._dynamo.reset()
        x = torch.randn(3, 8)
        out = minicomp.compile(model)(x)
        check(out, model(x))
        out.sum().backward()
    assert not entries(cache_dir)


def test_dynamic_shapes_are_not_cached(cache_dir):
    def make():
        x = torch.randn(6, 7)
        torch._dynamo.mark_dynamic(x, 0)
        return (x,)
    cold, warm = cold_then_warm(lambda x: x.exp() * 2, make)
    assert not warm.from_cache and not entries(cache_dir)


@pytest.mark.parametrize("switch", ["MINICOMP_GRAPH_CACHE", "MINICOMP_DUMP"])
def test_switched_off(cache_dir, tmp_path, monkeypatch, switch):
    monkeypatch.setenv(switch, "0" if switch == "MINICOMP_GRAPH_CACHE" else str(tmp_path / "dump"))
    cold, warm = cold_then_warm(lambda x: x.exp() * 2, lambda: (torch.randn(6, 7),))
    assert not warm.from_cache and not entries(cache_dir)


def test_corrupt_entry_recompiles(cache_dir):
    cold_then_warm(with_fallback, lambda: (torch.randn(6, 33), torch.randn(33)))
    [entry] = entries(cache_dir)
    entry.write_bytes(b"\x80\x04garbage")
    with pytest.warns(UserWarning, match="corrupt cache entry"):
        rebuilt, warm = cold_then_warm(with_fallback, lambda: (torch.randn(6, 33), torch.randn(33)))
    assert not rebuilt.from_cache and warm.from_cache  # compiled again, and stored again


def test_changed_kernel_file_recompiles(cache_dir):
    cold, _ = cold_then_warm(with_fallback, lambda: (torch.randn(6, 33), torch.randn(33)))
    for k in cold.kernels:
        with open(k.source_path, "a") as f:
            f.write("\nraise RuntimeError('this file was edited')\n")
    with pytest.warns(UserWarning, match="corrupt cache entry"):  # the compile repairs the files
        rebuilt, warm = cold_then_warm(with_fallback, lambda: (torch.randn(6, 33), torch.randn(33)))
    assert not rebuilt.from_cache and rebuilt.cache["repaired"] == len(cold.kernels), rebuilt.cache
    assert warm.from_cache


def test_another_input_signature_is_traced_and_compiled(cache_dir):
    seen = []

    def recording(gm, example_inputs):
        seen.append((gm, list(example_inputs)))
        return Backend()(gm, example_inputs)
    fn = lambda x: torch.relu(x) * 3 + 1  # noqa: E731
    with torch.no_grad():
        torch.compile(fn, backend=recording)(torch.randn(4, 8))
    [(gm, example)] = seen
    backend = Backend()
    with torch.no_grad():
        key = cached.key(gm, example, backend.options)
    hit = cached.lookup(key, gm, rebuild=lambda args: backend._trace(gm, args, None))
    assert hit is not None
    x = torch.randn(4, 8)
    check(hit([x])[0], fn(x))
    misaligned = torch.randn(33)[1:].view(4, 8)  # another signature: not 16-byte aligned
    check(hit([misaligned])[0], fn(misaligned))
    assert hit._traced is not None


def test_key_changes_with_tuned_schedules_grad_mode_and_inputs(cache_dir):
    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    options = Backend().options
    x = torch.randn(4, 4)
    first = cached.key(gm, [x], options)
    assert first == cached.key(gm, [torch.randn(4, 4)], options)
    assert first != cached.key(gm, [torch.randn(4, 5)], options)
    assert first != cached.key(gm, [x.t()], options)
    assert first != cached.key(gm, [x.half()], options)
    with torch.no_grad():
        assert first != cached.key(gm, [x], options)
    cache.store_tuned("some-kernel", {"num_warps": 4})
    assert first != cached.key(gm, [x], options)


def test_the_key_digests_every_module_of_the_compiler():
    """A changed pass, template or code generator invalidates every entry (the digest read ``graphs/``
    alone after the wiring moved there, and a fused kernel outlived the fusion rule that made it)."""
    import minicomp.codegen
    import minicomp.passes.fusion
    files = set(cached.sources())
    for module in (minicomp.passes.fusion, minicomp.codegen, minicomp, cached):
        assert Path(module.__file__).resolve() in files, module.__name__
