"""The same checks on a CUDA device (compiled Triton, not the interpreter); skipped without CUDA."""
import copy

import pytest
import torch
import torch.nn.functional as F

import minicomp
from tests.utils import assigned, compile_and_compare

pytestmark = pytest.mark.gpu


def rms_norm(x, w):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w


def _dev(*shapes, dtype=torch.float32):
    return [torch.randn(s, device="cuda", dtype=dtype) for s in shapes]


# (name, fn, inputs, expected kernel count)
FUSIONS = [
    ("relu_mul_add", lambda x: torch.relu(x) * 0.5 + 1, lambda: _dev((1000, 1024)), 1),
    ("gelu_bias", lambda x, b: F.gelu(x + b), lambda: _dev((512, 1024), (1024,), dtype=torch.bfloat16), 1),
    ("softmax", lambda x: F.softmax(x, -1), lambda: _dev((512, 4096), dtype=torch.bfloat16), 1),
    # online softmax: chunk statistics and their combination (one launch: the last partial program
    # combines), the normalized output
    ("softmax_long_rows", lambda x: F.softmax(x, -1), lambda: _dev((8, 100000), dtype=torch.bfloat16), 2),
    # the same three kernels as one pipelined launch once x is large (passes/pipelines.py)
    ("softmax_long_rows_pipelined", lambda x: F.softmax(x, -1), lambda: _dev((128, 262144), dtype=torch.bfloat16), 1),
    ("log_softmax_long_rows_pipelined", lambda x: F.log_softmax(x, -1), lambda: _dev((64, 131072)), 1),
    ("x_over_sum", lambda x: x / x.sum(-1, keepdim=True), lambda: _dev((512, 4096), dtype=torch.bfloat16), 1),
    ("layer_norm", lambda x, w, b: F.layer_norm(x, (4096,), w, b),
     lambda: _dev((512, 4096), (4096,), (4096,), dtype=torch.bfloat16), 1),
    ("rms_norm", rms_norm, lambda: _dev((512, 4096), (4096,), dtype=torch.bfloat16), 1),
    ("t_plus", lambda x, y: x.t() + y, lambda: _dev((1024, 768), (768, 1024), dtype=torch.bfloat16), 1),
    ("col_sum", lambda x: x.sum(0), lambda: _dev((2048, 1024)), 1),  # too short to split: column tiles
    ("col_sum_bf16", lambda x: x.sum(0), lambda: _dev((8192, 8192), dtype=torch.bfloat16), 1),  # split, one launch
    # too long to hold in bf16: the sum and Welford states per lane in one loop
    ("col_std_bf16", lambda x: torch.var_mean(x * 2 + 3, 1), lambda: _dev((128, 1024, 256), dtype=torch.bfloat16), 1),
]


@pytest.mark.parametrize("name,fn,make,kernels", FUSIONS, ids=[f[0] for f in FUSIONS])
def test_fusions_on_cuda(name, fn, make, kernels):
    # fp32 sums of thousands of terms: the order of additions differs from eager's (relative ~1e-7)
    tol = dict(atol=1e-4, rtol=1e-4) if name == "col_sum" else {}
    compile_and_compare(fn, *make(), kernels=kernels, **tol)


