"""The on-disk cache of minicomp across processes: kernel files under the cache dir, a second process that
writes nothing, corrupt entries rebuilt, an unwritable dir, and concurrent writers sharing one dir."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

import minicomp
from tests.test_runtime import assert_same, last_json, run_child, snapshot
from tests.utils import compile_and_compare


# A child script that compiles a fixed function and prints its results and what the cache did.
CACHE_CHILD = """
    import json, warnings
    import torch
    import minicomp
    from minicomp.runtime import cache

    def fn(x, y):
        return torch.relu(x) * 0.5 + y.sum(-1, keepdim=True)

    torch.manual_seed(0)
    x, y = torch.randn(4, 6), torch.randn(4, 3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = minicomp.compile(fn)(x, y)
    rep = minicomp.report()
    print(json.dumps({
        "ok": bool(torch.allclose(out, fn(x, y), atol=1e-5, rtol=1e-5)),
        "cache": rep.cache,
        "stats": dict(cache.stats),
        "whole_graph_fallback": rep.whole_graph_fallback,
        "kernel_paths": [k.source_path for k in rep.kernels],
        "warnings": [str(w.message) for w in caught if "minicomp" in str(w.message)],
    }))
"""


# --- 7. cache ---------------------------------------------------------------------------------

def test_cache_writes_kernel_files_under_cache_dir(cache_dir):
    x = torch.randn(4, 6)
    fn = lambda x: torch.relu(x) * 3 + 1  # noqa: E731
    report = compile_and_compare(fn, x, kernels=1)
    kernel_files = list((cache_dir / "kernels").glob("*.py"))
    assert kernel_files, snapshot(cache_dir) if cache_dir.exists() else "no cache dir"
    assert Path(report.kernels[0].source_path).resolve().parent == (cache_dir / "kernels").resolve()
    assert report.cache["written"] >= 1, report.cache


@pytest.mark.slow
def test_cache_second_process_writes_nothing_and_corrupt_files_are_rebuilt(cache_dir):
    env = {"MINICOMP_CACHE_DIR": cache_dir}
    first = last_json(run_child(CACHE_CHILD, **env))
    assert first["ok"] and first["whole_graph_fallback"] is None, first
    assert first["cache"]["written"] >= 2, first  # at least one kernel and the wrapper
    assert first["kernel_paths"] and all(Path(p).is_file() for p in first["kernel_paths"])
    assert all(Path(p).resolve().is_relative_to(cache_dir.resolve()) for p in first["kernel_paths"]), first
    before = snapshot(cache_dir)
    assert any(name.startswith("kernels") for name in before), before

    second = last_json(run_child(CACHE_CHILD, **env))
    assert second["ok"], second
    assert second["cache"]["graphs_reused"] == 1, second  # loaded whole from the graph cache
    assert second["cache"]["written"] == 0, second
    assert second["cache"]["repaired"] == 0, second
    assert second["cache"]["reused"] >= 2, second
    assert snapshot(cache_dir) == before
    assert second["kernel_paths"] == first["kernel_paths"]
    assert not second["warnings"], second

    # Now corrupt every file, kernels and wrappers alike, with bytes that are not even UTF-8.
    files = sorted(p for p in cache_dir.rglob("*.py") if p.is_file())
    assert any(p.parent.name == "wrappers" for p in files), files
    assert any(p.parent.name == "kernels" for p in files), files
    originals = {p: p.read_bytes() for p in files}
    for p in files:
        p.write_bytes(b"\xff\xfe\x00garbage")
    third = last_json(run_child(CACHE_CHILD, **env))
    assert third["ok"] and third["whole_graph_fallback"] is None, third
    assert third["cache"]["repaired"] == len(files), third
    assert third["cache"]["reused"] == 0, third
    assert sum("corrupt" in w for w in third["warnings"]) == len(files), third
    for p in files:
        assert p.read_bytes() == originals[p], p


def _cache_child_fn(x, y):  # the same function as CACHE_CHILD's ``fn``
    return torch.relu(x) * 0.5 + y.sum(-1, keepdim=True)


@pytest.mark.slow
def test_cache_corrupt_kernel_is_rebuilt(cache_dir):
    # Populate the cache in this process: kernel files are named by content only, so the child
    # compiling the same function looks for the very same kernel files.
    x, y = torch.randn(4, 6), torch.randn(4, 3)
    assert_same(minicomp.compile(_cache_child_fn)(x, y), _cache_child_fn(x, y))
    paths = [Path(k.source_path) for k in minicomp.report().kernels]
    assert paths and all(p.resolve().is_relative_to(cache_dir.resolve()) for p in paths)
    originals = {p: p.read_text() for p in paths}
    for p in paths:
        p.write_text("#" * len(originals[p]))  # same size, wrong content

    child = last_json(run_child(CACHE_CHILD, MINICOMP_CACHE_DIR=cache_dir))
    assert child["ok"] and child["whole_graph_fallback"] is None, child
    assert sorted(child["kernel_paths"]) == sorted(map(str, paths)), child
    assert child["cache"]["repaired"] == len(paths), child
    assert any("corrupt" in w for w in child["warnings"]), child
    for p in paths:
        assert p.read_text() == originals[p]


def test_cache_unwritable_dir_warns_and_still_works(tmp_path, monkeypatch):
    from minicomp.runtime import cache
    monkeypatch.setattr(cache, "_fallback_dir", None, raising=False)  # warn as a fresh process would
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("MINICOMP_CACHE_DIR", str(blocker / "sub"))
    x = torch.randn(3, 7)
    fn = lambda x: torch.abs(x) * 5 - 2  # noqa: E731
    with pytest.warns(UserWarning, match="not writable"):
        out = minicomp.compile(fn)(x)
    assert_same(out, fn(x))
    report = minicomp.report()
    assert report.whole_graph_fallback is None
    assert report.kernels and all(Path(k.source_path).is_file() for k in report.kernels)
    assert not any(str(blocker) in k.source_path for k in report.kernels)
    assert blocker.is_file()


def _concurrent_cache_worker(cache_dir: str, barrier, results, seed: int) -> None:
    """One of several processes compiling the same function into one shared cache at the same time
    (run in a forkserver child: torch and minicomp are already imported)."""
    import random
    import traceback
    import warnings
    from minicomp.runtime import cache

    os.environ["MINICOMP_CACHE_DIR"] = cache_dir
    t0 = time.perf_counter()
    out = {"seed": seed, "ok": [], "whole_graph_fallbacks": [], "warnings": [], "stats": {}, "error": None,
           "seconds": []}  # when warm and after each round, for diagnosing a slow run
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            minicomp.compile(lambda x: torch.sin(x) + 1)(torch.randn(3))  # warm Dynamo up before the race
            out["seconds"].append(round(time.perf_counter() - t0, 2))
            rng = random.Random(seed)
            for step, shape in enumerate([(4, 6), (5, 6), (4, 6), (2, 9)]):
                barrier.wait(timeout=60)  # every round starts in all processes at once
                time.sleep(rng.uniform(0, 0.02))
                torch._dynamo.reset()
                gen = torch.Generator().manual_seed(shape[0] * 100 + shape[1])  # same inputs everywhere
                x, y = torch.randn(shape, generator=gen), torch.randn(shape[0], 3, generator=gen)
                actual = minicomp.compile(_cache_child_fn)(x, y)
                out["ok"].append(bool(torch.allclose(actual, _cache_child_fn(x, y), atol=1e-5, rtol=1e-5)))
                out["whole_graph_fallbacks"].append(minicomp.report().whole_graph_fallback)
                # Large entries, written by every process at once: a reader seeing one half-written
                # would take it for a corrupt entry and warn.
                big = [f"# stress entry {step}.{k}\n" + "x = 1\n" * 40_000 for k in range(8)]  # 0.24 MB each
                for text in rng.sample(big, len(big)):
                    path = cache.store("stress", "big", text)
                    if path.read_text() != text:
                        out["warnings"].append(f"minicomp: read back a different {path}")
                out["seconds"].append(round(time.perf_counter() - t0, 2))
        out["warnings"] += [str(w.message) for w in caught if "minicomp" in str(w.message)]
        out["stats"] = dict(cache.stats)
    except BaseException:
        out["error"] = traceback.format_exc()
    results.put(out)


@pytest.mark.slow
def test_cache_concurrent_writers_share_one_cache_dir(cache_dir):
    import multiprocessing as mp
    import queue
    from minicomp.runtime import cache

    # forkserver: like spawn, workers start from a clean process (not a fork of this one, with its
    # threads and compiled state), but torch is imported once, in the server, not once per worker.
    ctx = mp.get_context("forkserver")
    # What a first compile imports, imported once in the server rather than in each worker.
    ctx.set_forkserver_preload(["torch", "torch._dynamo", "functorch.compile", "torch.export._trace",
                                "triton.compiler.code_generator", "triton.runtime.interpreter", "minicomp",
                                "minicomp.backend", "tests.test_runtime_cache"])
    n = 4
    barrier, results = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_concurrent_cache_worker, args=(str(cache_dir), barrier, results, seed))
             for seed in range(n)]
    for p in procs:
        p.start()
    outs = []
    try:
        for _ in procs:
            outs.append(results.get(timeout=180))
    except queue.Empty:
        pass
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    assert len(outs) == n, f"only {len(outs)} of {n} workers reported: {outs}"
    for out in outs:
        assert out["error"] is None, out["error"]
        assert out["ok"] == [True] * 4, out
        assert out["whole_graph_fallbacks"] == [None] * 4, out
        assert not any("corrupt" in w or "different" in w for w in out["warnings"]), out["warnings"]
        assert out["stats"]["repaired"] == 0, out
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]

    # Every entry is complete: valid Python whose content hash is the one in its name; no temp or probe
    # files are left behind.
    files = sorted(p for p in cache_dir.rglob("*") if p.is_file())
    leftovers = [p.name for p in files if p.name.startswith((".tmp-", ".probe-"))]
    assert not leftovers, leftovers
    entries = [p for p in files if p.suffix == ".py"]
    assert {p.parent.name for p in entries} >= {"kernels", "wrappers", "stress"}, entries
    assert len([p for p in entries if p.parent.name == "stress"]) == 4 * 8
    for p in entries:
        text = p.read_text()
        compile(text, str(p), "exec")
        assert p.stem.rsplit("_", 1)[1] == cache.digest(text), p
