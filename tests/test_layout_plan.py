"""The layout_plan pass: buffers around convolutions stored channels-last, kernels that walk them in
memory order, graph inputs and results in the user's and eager's layouts, no conversion between layers."""
from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

import minicomp
from tests.utils import compile_and_compare, layout_copies

CL = torch.channels_last


@pytest.fixture(autouse=True)
def _convolutions_as_externs(monkeypatch):
    """These tests are about the convolutions cuDNN/oneDNN run (conv_lowering's MINICOMP_CONV may
    rewrite some into IR; here none)."""
    monkeypatch.setenv("MINICOMP_CONV", "cudnn")


class Block(torch.nn.Module):
    """conv -> bn -> relu -> conv -> add (a residual block), odd channel counts and sizes."""

    def __init__(self, cin=3, c=5, groups=1):
        super().__init__()
        self.c1 = torch.nn.Conv2d(cin, c, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(c)
        self.c2 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False, groups=groups)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.5, 2)
            self.bn.weight.uniform_(0.5, 1.5)
            self.bn.bias.uniform_(-1, 1)

    def forward(self, x):
        y = torch.relu(self.bn(self.c1(x)))
        return self.c2(y) + y


class Net(torch.nn.Module):
    """Strided and grouped convolutions, max and adaptive average pooling, a classifier head."""

    def __init__(self):
        super().__init__()
        self.block = Block(3, 6, groups=3)
        self.down = torch.nn.Conv2d(6, 7, 3, stride=2, padding=1)
        self.pool = torch.nn.MaxPool2d(2, ceil_mode=True)
        self.fc = torch.nn.Linear(7, 4)

    def forward(self, x):
        y = self.pool(torch.nn.functional.silu(self.down(self.block(x))))
        return self.fc(torch.nn.functional.adaptive_avg_pool2d(y, 1).flatten(1)), y


@pytest.fixture
def copies(monkeypatch) -> list[tuple[str, tuple[int, ...]]]:
    """The layout conversions the wrappers make, as (helper, shape): fallback inputs copied to the
    strides they are handed with (``eager_strided``) and fallback results copied to the planned strides
    (``ensure_layout``)."""
    return layout_copies(monkeypatch, "eager_strided", "ensure_layout")


def _shapes(copies, helper: str) -> list[tuple[int, ...]]:
    return [shape for name, shape in copies if name == helper]


def _program_strides(dump) -> dict[str, tuple]:
    """Every 4-D buffer of the dumped program -> its strides."""
    text = next(dump.glob("*/program.txt")).read_text()
    found = re.findall(r"^(?:alloc|extern)\s+(\w+) \w+\[(\d+),(\d+),(\d+),(\d+)\] strides=\(([\d, ]+)\)", text, re.M)
    return {name: tuple(int(s) for s in strides.split(",")) for name, *_, strides in found}


def _layout_copies(rep) -> list[tuple[int, ...]]:
    """The shapes of the graph inputs the layout plan's copy kernels convert to channels-last (launched
    alone or as stages of a combo)."""
    shapes = [re.fullmatch(r"k\d+_copy_\w+?_(\d+(?:x\d+)*)", name) for k in rep.kernels for name in (k.name, *k.stages)]
    return sorted(tuple(int(n) for n in m.group(1).split("x")) for m in shapes if m)


def _check(model, x, tmp_path):
    with torch.no_grad():
        expected = model(x)
        actual = minicomp.compile(model, dump_dir=str(tmp_path))(x)
    expected = expected if isinstance(expected, tuple) else (expected,)
    actual = actual if isinstance(actual, tuple) else (actual,)
    for e, a in zip(expected, actual):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-4)
        assert a.stride() == e.stride(), (a.stride(), e.stride())
    rep = minicomp.report()
    assert rep.whole_graph_fallback is None
    return rep


