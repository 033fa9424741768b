"""``minicomp::recurrent``: a whole ``nn.LSTM``/``nn.GRU``/``nn.RNN`` call (``torch.lstm``, ``torch.gru``,
``torch.rnn_tanh``, ``torch.rnn_relu`` in Dynamo's graph) as one opaque torch op that runs PyTorch's
own recurrent kernels (cuDNN on GPUs, oneDNN on the CPU), with its backward
``minicomp::recurrent_backward``.

PyTorch registers Python decompositions of these ops at the CompositeImplicitAutograd key, so
AOTAutograd unrolls the sequence — a matrix product and a gate kernel per step and layer — whatever
decomposition table it is given. Unrolled, a step is a matrix-vector product too small to fill a GPU
and the call is bound by its launches: a 2-layer LSTM (hidden 512, 32 steps) was 134 kernels and
2.3 ms a call on the H200 against cuDNN's 1.4 ms, and 21.5 ms a training step against eager's 5.5.
``backend.py`` puts this op in place of those calls (``substitute_recurrent``); minicomp runs it as a
fallback (``fallback_reasons.py`` says why).

Cells (``nn.GRUCell`` stepped in Python: ``torch.gru_cell``) stay as they are: on GPUs they decompose
into two cuBLAS products and PyTorch's fused gate kernel, and an opaque op per step was no faster than
those three calls (a custom op's Python dispatch, ~45 us of host time a call, eats what one call instead
of three saves: an unrolled GRUCell model 2.97 vs 1.82 ms a call and 22.4 vs 16.8 a training step on the
H200, in a host-bound timing whose repeats of the same code differ by up to 40 %).

The backward recomputes the forward with autograd on and asks PyTorch for the gradients (as
activation checkpointing does): one more forward per training step, no per-step activations kept. A
call with dropout in training mode stays unrolled: the recomputation would draw other dropout masks.
"""
from __future__ import annotations

import contextlib
from typing import List

import torch
import torch.fx as fx

MODES = ("lstm", "gru", "rnn_tanh", "rnn_relu")
_TARGETS = {getattr(torch, mode): mode for mode in MODES}  # Dynamo records torch.lstm etc.


def _run(mode: str, input: torch.Tensor, hx: List[torch.Tensor], params: List[torch.Tensor], has_biases: bool,
         num_layers: int, dropout: float, train: bool, bidirectional: bool, batch_first: bool) -> list[torch.Tensor]:
    """PyTorch's recurrent op, autocast off (the op's dtype is its input's, as its fake says), every result
    contiguous (cuDNN returns a batch-first output as a transposed view): output, h_n (and c_n)."""
    with torch.autocast(input.device.type, enabled=False):
        state = tuple(hx) if mode == "lstm" else hx[0]
        out = getattr(torch, mode)(input, state, params, has_biases, num_layers, dropout, train, bidirectional,
                                   batch_first)
    return [t.contiguous() for t in out]


@torch.library.custom_op("minicomp::recurrent", mutates_args=())
def recurrent(mode: str, input: torch.Tensor, hx: List[torch.Tensor], params: List[torch.Tensor], has_biases: bool,
              num_layers: int, dropout: float, train: bool, bidirectional: bool,
              batch_first: bool) -> List[torch.Tensor]:
    """``torch.<mode>(input, hx, params, ...)`` (``mode`` one of ``MODES``; ``hx`` holds h_0, and c_0
    for an LSTM): [output, h_n] (+ [c_n] for an LSTM), contiguous."""
    return _run(mode, input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first)


def _result_shapes(input: torch.Tensor, hx: List[torch.Tensor], bidirectional: bool) -> list[tuple]:
    """The shapes of ``recurrent``'s results: the output (h_0's last dim is the projection's size), then
    h_n (and c_n) as h_0 (and c_0)."""
    return [(*input.shape[:-1], (2 if bidirectional else 1) * hx[0].shape[-1]), *(tuple(h.shape) for h in hx)]


@recurrent.register_fake
def _recurrent_fake(mode, input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
    return [input.new_empty(shape) for shape in _result_shapes(input, hx, bidirectional)]


@contextlib.contextmanager
def _autograd_on():
    """Grad mode on, and autograd's dispatch keys no longer excluded: a custom op's kernel runs below
    autograd (its inputs' operations are not recorded), and this one differentiates its recomputation."""
    keys = torch._C.DispatchKey
    below = torch._C._dispatch_tls_local_exclude_set()
    for key in (keys.AutogradFunctionality, keys.AutogradOther, keys.AutogradNestedTensor):
        below = below.remove(key)
    with torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), below), torch.enable_grad():
        yield


