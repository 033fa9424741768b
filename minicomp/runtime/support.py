"""Small helpers the generated wrappers call."""
from __future__ import annotations

import contextlib
import functools
import threading
from dataclasses import dataclass
from typing import Callable

import torch

from .. import config
from .triton_shims import lean_launcher  # noqa: F401 - the generated wrappers bind launches with it


_POISON = config.SETTINGS["poison"]


def poisoning() -> bool:
    """``MINICOMP_POISON`` (``config.poison``; a wrapper asks once per call)."""
    return _POISON.value()


def empty(shape, strides, dtype, device, poison: bool | None = None) -> torch.Tensor:
    """A fresh buffer; with ``MINICOMP_POISON=1`` filled with garbage (``fill_garbage``). ``poison``:
    ``poisoning()`` as the caller read it (a wrapper reads it once per call), None to read it here."""
    t = torch.empty_strided(shape, strides, dtype=dtype, device=device)
    if poisoning() if poison is None else poison:
        fill_garbage(t)
    return t


_guards = getattr(torch._C._dynamo, "guards", None)
_empty_cuda = getattr(_guards, "_empty_strided_cuda", None)
_current_device = getattr(torch._C, "_cuda_getDevice", None)


def allocators(device_index: int, poison: bool) -> tuple[Callable, Callable]:
    """``(fast, any_device)``: functions of ``(shape, strides, dtype)`` that allocate a lean wrapper's
    buffers on CUDA device ``device_index``. ``fast`` is one C call that skips the dispatcher and takes
    the current device (Inductor's helper: 2.7 against 4.9 µs of host time a buffer, H200 host, cProfile
    of a Qwen3 training step); a wrapper takes it when the current device is ``device_index``
    (``current_device``), ``any_device`` otherwise, and both are ``empty`` under poisoning."""
    device = f"cuda:{device_index}"

    def any_device(shape, strides, dtype):
        return empty(shape, strides, dtype, device, poison)
    return (any_device if poison or _empty_cuda is None else _empty_cuda), any_device


def current_device() -> int:
    """The current CUDA device's index."""
    return _current_device() if _current_device is not None else torch.cuda.current_device()


def _as_strided_past(t: torch.Tensor, shape, strides, offset: int) -> torch.Tensor:
    return torch.as_strided(t, shape, strides, t.storage_offset() + offset)


reinterpret = getattr(_guards, "_reinterpret_tensor", None) or _as_strided_past
"""``reinterpret(t, shape, strides, offset)``: a view of ``t``'s storage with these sizes and strides,
starting ``offset`` elements past ``t``'s own start. Inductor's helper where torch has it: one C call
without the dispatcher (1.5 against 3.4 µs a view for ``as_strided``, same measurement as
``allocators``); the generated wrappers run with autograd off, so no view needs tracking."""


def write_back(inputs: tuple, values: tuple) -> None:
    """A graph's updates of its inputs (``ir.program.WrittenBack``), copied in: one multi-tensor launch
    for all of them."""
    if len(inputs) == 1:
        inputs[0].copy_(values[0])
    else:
        torch._foreach_copy_(list(inputs), list(values))


def fill_garbage(t: torch.Tensor) -> None:
    """Fill a buffer about to be written with garbage (NaN, or a large integer) so a kernel that
    leaves part of its output unwritten is caught by any comparison: every fresh buffer under
    ``MINICOMP_POISON=1``, and every buffer that reuses a dead one's storage (a wrapper's ``call``
    asks ``poisoning()`` once per call, its lean ``run`` once when it is bound)."""
    if t.numel():
        t.fill_(True if t.dtype == torch.bool else float("nan") if t.dtype.is_floating_point else 77)


def ensure_contiguous(t: torch.Tensor) -> torch.Tensor:
    """``ensure_layout`` for a result the kernels read as contiguous: one C check in the usual case."""
    if t.is_contiguous() and t.data_ptr() % 16 == 0:
        return t
    return t.clone(memory_format=torch.contiguous_format)


