"""benchmarks/harness.py: ``--gpus N`` runs the selected rows in N shards at once and writes one table;
``--merge`` keeps what it does not measure again."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROWS = ["softmax last dim 262144x256 fp32", "softmax last dim 262144x256 bf16", "softmax last dim 16384x4095 fp32"]


def _corpus(out: Path, *extra: str, gpus: int = 2) -> dict:
    cmd = [sys.executable, str(ROOT / "benchmarks" / "corpus.py"), "ops", "--dry-run", "--no-inductor", "--gpus", str(gpus),
           "--out", str(out), *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads((out / "corpus-ops-dry.json").read_text())


def test_rows_in_two_shards_at_once_make_one_table_in_order(tmp_path):
    doc = _corpus(tmp_path, "--only", "softmax last dim 262144x256")
    assert [r["name"] for r in doc["rows"]] == ROWS[:2]
    assert all(r["correct"] and r["minicomp_ms"] > 0 for r in doc["rows"]), doc["rows"]
    assert doc["gpus"] == 2 and "--gpus 2" in doc["command"] and "--shard" not in doc["command"]
    again = _corpus(tmp_path, "--only", "softmax last dim 262144x256,softmax last dim 16384x4095 fp32", "--resume")
    assert [r["name"] for r in again["rows"]] == ROWS
    assert again["rows"][:2] == doc["rows"]  # kept as measured, the new row measured by a shard
    assert again["command"] == doc["command"] and len(again["resumed_with"]) == 1


def test_a_continued_table_keeps_its_first_date_and_gpu_and_names_a_different_last_one():
    """``--gpus`` continues the tables of its shards, themselves continuations: the dates and GPUs do not
    nest ("2026-11-28 to 2026-11-28 to 2026-11-30" was written once)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from harness import _continued
    earlier = {"date": "2026-11-28 to 2026-11-29", "gpu": "H200", "command": "c0", "resumed_with": ["c1"]}
    shards = {"date": "2026-11-28 to 2026-11-30", "gpu": "2x H200 (a shard of the rows on each, at once)",
              "command": "c2"}
    doc = _continued(shards, earlier)
    assert (doc["date"], doc["gpu"]) == ("2026-11-28 to 2026-11-30", "H200 (then 2x H200 (a shard of the rows on "
                                                                      "each, at once))")
    assert doc["command"] == "c0" and doc["resumed_with"] == ["c1", "c2"]
    later = _continued({"date": "2026-12-01", "gpu": "H200", "command": "c3"}, doc)
    assert (later["date"], later["gpu"]) == ("2026-11-28 to 2026-12-01", "H200")
    same = _continued({"date": "2026-11-28", "gpu": "H200", "command": "c1"}, {"date": "2026-11-28", "gpu": "H200",
                                                                              "command": "c0"})
    assert (same["date"], same["gpu"]) == ("2026-11-28", "H200")


def test_a_merge_that_runs_out_of_time_keeps_the_earlier_results(tmp_path):
    """``--merge`` past its ``--time-limit`` before a selected row: the row keeps its earlier result (it
    said "not run" and lost it: the Llama row of cliffs.json)."""
    doc = _corpus(tmp_path, "--only", ROWS[2], gpus=1)
    again = _corpus(tmp_path, "--only", ROWS[2], "--merge", "--time-limit", "0", gpus=1)
    assert again["rows"] == doc["rows"] and doc["rows"][0]["minicomp_ms"] > 0


def test_two_shards_on_one_gpu_make_one_table(tmp_path):
    """``--per-gpu 2``: two shard processes per GPU (here one "GPU", a dry run), one table in order."""
    doc = _corpus(tmp_path, "--only", "softmax last dim 262144x256,softmax last dim 16384x4095 fp32", "--per-gpu", "2",
                  gpus=1)
    assert [r["name"] for r in doc["rows"]] == ROWS and all(r["correct"] for r in doc["rows"]), doc["rows"]
    assert doc["per_gpu"] == 2 and "--per-gpu 2" in doc["command"]


