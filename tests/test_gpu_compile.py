"""The kernels minicomp generates for the H200 compile for sm_90 — checked on the CPU.

Triton compiles for a GPU it does not have (``triton.compile`` with a ``GPUTarget``; ptxas ships with
Triton), so a kernel that only a GPU build rejects (a layout ``tl.dot`` cannot take, a shape Triton's
passes refuse, an inline-PTX typo) fails here instead of sending a user's graph to PyTorch on the
device. Each case is scheduled for the H200 (as ``tests/test_target.py`` does) and every kernel of it
compiled with its schedule's warps and stages. Whether they run right and fast is the GPU's to say.
"""
from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F

from minicomp.codegen.naming import content_named_source
from minicomp.ir.kernel import Kernel
from tests.test_target import _scheduled
from tests.utils import H200

triton = pytest.importorskip("triton")
try:
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import CUDABackend  # noqa: F401  (ptxas ships with it)
except ImportError:  # pragma: no cover - a Triton without the NVIDIA backend
    pytest.skip("Triton's NVIDIA backend is not installed", allow_module_level=True)

aten = torch.ops.aten
BF16, F16 = torch.bfloat16, torch.float16
POINTER = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32", torch.int64: "*i64",
           torch.int32: "*i32", torch.bool: "*i1"}


def compile_for_sm90(kernel: Kernel, folder) -> None:
    """Compile ``kernel``'s Triton source for sm_90 (raises what Triton raises)."""
    function, source = content_named_source(kernel)
    path = folder / f"{function}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"gpu_compile_{function}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn = getattr(module, function)
    signature, constants = {}, {}
    for name in fn.arg_names:
        arg = next((a for a in kernel.args if a.name == name), None)
        if arg is not None:
            signature[name] = POINTER[arg.node.dtype]
        else:
            signature[name] = "constexpr"
            constants[name] = 0 if name == "INTERPRETED" else kernel.schedule.blocks[name]
    triton.compile(triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constants),
                   target=GPUTarget("cuda", 90, 32),
                   options=dict(num_warps=kernel.schedule.num_warps, num_stages=kernel.schedule.num_stages))


def _causal(q, k, v):
    t = q.shape[-2]
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    s = s.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s.float(), -1).to(q.dtype) @ v


def _padding_mask(q, k, v, m):
    return torch.softmax((q @ k.transpose(-1, -2) * 0.125 + m).float(), -1).to(q.dtype) @ v


def _decode(q, k, v):
    return torch.softmax((q @ k.transpose(-1, -2)).float() / 11.3, -1).to(q.dtype) @ v


