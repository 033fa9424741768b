"""Triton compiles in worker processes that import only Triton.

Why: Triton's compile is mostly Python (its frontend walks the kernel's AST holding the GIL), so the
thread pool of ``cache.precompile`` gains only about 2x on a 16-core host; a cold GPT-2 spent most of
its 5-6 s compile there. Inductor compiles in processes, but a worker that imports torch takes 3-4 s
to start. Generated kernel modules import only ``triton`` (~0.45 s), so ours are plain
``subprocess.Popen([python, compile_worker_script.py])`` processes: not ``multiprocessing`` (spawn
re-imports the user's ``__main__``; fork is unsafe once CUDA is initialized).

How a job runs: ``triton_shims.compile_ahead_elsewhere`` intercepts the launch's own call of Triton's
``compile(src, target=, options=)`` and hands it to ``compile_elsewhere``, which sends the kernel's
file path and function name, ``src``'s signature, constants and attributes, the target, the options
and the environment to an idle worker. The worker compiles into Triton's on-disk cache; the parent's
compile then continues and finds the kernel there (same source, same options, same TRITON_*
variables and cache folder: the same key). Whatever goes wrong (a job that cannot be pickled, a
worker that crashes, hangs past ``MINICOMP_COMPILE_TIMEOUT`` or reports an error, a cache key that
differs after all) only means the parent compiles that job itself, as it did before this module.

The pool is one per process, started by ``start()`` (non-blocking: the backend calls it when a CUDA
graph's compile begins, so workers import Triton while AOTAutograd, lowering and the passes run),
sized ``MINICOMP_COMPILE_WORKERS`` (0: no workers, threads only) or ``min(cores, 16)``, and shut
down at exit. A worker compiles a tiny kernel for the GPU's target as soon as Triton is imported: a
process's first compile costs ~0.4 s more than the next (measured on the CPU host), and this way
that is paid while the parent still lowers.
"""
from __future__ import annotations

import atexit
import os
import pickle
import queue
import select
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

SCRIPT = Path(__file__).with_name("compile_worker_script.py")
_HEADER = struct.Struct(">Q")
MAX_FAILURES = 3  # workers crashing or hanging this many times in a row, none compiling: stop using them

stats = {"sent": 0, "compiled": 0, "errors": 0, "crashed": 0, "timed_out": 0, "unpicklable": 0, "disabled": 0,
         "started": 0}
_lock = threading.Lock()
_stats_lock = threading.Lock()
_pool: Pool | None = None
_registered: list[bool] = []  # shutdown() registered with atexit


def _count(key: str) -> None:
    with _stats_lock:  # jobs finish on several threads
        stats[key] += 1


def wanted_workers() -> int:
    """``MINICOMP_COMPILE_WORKERS`` if set (0: none), else ``min(usable cores, 16)``; 0 when
    ``MINICOMP_PARALLEL_COMPILE=0`` (nothing is compiled ahead then)."""
    if os.environ.get("MINICOMP_PARALLEL_COMPILE", "1") == "0":
        return 0
    value = os.environ.get("MINICOMP_COMPILE_WORKERS")
    if value is not None and value.strip():
        try:
            return max(0, int(value))
        except ValueError:
            pass
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return min(cores, 16)


def timeout() -> float:
    """Seconds a worker may take for one job (``MINICOMP_COMPILE_TIMEOUT``, default 120)."""
    try:
        return float(os.environ.get("MINICOMP_COMPILE_TIMEOUT", "120"))
    except ValueError:
        return 120.0


def _warm_up_target() -> list[str]:
    """The current CUDA device's Triton target (``cuda <arch> 32``, as Triton's driver derives it)
    for the workers' warm-up compile; none when CUDA is not in use here yet (no warm-up then)."""
    torch = sys.modules.get("torch")
    try:
        if torch is None or torch.version.hip or not torch.cuda.is_initialized():
            return []
        major, minor = torch.cuda.get_device_capability()
        return ["cuda", str(major * 10 + minor), "32"]
    except Exception:  # noqa: BLE001 - only a warm-up
        return []


