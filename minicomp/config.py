"""Every setting that changes what minicomp generates or how a compile behaves, declared once.

Each ``Setting`` names its environment variable (``MINICOMP_*``) and default, the values it takes, and
whether it changes generated code (``codegen``). The torch globals that lowering reads (TF32 for
matrix products and convolutions) are declared here too, read from torch itself, so one list says
what a compiled graph depends on besides its inputs.

Read a setting as an attribute (``config.conv``, ``config.poison``); the environment is read at every
access, so a variable set after import takes effect at the next compile. ``patch`` overrides
settings for a ``with`` block (tests); for a torch global it sets torch's own flag and restores it.
``fingerprint()`` digests the settings marked ``codegen``: it is part of every graph-cache key, so a
graph compiled under one setting is never reused under another (a new ``codegen`` setting is keyed
without anyone touching the cache). An invalid value raises a ``ConfigError`` naming the variable and
the values it takes.

This module imports nothing of minicomp's: every layer may read it.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


class ConfigError(ValueError):
    """A setting has a value it does not take."""


@dataclass(frozen=True)
class Setting:
    name: str                        # the attribute: ``config.<name>``
    env: str | None                  # its environment variable; None for a torch global
    default: Any                     # a callable: computed when read (a path under the home folder)
    kind: str                        # "bool", "choice", "path"; "torch" for a torch global
    codegen: bool                    # changes generated code: part of ``fingerprint()``
    doc: str
    choices: tuple = ()              # "choice": the values it takes
    read: Callable[[], Any] | None = None    # a torch global: its getter and setter
    write: Callable[[Any], None] | None = None

    def parse(self, raw: Any) -> Any:
        """``raw`` (an environment string, or a value passed to ``patch``) as this setting's value."""
        where = self.env or f"config.{self.name}"
        if self.kind == "bool" or (self.kind == "torch" and isinstance(self.default, bool)):
            if isinstance(raw, bool):
                return raw
            text = str(raw).strip().lower()
            if text in _TRUE or text in _FALSE:
                return text in _TRUE
            raise ConfigError(f"{where}={raw!r}: expected one of 0, 1 (or {', '.join(_TRUE[1:] + _FALSE[1:])})")
        if self.kind == "path":
            return Path(raw).expanduser() if raw else None
        text = str(raw)
        if text not in self.choices:
            raise ConfigError(f"{where}={raw!r}: expected one of {', '.join(self.choices)}")
        return text

    def value(self) -> Any:
        if _overrides and self.name in _overrides:
            return _overrides[self.name]
        if self.read is not None:
            return self.read()
        raw = os.environ.get(self.env, "")
        if raw == "":
            return self.default() if callable(self.default) else self.default
        parsed = _parsed.get((self.name, raw), _parsed)  # a wrapper reads ``poison`` every call: parse once
        if parsed is _parsed:
            parsed = _parsed[self.name, raw] = self.parse(raw)
        return parsed


def _float32_matmul_precision(value: str) -> None:
    torch.set_float32_matmul_precision(value)


def _set(obj, attr: str) -> Callable[[Any], None]:
    return lambda value: setattr(obj, attr, value)