@pytest.mark.parametrize("fmt", [torch.contiguous_format, CL])
def test_block_nhwc_inside_user_layout_outside(fmt, tmp_path, copies):
    model = Block().eval()
    x = torch.randn(2, 3, 6, 7).contiguous(memory_format=fmt)
    rep = _check(model, x, tmp_path)
    assert any(d.startswith("layout: channels-last") for d in rep.decisions), rep.decisions
    strides = _program_strides(tmp_path)
    nhwc = (210, 1, 35, 5)  # [2, 5, 6, 7] channels-last
    assert list(strides.values()).count(nhwc) >= 3, strides  # both convolutions' results, bn-relu's
    # weights are graph inputs (no freeze): copied by a kernel once per call; the NCHW input once
    expected_inputs = [(5, 3, 3, 3), (5, 5, 3, 3)] + ([(2, 3, 6, 7)] if fmt is torch.contiguous_format else [])
    assert _layout_copies(rep) == sorted(expected_inputs), rep.kernels
    assert _shapes(copies, "eager_strided") == [], copies
    assert _shapes(copies, "ensure_layout") == [], "a convolution returned another layout than planned"


def test_net_odd_sizes_pooling_and_head(tmp_path, copies):
    model = Net().eval()
    x = torch.randn(3, 3, 9, 11)
    rep = _check(model, x, tmp_path)
    assert _shapes(copies, "ensure_layout") == []
    assert any("kernel(s) walk their buffers in memory order" in d for d in rep.decisions)
    assert _layout_copies(rep) == [(3, 3, 9, 11), (6, 2, 3, 3), (6, 3, 3, 3), (7, 6, 3, 3)]
    assert _shapes(copies, "eager_strided") == []


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("pool", [torch.nn.MaxPool2d(3, 2, 1), torch.nn.AvgPool2d(2)])
def test_a_pooled_buffer_between_convolutions_is_stored_nhwc(pool, batch, tmp_path, copies):
    """ResNet's stem: conv -> bn -> relu -> max pool -> conv (1x1, as in a bottleneck). The pooling
    kernel's result (its window kept as a trailing size-1 dim) is stored channels-last and walked in
    memory order, so the next convolution reads it as it is: nothing converted but the graph inputs,
    by their copy kernels. At batch 1 the view handed to the convolution has the batch stride eager's
    NHWC tensor has (PyTorch reads the memory format off it; another makes the library return NCHW)."""
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 6, 3, 2, 1, bias=False), torch.nn.BatchNorm2d(6), torch.nn.ReLU(),
                                pool, torch.nn.Conv2d(6, 5, 1)).eval()
    x = torch.randn(batch, 3, 13, 11)
    rep = _check(model, x, tmp_path)
    assert copies == [], copies
    assert _layout_copies(rep) == [(batch, 3, 13, 11), (6, 3, 3, 3)], rep.kernels
    text = next(tmp_path.glob("*/program.txt")).read_text()
    pooled = re.search(rf"^alloc\s+\w+ f32\[{batch},6,(\d+),(\d+)(,1)?\] strides=\(([\d, ]+)\)", text, re.M)
    h, w = int(pooled.group(1)), int(pooled.group(2))
    nhwc = (h * w * 6, 1, w * 6, 6)
    assert tuple(map(int, pooled.group(4).split(","))) == nhwc + ((1,) if pooled.group(3) else ()), text
    if pooled.group(3):  # the 5-D buffer is handed to the convolution as a 4-D view
        assert f"({batch}, 6, {h}, {w}), {nhwc}" in text, text


