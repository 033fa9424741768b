"""Structural checks run after every pass: a pass that breaks an invariant is named at once."""
from __future__ import annotations

import torch

from .attention import check as attention_check
from .attention_backward import check_grad
from .expr import Affine, index_vars
from .graph import Graph, Node
from .ops import OPS, REDUCTIONS, SCANS
from .types import FLOAT_DTYPES, TensorType


class VerificationError(AssertionError):
    pass


def verify(graph: Graph) -> None:
    seen: set[int] = set()
    outputs = [n for n in graph.nodes if n.op == "output"]
    _check(len(outputs) == 1, "graph must have exactly one output node")
    for node in graph.nodes:
        for i in node.inputs:
            _check(id(i) in seen, f"{node.name} uses {i.name} before it is defined")
        seen.add(id(node))
        _check(node.op == "output" or isinstance(node.type, (TensorType, tuple)),
               f"{node.name} has no type")
        getattr(_RULES, node.op, _unknown)(node)


def _check(cond, msg) -> None:
    if not cond:
        raise VerificationError(msg)


def _unknown(node: Node) -> None:
    _check(node.op in ("input", "constant", "extern", "getitem", "output"), f"unknown op {node.op}")


class _RULES:
    @staticmethod
    def pointwise(node: Node) -> None:
        fn = node.attrs["fn"]
        _check(fn in OPS, f"{node.name}: unknown pointwise fn {fn}")
        op, args = OPS[fn], node.attrs["args"]
        _check(op.arity is None or len(args) == op.arity, f"{node.name}: {fn} takes {op.arity} args, not {len(args)}")
        if op.result == "bool":
            _check(node.dtype == torch.bool, f"{node.name}: {fn} gives bool, not {node.dtype}")
        elif op.result == "to":
            _check(node.dtype == node.attrs["params"]["to"], f"{node.name}: {fn} to {node.attrs['params']['to']} "
                   f"gives {node.dtype}")
        for i in node.inputs:
            _check(i.shape == node.shape, f"{node.name}: input {i.name} shape {i.shape} != {node.shape}")

    @staticmethod
    def reduce(node: Node) -> None:
        (x,) = node.inputs
        _check(node.attrs["fn"] in REDUCTIONS, f"{node.name}: unknown reduction")
        expect = tuple(1 if d in node.attrs["axes"] else s for d, s in enumerate(x.shape))
        _check(node.shape == expect, f"{node.name}: reduce shape {node.shape} != {expect}")

    @staticmethod
    def scan(node: Node) -> None:
        (x,) = node.inputs
        _check(node.attrs["fn"] in SCANS, f"{node.name}: unknown scan {node.attrs['fn']}")
        _check(node.shape == x.shape, f"{node.name}: scan shape {node.shape} != {x.shape}")
        _check(0 <= node.attrs["axis"] < max(x.type.ndim, 1), f"{node.name}: scan axis out of range")

    @staticmethod
    def matmul(node: Node) -> None:
        a, b = node.inputs
        _check(a.shape[:-2] == b.shape[:-2] and a.shape[-1] == b.shape[-2],
               f"{node.name}: cannot multiply {a.shape} by {b.shape}")
        _check(a.dtype == b.dtype, f"{node.name}: operand dtypes differ")

    @staticmethod
    def attention(node: Node) -> None:
        problems = attention_check(node)
        _check(not problems, f"{node.name}: attention: {'; '.join(problems)}")

    @staticmethod
    def attention_grad(node: Node) -> None:
        problems = check_grad(node)
        _check(not problems, f"{node.name}: attention_grad: {'; '.join(problems)}")

    @staticmethod
    def view(node: Node) -> None:
        (x,) = node.inputs
        index = node.attrs["index"]
        _check(len(index) == len(x.shape), f"{node.name}: index rank {len(index)} != {len(x.shape)}")
        _check(node.dtype == x.dtype, f"{node.name}: a view cannot change dtype")
        if node.type.numel == 0:
            return
        masked = bool(node.attrs["mask"])
        for e, size in zip(index, x.shape):
            _check(isinstance(e, Affine), f"{node.name}: index is not an expression")
            lo, hi = e.bounds()
            _check(masked or (0 <= lo and hi < max(size, 1)),
                   f"{node.name}: index {e} leaves [0, {size})")

    @staticmethod
    def gather(node: Node) -> None:
        x, *indices = node.inputs
        index, values = node.attrs["index"], node.attrs["values"]
        _check(len(index) == len(x.shape), f"{node.name}: index rank {len(index)} != {len(x.shape)}")
        _check(node.dtype == x.dtype, f"{node.name}: a gather cannot change dtype")
        _check(len(values) == len(indices) and indices, f"{node.name}: one value variable per index input")
        for k, (var, i) in enumerate(zip(values, indices)):
            _check(var.name == f"j{k}", f"{node.name}: value variable {var} should be j{k}")
            _check(i.shape == node.shape, f"{node.name}: index input {i.name} shape {i.shape} != {node.shape}")
            _check(i.dtype not in FLOAT_DTYPES and i.dtype != torch.bool,
                   f"{node.name}: index input {i.name} is {i.dtype}, not an integer tensor")
        if node.type.numel == 0:
            return
        known = set(index_vars(node.shape)) | set(values)
        for e, size in zip(index, x.shape):
            _check(isinstance(e, Affine), f"{node.name}: index is not an expression")
            _check(e.vars() <= known, f"{node.name}: index {e} names unknown variables")
            lo, hi = e.bounds()
            _check(0 <= lo and hi < max(size, 1), f"{node.name}: index {e} leaves [0, {size})")
