"""A call stopped half-way (Ctrl-C, an exception inside a kernel launch) and calls from several
threads must leave every later call right. Staged launches (row pipelines, one-launch split
reductions) are the kernels that keep state between programs, so each kind is interrupted inside
its launch, in Triton's interpreter, after some of its programs ran."""
from __future__ import annotations

import sys
import threading

import pytest
import torch

import minicomp
from tests.utils import H200, small_split_thresholds


@pytest.fixture(autouse=True)
def small_thresholds(monkeypatch):
    small_split_thresholds(monkeypatch)


class Interrupt(KeyboardInterrupt):
    pass


def _interrupt_inside(name_prefix: str, after_programs: int):
    """A trace function that raises ``Interrupt`` when the ``after_programs``-th program of a kernel
    whose name starts with ``name_prefix`` starts (the interpreter calls the kernel once per program)."""
    seen = [0]

    def trace(frame, event, arg):
        if event == "call" and frame.f_code.co_name.startswith(name_prefix):
            seen[0] += 1
            if seen[0] == after_programs:
                raise Interrupt
        return None
    return trace, seen


STAGED = {  # fn, input shape, the decision that says it is one staged launch
    "pipeline": (lambda x: torch.softmax(x, -1), (5, 300), "pipelined:"),
    "split-combine": (lambda x: x.sum(0), (256, 128), "one launch:"),
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(STAGED))
def test_interrupted_staged_launch_leaves_later_calls_right(kind, monkeypatch):
    fn, shape, decision = STAGED[kind]
    from minicomp.templates import reduction
    choose = reduction.reduction_schedule  # the GPU's column tiles: combine groups of several programs
    monkeypatch.setattr(reduction, "reduction_schedule", lambda g, target, layouts=None: choose(g, H200, layouts))
    f = minicomp.compile(fn)
    x = torch.randn(shape)
    torch.testing.assert_close(f(x), fn(x))
    report = minicomp.report()
    assert any(d.startswith(decision) for d in report.decisions), report.summary()
    (staged,) = [k for k in report.kernels if k.template.startswith(("pipeline", "split"))]
    trace, seen = _interrupt_inside(staged.function or staged.name, after_programs=3)
    sys.settrace(trace)
    try:
        with pytest.raises(Interrupt):
            f(torch.randn(shape))
    finally:
        sys.settrace(None)
    assert seen[0] == 3  # it stopped inside the launch, with programs done and programs left
    for _ in range(2):
        x = torch.randn(shape)
        torch.testing.assert_close(f(x), fn(x))


def test_calls_from_several_threads():
    fn = lambda x: torch.softmax(x * 2, -1) + x.sum(0)  # noqa: E731
    f = minicomp.compile(fn)
    x0 = torch.randn(4, 300)
    torch.testing.assert_close(f(x0), fn(x0))  # compiled once, then shared by the threads
    inputs = [torch.randn(4, 300) for _ in range(4)]
    results, errors = [None] * 4, []

    def work(i):
        try:
            for _ in range(2):
                results[i] = f(inputs[i])
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for x, r in zip(inputs, results):
        torch.testing.assert_close(r, fn(x))
