"""CI sample of the OpInfo sweep (tests/opinfo.py): a fixed list of common ops, a few float32
samples each, compiled with minicomp and compared with eager. The full sweep is
``python -m tests.opinfo`` (writes tests/coverage/opinfo.md)."""
import pytest

from tests.opinfo import check_op, op_by_name

CI_OPS = [
    # elementwise
    "add", "mul", "sub", "div.no_rounding_mode", "div.floor_rounding", "neg", "abs", "exp", "log",
    "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid", "nn.functional.relu", "where", "clamp", "pow",
    "maximum", "minimum", "masked_fill",
    # reductions
    "sum", "mean", "amax", "amin", "prod", "var", "std", "argmax", "any", "all",
    # views and data movement
    "reshape", "view", "permute", "transpose", "t", "squeeze", "unsqueeze", "flip", "cat", "split",
    "chunk", "select", "narrow", "expand",
    # normalisation
    "softmax", "log_softmax", "nn.functional.layer_norm",
    # matmul
    "matmul", "mm", "bmm", "addmm",
]


@pytest.mark.parametrize("name", CI_OPS)
def test_opinfo(name):
    status, detail = check_op(op_by_name(name), max_samples=3)
    print(f"{name}: {status}: {detail}")
    assert status in ("native", "fallback"), f"{name}: {status}: {detail}"
