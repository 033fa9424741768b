"""Replay every saved fuzz failure (``tests/regressions/*.py``, written by ``tests/test_fuzz.py`` when
its property fails): each file defines ``f`` and ``make_inputs()``; minicomp's results must match
eager's with the fuzzer's tolerances (and, in a file that sets ``GRADIENTS = True``, its gradients too). A file that sets ``XFAIL = "<reason>"`` is a known, unfixed
bug: it is expected to fail (strictly, so a fix shows up as XPASS and the marker must go)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.test_fuzz import REGRESSIONS, check_against_eager, check_gradients_against_eager, load_module


def xfail_reason(path: Path) -> str | None:
    """The module-level ``XFAIL = "..."`` string of ``path``, read without importing it."""
    for node in ast.parse(path.read_text(), filename=str(path)).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "XFAIL" for t in node.targets):
            if isinstance(node.value, ast.Constant) and node.value.value:
                return str(node.value.value)
    return None


def cases(folder: Path = REGRESSIONS) -> list:
    params = []
    for path in sorted(folder.glob("*.py")) if folder.is_dir() else []:
        if path.name.startswith(("_", ".")):
            continue
        reason = xfail_reason(path)
        marks = [pytest.mark.xfail(strict=True, raises=AssertionError, reason=reason)] if reason else []
        params.append(pytest.param(path, marks=marks, id=path.stem))
    return params


@pytest.mark.parametrize("path", cases())
def test_saved_fuzz_failure_matches_eager(path: Path):
    module = load_module(path)
    check = check_gradients_against_eager if getattr(module, "GRADIENTS", False) else check_against_eager
    check(module.f, module.make_inputs)


def test_discovery_reads_xfail_without_importing(tmp_path):
    (tmp_path / "fuzz_a.py").write_text('XFAIL = "known bug"\nraise SystemExit("not imported")\n')
    (tmp_path / "fuzz_b.py").write_text("import torch\n")
    (tmp_path / "_helper.py").write_text("")
    found = cases(tmp_path)
    assert [p.id for p in found] == ["fuzz_a", "fuzz_b"]
    assert [m.kwargs.get("reason") for m in found[0].marks] == ["known bug"] and not found[1].marks
