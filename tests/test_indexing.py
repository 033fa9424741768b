"""Indexing with integer tensors (embedding, index_select, gather, index.Tensor) as indirect loads:
results and gradients against eager, fusion with consumers and index producers, the IR node."""
import pytest
import torch
import torch.nn.functional as F

import minicomp
from minicomp.frontend import rules_index
from minicomp.frontend.lowering import Lowering, Unsupported
from minicomp.ir import interpreter
from minicomp.ir.expr import Affine, Var, index_vars
from minicomp.ir.graph import Graph
from minicomp.ir.types import TensorType
from minicomp.ir.verifier import VerificationError, verify
from tests.utils import compile_and_compare

CPU = torch.device("cpu")


def _forward_report():
    return next(r for r in reversed(minicomp.reports()) if r.graph.endswith(("_forward", "_inference")))


def _check_grad(fn, data, *rest, dtype_tol=None):
    """Gradients w.r.t. ``data`` through minicomp (the backward may use fallbacks) match eager's;
    the forward graph is native."""
    expected_in = data.detach().clone().requires_grad_()
    actual_in = data.detach().clone().requires_grad_()
    expected = fn(expected_in, *rest)
    actual = minicomp.compile(fn)(actual_in, *rest)
    torch.testing.assert_close(actual, expected)
    assert not _forward_report().fallbacks, _forward_report().summary()
    g = torch.randn_like(expected)
    expected.backward(g)
    actual.backward(g)
    torch.testing.assert_close(actual_in.grad, expected_in.grad)


# --- each op against eager ----------------------------------------------------------------------

@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_embedding_fuses_with_its_consumer(index_dtype):
    w, idx = torch.randn(10, 4), torch.tensor([[1, 9, 9, 0], [3, 3, 3, 7]], dtype=index_dtype)  # repeats
    compile_and_compare(lambda w, i: F.embedding(i, w) * 2 + 1, w, idx, kernels=1)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_embedding_of_half_precision_weights(dtype):
    w, idx = torch.randn(10, 8, dtype=dtype), torch.randint(0, 10, (3, 5))
    compile_and_compare(lambda w, i: F.embedding(i, w) * 3, w, idx, kernels=1)


def test_embedding_of_a_transposed_weight():
    w, idx = torch.randn(4, 10), torch.tensor([[1, 9, 9], [0, 3, 3]])
    compile_and_compare(lambda w, i: F.embedding(i, w.t()) + 1, w, idx, kernels=1)


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_index_select(dim, index_dtype):
    x = torch.randn(5, 6, 7)
    idx = torch.tensor([4, 0, 0, 2], dtype=index_dtype)
    compile_and_compare(lambda x, i: torch.index_select(x, dim, i) - 1, x, idx, kernels=1)


def test_index_select_with_a_0d_index():
    compile_and_compare(lambda x, i: torch.index_select(x, 1, i), torch.randn(3, 4), torch.tensor(2), kernels=1)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_gather(dim):
    x = torch.randn(5, 6, 7)
    shape = [4, 3, 2]
    shape[dim] = 9  # longer than x along the gathered dim; shorter elsewhere
    idx = torch.randint(0, x.shape[dim], shape)
    compile_and_compare(lambda x, i: torch.gather(x, dim, i) * 2, x, idx, kernels=1)


def test_gather_with_int32_index_of_a_transposed_input():
    x = torch.randn(7, 5)
    idx = torch.randint(0, 7, (5, 3), dtype=torch.int32)
    compile_and_compare(lambda x, i: torch.gather(x.t(), 1, i), x, idx, kernels=1)


@pytest.mark.parametrize("case", ["first", "middle", "adjacent", "apart", "broadcast"])
def test_advanced_indexing(case):
    x = torch.randn(5, 6, 7)
    i, j = torch.tensor([[4], [-1], [0]]), torch.tensor([1, -6, 3, 3])  # negative indices wrap
    fn, args = {
        "first": (lambda x, i: x[i], (i,)),
        "middle": (lambda x, j: x[:, j], (j,)),
        "adjacent": (lambda x, i, j: x[:, j, i], (j, i)),        # B [3, 4] replaces dims 1, 2
        "apart": (lambda x, i, j: x[i, :, j], (i, j)),          # B [3, 4] goes first
        "broadcast": (lambda x, i, j: x[i, j], (i, j.to(torch.int32))),
    }[case]
    compile_and_compare(lambda x, *a: fn(x, *a) + 1, x, *args, kernels=1)


