"""``nn.LSTM``/``nn.GRU``/``nn.RNN`` kept whole as ``minicomp::recurrent`` (minicomp/frontend/recurrent_op.py):
every result and the gradients of the input, the initial state and every parameter against eager; the
report says why the op runs in PyTorch; the calls that must stay unrolled (dropout in training mode,
autocast) do."""
import pytest
import torch
import torch.nn as nn

import minicomp
from minicomp.frontend.recurrent_op import substitute_recurrent
from tests.utils import eager_or_skip

MODULES = {
    "lstm-2layers-batch_first": lambda: nn.LSTM(6, 5, 2, batch_first=True),
    "lstm-proj-bidirectional": lambda: nn.LSTM(6, 5, 1, proj_size=3, bidirectional=True),
    "gru-bidirectional": lambda: nn.GRU(6, 5, 2, bidirectional=True),
    "rnn-relu": lambda: nn.RNN(6, 5, 2, nonlinearity="relu", batch_first=True),
    "rnn-tanh-no-bias": lambda: nn.RNN(6, 5, 1, bias=False),
}


@pytest.fixture(autouse=True)
def allow_rnn():
    # Dynamo leaves recurrent modules to eager (a graph break) unless allowed. config.patch, not
    # monkeypatch.setattr: the config module keeps its values outside its __dict__, so pytest >= 9.2's
    # undo deletes the setting (every later test then fails on a missing allow_rnn)
    with torch._dynamo.config.patch(allow_rnn=True):
        torch._dynamo.reset()
        yield


def _flat(result) -> list[torch.Tensor]:
    out, state = result
    return [out, *(state if isinstance(state, tuple) else (state,))]


def _state(module: nn.RNNBase, batch: int) -> tuple | torch.Tensor:
    """A random initial state that requires grad (h_0, and c_0 for an LSTM)."""
    layers = module.num_layers * (2 if module.bidirectional else 1)
    h = torch.randn(layers, batch, module.proj_size or module.hidden_size, requires_grad=True)
    if isinstance(module, nn.LSTM):
        return h, torch.randn(layers, batch, module.hidden_size, requires_grad=True)
    return h


@pytest.mark.parametrize("name", MODULES)
@pytest.mark.parametrize("given_state", [False, True], ids=["zero-state", "given-state"])
def test_results_and_gradients_match_eager(name, given_state):
    torch.manual_seed(0)
    module = MODULES[name]()
    x = torch.randn(3, 4, 6, requires_grad=True)  # (batch, seq) or (seq, batch): both 3-D
    state = _state(module, 4 if not module.batch_first else 3) if given_state else None
    states = () if state is None else state if isinstance(state, tuple) else (state,)
    leaves = [x, *states, *module.parameters()]
    compiled = torch.compile(module, backend="minicomp")
    before = minicomp.report()
    got, expected = _flat(compiled(x, state)), _flat(module(x, state))
    assert [t.shape for t in got] == [t.shape for t in expected]
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b)
    seeds = [torch.randn_like(t) for t in expected]  # a gradient for every result
    for a, b in zip(torch.autograd.grad(got, leaves, seeds), torch.autograd.grad(expected, leaves, seeds)):
        torch.testing.assert_close(a, b)
    reports = minicomp.reports_since(before)
    forward, backward = (next(r for r in reports if r.graph.endswith(kind)) for kind in ("_forward", "_backward"))
    assert [f.op for f in forward.fallbacks] == ["recurrent.default"]
    assert [f.op for f in backward.fallbacks] == ["recurrent_backward.default"]
    assert "PyTorch's recurrent kernels" in forward.fallbacks[0].reason
    assert len(forward.kernels) <= 2  # the zero state at most, not a kernel per step


def test_inference_of_a_language_model_is_one_call_with_the_embedding_and_head_compiled():
    torch.manual_seed(0)

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.rnn, self.head = nn.Embedding(50, 8), nn.GRU(8, 8, 2, batch_first=True), nn.Linear(8, 50)

        def forward(self, ids):
            return self.head(self.rnn(self.embed(ids))[0])

    model = LM().eval()
    ids = torch.randint(0, 50, (2, 7))
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, backend="minicomp")(ids), model(ids))
    assert [f.op for f in minicomp.report().fallbacks] == ["recurrent.default"]