SETTINGS: dict[str, Setting] = {s.name: s for s in [
    # --- what the compiler generates ----------------------------------------------------------
    Setting("attention", "MINICOMP_ATTENTION", "auto", "choice", True,
            "attention in minicomp's flash kernel: auto (the measured rules for written-out attention and "
            "for SDPA's ops; ir/choices.py), 1 (every attention it can run), 0 (none), sdpa (none: written-out "
            "attention as one call of PyTorch's SDPA where that is exact)", ("auto", "0", "1", "sdpa")),
    Setting("gemm", "MINICOMP_GEMM", "auto", "choice", True,
            "which matrix products run in the GEMM template: auto (measured rule; ir/choices.py), "
            "template (every one), cublas (none: aten.mm/bmm)", ("auto", "template", "cublas")),
    Setting("bias", "MINICOMP_BIAS", "auto", "choice", True,
            "where a linear layer's bias after a cuBLAS product is added: auto (measured rule; ir/choices.py), "
            "addmm (cuBLAS's epilogue), kernel (minicomp's kernels: fused into the next one, or its own)",
            ("auto", "addmm", "kernel")),
    Setting("conv", "MINICOMP_CONV", "auto", "choice", True,
            "which convolutions run as IR kernels: cudnn (none), ir (every one it can), auto (measured "
            "rule; ir/choices.py)", ("auto", "cudnn", "ir")),
    Setting("channels_last_training", "MINICOMP_CHANNELS_LAST_TRAINING", "auto", "choice", True,
            "a training graph's convolutions read channels-last inputs: auto (graphs with depthwise "
            "convolutions, as measured; frontend/channels_last.py), 1 (every graph the layout rule favours), "
            "0 (none)", ("auto", "0", "1")),
    Setting("partitioner", "MINICOMP_PARTITIONER", "default", "choice", True,
            "how AOTAutograd splits a training step into forward and backward graphs: default (the forward "
            "saves every result its backward reads, as eager's autograd), min-cut (AOTAutograd's min-cut "
            "rematerialization, Inductor's: fusible ops recomputed in the backward where that saves traffic)",
            ("default", "min-cut")),
    Setting("memory_plan", "MINICOMP_MEMORY_PLAN", "1", "choice", True,
            "the wrapper's memory plan: 1 frees, reuses and writes in place, free only frees, 0 plans "
            "nothing (passes/memory_plan.py)", ("1", "free", "0")),
    Setting("index_checks", "MINICOMP_INDEX_CHECKS", True, "bool", True,
            "gathers and scatters check their indices as eager does (off: an index out of range reads "
            "outside the tensor; frontend/rules_index.py, benchmarks/index_checks.py)"),
    # torch's own globals that lowering reads: fp32 products and convolutions use TF32 where eager would
    Setting("cuda_matmul_allow_tf32", None, False, "torch", True,
            "torch.backends.cuda.matmul.allow_tf32 (frontend/rules.py: fp32 matrix products)",
            read=lambda: bool(torch.backends.cuda.matmul.allow_tf32),
            write=_set(torch.backends.cuda.matmul, "allow_tf32")),
    Setting("float32_matmul_precision", None, "highest", "torch", True,
            "torch.get_float32_matmul_precision() (frontend/rules.py: fp32 matrix products)",
            ("highest", "high", "medium"), read=torch.get_float32_matmul_precision,
            write=_float32_matmul_precision),
    Setting("cudnn_allow_tf32", None, True, "torch", True,
            "torch.backends.cudnn.allow_tf32 (passes/conv_lowering.py: fp32 convolutions as products)",
            read=lambda: bool(torch.backends.cudnn.allow_tf32),
            write=_set(torch.backends.cudnn, "allow_tf32")),
    # --- how a compile behaves (the generated code is the same) -----------------------------------
    Setting("cache_dir", "MINICOMP_CACHE_DIR", lambda: Path.home() / ".cache" / "minicomp", "path", False,
            "the cache folder (default ~/.cache/minicomp; runtime/cache.py checks who may write it)"),
    Setting("graph_cache", "MINICOMP_GRAPH_CACHE", True, "bool", False,
            "store inference graphs whole and load them in later processes (graphs/cached.py)"),
    Setting("dump", "MINICOMP_DUMP", None, "path", False,
            "write every graph's IR, kernels, wrapper and summary under this folder"),
    Setting("cpu", "MINICOMP_CPU", "pytorch", "choice", False,
            "what runs a graph on CPU tensors: pytorch (PyTorch's own CPU kernels, the whole graph), interpret "
            "(minicomp's Triton kernels in Triton's interpreter: to see them run and to test them; ~1,000x "
            "slower than eager)", ("pytorch", "interpret")),
    Setting("strict", "MINICOMP_STRICT", False, "bool", False,
            "raise a MinicompError where a graph or an op would fall back to PyTorch"),
    Setting("verify", "MINICOMP_VERIFY", False, "bool", False,
            "translation validation: name the first stage that changes results (slow; graphs/validation.py)"),
    Setting("poison", "MINICOMP_POISON", False, "bool", False,
            "fill fresh and reused buffers with garbage at run time (read by the wrapper per call)"),
    Setting("parallel_compile", "MINICOMP_PARALLEL_COMPILE", True, "bool", False,
            "compile a graph's Triton kernels ahead, in threads, on a GPU"),
    Setting("tune_verbose", "MINICOMP_TUNE_VERBOSE", True, "bool", False,
            "print each autotuned kernel's timings on stderr"),
]}

_overrides: dict[str, Any] = {}
_parsed: dict[tuple[str, str], Any] = {}  # (setting, environment string) -> its value


def __getattr__(name: str) -> Any:
    setting = SETTINGS.get(name)
    if setting is None:
        raise AttributeError(f"minicomp.config has no setting {name!r}")
    return setting.value()


def get(name: str) -> Any:
    """The setting ``name``'s value now (``config.<name>`` reads the same)."""
    return __getattr__(name)


@contextlib.contextmanager
def patch(**values):
    """Settings overridden for a ``with`` block: ``with config.patch(conv="ir", poison=True): ...``.
    Values are checked as the environment's are; a torch global is set in torch and restored."""
    unknown = sorted(set(values) - set(SETTINGS))
    if unknown:
        raise ConfigError(f"minicomp.config has no setting {', '.join(unknown)}; the settings: {', '.join(SETTINGS)}")
    parsed = {name: SETTINGS[name].parse(v) for name, v in values.items()}
    saved = {name: (name in _overrides, _overrides.get(name), SETTINGS[name].value()) for name in parsed}
    try:
        for name, value in parsed.items():
            setting = SETTINGS[name]
            if setting.write is not None:
                setting.write(value)
            else:
                _overrides[name] = value
        yield
    finally:
        for name, (had, override, before) in reversed(saved.items()):
            setting = SETTINGS[name]
            if setting.write is not None:
                setting.write(before)
            elif had:
                _overrides[name] = override
            else:
                _overrides.pop(name, None)


def codegen_settings() -> dict[str, Any]:
    """The settings that change generated code, with their values now."""
    return {name: s.value() for name, s in SETTINGS.items() if s.codegen}


def fingerprint() -> str:
    """A digest of ``codegen_settings()``: part of every graph-cache key."""
    text = ";".join(f"{name}={value!r}" for name, value in sorted(codegen_settings().items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@contextlib.contextmanager
def without_cudnn_attention():
    """PyTorch's SDPA with cuDNN's kernel left out for a ``with`` block, the user's setting restored: a
    choice made while running (``graphs.dynamic``: cuDNN plans every new shape), so nothing is keyed on it.
    The torch globals minicomp touches all live in this module."""
    enabled = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(False)
    try:
        yield
    finally:
        torch.backends.cuda.enable_cudnn_sdp(enabled)