def test_index_sizes_one_and_zero():
    x = torch.randn(5, 3)
    compile_and_compare(lambda x, i: x[i] + 1, x, torch.tensor([3]), kernels=1)
    compile_and_compare(lambda x, i: x[i] + 1, x, torch.zeros(0, dtype=torch.long))
    compile_and_compare(lambda x, i: torch.gather(x, 1, i), x, torch.zeros(5, 0, dtype=torch.long))


def test_bool_and_byte_indices_fall_back_with_a_reason():
    lowering = Lowering(torch.fx.GraphModule({}, torch.fx.Graph()), [])  # (an empty graph: a rule called alone)
    x = lowering.graph.input(0, TensorType((4, 3), torch.float32, CPU), (3, 1))
    for dtype in (torch.bool, torch.uint8):
        mask = lowering.graph.input(1, TensorType((4,), dtype, CPU), (1,))
        with pytest.raises(Unsupported, match="boolean mask"):
            rules_index._index(lowering, x, [mask])


# --- gradients (the backward's scatters may fall back; they must be right) -----------------------

def test_gradients_through_each_op():
    idx = torch.tensor([[1, 4, 4], [0, 2, 4]])
    _check_grad(lambda w, i: F.embedding(i, w) * 2, torch.randn(5, 3), idx)
    _check_grad(lambda x, i: torch.index_select(x, 1, i).sin(), torch.randn(3, 5), idx[0])
    _check_grad(lambda x, i: torch.gather(x, 1, i) * 3, torch.randn(2, 5), idx)
    _check_grad(lambda x, i: x[:, i] + 1, torch.randn(2, 5, 2), idx)


@pytest.mark.parametrize("padding_idx", [None, 2])
def test_embedding_backward_is_pytorchs_kernel_with_its_reason(padding_idx):
    # Kept whole (backend.LIBRARY_WHOLE): its decomposition's index_put serializes repeated ids.
    # Many repeats of a few ids, as BERT's token types; the padding row's gradient stays zero.
    idx = torch.tensor([[2, 2, 2, 0, 2], [2, 1, 2, 2, 4]])
    _check_grad(lambda w, i: F.embedding(i, w, padding_idx=padding_idx).sin(), torch.randn(6, 3), idx)
    backward = minicomp.reports()[-1]
    assert backward.graph.endswith("_backward"), backward.graph
    ops = [f.op for f in backward.fallbacks]
    assert ops == ["embedding_dense_backward.default"], backward.summary()
    assert "repeated ids" in backward.fallbacks[0].reason


# --- fusion --------------------------------------------------------------------------------------

def test_gpt2_token_and_position_embeddings_with_layer_norm_are_one_kernel():
    def embed(ids, pos, wte, wpe, g, b):
        return F.layer_norm(F.embedding(ids, wte) + F.embedding(pos, wpe), (wte.shape[1],), g, b)
    ids, pos = torch.randint(0, 50, (2, 8)), torch.arange(8).expand(2, 8)
    args = (torch.randn(50, 16), torch.randn(8, 16), torch.randn(16), torch.randn(16))
    compile_and_compare(embed, ids, pos, *args, kernels=1)


def test_bert_embeddings_with_layer_norm_looped_over_long_rows(monkeypatch):
    """A row longer than a block: the index is loaded once per row, the rows per reduction block."""
    from minicomp.templates import reduction
    monkeypatch.setattr(reduction, "persistent_limit", lambda target: 8)

    def bert(ids, types, we, pe, te, g, b):
        e = F.embedding(ids, we) + pe[: ids.shape[1]] + F.embedding(types, te)
        return F.layer_norm(e, (we.shape[1],), g, b)
    args = (torch.randint(0, 30, (1, 3)), torch.randint(0, 2, (1, 3)), torch.randn(30, 20), torch.randn(8, 20),
            torch.randn(2, 20), torch.randn(20), torch.randn(20))
    report = compile_and_compare(bert, *args, kernels=1)
    assert report.kernels[0].template == "reduction looped"