def _warm_up_parent() -> None:
    """Hash Triton's own files now (``triton_key``, part of every cache key; 0.34 s on the CPU host,
    cached for the process), which the parent's first compile would otherwise pay on the critical path.
    Mostly file reads and hashing, which release the GIL while lowering runs."""
    try:
        from triton.runtime.cache import triton_key
        triton_key()
    except Exception:  # noqa: BLE001 - only a warm-up
        pass


class _Worker:
    """One worker process and the framed pickles to and from it."""

    def __init__(self, command: list[str]):
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, close_fds=True)
        self.ready = False  # Triton imported (its first message read)
        self.lock = threading.Lock()  # held by the job using it (pipe reads are not shared)
        _count("started")

    def poll_ready(self) -> bool:
        """Whether the worker has imported Triton; never waits (False while another job uses it)."""
        if self.ready or not self.lock.acquire(blocking=False):
            return self.ready
        try:
            if select.select([self.proc.stdout], [], [], 0)[0]:
                self.ready = self._read(time.monotonic() + 1.0)[0] == "ready"
        except (OSError, ValueError, EOFError, TimeoutError, pickle.UnpicklingError, struct.error):
            pass
        finally:
            self.lock.release()
        return self.ready

    def request(self, data: bytes, deadline: float):
        """Send one framed request and return the worker's reply; raises EOFError (the worker died)
        or TimeoutError (``deadline``, a ``time.monotonic()`` value, passed)."""
        self._write_all(_HEADER.pack(len(data)) + data, deadline)
        if not self.ready:
            if self._read(deadline)[0] != "ready":
                raise EOFError("worker did not start")
            self.ready = True
        return self._read(deadline)

    def _write_all(self, data: bytes, deadline: float) -> None:
        """Write in pieces the pipe takes without blocking, so a worker that hangs before reading
        (still importing Triton, say) cannot block the parent past the deadline."""
        fd, view = self.proc.stdin.fileno(), memoryview(data)
        while view:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([], [fd], [], remaining)[1]:
                raise TimeoutError
            try:
                view = view[os.write(fd, view[:select.PIPE_BUF]):]
            except OSError as e:  # BrokenPipeError: it exited
                raise EOFError(f"worker gone: {e}") from e

    def _read(self, deadline: float):
        header = self._read_exact(_HEADER.size, deadline)
        return pickle.loads(self._read_exact(_HEADER.unpack(header)[0], deadline))

    def _read_exact(self, size: int, deadline: float) -> bytes:
        fd, chunks, left = self.proc.stdout.fileno(), [], size
        while left:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                raise TimeoutError
            chunk = os.read(fd, left)
            if not chunk:
                raise EOFError("worker exited")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def kill(self) -> None:
        """Kill the process: it holds nothing that needs flushing (Triton's cache writes are atomic)."""
        try:
            self.proc.kill()
        except OSError:
            pass

    def stop(self) -> None:
        """Kill the process and wait for it."""
        self.kill()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass


class Pool:
    """A fixed number of worker slots; a slot whose worker died or hung gets a new one when next used."""

    def __init__(self, size: int, job_timeout: float, command: list[str] | None = None):
        self.size, self.job_timeout = size, job_timeout
        self.command = command or [sys.executable, str(SCRIPT), *_warm_up_target()]
        self.pid = os.getpid()  # a forked child must not use (or stop) its parent's workers
        self.failures = 0  # crashes and hangs since the last job a worker compiled
        self.closed = False
        self._workers: list[_Worker | None] = [None] * size
        self._idle: queue.SimpleQueue[int] = queue.SimpleQueue()
        # Popen takes ~10 ms in a process holding torch (16 took 0.2 s on the 2-core CPU host): the
        # workers are started on a thread of their own, each slot usable as soon as its worker is
        self._spawner = threading.Thread(target=self._spawn_all, name="minicomp-compile-workers", daemon=True)
        self._spawner.start()

    def _spawn_all(self) -> None:
        for slot in range(self.size):
            if self.closed:
                return
            try:
                self._workers[slot] = _Worker(self.command)
            except Exception:  # noqa: BLE001 - run() tries again, and counts the failure
                pass
            self._idle.put(slot)
        _warm_up_parent()

    @property
    def usable(self) -> bool:
        return os.getpid() == self.pid and not self.closed and self.failures < MAX_FAILURES

    def any_ready(self) -> bool:
        """Whether some worker has imported Triton already (a one-kernel graph does not wait for one)."""
        return any(w is not None and w.poll_ready() for w in list(self._workers))

    def run(self, data: bytes) -> tuple[str, object]:
        """Run one pickled job on the next idle worker: ("ok", seconds), ("error", text) from Triton,
        ("crashed" | "timed_out", text) when the worker died or hung (it is replaced), or
        ("disabled", text) once workers have failed ``MAX_FAILURES`` times in a row."""
        try:
            slot = self._idle.get(timeout=self.job_timeout)
        except queue.Empty:
            return "timed_out", "no worker free"
        try:
            if not self.usable:
                return "disabled", f"pool closed or {self.failures} worker failures in a row"
            worker = self._workers[slot]
            if worker is None or worker.proc.poll() is not None:  # never started, or died since its last job
                if worker is not None:
                    worker.stop()
                try:
                    worker = self._workers[slot] = _Worker(self.command)
                except Exception as e:  # noqa: BLE001 - OSError, say
                    self._workers[slot] = None
                    self.failures += 1
                    return "crashed", f"cannot start a worker: {e}"
            with worker.lock:
                try:
                    reply = worker.request(data, time.monotonic() + self.job_timeout)
                except (EOFError, TimeoutError, pickle.UnpicklingError, struct.error) as e:
                    worker.stop()
                    self.failures += 1
                    return "timed_out" if isinstance(e, TimeoutError) else "crashed", f"{type(e).__name__}: {e}"
            if reply[0] == "ok":
                self.failures = 0
            return reply
        finally:
            self._idle.put(slot)

    def close(self) -> None:
        """Stop every worker (from the process that started them only)."""
        if os.getpid() != self.pid:
            return
        self.closed = True
        self._spawner.join()
        workers = [w for w in self._workers if w is not None]
        for worker in workers:
            worker.kill()
        for worker in workers:
            worker.stop()


def start() -> Pool | None:
    """Start the process's pool if it is wanted and not started (non-blocking: the workers import
    Triton in the background). Returns it, or None (``MINICOMP_COMPILE_WORKERS=0``, or workers that
    keep failing)."""
    global _pool
    with _lock:
        if _pool is not None and os.getpid() != _pool.pid:
            _pool = None  # a forked child: its parent's workers are not its own
        if _pool is None:
            size = wanted_workers()
            if size == 0:
                return None
            try:
                _pool = Pool(size, timeout())
            except Exception:  # noqa: BLE001 - no thread to spare, say: compile in this process
                return None
            if not _registered:
                atexit.register(shutdown)
                _registered.append(True)
        return _pool if _pool.usable else None


def shutdown() -> None:
    """Stop the workers (at exit, or to start over with other settings)."""
    global _pool
    with _lock:
        pool, _pool = _pool, None
    if pool is not None:
        pool.close()


def compile_elsewhere(pool: Pool, src, target, options: dict | None) -> bool:
    """Have a worker compile ``src`` (an ``ASTSource``) for ``target`` with ``options`` into Triton's
    on-disk cache: what the launch hands Triton's ``compile``. True if a worker did; False means the
    caller compiles it (never raises)."""
    import triton
    try:
        fn = src.fn.fn  # the Python function under @triton.jit: its file is the generated module
        # absolute paths: the parent's working folder may have changed since the worker started
        env = dict(os.environ, TRITON_CACHE_DIR=os.path.abspath(triton.knobs.cache.dir))
        job = {"path": os.path.abspath(fn.__code__.co_filename), "function": fn.__name__,
               "signature": src.signature, "constants": src.constants, "attrs": src.attrs,
               "target": target, "options": options, "env": env}
        if target is None or options is None or not os.path.isfile(job["path"]):
            raise ValueError("not a launch's compile of a generated file")
        data = pickle.dumps(job)
    except Exception:  # noqa: BLE001 - an odd job compiles in the parent
        _count("unpicklable")
        return False
    _count("sent")
    try:
        kind, _ = pool.run(data)
    except Exception:  # noqa: BLE001 - the pool closed under it, say: the parent compiles it
        kind = "crashed"
    _count({"ok": "compiled", "error": "errors"}.get(kind, kind))
    return kind == "ok"
