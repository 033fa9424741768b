"""Content-addressed on-disk cache of generated source, tuned schedules and whole graphs.

Files are named by the hash of their content, written atomically (temp file, then rename) and
imported from there, so tracebacks and Triton's own cache see real files. A file whose content no
longer matches its name is rewritten. Either way the cost is a recompile, never a wrong result.

What is read back runs as code (kernels/, wrappers/: imported) or steers what is generated (tuned/,
graphs/). A content hash is no secret: anyone who can write into the folder can plant a file under
the name we would look for. So the cache is used only where no one else can write:

* the folder (``MINICOMP_CACHE_DIR``, default ``~/.cache/minicomp``) and its subfolders kernels/,
  wrappers/, graphs/ and tuned/ must be real folders (not symbolic links: a link can point anywhere
  its maker chose, and who may change it depends on the folder that holds it, which is not ours to
  check), owned by this user and not writable by group or others. New ones are made 0700;
* otherwise minicomp uses a private temporary folder (``mkdtemp``: 0700) for this process and says
  why in one warning. So does a folder it cannot write (probed with ``O_EXCL | O_NOFOLLOW`` under a
  random name: a planted symbolic link is never followed, nor its target truncated).

Inside a folder that only we can write nobody else can plant a file or a symbolic link, so loading
a module by its path (``load``), checking a file's content against its name (``intact``) and then
importing it cannot be redirected; writes go to a fresh ``mkstemp`` file (``O_EXCL``, 0600) renamed
over the name, which replaces a link rather than following it. Data read back (tuned schedules,
graph entries) is JSON, never unpickled, and is validated by its reader (``passes/tune.py``,
``graphs/cache_entry.py``) before it reaches generated source.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import secrets
import stat
import sys
import tempfile
import warnings
from pathlib import Path
from types import ModuleType

from .. import config
from .triton_shims import compile_ahead, interpreting

stats = {"written": 0, "reused": 0, "repaired": 0, "graphs_reused": 0}
SUBFOLDERS = ("kernels", "wrappers", "graphs", "tuned")
SOURCE_NAME = re.compile(r"(kernels|wrappers)/([A-Za-z_][A-Za-z0-9_]*)_([0-9a-f]{20})\.py")
"""A stored source file's path relative to the cache: ``<kind>/<name>_<content hash>.py``."""
_KEY = re.compile(r"[A-Za-z0-9_-]{1,64}")  # a file name, never a path
_modules: dict[tuple[str, bool], ModuleType] = {}
_fallback_dir: Path | None = None
_chosen: dict[Path, Path] = {}  # configured folder -> the folder used for it (itself, or _fallback_dir)


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def cache_dir() -> Path:
    """The cache folder: ``config.cache_dir`` if it is safe and writable, else a private temporary
    folder (one warning per configured folder and process). Checked once per folder and process."""
    global _fallback_dir
    root = config.cache_dir
    chosen = _chosen.get(root)
    if chosen is not None:
        return chosen
    problem = _check(root)
    if problem is None:
        _chosen[root] = root
        return root
    if _fallback_dir is None:
        _fallback_dir = Path(tempfile.mkdtemp(prefix="minicomp-cache-"))
        for kind in SUBFOLDERS:
            _private_folder(_fallback_dir / kind)
    warnings.warn(f"minicomp: cache folder {root} is not used: {problem}; using the private folder "
                  f"{_fallback_dir} for this process")
    _chosen[root] = _fallback_dir
    return _fallback_dir


def _check(root: Path) -> str | None:
    """Why ``root`` cannot be the cache, or None. Missing folders are made (0700) once every existing
    one has passed: a folder that is not used gains nothing."""
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
        _private_folder(root)
        folders = [(root, "it")] + [(root / kind, f"its {kind}/") for kind in SUBFOLDERS]
        for path, what in folders:
            problem = _unsafe(path, what) if os.path.lexists(path) else None
            if problem is not None:
                return problem
        for path, what in folders:
            _private_folder(path)
            problem = _unsafe(path, what)
            if problem is not None:
                return problem
        probe = root / f".probe-{os.getpid()}-{secrets.token_hex(4)}"
        os.close(os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0), 0o600))
        os.unlink(probe)
    except OSError as e:
        return f"it is not writable ({e})"
    return None


def _private_folder(path: Path) -> None:
    """Make ``path`` a folder only this user can use, unless something is there already."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass


def _unsafe(path: Path, what: str) -> str | None:
    """Why others could plant files in ``path`` (``what``: it, in the message), or None."""
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        return f"{what} is a symbolic link (point MINICOMP_CACHE_DIR at a real folder)"
    if not stat.S_ISDIR(info.st_mode):
        return f"{what} is not a folder"
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        return f"{what} belongs to user id {info.st_uid}, not to this user ({os.getuid()})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (f"{what} is writable by its group or others (mode {stat.S_IMODE(info.st_mode):o}: "
                f"check what is in it, then chmod go-w)")
    return None


def _atomic_write(path: Path, data: str | bytes) -> None:
    if not path.parent.is_dir():  # removed while this process runs: made private again
        path.parent.parent.parent.mkdir(parents=True, exist_ok=True)
        _private_folder(path.parent.parent)
        _private_folder(path.parent)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
    with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)
    os.replace(tmp, path)


def store_tuned(key: str, choices: dict) -> None:
    """Remember tuned choices (autotuner winners) under ``<cache>/tuned/<key>.json``."""
    _atomic_write(_entry_path("tuned", key), json.dumps(choices, sort_keys=True))


def load_tuned(key: str) -> dict | None:
    """Tuned choices for ``key`` as stored (JSON: the caller validates them), or None (also when the
    entry is unreadable: it is re-tuned)."""
    try:
        choices = json.loads(_entry_path("tuned", key).read_text())
    except (OSError, ValueError, RecursionError):
        return None
    return choices if isinstance(choices, dict) else None


def store_graph(key: str, entry: dict) -> None:
    """Write a graph-cache entry (``graphs/cache_entry.encode``'s JSON data) under ``<cache>/graphs/<key>.json``."""
    _atomic_write(_entry_path("graphs", key), json.dumps(entry, separators=(",", ":"), allow_nan=False))


def load_graph(key: str) -> dict | None:
    """The JSON data stored under ``key`` (``graphs/cache_entry.decode`` validates it), or None: absent, or
    unreadable (then a warning, and it is rebuilt)."""
    path = _entry_path("graphs", key)
    try:
        text = path.read_bytes()
    except OSError:
        return None
    try:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        return data
    except (ValueError, RecursionError):
        corrupt(path)
        return None


def corrupt(path: Path | str, why: str = "") -> None:
    """Say that a cache entry is damaged (it is rebuilt)."""
    warnings.warn(f"minicomp: corrupt cache entry {path}{f' ({why})' if why else ''}; rebuilding it")
    stats["repaired"] += 1


def _entry_path(kind: str, key: str) -> Path:
    if not _KEY.fullmatch(key):  # keys are our own digests: never a path of someone's choosing
        raise ValueError(f"minicomp: bad cache key {key!r}")
    return cache_dir() / kind / f"{key}.json"


def intact(relative: str) -> Path | None:
    """The stored source file ``relative`` to the cache folder (``SOURCE_NAME``) if its content still
    matches the hash in its name, else None."""
    name = SOURCE_NAME.fullmatch(relative)
    if name is None:
        return None
    path = cache_dir() / relative
    try:
        if digest(path.read_text()) != name.group(3):
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
        corrupt(path)
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