def test_index_varying_along_the_reduction(monkeypatch):
    x, idx = torch.randn(3, 20), torch.randint(-20, 20, (3, 24))
    compile_and_compare(lambda x, i: x.gather(1, i % 20).sum(1), x, idx, kernels=1)
    from minicomp.templates import reduction
    monkeypatch.setattr(reduction, "persistent_limit", lambda target: 8)
    torch._dynamo.reset()
    report = compile_and_compare(lambda x, i: x.gather(1, i % 20).amax(1), x, idx, kernels=1)
    assert report.kernels[0].template == "reduction looped"


def test_gather_at_a_rows_argmax_joins_the_reduction():
    compile_and_compare(lambda x: x.gather(1, x.argmax(1, keepdim=True)) - x.mean(1, keepdim=True),
                        torch.randn(8, 33), kernels=1)


def test_index_producers_and_pointwise_data_producers_fuse():
    x, idx = torch.randn(10, 3), torch.randint(-10, 10, (7,))
    compile_and_compare(lambda x, i: x[(i * 3) % 10], x, idx, kernels=1)
    compile_and_compare(lambda x, i: (x.to(torch.float16) * 2)[i], x, idx % 10, kernels=1)
    compile_and_compare(lambda x, i, j: x[i][j] + 1, x, idx, torch.randint(0, 7, (2, 4)), kernels=1)  # nested


@pytest.mark.parametrize("case", ["tiled", "cat", "pad", "padded_data", "two_tables", "index_transposed"])
def test_gathers_in_other_templates_and_masked_views(case):
    w, x = torch.randn(9, 4), torch.randn(4, 5)
    i = torch.randint(-9, 9, (5,))
    fn, args = {
        "tiled": (lambda x, w, i: x.t() + w[i], (x, w, i)),                     # a 2-D tile
        "cat": (lambda x, w, i: torch.cat([x.t(), w[i]], 0) * 2, (x, w, i)),   # gather in a masked piece
        "pad": (lambda w, i: F.pad(w[i], (1, 2), value=3.0) + 1, (w, i)),
        "padded_data": (lambda w, i: F.pad(w, (0, 0, 1, 1), value=3.0)[i] - 1, (w, i)),
        "two_tables": (lambda w, v, i: (F.embedding(i, w), F.embedding(i, v)), (w, -w, i % 9)),  # one index load
        "index_transposed": (lambda w, i: w[i.view(1, 5).t()], (w, i)),
    }[case]
    compile_and_compare(fn, *args, kernels=1)


def test_gathered_offsets_follow_the_kernels_index_dtype(monkeypatch):
    from minicomp.templates import emitter
    monkeypatch.setattr(emitter, "INT32_LIMIT", 64)  # every kernel here counts as large
    report = compile_and_compare(lambda w, i: F.embedding(i, w) + 1, torch.randn(10, 4), torch.tensor([[1, 9, 9]]),
                                 kernels=1)
    source = open(report.kernels[0].source_path).read()
    assert "index=int64" in source and ".to(tl.int64)" in source, source


def test_a_reduction_read_at_gathered_rows_is_not_fused():
    x, idx = torch.randn(10, 3), torch.randint(0, 10, (10,))  # the gather iterates the softmax's space
    report = compile_and_compare(lambda x, i: torch.softmax(x, -1)[i], x, idx, kernels=2)
    assert any("[indexing]" in d for d in report.decisions), report.summary()


# --- the IR ---------------------------------------------------------------------------------------

def _hand_built(index_shape=(2, 3), index_dtype=torch.int64, col=None, wrap=True):
    g = Graph()
    w = g.input(0, TensorType((10, 4), torch.float32, CPU), (4, 1))
    i = g.input(1, TensorType(index_shape, index_dtype, CPU), (3, 1))
    shape = (2, 3, 4)
    out = index_vars(shape)
    placed = g.view(i, shape, (Affine.of(out[0]), Affine.of(out[1])), kind="expand")
    j = Var("j0", 10)
    y = g.gather(w, [placed], (Affine.of(j), Affine.of(out[2]) if col is None else col), [j], wrap=[wrap])
    g.add("output", [y], None, spec=[("node", 0)])
    return g


