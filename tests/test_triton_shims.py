"""The Triton internals minicomp relies on (``runtime/triton_shims.py``) still exist with the shape it
expects, on the installed Triton: the test that says when an upgrade breaks them. Runs on the CPU;
what needs a GPU (building a real launcher) is checked by its signature and source here and for real
by ``tests/test_cuda.py::test_launcher_built_while_the_kernel_compiles``."""
from __future__ import annotations

import collections
import glob
import inspect
import os
import re
import warnings

import pytest
import torch
import triton
import triton.language as tl

import minicomp
from minicomp.runtime import triton_shims


def _kernel_fn(x_ptr, XBLOCK: tl.constexpr):
    tl.store(x_ptr + tl.arange(0, XBLOCK), 1.0)


# --- version ------------------------------------------------------------------------------------

def test_installed_triton_is_in_the_supported_range():
    low, high = triton_shims.SUPPORTED
    assert low <= triton_shims.triton_version() <= high, triton.__version__
    assert triton_shims.supported()


def test_an_unsupported_version_warns_once_and_builds_no_launcher_ahead(monkeypatch):
    monkeypatch.setattr(triton_shims, "triton_version", lambda: (4, 0))
    triton_shims.supported.cache_clear()
    try:
        with pytest.warns(UserWarning, match="outside the tested range"):
            assert not triton_shims.supported()
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # cached: no second warning
            assert not triton_shims.supported()
        fn = _FakeJit()
        with triton_shims.launcher_alongside(fn):
            fn.compile("src")
        assert fn.compiled == ["src"] and fn.compile == fn.original  # the safe path: Triton's own compile
    finally:
        triton_shims.supported.cache_clear()


# --- interpreted or compiled: TRITON_INTERPRET while @triton.jit runs ------------------------------

def test_jit_reads_triton_interpret_while_it_runs():
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction
    before = os.environ.get("TRITON_INTERPRET")
    with triton_shims.interpreting(True):
        interpreted = triton.jit(_kernel_fn)
    with triton_shims.interpreting(False):
        compiled = triton.jit(_kernel_fn)
    assert isinstance(interpreted, InterpretedFunction) and not isinstance(interpreted, JITFunction)
    assert isinstance(compiled, JITFunction)
    assert os.environ.get("TRITON_INTERPRET") == before  # restored
    x = torch.zeros(4)
    interpreted[(1,)](x, XBLOCK=4)  # and the interpreted one runs on CPU tensors
    assert x.tolist() == [1.0] * 4


with triton_shims.interpreting(True):  # interpreted, whatever TRITON_INTERPRET says
    @triton.jit
    def _max_int8(a, b):
        return tl.maximum(a, b)

    @triton.jit
    def _raise_where_zero(x):
        if tl.reduce((x == 0).to(tl.int8), None, _max_int8) != 0:
            raise RuntimeError("ZeroDivisionError")

    @triton.jit
    def _checking_kernel(x_ptr, XBLOCK: tl.constexpr):
        _raise_where_zero(tl.load(x_ptr + tl.arange(0, XBLOCK)))


def test_an_interpreted_kernel_may_raise_and_the_interpreter_wraps_it():
    from minicomp.runtime.eager_errors import surfaced
    # codegen's _check_divisor: a helper of interpreted kernels branches on a scalar and raises
    _checking_kernel[(1,)](torch.ones(4), XBLOCK=4)  # no zero: nothing raised
    with pytest.raises(Exception) as wrapped:
        _checking_kernel[(1,)](torch.tensor([1.0, 0.0, 2.0, 3.0]), XBLOCK=4)
    assert type(wrapped.value).__name__ == "InterpreterError"
    raised = surfaced(wrapped.value, ())  # found as the cause of the interpreter's error
    assert (type(raised), str(raised)) == (RuntimeError, "ZeroDivisionError")
    assert surfaced(ValueError("other"), ()) is None


# --- compiling ahead: JITFunction.warmup, device_caches, compile ----------------------------------

