"""``freeze=True``: batch norm folded into the convolution before it (fp32 math, weight's dtype),
convolution weights as constants, a guard that sees parameters changed after compiling, ignored
(and reported) where a backward may follow."""
from __future__ import annotations

import pytest
import torch

import minicomp
from minicomp.frontend.freeze import batch_norm_affine, fold_weight

from .test_layout_plan import Block, Net, _convolutions_as_externs  # noqa: F401 (an autouse fixture)

TOL = {torch.float32: dict(rtol=1e-4, atol=1e-4), torch.bfloat16: dict(rtol=3e-2, atol=3e-2)}


def _randomize_bn(bn: torch.nn.BatchNorm2d) -> None:
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
        if bn.weight is not None:
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-1, 1)


class ConvBN(torch.nn.Module):
    def __init__(self, cin=6, cout=9, groups=1, bias=True, affine=True):
        super().__init__()
        self.conv = torch.nn.Conv2d(cin, cout, 3, padding=1, groups=groups, bias=bias)
        self.bn = torch.nn.BatchNorm2d(cout, affine=affine)
        _randomize_bn(self.bn)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


def _compare(model, x, dtype=torch.float32, **compile_kw):
    model = model.eval().to(dtype)
    x = x.to(dtype)
    with torch.no_grad():
        expected = model(x)
        compiled = minicomp.compile(model, freeze=True, **compile_kw)
        actual = compiled(x)
    expected = expected if isinstance(expected, tuple) else (expected,)
    actual = actual if isinstance(actual, tuple) else (actual,)
    for e, a in zip(expected, actual):
        assert a.dtype == e.dtype and a.shape == e.shape and a.stride() == e.stride()
        torch.testing.assert_close(a, e, **TOL[dtype])
    rep = minicomp.report()
    assert rep.whole_graph_fallback is None, rep.whole_graph_fallback
    return compiled, rep


