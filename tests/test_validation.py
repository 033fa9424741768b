"""Translation validation (MINICOMP_VERIFY=1) names the first stage that changes results."""
import pytest
import torch
import torch.nn.functional as F

import minicomp
from minicomp.compiler import PIPELINE
from minicomp.passes.manager import Pass
from minicomp.validation import ValidationError
from tests.utils import compile_and_compare


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