def test_warmup_takes_dtypes_for_tensors_and_launch_keywords():
    from triton.runtime.jit import JITFunction, MockTensor
    params = inspect.signature(JITFunction.warmup).parameters
    kinds = {name: p.kind for name, p in params.items()}
    assert kinds == {"self": inspect.Parameter.POSITIONAL_OR_KEYWORD, "args": inspect.Parameter.VAR_POSITIONAL,
                     "grid": inspect.Parameter.KEYWORD_ONLY, "kwargs": inspect.Parameter.VAR_KEYWORD}, kinds
    assert "MockTensor.wrap_dtype" in inspect.getsource(JITFunction.warmup)
    assert MockTensor.wrap_dtype(torch.float16).dtype == torch.float16  # a dtype stands for a tensor of it


def test_jit_function_sets_compile_when_it_builds_its_device_cache():
    from triton.runtime.jit import JITFunction
    with triton_shims.interpreting(False):
        fn = triton.jit(_kernel_fn)
    assert isinstance(fn.device_caches, collections.defaultdict)
    assert fn.device_caches.default_factory == fn.create_binder
    binder = inspect.getsource(JITFunction.create_binder)
    assert re.search(r"from \.\.compiler import .*\bcompile\b", binder) and "self.compile = compile" in binder
    assert "self.compile(src, target=target, options=" in inspect.getsource(JITFunction)  # how a launch compiles


class _FakeJit:
    """A JITFunction as ``launcher_alongside`` sees it."""

    def __init__(self):
        self.device_caches, self.compiled = {0: None}, []
        self.compile = self.original = lambda src, *a, **k: self.compiled.append(src) or "kernel"


class _FakeDriver:
    def __init__(self):
        self.built = []

    def get_current_device(self) -> int:
        return 0

    def launcher_cls(self, src, metadata):
        self.built.append((src, metadata))


def test_launcher_alongside_builds_the_launcher_of_what_compiles_and_restores_compile(monkeypatch):
    from triton.runtime import driver
    fake = _FakeDriver()
    monkeypatch.setattr(driver, "_active", fake)  # DriverConfig.active returns it
    assert driver.active is fake
    fn = _FakeJit()
    with triton_shims.launcher_alongside(fn):
        assert fn.compile("src", target=None, options={}) == "kernel"
    assert fn.compiled == ["src"] and fn.compile == fn.original
    ((src, metadata),) = fake.built
    assert src == "src" and isinstance(metadata, triton_shims._LaunchTimeMetadata)
    assert metadata.num_ctas is None and metadata.tensordesc_meta is None


def test_launcher_alongside_compiles_plainly_when_internals_differ(monkeypatch):
    from triton.runtime import driver
    monkeypatch.setattr(driver, "_active", _FakeDriver())
    fn = _FakeJit()
    fn.device_caches = {}  # no cache for the device: Triton's internals changed
    with triton_shims.launcher_alongside(fn):
        fn.compile("src")
    assert fn.compiled == ["src"] and fn.compile == fn.original


def _kernel_with_defaults(x_ptr, y_ptr, sync, XBLOCK: tl.constexpr, FLAG: tl.constexpr = 7):
    tl.store(x_ptr + tl.arange(0, XBLOCK), tl.load(y_ptr + tl.arange(0, XBLOCK)))


class _FakeCompiled:
    """Stands for a ``CompiledKernel``: what ``lean_launcher`` reads of it, and the launch it makes."""
    function, packed_metadata = "function-handle", ("metadata",)

    def __init__(self):
        self.launches = []

    def run(self, *args):
        self.launches.append(args)


def test_lean_launcher_passes_what_jit_function_run_passes():
    # JITFunction.run launches kernel.run(g0, g1, g2, stream, function, packed_metadata, launch_metadata,
    # enter_hook, exit_hook, *every bound argument): constexprs in parameter order, defaults filled in
    with triton_shims.interpreting(False):
        fn = triton.jit(_kernel_with_defaults)
    run_source = inspect.getsource(type(fn).run)
    assert "kernel.run(grid_0, grid_1, grid_2, stream, kernel.function, kernel.packed_metadata" in run_source
    assert "*bound_args.values())" in run_source
    kernel = _FakeCompiled()
    launch = triton_shims.lean_launcher(fn, kernel, (5, 2), {"XBLOCK": 64, "num_warps": 4})
    launch(1234, "x", "y", "s")
    assert kernel.launches == [(5, 2, 1, 1234, "function-handle", ("metadata",), None, None, None,
                                "x", "y", "s", 64, 7)]