def test_the_gather_node_prints_runs_and_verifies():
    g = _hand_built()
    verify(g)
    assert "gather    f32[2,3,4]       %0[j0, i2]  where j0 = %2 (+10 if < 0)" in str(g)
    w, idx = torch.randn(10, 4), torch.tensor([[1, -1, 9], [0, 0, 3]])
    (out,) = interpreter.run(g, [w, idx])
    torch.testing.assert_close(out, F.embedding(idx % 10, w))
    with pytest.raises(IndexError):
        interpreter.run(g, [w, torch.tensor([[1, 10, 9], [0, 0, 3]])])
    unwrapped = _hand_built(wrap=False)  # embedding's gather: a negative index is out of range
    assert "where j0 = %2\n" in str(unwrapped)
    with pytest.raises(IndexError):
        interpreter.run(unwrapped, [w, idx])


@pytest.mark.parametrize("make,reason", [
    (lambda: _hand_built(index_dtype=torch.float32), "not an integer tensor"),
    (lambda: _hand_built(col=Affine.of(Var("i2", 4)) + 1), "leaves"),
    (lambda: _hand_built(col=Affine.of(Var("k", 4))), "unknown variables"),
])
def test_the_verifier_rejects_bad_gathers(make, reason):
    with pytest.raises(VerificationError, match=reason):
        verify(make())


# --- translation validation feeds inputs the graph accepts ---------------------------------------

@pytest.mark.parametrize("fn,args", [
    (lambda w, i: F.embedding(i, w) + 1, (torch.randn(10, 4), torch.randint(0, 10, (3, 2)))),
    (lambda x, i: x.gather(1, i), (torch.randn(4, 5), torch.randint(0, 5, (4, 2)))),
    (lambda a, b: a // b + a % b, (torch.randint(-9, 9, (16,)), torch.tensor([1, 2, 3, -1] * 4))),
    (lambda x, y: x[(y * 10).long()], (torch.randn(3, 2), torch.rand(5) * 0.29)),  # an index from floats
], ids=["embedding", "gather", "floordiv", "float_index"])
def test_validation_draws_inputs_the_graph_accepts(monkeypatch, fn, args):
    monkeypatch.setenv("MINICOMP_VERIFY", "1")
    compile_and_compare(fn, *args)


@pytest.mark.parametrize("dim", [0, 1, 2])
def test_scatter_of_a_value_with_one_index_per_position(dim):
    # one select fused with its consumer; an index shorter than the data outside the scattered dim
    # leaves the rest of the data as it was
    x = torch.randn(5, 6, 7)
    shape = [4, 5, 3]
    shape[dim] = 1
    idx = torch.randint(0, x.shape[dim], shape)
    compile_and_compare(lambda x, i: torch.scatter(x, dim, i, 2.5) * 3, x, idx, kernels=1)
    # a negative index raises, as in eager (tests/test_index_bounds.py: every op's bounds)
    with pytest.raises(IndexError):
        minicomp.compile(lambda x, i: torch.scatter(x, dim, i, -1.0))(x, idx - x.shape[dim])


@pytest.mark.parametrize("dtype, value", [(torch.int64, 7), (torch.bool, True), (torch.float16, -0.5)])
def test_scatter_of_a_value_into_other_dtypes(dtype, value):
    x = (torch.randn(6, 9) * 4).to(dtype)
    idx = torch.randint(0, 9, (6, 1))
    compile_and_compare(lambda x, i: torch.scatter(x, 1, i, value), x, idx, kernels=1)


def test_scatter_of_several_indices_per_position_stays_in_pytorch():
    x, idx = torch.randn(4, 8), torch.randint(0, 8, (4, 3))
    report = compile_and_compare(lambda x, i: torch.scatter(x, 1, i, 1.0) + 1, x, idx, fallbacks=1)
    assert "several indices per position" in report.fallbacks[0].reason


def test_cross_entropy_gradient_has_no_scatter_fallback():
    # nll_loss's backward writes -1 at each row's target (scatter of a value): native now, fused
    logits = torch.randn(12, 37, requires_grad=True)
    target = torch.randint(0, 37, (12,))
    target[3] = -100  # ignored

    def fn(z, t):
        return F.cross_entropy(z, t, ignore_index=-100)
    expected_in = logits.detach().clone().requires_grad_()
    fn(expected_in, target).backward()
    before = minicomp.report()
    actual_in = logits.detach().clone().requires_grad_()
    torch._dynamo.reset()
    minicomp.compile(fn)(actual_in, target).backward()
    torch.testing.assert_close(actual_in.grad, expected_in.grad)
    fallbacks = [f.op for r in minicomp.reports_since(before) for f in r.fallbacks]
    assert not [op for op in fallbacks if "scatter" in op], fallbacks
