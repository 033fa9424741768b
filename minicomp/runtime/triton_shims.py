"""Everything minicomp does with Triton's internals, in one place.

Generated kernels use only ``triton.language`` (``tests/test_triton_shims.py`` checks each name they
use); the runtime also relies on a few things Triton does not document:

* ``@triton.jit`` makes an interpreted function when ``TRITON_INTERPRET`` is set *while it runs*
  (``triton.knobs.runtime.interpret``, read from the environment): ``interpreting``;
* a ``JITFunction`` gets its ``compile`` attribute (``triton.compiler.compile``) when it first builds
  its per-device cache (``device_caches[device]`` -> ``create_binder``), and ``run`` calls
  ``self.compile(src, target=..., options=...)``;
* ``JITFunction.warmup`` takes torch dtypes where the launch passes tensors (``MockTensor``) and
  compiles what the launch with the same constexprs and options finds in Triton's cache: ``compile_ahead``;
* a driver's ``launcher_cls(src, metadata)`` builds the launcher of a kernel signature, reading
  ``src.signature``/``src.constants``, and ``metadata`` only through attributes: ``launcher_alongside``;
* the interpreter hands a ``tl.reduce`` whose combine function *is* ``tl.standard._sum_combine`` to
  numpy's (pairwise) sum and runs any other combine function element after element in Python: the
  reduction template's floating sums and the attention template's row sums name it
  (``test_a_long_float_sum_is_as_exact_as_eagers``);
* ``tl.device_assert`` is compiled out unless the kernel is compiled with the option ``debug=True``,
  which also turns on integer-overflow checks of every ``+ - *`` on 32-bit integers (each one more
  assert) unless ``sanitize_overflow=False``; Inductor passes both for its indirect-indexing asserts:
  ``device_assert_options``. The interpreter drops ``tl.device_assert`` whatever the options (its
  builder's options are fixed defaults, ``debug`` off; launch keywords that are not the kernel's
  parameters are ignored), so interpreted kernels check indices with a Python ``raise``
  (``codegen/triton.py``); a block reduced to one value there is 0-d in Triton 3.9's interpreter and
  a block of one element in 3.6's, which ``int()`` refuses under numpy 2: ``interpreted_int``;
* ``JITFunction.run`` returns the ``CompiledKernel`` it launched, and launches it as
  ``kernel.run(grid_0, grid_1, grid_2, stream, kernel.function, kernel.packed_metadata, launch_metadata,
  enter_hook, exit_hook, *every_argument)`` (constexprs included, in parameter order): ``lean_launcher``;
* Triton 3.6's ``CudaLauncher`` asks the allocator ``triton.set_allocator`` installed
  (``triton.runtime._allocation._allocator``) for ``programs * num_ctas * global_scratch_size`` bytes of
  scratch at every launch of a kernel that makes TMA descriptors: ``_scratch``.

Tested with Triton 3.6 to 3.9 (``SUPPORTED``). With another version minicomp warns once and takes the
safe path: no launcher is built ahead (the first launch builds it, as Triton always does). Kernels
still run interpreted on the CPU, since there is no other way to ask for that.
"""
from __future__ import annotations

import functools
import inspect
import os
import re
import threading
import warnings
from contextlib import contextmanager
from typing import Callable

SUPPORTED = ((3, 6), (3, 9))  # oldest and newest (major, minor) minicomp is tested with


def triton_version() -> tuple[int, int]:
    """Triton's (major, minor) version."""
    import triton
    major, minor = re.match(r"(\d+)\.(\d+)", triton.__version__).groups()
    return int(major), int(minor)


@functools.lru_cache(maxsize=None)
def supported() -> bool:
    """Whether the installed Triton is in the tested range; warns once when not."""
    low, high = SUPPORTED
    if low <= triton_version() <= high:
        return True
    import triton
    warnings.warn(f"minicomp: Triton {triton.__version__} is outside the tested range "
                  f"{'.'.join(map(str, low))}-{'.'.join(map(str, high))}; launchers are not built ahead")
    return False


@contextmanager
def interpreting(on: bool):
    """Triton chooses compiled or interpreted functions when ``@triton.jit`` runs (importing a
    generated module), from ``TRITON_INTERPRET``."""
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1" if on else "0"
    try:
        yield
    finally:
        if old is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = old


