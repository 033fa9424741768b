"""A compile worker: run as ``python compile_worker_script.py`` by ``compile_workers``, never imported.

It imports only Triton (about 0.45 s on the H200 host, where a worker importing torch took 3-4 s to
start) and then, per request, imports the generated kernel module by its file path, rebuilds the
``ASTSource`` the parent's launch would hand Triton and calls ``triton.compile``, which writes
Triton's on-disk cache; the parent's own compile of the same source then finds it there.

Protocol (length-prefixed pickles): requests on stdin; replies on the original stdout, which is kept
for them alone (fd 1 is pointed at stderr, so a print in Triton cannot corrupt a reply). First reply
``("ready", pid)`` once Triton is imported, then ``("ok", seconds)`` or ``("error", text)`` per
request. End of stdin (the parent closed it or died) ends the worker.
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


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or ".") == here:
        sys.path.pop(0)  # this folder's modules (cache.py, ...) must not shadow anything
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it then closes stdin
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    inp = sys.stdin.buffer
    import triton  # noqa: F401 - the start-up cost, paid before the first request
    from triton.compiler import ASTSource  # noqa: F401
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
