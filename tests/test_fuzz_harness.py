"""The fuzzer of tests/test_fuzz.py checked itself: the generator reaches every dtype, layout and kind of op,
a program's source is a reproducer, failures are saved shrunk and replay, the float64 reference for low
precision, errors in generated code, and the gradient check finding a wrong gradient."""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from tests.test_fuzz import (DTYPES, GeneratedCodeError, Input, LAYOUTS, Program, assert_matches,
                             check_against_eager, check_gradients_against_eager, check_program, load_module,
                             programs, run_property, save_regression)


def test_generated_programs_cover_dtypes_layouts_and_ops():
    # The generator reaches every dtype, layout and kind of op (drawn with a fixed seed: no compiling).
    from hypothesis import find
    from hypothesis.errors import NoSuchExample
    seen: set = set()
    texts: list[str] = []
    sizes: set = set()
    index_layouts: set = set()

    def covers(p: Program) -> bool:
        seen.update((i.dtype, i.layout) for i in p.inputs)
        texts.extend(p.steps)
        sizes.update(n for i in p.inputs + p.indices for n in i.shape)
        index_layouts.update(i.layout for i in p.indices)
        return False

    with pytest.raises(NoSuchExample):
        find(programs(), covers, settings=settings(max_examples=150, derandomize=True, database=None,
                                                   suppress_health_check=list(HealthCheck)))
    assert {d for d, _ in seen} == set(DTYPES.values()), seen
    assert {lay for _, lay in seen} == set(LAYOUTS), seen
    for needle in ["torch.where(", " @ ", ".sum(", ".float()", ".half()", " > ", " + ", "torch.exp(", "[::2]",
                   ".index_select(", "torch.gather(", "embedding(i", "[i", "[:, i"]:
        assert any(needle in t for t in texts), needle
    assert 0 in sizes  # zero-size dims, in inputs and indices
    assert {"contiguous", "window"} <= index_layouts, index_layouts


def test_program_source_is_a_reproducer():
    program = Program([Input((3, 4), torch.float16, "transposed"), Input((4,), torch.int32, "offset", 2),
                       Input((2, 3), torch.bool, "expanded", 1), Input((2, 3), torch.bfloat16, "strided", 1),
                       Input((2, 0, 3), torch.float32, "window", 1)],
                      ["v0 + v1", "torch.where(v2, v3, v2.float())", "v3[i0].sum(0) + v4.sum((0, 1))"],
                      [Input((5,), torch.int64, "strided", 0, low=-2, high=2)])
    scope = program.namespace()
    v0, v1, v2, v3, v4, i0 = scope["make_inputs"]()
    assert (v0.shape, v0.dtype, v0.stride()) == ((3, 4), torch.float16, (1, 3))
    assert (v1.shape, v1.dtype, v1.storage_offset()) == ((4,), torch.int32, 2)
    assert (v2.shape, v2.dtype, v2.stride()) == ((2, 3), torch.bool, (0, 1))
    assert (v3.shape, v3.dtype, v3.stride()) == ((2, 3), torch.bfloat16, (6, 2))
    assert (v4.shape, v4.stride(), v4.storage_offset()) == ((2, 0, 3), (4, 4, 1), 9)  # a window of 3x1x4
    assert (i0.shape, i0.dtype, i0.stride()) == ((5,), torch.int64, (2,)) and -2 <= i0.min() <= i0.max() < 2
    assert torch.equal(scope["make_inputs"]()[0], v0)  # seeded: the same values every time
    check_program(program)


