"""Issue 40, a cache that never runs foreign code: the cache folder is used only where nobody else
can write, and the writability probe follows no link."""
from __future__ import annotations

import os
import stat
import warnings

import pytest
import torch

import minicomp
from minicomp.runtime import cache


def with_fallback(x, w):
    return torch.softmax(x * w, -1) + torch.sort(x, 0).values  # sort runs in PyTorch


def inputs():
    return torch.randn(6, 33), torch.randn(33)


def _pointwise(x):
    return torch.relu(x) * 0.5 + 1


def compile_once(fn=with_fallback, make=inputs):
    """A fresh compile (Dynamo reset: what a new process does) checked against eager; its report and
    the warnings it gave."""
    torch._dynamo.reset()
    args = make()
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = minicomp.compile(fn)(*args)
        torch.testing.assert_close(out, fn(*args))
    return minicomp.report(), [str(w.message) for w in caught]


# --- the cache folder ---------------------------------------------------------------------------------

def test_a_symlinked_probe_does_not_truncate_its_target(cache_dir, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (cache_dir / f".probe-{os.getpid()}").symlink_to(victim)
    compile_once(_pointwise, lambda: (torch.randn(8),))
    assert victim.read_text() == "precious"


def _uses_a_private_folder(cache_dir, reason: str):
    """Two compiles: both right, one warning naming the folder and ``reason``, nothing written there."""
    before = sorted(p for p in cache_dir.rglob("*"))
    warned = compile_once(_pointwise, lambda: (torch.randn(8),))[1] + compile_once(with_fallback)[1]
    about = [w for w in warned if "cache folder" in w]
    assert len(about) == 1 and str(cache_dir) in about[0] and reason in about[0], warned
    assert sorted(p for p in cache_dir.rglob("*")) == before
    assert not str(minicomp.report().kernels[0].source_path).startswith(str(cache_dir))


def test_a_folder_of_another_user_is_not_used(cache_dir, monkeypatch):
    monkeypatch.setattr(os, "getuid", lambda: os.stat(cache_dir).st_uid + 1)
    _uses_a_private_folder(cache_dir, "belongs to user id")


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0, reason="chown needs root")
def test_a_subfolder_of_another_user_is_not_used(cache_dir):
    (cache_dir / "wrappers").mkdir(mode=0o700)
    os.chown(cache_dir / "wrappers", 12345, -1)
    _uses_a_private_folder(cache_dir, "wrappers/ belongs to user id 12345")


@pytest.mark.parametrize("sub", ["", "kernels", "tuned"])
def test_a_folder_others_can_write_is_not_used(cache_dir, sub):
    folder = cache_dir / sub
    folder.mkdir(mode=0o700, exist_ok=True)
    folder.chmod(0o777 if not sub else 0o770)
    _uses_a_private_folder(cache_dir, "writable by its group or others")


@pytest.mark.parametrize("sub", ["", "graphs"])
def test_a_symlinked_folder_is_not_used(cache_dir, tmp_path, monkeypatch, sub):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    link = cache_dir / (sub or "link")
    link.symlink_to(elsewhere, target_is_directory=True)
    if not sub:
        monkeypatch.setenv("MINICOMP_CACHE_DIR", str(link))
    _uses_a_private_folder(link if not sub else cache_dir, "symbolic link")
    assert not any(elsewhere.iterdir())


def test_a_new_cache_folder_is_private(tmp_path, monkeypatch):
    root = tmp_path / "new" / "minicomp"
    monkeypatch.setenv("MINICOMP_CACHE_DIR", str(root))
    old = os.umask(0o002)  # a umask that would leave new folders group-writable
    try:
        _, warned = compile_once()
    finally:
        os.umask(old)
    assert not [w for w in warned if "cache folder" in w]
    for folder in [root, *(root / kind for kind in cache.SUBFOLDERS)]:
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    assert not list(root.glob(".probe-*"))