DEVICE_ASSERTS = {"debug": True, "sanitize_overflow": False}


@functools.lru_cache(maxsize=None)
def device_assert_options() -> dict:
    """The launch options that compile a kernel's ``tl.device_assert`` in, and nothing more: ``debug``
    on, the overflow sanitizer it would bring off. Only options the installed CUDA backend knows (a
    Triton without ``sanitize_overflow`` sanitizes nothing); ``{}`` where its options cannot be read
    (asserts then stay compiled out: indices are not checked on the GPU)."""
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
        known = CUDAOptions.__dataclass_fields__
    except Exception:  # noqa: BLE001 - no CUDA backend, or its options moved
        return {}
    return {k: v for k, v in DEVICE_ASSERTS.items() if k in known} if "debug" in known else {}


def interpreted_int(value) -> int:
    """A value an interpreted kernel reduced to one element, as a Python int."""
    try:
        return int(value)
    except TypeError:  # Triton 3.6: a block of one element (its numpy array is ``handle.data``)
        return int(value.handle.data.reshape(-1)[0])


def compile_ahead(fn, dtypes: list, options: dict) -> None:
    """Compile ``fn`` (a ``JITFunction``) for a launch whose tensor arguments have ``dtypes`` and whose
    keywords (constexprs, ``num_warps``, ...) are ``options``, building its launcher alongside; the
    launch then finds both in Triton's cache. Raises what Triton's compile raises."""
    with launcher_alongside(fn):
        fn.warmup(*dtypes, grid=(1,), **options)


class _LaunchTimeMetadata:
    """Stands in for a compiled kernel's metadata, which a launcher reads only when it launches."""

    def __getattr__(self, name: str) -> None:
        return None


@contextmanager
def launcher_alongside(fn):
    """While ``fn`` (a ``JITFunction``) compiles inside this block, build its C launcher on a second
    thread. Triton 3.6 builds one per kernel signature (gcc, ~0.13 s on the H200 host) at the first
    launch; its source depends only on the signature, so it can be built while the kernel compiles
    and the launch finds it in Triton's cache. (Triton 3.9 has one generic launcher: the thread has
    nothing to build.) Outside ``SUPPORTED``, or when an internal differs, nothing is built ahead."""
    if not supported():
        yield
        return
    from triton.runtime import driver

    def build(src) -> None:
        try:
            driver.active.launcher_cls(src, _LaunchTimeMetadata())
        except Exception:  # noqa: BLE001 - the launch builds it
            pass

    def compile_and_build(src, *args, **kwargs):
        thread = threading.Thread(target=build, args=(src,), daemon=True)
        thread.start()
        try:
            return compile(src, *args, **kwargs)
        finally:
            thread.join()

    try:
        fn.device_caches[driver.active.get_current_device()]  # Triton sets fn.compile when it first builds this
        compile = fn.compile
    except Exception:  # noqa: BLE001 - internals differ: compile without the launcher thread
        yield
        return
    fn.compile = compile_and_build
    try:
        yield
    finally:
        fn.compile = compile


def _no_hook(hook) -> bool:
    """Triton's launch hooks are ``HookChain``s (3.6-3.9): empty unless a profiler such as Proton is on."""
    return hook is None or getattr(hook, "calls", None) == []


