"""Real models through minicomp on the CPU (Triton's interpreter): tiny transformers models (GPT-2 with
SDPA and with eager attention, BERT, Llama with grouped-query attention, T5, BART, ViT, Swin), CNN blocks
written in plain PyTorch (ResNet bottleneck, MobileNetV3 and EfficientNet blocks, DenseNet dense block,
ConvNeXt block), an ``nn.LSTM`` and an unrolled ``nn.GRUCell``, and attention idioms (``triu(a @ b)``,
two causal masks). Each: the eval-mode forward and a training step (loss, every gradient, BatchNorm's
running statistics) against eager, no graph falling back to PyTorch whole.

The models are the GPU suite's (benchmarks/model_zoo.py) at ``TINY`` sizes: hidden 32, 2 layers, 4
heads (2 key/value heads for Llama), sequence 8, images 16x16, batch 2. A test marked xfail fails today
because of a known compiler bug named in its reason; strict, so the fix turns it red: remove the mark.
"""
from __future__ import annotations

import copy
import importlib.util
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import minicomp
from benchmarks import model_zoo as zoo
from benchmarks.model_zoo import gradient_mismatches
from tests.model_checks import assert_compiled_whole, check_forward, check_training_step
from tests.utils import compile_and_compare

BATCH = 2
HAVE_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
SPECS = [
    zoo.gpt2(zoo.TINY, "sdpa"), zoo.gpt2(zoo.TINY, "eager"), zoo.bert(zoo.TINY), zoo.llama(zoo.TINY), zoo.t5(zoo.TINY),
    zoo.bart(zoo.TINY), zoo.vit(zoo.TINY), zoo.swin(zoo.TINY), *zoo.cnn_blocks(zoo.TINY), *zoo.rnns(zoo.TINY),
]

KNOWN_BUGS: dict = {}  # (model, "forward" | "training") -> the reason it fails today (none now)


def known_bug(reason: str):
    """Fails today with a wrong result or a whole-graph fallback (an AssertionError, not a crash)."""
    return pytest.mark.xfail(strict=True, raises=AssertionError, reason=reason)


def cases(mode: str) -> list:
    def marks(spec: zoo.ModelSpec) -> list:
        needs = [pytest.mark.skipif(not HAVE_TRANSFORMERS, reason="needs transformers")] \
            if spec.family == "transformer" else []
        return needs + ([known_bug(KNOWN_BUGS[spec.name, mode])] if (spec.name, mode) in KNOWN_BUGS else [])
    return [pytest.param(s, id=s.name, marks=marks(s)) for s in SPECS]


@pytest.mark.slow
@pytest.mark.parametrize("spec", cases("forward"))
def test_forward_matches_eager(spec):
    check_forward(spec, BATCH)


@pytest.mark.slow
@pytest.mark.parametrize("spec", cases("training"))
def test_training_step_matches_eager(spec):
    check_training_step(spec, BATCH)


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_TRANSFORMERS, reason="needs transformers")
def test_llama_bf16_forward_matches_eager():
    # the suite runs Llama in bf16: bf16 GEMMs, RMSNorm's fp32 upcast, RoPE in bf16. Its bf16 causal
    # mask, expanded over heads and cast to fp32, once left a fusion group iterating a space none of its
    # stores had (the whole graph fell back); see also test_bf16_mask_cast_feeding_two_kernels
    check_forward(zoo.llama(zoo.TINY), BATCH, dtype=torch.bfloat16)


# ---------------------------------------------------------------------------------- attention idioms

def triu_matmul(a, b):
    return torch.triu(a @ b)


def causal_softmax_arange(q, k):
    """Scores masked by comparing two aranges (the mask is built inside the graph)."""
    s = q.shape[-2]
    i = torch.arange(s, device=q.device)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    return scores.masked_fill(i[None, :] > i[:, None], float("-inf")).softmax(-1)


def causal_additive_mask(q, k, v):
    """GPT-style additive mask: a full -inf matrix, triu(1), added to the scores."""
    s = q.shape[-2]
    mask = torch.full((s, s), float("-inf"), device=q.device, dtype=q.dtype).triu(1)
    return F.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + mask, -1) @ v


IDIOMS = [
    pytest.param(triu_matmul, [(2, 8, 16), (2, 16, 8)], id="triu(a@b)"),
    pytest.param(causal_softmax_arange, [(2, 2, 8, 16), (2, 2, 8, 16)], id="causal-arange"),
    pytest.param(causal_additive_mask, [(2, 2, 8, 16)] * 3, id="causal-additive"),
]


@pytest.mark.parametrize("fn,shapes", IDIOMS)
def test_attention_idiom_forward_and_gradients(fn, shapes):
    inputs = [torch.randn(s) for s in shapes]
    compile_and_compare(fn, *inputs, fallbacks=None, atol=1e-5, rtol=1e-5)
    torch._dynamo.reset()
    leaves = [x.clone().requires_grad_() for x in inputs]
    twins = [x.clone().requires_grad_() for x in inputs]
    cotangent = torch.randn(fn(*inputs).shape)
    expected = torch.autograd.grad(fn(*leaves), leaves, cotangent)
    before = minicomp.report()
    actual = torch.autograd.grad(minicomp.compile(fn)(*twins), twins, cotangent)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, atol=1e-5, rtol=1e-5)
    assert_compiled_whole(minicomp.reports_since(before), backward=True)