def _rotary(q, k, v, cos, sin):
    """Llama's attention: HF's rotate_half in fp32 on bf16 q and k (grouped-query k and v), computed
    on the attention kernel's loads (attention-prologue)."""
    def rope(x):
        x32 = x.float()
        half = torch.cat((-x32[..., x.shape[-1] // 2:], x32[..., : x.shape[-1] // 2]), dim=-1)
        return (x32 * cos[:, None].float() + half * sin[:, None].float()).to(x.dtype)
    return F.scaled_dot_product_attention(rope(q), rope(k), v * 0.5, is_causal=True, enable_gqa=True)


def _sdpa_backward(dout, q, k, v, out, lse):
    return aten._scaled_dot_product_flash_attention_for_cpu_backward(dout, q, k, v, out, lse, 0.0, True)


def _conv_block(x, w1, w2, g, b, m, var):
    y = F.relu(F.batch_norm(F.conv2d(x, w1, padding=1), m, var, g, b, False, 0.1, 1e-5))
    return F.avg_pool2d(F.conv2d(y, w2) + y, 2).flatten(1)


def _squeeze_excite(x, w, w1, w2):
    """EfficientNet's squeeze-excite after a 1x1 conv: the mean over H, W of a channels-last buffer
    (a column reduction on the GPU, looped) and the scale."""
    y = F.silu(F.conv2d(x, w))
    s = torch.sigmoid(F.conv2d(F.silu(F.conv2d(y.mean((2, 3), keepdim=True), w1)), w2))
    return y * s


def _stem(x, w, g, b, m, var):
    """ResNet's stem: a channels-last convolution result through batch norm, relu and a 3x3/2 max pool
    with its indices (a window kernel walking the channels fastest, storing NCHW results)."""
    y = F.relu(F.batch_norm(F.conv2d(x, w, stride=2, padding=3), m, var, g, b, False, 0.1, 1e-5))
    return F.max_pool2d(y, 3, 2, 1, return_indices=True)


def _r(*shape, dtype=BF16):
    return torch.randn(*shape, dtype=dtype)


CASES = {  # name: (function, inputs, templates that must be among its kernels)
    "attention causal d64": (_causal, lambda: [_r(1, 2, 256, 64) for _ in range(3)], {"attention"}),
    "attention causal d128": (_causal, lambda: [_r(1, 2, 257, 128) for _ in range(3)], {"attention"}),
    "attention padding mask": (_padding_mask, lambda: [_r(2, 2, 128, 64) for _ in range(3)]
                               + [torch.where(torch.rand(2, 1, 1, 128) > 0.2, 0.0, -1e9).to(BF16)], {"attention"}),
    "attention decode": (_decode, lambda: [_r(2, 4, 1, 128), _r(2, 4, 4096, 128), _r(2, 4, 4096, 128)], {"attention"}),
    "attention backward": (_sdpa_backward, lambda: [_r(1, 2, 256, 64) for _ in range(5)] + [torch.randn(1, 2, 256)],
                           {"attention_dq", "attention_dkdv"}),
    "attention rotary gqa": (_rotary, lambda: [_r(1, 4, 256, 64), _r(1, 2, 256, 64), _r(1, 2, 256, 64),
                                               _r(1, 256, 64), _r(1, 256, 64)], {"attention"}),
    "attention rotary d96": (_rotary, lambda: [_r(1, 2, 130, 96), _r(1, 2, 130, 96), _r(1, 2, 130, 96),
                                               _r(1, 130, 96), _r(1, 130, 96)], {"attention"}),
    "gemm gelu": (lambda a, b: F.gelu(a @ b, approximate="tanh"), lambda: [_r(1024, 512), _r(512, 4096)], {"gemm"}),
    "conv block channels-last": (_conv_block, lambda: [_r(2, 64, 16, 16, dtype=F16), _r(64, 64, 3, 3, dtype=F16),
                                                       _r(64, 64, 1, 1, dtype=F16)]
                                 + [_r(64, dtype=F16).abs() + 0.5 for _ in range(4)], {"pointwise", "window"}),
    "stem pool with indices": (_stem, lambda: [_r(2, 3, 32, 32), _r(16, 3, 7, 7)]
                               + [_r(16).abs() + 0.5 for _ in range(4)], {"window"}),
    "max pool 3-D, 27 taps": (lambda x: F.max_pool3d(x, 3, 2, 1, return_indices=True),
                              lambda: [torch.randn(2, 4, 5, 9, 7)], {"window"}),
    "avg pool 3-D, 27 taps": (lambda x: F.avg_pool3d(x, 3, 1, 1), lambda: [torch.randn(2, 4, 5, 9, 7)], {"window"}),
    "group norm, one-pass moments": (lambda x, w, b: F.group_norm(x, 8, w, b),
                                     lambda: [_r(2, 64, 64, 64), _r(64), _r(64)], {"reduction", "pointwise"}),
    "squeeze-excite channels-last": (_squeeze_excite, lambda: [_r(4, 96, 14, 14), _r(96, 96, 1, 1), _r(24, 96, 1, 1),
                                                               _r(96, 24, 1, 1)], {"reduction"}),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_kernels_compile_for_sm90(case, tmp_path, monkeypatch):
    monkeypatch.setenv("MINICOMP_ATTENTION", "1")  # SDPA's ops too (PyTorch's by default on GPUs)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))  # compile, do not find it cached
    fn, inputs, templates = CASES[case]
    with torch.no_grad():
        _, kernels = _scheduled(fn, inputs(), H200)
    assert templates <= {k.schedule.template for k in kernels}, [k.schedule for k in kernels]
    if fn is _rotary:  # one kernel: the rotary and v's scale are computed on its loads
        assert len(kernels) == 1, [k.name for k in kernels]
    for kernel in kernels:
        compile_for_sm90(kernel, tmp_path)