def lean_launcher(fn, kernel, grid: tuple[int, ...], options: dict) -> Callable | None:
    """``launch(stream, *tensors)``: launch ``kernel`` (the ``CompiledKernel`` that ``fn[grid](*tensors,
    **options)`` returned) again with Triton's per-call work done once: binding arguments to
    parameters, computing the specialization key, looking up the kernel, building launch metadata and
    running empty hook chains (tens of µs per launch, measured on the H200 host).

    Sound only while the arguments specialize as they did when ``kernel`` was compiled: the same
    dtypes and 16-byte alignment of each pointer (the caller guarantees both: a compiled graph is
    specialized on its inputs' dtypes and alignment, and fallback results that feed kernels are
    copied when misaligned) and no scalar arguments (minicomp bakes sizes in). None where it cannot
    be bound: an untested Triton, launch hooks installed (they run on the usual path), pre-run hooks,
    or an argument list it does not recognize."""
    from triton import knobs
    if kernel is None or not supported() or fn.pre_run_hooks or not (_no_hook(knobs.runtime.launch_enter_hook)
                                                   and _no_hook(knobs.runtime.launch_exit_hook)):
        return None
    try:
        kernel = kernel.result() if hasattr(kernel, "result") else kernel  # an async compile's future
        run, function, metadata = kernel.run, kernel.function, kernel.packed_metadata
        params = fn.params
        first_constexpr = next((i for i, p in enumerate(params) if p.is_constexpr), len(params))
        if not all(p.is_constexpr for p in params[first_constexpr:]):
            return None  # tensors first, then constexprs: how minicomp writes kernels
        tail = tuple(options[p.name] if p.name in options else p.default for p in params[first_constexpr:])
        if any(v is inspect.Parameter.empty for v in tail):
            return None
    except Exception:  # noqa: BLE001 - internals differ: Triton's own launch path
        return None
    g0, g1, g2 = (*grid, 1, 1)[:3]
    direct = _c_launch(run, g0 * g1 * g2)
    if direct is not None:  # Triton 3.6's CUDA launcher: its C entry point, with the scratch it needs
        c_launch, cooperative, pdl, scratch = direct
        if scratch is None:  # most kernels: nothing to allocate

            def launch(stream: int, *tensors) -> None:
                c_launch(g0, g1, g2, stream, function, cooperative, pdl, None, None, metadata, None, None, None,
                         *tensors, *tail)
            return launch

        def launch_with_scratch(stream: int, *tensors) -> None:
            c_launch(g0, g1, g2, stream, function, cooperative, pdl, scratch(stream), None, metadata, None, None,
                     None, *tensors, *tail)
        return launch_with_scratch

    def launch(stream: int, *tensors) -> None:
        run(g0, g1, g2, stream, function, metadata, None, None, None, *tensors, *tail)
    return launch


_CUDA_LAUNCHER_36 = ["self", "gridX", "gridY", "gridZ", "stream", "function", "args"]


@functools.lru_cache(maxsize=None)
def _call_parameters(cls: type) -> list[str]:
    """The parameter names of a launcher class's ``__call__`` (read once per class, not per launch bound)."""
    return list(inspect.signature(cls.__call__).parameters)


def _c_launch(launcher, programs: int) -> tuple | None:
    """(C launch, cooperative grid, PDL, ``scratch(stream)`` or None) of a Triton 3.6 ``CudaLauncher`` whose kernel
    needs no profiling scratch: its ``__call__`` only allocates scratch memory and then calls
    ``self.launch(gridX, gridY, gridZ, stream, function, cooperative, pdl, global_scratch,
    profile_scratch, *args)``; skipping that Python frame saves about 1 µs per launch, and keeping a
    small global scratch (``_scratch``) a few more. None for any other launcher (Triton 3.9's passes its
    arguments differently: it keeps its Python entry point)."""
    try:
        cls = type(launcher)
        if cls.__name__ != "CudaLauncher" or _call_parameters(cls) != _CUDA_LAUNCHER_36 or \
                launcher.profile_scratch_size:
            return None
        return launcher.launch, launcher.launch_cooperative_grid, launcher.launch_pdl, _scratch(launcher, programs)
    except Exception:  # noqa: BLE001 - another shape: its Python entry point
        return None


SCRATCH_KEPT = 1 << 20  # bytes: a launch's global scratch up to this size is allocated once per stream


def _scratch(launcher, programs: int) -> Callable[[int], object] | None:
    """``scratch(stream)``: the global scratch memory of one launch of ``programs`` programs, where TMA
    descriptors made on the device live (None if the kernel needs none). Triton allocates it at every
    launch through its allocator (a tensor: several µs of host time per GEMM launch on Hopper); launches
    on one stream run one after another, so a small one is allocated once per stream and reused. Not
    with programmatic dependent launch (the next launch may start before this one ends)."""
    size = programs * getattr(launcher, "num_ctas", 1) * launcher.global_scratch_size
    if not size:
        return None
    from triton.runtime import _allocation

    def allocate(stream: int):
        return _allocation._allocator.get()(size, launcher.global_scratch_align, stream)
    if size > SCRATCH_KEPT or launcher.launch_pdl:
        return allocate
    kept: dict[int, object] = {}

    def reused(stream: int):
        buffer = kept.get(stream)
        if buffer is None:
            buffer = kept[stream] = allocate(stream)
        return buffer
    return reused