def ensure_layout(t: torch.Tensor, strides: tuple[int, ...]) -> torch.Tensor:
    """A fallback op's result as the kernels were generated for it: these strides, and 16-byte aligned
    (Triton specializes pointers on alignment, and launches bound once assume it stays as it was);
    copied if PyTorch returned another layout or an unaligned view."""
    if t.stride() == strides and t.data_ptr() % 16 == 0:  # the usual case: one tuple comparison
        return t
    if (t.numel() <= 1 or all(a == b for a, b, n in zip(t.stride(), strides, t.shape) if n > 1)) \
            and t.data_ptr() % 16 == 0:
        return t
    out = torch.empty_strided(t.shape, strides, dtype=t.dtype, device=t.device)
    out.copy_(t)
    return out


def eager_strided(t: torch.Tensor, strides: tuple[int, ...]) -> torch.Tensor:
    """``t`` laid out with the strides eager hands a fallback op: copied to them, gaps included (SDPA
    wants its bias in aligned rows); dims eager broadcasts (stride 0) stay broadcast, over a copy of
    one slice; where the rest would overlap, contiguous."""
    if t.numel() <= 1 or all(a == b for a, b, n in zip(t.stride(), strides, t.shape) if n > 1):
        return t
    broadcast = any(st == 0 and n > 1 for st, n in zip(strides, t.shape))
    base, rest = t, strides
    if broadcast:  # (slicing and expanding cost host time: only where needed, not per convolution weight)
        base = t[tuple(slice(0, 1) if st == 0 and n > 1 else slice(None) for st, n in zip(strides, t.shape))]
        rest = tuple(st if st else 1 for st in strides)
    extent = 1
    for stride, size in sorted((st, n) for st, n in zip(rest, base.shape) if n > 1):
        if stride < extent:  # overlapping: no buffer has these strides
            return t.contiguous()
        extent = stride * size
    out = ensure_layout(base, rest)
    return out.expand(t.shape) if broadcast else out


_COUNTERS: dict = {}
_COUNTERS_LOCK = threading.Lock()


def counters(kernel, n: int, device: str) -> torch.Tensor:
    """The int64 counters of a staged launch (``ir.kernel.StagedLaunch``): on a GPU the kept ones
    (``kept_counters``); in Triton's interpreter fresh zeros for every launch, because there a launch
    runs on the calling thread and can stop half-way (Ctrl-C, an exception), which would leave kept
    counters out of step for every later call."""
    if not device.startswith("cuda"):
        return torch.zeros(n, dtype=torch.int64, device=device)
    return kept_counters(kernel, n, device)


def counter_keeper(kernel, n: int, device: str) -> Callable[[int], torch.Tensor]:
    """``kept_counters`` of one staged launch as a function of the stream, for a lean wrapper: after a
    stream's first launch, one dictionary lookup."""
    per_stream: dict[int, torch.Tensor] = {}

    def kept(stream: int) -> torch.Tensor:
        if _RECORDING:  # a CUDA graph is being recorded (rarely): in its thread, its own counters
            own = _own_counters(kernel, n, device)
            if own is not None:
                return own
        sync = per_stream.get(stream)
        if sync is None:
            sync = per_stream[stream] = kept_counters(kernel, n, device, stream)
        return sync
    return kept


def kept_counters(kernel, n: int, device: str, stream: int | None = None) -> torch.Tensor:
    """Counters kept per kernel, device and stream and never reset, so no call pays a memset launch:
    launch ``e`` of a pipeline of ``T`` programs draws tickets ``e*T .. e*T+T-1`` and waits for ``(e+1)``
    times a row's program count; a split-combine's group ends where its count reaches a multiple of
    the group's size. Sound because a GPU launch, once queued, runs whole, and launches on one stream
    run in order; another stream gets counters of its own. Inside ``own_counters(store)`` (a CUDA
    graph's warm-up and capture) they come from ``store`` instead."""
    own = _own_counters(kernel, n, device) if _RECORDING else None
    if own is not None:
        return own
    if stream is None:  # a lean wrapper passes the current stream it has (``counter_keeper``)
        stream = torch.cuda.current_stream(device).cuda_stream if device.startswith("cuda") else 0
    key = (id(kernel), device, stream)
    entry = _COUNTERS.get(key)
    if entry is None:
        with _COUNTERS_LOCK:  # two threads starting on one stream must share one set
            entry = _COUNTERS.setdefault(key, (kernel, torch.zeros(n, dtype=torch.int64, device=device)))
    return entry[1]  # the kernel is kept alive with its counters: its id is not reused


