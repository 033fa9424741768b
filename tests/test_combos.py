"""Independent kernels as one launch (passes/combos.py): a layout copy of a graph input joins the
launch before it. Results against eager (outputs poisoned before each run: tests/conftest.py), the
launches in the report, and the rule that only independent, adjacent kernels combine."""
from types import SimpleNamespace

import torch
import torch.nn.functional as F

import minicomp
from minicomp.ir.kernel import Combo
from minicomp.passes.combos import _independent
from minicomp.passes.program import grid
from tests.test_target import _scheduled
from tests.utils import H200


def _block(x, w1, b1, w2, mean, var):
    """conv -> batch norm -> relu -> conv, weights as graph inputs (so copied channels-last per call)."""
    y = F.relu(F.batch_norm(F.conv2d(x, w1, b1, padding=1), mean, var, training=False))
    return F.conv2d(y, w2, stride=2)


def _block_args():
    return [torch.randn(2, 3, 7, 6), torch.randn(5, 3, 3, 3), torch.randn(5), torch.randn(4, 5, 3, 3),
            torch.randn(5), torch.rand(5) + 0.5]


def _stages(report) -> dict[str, tuple[str, ...]]:
    return {k.name: k.stages for k in report.kernels}


def test_a_weight_copy_runs_as_a_stage_of_the_launch_before_it():
    args = _block_args()
    f = minicomp.compile(_block)
    for call in range(2):  # new weights each call: the copies run on every call
        args[3] = torch.randn(4, 5, 3, 3)
        torch.testing.assert_close(f(*args), _block(*args), rtol=1e-4, atol=1e-4)
    report = minicomp.report()
    stages = _stages(report)
    copies = [s for k in stages.values() for s in k if "_copy_" in s]
    # the input and w1 (both before the first convolution) in one launch; w2 with batch norm + relu
    assert len(copies) == 3 and not any("_copy_" in name for name in stages), report.summary()
    (bn,) = [k for k in stages.values() if any("relu" in s for s in k)]
    assert len(bn) == 2 and "_copy_f32_4x5x3x3" in bn[1], report.summary()
    assert sum(d.startswith("one launch:") and "later stages: layout copy" in d for d in report.decisions) == 2


def test_a_copy_after_a_fallback_op_launches_alone():
    """conv(conv(x, w1), w2): nothing is launched between the convolutions for w2's copy to join."""
    def fn(x, w1, w2):
        return F.conv2d(F.conv2d(x, w1), w2)
    x, w1, w2 = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3), torch.randn(5, 4, 3, 3)
    torch.testing.assert_close(minicomp.compile(fn)(x, w1, w2), fn(x, w1, w2), rtol=1e-4, atol=1e-4)
    stages = _stages(minicomp.report())
    assert sorted(len(s) for s in stages.values()) == [0, 2], stages  # (x, w1) together; w2 alone
    assert any("_copy_f32_5x4x3x3" in name for name in stages), stages


def test_a_combo_launches_every_stages_grid_with_the_most_warps():
    graph, kernels = _scheduled(_block, _block_args(), H200)
    combos = [s for s in graph.staged_launches if isinstance(s, Combo)]
    assert len(combos) == 2, graph.decisions
    for c in combos:
        assert c.sizes == [grid(k)[0] for k in c.stages] and c.programs == sum(c.sizes)
        assert c.num_warps == max(k.schedule.num_warps for k in c.stages) and c.counters == 0


def test_only_independent_kernels_combine():
    a, b, c = object(), object(), object()  # buffers

    def kernel(reads, writes):
        args = [SimpleNamespace(node=n, is_output=False) for n in reads] + \
               [SimpleNamespace(node=n, is_output=True) for n in writes]
        return SimpleNamespace(args=args, inputs=set(reads))
    run = [kernel([a], [b])]
    assert _independent(run, kernel([c], [object()]))
    assert not _independent(run, kernel([b], [object()]))  # reads what the run writes
    assert not _independent(run, kernel([c], [a]))         # overwrites what the run reads
    assert not _independent(run, kernel([c], [b]))         # writes what the run writes


def test_a_combo_stage_writes_in_place_only_when_no_other_stage_names_the_buffers():
    """The memory plan's in-place rule (``ir.program.in_place_problem``) looks at the stage that writes
    the buffer; another stage naming the donor (or the buffer) runs at the same time: refused."""
    from minicomp.ir.program import KernelLaunch, _stage_writing

    def stage(n):
        return SimpleNamespace(args=[object()] * n)
    bn, copy = stage(3), stage(2)
    launch = KernelLaunch(Combo("c0", [bn, copy], 4, sizes=[1, 1]), (2,), ("conv", "mean", "out", "w", "wcl"),
                          ("out", "wcl"), {})
    assert _stage_writing(launch, "out", "conv") == (bn, ("conv", "mean", "out"))
    shared = KernelLaunch(Combo("c0", [bn, copy], 4, sizes=[1, 1]), (2,), ("conv", "mean", "out", "conv", "wcl"),
                          ("out", "wcl"), {})
    assert _stage_writing(shared, "out", "conv") == (None, ())


def test_a_training_forwards_batch_norm_counters_run_as_stages_of_other_launches():
    """``num_batches_tracked + 1`` (one one-element kernel per batch norm in a training forward) reads
    only a graph input and is read by nothing but the write-back: it runs as a later stage of the next
    launch (it follows a convolution, so no launch before can take it). Buffers equal eager's."""
    import copy
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                torch.nn.Conv2d(8, 4, 1), torch.nn.BatchNorm2d(4))
    eager = copy.deepcopy(model)
    before = minicomp.report()
    x = torch.randn(2, 3, 8, 8)
    torch.compile(model, backend="minicomp")(x).sum().backward()
    eager(x).sum().backward()
    for (name, got), want in zip(model.state_dict().items(), eager.state_dict().values()):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=name)
    forward = next(r for r in minicomp.reports_since(before) if r.graph.endswith("forward"))
    stages = _stages(forward)
    counters = [s for k in stages.values() for s in k[1:] if "_add_i64" in s]
    assert len(counters) == 2 and not any("_add_i64" in name for name in stages), forward.summary()
    assert sum("later stages: update of an input" in d for d in forward.decisions) == 2, forward.decisions
