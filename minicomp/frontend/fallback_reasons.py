"""Ops that run in PyTorch on purpose, and why (the reason the report gives instead of "no lowering
rule"). Each is one fused library kernel that minicomp has no template for yet; replacing it with
minicomp's own kernels is work of a named issue, not an oversight. An op gets a lowering rule by
leaving this table. Collectives (communication between ranks) stay PyTorch's for good."""
from __future__ import annotations

from ..ir import collectives

_ATTENTION = ("runs PyTorch's fused attention kernel ({}): one launch that never stores the score "
              "matrix (minicomp has no kernel of its own for this attention variant)")
_ATTENTION_BACKWARD = "backward of PyTorch's fused attention kernel ({}), run because its forward ran it"
_RNN_CELL = ("PyTorch's fused {} cell: the gates' pointwise math in one CUDA launch after the two matmuls; "
             "PyTorch has no decomposition of it, and its backward reads the kernel's own workspace")
_RECURRENT = ("PyTorch's recurrent kernels (cuDNN, oneDNN) run the whole sequence; unrolled, every step and layer "
              "is a matrix-vector product and a gate kernel, bound by its launches (frontend/recurrent_op.py)")
_COLLECTIVE = ("a collective: PyTorch's process group runs it, on every rank in program order; never fused, "
               "moved across its wait or dropped (ir/collectives.py)")
# Reasons are read by users (the report, the dumps): they say what runs and why, never where work is tracked.
_CONVOLUTION = ("runs cuDNN's (oneDNN's on the CPU) convolution as a library call, unless the conv_lowering "
                "pass chooses minicomp's own kernels for it (the decisions say which)")

# op (overload packet) name — aten's bare, other namespaces' qualified ("minicomp::recurrent") -> why it
# falls back (the SDPA forward ops have rules in
# frontend/rules_attention.py, their backward ops in rules_attention_backward.py: they say why when they decline)
DELIBERATE_FALLBACKS: dict[str, str] = {
    "_scaled_dot_product_fused_attention_overrideable": _ATTENTION.format("the backend's own"),
    "_flash_attention_forward": _ATTENTION.format("flash"),
    "_efficient_attention_forward": _ATTENTION.format("memory-efficient"),
    "_cudnn_attention_forward": _ATTENTION.format("cuDNN"),
    "_scaled_dot_product_fused_attention_overrideable_backward": _ATTENTION_BACKWARD.format("the backend's own"),
    "_flash_attention_backward": _ATTENTION_BACKWARD.format("flash"),
    "_efficient_attention_backward": _ATTENTION_BACKWARD.format("memory-efficient"),
    "_thnn_fused_gru_cell": _RNN_CELL.format("GRU"),
    "_thnn_fused_gru_cell_backward": _RNN_CELL.format("GRU") + " (this is that backward)",
    "_thnn_fused_lstm_cell": _RNN_CELL.format("LSTM"),
    "_thnn_fused_lstm_cell_backward_impl": _RNN_CELL.format("LSTM") + " (this is that backward)",
    "minicomp::recurrent": _RECURRENT,
    "minicomp::recurrent_backward": _RECURRENT + "; its backward recomputes the forward with autograd",
    "embedding_dense_backward": ("PyTorch's embedding backward: sums the gradient rows of repeated ids in "
                                 "parallel segments (its decomposition, index_put with accumulate, walks "
                                 "them one after another; minicomp has no scatter-add kernel)"),
    "convolution": _CONVOLUTION,
    "convolution_backward": _CONVOLUTION,
    "_assert_async": ("an assertion on tensor values (`assert cond, msg` as Dynamo traces it): PyTorch checks "
                      "it where the program has it, and raises its message when it fails; never dropped"),
}


def deliberate_fallback(target) -> str | None:
    """Why ``target`` (an OpOverload) runs in PyTorch on purpose; None if it is not meant to."""
    if collectives.is_ordered(target):
        return _COLLECTIVE
    schema = getattr(target, "_schema", None)
    return DELIBERATE_FALLBACKS.get(schema.name.removeprefix("aten::")) if schema is not None else None
