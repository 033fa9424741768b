"""CI sample of the OpInfo sweep (tests/opinfo.py): a fixed list of common ops, a few float32
samples each, compiled with minicomp and compared with eager; for ``GRAD_OPS`` the first sample's
gradients too (a training graph: every input's ``.grad`` against eager's). The full sweep is
``python -m tests.opinfo`` (writes tests/coverage/opinfo.md)."""
import pytest
import torch

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
    # scans
    "logcumsumexp",
    # normalisation
    "softmax", "log_softmax", "nn.functional.layer_norm",
    # matmul
    "matmul", "mm", "bmm", "addmm",
]

# Ops whose backward is checked in CI (one sample each): broadcasting binaries, reductions whose
# backward expands, backward ops fed saved outputs (softmax, log_softmax, layer_norm, amax), views and
# matmuls. The full sweep checks every op that supports autograd.
GRAD_OPS = {"add", "mul", "div.no_rounding_mode", "tanh", "sigmoid", "where", "clamp", "pow", "maximum",
            "sum", "mean", "amax", "prod", "var", "softmax", "log_softmax", "nn.functional.layer_norm",
            "permute", "cat", "select", "expand", "matmul", "addmm",
            "logcumsumexp"}  # its backward is ill-conditioned at OpInfo's 1e4 inputs: checked against float64


@pytest.mark.parametrize("name", CI_OPS)
def test_opinfo(name):
    result = check_op(op_by_name(name), max_samples=3, grad_samples=1 if name in GRAD_OPS else 0)
    print(f"{name}: {result}")
    assert result.status in ("native", "fallback"), f"{name}: {result.status}: {result.detail}"
    if name in GRAD_OPS:
        assert result.grad == "correct", f"{name}: gradients {result.grad}: {result.grad_detail}"


def test_grad_ops_are_in_the_sample():
    assert GRAD_OPS <= set(CI_OPS), GRAD_OPS - set(CI_OPS)


def wrong_gradient(x):
    """2x both ways, but compiled its gradient is 3 (Dynamo traces the is_compiling branch)."""
    if torch.compiler.is_compiling():
        return x * 3 - x.detach()
    return x * 2


def test_check_op_finds_a_wrong_gradient():
    from torch.testing._internal.opinfo.core import SampleInput

    class Fake:  # the parts of an OpInfo that check_op reads
        name, variant_test_name, supports_autograd, op = "wrong_gradient", "", True, staticmethod(wrong_gradient)

        def supported_dtypes(self, device):
            return {torch.float32}

        def sample_inputs(self, device, dtype, requires_grad):
            return [SampleInput(torch.randn(3, 4, requires_grad=requires_grad))]

    result = check_op(Fake(), max_samples=1)
    assert (result.status, result.grad) == ("native", "wrong"), result
    assert "grad of input 0" in result.grad_detail, result


def test_float64_reference_takes_eager_error_as_slack():
    """A gradient eager's float32 gets only to 1e-2 may be as far off; ten times further is wrong."""
    from tests.opinfo import _as_close_as_eager
    exact = torch.linspace(-3, 3, 20, dtype=torch.float64)
    eager = (exact + 1e-2).float()
    assert _as_close_as_eager((exact - 1.5e-2).float(), eager, exact) == pytest.approx(1e-2, rel=1e-4)
    with pytest.raises(AssertionError):
        _as_close_as_eager((exact + 1e-1).float(), eager, exact)
    with pytest.raises(AssertionError):  # where eager is exact, the usual tolerance
        _as_close_as_eager((exact + 2e-2).float(), exact.float(), exact)
