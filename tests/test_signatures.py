"""The per-call check of a compiled graph's specialization (``minicomp/graphs/signatures.py``): the cheap
``LastCall`` check agrees with the full ``signature`` on what Dynamo leaves to us (alignment, the
values of non-tensor inputs), and a moved parameter sends the call back to the full check."""
from __future__ import annotations

import pytest
import torch

import minicomp
from minicomp.graphs import signatures
from minicomp.runtime.support import ensure_layout
from minicomp.graphs.signatures import LastCall, signature


def _pointers_equal(tensors, pointers, indices):  # what the CUDA build's C helper computes
    assert type(tensors) is list, "the C helper takes a list, not a tuple"
    return all(tensors[i].data_ptr() == pointers[i] for i in indices)


@pytest.fixture(params=["c-helper", "python"])
def pointer_check(request, monkeypatch):
    monkeypatch.setattr(signatures, "_same_pointers", _pointers_equal if request.param == "c-helper" else None)
    return request.param


def test_last_call_compares_unchecked_inputs_in_full(pointer_check):
    # a part of a graph with symbolic sizes (dynamic.py): a value another part made has no guard
    w, x = torch.randn(8, 8), torch.randn(4, 6)
    transposed = torch.randn(6, 4).t()  # x's shape, other strides
    last = LastCall("fn", [w, x], unchecked=frozenset({1}))
    assert last.matches([w, torch.randn(4, 6)])
    assert not last.matches([w, transposed])
    assert not last.matches([w, torch.randn(4, 7)])
    assert not last.matches([w, x.double()])


def test_last_call_matches_exactly_when_the_signature_would(pointer_check):
    w, b = torch.randn(8, 8), torch.randn(8)
    x = torch.randn(4, 8)
    last = LastCall("fn", [w, b, x, 3], LastCall("fn", [w, b, torch.randn(4, 8), 3]))  # x moved once
    assert last.matches([w, b, torch.randn(4, 8), 3])                 # a new activation, aligned
    assert not last.matches([w, b, torch.randn(33)[1:].view(4, 8), 3])  # an activation off 16 bytes
    assert not last.matches([w, b, x, 4])                             # a symbolic size changed
    assert not last.matches([w, b, x, 3.0])                           # same value, another type
    assert not last.matches([w, b, x])                                # another arity
    assert last.matches((w, b, torch.randn(4, 8), 3))                 # a tuple (cached.CachedGraph)
    moved = torch.randn(65)[1:].view(8, 8)                            # a parameter's storage moved
    assert signature([moved, b, x, 3]) != signature([w, b, x, 3])
    assert not last.matches([moved, b, x, 3])


def test_a_storage_that_moves_is_checked_one_by_one_from_then_on(pointer_check):
    w, x = torch.randn(8), torch.randn(8)
    first = LastCall("fn", [w, x])
    second = LastCall("fn", [w, torch.randn(8)], first)
    if pointer_check == "c-helper":
        assert first.stable == [0, 1] and second.stable == [0]        # x moved: its alignment is checked
    else:
        assert second.stable == []
    assert second.matches([w, torch.randn(8)])
    assert not second.matches([w, torch.randn(9)[1:]])


def test_compiled_graph_recompiles_for_a_misaligned_input_and_stays_right():
    f = minicomp.compile(lambda x, w: torch.relu(x) * w + 1)
    w = torch.randn(16)
    for x in [torch.randn(16), torch.randn(17)[1:], torch.randn(16), torch.randn(17)[1:]]:
        out = torch.full((16,), float("nan"))
        out.copy_(f(x, w))
        torch.testing.assert_close(out, torch.relu(x) * w + 1)


def test_a_parameter_replaced_in_place_by_a_tensor_of_another_shape_is_seen():
    lin = torch.nn.Linear(8, 4)
    f = minicomp.compile(lin)
    x = torch.randn(3, 8)
    torch.testing.assert_close(f(x), lin(x))
    with torch.no_grad():
        lin.weight.data = torch.randn(4, 8).t().contiguous().t()  # same shape, other strides, new storage
    torch.testing.assert_close(f(x), lin(x))


def test_ensure_layout_copies_misaligned_or_restrided_results():
    t = torch.randn(33)[1:].view(4, 8)        # 4 bytes past an aligned address
    out = ensure_layout(t, (8, 1))
    assert out.data_ptr() % 16 == 0 and torch.equal(out, t)
    aligned = torch.randn(4, 8)
    assert ensure_layout(aligned, (8, 1)) is aligned
    restrided = ensure_layout(aligned, (1, 4))
    assert restrided.stride() == (1, 4) and torch.equal(restrided, aligned)
