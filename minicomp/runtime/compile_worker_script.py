"""A compile worker: run as ``python compile_worker_script.py`` by ``compile_workers``, never imported.

It imports only Triton (about 0.45 s on the H200 host, where a worker importing torch took 3-4 s to
start) and then, per request, imports the generated kernel module by its file path, rebuilds the
``ASTSource`` the parent's launch would hand Triton and calls ``triton.compile``, which writes
Triton's on-disk cache; the parent's own compile of the same source then finds it there.

Started with the parent's target (``backend arch warp_size``), it first compiles a tiny kernel for it
(``_warm_up``). Protocol (length-prefixed pickles): requests on stdin; replies on the original
stdout, kept for them alone (fd 1 is pointed at stderr, so a print in a kernel module or in Triton
cannot garble a reply). First reply ``("ready", pid)`` once Triton is imported (and warmed up), then
``("ok", seconds)`` or ``("error", text)`` per request. End of stdin (the parent closed it or died)
ends the worker; Ctrl-C is ignored (the parent handles it).
"""
import importlib.util
import os
import pickle
import signal
import struct
import sys
import time

_HEADER = struct.Struct(">Q")


def _send(out, message) -> None:
    data = pickle.dumps(message)
    out.write(_HEADER.pack(len(data)) + data)
    out.flush()


def _receive(inp):
    header = inp.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None
    (size,) = _HEADER.unpack(header)
    data = inp.read(size)
    return pickle.loads(data) if len(data) == size else None


def _kernel(path: str, name: str, modules: dict):
    """The ``@triton.jit`` function ``name`` of the generated file ``path``, compiled (not interpreted)."""
    if path not in modules:
        spec = importlib.util.spec_from_file_location(f"minicomp_worker_{len(modules)}", path)
        module = importlib.util.module_from_spec(spec)
        os.environ["TRITON_INTERPRET"] = "0"  # @triton.jit reads it while it runs
        spec.loader.exec_module(module)
        modules[path] = module
    return getattr(modules[path], name)


def _compile(request: dict, modules: dict) -> None:
    import triton
    from triton.compiler import ASTSource
    fn = _kernel(request["path"], request["function"], modules)
    os.environ.clear()  # the parent's environment at the job: Triton's cache key reads TRITON_* variables
    os.environ.update(request["env"])
    src = ASTSource(fn, request["signature"], request["constants"], request["attrs"])
    triton.compile(src, target=request["target"], options=request["options"])


_WARM_UP = """
import triton
import triton.language as tl

@triton.jit
def warm_up(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.exp(tl.load(x_ptr + i, mask=i < n)) + 1.0, mask=i < n)
"""


def _warm_up(target) -> None:
    """Compile a tiny kernel for ``target`` into a throw-away cache: a process's first compile costs
    about 0.4 s more than the next ones (backend and MLIR set-up, ptxas version checks), paid here
    while the parent still lowers its graph."""
    import shutil
    import tempfile

    import triton
    from triton.compiler import ASTSource
    folder = tempfile.mkdtemp(prefix="minicomp-warm-up-")
    old = os.environ.get("TRITON_CACHE_DIR")
    try:
        path = os.path.join(folder, "warm_up.py")
        with open(path, "w") as f:
            f.write(_WARM_UP)
        os.environ["TRITON_CACHE_DIR"] = os.path.join(folder, "cache")
        fn = _kernel(path, "warm_up", {})
        signature = {"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}
        triton.compile(ASTSource(fn, signature, {(3,): 128}), target=target, options={})
    except Exception:  # noqa: BLE001 - only a warm-up
        pass
    finally:
        if old is None:
            os.environ.pop("TRITON_CACHE_DIR", None)
        else:
            os.environ["TRITON_CACHE_DIR"] = old
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or ".") == here:
        sys.path.pop(0)  # this folder's modules (cache.py, ...) must not shadow anything
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it then closes stdin
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    inp = sys.stdin.buffer
    import triton  # noqa: F401 - the start-up cost, paid before the first request
    if len(sys.argv) == 4:  # the parent's target: backend, arch, warp size
        from triton.backends.compiler import GPUTarget
        backend, arch, warp_size = sys.argv[1:]
        _warm_up(GPUTarget(backend, int(arch) if arch.isdigit() else arch, int(warp_size)))
    _send(out, ("ready", os.getpid()))
    modules: dict = {}
    while True:
        request = _receive(inp)
        if request is None:
            return
        start = time.perf_counter()
        try:
            _compile(request, modules)
            reply = ("ok", time.perf_counter() - start)
        except Exception as e:  # noqa: BLE001 - reported; the parent compiles this job itself
            reply = ("error", f"{type(e).__name__}: {e}"[:2000])
        _send(out, reply)


if __name__ == "__main__":
    main()
