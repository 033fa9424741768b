"""Triton compiles in worker processes (``runtime/compile_workers.py``), checked on the CPU: kernels
scheduled for a fake H200 are compiled for sm_90 (Triton ships ptxas), with a stand-in for Triton's
CUDA driver where the launch path asks for the device, stream and target. A worker fills Triton's
on-disk cache and the parent's own compile must then be a cache hit; every way a worker can fail
must leave the job to the parent. ``tests/test_cuda.py`` checks the real thing on a GPU."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from minicomp.assemble import _arg_dtypes
from minicomp.backend import decompositions
from minicomp.codegen.naming import content_named_source
from minicomp.compiler import PIPELINE
from minicomp.frontend.lowering import Lowering
from minicomp.passes.manager import run_pipeline
from minicomp.passes.program import launch_options
from minicomp.runtime import cache, compile_workers, triton_shims
from tests.utils import H200


class _FakeCudaDriver:
    """What ``JITFunction.warmup`` asks Triton's driver: device 0, stream 0, an sm_90 target."""

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget
        return GPUTarget("cuda", 90, 32)

    class launcher_cls:  # noqa: N801 - Triton's name; nothing to launch here
        def __init__(self, src, metadata):
            pass


@pytest.fixture
def sm90(monkeypatch, tmp_path):
    """A fake CUDA driver, an empty Triton cache and no pool left over from another test."""
    from triton.runtime import driver
    monkeypatch.setattr(driver, "_active", _FakeCudaDriver())
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setenv("MINICOMP_COMPILE_WORKERS", "2")
    compile_workers.shutdown()
    yield tmp_path / "triton"
    compile_workers.shutdown()


def _jobs(fn, *shapes, dtype=torch.float32) -> list[tuple]:
    """Precompile jobs (jit function, dtypes, launch keywords) of ``fn``'s kernels scheduled for an
    H200, loaded compiled (not interpreted) from the minicomp cache."""
    args = [torch.randn(s, dtype=dtype) for s in shapes]
    graph = Lowering(make_fx(fn, decomposition_table=decompositions())(*args), args).run()
    graph.target = H200
    jobs = []
    for k in run_pipeline(graph, PIPELINE, None, None).kernels:
        function, source = content_named_source(k)
        module = cache.load(cache.store("kernels", function, source), interpret=False)
        jobs.append((getattr(module, function), _arg_dtypes(k), launch_options(k)))
    return jobs


def _files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()} if folder.exists() else set()


def _compile_in_worker(pool, job) -> bool:
    """One job through a worker the way ``cache.precompile`` sends it; True if a worker compiled it."""
    done = []
    fn, dtypes, options = job
    triton_shims.compile_ahead_elsewhere(
        fn, dtypes, options, lambda *a: done.append(compile_workers.compile_elsewhere(pool, *a)))
    return done == [True]


def test_a_worker_fills_tritons_cache_and_the_parents_compile_hits_it(sm90):
    (job,) = _jobs(lambda x: torch.sigmoid(x) * x + 1, (1000,))
    pool = compile_workers.start()
    seen = {}

    def elsewhere(src, target, options):
        seen["before"] = _files(sm90)
        seen["worked"] = compile_workers.compile_elsewhere(pool, src, target, options)
        seen["after worker"] = _files(sm90)
    triton_shims.compile_ahead_elsewhere(*job, elsewhere)
    assert seen["worked"], compile_workers.stats
    assert not seen["before"] and any(f.endswith(".cubin") for f in seen["after worker"]), seen
    assert _files(sm90) == seen["after worker"]  # the parent's compile wrote nothing: a cache hit
    # and the parent's compile for the launch hits it too: a fresh function object, same file
    cache._modules.clear()
    (again,) = _jobs(lambda x: torch.sigmoid(x) * x + 1, (1000,))
    triton_shims.compile_ahead(*again)
    assert _files(sm90) == seen["after worker"]


def test_precompile_sends_every_kernel_to_the_workers(sm90):
    jobs = _jobs(lambda x, w: (torch.softmax(x, -1) * w, x.sum(0), torch.tanh(x * w)), (16, 32), (32,))
    jobs += _jobs(lambda x: (x.cumsum(-1), x.amax(0)), (16, 32))
    assert len(jobs) > cache.FEW_JOBS
    before = cache.stats["compiled_in_workers"]
    cache.precompile(jobs)
    assert cache.stats["compiled_in_workers"] - before == len(jobs), compile_workers.stats
    hashes = {p.parent.name for p in sm90.rglob("*.cubin")}
    assert len(hashes) == len(jobs)
    for job in jobs:  # what the launches do: each finds its kernel in Triton's cache
        triton_shims.compile_ahead(*job)
    assert {p.parent.name for p in sm90.rglob("*.cubin")} == hashes


def test_few_kernels_do_not_wait_for_workers_still_starting(sm90, monkeypatch):
    jobs = _jobs(lambda x, w: (x * 3 - 1, x.sum(0) * w), (100, 8), (8,))
    assert 1 < len(jobs) <= cache.FEW_JOBS
    monkeypatch.setenv("MINICOMP_COMPILE_WORKERS", "1")
    pool = compile_workers.start()
    monkeypatch.setattr(pool, "any_ready", lambda: False)
    monkeypatch.setattr(pool, "run", lambda data: pytest.fail("sent to a worker"))
    before = cache.stats["compiled_in_workers"]
    cache.precompile(jobs)
    assert cache.stats["compiled_in_workers"] == before
    assert len({p.parent for p in sm90.rglob("*.cubin")}) == len(jobs)  # compiled here