def test_timing_holds_its_gpu_alone(monkeypatch, tmp_path):
    """Two processes' timing rounds on one GPU (the lock's file; threads here, each its own open file)
    never overlap; on other GPUs they may."""
    import threading
    import time

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from harness import gpu_turn
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"test-{tmp_path.name}")
    spans = []

    def timed():
        with gpu_turn("cuda"):
            start = time.perf_counter()
            time.sleep(0.2)
            spans.append((start, time.perf_counter()))
    threads = [threading.Thread(target=timed) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    (a0, a1), (b0, b1) = sorted(spans)
    assert b0 >= a1, spans


def _at_near_inputs(monkeypatch, delta, backend_scale: float, trace_scale: float):
    """The harness, with the backend and the step compiled with ``aot_eager`` replaced by eager's loss with
    gradients taken at a nearby input (``x + scale * delta``, each its own scale), and fp32's tolerance
    1e-6."""
    import torch
    from torch import nn

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import harness

    class Near(nn.Module):
        def __init__(self, model, scale):
            super().__init__()
            self.model, self.scale = model, scale

        def forward(self, x):
            near = self.model(x + self.scale * delta)
            return self.model(x).detach() + near - near.detach()
    monkeypatch.setattr(harness, "compile_with", lambda backend, model: Near(model, backend_scale))
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, backend=None, **kw:
                        Near(model, trace_scale) if backend == "aot_eager" else real_compile(model, backend=backend, **kw))
    monkeypatch.setitem(harness.TRAIN_TOL, "fp32", 1e-6)
    return harness


def _trained_row(harness, model, x, name: str) -> dict:
    """``harness.run_training``'s fp32 row for ``model`` on ``x`` (loss: the output's sum of squares), on the CPU."""
    import argparse
    work = harness.Work(model, (x,), "x".join(map(str, x.shape)), loss=lambda out: out.square().sum())
    row = dict(n=1, name=name, kind="train", dtype="fp32")
    harness.run_training(work, row, argparse.Namespace(backends=("minicomp",), rounds=1), "cpu",
                         lambda fn: (fn(), 1.0)[1])
    return row


def _tiny_mlp():
    import torch
    from torch import nn
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1)), torch.randn(4, 8)


def test_a_gradient_off_as_aot_eagers_trace_is_judged_against_that_trace(monkeypatch):
    """A training row whose gradients differ from eager's and float64's, but exactly as the step compiled
    with ``aot_eager`` does (here: both backends see the same perturbed input), is correct and says it
    was judged against the trace; without that referee it is wrong."""
    import torch
    harness = _at_near_inputs(monkeypatch, torch.randn(4, 8) * 0.1, 1.0, 1.0)

    def run(trace_referee: bool) -> dict:
        if not trace_referee:
            without = _without_alternatives(harness.zoo.gradient_mismatches)
            monkeypatch.setattr(harness.zoo, "gradient_mismatches", without)
        return _trained_row(harness, *_tiny_mlp(), "tiny")
    row = run(trace_referee=True)
    assert row["correct"] and row["minicomp_fp64_referee"] and row["minicomp_trace_referee"], row
    assert any("aot_eager" in line for line in harness.notes([row])), harness.notes([row])
    row = run(trace_referee=False)
    assert not row["correct"] and "wrong" in row["error"], row


def test_an_image_models_gradients_are_judged_against_eagers_channels_last_step(monkeypatch):
    """A training row of an image model still off after the float64 and trace referees is judged against
    eager's step on channels-last images too (``<backend>_layout_referee``), and one further from
    float64's than that layout's (here: taken at a perturbed input) stays wrong."""
    import torch
    from torch import nn
    harness = _at_near_inputs(monkeypatch, torch.randn(2, 3, 6, 6) * 0.1, 1.0, 0.01)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Tanh(), nn.Flatten(), nn.Linear(64, 1))
    row = _trained_row(harness, model, torch.randn(2, 3, 6, 6), "tiny conv")
    assert row["minicomp_trace_referee"] and row["minicomp_layout_referee"], row
    assert not row["correct"] and "wrong" in row["error"], row
    assert any("channels-last images" in line for line in harness.notes([row])), harness.notes([row])