def test_lean_launcher_leaves_hooks_and_odd_kernels_to_tritons_path(monkeypatch):
    from triton import knobs
    with triton_shims.interpreting(False):
        fn = triton.jit(_kernel_with_defaults)
        odd = triton.jit(_odd_order)
    assert triton_shims.lean_launcher(odd, _FakeCompiled(), (1,), {"XBLOCK": 8}) is None  # a tensor after a constexpr
    assert triton_shims.lean_launcher(fn, None, (1,), {"XBLOCK": 8}) is None  # nothing compiled
    assert triton_shims.lean_launcher(fn, _FakeCompiled(), (1,), {}) is None  # XBLOCK has no value
    hook = knobs.runtime.launch_enter_hook
    assert triton_shims._no_hook(hook), "Triton's launch hook chain is not empty by default"
    monkeypatch.setattr(hook, "calls", [print])  # a profiler's hook must keep running: Triton's path
    assert triton_shims.lean_launcher(fn, _FakeCompiled(), (1,), {"XBLOCK": 8}) is None


class CudaLauncher:
    """Shaped like Triton 3.6's CUDA launcher (``triton/backends/nvidia/driver.py``)."""
    global_scratch_size = profile_scratch_size = 0
    launch_cooperative_grid, launch_pdl = False, True

    def __init__(self):
        self.calls = []
        self.launch = lambda *args: self.calls.append(args)

    def __call__(self, gridX, gridY, gridZ, stream, function, *args):
        raise AssertionError("the lean path calls the C launch directly")


def test_lean_launcher_calls_triton_36s_c_launch_directly():
    # Triton 3.6: CudaLauncher.__call__ allocates scratch (none here) and calls
    # self.launch(gridX, gridY, gridZ, stream, function, cooperative, pdl, global_scratch, profile_scratch, *args)
    with triton_shims.interpreting(False):
        fn = triton.jit(_kernel_with_defaults)
    kernel = _FakeCompiled()
    kernel.run = CudaLauncher()
    triton_shims.lean_launcher(fn, kernel, (3,), {"XBLOCK": 16})(99, "x", "y", "s")
    assert kernel.run.calls == [(3, 1, 1, 99, "function-handle", False, True, None, None, ("metadata",), None, None,
                                 None, "x", "y", "s", 16, 7)]
    kernel.run.profile_scratch_size = 64  # a profiler's scratch: Triton's own entry point
    assert triton_shims._c_launch(kernel.run, 3) is None
    from triton.backends.nvidia.driver import CudaLauncher as Real
    real = list(inspect.signature(Real.__call__).parameters)
    if triton_shims.triton_version() == (3, 6):
        assert real == triton_shims._CUDA_LAUNCHER_36, real
    elif real != triton_shims._CUDA_LAUNCHER_36:  # another launcher signature: its Python entry point
        assert triton_shims._c_launch(object.__new__(Real), 1) is None