def test_a_pooling_window_loads_per_channel_parameters_once_per_output():
    """Scheduled for the H200 (nothing runs): batch norm and relu fused into a padded max pool read
    the input per tap under the padding mask, but the per-channel parameters, always in bounds, need
    no mask and are loaded once per output, outside the taps."""
    from minicomp.ir.kernel import Load
    from tests.test_target import _scheduled
    from tests.utils import H200
    bn = torch.nn.BatchNorm2d(8).eval()

    def fn(x):
        return torch.nn.functional.max_pool2d(torch.relu(bn(x)), 3, 2, 1)
    with torch.no_grad():
        _, (kernel,) = _scheduled(fn, [torch.randn(2, 8, 9, 9)], H200)
    outer = [s for p in kernel.phases for s in p.outer if isinstance(s, Load)]
    inner = [s for p in kernel.phases for s in p.inner if isinstance(s, Load)]
    assert len(outer) == 4 and all(not s.mask for s in outer), kernel.phases
    assert len(inner) == 1 and inner[0].mask, kernel.phases


def _stem():
    """ResNet's stem: conv 7x7/2 -> bn -> relu -> max pool 3x3/2, whose pooled result is the graph's
    (NCHW, as eager returns it)."""
    bn = torch.nn.BatchNorm2d(8)
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1), bn.running_var.uniform_(0.5, 2)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 7, 2, 3, bias=False), bn, torch.nn.ReLU(),
                               torch.nn.MaxPool2d(3, 2, 1)).eval()


def test_a_pool_of_a_channels_last_buffer_walks_its_channels_fastest():
    """Scheduled for the H200 (nothing runs): the stem's bn + relu + pool reads the channels-last
    convolution result through its window and stores an NCHW graph result. It walks N, H, W, C (C
    fastest), so every tap's load is a contiguous run of channels (walking N, C, H, W, each lane's load
    was C floats from its neighbour's: 0.35 ms at batch 32 on the H200, Inductor 0.10). On the CPU the
    same walk gives eager's values and indices."""
    from tests.test_target import _scheduled
    from tests.utils import H200
    model = _stem()
    with torch.no_grad():
        graph, kernels = _scheduled(model, [torch.randn(2, 3, 32, 32)], H200)
    (pool,) = [k for k in kernels if k.schedule.template == "window"]
    (group,) = [g for g in graph.groups if g.axes]
    assert group.order == (0, 2, 3, 1), group
    (tap,) = [s for p in pool.phases for s in p.inner if type(s).__name__ == "Load"]
    assert re.search(r"(^|\+ )\(xindex % 8\)", str(tap.index)), tap.index  # the channel, unit stride
    x = torch.randn(2, 3, 29, 31)
    with torch.no_grad():
        compile_and_compare(model, x, fallbacks=1)  # the convolution
        compile_and_compare(lambda x: F.max_pool2d(model[:3](x), 3, 2, 1, return_indices=True), x, fallbacks=1)


def test_channels_last_input_converts_nothing_but_weights(tmp_path, copies):
    model = Net().eval()
    x = torch.randn(2, 3, 8, 8).contiguous(memory_format=CL)
    rep = _check(model, x, tmp_path)
    assert _layout_copies(rep) == [(6, 2, 3, 3), (6, 3, 3, 3), (7, 6, 3, 3)], rep.kernels
    assert _shapes(copies, "eager_strided") == []


def test_flatten_of_a_planned_buffer_returned(tmp_path):
    """A graph result that views a buffer through a flatten NHWC strides cannot express: that buffer
    stays NCHW."""
    conv = torch.nn.Conv2d(3, 4, 3).eval()

    def fn(x):
        y = torch.relu(conv(x))
        return conv(x).sigmoid() * 2, y.flatten(1)
    x = torch.randn(2, 3, 5, 6)
    with torch.no_grad():
        _check(fn, x, tmp_path)


def test_graph_without_convolution_unchanged(tmp_path):
    def fn(x):
        return torch.relu(x * 2).sum(1, keepdim=True) + x
    x = torch.randn(2, 3, 4, 5)
    rep = _check(fn, x, tmp_path)
    assert not any(d.startswith("layout") for d in rep.decisions)
    assert all(s == (60, 20, 5, 1) for s in _program_strides(tmp_path).values() if len(s) == 4)