def test_a_gradient_as_far_off_as_eagers_at_a_nudged_input_is_ill_conditioned_not_wrong(monkeypatch):
    """A training row still off after the float64, trace and layout referees is judged against eager's
    step on inputs moved by ``NUDGE`` machine epsilons (``<backend>_nudged_referee``): correct where eager
    moves as far (here: the nudge made large), wrong where eager barely moves (the nudge tiny)."""
    import torch
    harness = _at_near_inputs(monkeypatch, torch.randn(4, 8) * 1e-3, 1.0, 0.0)

    def run(nudge: float) -> dict:
        monkeypatch.setattr(harness, "NUDGE", nudge)
        return _trained_row(harness, *_tiny_mlp(), "tiny")
    row = run(nudge=1e6)  # eager's inputs moved by ~6 %: its gradients as far off as the backend's
    assert row["correct"] and row["minicomp_nudged_referee"] and "minicomp_layout_referee" not in row, row
    assert row["minicomp_judged"] and "against float64" in row["minicomp_judged"][0], row
    assert any("last place" in line and "against float64" in line for line in harness.notes([row])), harness.notes([row])
    row = run(nudge=0.5)  # half an epsilon: eager's gradients stay at float64's
    assert row["minicomp_nudged_referee"] and not row["correct"] and "wrong" in row["error"], row


def _without_alternatives(mismatches):
    return lambda *args, alternatives=(), **kwargs: mismatches(*args, **kwargs)