@pytest.mark.parametrize("failure", ["crashed", "timed_out"])
def test_a_worker_that_crashes_or_hangs_leaves_the_job_to_the_parent(sm90, failure):
    (job,) = _jobs(lambda x: torch.relu(x) + 2, (64,))
    command = {"crashed": [sys.executable, "-c", "import sys; sys.stdin.buffer.read(1); sys.exit(3)"],
               "timed_out": [sys.executable, "-c", "import time; time.sleep(60)"]}[failure]
    pool = compile_workers.Pool(1, job_timeout=1.0, command=command)
    try:
        before = dict(compile_workers.stats)
        start = time.perf_counter()
        assert not _compile_in_worker(pool, job)
        assert time.perf_counter() - start < 8
        assert compile_workers.stats[failure] == before[failure] + 1, compile_workers.stats
        assert list(sm90.rglob("*.cubin"))  # the parent compiled it
        assert pool.failures == 1 and pool._workers[0].proc.poll() is not None  # stopped, not left behind
    finally:
        pool.close()


def test_a_compile_error_in_the_worker_is_reported_and_the_worker_kept(sm90, tmp_path):
    import triton
    from triton.backends.compiler import GPUTarget
    broken = tmp_path / "broken_kernel.py"
    broken.write_text("import triton\n\n@triton.jit\ndef broken(x_ptr):\n    undefined_name(x_ptr)\n")
    module = cache.load(broken, interpret=False)

    class Source:  # what the hook hands over
        fn = module.broken
        signature, constants, attrs = {"x_ptr": "*fp32"}, {}, {}
    pool = compile_workers.Pool(1, job_timeout=30.0)
    try:
        before = dict(compile_workers.stats)
        assert not compile_workers.compile_elsewhere(pool, Source(), GPUTarget("cuda", 90, 32), {})
        assert compile_workers.stats["errors"] == before["errors"] + 1
        assert pool.failures == 0 and pool._workers[0].proc.poll() is None  # a Triton error: it serves on
        with pytest.raises(Exception, match="undefined_name"):  # the parent's compile reports it, as the launch
            src = triton.compiler.ASTSource(module.broken, Source.signature)
            triton.compile(src, target=GPUTarget("cuda", 90, 32))
    finally:
        pool.close()


def test_workers_that_keep_failing_are_given_up(sm90):
    pool = compile_workers.Pool(1, job_timeout=5.0, command=[sys.executable, "-c", "pass"])
    try:
        kinds = [pool.run(b"job")[0] for _ in range(compile_workers.MAX_FAILURES + 1)]
        assert kinds == ["crashed"] * compile_workers.MAX_FAILURES + ["disabled"]
        assert not pool.usable
    finally:
        pool.close()


def test_a_job_that_cannot_be_pickled_stays_in_the_parent(sm90):
    pool = compile_workers.Pool(1, job_timeout=5.0, command=[sys.executable, "-c", "pass"])
    try:
        class Source:  # what the hook sees, with a constant no worker could rebuild
            fn = _jobs(lambda x: x + 1, (8,))[0][0]
            signature, constants, attrs = {"x": "*fp32"}, {(1,): lambda: 0}, {}
        before = dict(compile_workers.stats)
        assert not compile_workers.compile_elsewhere(pool, Source(), object(), {})
        assert compile_workers.stats["unpicklable"] == before["unpicklable"] + 1
        assert compile_workers.stats["sent"] == before["sent"] and pool.failures == 0
    finally:
        pool.close()


def test_a_kernel_module_that_prints_does_not_garble_the_replies(sm90, tmp_path):
    jobs = _jobs(lambda x: x * x, (32,))
    path = Path(jobs[0][0].fn.__code__.co_filename)
    noisy = tmp_path / path.name
    noisy.write_text("print('noise on stdout')\n" + path.read_text())
    module = cache.load(noisy, interpret=False)
    pool = compile_workers.Pool(1, job_timeout=30.0)
    try:
        assert _compile_in_worker(pool, (getattr(module, jobs[0][0].__name__),) + jobs[0][1:])
    finally:
        pool.close()


def test_no_workers_when_asked_for_none(monkeypatch):
    compile_workers.shutdown()
    for name, value in (("MINICOMP_COMPILE_WORKERS", "0"), ("MINICOMP_PARALLEL_COMPILE", "0")):
        with monkeypatch.context() as m:
            m.setenv(name, value)
            assert compile_workers.wanted_workers() == 0 and compile_workers.start() is None
    monkeypatch.setenv("MINICOMP_COMPILE_WORKERS", "3")
    assert compile_workers.wanted_workers() == 3
    monkeypatch.delenv("MINICOMP_COMPILE_WORKERS")
    assert 1 <= compile_workers.wanted_workers() <= 16


def test_the_pool_is_stopped_at_shutdown_and_not_shared_with_a_forked_child(monkeypatch):
    monkeypatch.setenv("MINICOMP_COMPILE_WORKERS", "1")
    compile_workers.shutdown()
    pool = compile_workers.start()
    assert compile_workers.start() is pool  # one per process
    pool._spawner.join()
    worker = pool._workers[0]
    monkeypatch.setattr(pool, "pid", os.getpid() + 1)  # as a forked child sees it
    assert not pool.usable
    pool.close()  # a child's exit must not stop its parent's workers
    assert worker.proc.poll() is None
    monkeypatch.undo()
    compile_workers.shutdown()
    assert worker.proc.poll() is not None