def test_unbatched_input_and_float64():
    torch.manual_seed(0)
    module = nn.LSTM(6, 5, 2).double()
    x = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)  # (seq, features): no batch dim
    got, expected = _flat(torch.compile(module, backend="minicomp")(x)), _flat(module(x))
    for a, b in zip(got, expected):
        assert a.dtype == torch.float64
        torch.testing.assert_close(a, b)
    grads = [torch.autograd.grad(r[0].sum(), [x, module.weight_hh_l1]) for r in (got, expected)]
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)


def _dynamo_graph(fn, *args):
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm
    torch.compile(fn, backend=capture)(*args)
    return graphs[0]


@pytest.mark.parametrize("train, dropout, substituted", [(True, 0.3, 0), (False, 0.3, 1), (True, 0.0, 1)])
def test_dropout_in_training_mode_stays_unrolled(train, dropout, substituted):
    module = nn.LSTM(6, 5, 2, dropout=dropout).train(train)
    gm = _dynamo_graph(module, torch.randn(3, 2, 6))
    assert substitute_recurrent(gm) == substituted


def test_autocast_stays_unrolled_so_the_result_has_eager_dtype():
    module = nn.LSTM(6, 5)

    def f(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return module(x)[0]
    x = torch.randn(3, 2, 6)
    with torch.no_grad():  # (with grad, AOTAutograd itself fails on oneDNN's LSTM under autocast, torch 2.13)
        expected = eager_or_skip(f, x)
    assert substitute_recurrent(_dynamo_graph(f, x)) == 0
    torch._dynamo.reset()
    with torch.no_grad():
        assert torch.compile(f, backend="minicomp")(x).dtype == expected.dtype == torch.bfloat16


def test_eval_mode_dropout_is_not_applied_when_gradients_are_recomputed():
    torch.manual_seed(0)
    module = nn.LSTM(6, 5, 3, dropout=0.5).eval()  # eval mode: eager applies no dropout, forward or backward
    x = torch.randn(4, 2, 6, requires_grad=True)
    got, expected = torch.compile(module, backend="minicomp")(x)[0], module(x)[0]
    torch.testing.assert_close(got, expected)
    leaves = [x, *module.parameters()]
    for a, b in zip(torch.autograd.grad(got.sum(), leaves), torch.autograd.grad(expected.sum(), leaves)):
        torch.testing.assert_close(a, b)
    assert "recurrent_backward.default" in [f.op for r in minicomp.reports() for f in r.fallbacks]


@pytest.mark.slow
def test_a_transformers_model_with_lstms_trains_as_eager():
    """Encodec (transformers' audio codec: convolutions, weight norm, an LSTM in encoder and decoder,
    a quantizer Dynamo breaks the graph at): the output and every parameter's gradient against eager."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.EncodecConfig(hidden_size=16, num_filters=4, codebook_size=16, codebook_dim=16)
    model = transformers.EncodecModel(config).train()
    x = torch.randn(1, 1, 320)

    def step(fn):
        model.zero_grad(set_to_none=True)
        out = fn(x).audio_values
        out.square().mean().backward()
        return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    expected, expected_grads = step(model)
    before = minicomp.report()
    got, grads = step(torch.compile(model, backend="minicomp"))
    torch.testing.assert_close(got, expected)
    assert grads.keys() == expected_grads.keys()
    for name, g in grads.items():
        torch.testing.assert_close(g, expected_grads[name], msg=name)
    ops = {f.op for r in minicomp.reports_since(before) for f in r.fallbacks}
    assert {"recurrent.default", "recurrent_backward.default"} <= ops, ops


def test_autograd_on_records_below_autograd():
    """``_autograd_on`` (private torch dispatch-key APIs) turns recording back on where a custom op's
    kernel runs: below autograd, with autograd's keys excluded. A torch release that changes them
    fails here by name."""
    from minicomp.frontend.recurrent_op import _autograd_on
    x = torch.randn(3, requires_grad=True)
    with torch._C._AutoDispatchBelowAutograd():
        assert not (x * 2).requires_grad  # what a custom op's kernel sees
        with _autograd_on():
            (grad,) = torch.autograd.grad((x * 2).sum(), x)
        assert not (x * 2).requires_grad  # restored on exit
    torch.testing.assert_close(grad, torch.full((3,), 2.0))