def test_profile_rows_dry_run_writes_each_backend_and_minicomps_report(tmp_path):
    """``benchmarks/profile_rows.py --dry-run``: a row of a benchmark's table, built as the benchmark
    builds it, timed under both backends; minicomp's report names its kernels; an unknown row is refused."""
    script = [sys.executable, str(ROOT / "benchmarks" / "profile_rows.py"), "cliffs"]
    done = subprocess.run([*script, "softmax rows of 393216", "--dry-run", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    row = json.loads((tmp_path / "profile.json").read_text())["rows"]["softmax rows of 393216"]
    assert set(row) == {"inductor", "minicomp"} and all(r["wall_ms"] > 0 for r in row.values()), row
    assert "softmax" in (tmp_path / "report_softmax_rows_of_393216.txt").read_text()
    wrong = subprocess.run([*script, "no such row", "--dry-run", "--out", str(tmp_path)], capture_output=True, text=True,
                           timeout=300)
    assert wrong.returncode == 1 and "no row named" in wrong.stderr


def test_a_row_timeout_swallowed_once_rings_again():
    """Python prints and drops an exception raised inside a weakref callback (Dynamo's caches run them):
    the deadline's ``RowTimeout`` rang there once and the row ran on until the outer kill."""
    import time
    import pytest
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import harness
    swallowed = 0
    try:
        with pytest.raises(harness.RowTimeout):
            harness._alarm(0.05)
            try:
                while True:
                    time.sleep(0.01)
            except harness.RowTimeout:
                swallowed += 1
            while True:
                time.sleep(0.01)
    finally:
        harness._alarm(None)
    assert swallowed == 1


def test_a_merge_keeps_the_rows_no_run_has_reached(tmp_path):
    """A table whose rows were not all run yet, merged with one row measured: the others stay in it as
    "not run" (a merge dropped them: 20 rows of corpus-models-infer vanished)."""
    doc = _corpus(tmp_path, "--only", "softmax last dim 262144x256", "--time-limit", "0", gpus=1)
    assert [r["name"] for r in doc["rows"]] == ROWS[:2] and all("not run" in r["error"] for r in doc["rows"])
    again = _corpus(tmp_path, "--only", ROWS[0], "--merge", gpus=1)
    assert [r["name"] for r in again["rows"]] == ROWS[:2], again["rows"]
    assert again["rows"][0]["minicomp_ms"] > 0 and "not run" in again["rows"][1]["error"]


def test_a_rendered_page_names_the_cause_of_each_row_above_1_10(tmp_path):
    """``--render`` writes the page again from the JSON: each row above 1.10x Inductor's time gets a line
    with its entry of ``benchmarks/causes.py``, or says its cause is not measured yet."""
    doc = json.loads((ROOT / "benchmarks/results/corpus-ops.json").read_text())
    doc["rows"] = [dict(r) for r in doc["rows"][:3]]
    doc["rows"][0]["minicomp_vs_inductor"] = 1.5
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from causes import CAUSES
    named = "instance_norm 32x64x128x128 fp32"
    doc["rows"][1].update(name=named, minicomp_vs_inductor=1.3)
    doc["rows"][2]["minicomp_vs_inductor"] = 1.05
    (tmp_path / "corpus-ops.json").write_text(json.dumps(doc))
    cmd = [sys.executable, str(ROOT / "benchmarks" / "corpus.py"), "ops", "--render", "--out", str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = (tmp_path / "corpus-ops.md").read_text().splitlines()
    causes = [line for line in lines if line.startswith("  - ")]
    assert causes[:2] == [f"  - {doc['rows'][0]['name']} (1.50): cause not measured yet",
                          f"  - {named} (1.30): {CAUSES[named]}"]
    assert not any(doc["rows"][2]["name"] in line for line in causes)


def test_the_committed_pages_name_a_cause_for_each_row_above_1_10():
    """The results pages were written (or rendered) with ``causes.py``: a line per row above 1.10x."""
    for stem in ("cliffs", "corpus-ops", "corpus-models-infer", "corpus-models-train"):
        rows = json.loads((ROOT / f"benchmarks/results/{stem}.json").read_text())["rows"]
        page = (ROOT / f"benchmarks/results/{stem}.md").read_text()
        for r in rows:
            if (r.get("minicomp_vs_inductor") or 0) > 1.10:
                assert f"  - {r['name']} ({r['minicomp_vs_inductor']:.2f}): " in page, (stem, r["name"])


def test_an_output_of_another_dtype_than_eagers_is_wrong(monkeypatch):
    """Equal values in another dtype (a bf16 result where eager's is float32, as a resize under CUDA
    autocast was) are not eager's result: the row is wrong and says why."""
    import argparse
    import torch
    from torch import nn

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import harness

    class Rounded(nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, x):
            return self.model(x).bfloat16()
    monkeypatch.setattr(harness, "compile_with", lambda backend, model: Rounded(model))
    work = harness.Work(nn.Linear(8, 8), (torch.randint(-3, 3, (4, 8)).float(),), "4x8")
    row = dict(n=1, name="tiny", kind="inference", dtype="fp32")
    harness.run_inference(work, row, argparse.Namespace(backends=("minicomp",), rounds=1), "cpu",
                          lambda fn: (fn(), 1.0)[1])
    assert not row["correct"] and "dtype torch.bfloat16, eager's torch.float32" in row["error"], row
    assert harness.output_error(torch.ones(2), torch.ones(2, dtype=torch.float64), same_dtype=False) == (0.0, True)


def test_a_row_above_1_10_is_timed_again_back_to_back_and_its_cause_line_says_so():
    """``back_to_back``: only a row do_bench put above 1.10x Inductor's time is timed again, each variant as
    calls in a row (here each call sleeps its own time, so the loop's times are known), and the page's
    cause line gives those times beside the ratio."""
    import time

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import harness
    naps = {"eager": 0.004, "inductor": 0.001, "minicomp": 0.004}
    variants = {k: (lambda s=s: time.sleep(s)) for k, s in naps.items()}
    close = dict(name="close", eager_ms=4.0, inductor_ms=1.0, minicomp_ms=1.1)
    harness.back_to_back(variants, close, "cpu", rounds=1)
    assert not any(k.endswith("_loop_ms") for k in close)
    slow = dict(name="slow", eager_ms=4.0, inductor_ms=1.0, minicomp_ms=1.5, minicomp_vs_inductor=1.5)
    harness.back_to_back({**variants, "eager": None}, slow, "cpu", rounds=1)
    assert "eager_loop_ms" not in slow  # a variant that crashed is not timed
    assert naps["inductor"] * 1e3 <= slow["inductor_loop_ms"] < slow["minicomp_loop_ms"], slow
    assert naps["minicomp"] * 1e3 <= slow["minicomp_loop_ms"], slow
    line = next(x for x in harness.summary([slow]) if x.startswith("  - slow"))
    assert line.endswith(f"minicomp {slow['minicomp_loop_ms']:.3f} against Inductor's "
                         f"{slow['inductor_loop_ms']:.3f} ms ({slow['minicomp_loop_ms'] / slow['inductor_loop_ms']:.2f}x)"), line


def test_the_cores_other_processes_keep_busy_while_a_row_is_timed_are_recorded():
    """``others_load``: a process spinning beside the timing shows as (most of) one busy core, and the
    cause line says so."""
    import time

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import harness
    if harness.cpu_seconds() is None:
        return  # no /proc/stat here: nothing is recorded
    spin = "import time\nt = time.perf_counter()\nwhile time.perf_counter() - t < 1.5: pass\n"
    row: dict = {}
    with subprocess.Popen([sys.executable, "-c", spin]) as other:
        time.sleep(0.3)  # the interpreter started
        with harness.others_load(row):
            time.sleep(0.8)
        other.wait()
    assert row["others_busy_cores"] >= 0.6, row
    line = harness._loop_words(dict(row, minicomp_loop_ms=2.0, inductor_loop_ms=1.0))
    assert line.endswith(f"; other processes kept {row['others_busy_cores']:.1f} cores busy meanwhile"), line


def test_a_timing_whose_rounds_disagree_is_taken_again_and_the_quietest_kept():
    """``quiet_times``: on a GPU a timing in which one variant's rounds spread beyond ``NOISY`` is taken
    again, at most ``RETIMES`` times, and the one with the smallest spread is kept; on the CPU (a dry
    run) once. Here the "host" disturbs the first two timings' rounds of minicomp alone."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import harness
    # each timing: two rounds of (eager, Inductor, minicomp)
    script = iter([1.5, 1.0, 3.0, 1.5, 1.0, 1.0,    # timing 1: minicomp's rounds 3 and 1 ms
                   1.5, 1.0, 1.5, 1.5, 1.0, 1.1,    # timing 2: 1.5 and 1.1
                   1.5, 1.0, 1.3, 1.5, 1.0, 1.0,    # timing 3: 1.3 and 1.0 (still noisy: kept as the quietest)
                   9.0, 9.0, 9.0, 9.0, 9.0, 9.0])   # never reached
    variants = {"eager": lambda: "eager", "inductor": lambda: "inductor", "minicomp": lambda: "minicomp"}
    bench = lambda fn: next(script)  # noqa: E731 - rounds interleave eager, inductor, minicomp
    row = harness.quiet_times(variants, bench, 2, "cuda")
    assert row == dict(eager_ms=1.5, inductor_ms=1.0, minicomp_ms=1.15, spread=1.3, timings=3), row
    once = harness.quiet_times({**variants, "eager": None}, lambda fn: 1.0 if fn() == "inductor" else next(script), 2,
                               "cpu")
    assert once["eager_ms"] is None and once["timings"] == 1 and once["minicomp_ms"] == 9.0, once