@pytest.mark.slow
def test_failures_are_saved_shrunk_and_replay(tmp_path, monkeypatch):
    # A fake property that "fails" on any program using exp: Hypothesis shrinks it, and only the
    # final, minimal example is written.
    monkeypatch.setenv("MINICOMP_FUZZ_SAVE", "1")
    calls = []

    def fake_check(program: Program) -> None:
        calls.append(program)
        assert "torch.exp" not in program.source(), "fake mismatch"

    @settings(max_examples=200, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(programs())
    def prop(program):
        run_property(program, fake_check, tmp_path)

    with pytest.raises(AssertionError, match="fake mismatch"):
        prop()
    assert sum("torch.exp" in p.source() for p in calls) > 1  # it failed more than once (shrinking)
    (path,) = tmp_path.glob("fuzz_*.py")  # but exactly one file: the final example
    assert not list(tmp_path.glob(".*"))
    text = path.read_text()
    assert "fake mismatch" in text and "def f(v0):\n    v1 = torch.exp(v0)\n    return v1\n" in text, text
    module = load_module(path)
    assert getattr(module, "XFAIL", None) is None
    (x,) = module.make_inputs()
    assert x.shape == (1,), x  # shrunk input
    check_against_eager(module.f, module.make_inputs)  # the real check passes: exp is fine

    # Saving can be turned off.
    monkeypatch.setenv("MINICOMP_FUZZ_SAVE", "0")
    path.unlink()
    with pytest.raises(AssertionError, match="fake mismatch"):
        prop()
    assert not list(tmp_path.iterdir())


def test_assert_matches_uses_float64_reference_for_low_precision():
    ref = torch.tensor([1000.123], dtype=torch.float64)
    eager = torch.tensor([990.0], dtype=torch.bfloat16)      # off by 10 (bf16 rounding of intermediates)
    better = torch.tensor([1000.0], dtype=torch.bfloat16)   # closer to the float64 result
    worse = torch.tensor([1100.0], dtype=torch.bfloat16)
    assert_matches(better, eager, lambda: ref)
    with pytest.raises(AssertionError):
        assert_matches(worse, eager, lambda: ref)
    with pytest.raises(AssertionError, match="dtype"):
        assert_matches(better.float(), eager, lambda: ref)
    with pytest.raises(AssertionError):
        assert_matches(torch.tensor([1, 2], dtype=torch.int32), torch.tensor([1, 3], dtype=torch.int32))


def test_errors_in_generated_code_raise_from_one_place(cache_dir, monkeypatch):
    # Generated files are named by content that differs per compile; Hypothesis must see one bug.
    monkeypatch.setenv("MINICOMP_FUZZ_SAVE", "0")
    generated = cache_dir / "wrappers" / "wrapper_0123.py"
    generated.parent.mkdir(parents=True)
    generated.write_text("def call():\n    return buf25\n")
    scope: dict = {}
    exec(compile(generated.read_text(), str(generated), "exec"), scope)

    def crashing_check(program):
        scope["call"]()

    program = Program([Input((2,), torch.float32)], ["v0 + 1"])
    with pytest.raises(GeneratedCodeError, match="NameError in generated code: name 'buf25'") as info:
        run_property(program, crashing_check)
    assert info.value.__context__ is None and "wrappers/...: return buf25" in str(info.value)
    with pytest.raises(ZeroDivisionError):  # other errors pass through as they are
        run_property(program, lambda p: 1 / 0)


def test_gradient_check_finds_a_wrong_gradient():
    # Same outputs, but compiled the gradient is 3 where eager's is 2 (Dynamo takes the is_compiling branch).
    def f(v0):
        return v0 * 3 - v0.detach() if torch.compiler.is_compiling() else v0 * 2

    def make_inputs():
        torch.manual_seed(0)
        return [torch.randn(3, 2).t()]

    with pytest.raises(AssertionError, match="gradient of input 0"):
        check_gradients_against_eager(f, make_inputs)
    check_gradients_against_eager(lambda v0: v0 * 2, make_inputs)


def test_gradient_regressions_replay_with_gradients(tmp_path):
    program = Program([Input((2,), torch.float32)], ["torch.exp(v0)"])
    path = save_regression(program, AssertionError("gradient of input 0: ..."), tmp_path, gradients=True)
    assert path.name != save_regression(program, AssertionError("..."), tmp_path).name
    module = load_module(path)
    assert module.GRADIENTS is True
    check_gradients_against_eager(module.f, module.make_inputs)
