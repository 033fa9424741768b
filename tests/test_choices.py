"""Every template-vs-library rule (``minicomp/ir/choices.py``) follows its measurement table: each
row's workload (``benchmarks/choices.py``'s; traced with fake CPU tensors, lowered with meta ones) goes
through the pipeline for the H200 under the row's setting, and the rule's decision must be the row's
``picks``; ``picks`` must be the side the row measured fastest (or within ``NOISE`` of it; the
attention rule has a third side), unless the row's ``open`` says why not. Changing a rule without
changing its table fails the first test; changing a table's picks against its numbers fails the
second."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from benchmarks.choices import workload
from minicomp import config
from minicomp.backend import decompositions
from minicomp.graphs.options import PIPELINE
from minicomp.frontend.lowering import Lowering
from minicomp.frontend.rules import _matmul_precision
from minicomp.ir.choices import LIBRARY, PRECISIONS, RULES, TEMPLATE, picked
from minicomp.passes.manager import run_pipeline
from tests.utils import H200

ROWS = [pytest.param(rule, row, id=f"{rule.name}-{row.setting}-{'-'.join(map(str, row.case.values()))}")
        for rule in RULES.values() for row in rule.table]


def decided(rule, row) -> list[str]:
    """The sides ``rule`` picked for ``row``'s workload, scheduled for the H200 (nothing runs)."""
    dtype, flags = PRECISIONS[row.setting]
    with FakeTensorMode():  # traced as CPU tensors are (SDPA's fused op), without allocating them
        fn, args = workload(rule.name, row.case, dtype, device="cpu")
        gm = make_fx(fn, decomposition_table=decompositions())(*args)
    with config.patch(attention="auto", gemm="auto", conv="auto", **flags):
        lowering = Lowering(gm, [torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device="meta") for a in args])
        lowering.graph.target = H200  # (the SDPA rule reads it while lowering)
        graph = lowering.run()
        if row.setting == "tf32":  # what lowering gives CUDA inputs with TF32 allowed (frontend/rules.py)
            for n in graph.nodes:
                if n.op == "matmul":
                    n.attrs["precision"] = "tf32"
        graph = run_pipeline(graph, PIPELINE, None, None)
    return picked(graph.decisions, rule.name)


@pytest.mark.parametrize("rule, row", ROWS)
def test_each_rule_picks_what_its_table_says(rule, row):
    assert decided(rule, row) == [row.picks], (row, rule.question)


@pytest.mark.parametrize("rule, row", ROWS)
def test_each_pick_is_the_side_measured_faster(rule, row):
    fast = row.is_fast(row.picks)
    if fast is None:  # a side not measured: nothing to compare, and no claim
        assert not row.open, row
        return
    if row.open:
        assert not fast, f"stale `open` note (the pick is no longer slower): {row}"
    else:
        assert fast, f"the rule picks the slower side, measured: {row}"


def test_tables_are_complete_and_cited():
    for rule in RULES.values():
        seen = set()
        for row in rule.table:
            assert row.setting in PRECISIONS and row.picks in rule.sides, row
            assert set(row.case) <= set(rule.case_keys), (rule.name, row.case)
            assert not row.times or row.source, row  # numbers cite a source
            assert row.sdpa_ms is None or "sdpa" in rule.sides, row
            key = (row.setting, tuple(sorted(row.case.items())))
            assert key not in seen, f"{rule.name}: two rows for {key}"
            seen.add(key)
        # every setting has a row, measured or not (a missing cell is said, not skipped)
        assert {row.setting for row in rule.table} == set(PRECISIONS) or rule.name == "plain_gemm", rule.name


def test_each_setting_gives_lowering_its_precision():
    """A row's setting, applied as the benchmark applies it, is what lowering reads on a GPU: TF32
    products and convolutions only under "tf32" (torch ties its two matmul flags: a "highest" set
    after allow_tf32 turned TF32 off again, and 2026-11-28's tf32 products ran IEEE)."""
    cuda_fp32 = SimpleNamespace(dtype=torch.float32, type=SimpleNamespace(device=torch.device("cuda")))
    for setting, (dtype, flags) in PRECISIONS.items():
        with config.patch(**flags):
            assert _matmul_precision(cuda_fp32) == ("tf32" if setting == "tf32" else "ieee"), setting
            assert config.cudnn_allow_tf32 == (setting != "fp32-ieee"), setting


@pytest.mark.parametrize("name", list(RULES))
def test_a_rule_change_fails_the_table_test(monkeypatch, name):
    """The check above is not vacuous: flipping a rule's decision breaks its rows."""
    rule = RULES[name]
    row = rule.table[0]
    flipped = LIBRARY if row.picks == TEMPLATE else TEMPLATE
    monkeypatch.setattr(rule, "decide", lambda *facts: (flipped, "flipped"))
    assert decided(rule, row) == [flipped] != [row.picks]
    monkeypatch.undo()
    assert decided(rule, row) == [row.picks]


def test_a_switch_forces_its_side_and_names_itself():
    with config.patch(gemm="cublas", conv="ir", attention="1"):
        assert RULES["gemm"].forced() == ("gemm", LIBRARY, "MINICOMP_GEMM=cublas")
        assert all(RULES[name].forced().template for name in ("conv", "attention", "sdpa"))
    with config.patch(gemm="auto", conv="auto", attention="auto"):
        assert all(rule.forced() is None for rule in RULES.values())


def test_a_merged_measurement_replaces_its_rows_and_keeps_the_others_in_table_order():
    """``choices.py --merge``: rows measured again replace theirs, the file's others stay, in the rules'
    order; the command records both runs."""
    from benchmarks.choices import merged
    first, second = RULES["gemm"].table[0], RULES["gemm"].table[1]
    conv = RULES["conv"].table[0]

    def measured(rule, row, ms):
        return dict(rule=rule, setting=row.setting, case=row.case, template_ms=ms)
    earlier = dict(command="python benchmarks/choices.py", date="2026-11-27",
                   rows=[measured("gemm", first, 1.0), measured("gemm", second, 2.0), measured("conv", conv, 3.0)])
    meta, rows = merged(earlier, dict(command="python benchmarks/choices.py --only conv,gemm --rows x", date="2026-11-28"),
                        [measured("conv", conv, 4.0), measured("gemm", second, 5.0)], RULES)
    assert [r["template_ms"] for r in rows] == [1.0, 5.0, 4.0]
    assert meta["command"].endswith("then python benchmarks/choices.py --only conv,gemm --rows x --merge")
    assert meta["date"] == "2026-11-27 and 2026-11-28"
    again, _ = merged(dict(meta, rows=rows), dict(command="python benchmarks/choices.py --only conv", date="2026-11-28"),
                      [], RULES)
    assert again["date"] == "2026-11-27 and 2026-11-28"  # a date already last is not repeated
