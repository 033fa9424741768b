"""Content-addressed on-disk cache of generated source.

Files are named by the hash of their content, written atomically (temp file, then rename) and
imported from there, so tracebacks and Triton's own cache see real files. A file whose content no
longer matches its name is rewritten; a folder that cannot be written falls back to a temporary one
with a warning. Either way the cost is a recompile, never a wrong result.
"""
from __future__ import annotations

import hashlib
import json
import importlib.util
import os
import pickle
import sys
import tempfile
import warnings
from pathlib import Path
from types import ModuleType

from .. import config
from .triton_shims import compile_ahead, interpreting

stats = {"written": 0, "reused": 0, "repaired": 0, "graphs_reused": 0}
_modules: dict[tuple[str, bool], ModuleType] = {}
_fallback_dir: Path | None = None
_writable: set[Path] = set()


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def cache_dir() -> Path:
    """``$MINICOMP_CACHE_DIR``, default ``~/.cache/minicomp``; a temporary folder if unwritable. A
    folder found writable is not probed again (a graph asks once per kernel)."""
    global _fallback_dir
    root = config.cache_dir
    if root in _writable:
        return root
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / f".probe-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
        _writable.add(root)
        return root
    except OSError as e:
        if _fallback_dir is None:
            _fallback_dir = Path(tempfile.mkdtemp(prefix="minicomp-cache-"))
            warnings.warn(f"minicomp: cache folder {root} is not writable ({e}); using {_fallback_dir}")
        return _fallback_dir


def _atomic_write(path: Path, data: str | bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
    with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)
    os.replace(tmp, path)


def store_tuned(key: str, choices: dict) -> None:
    """Remember tuned choices (autotuner winners) under ``<cache>/tuned/<key>.json``."""
    _atomic_write(cache_dir() / "tuned" / f"{key}.json", json.dumps(choices, sort_keys=True))


def load_tuned(key: str) -> dict | None:
    """Tuned choices for ``key``, or None (also when the entry is unreadable: it is re-tuned)."""
    path = cache_dir() / "tuned" / f"{key}.json"
    try:
        choices = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return choices if isinstance(choices, dict) else None


def store_graph(key: str, entry) -> bool:
    """Pickle a compiled graph's entry under ``<cache>/graphs/<key>.pkl``; False if it cannot be
    pickled (a fallback op that is not a named aten-style op, say): that graph is not cached."""
    try:
        data = pickle.dumps(entry)
    except Exception:  # noqa: BLE001 - unpicklable parts only mean no graph-cache entry
        return False
    _atomic_write(cache_dir() / "graphs" / f"{key}.pkl", data)
    return True


def load_graph(key: str):
    """The entry stored under ``key``, or None (absent, or unreadable: then it is rebuilt)."""
    path = cache_dir() / "graphs" / f"{key}.pkl"
    try:
        data = path.read_bytes()
    except OSError:
        return None
    try:
        return pickle.loads(data)
    except Exception:  # noqa: BLE001 - a damaged entry costs a recompile
        warnings.warn(f"minicomp: corrupt cache entry {path}; rebuilding it")
        stats["repaired"] += 1
        return None


def intact(relative: str) -> Path | None:
    """The stored file ``relative`` to the cache folder if its content still matches the hash in its
    name, else None."""
    path = cache_dir() / relative
    try:
        if digest(path.read_text()) != path.stem.rsplit("_", 1)[-1]:
            return None
    except (OSError, UnicodeDecodeError):
        return None
    stats["reused"] += 1
    return path


def store(kind: str, name: str, source: str) -> Path:
    """Write ``source`` under ``<cache>/<kind>/<name>_<hash>.py`` unless an intact copy exists."""
    path = cache_dir() / kind / f"{name}_{digest(source)}.py"
    if path.exists():
        try:
            if path.read_text() == source:
                stats["reused"] += 1
                return path
        except (OSError, UnicodeDecodeError):
            pass
        warnings.warn(f"minicomp: corrupt cache entry {path}; rebuilding it")
        stats["repaired"] += 1
    _atomic_write(path, source)
    stats["written"] += 1
    return path


def load(path: Path, interpret: bool = False) -> ModuleType:
    """Import a cached file (once per process and mode)."""
    key = (str(path), interpret)
    if key not in _modules:
        name = f"minicomp_gen_{path.stem}_{'interp' if interpret else 'jit'}"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        with interpreting(interpret):
            spec.loader.exec_module(module)
        sys.modules[name] = module
        _modules[key] = module
    return _modules[key]


def precompile(jobs: list[tuple]) -> None:
    """Compile Triton kernels before their first launch finds them in Triton's cache. ``jobs``:
    (jit function, argument dtypes, launch keywords). Threads, not processes: Triton releases the GIL
    in its MLIR passes and ptxas (about 2x on the H200 host with 16 cores), while a process pool costs
    3-4 s to start (measured), longer than a graph's whole compile. A kernel that fails here is
    compiled at its launch as usual. The variants of one function (kernels are named by content, so
    launches with other dtypes or options can share it) compile one after another in one thread:
    ``triton_shims.compile_ahead`` swaps the function's ``compile`` while it runs."""
    from concurrent.futures import ThreadPoolExecutor

    def compile_variants(variants: list[tuple]) -> None:
        for fn, dtypes, options in variants:
            try:
                compile_ahead(fn, dtypes, options)
            except Exception:  # noqa: BLE001 - the launch compiles it again and reports any error
                pass
    by_function: dict[int, list[tuple]] = {}
    for job in jobs:
        by_function.setdefault(id(job[0]), []).append(job)
    with ThreadPoolExecutor(max_workers=min(len(by_function), os.cpu_count() or 1)) as pool:
        list(pool.map(compile_variants, by_function.values()))
