"""The template registry (minicomp/templates/): every kernel is scheduled, built, printed and
launched by the template object its schedule names; a new template is one object in the list."""
from __future__ import annotations

import torch

import minicomp
from minicomp import templates
from minicomp.ir.kernel import Schedule
from minicomp.templates.pointwise import Pointwise
from tests.utils import compile_and_compare


def test_the_registry_is_ordered_and_named_once():
    names = [t.name for t in templates.TEMPLATES]
    assert names == ["attention", "attention_dkdv", "attention_dq", "gemm", "scan", "window", "reduction", "tiled",
                     "pointwise"]
    assert all(templates.template_of(n) is t for n, t in zip(names, templates.TEMPLATES))


def test_each_template_runs_its_groups():
    cases = {  # fn, inputs, the template of its kernel
        "pointwise": (lambda x: torch.relu(x) + 1, (torch.randn(5, 7),)),
        "tiled": (lambda x, y: x.t() + y, (torch.randn(9, 6), torch.randn(6, 9))),
        "reduction persistent": (lambda x: torch.softmax(x, -1), (torch.randn(3, 10),)),
        "window": (lambda x: torch.nn.functional.max_pool2d(x, 3, 2, 1), (torch.randn(2, 3, 7, 6),)),
        "scan persistent": (lambda x: torch.cumsum(x, -1), (torch.randn(3, 10),)),
        "gemm": (lambda a, b: torch.relu(a @ b), (torch.randn(5, 8), torch.randn(8, 3))),
    }
    for kind, (fn, args) in cases.items():
        torch._dynamo.reset()
        report = compile_and_compare(fn, *args, kernels=1)
        assert report.kernels[0].template == kind, report.summary()


class SmallPointwise(Pointwise):
    """The example of docs/architecture.md ("How to add a template"): elementwise groups of at most
    64 elements as one program of 64 lanes."""
    name = "small_pointwise"

    def matches(self, group, ctx):
        return super().matches(group, ctx) and 0 < torch.Size(group.shape).numel() <= 64

    def default_schedule(self, group, ctx):
        return Schedule(self.name, {"XBLOCK": 64}, 1)

    def grid(self, kernel):
        return (1,)


def test_a_new_template_is_one_object_in_the_list(monkeypatch, cache_dir, capsys, tuning_in_the_interpreter):
    monkeypatch.setattr(templates, "TEMPLATES", [SmallPointwise()] + templates.TEMPLATES)
    report = compile_and_compare(lambda x: x.sin() * 2, torch.randn(3, 7), kernels=1)
    assert report.kernels[0].template == "small_pointwise"
    source = open(report.kernels[0].source_path).read()
    assert "XBLOCK=64" in source and "xmask = xindex < xnumel" in source
    torch._dynamo.reset()  # larger groups go on to the next template that matches
    assert compile_and_compare(lambda x: x.sin() * 2, torch.randn(9, 9), kernels=1).kernels[0].template == "pointwise"
    torch._dynamo.reset()  # the tune pass walks its config space like any other template's
    x = torch.randn(3, 7)
    torch.testing.assert_close(minicomp.compile(lambda x: x.sin() * 2, mode="max-autotune")(x), x.sin() * 2)
    assert "minicomp: tuned k0_sin_mul_f32_3x7" in capsys.readouterr().err


def test_a_result_of_no_elements_is_never_stored():
    """``x.float()`` of a stride-0 bf16 vector of no elements, next to its mean (NaN, one element): the
    kernel iterates the mean's one output, and the empty result's index, its size-0 dim of stride 0
    gone, was 0 for every lane, unmasked: a write outside a buffer of no bytes (the fuzzer's program
    crashed the interpreter). No statement stores a node of no elements; its argument stays."""
    from minicomp.ir.kernel import Store
    from minicomp.ir.target import INTERPRETER
    from tests.test_target import _scheduled
    from tests.utils import H200
    x = torch.randn(1, dtype=torch.bfloat16).expand(0)
    fn = lambda x: (x.float(), x.mean(-1, keepdim=True))  # noqa: E731
    for target in (INTERPRETER, H200):
        _, kernels = _scheduled(fn, [x], target)
        for k in kernels:
            empty = {a.name for a in k.args if a.is_output and a.node.type.numel == 0}
            stores = [s for p in k.phases for s in p.outer + p.inner if isinstance(s, Store)]
            assert empty and not any(s.buffer in empty for s in stores), (target, k.name, stores)
    compile_and_compare(fn, x)  # and eager's results: the empty one and NaN
