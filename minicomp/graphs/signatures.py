"""What a compiled graph specializes on, and a cheap check that a call has the last call's signature.

A compiled graph is specialized on its inputs' shapes, strides, dtypes, devices, layouts and 16-byte
alignment, and on the values of its non-tensor inputs (symbolic sizes). ``signature`` computes all of
it, about 1 µs per tensor: 0.3 ms per call for a ResNet-50 forward's ~320 inputs, more than all of its
launches. ``LastCall`` checks only what Dynamo has not already checked."""
from __future__ import annotations

from typing import Callable

import torch
from torch._subclasses.fake_tensor import is_fake

_same_pointers = getattr(torch._C, "_tensors_data_ptrs_at_indices_equal", None)  # CUDA builds
_FAKE = torch._C._TorchDispatchModeKey.FAKE


def faking() -> bool:
    """Whether a ``FakeTensorMode`` is active: a compiled graph is run for its results' metadata only
    (DDPOptimizer runs each piece it compiled on fake tensors to get the next piece's example inputs).
    One C call (~0.15 µs), cheap enough for every call."""
    return torch._C._get_dispatch_mode(_FAKE) is not None


def has_fakes(args) -> bool:
    """Whether an argument is a tensor without data (fake, functional): no data pointer to read,
    nothing to compute on."""
    return any(type(a) is not torch.Tensor and isinstance(a, torch.Tensor) and is_fake(a) for a in args)


def signature(args) -> tuple:
    """Everything a compiled graph specializes on."""
    return tuple(map(_specialized_on, args))


def _specialized_on(a) -> tuple:
    """What a compiled graph specializes on of one input."""
    if isinstance(a, torch.Tensor):
        return (tuple(a.shape), a.stride(), a.dtype, a.device, a.layout, a.data_ptr() % 16 == 0)
    return (type(a), a)


class LastCall:
    """The last call's specialization ``fn``, and what a new call must share with it to use it too,
    for graphs that Dynamo calls after checking its guards (every tensor's shape, strides, dtype and
    device; a forward or inference graph): the alignment of each tensor and the non-tensor values.
    Inputs Dynamo has not checked (``unchecked``: in a part of a graph with symbolic sizes, the values
    another part made) are compared in full, as ``signature`` sees them.

    Tensors whose storage has stayed put since the graph first ran (parameters and buffers, in
    practice) keep their alignment: one C call compares their addresses with the remembered ones. The
    others (activations) are checked one by one. A storage that moves (``p.data = ...``) drops the
    check to the full ``signature``, which then sees any change of shape too."""

    __slots__ = ("fn", "stable", "pointers", "moving", "unchecked")

    def __init__(self, fn: Callable, args, previous: LastCall | None = None, unchecked: frozenset[int] = frozenset()):
        self.fn = fn
        self.pointers = [a.data_ptr() if isinstance(a, torch.Tensor) else None for a in args]
        self.unchecked = [(i, _specialized_on(args[i])) for i in sorted(unchecked)]
        tensors = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and i not in unchecked]
        if previous is None or len(previous.pointers) != len(args):
            self.stable = tensors
        else:
            self.stable = [i for i in previous.stable if previous.pointers[i] == self.pointers[i]]
        if _same_pointers is None or not all(isinstance(a, (torch.Tensor, int)) for a in args):
            self.stable = []  # the C check takes tensors and ints
        stable = set(self.stable)
        self.moving = [(i, a.data_ptr() % 16 == 0) if isinstance(a, torch.Tensor) else (i, (type(a), a))
                       for i, a in enumerate(args) if i not in stable and i not in unchecked]

    def matches(self, args) -> bool:
        """Whether ``args`` has the signature of the call this was made from (given Dynamo's guards)."""
        if len(args) != len(self.pointers):
            return False
        if self.stable and not _same_pointers(args if type(args) is list else list(args), self.pointers, self.stable):
            return False  # (the C check takes a list, not a tuple)
        for i, want in self.moving:
            a = args[i]
            if isinstance(a, torch.Tensor):
                if (a.data_ptr() % 16 == 0) is not want:
                    return False
            elif (type(a), a) != want:
                return False
        for i, want in self.unchecked:
            if _specialized_on(args[i]) != want:
                return False
        return True
