"""Autotuning of pointwise and reduction kernels: the config space, the progress line, the on-disk
tuned cache keyed by the kernel's structure (timed in the interpreter here; on a GPU with do_bench)."""
from __future__ import annotations

import json

import pytest
import torch

import minicomp
from minicomp.ir.kernel import Schedule
from minicomp.ir.graph import Group
from minicomp.templates import template_of
from minicomp.passes.tune import structural_key

pytestmark = pytest.mark.usefixtures("tuning_in_the_interpreter")


def _fn(x):
    return torch.relu(x) * 0.5 + 1


def test_max_autotune_tunes_each_kernel_stores_and_reuses_the_winner(cache_dir, capsys):
    x = torch.randn(300)
    out = minicomp.compile(_fn, mode="max-autotune")(x)
    torch.testing.assert_close(out, _fn(x))
    err = capsys.readouterr().err
    assert "minicomp: tuned k0_relu_mul_add_f32_300" in err and "->" in err
    (entry,) = (cache_dir / "tuned").glob("*.json")
    tuned = json.loads(entry.read_text())
    assert set(tuned) == {"blocks", "num_warps", "num_stages", "persistent"}

    torch._dynamo.reset()  # default mode: the stored winner is used, nothing is measured again
    out = minicomp.compile(_fn)(torch.randn(300))
    assert "tuned" not in capsys.readouterr().err
    assert any(d.startswith("tuned: k0_relu_mul_add_f32_300") for d in minicomp.report().decisions)


def test_tuning_progress_can_be_turned_off(cache_dir, capsys, monkeypatch):
    monkeypatch.setenv("MINICOMP_TUNE_VERBOSE", "0")
    minicomp.compile(_fn, mode="max-autotune")(torch.randn(300))
    assert "tuned" not in capsys.readouterr().err


def test_a_damaged_tuned_entry_is_ignored(cache_dir):
    minicomp.compile(_fn, mode="max-autotune")(torch.randn(300))
    (entry,) = (cache_dir / "tuned").glob("*.json")
    entry.write_text('{"blocks": 3}')
    torch._dynamo.reset()
    x = torch.randn(300)
    with pytest.warns(UserWarning, match="tuned schedule .* ignored"):
        torch.testing.assert_close(minicomp.compile(_fn)(x), _fn(x))
    report = minicomp.report()
    assert report.whole_graph_fallback is None and not any(d.startswith("tuned") for d in report.decisions)


def test_tuned_schedules_are_keyed_with_the_caches_digest():
    """The tune pass (a pass: it imports no runtime) hashes as the cache does, so stored keys stay valid."""
    from minicomp.passes import tune
    from minicomp.runtime import cache
    assert tune.digest("k0_relu_f32_300|NVIDIA H200|3.4.0") == cache.digest("k0_relu_f32_300|NVIDIA H200|3.4.0")


def test_structural_key_ignores_names_but_not_shapes_or_dtypes(monkeypatch):
    import minicomp.passes.tune as tuning
    keys = []
    monkeypatch.setattr(tuning, "structural_key", lambda k, t: keys.append(structural_key(k, t)) or keys[-1])

    def add(x):
        return x + 1

    def add_again(y):
        return y + 1
    for fn, x in ((add, torch.randn(8)), (add_again, torch.randn(8)), (add, torch.randn(9)),
                  (add, torch.randn(8, dtype=torch.float16))):
        torch._dynamo.reset()
        minicomp.compile(fn)(x)
    assert keys[0] == keys[1] and len({keys[0], keys[2], keys[3]}) == 3


def test_config_space_halves_and_doubles_blocks_and_keeps_persistent_rows_whole():
    pointwise = template_of("pointwise").config_space(Group(0, [], (4096,)), Schedule("pointwise", {"XBLOCK": 1024}, 4))
    assert {c.blocks["XBLOCK"] for c in pointwise} == {512, 1024, 2048} and {c.num_warps for c in pointwise} == {4, 8}
    row = template_of("reduction").config_space(Group(0, [], (64, 4096), (1,)),
                                                Schedule("reduction", {"XBLOCK": 1, "RBLOCK": 4096}, 4))
    assert all(c.blocks["RBLOCK"] == 4096 and c.persistent for c in row)
    assert {c.blocks["XBLOCK"] for c in row} == {1, 2}