def test_a_small_global_scratch_is_allocated_once_per_stream():
    # Triton 3.6 allocates programs * num_ctas * global_scratch_size bytes at every launch of a kernel
    # making TMA descriptors; the lean path keeps a small one per stream, unless launches may overlap
    with triton_shims.interpreting(False):
        fn = triton.jit(_kernel_with_defaults)
    from triton.runtime import _allocation
    before, asked = _allocation._allocator.get(), []
    triton.set_allocator(lambda size, align, stream: asked.append((size, align, stream)) or f"buffer{len(asked)}")
    try:
        kernel = _FakeCompiled()
        kernel.run = CudaLauncher()
        kernel.run.global_scratch_size, kernel.run.global_scratch_align, kernel.run.launch_pdl = 128, 64, False
        launch = triton_shims.lean_launcher(fn, kernel, (3, 2), {"XBLOCK": 16})
        for stream in (7, 7, 8, 7):
            launch(stream, "x", "y", "s")
        assert asked == [(768, 64, 7), (768, 64, 8)]
        assert [call[7] for call in kernel.run.calls] == ["buffer1", "buffer1", "buffer2", "buffer1"]
        kernel.run.launch_pdl = True  # the next launch may start before this one ends: a scratch each
        launch = triton_shims.lean_launcher(fn, kernel, (3, 2), {"XBLOCK": 16})
        launch(7, "x", "y", "s")
        launch(7, "x", "y", "s")
        assert len(asked) == 4
        kernel.run.launch_pdl = False  # too large to keep: a scratch each launch, as Triton does
        launch = triton_shims.lean_launcher(fn, kernel, (triton_shims.SCRATCH_KEPT // 128 + 1,), {"XBLOCK": 16})
        launch(7, "x", "y", "s")
        launch(7, "x", "y", "s")
        assert len(asked) == 6
    finally:
        triton.set_allocator(before)


def _odd_order(x_ptr, XBLOCK: tl.constexpr, y_ptr):
    tl.store(x_ptr + tl.arange(0, XBLOCK), tl.load(y_ptr + tl.arange(0, XBLOCK)))


def test_cuda_driver_has_the_launcher_class_minicomp_builds():
    from triton.backends.nvidia import driver as nvidia
    assert list(inspect.signature(nvidia.CudaLauncher.__init__).parameters) == ["self", "src", "metadata"]
    assert "self.launcher_cls = CudaLauncher" in inspect.getsource(nvidia.CudaDriver.__init__)
    current = inspect.getsource(nvidia.CudaDriver) + inspect.getsource(nvidia.GPUDriver)
    assert "get_current_device" in current
    # the launcher reads the metadata only through attributes (a stand-in answers None to each)
    assert not re.search(r"metadata\[", inspect.getsource(nvidia.CudaLauncher.__init__))


# --- public APIs the runtime and the tuners call ------------------------------------------------------

def test_public_apis_used_by_the_runtime():
    assert callable(triton.set_allocator)  # runtime.support.tma_allocator
    from triton.testing import do_bench
    assert {"warmup", "rep", "return_mode"} <= set(inspect.signature(do_bench).parameters)


# --- triton.language names in generated code ------------------------------------------------------------

KEYWORDS = {  # keyword arguments the generated code passes to triton.language functions
    "range": ["flatten"], "maximum": ["propagate_nan"], "minimum": ["propagate_nan"],
    "load": ["mask", "other", "eviction_policy"], "atomic_add": ["sem"], "reduce": ["combine_fn"],
    "inline_asm_elementwise": ["asm", "constraints", "args", "dtype", "is_pure", "pack"],
    "associative_scan": ["reverse"], "dot": ["input_precision"],
    "make_tensor_descriptor": ["base", "shape", "strides", "block_shape"],
}


def _resolve(name: str):
    obj = tl
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def _tl_names(text: str) -> set[str]:
    return set(re.findall(r"\btl\.([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)", text))


def _unresolved(names) -> list[str]:
    """The ``tl`` names the installed Triton does not have."""
    missing = []
    for n in sorted(names):
        try:
            _resolve(n)
        except AttributeError:
            missing.append(n)
    return missing


def test_every_tl_name_in_codegen_exists():
    import minicomp.codegen as codegen
    import minicomp.templates as templates  # each template spells its own body
    sources = "".join(open(p).read() for pkg in (codegen, templates)
                      for p in glob.glob(os.path.join(os.path.dirname(pkg.__file__), "*.py")))
    names = _tl_names(sources)
    assert {"arange", "load", "store", "reduce", "where"} <= names, names  # the scan finds them
    assert not _unresolved(names), _unresolved(names)


def test_every_tl_name_in_generated_kernels_exists():
    def fn(x, i):
        y = torch.sin(x) + torch.cos(x) + torch.rsqrt(x.abs() + 1) + torch.exp2(x) + torch.log2(x.abs() + 1)
        y = y + torch.erf(x) + torch.floor(x) + torch.sqrt(x.abs()) + torch.sigmoid(x) + x.to(torch.bfloat16)
        return torch.softmax(y, -1), torch.cumsum(y, -1), torch.maximum(i, i.flip(-1)), y.amax(0)
    x, i = torch.randn(4, 16), torch.randint(-5, 5, (4, 16), dtype=torch.int32)
    minicomp.compile(fn)(x, i)
    report = minicomp.report()
    assert report.whole_graph_fallback is None and len(report.kernels) >= 2, report.summary()
    names = set().union(*(_tl_names(open(k.source_path).read()) for k in report.kernels))
    assert {"sin", "cos", "rsqrt", "exp2", "log2", "associative_scan"} <= names, names
    assert not _unresolved(names), _unresolved(names)


@pytest.mark.parametrize("fn", sorted(KEYWORDS))
def test_tl_functions_take_the_keywords_generated_code_passes(fn):
    params = inspect.signature(getattr(tl, fn)).parameters
    assert set(KEYWORDS[fn]) <= set(params), (fn, list(params))