def test_ops_on_cuda():
    x, y = _dev((64, 96), (96,))
    i = torch.randint(-50, 50, (64, 96), device="cuda")
    compile_and_compare(lambda x, y, i: (
        x.exp(), x.abs().log1p(), x.tanh(), x.sigmoid(), x.abs().sqrt(), x.abs().pow(1.5), torch.maximum(x, y),
        x.clamp(-0.5, 0.5), torch.where(x > y, x, y), i // 7, i % 7, i.abs() & 6, x.amax(0), x.argmax(-1),
        x.var(-1), x.prod(-1), (x > 0).any(-1), torch.cat([x, x * 2], 0).flip(1), F.pad(x, (1, 2), value=3.0),
        x.t().reshape(-1)[::3], x.to(torch.float16) * 2, F.log_softmax(x, 0)), x, y, i)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_expm1_on_cuda_is_libdevices(dtype):
    # on a GPU codegen/helpers._expm1 calls libdevice: tiny |x| (where exp(x) - 1 cancels), large, ±inf, NaN
    x = torch.randn(64, 300, device="cuda", dtype=dtype) * 4
    x[0, :8] = torch.tensor([1e-6, -1e-6, 3e-4, -0.0, 80.0, -100.0, float("inf"), float("-inf")], dtype=dtype)
    x[1, 0] = float("nan")
    compile_and_compare(lambda x, y: (torch.expm1(x), torch.where(x > 0, x * y, torch.expm1(y))), x, x.flip(1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_nan_and_inf_propagate_through_max_and_min_on_cuda(dtype):
    # max/min compile to PTX max.NaN/min.NaN (fp64: LLVM's expansion); eager propagates NaN
    x = torch.randn(64, 300, device="cuda", dtype=dtype)
    x[1, 3] = x[4, 0] = x[4, 299] = float("nan")
    x[2, 5], x[3, 1] = float("inf"), float("-inf")
    x[5] = float("-inf")
    y = torch.randn_like(x)
    compile_and_compare(lambda x, y: (x.amax(1), x.amin(0), torch.maximum(x, y), torch.minimum(y, x),
                                      x.clamp(-0.5, 0.5), x.max(), x.softmax(-1), x.argmax(1)), x, y)


@pytest.mark.parametrize("fn,shape,template", [
    (lambda x: F.softmax(x, -1), (128, 262144), "pipeline of 3"),
    (lambda x: x.sum(0), (8192, 8192), "split reduction + combine"),      # 128 groups of 8 partials
    (lambda x: x.float().mean(), (4096, 4096), "split reduction + combine"),  # one group
])
def test_staged_launches_on_two_streams_keep_their_own_counters(fn, shape, template):
    # a staged launch's counters are never reset (a pipeline's launch e waits for e+1 times a count;
    # a split-combine's last program of a group is the one whose count ends a multiple of the group):
    # calls on two streams at once must not share them
    f = minicomp.compile(fn)
    (x,) = _dev(shape, dtype=torch.bfloat16)
    f(x)
    assert minicomp.report().kernels[0].template == template, minicomp.report().summary()
    streams = [torch.cuda.Stream() for _ in range(2)]
    inputs = [x * (k + 1) for k in range(2)]
    torch.cuda.synchronize()
    results = []
    for _ in range(3):
        for s, t in zip(streams, inputs):
            with torch.cuda.stream(s):
                results.append((t, f(t)))
    torch.cuda.synchronize()
    for t, got in results:
        torch.testing.assert_close(got, fn(t), atol=0.5, rtol=2e-2)  # bf16 sums of 8192 in another order


def test_mlp_on_cuda_matches_eager():
    mlp = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.LayerNorm(512), torch.nn.GELU(),
                              torch.nn.Linear(512, 256)).cuda().to(torch.bfloat16)
    x = torch.randn(128, 256, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        compile_and_compare(mlp, x, fallbacks=None)
    assert any("layer_norm" in k.name for k in minicomp.report().kernels)


GEMMS = [  # each with an epilogue: a product alone runs in cuBLAS (below)
    ("mm_bf16_tma", lambda a, b: (a @ b) + 1, ((1024, 512), (512, 768)), torch.bfloat16),
    ("linear_relu_residual", lambda x, w, b, r: F.relu(F.linear(x, w, b)) + r,
     ((512, 256), (384, 256), (384,), (512, 384)), torch.bfloat16),
    ("mm_transposed_fp16", lambda a, b: (a.t() @ b.t()).relu(), ((256, 200), (136, 256)), torch.float16),
    ("mm_odd_sizes_fp32", lambda a, b: (a @ b).relu(), ((127, 17), (17, 33)), torch.float32),
    ("bmm_broadcast", lambda a, b: torch.relu(a @ b), ((4, 1, 64, 48), (3, 48, 80)), torch.bfloat16),
    ("misaligned_view", lambda a, b: (a[1:] @ b).relu(), ((129, 64), (64, 128)), torch.bfloat16),
]


@pytest.mark.parametrize("name,fn,shapes,dtype", GEMMS, ids=[g[0] for g in GEMMS])
def test_gemm_on_cuda(name, fn, shapes, dtype, monkeypatch):
    # the template, whatever the rule says (these products have fewer tiles than the H200 has SMs:
    # by default they run in cuBLAS)
    monkeypatch.setenv("MINICOMP_GEMM", "template")
    args = [torch.randn(s, device="cuda", dtype=dtype) / 8 for s in shapes]
    with assigned(torch.backends.cuda.matmul, "allow_tf32", True):  # fp32 on tensor cores (IEEE: cuBLAS)
        compile_and_compare(fn, *args, kernels=1, atol=3e-2, rtol=3e-2)
    assert minicomp.report().kernels[0].name.startswith("k0_mm")


PLAIN_GEMMS = [  # (..., the side of ir/choices.PLAIN_GEMM: 16-bit 2-D products this small stay in the template)
    ("mm_bf16", lambda a, b: a @ b, ((8192, 1024), (1024, 1024)), torch.bfloat16, "template"),
    # 24 tiles of the template for 132 SMs: the gemm rule takes cuBLAS before fusion
    ("mm_bf16_few_tiles", lambda a, b: a @ b, ((1024, 512), (512, 768)), torch.bfloat16, "library"),
    ("mm_transposed_fp16", lambda a, b: a.t() @ b.t(), ((256, 200), (136, 256)), torch.float16, "template"),
    ("mm_odd_sizes_fp32", lambda a, b: a @ b, ((127, 17), (17, 33)), torch.float32, "library"),
    ("bmm_bf16", torch.bmm, ((3, 64, 48), (3, 48, 80)), torch.bfloat16, "library"),
    ("misaligned_view", lambda a, b: a[1:] @ b, ((129, 64), (64, 128)), torch.bfloat16, "template"),
    ("linear_no_bias_then_softmax", lambda x, w: torch.softmax(F.linear(x, w), -1), ((64, 96), (40, 96)),
     torch.bfloat16, "template"),
]


@pytest.mark.parametrize("name,fn,shapes,dtype,side", PLAIN_GEMMS, ids=[g[0] for g in PLAIN_GEMMS])
def test_a_product_nothing_fuses_into_follows_the_plain_gemm_rule(name, fn, shapes, dtype, side):
    args = [torch.randn(s, device="cuda", dtype=dtype) / 8 for s in shapes]
    rep = compile_and_compare(fn, *args, atol=3e-2, rtol=3e-2)
    in_template = [k for k in rep.kernels if "mm" in k.name]
    if side == "library":  # (fp32: IEEE, the gemm rule's cuBLAS before fusion)
        assert not in_template, rep.summary()
        assert any(d.startswith("gemm") and "cuBLAS" in d for d in rep.decisions), rep.summary()
    else:
        assert in_template and "[rule plain_gemm: template]" in " ".join(rep.decisions), rep.summary()


def test_heavy_epilogue_runs_in_cublas_and_says_why():
    x, w, b, r = (torch.randn(s, device="cuda", dtype=torch.bfloat16) / 8 for s in ((2048, 1024), (1024, 1024),
                                                                                   (1024,), (2048, 1024)))
    rep = compile_and_compare(lambda x, w, b, r: F.gelu(F.linear(x, w, b)) + r, x, w, b, r, kernels=1,
                              atol=3e-2, rtol=3e-2)
    assert any("cuBLAS" in d and "gelu" in d for d in rep.decisions), rep.summary()


def test_max_autotune_measures_and_caches(cache_dir):
    a, b = (torch.randn(512, 512, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    compiled = minicomp.compile(lambda a, b: torch.relu(a @ b), mode="max-autotune")
    torch.testing.assert_close(compiled(a, b), torch.relu(a @ b), atol=3e-2, rtol=3e-2)
    assert any("measured" in d for d in minicomp.report().decisions)
    assert list((cache_dir / "tuned").glob("*.json"))


def test_max_autotune_tunes_reductions_and_the_winner_is_reused(cache_dir, capsys):
    x = torch.randn(4096, 2048, device="cuda", dtype=torch.bfloat16)
    compiled = minicomp.compile(lambda x: torch.softmax(x, -1), mode="max-autotune")
    torch.testing.assert_close(compiled(x), torch.softmax(x, -1), atol=2e-2, rtol=2e-2)
    assert "minicomp: tuned k0_softmax" in capsys.readouterr().err
    torch._dynamo.reset()
    compile_and_compare(lambda x: torch.softmax(x, -1), x)
    assert any(d.startswith("tuned: k0_softmax") for d in minicomp.report().decisions)


def test_several_kernels_precompiled_in_parallel_match_eager():
    x, w = torch.randn(4096, 1024, device="cuda"), torch.randn(1024, device="cuda")
    compile_and_compare(lambda x, w: (torch.softmax(x, -1) * w, x.sum(0), (x * w).t() + 1), x, w,
                        atol=1e-4, rtol=1e-4)  # x.sum(0) adds 4096 terms in another order than eager
    assert len(minicomp.report().kernels) >= 3


def test_launcher_built_while_the_kernel_compiles(monkeypatch):
    # runtime/triton_shims.launcher_alongside hooks Triton internals; if they change, this says the overlap is gone
    from triton.runtime import driver

    from minicomp.runtime import triton_shims
    built, launcher_cls = [], driver.active.launcher_cls
    monkeypatch.setattr(driver.active, "launcher_cls",
                        lambda src, metadata: built.append(type(metadata)) or launcher_cls(src, metadata))
    x = torch.randn(1000, 3, device="cuda")
    compile_and_compare(lambda x: torch.sigmoid(x) * 3 - x, x)  # one kernel: precompiled too
    assert triton_shims._LaunchTimeMetadata in built, built


def test_graph_cache_warm_compile_on_the_gpu():
    # several kernels (precompiled in parallel), a cuBLAS GEMM (a fallback op by name), a pipeline
    def fn(x, v, w, b):
        return torch.softmax(x, -1) * v, F.gelu(F.linear(x[:, :1024], w, b)), F.softmax(x.view(128, 262144), -1)
    reports = []
    for _ in range(2):  # the second compile is what a new process does: Dynamo reset, same cache folder
        torch._dynamo.reset()
        x, v, w, b = _dev((8192, 4096), (4096,), (1024, 1024), (1024,), dtype=torch.bfloat16)
        compile_and_compare(fn, x, v, w / 32, b, atol=3e-2, rtol=3e-2)
        reports.append(minicomp.report())
    assert not reports[0].from_cache and reports[1].from_cache, reports[1].summary()
    assert [k.name for k in reports[1].kernels] == [k.name for k in reports[0].kernels]
    assert reports[1].fallbacks == reports[0].fallbacks


def test_64bit_indexing_beyond_2_pow_31_elements():
    n = 2**31 + 4096
    x = torch.randint(-3, 4, (n,), device="cuda", dtype=torch.int8)
    out = minicomp.compile(lambda x: x * 2 + 1)(x)
    source = open(minicomp.report().kernels[0].source_path).read()
    assert "tl.int64" in source  # the flat index is computed in 64 bits
    for sl in (slice(0, 4096), slice(2**31 - 2048, 2**31 + 2048), slice(n - 4096, n)):
        torch.testing.assert_close(out[sl], x[sl] * 2 + 1)
    del out
    rows = x.view(-1, 4096)[: 2**31 // 4096 + 1]
    sums = minicomp.compile(lambda r: r.sum(-1))(rows)
    torch.testing.assert_close(sums, rows.sum(-1))


@pytest.mark.parametrize("cols", [3000, 50000])  # one block per row (persistent); blocks carried (looped)
def test_scans_on_cuda(cols):
    x = torch.randn(16, cols, device="cuda")
    i = torch.randint(-9, 9, (16, cols), device="cuda", dtype=torch.int32)
    # fp32 running sums of thousands of terms: the order of additions differs from eager's
    tol = dict(atol=1e-2, rtol=1e-4)
    compile_and_compare(lambda x: torch.exp(torch.cumsum(x * 0.5, -1) * 1e-3), x, kernels=1, **tol)
    compile_and_compare(lambda x, i: (torch.cumsum(x, -1), torch.cumprod(1 + x * 1e-4, -1), torch.logcumsumexp(x, -1),
                                      torch.cummax(x, -1), torch.cumsum(i, -1), torch.cummin(i, -1)), x, i, **tol)
    compile_and_compare(lambda x, i: (torch.cumsum(x, 0), torch.cummax(i, 0)), x.t().contiguous(), i.t(), **tol)
    # half types: a float running total rounded per element (eager's CUDA kernel keeps a half one)
    h = x.to(torch.float16)
    torch.testing.assert_close(minicomp.compile(lambda h: torch.cumsum(h, -1))(h),
                               torch.cumsum(h.double(), -1).to(torch.float16), atol=2e-2, rtol=2e-3)


def test_cumsum_gradient_on_cuda():
    x = torch.randn(32, 20000, device="cuda", requires_grad=True)
    xc = x.detach().clone().requires_grad_()
    g = torch.randn_like(x)
    (torch.cumsum(x, -1) * g).sum().backward()
    (minicomp.compile(lambda x: torch.cumsum(x, -1))(xc) * g).sum().backward()
    assert len(minicomp.report().kernels) == 1, minicomp.report().summary()  # a reversed scan
    torch.testing.assert_close(xc.grad, x.grad, atol=1e-2, rtol=1e-4)


def test_cpu_scalar_tensors_in_a_cuda_graph():
    # eager lets a CPU 0-d tensor join GPU ops; a kernel cannot read it: it is copied once, and work on
    # CPU tensors stays in PyTorch (the report says both)
    x, s = torch.randn(64, 33, device="cuda"), torch.tensor(1.5)

    def fn(x, s):
        t = torch.tensor(-2.0) * s  # CPU work
        return torch.relu(x) * s + t, t
    report = compile_and_compare(fn, x, s, fallbacks=None)
    reasons = {f.reason for f in report.fallbacks}
    assert reasons <= {"a CPU scalar tensor moves to the GPU", "computes a CPU tensor in a CUDA graph (as eager does)"}, reasons
    # the moves do not synchronize the stream (a blocking copy would: a host-GPU sync per move), and a
    # new value of the CPU tensor is read on the next call
    compiled = minicomp.compile(fn)
    compiled(x, s)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out, t = compiled(x, torch.tensor(-0.25))
    assert not [e for e in prof.events() if e.name in ("cudaStreamSynchronize", "cudaDeviceSynchronize")]
    expected, t_expected = fn(x, torch.tensor(-0.25))
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(t, t_expected)


def test_cpu_work_that_reads_no_input_runs_once_while_compiling():
    """BEiT's relative position index (meshgrid of aranges, in-place fills) and MPNet's buckets (abs,
    log, where) are CPU work inside a CUDA graph that reads no input: constants of the compiled graph
    (FOLD_MAX_BYTES), so no fallback op computes them per call; values as eager's, call after call."""
    table, x = torch.randn(50, 4, device="cuda"), torch.randn(2, 4, 17, 17, device="cuda")

    def fn(table, x):
        coords = torch.stack(torch.meshgrid(torch.arange(4), torch.arange(4), indexing="ij")).flatten(1)
        rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0).contiguous()
        rel[:, :, 0] += 3
        rel[:, :, 1] += 3
        rel[:, :, 0] *= 7
        index = torch.zeros(17, 17, dtype=torch.long)
        index[1:, 1:] = rel.sum(-1)
        index[0, :], index[:, 0], index[0, 0] = 49, 48, 47
        n = torch.arange(17)[None, :] - torch.arange(17)[:, None]
        bucket = torch.where(n.abs() < 4, n.abs(), (torch.log(n.abs().float().clamp(min=1)) * 2).long())
        return x + table[index.view(-1)].view(17, 17, 4).permute(2, 0, 1) + bucket.to(x.device)
    report = compile_and_compare(fn, table, x, fallbacks=None)
    assert not [f for f in report.fallbacks if "CPU tensor" in f.reason], report.fallbacks
    compiled = minicomp.compile(fn)
    for _ in range(2):
        table = torch.randn(50, 4, device="cuda")
        torch.testing.assert_close(compiled(table, x), fn(table, x))


def test_factory_ops_and_masks_on_cuda():
    # arange / triu / a causal mask were created on the CPU once (a CPU pointer reached a kernel)
    a, b = torch.randn(40, 24, device="cuda"), torch.randn(24, 40, device="cuda")
    compile_and_compare(lambda a, b: torch.triu(a @ b), a, b, fallbacks=None)

    def causal(x):
        n = x.shape[-1]
        mask = torch.arange(n, device=x.device)[None, :] > torch.arange(n, device=x.device)[:, None]
        return torch.softmax(x.masked_fill(mask, float("-inf")), -1) + torch.arange(n, device=x.device)
    compile_and_compare(causal, torch.randn(3, 17, 17, device="cuda"), fallbacks=None)


def test_first_run_error_falls_back_on_cuda(monkeypatch):
    from minicomp.runtime import support

    def fail(*args, **kwargs):
        raise RuntimeError("simulated launch failure")
    monkeypatch.setattr(support, "empty", fail)
    x = torch.randn(8, 8, device="cuda")
    with pytest.warns(UserWarning, match="runs in PyTorch"):
        torch.testing.assert_close(minicomp.compile(lambda x: x.exp() * 2)(x), x.exp() * 2)
    assert minicomp.report().whole_graph_fallback.startswith("first run:")


# ------------------------------------------------------------------------------- models (model suite)

def _cuda_model_cases():
    from benchmarks import model_zoo as zoo
    tiny = zoo.TINY
    specs = [zoo.gpt2(tiny, "sdpa"), zoo.gpt2(tiny, "eager"), zoo.bert(tiny), zoo.llama(tiny), zoo.t5(tiny),
             zoo.bart(tiny), zoo.vit(tiny), zoo.swin(tiny), *zoo.cnn_blocks(tiny), *zoo.rnns(tiny)]
    cases = [pytest.param(s, torch.float32, id=f"{s.name}-fp32") for s in specs]
    # the suite's low-precision dtypes: Llama bf16, ViT fp16, cuDNN convolutions in half precision
    low = {"llama-gqa": torch.bfloat16, "vit": torch.float16, "resnet-bottleneck": torch.float16,
           "convnext-block": torch.bfloat16}
    cases += [pytest.param(s, low[s.name], id=f"{s.name}-{str(low[s.name])[6:]}") for s in specs if s.name in low]
    return cases


@pytest.mark.parametrize("spec,dtype", _cuda_model_cases())
def test_model_forward_on_cuda(spec, dtype, monkeypatch):
    # a fallback op that makes its tensor on the CPU (arange, full, an index) only shows with CUDA inputs
    if spec.family == "transformer":
        pytest.importorskip("transformers")
    # fp32 compared at fp32 precision: TF32 convolutions differ by ~4e-4 between cuDNN's NCHW (eager)
    # and channels-last (the layout plan) algorithms
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    from tests.model_checks import check_forward
    check_forward(spec, 2, device="cuda", dtype=dtype)


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
@pytest.mark.parametrize("make", [lambda: torch.nn.LSTM(16, 24, 2, batch_first=True),
                                  lambda: torch.nn.GRU(16, 24, 1, bidirectional=True)], ids=["lstm", "gru"])
@torch._dynamo.config.patch(allow_rnn=True)  # (monkeypatch.setattr would delete it: tests/test_recurrent.py)
def test_recurrent_modules_run_cudnn_forward_and_backward_on_cuda(make, mode, monkeypatch):
    # minicomp::recurrent: cuDNN's kernels (flattened weights), the backward by recomputation
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    torch._dynamo.reset()
    torch.manual_seed(0)
    module = make().cuda()
    compiled = torch.compile(module, backend="minicomp", mode=mode)
    for _ in range(3):  # reduce-overhead: plain run, capture, replay
        x = torch.randn(4, 7, 16, device="cuda", requires_grad=True)
        leaves = [x, *module.parameters()]
        got, expected = compiled(x), module(x)
        seed = torch.randn_like(expected[0])
        for a, b in zip(torch.autograd.grad(got[0], leaves, seed), torch.autograd.grad(expected[0], leaves, seed)):
            torch.testing.assert_close(a, b)
        torch.testing.assert_close(got[0], expected[0])
        torch.testing.assert_close(got[1], expected[1])
    with torch.no_grad():
        x = torch.randn(4, 7, 16, device="cuda")
        torch.testing.assert_close(compiled(x)[0], module(x)[0])
    assert "recurrent.default" in [f.op for f in minicomp.report().fallbacks]


def test_target_describes_the_gpu():
    from minicomp.ir.target import Target
    t = Target.for_device(torch.device("cuda"))
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    assert t is Target.for_device(torch.device("cuda", torch.cuda.current_device()))  # described once
    assert t.is_cuda and not t.interpreted and t.device == torch.device("cuda", torch.cuda.current_device())
    assert (t.name, t.sm_count, t.compute_capability) == (props.name, props.multi_processor_count,
                                                         (props.major, props.minor))
    assert t.tma == (props.major >= 9)
    x = torch.randn(8, device="cuda")
    assert Target.for_values([torch.ones(()), x]) is t  # a CPU scalar tensor joins a GPU graph


def test_later_calls_take_the_lean_launch_path_and_match_eager(monkeypatch):
    # after the first call every launch is bound once to its compiled kernel (runtime/triton_shims.lean_launcher)
    from minicomp.runtime.executable import Executable
    bound, bind = [], Executable._bind
    monkeypatch.setattr(Executable, "_bind", lambda self, compiled: (bind(self, compiled), bound.append(self)))

    def fn(x, w):
        y = torch.softmax(x @ w, -1)
        return y * 2, x.sum(0), y.cumsum(1), F.conv1d(y.unsqueeze(1), w[:4, None, :3].contiguous()), x[1:, 3:]
    f = minicomp.compile(fn)
    w = torch.randn(64, 64, device="cuda")
    for _ in range(4):
        x = torch.randn(32, 64, device="cuda")
        for got, want in zip(f(x, w), fn(x, w), strict=True):
            torch.testing.assert_close(got, want, atol=1e-3, rtol=1e-3)
    assert bound and all(e.lean is not None for e in bound), [e.lean_failed for e in bound]



def test_resize_under_autocast_as_eager():
    """CUDA autocast runs aten's upsample ops in float32: minicomp's resize op too (the result's dtype,
    and a backward that adds in float32: with bf16 atomics SegFormer's bias gradients were 6x further
    from float64's than eager's). Judged against the float64 step: bf16 rounding makes any two correct
    runs differ by an ulp here and there."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 64).cuda()
    x = torch.randn(8, 49, 64, device="cuda")
    upstream = torch.randn(8, 64, 56, 56, device="cuda")

    def f(x, layer=lin):
        y = layer(x).transpose(1, 2).reshape(8, 64, 7, 7)
        return F.interpolate(y, size=(56, 56), mode="bilinear")

    def run(fn, amp=True, dtype=torch.float32, layer=lin):
        layer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", torch.bfloat16, enabled=amp):
            y = fn(x.to(dtype), layer)
        y.backward(upstream.to(y.dtype))
        return y, layer.bias.grad.double()

    _, exact = run(f, amp=False, dtype=torch.float64, layer=copy.deepcopy(lin).double())
    y_eager, g_eager = run(f)
    y, g = run(minicomp.compile(f))
    assert y.dtype == y_eager.dtype == torch.float32
    torch.testing.assert_close(y, y_eager, rtol=1e-2, atol=1e-2)
    err = lambda grad: ((grad - exact).norm() / exact.norm()).item()  # noqa: E731
    assert err(g) <= 2 * err(g_eager) + 1e-6, (err(g), err(g_eager))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_avg_pool3d_and_its_gradient_on_cuda(dtype):
    """avg_pool3d (lowered since the 2-D rule serves n dims) on a channels-last-3d input with padding
    and ceil_mode: the result and the input's gradient as eager's."""
    torch.manual_seed(0)
    x = torch.randn(2, 8, 9, 10, 11, device="cuda", dtype=dtype).to(memory_format=torch.channels_last_3d)
    upstream = torch.randn(2, 8, 5, 6, 6, device="cuda", dtype=dtype)

    def pool(t):
        return F.avg_pool3d(t, 3, 2, 1, ceil_mode=True, count_include_pad=False)

    def run(fn):
        xc = x.detach().clone().requires_grad_()
        y = fn(xc)
        y.backward(upstream)
        return y, xc.grad
    y_eager, g_eager = run(pool)
    before = minicomp.report()
    y, g = run(minicomp.compile(pool))
    assert not any(r.fallbacks or r.whole_graph_fallback for r in minicomp.reports_since(before))
    tol = dict(rtol=1e-2, atol=1e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(y, y_eager, **tol)
    torch.testing.assert_close(g, g_eager, **tol)
