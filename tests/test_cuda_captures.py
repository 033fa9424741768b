"""CUDA graphs (mode="reduce-overhead") on a real GPU: replays with fresh inputs, static outputs, parameters
that move, staged launches on two streams, a small CNN's steps, fallback reasons, capture errors, and
captures of graphs from the graph cache. GPU-only: every test skips without CUDA."""
import pytest
import torch
import torch.nn.functional as F

import minicomp
from tests.test_cuda import _dev

pytestmark = pytest.mark.gpu


# ------------------------------------------------------------- CUDA graphs (mode="reduce-overhead")

def _captured(rep) -> bool:
    return rep is not None and (rep.cuda_graph or "").startswith("captured")


def test_cuda_graph_replays_fresh_inputs_and_keeps_earlier_results():
    def fn(x, y):
        return torch.softmax(x, -1) * y, (x + y).sum(0), x.t()  # the last: a view of the input
    f = minicomp.compile(fn, mode="reduce-overhead")
    results = []
    for k in range(5):  # 1: plain run; 2: warm-up, capture, replay; 3-5: replays
        x, y = _dev((64, 96), (96,))
        got = f(x, y)
        for g, e in zip(got, fn(x, y)):
            torch.testing.assert_close(g, e)
            assert g.stride() == e.stride()
        assert got[2].data_ptr() == x.data_ptr()  # a view of this call's x, as eager returns it
        results.append(([g.clone() for g in got], got))
    rep = minicomp.report()
    assert rep.cuda_graph.startswith("captured: 2 input(s) copied per call, 0 static"), rep.summary()
    for then, now in results:  # the default: every call's results are its own
        for a, b in zip(then, now):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_cuda_graph_static_outputs_are_overwritten_by_the_next_call():
    f = minicomp.compile(lambda x: x * 2, mode="reduce-overhead", static_outputs=True)
    outs = [f(x) for x in _dev((8, 8), (8, 8), (8, 8), (8, 8))]
    assert "own buffers" in minicomp.report().cuda_graph, minicomp.report().summary()
    assert outs[2].data_ptr() == outs[3].data_ptr()  # replays write the same buffer
    torch.testing.assert_close(outs[2], outs[3])


def test_cuda_graph_parameters_are_not_copied_and_may_move():
    lin = torch.nn.Linear(32, 16).cuda()
    f = torch.compile(lin, backend="minicomp", mode="reduce-overhead")
    with torch.no_grad():
        for _ in range(3):
            (x,) = _dev((8, 32))
            torch.testing.assert_close(f(x), lin(x))
        rep = minicomp.report()
        assert rep.cuda_graph.startswith("captured: 1 input(s) copied per call, 2 static"), rep.summary()
        lin.weight.mul_(-2)  # in place, same address: the graph reads the parameter itself
        torch.testing.assert_close(f(x), lin(x))
        assert "re-recorded" not in rep.cuda_graph
        lin.weight.data = torch.randn(16, 32, device="cuda")  # swapped for another tensor: recorded again
        (x,) = _dev((8, 32))
        torch.testing.assert_close(f(x), lin(x))
        torch.testing.assert_close(f(x * 2), lin(x * 2))
    # recorded again (or, should Dynamo guard on the swap, compiled and captured anew)
    again = minicomp.report() is not rep and _captured(minicomp.report())
    assert "re-recorded 1 time(s)" in rep.cuda_graph or again, rep.summary()


@pytest.mark.parametrize("fn,shape,template", [
    (lambda x: F.softmax(x, -1), (128, 262144), "pipeline of 3"),
    (lambda x: x.sum(0), (8192, 8192), "split reduction + combine"),
])
def test_cuda_graph_of_staged_launches_replays_in_step_from_two_streams(fn, shape, template):
    # a staged launch's counters are never reset: the captured graph has its own, and replays from two
    # streams are ordered one after the other
    f = minicomp.compile(fn, mode="reduce-overhead")
    (x,) = _dev(shape, dtype=torch.bfloat16)
    f(x)
    rep = minicomp.report()
    assert rep.kernels[0].template == template, rep.summary()
    streams = [torch.cuda.Stream() for _ in range(2)]
    inputs = [[x * (k + 1) if k % 2 else torch.randn_like(x) for _ in streams] for k in range(4)]
    results = []
    torch.cuda.synchronize()  # the inputs are ready before the other streams read them
    for row in inputs:
        for s, t in zip(streams, row):
            with torch.cuda.stream(s):
                results.append((t, f(t)))
    torch.cuda.synchronize()
    assert _captured(rep), rep.summary()
    for t, got in results:
        torch.testing.assert_close(got, fn(t), atol=0.5, rtol=2e-2)  # bf16 sums of 8192 in another order


