"""Updates of mutated inputs written in place (``minicomp/frontend/reinplace.py``): a static cache's
``index_copy_`` no longer copies the whole cache twice a call; results and the cache as eager's."""
from __future__ import annotations

import torch

import minicomp


def run_both(step, make_cache, calls: int = 3):
    """``step(cache, rows, pos)`` eagerly and compiled, each on its own cache; results and caches
    compared after every call."""
    eager_cache = make_cache()
    cache = eager_cache.clone()
    torch._dynamo.mark_static_address(cache)
    compiled = minicomp.compile(step)
    for k in range(calls):
        rows, pos = torch.randn(2, 1, 4), torch.tensor([k + 1])
        with torch.no_grad():
            want, got = step(eager_cache, rows, pos), compiled(cache, rows, pos)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(cache, eager_cache)


def test_a_cache_update_runs_in_place():
    def step(cache, rows, pos):
        cache.index_copy_(1, pos, rows)
        return (cache * 2).sum(1)
    before = minicomp.report()
    run_both(step, lambda: torch.randn(2, 8, 4))
    decisions = [d for r in minicomp.reports_since(before) for d in r.decisions if d.startswith("reinplace")]
    assert decisions, [r.summary() for r in minicomp.reports_since(before)]


def test_an_input_read_before_its_update_is_not_rewritten():
    def step(cache, rows, pos):
        old = cache.sum(1)  # the value before the write: an in-place write would change it
        cache.index_copy_(1, pos, rows)
        return old + cache.sum(1)
    before = minicomp.report()
    run_both(step, lambda: torch.randn(2, 8, 4))
    assert not [d for r in minicomp.reports_since(before) for d in r.decisions if d.startswith("reinplace")]


def test_index_put_with_accumulate_in_place():
    def step(cache, rows, pos):
        cache.index_put_((torch.arange(2)[:, None], pos[None].expand(2, 1)), rows, accumulate=True)
        return cache.amax(1)
    run_both(step, lambda: torch.randn(2, 8, 4))


def test_under_cuda_graphs_only_a_static_address_input_is_written_in_place():
    # a replay reads a copy of any other input: an in-graph write would land there (and the graph
    # would not be captured); its out-of-place update is captured instead
    def step(cache, rows, pos):
        cache.index_copy_(1, pos, rows)
        return cache.sum(1)
    for static in (False, True):
        torch._dynamo.reset()
        eager_cache = torch.randn(2, 8, 4)
        cache = eager_cache.clone()
        if static:
            torch._dynamo.mark_static_address(cache)
        before = minicomp.report()
        f = minicomp.compile(step, mode="reduce-overhead")
        for k in range(3):
            rows, pos = torch.randn(2, 1, 4), torch.tensor([k])
            with torch.no_grad():
                torch.testing.assert_close(f(cache, rows, pos), step(eager_cache, rows, pos))
            torch.testing.assert_close(cache, eager_cache)
        done = [d for r in minicomp.reports_since(before) for d in r.decisions if d.startswith("reinplace")]
        assert bool(done) == static, done
