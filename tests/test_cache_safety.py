"""Issue 40, a cache that never runs foreign code: graph entries are validated JSON (never unpickled),
tuned schedules are checked against their template, the cache folder is used only where nobody else
can write, the writability probe follows no link, and every setting that changes generated code keys
the graph cache."""
from __future__ import annotations

import json
import os
import pickle
import stat
import warnings

import pytest
import torch

import minicomp
from minicomp import config
from minicomp.graphs import cached
from minicomp.backend import Backend
from minicomp.passes import tune as tuning
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


# --- graph entries ----------------------------------------------------------------------------------

def stored_entry(cache_dir):
    """Compile ``with_fallback`` once: its graph-cache entry's path (any format)."""
    report, _ = compile_once()
    assert not report.from_cache
    (entry,) = [p for p in (cache_dir / "graphs").iterdir() if not p.name.startswith(".")]
    return entry


class Plant:
    """Unpickling this makes a folder: evidence that a cache file ran code."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.mkdir, (self.marker,)


def test_a_planted_pickle_entry_runs_no_code(cache_dir, tmp_path):
    entry = stored_entry(cache_dir)
    marker = tmp_path / "ran"
    payload = pickle.dumps(Plant(marker))
    for name in (f"{entry.stem}.pkl", f"{entry.stem}.json"):  # wherever an entry might be read from
        (cache_dir / "graphs" / name).write_bytes(payload)
    report, warned = compile_once()
    assert not marker.exists(), "a cache entry was unpickled"
    assert not report.from_cache and report.whole_graph_fallback is None
    assert sum("corrupt cache entry" in w for w in warned) <= 1, warned


def _evil(tmp_path, entry: dict) -> list[tuple[str, dict]]:
    """Entries that each break one rule of the format (a module that would make ``ran`` if imported
    sits next to the cache)."""
    (tmp_path / "evil.py").write_text(f"import os\nos.mkdir({str(tmp_path / 'ran')!r})\n")

    def changed(**edits):
        e = json.loads(json.dumps(entry))
        for path, value in edits.items():
            *parents, last = path.split(".")
            target = e
            for p in parents:
                target = target[int(p)] if p.isdigit() else target[p]
            target[int(last) if last.isdigit() else last] = value
        return e
    kernel = entry["kernels"][0]
    op_key = next(k for k, v in entry["externs"] if "op" in v)
    op_index = next(i for i, (k, v) in enumerate(entry["externs"]) if k == op_key)
    return [
        ("pickle-style object", changed(**{"externs.0.1": {"__reduce__": ["os.mkdir", [str(tmp_path / "ran")]]}})),
        ("wrapper outside the cache", changed(wrapper=str(tmp_path / "evil.py"))),
        ("wrapper up the tree", changed(wrapper="wrappers/../../evil.py")),
        ("kernel path of another function", changed(**{"kernels.0.path": kernel["path"].replace(kernel["function"], "evil")})),
        ("function that is code", changed(**{"kernels.0.function": "__import__('os').mkdir('ran')"})),
        ("op that is not a torch op", changed(**{f"externs.{op_index}.1.op": "builtins.eval.default"})),
        ("op through a module", changed(**{f"externs.{op_index}.1.op": "os.system"})),
        ("argument of an unknown tag", changed(**{f"externs.{op_index}.1.args": {"call": ["os.system", "id"]}})),
        ("unknown dtype", changed(**{"kernels.0.dtypes": ["object"]})),
        ("launch option that is code", changed(**{"kernels.0.options": {"XBLOCK=__import__('os')": 1}})),
        ("launch option of another type", changed(**{"kernels.0.options": {"XBLOCK": "8"}})),
        ("device-assert option of another value", changed(**{"kernels.0.options": {"debug": "yes"}})),
        ("signature of another type", changed(**{"signature.0.0": "6x33"})),
        ("newer version", changed(version=2)),
        ("extra field", {**entry, "code": "import os"}),
    ]


def test_hostile_json_entries_run_no_code_and_cost_a_recompile(cache_dir, tmp_path):
    entry = stored_entry(cache_dir)
    good = json.loads(entry.read_text())
    for why, evil in _evil(tmp_path, good):
        entry.write_text(json.dumps(evil))
        report, warned = compile_once()
        assert not (tmp_path / "ran").exists(), why
        assert not report.from_cache and report.whole_graph_fallback is None, why
        assert sum("corrupt cache entry" in w for w in warned) == 1, (why, warned)
    report, warned = compile_once()  # the recompile stored a good entry again
    assert report.from_cache and not warned


def test_a_kernel_that_checks_indices_on_a_gpu_keeps_its_launch_options():
    """On a GPU a checking kernel launches with the device-assert options (``debug``, and the overflow
    sanitizer off): its stored entry must decode, or every warm start would recompile the graph."""
    from minicomp.graphs.cache_entry import _decode_kernel
    from minicomp.runtime.triton_shims import DEVICE_ASSERTS
    options = {"XBLOCK": 1024, "INTERPRETED": 0, "num_warps": 4, "num_stages": 1, **DEVICE_ASSERTS}
    stored = {"name": "k0_embedding_f32_4x8", "function": "embedding_f32_4x8_0123456789abcdef0123",
              "path": "kernels/embedding_f32_4x8_0123456789abcdef0123_0123456789abcdef0123.py",
              "dtypes": ["float32", "int64", "float32"], "options": options}
    assert _decode_kernel(json.loads(json.dumps(stored))).options == options


def test_a_constant_is_stored_by_value_with_its_strides(cache_dir):
    def fn(x):
        return x * torch.tensor([[0.5, 1.5, -2.0]]) + 1  # a constant the graph bakes in
    compile_once(fn, lambda: (torch.randn(4, 3),))
    report, warned = compile_once(fn, lambda: (torch.randn(4, 3),))
    assert report.from_cache and not warned

    from minicomp.graphs.cache_entry import _decode_tensor, _encode_tensor
    base = torch.randn(4, 6, dtype=torch.bfloat16)
    for t in (base, base.t(), base[1:, ::2], base[0].expand(3, 6), torch.empty(0, 3), torch.tensor(True)):
        back = _decode_tensor(json.loads(json.dumps(_encode_tensor(t))))
        assert back.dtype == t.dtype and back.shape == t.shape and back.stride() == t.stride()
        assert torch.equal(back, t)


def test_a_stored_graph_that_fails_at_its_first_run_is_compiled_instead(cache_dir):
    entry = stored_entry(cache_dir)
    data = json.loads(entry.read_text())
    for key, extern in data["externs"]:
        if extern.get("op") == "aten.sort.default":
            extern["op"] = "aten.relu.default"  # valid, but called with sort's arguments it raises
    entry.write_text(json.dumps(data))
    report, warned = compile_once()
    assert report.whole_graph_fallback is None
    assert sum("failed at its first run" in w for w in warned) == 1, warned


# --- tuned schedules --------------------------------------------------------------------------------

HOSTILE_TUNED = {
    "block name that is code": {"XBLOCK": 64, "Z: tl.constexpr, *, W=__import__('os').mkdir({ran!r}), V": 1},
    "huge block": {"XBLOCK": 2**40},
    "negative block": {"XBLOCK": -64},
    "block of another type": {"XBLOCK": "64"},
    "boolean block": {"XBLOCK": True},
    "block that is not a power of two": {"XBLOCK": 48},
    "missing block": {},
}


@pytest.mark.parametrize("why", [*HOSTILE_TUNED, "warps that are code", "huge stages", "persistent of another type",
                                 "not a schedule"])
def test_hostile_tuned_entries_are_ignored_and_run_no_code(cache_dir, tmp_path, monkeypatch, why):
    keys = []
    monkeypatch.setattr(tuning, "structural_key", lambda k, t, key=tuning.structural_key: keys.append(key(k, t)) or keys[-1])
    ran = str(tmp_path / "ran")
    with config.patch(graph_cache=False):
        compile_once(_pointwise, lambda: (torch.randn(300),))
        (key,) = set(keys)
        blocks = {name.format(ran=ran): v for name, v in HOSTILE_TUNED.get(why, {"XBLOCK": 64}).items()}
        entry = {"blocks": blocks, "num_warps": 1, "num_stages": 1, "persistent": True}
        entry.update({"warps that are code": {"num_warps": f"__import__('os').mkdir({ran!r})"},
                      "huge stages": {"num_stages": 10**9}, "persistent of another type": {"persistent": "yes"},
                      "not a schedule": {"code": "import os"}}.get(why, {}))
        (cache_dir / "tuned").mkdir(mode=0o700, exist_ok=True)
        (cache_dir / "tuned" / f"{key}.json").write_text(json.dumps(entry))
        report, warned = compile_once(_pointwise, lambda: (torch.randn(300),))
    assert not (tmp_path / "ran").exists()
    assert report.whole_graph_fallback is None and not any(d.startswith("tuned") for d in report.decisions)
    assert sum("tuned schedule" in w for w in warned) == 1, warned


def test_max_autotune_measures_again_over_a_hostile_tuned_entry(cache_dir, capsys, tuning_in_the_interpreter):
    compile_once(_pointwise, lambda: (torch.randn(300),))
    minicomp.compile(_pointwise, mode="max-autotune")(torch.randn(300))
    (entry,) = (cache_dir / "tuned").glob("*.json")
    good = json.loads(entry.read_text())
    entry.write_text(json.dumps({**good, "num_warps": "4"}))
    torch._dynamo.reset()
    with pytest.warns(UserWarning, match="tuned schedule .* ignored .*measuring again"):
        minicomp.compile(_pointwise, mode="max-autotune")(torch.randn(300))
    assert type(json.loads(entry.read_text())["num_warps"]) is int  # measured and stored again
    report, warned = compile_once(_pointwise, lambda: (torch.randn(300),))
    assert any(d.startswith("tuned") for d in report.decisions) and not warned


# --- settings in the key --------------------------------------------------------------------------------

def _other(name: str):
    setting, value = config.SETTINGS[name], config.get(name)
    return (not value) if isinstance(value, bool) else next(c for c in setting.choices if c != value)


@pytest.mark.parametrize("name", [n for n, s in config.SETTINGS.items() if s.codegen])
def test_each_setting_that_changes_generated_code_keys_the_graph_cache(name):
    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    options, x = Backend().options, torch.randn(4, 4)
    first = cached.key(gm, [x], options)
    with config.patch(**{name: _other(name)}):
        assert cached.key(gm, [x], options) != first, name
    assert cached.key(gm, [x], options) == first


def test_a_flipped_tf32_flag_is_a_graph_cache_miss(cache_dir):
    assert not compile_once()[0].from_cache and compile_once()[0].from_cache
    baseline = set((cache_dir / "graphs").iterdir())
    for name in ("cuda_matmul_allow_tf32", "float32_matmul_precision", "cudnn_allow_tf32"):
        with config.patch(**{name: _other(name)}):
            assert not compile_once()[0].from_cache, name
        for entry in set((cache_dir / "graphs").iterdir()) - baseline:
            entry.unlink()  # torch couples the first two flags: each flip is checked against the baseline
    assert compile_once()[0].from_cache