def test_cuda_graph_small_cnn_inference_and_training_steps_match_eager():
    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                   torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 32), torch.nn.GELU(),
                                   torch.nn.Linear(32, 10)).cuda()
    eager, mine = model(), model()
    compiled = torch.compile(mine, backend="minicomp", mode="reduce-overhead")
    opt_e, opt_m = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, mine))
    before, grads = minicomp.report(), {}
    for step in range(4):
        x, target = torch.randn(4, 3, 6, 6, device="cuda"), torch.randint(0, 10, (4,), device="cuda")
        losses = []
        for m, opt, run in ((eager, opt_e, eager), (mine, opt_m, compiled)):
            opt.zero_grad()
            loss = F.cross_entropy(run(x), target)
            loss.backward()
            losses.append(loss.detach())
            grads[m is mine] = [p.grad.clone() for p in m.parameters()]
            opt.step()
        torch.testing.assert_close(losses[1], losses[0], atol=1e-4, rtol=1e-4)
        for a, b in zip(grads[True], grads[False]):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
        for a, b in zip(mine.buffers(), eager.buffers()):  # BatchNorm's running statistics
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    reports = minicomp.reports_since(before)
    kinds = {r.graph.rsplit("_", 1)[-1] for r in reports if _captured(r)}
    assert kinds >= {"forward", "backward"}, "\n".join(r.summary() for r in reports)
    # inference (eval mode, no grad) through the same compiled module
    eager.eval(), mine.eval()
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(4, 3, 6, 6, device="cuda")
            torch.testing.assert_close(compiled(x), eager(x), atol=1e-4, rtol=1e-4)
    assert _captured(minicomp.report()), minicomp.report().summary()


def test_max_autotune_captures_and_no_cudagraphs_does_not():
    for mode, captured in (("max-autotune-no-cudagraphs", False), ("max-autotune", True)):
        torch._dynamo.reset()
        f = minicomp.compile(lambda x: torch.softmax(x, -1) * 3, mode=mode)
        for _ in range(3):
            (x,) = _dev((64, 128))
            torch.testing.assert_close(f(x), torch.softmax(x, -1) * 3)
        rep = minicomp.report()
        assert _captured(rep) == captured, rep.summary()
        assert captured or rep.cuda_graph is None


def test_cuda_graph_fallback_reasons_on_the_gpu(monkeypatch):
    # dynamic shapes, a CPU scalar tensor read by the graph: plain launches, the reason in the report
    f = torch.compile(lambda x: x.sin() + x.shape[0], backend="minicomp", mode="reduce-overhead", dynamic=True)
    for n in (5, 7, 7, 9):
        (x,) = _dev((n, 3))
        torch.testing.assert_close(f(x), x.sin() + n)
    assert minicomp.report().cuda_graph.startswith("not captured: dynamic shapes"), minicomp.report().summary()
    g = minicomp.compile(lambda x, s: x * s, mode="reduce-overhead")
    for _ in range(3):
        (x,), s = _dev((4, 4)), torch.tensor(1.5)
        torch.testing.assert_close(g(x, s), x * s)
    rep = minicomp.report()
    assert rep.cuda_graph.startswith("not captured: reads CPU tensor input(s)"), rep.summary()


def test_cuda_graph_capture_error_falls_back_and_cuda_stays_usable(monkeypatch):
    from minicomp.runtime import support
    real_empty = support.empty

    def syncing_empty(*args, **kwargs):  # a synchronization: not allowed while capturing
        torch.cuda.synchronize()
        return real_empty(*args, **kwargs)
    monkeypatch.setattr(support, "empty", syncing_empty)
    f = minicomp.compile(lambda x: x.exp() * 2, mode="reduce-overhead")
    for _ in range(3):
        (x,) = _dev((16, 16))
        torch.testing.assert_close(f(x), x.exp() * 2)
    rep = minicomp.report()
    assert rep.cuda_graph.startswith("not captured: ") and "capturing" in rep.cuda_graph, rep.summary()
    assert not torch.cuda.is_current_stream_capturing()
    y = torch.randn(100, device="cuda")
    torch.testing.assert_close((y * 2).sum().cpu(), y.cpu().sum() * 2)


def test_cuda_graph_from_the_graph_cache():
    def fn(x):
        return torch.nn.functional.gelu(x) * 2
    (x,) = _dev((32, 64))
    minicomp.compile(fn, mode="reduce-overhead")(x)
    torch._dynamo.reset()
    f = minicomp.compile(fn, mode="reduce-overhead")
    for _ in range(3):
        (x,) = _dev((32, 64))
        torch.testing.assert_close(f(x), fn(x))
    rep = minicomp.report()
    assert rep.from_cache and _captured(rep), rep.summary()