def test_bf16_block(tmp_path):
    model = Block().eval().to(torch.bfloat16)
    x = torch.randn(2, 3, 6, 7, dtype=torch.bfloat16)
    with torch.no_grad():
        expected = model(x)
        actual = minicomp.compile(model, dump_dir=str(tmp_path))(x)
    torch.testing.assert_close(actual, expected, rtol=2e-2, atol=2e-2)
    assert actual.stride() == expected.stride()


def test_kernels_walk_nhwc_buffers_in_memory_order(tmp_path):
    """bn-relu over the NHWC convolution result reads and writes it at the flat index itself (coalesced);
    the last kernel, which writes the NCHW result from NHWC buffers, is a tile with y along C (reads)
    and x along W (writes)."""
    _check(Block().eval(), torch.randn(2, 3, 6, 7), tmp_path)
    (dump,) = tmp_path.iterdir()
    first = next(dump.glob("*k0_*.py")).read_text()  # a launch of its own or a combo's first stage
    assert "tl.load(in_ptr0 + (xindex)" in first and "tl.store(out_ptr0 + (xindex)" in first, first
    last = next(dump.glob("k1_*.py")).read_text()
    assert "(yindex % 5) + 35*(yindex // 5) + 5*xindex" in last, last  # read: C = yindex % 5 at unit stride
    assert "+ xindex), " in last.split("tl.store")[1], last                 # write: W = xindex at unit stride


@pytest.mark.parametrize("fmt", [torch.contiguous_format, CL])
def test_results_that_view_planned_buffers_have_eager_strides(fmt, tmp_path):
    """A slice and a permute of an intermediate between two convolutions, returned: eager's strides."""
    c1, c2 = torch.nn.Conv2d(3, 5, 3, padding=1).eval(), torch.nn.Conv2d(5, 4, 1).eval()

    def fn(x):
        y = torch.relu(c1(x))
        return c2(y), y[:, 1:4], y.permute(0, 2, 3, 1)
    _check(fn, torch.randn(2, 3, 5, 6).contiguous(memory_format=fmt), tmp_path)


