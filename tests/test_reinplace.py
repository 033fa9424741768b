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


def test_an_accumulating_update_is_not_rewritten():
    # not idempotent: a first run that failed half-way and ran again in PyTorch would add twice
    def step(cache, rows, pos):
        cache.index_put_((torch.arange(2)[:, None], pos[None].expand(2, 1)), rows, accumulate=True)
        return cache.amax(1)
    before = minicomp.report()
    run_both(step, lambda: torch.randn(2, 8, 4))
    assert not [d for r in minicomp.reports_since(before) for d in r.decisions if d.startswith("reinplace")]


def test_not_under_cuda_graphs():
    # a write inside a captured graph would land in the replay's copy of the input, and recording runs
    # the graph more than once: the update stays out of place there (and is captured)
    def step(cache, rows, pos):
        cache.index_copy_(1, pos, rows)
        return cache.sum(1)
    eager_cache = torch.randn(2, 8, 4)
    cache = eager_cache.clone()
    torch._dynamo.mark_static_address(cache)
    before = minicomp.report()
    f = minicomp.compile(step, mode="reduce-overhead")
    for k in range(3):
        rows, pos = torch.randn(2, 1, 4), torch.tensor([k])
        with torch.no_grad():
            torch.testing.assert_close(f(cache, rows, pos), step(eager_cache, rows, pos))
        torch.testing.assert_close(cache, eager_cache)
    assert not [d for r in minicomp.reports_since(before) for d in r.decisions if d.startswith("reinplace")]
