"""A graph-cache entry as JSON data: ``encode`` writes what a compiled graph needs to run again,
``decode`` reads it back and checks every field, so nothing in an entry can run code or reach
generated source (no pickle: unpickling a planted file runs whatever it says).

Format (``VERSION``)::

    {"version": 1,
     "signature": [[shape, strides, dtype, device, aligned], ...],    # tensors only (strided)
     "interpret": bool,                                                # CPU: Triton's interpreter
     "wrapper": "wrappers/wrapper_<hash>.py",
     "kernels": [{"name", "function", "path": "kernels/<function>_<hash>.py", "dtypes", "options"}],
     "externs": [[key, {"op": "aten.sort.default", "args": tree}] | [key, {"tensor": tensor}]],
     "report": {"kernels": [{"name", "template", "ops", "path", "bytes", "function", "stages"}],
                "fallbacks": [[op, reason]], "decisions": [str]}}

An argument tree is JSON with tags for what JSON lacks: ``{"list": [...]}``, ``{"tuple": [...]}``,
``{"dict": [[name, value], ...]}``, ``{"input": k}`` (the k-th tensor), ``{"float": hex}`` (exact,
inf and nan too), ``{"dtype" | "device" | "layout" | "memory_format": name}``; null, booleans, ints
and strings as themselves. A constant tensor is its dtype, shape, strides, device and the bytes its
strides reach (base64), read with ``torch.frombuffer``. What cannot be written this way (a fallback op
that is not a ``torch.ops`` overload, an argument of another type) means the graph is not stored.

``decode`` accepts exactly this: dtypes from ``DTYPES``, ops that resolve to ``torch.ops``
overloads, source paths of the cache's own naming (``cache.SOURCE_NAME``, so they stay inside the
folder), identifiers for kernel and function names, launch options of Triton's or the templates'
(upper-case constexprs) with int or bool values, and the device-assert options of kernels that
check indices (``triton_shims.DEVICE_ASSERTS``) with exactly their values. Anything else raises ``BadEntry``: the caller
rebuilds the graph.
"""
from __future__ import annotations

import base64
import re
from dataclasses import dataclass

import torch

from .assemble import Artifacts, StoredKernel
from ..report import Fallback, KernelInfo
from ..runtime import cache
from ..runtime.support import InputRef
from ..runtime.triton_shims import DEVICE_ASSERTS

VERSION = 1
DTYPES = {name: getattr(torch, name) for name in (
    "float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "complex64", "complex128",
    "int64", "int32", "int16", "int8", "uint8", "uint16", "uint32", "uint64", "bool") if hasattr(torch, name)}
_DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}
LAYOUTS = {"strided": torch.strided}
MEMORY_FORMATS = {name: getattr(torch, name) for name in
                  ("contiguous_format", "channels_last", "channels_last_3d", "preserve_format")}
TRITON_OPTIONS = ("num_warps", "num_stages")
_CONSTEXPR = re.compile(r"[A-Z][A-Z0-9_]{0,31}")  # a template's block size or flag (XBLOCK, GROUP_M)
_OP_PART = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MAX_INT = 2**63


class BadEntry(ValueError):
    """A graph-cache entry that is not exactly what ``encode`` writes."""


class Unencodable(Exception):
    """A part of a graph that this format cannot hold: the graph is not stored."""


@dataclass
class Entry:
    signature: tuple
    artifacts: Artifacts
    kernels: list[KernelInfo]
    fallbacks: list[Fallback]
    decisions: list[str]


# --- encode ----------------------------------------------------------------------------------------

def encode(entry: Entry) -> dict | None:
    """The entry as JSON data, or None where some part of it cannot be stored."""
    art = entry.artifacts
    try:
        paths = {k.path for k in art.kernels}
        return {
            "version": VERSION,
            "signature": [_encode_specialization(s) for s in entry.signature],
            "interpret": bool(art.interpret),
            "wrapper": art.wrapper,
            "kernels": [{"name": k.name, "function": k.function, "path": k.path,
                         "dtypes": [_dtype_name(d) for d in k.dtypes], "options": dict(k.options)}
                        for k in art.kernels],
            "externs": [[key, _encode_extern(ref)] for key, ref in art.externs.items()],
            "report": {"kernels": [_encode_kernel_info(k, paths) for k in entry.kernels],
                       "fallbacks": [[f.op, f.reason] for f in entry.fallbacks],
                       "decisions": list(entry.decisions)},
        }
    except Unencodable:
        return None