class ConvNeXtStage(torch.nn.Module):
    """ConvNeXt's stem and block: layer norms over channels computed in (N, H, W, C) order through
    permutes (timm's LayerNorm2d and its block's norm before the MLP), between convolutions."""

    def __init__(self, c=6):
        super().__init__()
        self.stem, self.stem_norm = torch.nn.Conv2d(3, c, 2, 2), torch.nn.LayerNorm(c)
        self.dw, self.norm = torch.nn.Conv2d(c, c, 3, padding=1, groups=c), torch.nn.LayerNorm(c)
        self.fc = torch.nn.Linear(c, c)
        self.down = torch.nn.Conv2d(c, 5, 2, 2)

    def forward(self, x):
        x = self.stem_norm(self.stem(x).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        y = self.fc(self.norm(self.dw(x).permute(0, 2, 3, 1))).permute(0, 3, 1, 2)
        return self.down(x + y)


def test_a_buffer_permuted_before_a_convolution_is_stored_nhwc_through_the_permute(tmp_path, copies):
    """The stem's layer norm writes an (N, H, W, C) buffer the next convolution reads permuted to
    (N, C, H, W): stored row-major, which is channels-last for that view, so no convolution's input
    is converted (the plan gave it channels-last strides of its own (N, H, W, C) shape before: a copy
    before the convolution and stores strided by H)."""
    rep = _check(ConvNeXtStage().eval(), torch.randn(2, 3, 10, 14), tmp_path)
    assert _shapes(copies, "eager_strided") == [] and _shapes(copies, "ensure_layout") == [], copies
    strides = _program_strides(tmp_path)
    assert (210, 42, 6, 1) in strides.values(), strides  # [2, 5, 7, 6] (N, H, W, C) row-major
    assert (210, 1, 42, 6) in strides.values(), strides  # the depthwise result: NCHW channels-last
    assert all(k.template != "tiled" for k in rep.kernels if "copy" not in k.name), rep.kernels


class Depthwise(torch.nn.Module):
    """MobileNet's pattern: 1x1 expand, depthwise 3x3 (stride 2), 1x1 project, with batch norms."""

    def __init__(self, c=8):
        super().__init__()
        self.expand = torch.nn.Conv2d(c, 4 * c, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(4 * c)
        self.dw = torch.nn.Conv2d(4 * c, 4 * c, 3, stride=2, padding=1, groups=4 * c, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(4 * c)
        self.project = torch.nn.Conv2d(4 * c, c, 1)

    def forward(self, x):
        y = torch.nn.functional.hardswish(self.bn1(self.expand(x)))
        return self.project(torch.nn.functional.hardswish(self.bn2(self.dw(y))))


@pytest.mark.gpu(reason="cuDNN's result layout: needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("make", [Net, Depthwise])
@pytest.mark.parametrize("freeze", [False, True])
def test_cudnn_returns_the_planned_layout(make, dtype, freeze, copies, monkeypatch):
    """On the GPU: cuDNN returns channels-last for every planned convolution (no ensure_layout copy),
    results match eager with its strides; under freeze no weight is converted per call."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)  # fp32 compared at fp32 precision
    model = make().eval().cuda().to(dtype)
    x = torch.randn(2, 3 if make is Net else 8, 9, 11, device="cuda", dtype=dtype)
    with torch.no_grad():
        expected = model(x)
        actual = minicomp.compile(model, freeze=freeze)(x)
    expected = expected if isinstance(expected, tuple) else (expected,)
    actual = actual if isinstance(actual, tuple) else (actual,)
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-3, atol=1e-3)
    for e, a in zip(expected, actual):
        torch.testing.assert_close(a, e, **tol)
        assert a.stride() == e.stride()
    assert _shapes(copies, "ensure_layout") == [], copies
    if freeze:
        assert all(s == tuple(x.shape) for s in _shapes(copies, "eager_strided")), copies  # only the NCHW input


def test_one_convolution_among_many_nodes_stays_nchw_on_the_gpu():
    """Scheduled for the H200 (nothing runs): a patch-embedding convolution followed by a long chain
    (a transformer: >= NODES_PER_CONV nodes per convolution) keeps NCHW, as Inductor decides; the same
    convolution followed by a short chain is planned channels-last; on the CPU both are."""
    from minicomp.ir.target import INTERPRETER
    from minicomp.passes.layout_plan import NODES_PER_CONV
    from tests.test_target import _scheduled
    from tests.utils import H200

    def net(steps):
        def fn(x, w):
            y = torch.nn.functional.conv2d(x, w, stride=4).flatten(2).transpose(1, 2)
            for _ in range(steps):
                y = torch.tanh(y) * 0.5 + y
            return y
        return fn
    args = [torch.randn(2, 3, 16, 16), torch.randn(8, 3, 4, 4)]
    for steps, nchw in ((NODES_PER_CONV // 3, True), (3, False)):
        graph, _ = _scheduled(net(steps), args, H200)
        kept = [d for d in graph.decisions if d.startswith("layout: NCHW kept")]
        assert bool(kept) == nchw and (not nchw or "NODES_PER_CONV" in kept[0]), graph.decisions
        graph, _ = _scheduled(net(steps), args, INTERPRETER)
        assert not any(d.startswith("layout: NCHW kept") for d in graph.decisions), graph.decisions


def _split_attention(b, c, radix=2):
    """ResNeSt's split attention after a convolution into radix x c channels and its batch norm (inference):
    the sum over the radix, its mean, two 1x1 convolutions, a softmax over the radix and the weighted sum,
    into a 1x1 convolution."""
    def fn(x0, wc, w1, w2, w3, norm):
        stats = norm[0].detach(), norm[1].detach().exp()  # (running statistics take no gradient)
        x = F.batch_norm(F.conv2d(x0, wc, padding=1), *stats, norm[2], norm[3]).relu()
        xr = x.reshape(b, radix, c, *x.shape[2:])
        a = F.conv2d(F.conv2d(xr.sum(1).mean((2, 3), keepdim=True), w1).relu(), w2)
        a = a.view(b, 1, radix, -1).transpose(1, 2).softmax(1).reshape(b, radix, c, 1, 1)
        return F.conv2d((xr * a).sum(1), w3)
    return fn


def test_a_sum_over_split_channels_is_stored_channels_last_and_walked_in_memory_order():
    """Scheduled for the H200 (nothing runs), bf16: ResNeSt's sums over its radix (``x.reshape(B, 2, C, H,
    W).sum(1)`` of a channels-last buffer) store their [B, 1, C, H, W] results channels-last and walk them
    in memory order, so the loads run along C; the first also stores the batch norm's [B, 2, C, H, W]
    result the weighted sum reads again, as the NHWC [B, 2 * C, H, W] buffer it views (C fastest, then the
    radix). Stored row-major they read across the buffer, 2 bytes per 128-byte row at batch 32 (0.27 ms a
    kernel); with the 5-D store row-major, they wrote so (0.13 ms for the first)."""
    from tests.test_target import _scheduled
    from tests.utils import H200
    b, c, hw = 2, 64, 6
    args = [torch.randn(b, 16, hw, hw), torch.randn(2 * c, 16, 3, 3), torch.randn(8, c, 1, 1),
            torch.randn(2 * c, 8, 1, 1), torch.randn(c, c, 1, 1), torch.randn(4, 2 * c)]
    with torch.no_grad():
        graph, kernels = _scheduled(_split_attention(b, c), [a.bfloat16() for a in args], H200)
    sums = [g for g in graph.groups if g.kind == "reduction" and [g.shape[a] for a in g.axes] == [2]
            and len(g.shape) == 5]
    assert len(sums) == 2, graph.groups  # the sum the mean reads, and the weighted sum
    for g in sums:
        (store,) = [m for m in g.stores if m.shape[1] == 1]
        assert store.shape == (b, 1, c, hw, hw) and graph.layouts[store][2] == 1, (store, graph.layouts.get(store))
        assert g.order and g.order[-1] == 2, g.order  # channels fastest
    (split,) = [m for m in sums[0].stores if m.shape[1] == 2]
    assert graph.layouts[split] == (2 * c * hw * hw, c, 1, 2 * c * hw, 2 * c), graph.layouts[split]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_sum_over_split_channels_stored_channels_last_matches_eager(dtype):
    """The same layout in the interpreter (the CPU plans channels-last too), forward and gradients; in bf16
    with the [B, 2, C, H, W] store."""
    from tests.utils import compare_gradients
    b, c = 2, 8
    args = [torch.randn(b, 4, 5, 6), torch.randn(2 * c, 4, 3, 3), torch.randn(4, c, 1, 1), torch.randn(2 * c, 4, 1, 1),
            torch.randn(c, c, 1, 1), torch.randn(4, 2 * c)]
    args = [a.to(dtype) for a in args]
    report = compile_and_compare(_split_attention(b, c), *args, fallbacks=None)
    assert any("walk their buffers in memory order" in d for d in report.decisions), report.decisions
    compare_gradients(_split_attention(b, c), *args)


# --- reductions over channels-last buffers: scheduled by memory order -------------------------------

def _h200_reduction_schedules(fn, *args):
    from tests.test_target import _scheduled
    from tests.utils import H200
    with torch.no_grad():
        _, kernels = _scheduled(fn, list(args), H200)
    return [k.schedule for k in kernels if k.schedule.template == "reduction"]


def test_a_channels_last_pooling_is_a_column_reduction_on_the_gpu():
    """Scheduled for the H200 (nothing runs): a mean over H, W of a buffer the layout plan stores
    NHWC reads C neighbouring outputs per pixel, so it takes the column tiles (up to COLUMN_TILE
    outputs per program, for these few outputs narrowed to runs of MIN_COLUMN_RUN_BYTES) as x.sum(0)
    does; the same mean of an NCHW input stays one row per output; a sum over C of an NHWC input is a
    row reduction in memory although C is not the last dim."""
    from minicomp.templates.reduction import COLUMN_TILE, MIN_COLUMN_RUN_BYTES

    def column_tile(s):
        return 1 < s.blocks["XBLOCK"] <= COLUMN_TILE and s.blocks["XBLOCK"] * 4 >= MIN_COLUMN_RUN_BYTES
    x, w = torch.randn(4, 8, 10, 10), torch.randn(64, 8, 3, 3)
    (pool,) = _h200_reduction_schedules(
        lambda x, w: torch.nn.functional.conv2d(x, w, padding=1).relu().mean((2, 3)), x, w)
    assert column_tile(pool), pool
    (row,) = _h200_reduction_schedules(lambda x: x.relu().mean((2, 3)), torch.randn(4, 64, 10, 10))
    assert row.blocks["RBLOCK"] == 128 and row.persistent, row
    nhwc = torch.randn(4, 64, 10, 10).contiguous(memory_format=torch.channels_last)
    (over_c,) = _h200_reduction_schedules(lambda x: x.relu().sum(1), nhwc)
    assert over_c.blocks["RBLOCK"] == 64 and over_c.persistent, over_c
    (over_hw,) = _h200_reduction_schedules(lambda x: x.relu().sum((2, 3)), nhwc)
    assert column_tile(over_hw), over_hw


@pytest.mark.parametrize("dims", [(2, 3), (1,), (1, 3)])
def test_channels_last_reductions_with_the_gpu_schedule_match_eager(dims, monkeypatch):
    """The H200's blocks (column tiles where memory says so, looped over the reduced elements) run
    in the interpreter and give eager's values, for an NHWC input reduced over H, W, over C and over
    C, W."""
    from minicomp.templates import reduction
    from tests.utils import H200
    choose = reduction.reduction_schedule
    monkeypatch.setattr(reduction, "reduction_schedule", lambda g, target, layouts=None: choose(g, H200, layouts))
    x = torch.randn(3, 70, 17, 19).contiguous(memory_format=torch.channels_last)  # 323 pixels: looped in 16-column tiles
    fn = lambda x: (x * 2).sigmoid().sum(dims)  # noqa: E731
    torch.testing.assert_close(minicomp.compile(fn)(x), fn(x))
    (kernel,) = minicomp.report().kernels
    assert kernel.template == ("reduction looped" if dims == (2, 3) else "reduction persistent"), kernel


def _squeeze_excite(x, w):
    y = torch.nn.functional.conv2d(x, w, padding=1).relu()
    return y * y.mean((2, 3), keepdim=True).sigmoid()


def test_a_channels_last_pooling_with_few_outputs_is_split_into_column_chunks(monkeypatch):
    """Squeeze-excite's pooling over H, W with few (N, C) outputs: scheduled for the H200, it is split
    along H into chunks placed before C, so the partial sums read C neighbours per pixel (column
    tiles as wide as C) with many programs (a RegNetY stage at batch 32 ran 24 programs, 97 us)."""
    from tests.utils import small_split_thresholds
    small_split_thresholds(monkeypatch)
    x, w = torch.randn(2, 3, 8, 8), torch.randn(16, 3, 3, 3)
    partial, total = _h200_reduction_schedules(_squeeze_excite, x, w)
    assert partial.blocks["XBLOCK"] == 16 and partial.blocks["RBLOCK"] == 8, partial  # 16 channels a pixel, 8 in W


def test_split_channels_last_pooling_with_the_gpu_schedule_matches_eager(monkeypatch):
    """The split pooling's kernels with the H200's blocks, run in the interpreter: eager's values,
    for channel counts above and below a column tile and H not a power of two."""
    from minicomp.templates import reduction
    from tests.utils import H200, small_split_thresholds
    small_split_thresholds(monkeypatch)
    choose = reduction.reduction_schedule
    monkeypatch.setattr(reduction, "reduction_schedule", lambda g, target, layouts=None: choose(g, H200, layouts))
    for cout, side in ((70, 6), (5, 12)):
        x, w = torch.randn(2, 3, side, side + 1), torch.randn(cout, 3, 3, 3)
        torch._dynamo.reset()  # each size compiled as a graph of its own (not Dynamo's symbolic second)
        with torch.no_grad():
            torch.testing.assert_close(minicomp.compile(_squeeze_excite)(x, w), _squeeze_excite(x, w))
        assert any("partial reductions" in d for d in minicomp.report().decisions)


def test_a_pooled_vector_between_two_convolutions_compiles():
    """A convolution's pooled output as an ``[N, C]`` vector (plus a bias), viewed back to ``[N, C, 1, 1]``
    for the next convolution (Segformer's decode head): the 2-D buffer shares a kernel with the 4-D
    ones the layout plan gives faces; it has none to take (this raised IndexError and the whole graph
    ran in PyTorch)."""
    def f(x, w, w2, b):
        return F.conv2d((F.conv2d(x, w).mean((2, 3)) + b).view(2, 8, 1, 1), w2)
    args = torch.randn(2, 3, 6, 6), torch.randn(8, 3, 3, 3), torch.randn(8, 8, 1, 1), torch.randn(8)
    report = compile_and_compare(f, *args, fallbacks=2)  # the two convolutions: oneDNN on the CPU
    assert report.whole_graph_fallback is None, report.whole_graph_fallback


def test_a_training_forwards_results_are_walked_in_memory_order_on_the_gpu():
    """A training forward saves nearly every buffer for its backward: results, which keep eager's
    channels-last strides, so layout_plan plans no intermediate. Scheduled for the H200 (nothing runs),
    its kernels still walk those results in memory order (not N, C, H x W tiles over NHWC data: ResNet-50's
    batch-norm kernels ran at 15x their memory time), and the batch-norm statistics read C neighbours a
    pixel (column tiles), not one channel's pixels 64 values apart."""
    from tests.test_target import _scheduled
    from tests.utils import H200

    def fn(x, w, weight, bias, r):
        y = F.conv2d(x, w, padding=1)
        return y, torch.relu(F.batch_norm(y, None, None, weight, bias, training=True) + r)
    x = torch.randn(8, 16, 56, 56).contiguous(memory_format=CL)
    r = torch.randn(8, 64, 56, 56).contiguous(memory_format=CL)
    args = [x, torch.randn(64, 16, 3, 3), torch.rand(64) + 0.5, torch.randn(64), r]
    graph, kernels = _scheduled(fn, args, H200)
    assert [k.schedule.template for k in kernels if k.schedule.template in ("tiled", "pointwise")] == ["pointwise"]
    stats = [k.schedule for k in kernels if k.schedule.template == "reduction"]
    assert stats and all(s.blocks["XBLOCK"] > 1 for s in stats), stats
    assert any("walk their buffers in memory order" in d for d in graph.decisions), graph.decisions


def test_a_training_forward_over_channels_last_results_matches_eager():
    """The same forward, small, compiled with its backward and run (the interpreter): eager's outputs and
    every input's gradient."""
    from tests.utils import compare_gradients

    def fn(x, w, weight, bias, r):
        y = F.conv2d(x, w, padding=1)
        return y, torch.relu(F.batch_norm(y, None, None, weight, bias, training=True) + r)
    x = torch.randn(2, 3, 9, 7).contiguous(memory_format=CL)
    r = torch.randn(2, 6, 9, 7).contiguous(memory_format=CL)
    compare_gradients(fn, x, torch.randn(6, 3, 3, 3), torch.rand(6) + 0.5, torch.randn(6), r)