def test_bf16_mask_cast_feeding_two_kernels():
    # a bf16 mask, expanded over heads and widened: its cast must not leave the mask's kernel
    def fn(m, q, k):
        w = torch.where(m, 0.0, float("-inf")).to(torch.bfloat16)
        scores = (q @ k.transpose(-1, -2)).float() + w.expand(2, 4, 8, 8).float()
        return torch.softmax(scores, -1), scores.amax(-1)
    q, k = (torch.randn(2, 4, 8, 16, dtype=torch.bfloat16) for _ in range(2))
    compile_and_compare(fn, torch.rand(2, 1, 8, 8) > 0.3, q, k)


def test_gradient_check_catches_a_wrong_gradient():
    # the comparison of the training tests must be able to fail: scale one gradient by 1.01
    spec = zoo.cnn_blocks(zoo.TINY)[0]
    reference = spec.build().train()
    model = copy.deepcopy(reference)
    inputs = spec.inputs(BATCH, "cpu", torch.float32, True)
    for m in (reference, model):
        spec.training_loss(m, inputs).backward()
    assert gradient_mismatches(reference, model) == []
    next(model.parameters()).grad.mul_(1.01)
    assert len(gradient_mismatches(reference, model)) == 1
    # nor does a float64 referee let it through: it is 1 % off float64, eager's fp32 about 1e-7
    exact = copy.deepcopy(spec.build().train()).double()
    spec.training_loss(exact, {k: v.double() if v.is_floating_point() else v for k, v in inputs.items()}).backward()
    assert len(gradient_mismatches(reference, model, exact=exact)) == 1


def test_gradient_referee_takes_eagers_spread_from_its_alternatives():
    """With ``alternatives`` (eager run another valid way) eager's error against float64 is the largest
    of its runs': a gradient 1.2 % off float64 passes where eager's own runs are 0.3 % and 1 % off
    (not against the first alone), and fails where they are 0.1 % and 0.2 % off."""
    def with_grad(g):
        m = torch.nn.Linear(8, 4, bias=False, dtype=g.dtype)
        m.weight.grad = g.clone()
        return m
    truth = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    direction = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    off = lambda f: with_grad(truth + f * truth.norm() * direction / direction.norm())  # noqa: E731
    exact = with_grad(truth.double())
    compiled = off(0.012)
    assert len(gradient_mismatches(off(0.003), compiled, exact=exact)) == 1
    assert gradient_mismatches(off(0.003), compiled, exact=exact, alternatives=(off(-0.01),)) == []
    (failure,) = gradient_mismatches(off(0.001), compiled, exact=exact, alternatives=(off(0.002),))
    assert "against float64 0.012" in failure and "eager's 0.001/0.002" in failure  # every eager run's error


@pytest.mark.slow
def test_training_step_compiled_as_one_function():
    # the other common way to compile training: the whole step, backward included, is one compiled function
    spec = next(s for s in SPECS if s.name == "convnext-block")
    reference = spec.build().train()
    model = copy.deepcopy(reference)
    inputs = spec.inputs(BATCH, "cpu", torch.float32, True)
    cotangent = torch.randn(spec.logits(reference(**inputs)).shape)

    def step(m):
        loss = spec.training_loss(m, inputs, cotangent)
        loss.backward()
        return loss.detach()
    expected = step(reference)
    before = minicomp.report()
    actual = torch.compile(step, backend="minicomp")(model)
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6)
    assert gradient_mismatches(reference, model) == []
    assert_compiled_whole(minicomp.reports_since(before), backward=True)


def test_as_trained_gives_every_constant_initialised_scale_a_value_that_counts():
    """timm's ``zero_init_last`` (a residual branch's last batch norm scale 0) and ConvNeXt's layer scale
    (1e-6) make a random model's branches add nothing to its output, so a wrong kernel in them would
    pass a comparison with eager: ``as_trained`` draws such scales and shifts afresh and leaves
    randomly initialised weights as they were."""
    torch.manual_seed(0)
    conv, bn = torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8)
    layer_scale = torch.nn.Parameter(torch.full((8,), 1e-6))
    torch.nn.init.zeros_(bn.weight)
    model = torch.nn.Sequential(conv, bn)
    model.register_parameter("layer_scale", layer_scale)
    weight = conv.weight.detach().clone()
    zoo.as_trained(model, torch.randn(4, 3, 8, 8))
    assert torch.equal(conv.weight, weight)
    for p in (bn.weight, layer_scale):
        assert p.min() >= 0.5 and p.max() <= 1.5 and p.unique().numel() == 8, p
    assert bn.bias.abs().max() <= 0.1 and bn.bias.unique().numel() == 8
    assert not model.training and bn.running_var.ne(1).all()


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_TRANSFORMERS, reason="transformers is not installed")
@pytest.mark.parametrize("name", ["qwen2", "distilbert"])
def test_more_architectures_match_eager_in_forward_and_gradients(name, monkeypatch):
    """Two of ``benchmarks/architectures.py``'s sweep (grouped-query attention with biased q/k/v; an
    encoder with its own attention code): logits and a training step's gradients as eager's."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import architectures
    line = architectures.check(name)
    assert line.startswith(f"{name}: OK "), line
