"""Translation validation (MINICOMP_VERIFY=1) names the first stage that changes results."""
import pytest
import torch
import torch.nn.functional as F

import minicomp
from minicomp.graphs.options import PIPELINE
from minicomp.passes.manager import Pass
from minicomp.graphs.validation import ValidationError
from tests.utils import compare_gradients, compile_and_compare


@pytest.fixture
def verify(monkeypatch):
    monkeypatch.setenv("MINICOMP_VERIFY", "1")


@pytest.mark.parametrize("fn,shapes", [
    (lambda x: F.softmax(x, -1) * 2, [(6, 10)]),
    (lambda x, w, b: F.gelu(F.linear(x, w, b)), [(5, 8), (6, 8), (6,)]),
    (lambda x, y: torch.cat([x.t(), y], 0).flip(1).sum(0), [(4, 3), (2, 4)]),
], ids=["softmax", "linear_gelu", "views"])
def test_correct_pipeline_passes_validation(verify, fn, shapes):
    compile_and_compare(fn, *[torch.randn(s) for s in shapes])


def _break_mul(graph):
    """A wrong 'optimization': every multiplication becomes an addition."""
    for n in graph.nodes:
        if n.op == "pointwise" and n.attrs["fn"] == "mul":
            n.attrs["fn"] = "add"
    return graph


def test_a_wrong_pass_is_named(verify):
    broken = [*PIPELINE[:2], Pass("break_mul", _break_mul, "wrong on purpose"), *PIPELINE[2:]]
    from minicomp.backend import Backend
    compiled = torch.compile(lambda x: x * 3 + 1, backend=Backend(pipeline=broken))
    with pytest.raises(ValidationError, match="break_mul"):
        compiled(torch.randn(4, 4))


def test_validation_is_off_by_default(monkeypatch):
    monkeypatch.delenv("MINICOMP_VERIFY", raising=False)
    broken = [*PIPELINE[:2], Pass("break_mul", _break_mul, "wrong on purpose"), *PIPELINE[2:]]
    from minicomp.backend import Backend
    out = torch.compile(lambda x: x * 3 + 1, backend=Backend(pipeline=broken))(torch.ones(2))
    assert torch.equal(out, torch.full((2,), 5.0))  # wrong (1 + 3 + 1), and nothing checked it
    assert minicomp.report().whole_graph_fallback is None


@pytest.mark.parametrize("make", [
    lambda: torch.randn(64, 32)[:, :4],            # a slice: strides (32, 1)
    lambda: torch.randn(64, 32)[3:, 1:5],          # and a storage offset
    lambda: torch.randn(5, 7).t(),                 # transposed
    lambda: torch.randn(1, 7).expand(5, 7),        # expanded: stride 0, repeated elements
    lambda: torch.randn(40)[3:33].view(5, 6),      # an offset view of a 1-D buffer
    lambda: torch.randn(10)[3:3].view(0, 4),       # no elements
], ids=["slice", "offset", "transposed", "expanded", "offset_view", "empty"])
def test_strided_views_pass_validation(verify, make):
    # the validator hands the compiled code copies with the input's strides and offset (a clone
    # is contiguous, so the code specialized on the view's strides read it wrongly: ValidationError)
    x = make()
    compile_and_compare(lambda x, y: ((x * 2).sum(0), x.exp() + y), x, torch.randn(x.shape[-1]))


def test_attention_block_backward_passes_validation(verify):
    # training an attention block: the backward's inputs include transposed views of saved tensors
    B, T, C = 2, 8, 16
    qkv, proj = torch.nn.Linear(C, 3 * C), torch.nn.Linear(C, C)

    def block(x, w_qkv, w_proj):
        q, k, v = F.linear(x, w_qkv, qkv.bias).split(C, -1)
        att = (q @ k.transpose(-2, -1) * C ** -0.5).softmax(-1)
        return F.linear(att @ v, w_proj, proj.bias)

    compare_gradients(block, torch.randn(B, T, C), qkv.weight.detach(), proj.weight.detach())