def _dtype_name(dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        raise Unencodable(f"dtype {dtype}")
    return name


def _encode_specialization(s) -> list:
    if len(s) != 6 or s[4] != torch.strided:
        raise Unencodable("an input that is not a strided tensor")
    shape, strides, dtype, device, _, aligned = s
    return [list(shape), list(strides), _dtype_name(dtype), str(device), bool(aligned)]


def _encode_extern(ref: tuple) -> dict:
    if ref[0] == "value":
        return {"tensor": _encode_tensor(ref[1])}
    _, target, tree = ref
    if not isinstance(target, str):  # only torch.ops overloads are stored by name (assemble._externs)
        raise Unencodable(f"fallback op {target!r}")
    return {"op": target, "args": encode_tree(tree)}


def _encode_tensor(t) -> dict:
    if type(t) not in (torch.Tensor, torch.nn.Parameter) or t.layout != torch.strided or \
            t.device.type not in ("cpu", "cuda"):
        raise Unencodable("a constant that is not a plain tensor")
    extent = _extent(t.shape, t.stride())
    flat = t.detach().as_strided((extent,), (1,), t.storage_offset()).cpu().contiguous()
    data = flat.view(torch.uint8).numpy().tobytes() if extent else b""
    return {"dtype": _dtype_name(t.dtype), "shape": list(t.shape), "strides": list(t.stride()),
            "device": str(t.device), "data": base64.b64encode(data).decode("ascii")}


def _extent(shape, strides) -> int:
    """Elements a strided tensor's storage must hold from its offset on."""
    if any(n == 0 for n in shape):
        return 0
    return 1 + sum((n - 1) * s for n, s in zip(shape, strides))


def encode_tree(v):
    """A fallback op's argument tree (``InputRef`` for its tensors) as tagged JSON."""
    if v is None or type(v) in (bool, str):
        return v
    if type(v) is int:
        if not -_MAX_INT <= v < _MAX_INT:
            raise Unencodable("an integer beyond 64 bits")
        return v
    if type(v) is float:
        return {"float": v.hex()}
    if isinstance(v, list):  # FX's immutable_list too: ops take any list
        return {"list": [encode_tree(x) for x in v]}
    if type(v) in (tuple, torch.Size):
        return {"tuple": [encode_tree(x) for x in v]}
    if isinstance(v, dict) and all(type(k) is str for k in v):
        return {"dict": [[k, encode_tree(x)] for k, x in v.items()]}
    if isinstance(v, InputRef):
        return {"input": v.k}
    if isinstance(v, torch.dtype):
        return {"dtype": _dtype_name(v)}
    if isinstance(v, torch.device):
        return {"device": str(v)}
    if isinstance(v, torch.layout) and v in LAYOUTS.values():
        return {"layout": "strided"}
    if isinstance(v, torch.memory_format):
        return {"memory_format": next(n for n, f in MEMORY_FORMATS.items() if f == v)}
    raise Unencodable(f"an argument of type {type(v).__name__}")


def _encode_kernel_info(k: KernelInfo, paths: set[str]) -> dict:
    relative = next((p for p in paths if k.source_path.endswith("/" + p)), None)
    if relative is None:
        raise Unencodable(f"a kernel outside the cache: {k.source_path}")
    return {"name": k.name, "template": k.template, "ops": list(k.ops), "path": relative,
            "bytes": k.bytes_moved, "function": k.function, "stages": list(k.stages)}


# --- decode ----------------------------------------------------------------------------------------

def decode(data: dict) -> Entry:
    """The entry ``encode`` wrote, checked field by field (``BadEntry`` on anything else)."""
    _fields(data, "entry", {"version", "signature", "interpret", "wrapper", "kernels", "externs", "report"})
    if type(data["version"]) is not int or data["version"] != VERSION:
        raise BadEntry(f"format version {data['version']!r}, expected {VERSION}")
    signature = tuple(_decode_specialization(s) for s in _list(data["signature"], "signature"))
    interpret = _bool(data["interpret"], "interpret")
    if interpret != all(s[3].type == "cpu" for s in signature):
        raise BadEntry("interpret does not match the inputs' devices")
    wrapper = _source_path(data["wrapper"], "wrappers", "wrapper")
    kernels = [_decode_kernel(k) for k in _list(data["kernels"], "kernels")]
    externs = {}
    for item in _list(data["externs"], "externs"):
        if not (isinstance(item, list) and len(item) == 2):
            raise BadEntry("an extern is not [key, value]")
        key = _int(item[0], "extern key", 0)
        if key in externs:
            raise BadEntry(f"extern {key} twice")
        externs[key] = _decode_extern(item[1])
    report = data["report"]
    _fields(report, "report", {"kernels", "fallbacks", "decisions"})
    paths = {k.path for k in kernels}
    infos = [_decode_kernel_info(k, paths) for k in _list(report["kernels"], "report kernels")]
    fallbacks = []
    for f in _list(report["fallbacks"], "fallbacks"):
        if not (isinstance(f, list) and len(f) == 2):
            raise BadEntry("a fallback is not [op, reason]")
        fallbacks.append(Fallback(_str(f[0], "fallback op"), _str(f[1], "fallback reason")))
    decisions = [_str(d, "decision") for d in _list(report["decisions"], "decisions")]
    return Entry(signature, Artifacts(interpret, kernels, wrapper, externs), infos, fallbacks, decisions)


def _fields(d, what: str, names: set[str]) -> None:
    if not isinstance(d, dict) or set(d) != names:
        raise BadEntry(f"{what}: expected the fields {', '.join(sorted(names))}")


def _list(v, what: str) -> list:
    if not isinstance(v, list):
        raise BadEntry(f"{what}: not a list")
    return v


def _str(v, what: str) -> str:
    if not isinstance(v, str):
        raise BadEntry(f"{what}: not a string")
    return v


def _bool(v, what: str) -> bool:
    if not isinstance(v, bool):
        raise BadEntry(f"{what}: not a boolean")
    return v


def _int(v, what: str, least: int = -_MAX_INT, most: int = _MAX_INT - 1) -> int:
    if type(v) is not int or not least <= v <= most:
        raise BadEntry(f"{what}: not an integer in [{least}, {most}]")
    return v


def _identifier(v, what: str) -> str:
    if not (isinstance(v, str) and v.isascii() and v.isidentifier()):
        raise BadEntry(f"{what}: {v!r} is not an identifier")
    return v


def _dtype(v, what: str) -> torch.dtype:
    if v not in DTYPES:
        raise BadEntry(f"{what}: unknown dtype {v!r}")
    return DTYPES[v]


def _device(v, what: str) -> torch.device:
    if not (isinstance(v, str) and re.fullmatch(r"cpu|cuda(:[0-9]{1,3})?", v)):
        raise BadEntry(f"{what}: device {v!r}")
    return torch.device(v)


def _sizes(v, what: str) -> tuple[int, ...]:
    return tuple(_int(n, what, 0) for n in _list(v, what))


def _source_path(v, kind: str, function: str | None = None) -> str:
    """A stored file's path: ``<kind>/<function>_<hash>.py``, nothing else (no folder of its own)."""
    name = cache.SOURCE_NAME.fullmatch(v) if isinstance(v, str) else None
    if name is None or name.group(1) != kind or (function is not None and name.group(2) != function):
        raise BadEntry(f"source path {v!r}")
    return v


def _decode_specialization(s) -> tuple:
    if not (isinstance(s, list) and len(s) == 5):
        raise BadEntry("an input's signature is not [shape, strides, dtype, device, aligned]")
    shape, strides = _sizes(s[0], "input shape"), _sizes(s[1], "input strides")
    if len(shape) != len(strides):
        raise BadEntry("an input's shape and strides differ in length")
    return shape, strides, _dtype(s[2], "input dtype"), _device(s[3], "input device"), torch.strided, \
        _bool(s[4], "input alignment")


def _decode_kernel(k) -> StoredKernel:
    _fields(k, "kernel", {"name", "function", "path", "dtypes", "options"})
    function = _identifier(k["function"], "kernel function")
    options = k["options"]
    if not isinstance(options, dict):
        raise BadEntry("kernel options: not an object")
    for name, value in options.items():
        if name in DEVICE_ASSERTS:  # a kernel that checks indices on a GPU: these values and no others
            if value is not DEVICE_ASSERTS[name]:
                raise BadEntry(f"launch option {name}={value!r}")
            continue
        if name not in TRITON_OPTIONS and not _CONSTEXPR.fullmatch(name):
            raise BadEntry(f"launch option {name!r}")
        if not isinstance(value, bool):
            _int(value, f"launch option {name}", 0, 2**31 - 1)
    return StoredKernel(_identifier(k["name"], "kernel name"), function, _source_path(k["path"], "kernels", function),
                        [_dtype(d, "kernel argument dtype") for d in _list(k["dtypes"], "kernel dtypes")],
                        dict(options))


def _decode_kernel_info(k, paths: set[str]) -> KernelInfo:
    _fields(k, "report kernel", {"name", "template", "ops", "path", "bytes", "function", "stages"})
    if k["path"] not in paths:
        raise BadEntry(f"report kernel path {k['path']!r} is not a launched kernel's")
    return KernelInfo(_identifier(k["name"], "report kernel name"), _str(k["template"], "template"),
                      tuple(_str(o, "kernel op") for o in _list(k["ops"], "kernel ops")),
                      str(cache.cache_dir() / k["path"]), _int(k["bytes"], "bytes moved", 0),
                      _identifier(k["function"], "report kernel function"),
                      tuple(_identifier(s, "stage") for s in _list(k["stages"], "stages")))


def _decode_extern(v):
    if isinstance(v, dict) and set(v) == {"tensor"}:
        return ("value", _decode_tensor(v["tensor"]))
    _fields(v, "extern", {"op", "args"})
    tree = decode_tree(v["args"])
    if not (isinstance(tree, tuple) and len(tree) == 2 and isinstance(tree[0], (list, tuple))
            and isinstance(tree[1], dict) and all(k.isidentifier() for k in tree[1])):
        raise BadEntry("an extern's arguments are not (args, kwargs)")
    return ("op", resolve_op(v["op"]), tree)


def resolve_op(name) -> torch._ops.OpOverload:
    """The ``torch.ops`` overload ``name`` names (``"aten.sort.default"``); nothing else."""
    parts = name.split(".") if isinstance(name, str) else []
    if len(parts) != 3 or not all(_OP_PART.fullmatch(p) and not p.startswith("__") for p in parts):
        raise BadEntry(f"fallback op {name!r} is not a torch.ops name")
    try:  # lookups in the dispatcher's registry: an unknown name raises, nothing is imported or run
        namespace = getattr(torch.ops, parts[0], None)
        packet = getattr(namespace, parts[1], None) if isinstance(namespace, torch._ops._OpNamespace) else None
        op = getattr(packet, parts[2], None) if isinstance(packet, torch._ops.OpOverloadPacket) else None
    except (AttributeError, RuntimeError):
        op = None
    if not isinstance(op, torch._ops.OpOverload) or str(op) != name:
        raise BadEntry(f"fallback op {name!r} is not a torch.ops overload")
    return op


_TAGS = {"list", "tuple", "dict", "input", "float", "dtype", "device", "layout", "memory_format"}


def decode_tree(v, depth: int = 0):
    """``encode_tree``'s inverse."""
    if depth > 32:
        raise BadEntry("an argument tree nested too deep")
    if v is None or isinstance(v, (bool, str)):
        return v
    if type(v) is int:
        return _int(v, "integer argument")
    if not (isinstance(v, dict) and len(v) == 1 and next(iter(v)) in _TAGS):
        raise BadEntry(f"argument {v!r}")
    (tag, x), = v.items()
    if tag in ("list", "tuple"):
        items = [decode_tree(i, depth + 1) for i in _list(x, tag)]
        return items if tag == "list" else tuple(items)
    if tag == "dict":
        out = {}
        for item in _list(x, "dict"):
            if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)):
                raise BadEntry("a dict item is not [name, value]")
            out[item[0]] = decode_tree(item[1], depth + 1)
        return out
    if tag == "input":
        return InputRef(_int(x, "tensor input", 0))
    if tag == "float":
        try:
            return float.fromhex(_str(x, "float"))
        except ValueError:
            raise BadEntry(f"float {x!r}") from None
    if tag == "dtype":
        return _dtype(x, "dtype argument")
    if tag == "device":
        return _device(x, "device argument")
    table = LAYOUTS if tag == "layout" else MEMORY_FORMATS
    if x not in table:
        raise BadEntry(f"{tag} {x!r}")
    return table[x]


def _decode_tensor(v) -> torch.Tensor:
    _fields(v, "constant", {"dtype", "shape", "strides", "device", "data"})
    dtype, device = _dtype(v["dtype"], "constant dtype"), _device(v["device"], "constant device")
    shape, strides = _sizes(v["shape"], "constant shape"), _sizes(v["strides"], "constant strides")
    if len(shape) != len(strides):
        raise BadEntry("a constant's shape and strides differ in length")
    extent = _extent(shape, strides)
    try:
        data = base64.b64decode(_str(v["data"], "constant data"), validate=True)
    except ValueError:
        raise BadEntry("constant data is not base64") from None
    if len(data) != extent * dtype.itemsize:
        raise BadEntry(f"constant data: {len(data)} bytes for {extent} elements of {dtype}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise BadEntry("a CUDA constant without CUDA")
    if not extent:
        return torch.empty_strided(shape, strides, dtype=dtype, device=device)
    flat = torch.frombuffer(bytearray(data), dtype=dtype).clone()  # its own memory, not the buffer's
    return flat.to(device).as_strided(shape, strides)  # strides kept (a broadcast constant's 0s too)