def test_tuning_is_a_pass_in_the_dumps_and_the_report(cache_dir, tmp_path, capsys):
    minicomp.compile(_fn, mode="max-autotune")(torch.randn(300))
    capsys.readouterr()
    torch._dynamo.reset()  # a stored winner: the tune pass uses it and says so in its dump
    x = torch.randn(300)
    torch.testing.assert_close(minicomp.compile(_fn, dump_dir=str(tmp_path))(x), _fn(x))
    (dump,) = tmp_path.iterdir()
    (tune_dump,) = dump.glob("*_tune.txt")
    assert "tuned: k0_relu_mul_add_f32_300" in tune_dump.read_text()
    assert not any("tuned:" in f.read_text() for f in dump.glob("*_split_combines.txt"))


def _kernels(fn, *args):
    """The scheduled kernels of ``fn`` (the tune pass sees these)."""
    from minicomp.graphs.options import PIPELINE
    from minicomp.frontend.lowering import Lowering
    from minicomp.passes.manager import run_pipeline
    seen = []

    def backend(gm, example):
        graph = run_pipeline(Lowering(gm, list(example)).run(), PIPELINE)
        seen.extend(graph.kernels)
        return gm
    torch._dynamo.reset()
    from torch._functorch.aot_autograd import aot_function
    aot_function(fn, fw_compiler=backend)(*args)
    return seen


def test_structural_hash_canonicalizes_names_and_ids_but_sees_every_statement():
    from minicomp.passes.tune import structural_hash
    emb = torch.randn(10, 16)
    ids = torch.randint(0, 10, (3, 4))
    (a,) = _kernels(lambda e, i: torch.nn.functional.embedding(i, e).sum(-1), emb, ids)
    # the same kernel after other work: other node ids, statement names and kernel name
    *_, b = _kernels(lambda x, e, i: (x.exp().sum(), torch.nn.functional.embedding(i, e).sum(-1)),
                     torch.randn(7), emb, ids)
    assert a.name != b.name and str(a) != str(b)
    assert structural_hash(a) == structural_hash(b)
    (c,) = _kernels(lambda e, i: torch.nn.functional.embedding(i, e).amax(-1), emb, ids)
    assert structural_hash(c) != structural_hash(a)
    (d,) = _kernels(lambda e, i: torch.nn.functional.embedding(i, e).sum(-1), torch.randn(11, 16), ids)
    assert structural_hash(d) != structural_hash(a)  # the gathered size is part of the index


def test_gemm_configs_are_tuned_per_kernel_by_the_tune_pass(cache_dir, capsys, monkeypatch):
    # on the GPU the GEMM template walks GEMM_CONFIGS; here two small configs stand in for them
    from minicomp.templates import gemm
    monkeypatch.setattr(gemm.GemmTemplate, "tunes", lambda self, kernel: True)
    monkeypatch.setattr(gemm, "GEMM_CONFIGS", ("16x16x16/1/1", "32x32x16/4/1"))
    fn = lambda a, b: torch.relu(a @ b)  # noqa: E731
    a, b = torch.randn(20, 24), torch.randn(24, 18)
    torch.testing.assert_close(minicomp.compile(fn, mode="max-autotune")(a, b), fn(a, b))
    err = capsys.readouterr().err
    assert "minicomp: tuned k0_mm_relu_f32_20x18 (BLOCK_M/BLOCK_N/BLOCK_K/GROUP_M x warps)" in err, err
    assert err.count("/8x") == 3  # the heuristic (32x32x32, GROUP_M 8) and both configs
    torch._dynamo.reset()
    a, b = torch.randn(20, 24), torch.randn(24, 18)
    torch.testing.assert_close(minicomp.compile(fn)(a, b), fn(a, b))
    assert any(d.startswith("tuned: k0_mm_relu_f32_20x18 gemm") for d in minicomp.report().decisions)