@torch.library.custom_op("minicomp::recurrent_backward", mutates_args=())
def recurrent_backward(grads: List[torch.Tensor], mode: str, input: torch.Tensor, hx: List[torch.Tensor],
                       params: List[torch.Tensor], has_biases: bool, num_layers: int, bidirectional: bool,
                       batch_first: bool) -> List[torch.Tensor]:
    """The gradients of ``recurrent``'s results (``grads``, one per result) with respect to its input,
    ``hx`` and ``params``, in that order: the forward recomputed with autograd, in training mode
    (cuDNN's backward needs its workspace) without dropout (the substituted forward applied none:
    dropout is 0 or the module was in eval mode)."""
    return _gradients(lambda x, *rest: _run(mode, x, rest[:len(hx)], rest[len(hx):], has_biases, num_layers, 0.0,
                                            True, bidirectional, batch_first), [input, *hx, *params], grads)


def _gradients(run, tensors: list[torch.Tensor], grads: List[torch.Tensor]) -> List[torch.Tensor]:
    """The gradients of ``run(*tensors)``'s results (``grads``, one per result) with respect to
    ``tensors``: recomputed with autograd."""
    leaves = [t.detach().requires_grad_() for t in tensors]
    with _autograd_on():
        found = torch.autograd.grad(run(*leaves), leaves, grads, allow_unused=True, materialize_grads=True)
    # a custom op's results may not alias its inputs or each other (autograd may hand back a
    # gradient it was given: cuDNN's backward on the GPU does)
    taken = {t.untyped_storage().data_ptr() for t in (*grads, *tensors)}
    out = []
    for g in found:
        ptr = g.untyped_storage().data_ptr()
        out.append(g.clone() if ptr in taken else g)
        taken.add(ptr)
    return out


@recurrent_backward.register_fake
def _recurrent_backward_fake(grads, mode, input, hx, params, *flags):
    return [t.new_empty(t.shape) for t in (input, *hx, *params)]


def _setup_context(ctx, inputs, output):
    mode, input, hx, params, has_biases, num_layers, _, _, bidirectional, batch_first = inputs
    ctx.args = (mode, has_biases, num_layers, bidirectional, batch_first)
    ctx.hx = len(hx)
    ctx.save_for_backward(input, *hx, *params)


def _backward(ctx, grads):
    mode, has_biases, num_layers, bidirectional, batch_first = ctx.args
    input, *rest = ctx.saved_tensors
    hx, params = rest[:ctx.hx], rest[ctx.hx:]
    grads = [input.new_zeros(shape) if g is None else g
             for g, shape in zip(grads, _result_shapes(input, hx, bidirectional))]  # results nothing read
    out = recurrent_backward(grads, mode, input, hx, params, has_biases, num_layers, bidirectional, batch_first)
    return None, out[0], out[1:1 + ctx.hx], out[1 + ctx.hx:], None, None, None, None, None, None


recurrent.register_autograd(_backward, setup_context=_setup_context)


def substitute_recurrent(gm: fx.GraphModule) -> int:
    """Put ``minicomp::recurrent`` in place of every ``torch.lstm``/``gru``/``rnn_tanh``/``rnn_relu`` call
    of Dynamo's graph on a padded batch (not a ``PackedSequence``) without dropout in training mode, in
    a graph that autocast does not cover (eager runs them in the autocast dtype); returns how many."""
    calls = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in _TARGETS]
    if not calls or _autocast(gm):
        return 0
    count = 0
    for node in calls:
        mode = _TARGETS[node.target]
        if node.kwargs or len(node.args) != 9 or not isinstance(node.args[3], bool):
            continue  # (the PackedSequence overload: (data, batch_sizes, hx, params, has_biases, ...))
        input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first = node.args
        if train and dropout:
            continue
        node.target = torch.ops.minicomp.recurrent.default
        node.args = (mode, input, list(hx) if mode == "lstm" else [hx], list(params), has_biases, num_layers,
                     float(dropout), train, bidirectional, batch_first)
        count += 1
    if count:
        gm.recompile()
    return count


def _autocast(gm: fx.GraphModule) -> bool:
    """Whether autocast covers part of the graph: enabled around the compiled call (Dynamo guards on it)
    or entered inside."""
    return any(torch.is_autocast_enabled(device) for device in ("cpu", "cuda")) or any(
        n.op == "call_function" and n.target is torch.amp.autocast_mode._enter_autocast for n in gm.graph.nodes)