_OWN_COUNTERS = threading.local()
_RECORDING = 0  # open ``own_counters`` blocks in the process: launches look for a store only then


@contextlib.contextmanager
def own_counters(store: dict):
    """Staged launches made by this thread meanwhile take their counters from ``store`` (filled on
    first use) instead of the kept ones: a captured CUDA graph's counters are its own
    (``runtime/cuda_graphs.py`` says why that keeps replays sound)."""
    global _RECORDING
    outer = getattr(_OWN_COUNTERS, "store", None)
    with _COUNTERS_LOCK:
        _RECORDING += 1
    _OWN_COUNTERS.store = store
    try:
        yield store
    finally:
        _OWN_COUNTERS.store = outer
        with _COUNTERS_LOCK:
            _RECORDING -= 1


def _own_counters(kernel, n: int, device: str) -> torch.Tensor | None:
    """This thread's ``own_counters`` store's counters for ``kernel`` (made on first use), or None."""
    store = getattr(_OWN_COUNTERS, "store", None)
    if store is None:
        return None
    key = (id(kernel), device)
    if key not in store:
        store[key] = (kernel, torch.zeros(n, dtype=torch.int64, device=device))
    return store[key][1]


def raw_stream(device_index: int | None) -> int | None:
    """The current CUDA stream of a device as the launcher takes it (None for the interpreter)."""
    return None if device_index is None else _raw_stream(device_index)


_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or \
    (lambda index: torch.cuda.current_stream(index).cuda_stream)


INTERPRETER_LOCK = threading.RLock()
"""Triton's interpreter patches ``triton.language`` while a kernel runs: one interpreted graph at a
time per process (calls from several threads take turns)."""


def tma_allocator() -> None:
    """Kernels that make TMA descriptors on the device need Triton's global scratch allocator."""
    import triton

    def alloc(size: int, alignment: int, stream):
        return torch.empty(size, device="cuda", dtype=torch.int8)

    triton.set_allocator(alloc)


@dataclass(frozen=True)
class InputRef:
    """Stands for the k-th tensor input of a fallback op inside its stored argument tree."""
    k: int


def _fill(tree, tensors):
    if isinstance(tree, (list, tuple)):
        return type(tree)(_fill(t, tensors) for t in tree)
    if isinstance(tree, dict):
        return {k: _fill(v, tensors) for k, v in tree.items()}
    return tensors[tree.k] if isinstance(tree, InputRef) else tree


def extern_call(target, tree) -> Callable:
    """A fallback op as a function of its tensor inputs. ``target``: the op, or its qualified name
    (``"aten.cumsum.default"``, how the graph cache stores it); ``tree``: ``(args, kwargs)`` with
    ``InputRef`` where the tensors go. The usual case, tensors only as top-level positional arguments,
    fills a list rather than rebuilding the tree on every call."""
    if isinstance(target, str):
        target = functools.reduce(getattr, target.split("."), torch.ops)
    args, kwargs = tree
    if target in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default) and not kwargs:
        target = functools.partial(aligned_rows_product, target)
    else:
        target = target if kwargs else public_function(target, len(args))
    slots = [(i, a.k) for i, a in enumerate(args) if isinstance(a, InputRef)]
    if not _has_ref((kwargs, [a for a in args if not isinstance(a, InputRef)])):
        template = list(args)

        def call_flat(*tensors):
            filled = template.copy()
            for i, k in slots:
                filled[i] = tensors[k]
            return target(*filled, **kwargs)
        return call_flat

    def call(*tensors):
        args, kwargs = _fill(tree, tensors)
        return target(*args, **kwargs)
    return call


