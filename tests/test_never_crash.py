"""Never fail a user's model: an error while compiling or at the first run of a graph leaves the
graph in PyTorch (stage and error in the report, one warning); ``MINICOMP_STRICT=1`` raises a
``MinicompError`` instead. Fallback ops behave as in eager."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import minicomp
from minicomp.errors import MinicompError
from tests.utils import compile_and_compare, layout_copies


def _broken_launches(monkeypatch):
    """Every buffer allocation of generated code fails, as a launch error (a wrong-device pointer,
    OutOfResources) would at the first run; returns the count of attempts."""
    from minicomp.runtime import support
    calls = [0]

    def fail(*args, **kwargs):
        calls[0] += 1
        raise RuntimeError("simulated launch failure")
    monkeypatch.setattr(support, "empty", fail)
    return calls


def test_error_at_the_first_run_falls_back_once(monkeypatch):
    calls = _broken_launches(monkeypatch)
    fn = lambda x: torch.relu(x) * 2 + 1  # noqa: E731
    f = minicomp.compile(fn)
    x = torch.randn(4, 5)
    with pytest.warns(UserWarning, match="runs in PyTorch") as caught:
        torch.testing.assert_close(f(x), fn(x))
    assert len([w for w in caught if "runs in PyTorch" in str(w.message)]) == 1
    reason = minicomp.report().whole_graph_fallback
    assert reason.startswith("first run: RuntimeError: simulated launch failure"), reason
    assert calls[0] == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # later calls: no warning, no second attempt
        for _ in range(2):
            x = torch.randn(4, 5)
            torch.testing.assert_close(f(x), fn(x))
    assert calls[0] == 1


def test_strict_mode_raises_minicomp_error_at_the_first_run(monkeypatch):
    _broken_launches(monkeypatch)
    monkeypatch.setenv("MINICOMP_STRICT", "1")
    with pytest.raises(MinicompError, match="first run: RuntimeError: simulated launch failure"):
        minicomp.compile(lambda x: x * 3)(torch.randn(3))


def test_strict_mode_raises_minicomp_error_for_a_compile_failure(monkeypatch):
    from minicomp.graphs import options
    from minicomp.passes.manager import Pass

    def broken(graph):
        raise ValueError("simulated pass failure")
    monkeypatch.setattr(options, "PIPELINE", [Pass("fusion", broken) if p.name == "fusion" else p
                                              for p in options.PIPELINE])
    fn = lambda x: x.exp() + 1  # noqa: E731
    x = torch.randn(3)
    with pytest.warns(UserWarning, match="simulated pass failure"):
        torch.testing.assert_close(minicomp.compile(fn)(x), fn(x))
    assert minicomp.report().whole_graph_fallback.startswith("compile: ValueError: simulated pass failure")
    torch._dynamo.reset()
    monkeypatch.setenv("MINICOMP_STRICT", "1")
    with pytest.raises(MinicompError, match="simulated pass failure"):
        minicomp.compile(fn)(x)


def test_meta_device_inputs_run_in_pytorch():
    x = torch.randn(3, 4, device="meta")
    with pytest.warns(UserWarning, match="device meta"):
        out = minicomp.compile(lambda t: t.relu() + 1)(x)
    assert out.device.type == "meta" and out.shape == (3, 4)


def test_op_without_a_meta_kernel_falls_back_alone():
    # aten._transformer_encoder_layer_fwd (the eval fast path) has no meta kernel
    layer = torch.nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, batch_first=True).eval()
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        report = compile_and_compare(layer, x, fallbacks=None)
    assert report.whole_graph_fallback is None


@pytest.mark.parametrize("fn,make", [
    (lambda x: torch.relu(x) * 2, lambda: torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)),
    (lambda x: x.t() * 2, lambda: torch.randn(4, 6)),
    (lambda x: (x + 1).permute(2, 0, 1), lambda: torch.randn(3, 4, 5)),
    (lambda x: x.permute(2, 0, 1).exp(), lambda: torch.randn(3, 4, 5)),
])
def test_results_keep_eager_strides(fn, make):
    x = make()
    out, expected = minicomp.compile(fn)(x), fn(x)
    torch.testing.assert_close(out, expected)
    assert out.stride() == expected.stride()


@torch.library.custom_op("minicomp_test::strides_of", mutates_args=())
def strides_of(x: torch.Tensor) -> torch.Tensor:
    """A fallback op that sees its input's memory layout (as SDPA's kernels, which need aligned rows)."""
    return torch.tensor(x.stride(), dtype=torch.int64)


@strides_of.register_fake
def _(x):
    return torch.empty(x.dim(), dtype=torch.int64)


@torch.library.custom_op("minicomp_test::like_and_rows", mutates_args=())
def like_and_rows(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """A fallback op whose result is laid out like its input and which also returns a number (as the
    SDPA ops: the output in the query's layout, the sequence lengths)."""
    return torch.empty_like(x).copy_(x.exp()), x.shape[0]


@like_and_rows.register_fake
def _(x):
    return torch.empty_like(x), x.shape[0]


def test_a_fallback_result_keeps_its_traced_layout_beside_a_number(monkeypatch):
    """The traced layout of the op's result (transposed, as its input) is the one the kernels after it
    read: no copy to another layout per call (a GPT-2 block copied SDPA's output every call)."""
    copied = layout_copies(monkeypatch, "ensure_contiguous", "ensure_layout")

    def fn(x):
        y, rows = like_and_rows((x * 2).t())
        return y * rows + 1
    x = torch.randn(6, 5)
    torch.testing.assert_close(minicomp.compile(fn)(x), fn(x))
    assert [f.op for f in minicomp.report().fallbacks] == ["minicomp_test.like_and_rows.default"]
    assert copied == []


def test_a_kernel_result_a_fallback_op_reads_is_stored_as_eager_hands_it(monkeypatch):
    """``x.t() * 2`` is transposed in memory in eager (elementwise ops keep their input's layout): the
    kernel stores it so, and the fallback op gets it without a copy per call."""
    copied = layout_copies(monkeypatch, "eager_strided")

    def fn(x):
        return strides_of(x.t() * 2)
    x = torch.randn(4, 5)
    assert minicomp.compile(fn)(x).tolist() == fn(x).tolist() == [1, 5]
    assert copied == []


@pytest.mark.parametrize("fn", [
    lambda x: strides_of(F.pad(x * 2, (0, 3))[..., :5]),        # padded rows (gaps): kept
    lambda x: strides_of((x + 1).permute(1, 0).clone()),        # a clone eager makes contiguous
    lambda x: strides_of((x * 3).permute(1, 0)),                # a transposed result
    lambda x: strides_of((x - 1)[:, None, :].expand(4, 3, 5)),  # an expanded view (broadcast)
    # Swin's attention bias: a permuted result, padded to aligned rows, broadcast over the batch
    lambda x: strides_of(F.pad((x * 2).t().contiguous()[None], (0, 3))[..., :4].expand(6, 5, 4)),
])
def test_fallback_ops_get_eager_strides(fn):
    x = torch.randn(4, 5)
    expected, actual = fn(x), minicomp.compile(fn)(x)
    assert minicomp.report().fallbacks, minicomp.report().summary()
    assert actual.tolist() == expected.tolist()