def _folded(rep) -> int:
    line = next(d for d in rep.decisions if d.startswith("freeze:"))
    return int(line.split()[1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_block_folded_equals_eager(dtype):
    _, rep = _compare(Block(), torch.randn(2, 3, 6, 7), dtype)
    assert _folded(rep) == 1
    assert not any("batch_norm" in k.name for k in rep.kernels), [k.name for k in rep.kernels]
    assert any("(a constant) converted to channels-last at compile time" in d for d in rep.decisions)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kw", [dict(bias=False), dict(groups=3), dict(groups=3, bias=False, affine=False)],
                         ids=["no-bias", "groups", "groups-no-bias-no-affine"])
def test_conv_bn_variants(kw, dtype):
    _, rep = _compare(ConvBN(**kw), torch.randn(2, 6, 5, 7), dtype)
    assert _folded(rep) == 1


def test_net_with_pooling_and_head_bf16():
    _compare(Net(), torch.randn(2, 3, 9, 8), torch.bfloat16)


def test_fold_matches_batch_norm_in_float64():
    """The folded weights computed in fp32 agree with conv then batch norm in float64."""
    conv = torch.nn.Conv2d(4, 5, 3, bias=True).double()
    bn = torch.nn.BatchNorm2d(5).double().eval()
    _randomize_bn(bn)
    x = torch.randn(2, 4, 6, 6, dtype=torch.float64)
    with torch.no_grad():
        scale, shift = batch_norm_affine(conv.bias.float(), bn.weight.float(), bn.bias.float(),
                                         bn.running_mean.float(), bn.running_var.float(), bn.eps)
        folded = torch.nn.functional.conv2d(x, fold_weight(conv.weight.float(), scale).double(), shift.double())
        torch.testing.assert_close(folded, bn(conv(x)), rtol=1e-5, atol=1e-5)


def test_half_precision_batch_norm_becomes_an_fp32_scale_and_shift_after_the_trained_weights():
    """In bf16 the convolution keeps its weights as trained (rounding ``w * scale`` to bf16 is an error
    eager does not make) and the batch norm becomes an fp32 scale and shift rounded once, fused into
    the relu's kernel: over ten conv-BN-relu layers the result is as close to float64 as eager's own
    (folded into bf16 weights it was 1.33x eager's error here, measured)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[ConvBN(cin=16, cout=16) for _ in range(10)]).eval()
    x = torch.randn(2, 16, 9, 9)
    with torch.no_grad():
        exact = model.double()(x.double())
        model.to(torch.bfloat16)
        eager = model(x.bfloat16())
    compiled, rep = _compare(model, x, torch.bfloat16)
    with torch.no_grad():
        actual = compiled(x.bfloat16())

    def error(t):
        return ((t.double() - exact).norm() / exact.norm()).item()
    assert error(actual) <= 1.15 * error(eager), (error(actual), error(eager))
    assert "(0 into fp32 weights and bias; 10 half-precision as an fp32 scale and shift" in \
        next(d for d in rep.decisions if d.startswith("freeze:"))
    assert not any("batch_norm" in k.name for k in rep.kernels), [k.name for k in rep.kernels]


@pytest.mark.parametrize("change", ["copy_", "mul_", "_foreach_add_", "data=", "new-parameter"])
def test_parameter_changed_after_compiling_is_seen(change):
    model = ConvBN().eval()
    x = torch.randn(2, 6, 5, 7)
    compiled, _ = _compare(model, x)
    with torch.no_grad():
        if change == "copy_":
            model.bn.running_var.copy_(torch.rand(9) + 0.5)
        elif change == "mul_":
            model.conv.weight.mul_(2)
        elif change == "_foreach_add_":  # what foreach optimizers and EMA updates call
            torch._foreach_add_([model.conv.weight, model.bn.bias], 0.5)
        elif change == "data=":
            model.conv.weight.data = torch.randn_like(model.conv.weight)
        else:
            model.bn.weight = torch.nn.Parameter(torch.rand(9) + 0.5)
        expected = model(x)
        actual = compiled(x)
    torch.testing.assert_close(actual, expected, **TOL[torch.float32])
    assert any("frozen again" in d for d in minicomp.report().decisions) or change == "new-parameter"


def test_unchanged_parameters_do_not_recompile():
    model = ConvBN().eval()
    x = torch.randn(2, 6, 5, 7)
    compiled, _ = _compare(model, x)
    before = len(minicomp.reports())
    with torch.no_grad():
        compiled(x)
        torch.testing.assert_close(compiled(torch.randn(2, 6, 5, 7) * 0 + x), model(x), **TOL[torch.float32])
    assert len(minicomp.reports()) == before


def test_torch_compile_options_dict():
    model = ConvBN().eval()
    x = torch.randn(2, 6, 5, 7)
    with torch.no_grad():
        out = torch.compile(model, backend="minicomp", options={"freeze": True})(x)
        torch.testing.assert_close(out, model(x), **TOL[torch.float32])
    assert _folded(minicomp.report()) == 1


def test_freeze_under_training_is_ignored_and_reported():
    model = ConvBN().eval()
    x = torch.randn(2, 6, 5, 7, requires_grad=True)
    with pytest.warns(UserWarning, match="freeze: ignored"):
        out = minicomp.compile(model, freeze=True)(x)
    expected = model(x)
    torch.testing.assert_close(out, expected, **TOL[torch.float32])
    grads = torch.autograd.grad(out.square().sum(), [x, model.conv.weight, model.bn.weight])
    want = torch.autograd.grad(expected.square().sum(), [x, model.conv.weight, model.bn.weight])
    for g, w in zip(grads, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
    assert any(d.startswith("freeze: ignored") for r in minicomp.reports() for d in r.decisions)


@pytest.mark.xfail(strict=True, reason="a write through p.data bumps the version counter of a detached alias, "
                   "not the parameter's: no per-call check short of reading the values sees it")
def test_write_through_data_alias_is_not_seen():
    model = ConvBN().eval()
    x = torch.randn(2, 6, 5, 7)
    compiled, _ = _compare(model, x)
    with torch.no_grad():
        model.conv.weight.data.mul_(2)
        torch.testing.assert_close(compiled(x), model(x), **TOL[torch.float32])


def test_write_through_data_alias_is_seen_after_increment_version():
    # the README's way out for writes freeze cannot see
    model = ConvBN().eval()
    x = torch.randn(2, 6, 5, 7)
    compiled, _ = _compare(model, x)
    with torch.no_grad():
        model.conv.weight.data.mul_(2)
        torch.autograd.graph.increment_version(model.conv.weight)
        torch.testing.assert_close(compiled(x), model(x), **TOL[torch.float32])


OPTIMIZERS = {  # (what the step writes through: fused kernels leave _version as it was, torch 2.13)
    "adam-fused": lambda ps: torch.optim.Adam(ps, lr=0.05, fused=True),
    "adamw-fused": lambda ps: torch.optim.AdamW(ps, lr=0.05, fused=True),
    "sgd-fused": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, fused=True),
    "adam-foreach": lambda ps: torch.optim.Adam(ps, lr=0.05, foreach=True),
    "sgd-for-loop": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, foreach=False),
}


def _train_step(model, optimizer, x):
    optimizer.zero_grad()
    model(x)[0].square().mean().backward()
    optimizer.step()


def _frozen_follows_optimizer_steps(make_optimizer, device):
    """A frozen model run between steps of an optimizer over its parameters gives eager's results
    after every step (fresh inputs each time): the steps are seen, however they write."""
    model = Net().to(device).eval()  # eval: the batch norm's statistics stay; only the optimizer writes
    optimizer = make_optimizer(list(model.parameters()))
    compiled = minicomp.compile(model, freeze=True)
    for step in range(3):
        x = torch.randn(2, 3, 9, 8, device=device)
        with torch.no_grad():
            for a, e in zip(compiled(x), model(x)):
                torch.testing.assert_close(a, e, **TOL[torch.float32])
        _train_step(model, optimizer, torch.randn(2, 3, 9, 8, device=device))
    assert any("frozen again" in d for d in minicomp.report().decisions)


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_frozen_model_follows_optimizer_steps(name):
    _frozen_follows_optimizer_steps(OPTIMIZERS[name], "cpu")


@pytest.mark.gpu(reason="needs CUDA (fused Adam's CUDA kernel)")
def test_frozen_model_follows_fused_adam_steps_on_cuda():
    _frozen_follows_optimizer_steps(OPTIMIZERS["adam-fused"], "cuda")


def test_a_write_that_leaves_version_alone_is_seen_through_the_optimizer_step():
    """An optimizer whose step writes where ``_version`` cannot see (as fused kernels do): the step
    itself is what the frozen graph notices."""
    class DataWriter(torch.optim.Optimizer):
        def __init__(self, params):
            super().__init__(params, {})

        def step(self, closure=None):
            for group in self.param_groups:
                for p in group["params"]:
                    p.data.mul_(0.5)  # through a detached alias: the parameter's version stays

    _frozen_follows_optimizer_steps(DataWriter, "cpu")


def test_fused_step_of_a_flat_parameter_the_modules_view_is_seen():
    """An optimizer over one flat parameter whose views the module's parameters are (as FSDP's flat
    parameters): the step is matched to the frozen parameters by storage, not identity."""
    model = ConvBN().eval()
    params = list(model.parameters())
    flat = torch.nn.Parameter(torch.cat([p.detach().flatten() for p in params]))
    offset = 0
    for p in params:
        p.data = flat.data[offset:offset + p.numel()].view_as(p)
        offset += p.numel()
    optimizer = torch.optim.Adam([flat], lr=0.05, fused=True)
    x = torch.randn(2, 6, 5, 7)
    compiled, _ = _compare(model, x)
    flat.grad = torch.randn_like(flat)
    optimizer.step()
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), **TOL[torch.float32])


def test_other_models_optimizer_steps_do_not_refreeze():
    """A frozen model beside another one in training (a teacher beside its student): the student's
    steps touch none of the frozen parameters, so the frozen graph is neither rebuilt nor given up."""
    teacher, student = ConvBN().eval(), ConvBN()
    optimizer = torch.optim.Adam(student.parameters(), lr=0.05, fused=True)
    x = torch.randn(2, 6, 5, 7)
    compiled, _ = _compare(teacher, x)
    before = len(minicomp.reports())
    for _ in range(3):
        optimizer.zero_grad()
        student(x).square().mean().backward()
        optimizer.step()
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), teacher(x), **TOL[torch.float32])
    assert len(minicomp.reports()) == before


class PreActivation(torch.nn.Module):
    """DenseNet's order: batch norm -> relu -> conv (nothing to fold), and a conv whose output is read
    twice before its batch norm (not folded either)."""

    def __init__(self):
        super().__init__()
        self.bn0 = torch.nn.BatchNorm2d(4)
        self.conv = torch.nn.Conv2d(4, 6, 3, padding=1)
        self.bn1 = torch.nn.BatchNorm2d(6)
        _randomize_bn(self.bn0)
        _randomize_bn(self.bn1)

    def forward(self, x):
        y = self.conv(torch.relu(self.bn0(x)))
        return self.bn1(y) + y


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_batch_norm_without_a_conv_before_it_stays(dtype):
    _, rep = _compare(PreActivation(), torch.randn(2, 4, 5, 6), dtype)
    assert _folded(rep) == 0
    assert sum("batch_norm" in k.name for k in rep.kernels) >= 1, [k.name for k in rep.kernels]


def test_batch_size_changes_split_the_frozen_graph():
    # once Dynamo makes the batch symbolic, the frozen graph is split as an unfrozen one is
    # (dynamic.py): a batch size is compiled when it comes back, not once per size
    model = ConvBN().eval()
    compiled = torch.compile(model, backend="minicomp", options={"freeze": True})
    with torch.no_grad():
        compiled(torch.randn(2, 6, 5, 7))
        before = minicomp.report()
        for b in (3, 4, 5, 3, 3):
            x = torch.randn(b, 6, 5, 7)
            torch.testing.assert_close(compiled(x), model(x), **TOL[torch.float32])
        model.conv.weight.mul_(2)  # a parameter changed: frozen again, still split
        x = torch.randn(4, 6, 5, 7)
        torch.testing.assert_close(compiled(x), model(x), **TOL[torch.float32])
    # the split (its static part compiled at once, the convolution's part for batch 3 when 3 came
    # back), then the split of the graph frozen again (batch 4: first seen, runs in PyTorch)
    kinds = [r.graph.split("_", 1)[1] for r in minicomp.reports_since(before)]
    assert kinds == ["inference", "inference_part0", "inference_part1", "inference", "inference_part0"], kinds