def public_function(op, passed: int):
    """``torch.<name>`` in place of the aten overload ``op`` where a call passing ``passed`` positional
    arguments can only resolve to ``op`` (every other overload requires more): PyTorch's argument parser is
    cheaper than the dispatcher's boxed call (a convolution: 14 vs 19 µs of host time, measured on
    the H200's host; Inductor calls ``torch.convolution`` too). Else ``op`` itself."""
    try:
        packet = op.overloadpacket
        fn = getattr(torch._C._VariableFunctions, packet.__name__, None)
        others = [getattr(packet, name)._schema for name in packet.overloads() if name != op._overloadname]
    except AttributeError:  # not an OpOverload (a Python function, a HigherOrderOperator)
        return op
    required = lambda schema: sum(not a.has_default_value() for a in schema.arguments)  # noqa: E731
    if fn is None or any(required(schema) <= passed for schema in others):
        return op
    return fn


def _has_ref(tree) -> bool:
    if isinstance(tree, (list, tuple)):
        return any(_has_ref(t) for t in tree)
    if isinstance(tree, dict):
        return any(_has_ref(v) for v in tree.values())
    return isinstance(tree, InputRef)


PAD_MIN_OPERAND = 2**20
"""Right operands of fewer elements keep their unaligned rows: padding costs three launches and a copy
every call, more than the aligned kernel saves on so small an operand (ResMLP's 196x196 token mixing,
bf16, 12288 rows a layer: the model's host time 1.8x Inductor's with its GPU time 1.06x, H200). GPT-2's
LM head (768x50257: 843 against 124 us at 1024 tokens) stays padded; sizes between are not measured."""


def aligned_rows_product(op, *args, cuda_only: bool = True, min_operand: int = PAD_MIN_OPERAND) -> torch.Tensor:
    """``op`` (aten ``mm``, or ``addmm`` with a bias vector) with the result's row length padded to a
    multiple of 16 bytes when it is not (a 50257-word vocabulary) and the right operand has ``min_operand``
    elements: the right operand copied into a padded buffer (as Inductor's padding does), the product's
    extra columns dropped by a view. cuBLAS runs unaligned kernels otherwise (H200, GPT-2's fp16 LM head
    at 1024 tokens: 843 us in ``cutlass_75..._align1`` against 124 us aligned). The callers copy the view
    to contiguous where they need it. Tensor-core products only: fp32 IEEE ones run SIMT kernels either
    way, and the copies cost more than padding gains (``benchmarks/results/unaligned_rows.md``)."""
    a, b = args[-2], args[-1]
    n, per = b.shape[1], 16 // b.element_size()
    bias = args[0] if op is torch.ops.aten.addmm.default else None
    product = torch.mm if bias is None else torch.addmm  # the public functions: cheaper calls than the aten overloads
    if (n % per == 0 or n < per or (cuda_only and not b.is_cuda) or (bias is not None and bias.shape != (n,))
            or b.numel() < min_operand or (b.dtype == torch.float32 and not config.cuda_matmul_allow_tf32)):
        return product(*args)
    n_pad = n + per - n % per
    like = dict(dtype=b.dtype, device=b.device)
    # the padded operand in b's own order (a transposed nn.Linear weight stays transposed)
    padded = torch.empty((n_pad, b.shape[0]), **like).T if b.stride(0) == 1 else torch.empty((b.shape[0], n_pad), **like)
    padded[:, :n].copy_(b)
    padded[:, n:].zero_()
    if bias is None:
        return product(a, padded)[:, :n]
    bias_padded = torch.zeros(n_pad, **like)
    bias_padded[:n].copy_(bias)
    return product(bias_padded, a, padded)[:, :n]
