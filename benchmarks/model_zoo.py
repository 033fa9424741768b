"""The models of the model suite, built from configs with random weights (no downloads).

Shared by ``benchmarks/models.py`` (the GPU suite, ``SUITE`` sizes), ``tests/test_models.py`` (CPU,
``TINY`` sizes) and ``tests/test_cuda.py``. Every builder returns a ``ModelSpec``: how to build the
model (fp32 on the CPU; the caller moves it), its inputs for a batch, and how to read its logits.

Three families:
- transformers models (GPT-2, BERT, Llama with grouped-query attention, T5, BART, ViT, Swin);
- CNN blocks written in plain PyTorch (ResNet bottleneck, MobileNetV3 inverted residual, DenseNet dense
  block, ConvNeXt block) and recurrent models (``nn.LSTM``, an unrolled ``nn.GRUCell``): these need
  nothing beyond torch, so the CPU tests and the dry run have CNNs too;
- whole CNNs from torchvision (or timm when torchvision is missing), for the GPU suite only.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class Size:
    """The dimensions the builders share."""
    hidden: int
    layers: int
    heads: int
    kv_heads: int      # Llama: fewer key/value heads than query heads (grouped-query attention)
    ffn: int
    vocab: int | None  # None: the model's usual vocabulary
    seq: int
    image: int         # transformers vision models and CNN blocks: image side
    channels: int      # CNN blocks: input channels


TINY = Size(hidden=32, layers=2, heads=4, kv_heads=2, ffn=64, vocab=96, seq=8, image=16, channels=16)
SUITE = Size(hidden=768, layers=4, heads=12, kv_heads=4, ffn=3072, vocab=None, seq=128, image=224, channels=64)
# the dry run of benchmarks/models.py: TINY, but images large enough for ViT's and Swin's patch grids
DRY = Size(hidden=32, layers=2, heads=4, kv_heads=2, ffn=64, vocab=96, seq=16, image=32, channels=16)

Inputs = dict  # keyword arguments of the model's forward


@dataclass
class ModelSpec:
    """A model of the suite: ``build()`` makes it (fp32, CPU, eval mode, random weights);
    ``inputs(batch, device, dtype, train)`` its keyword arguments (``train``: with labels, for models
    whose forward computes a loss); ``logits(output)`` the tensor compared with eager."""
    name: str
    family: str  # "transformer", "cnn", "block", "rnn"
    dtype: torch.dtype
    build: Callable[[], nn.Module]
    inputs: Callable[[int, str, torch.dtype, bool], Inputs]
    logits: Callable[[object], torch.Tensor] = field(default=lambda out: out.logits)
    has_loss: bool = False  # the forward returns ``.loss`` when given the training inputs
    batches: tuple[int, ...] = (1, 8)  # the suite's batch sizes: 1 and a serving batch

    def training_loss(self, model: nn.Module, inputs: Inputs, cotangent: torch.Tensor | None = None) -> torch.Tensor:
        """A scalar to differentiate: the model's own loss, else the logits weighted by ``cotangent``
        (random, so every output element's gradient differs: a transposed or misplaced one shows)."""
        out = model(**inputs)
        if self.has_loss:
            return out.loss
        logits = self.logits(out)
        if cotangent is None:
            cotangent = torch.randn(logits.shape, generator=torch.Generator().manual_seed(1)).to(logits.device)
        return (logits.float() * cotangent).sum() / math.sqrt(logits.numel())


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """‖a − b‖ / ‖b‖ in float64."""
    a, b = actual.detach().double(), expected.detach().double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def gradient_mismatches(reference: nn.Module, model: nn.Module, rtol: float = 1e-3,
                        exact: nn.Module | None = None, alternatives: tuple[nn.Module, ...] = (),
                        judged: list[str] | None = None) -> list[str]:
    """After the same training step on two copies of a model: the parameters whose gradients differ and
    the floating buffers (BatchNorm running statistics) whose values differ, each with its relative
    error. A gradient passes if ‖a − b‖ ≤ rtol·(‖b‖ + 0.01·rms·√n), rms the root mean square of all
    eager gradients: a gradient that is zero in exact arithmetic (a key bias under softmax) is judged
    against a hundredth of the others' scale, not against its own rounding noise.

    ``exact``: a third copy after the same step in float64. A gradient or buffer that differs from
    eager's still passes when its error against float64 is at most twice eager's (plus 1e-4 of the
    scale above): PyTorch's own rule for judging a compiler where eager's fp32 is itself inexact
    (deep stacks of training-mode batch norm amplify rounding towards the input layers).
    ``alternatives``: more eager copies after the same step, run another valid way (channels-last
    memory): eager's error is then the largest of theirs and the reference's — where eager's own ways
    differ from float64 by a percent, so may a compiler. ``judged``: gets the same line as a wrong
    gradient for each one beyond ``rtol`` that passed against float64 (the numbers it passed by)."""
    grads = [p.grad for p in reference.parameters() if p.grad is not None]
    squares = sum(float(g.double().pow(2).sum()) for g in grads)
    rms = math.sqrt(squares / max(sum(g.numel() for g in grads), 1))
    exact_grads = {n: p.grad for n, p in exact.named_parameters()} if exact is not None else {}
    exact_buffers = dict(exact.named_buffers()) if exact is not None else {}
    other_grads = [{n: p.grad for n, p in m.named_parameters()} for m in alternatives]
    other_buffers = [dict(m.named_buffers()) for m in alternatives]

    def as_exact(actual: torch.Tensor, eager: list, truth: torch.Tensor | None, scale: float) -> bool:
        """``actual`` differs from eager's (``eager``: its runs' values) but is as close to float64's
        ``truth`` as eager is."""
        if truth is None:
            return False
        err = (actual.double() - truth.double()).norm().item()
        eager_err = max((e.double() - truth.double()).norm().item() for e in eager if e is not None)
        return err <= 2 * eager_err + 1e-4 * scale

    wrong = []
    for (name, p), (_, q) in zip(reference.named_parameters(), model.named_parameters()):
        if (p.grad is None) != (q.grad is None):
            wrong.append(f"{name}: gradient is None in {'eager' if p.grad is None else 'the compiled model'} only")
        elif p.grad is not None:
            scale = p.grad.double().norm().item() + 0.01 * rms * p.numel() ** 0.5
            diff = (q.grad.double() - p.grad.double()).norm().item()
            eager = [p.grad, *(g.get(name) for g in other_grads)]
            if diff <= rtol * scale:
                continue
            line = f"{name}: relative error {relative_error(q.grad, p.grad):.3g}" + (
                "" if name not in exact_grads else f" (against float64 {relative_error(q.grad, exact_grads[name]):.3g},"
                f" eager's {'/'.join(f'{relative_error(e, exact_grads[name]):.3g}' for e in eager if e is not None)})")
            if not as_exact(q.grad, eager, exact_grads.get(name), scale):
                wrong.append(line)
            elif judged is not None:
                judged.append(line)
    for (name, b), (_, c) in zip(reference.named_buffers(), model.named_buffers()):
        if b.is_floating_point() and not torch.allclose(c, b, rtol=1e-4, atol=1e-5) \
                and not as_exact(c, [b, *(o.get(name) for o in other_buffers)], exact_buffers.get(name),
                                 b.double().norm().item()):
            wrong.append(f"buffer {name}: relative error {relative_error(c, b):.3g}")
    return wrong


def _seeded(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _ids(batch: int, seq: int, vocab: int, device: str, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq), generator=_seeded(seed)).to(device)


def _image(batch: int, channels: int, side: int, device: str, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(batch, channels, side, side, generator=_seeded(2)).to(device=device, dtype=dtype)


def _padding_mask(batch: int, seq: int, device: str) -> torch.Tensor:
    """Ones, except the last quarter of every other sequence: padded batch entries mask keys."""
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[1::2, seq - seq // 4:] = 0
    return mask.to(device)


# --------------------------------------------------------------------------------- transformers models

def _no_dropout() -> dict:
    """Config keywords that turn dropout off: a training step must be deterministic to compare."""
    return dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def gpt2(size: Size, attn: str = "sdpa", dtype: torch.dtype = torch.float32) -> ModelSpec:
    vocab = size.vocab or 50257

    def build() -> nn.Module:
        from transformers import GPT2Config, GPT2LMHeadModel
        cfg = GPT2Config(vocab_size=vocab, n_positions=max(size.seq, 128), n_embd=size.hidden, n_layer=size.layers,
                         n_head=size.heads, n_inner=size.ffn, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                         bos_token_id=0, eos_token_id=0, use_cache=False)
        return _hf(GPT2LMHeadModel, cfg, attn)

    def inputs(batch, device, dtype, train):
        ids = _ids(batch, size.seq, vocab, device)
        return dict(input_ids=ids, labels=ids) if train else dict(input_ids=ids)
    return ModelSpec(f"gpt2-{attn}" if attn != "sdpa" else "gpt2", "transformer", dtype, build, inputs, has_loss=True)


def bert(size: Size, attn: str = "sdpa", dtype: torch.dtype = torch.float32) -> ModelSpec:
    vocab = size.vocab or 30522

    def build() -> nn.Module:
        from transformers import BertConfig, BertForMaskedLM
        cfg = BertConfig(vocab_size=vocab, hidden_size=size.hidden, num_hidden_layers=size.layers,
                         num_attention_heads=size.heads, intermediate_size=size.ffn,
                         max_position_embeddings=max(size.seq, 128), pad_token_id=0, **_no_dropout())
        return _hf(BertForMaskedLM, cfg, attn)

    def inputs(batch, device, dtype, train):
        ids = _ids(batch, size.seq, vocab, device)
        kw = dict(input_ids=ids, attention_mask=_padding_mask(batch, size.seq, device),
                  token_type_ids=torch.zeros_like(ids))
        return dict(kw, labels=_ids(batch, size.seq, vocab, device, seed=3)) if train else kw
    return ModelSpec("bert" if attn == "sdpa" else f"bert-{attn}", "transformer", dtype, build, inputs,
                     has_loss=True)


def llama(size: Size, attn: str = "sdpa", dtype: torch.dtype = torch.bfloat16) -> ModelSpec:
    """Llama with grouped-query attention (``kv_heads`` < ``heads``), RoPE, RMSNorm, SwiGLU."""
    vocab = size.vocab or 32000
    assert size.kv_heads < size.heads

    def build() -> nn.Module:
        from transformers import LlamaConfig, LlamaForCausalLM
        cfg = LlamaConfig(vocab_size=vocab, hidden_size=size.hidden, intermediate_size=size.ffn,
                          num_hidden_layers=size.layers, num_attention_heads=size.heads,
                          num_key_value_heads=size.kv_heads, max_position_embeddings=max(size.seq, 128),
                          use_cache=False, bos_token_id=0, eos_token_id=0, pad_token_id=0)
        return _hf(LlamaForCausalLM, cfg, attn)

    def inputs(batch, device, dtype, train):
        ids = _ids(batch, size.seq, vocab, device)
        return dict(input_ids=ids, labels=ids) if train else dict(input_ids=ids)
    return ModelSpec("llama-gqa" if attn == "sdpa" else f"llama-gqa-{attn}", "transformer", dtype, build, inputs,
                     has_loss=True)


def t5(size: Size, dtype: torch.dtype = torch.float32) -> ModelSpec:
    """T5 encoder-decoder: relative position buckets, RMS-style layer norm, no attention scaling."""
    vocab = size.vocab or 32128

    def build() -> nn.Module:
        from transformers import T5Config, T5ForConditionalGeneration
        cfg = T5Config(vocab_size=vocab, d_model=size.hidden, d_kv=size.hidden // size.heads, d_ff=size.ffn,
                       num_layers=size.layers, num_decoder_layers=size.layers, num_heads=size.heads,
                       dropout_rate=0.0, use_cache=False, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
        return _hf(T5ForConditionalGeneration, cfg, None)

    def inputs(batch, device, dtype, train):
        kw = dict(input_ids=_ids(batch, size.seq, vocab, device),
                  attention_mask=_padding_mask(batch, size.seq, device))
        decoder = _ids(batch, size.seq, vocab, device, seed=4)
        return dict(kw, labels=decoder) if train else dict(kw, decoder_input_ids=decoder)
    return ModelSpec("t5", "transformer", dtype, build, inputs, has_loss=True)


def bart(size: Size, dtype: torch.dtype = torch.float32) -> ModelSpec:
    vocab = size.vocab or 50265

    def build() -> nn.Module:
        from transformers import BartConfig, BartForConditionalGeneration
        cfg = BartConfig(vocab_size=vocab, d_model=size.hidden, encoder_layers=size.layers,
                         decoder_layers=size.layers, encoder_attention_heads=size.heads,
                         decoder_attention_heads=size.heads, encoder_ffn_dim=size.ffn, decoder_ffn_dim=size.ffn,
                         max_position_embeddings=max(size.seq, 128), dropout=0.0, attention_dropout=0.0,
                         activation_dropout=0.0, use_cache=False, pad_token_id=1, bos_token_id=0,
                         eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=None)
        return _hf(BartForConditionalGeneration, cfg, "sdpa")

    def inputs(batch, device, dtype, train):
        kw = dict(input_ids=_ids(batch, size.seq, vocab, device), attention_mask=_padding_mask(batch, size.seq, device))
        decoder = _ids(batch, size.seq, vocab, device, seed=4)
        return dict(kw, labels=decoder) if train else dict(kw, decoder_input_ids=decoder)
    return ModelSpec("bart", "transformer", dtype, build, inputs, has_loss=True)


def vit(size: Size, dtype: torch.dtype = torch.float16) -> ModelSpec:
    patch = 16 if size.image >= 128 else 8

    def build() -> nn.Module:
        from transformers import ViTConfig, ViTForImageClassification
        cfg = ViTConfig(hidden_size=size.hidden, num_hidden_layers=size.layers, num_attention_heads=size.heads,
                        intermediate_size=size.ffn, image_size=size.image, patch_size=patch, num_labels=1000,
                        **_no_dropout())
        return _hf(ViTForImageClassification, cfg, "sdpa")

    def inputs(batch, device, dtype, train):
        kw = dict(pixel_values=_image(batch, 3, size.image, device, dtype))
        return dict(kw, labels=torch.randint(0, 1000, (batch,), generator=_seeded(5)).to(device)) if train else kw
    return ModelSpec("vit", "transformer", dtype, build, inputs, has_loss=True)


def swin(size: Size, dtype: torch.dtype = torch.float32) -> ModelSpec:
    """Swin: shifted windows (rolls, window partition views, a relative position bias gathered by index)."""
    full = size.image >= 128

    def build() -> nn.Module:
        from transformers import SwinConfig, SwinForImageClassification
        # Swin-T at full size; tiny: 2 stages, windows of 2x2 patches (a shifted window needs a grid of 4+)
        cfg = (SwinConfig(image_size=size.image, patch_size=4, embed_dim=96, depths=(2, 2, 6, 2),
                          num_heads=(3, 6, 12, 24), window_size=7, drop_path_rate=0.0, num_labels=1000)
               if full else
               SwinConfig(image_size=size.image, patch_size=4, embed_dim=size.hidden // 2, depths=(2, 2),
                          num_heads=(2, 4), window_size=2, drop_path_rate=0.0, num_labels=10))
        return _hf(SwinForImageClassification, cfg, None)

    def inputs(batch, device, dtype, train):
        kw = dict(pixel_values=_image(batch, 3, size.image, device, dtype))
        labels = torch.randint(0, 1000 if full else 10, (batch,), generator=_seeded(5)).to(device)
        return dict(kw, labels=labels) if train else kw
    return ModelSpec("swin", "transformer", dtype, build, inputs, has_loss=True)


def _hf(cls, cfg, attn: str | None) -> nn.Module:
    """A transformers model from ``cfg`` with random weights; ``attn`` picks the attention
    implementation ("sdpa" or "eager"; None: the model's default)."""
    if attn is not None:
        cfg._attn_implementation = attn
    torch.manual_seed(0)
    return cls(cfg).eval()


# ---------------------------------------------------------------------------- CNN blocks in plain PyTorch

class Bottleneck(nn.Module):
    """ResNet-50's bottleneck: 1x1 -> 3x3 (stride) -> 1x1 convolutions with BatchNorm, a projection shortcut."""

    def __init__(self, cin: int, width: int, stride: int = 2):
        super().__init__()
        cout = 4 * width
        self.conv1, self.bn1 = nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width)
        self.conv2, self.bn2 = nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width)
        self.conv3, self.bn3 = nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout)
        self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        return F.relu(self.bn3(self.conv3(y)) + self.down(x))


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, squeezed: int):
        super().__init__()
        self.reduce, self.expand = nn.Conv2d(channels, squeezed, 1), nn.Conv2d(squeezed, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = F.adaptive_avg_pool2d(x, 1)
        return x * F.hardsigmoid(self.expand(F.relu(self.reduce(s))))


class InvertedResidual(nn.Module):
    """MobileNetV3's block (hardswish, squeeze-excite); with ``act=nn.SiLU`` EfficientNet's MBConv."""

    def __init__(self, channels: int, expand: int = 4, kernel: int = 3, act: type[nn.Module] = nn.Hardswish):
        super().__init__()
        hidden = channels * expand
        self.expand = nn.Sequential(nn.Conv2d(channels, hidden, 1, bias=False), nn.BatchNorm2d(hidden), act())
        self.depthwise = nn.Sequential(nn.Conv2d(hidden, hidden, kernel, 1, kernel // 2, groups=hidden, bias=False),
                                       nn.BatchNorm2d(hidden), act())
        self.se = SqueezeExcite(hidden, max(hidden // 4, 8))
        self.project = nn.Sequential(nn.Conv2d(hidden, channels, 1, bias=False), nn.BatchNorm2d(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.project(self.se(self.depthwise(self.expand(x))))


class DenseBlock(nn.Module):
    """DenseNet's block: each layer (BN-ReLU-1x1-BN-ReLU-3x3) sees the concatenation of all before it."""

    def __init__(self, channels: int, layers: int = 4, growth: int = 8):
        super().__init__()
        self.layers = nn.ModuleList()
        for i in range(layers):
            cin = channels + i * growth
            self.layers.append(nn.Sequential(
                nn.BatchNorm2d(cin), nn.ReLU(), nn.Conv2d(cin, 4 * growth, 1, bias=False),
                nn.BatchNorm2d(4 * growth), nn.ReLU(), nn.Conv2d(4 * growth, growth, 3, padding=1, bias=False)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = [x]
        for layer in self.layers:
            features.append(layer(torch.cat(features, 1)))
        return torch.cat(features, 1)


class ConvNeXtBlock(nn.Module):
    """ConvNeXt's block: depthwise 7x7, LayerNorm over channels in channels-last, MLP with GELU, layer scale."""

    def __init__(self, channels: int):
        super().__init__()
        self.dwconv = nn.Conv2d(channels, channels, 7, padding=3, groups=channels)
        self.norm = nn.LayerNorm(channels, eps=1e-6)
        self.fc1, self.fc2 = nn.Linear(channels, 4 * channels), nn.Linear(4 * channels, channels)
        self.gamma = nn.Parameter(torch.full((channels,), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.dwconv(x).permute(0, 2, 3, 1)  # N, H, W, C
        y = self.gamma * self.fc2(F.gelu(self.fc1(self.norm(y))))
        return x + y.permute(0, 3, 1, 2)


class _Image(nn.Module):
    """Wraps a block so its forward takes ``x=`` like the specs' inputs."""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.block = block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


def _block(name: str, make: Callable[[int], nn.Module], size: Size, dtype: torch.dtype) -> ModelSpec:
    def build() -> nn.Module:
        torch.manual_seed(0)
        return as_trained(_Image(make(size.channels)), _image(4, size.channels, size.image, "cpu", torch.float32))

    def inputs(batch, device, dtype, train):
        return dict(x=_image(batch, size.channels, size.image, device, dtype))
    return ModelSpec(name, "block", dtype, build, inputs, logits=lambda out: out, batches=(1, 32))


def cnn_blocks(size: Size, dtype: torch.dtype = torch.float32) -> list[ModelSpec]:
    """The plain-PyTorch CNN blocks."""
    return [
        _block("resnet-bottleneck", lambda c: Bottleneck(c, c // 2), size, dtype),
        _block("mobilenetv3-block", lambda c: InvertedResidual(c), size, dtype),
        _block("efficientnet-mbconv", lambda c: InvertedResidual(c, expand=6, kernel=5, act=nn.SiLU), size, dtype),
        _block("densenet-block", lambda c: DenseBlock(c), size, dtype),
        _block("convnext-block", lambda c: ConvNeXtBlock(c), size, dtype),
    ]


def as_trained(model: nn.Module, *examples: torch.Tensor) -> nn.Module:
    """A random-weight model made to compute as a trained one does, so that a comparison of its outputs
    tests every layer. Returns the model in eval mode.

    * Scales and shifts that an initialisation sets to one value (normalisation weights 1 and biases 0;
      timm's ``zero_init_last`` zeroes each residual branch's last batch norm scale and ConvNeXt's layer
      scale is 1e-6, so those branches add nothing to the output and an error in them would pass
      unseen) are drawn afresh: biases from U(-0.1, 0.1), other parameters (scales) from U(0.5, 1.5).
    * BatchNorm layers get running statistics from a few training-mode batches of ``examples``: with
      the initial ones (mean 0, variance 1) activations of a deep random CNN grow layer by layer until
      fp16 overflows."""
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dtype.is_floating_point and p.numel() > 1 and bool((p == p.flatten()[0]).all()):
                shift = name.rsplit(".", 1)[-1] == "bias"
                p.copy_(torch.rand(p.shape, generator=gen) * (0.2 if shift else 1.0) - (0.1 if shift else -0.5))
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    momenta = [m.momentum for m in norms]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # cumulative average over the calibration batches
    model.train()
    with torch.no_grad():
        for x in examples:
            model(x)
    for m, momentum in zip(norms, momenta):
        m.momentum = momentum
    return model.eval()


# ------------------------------------------------------------------------------------------------ RNNs

class RecurrentLanguageModel(nn.Module):
    """Embedding -> 2-layer ``rnn`` (``nn.LSTM``, ``nn.GRU`` or ``nn.RNN``; batch first) -> vocabulary
    projection."""

    def __init__(self, vocab: int, hidden: int, layers: int = 2, rnn: type[nn.RNNBase] = nn.LSTM):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.rnn = rnn(hidden, hidden, layers, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(self.embed(input_ids))[0])


class GRUCellLanguageModel(nn.Module):
    """Embedding -> ``nn.GRUCell`` unrolled over the sequence in Python -> vocabulary projection."""

    def __init__(self, vocab: int, hidden: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.cell = nn.GRUCell(hidden, hidden)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        h = x.new_zeros(x.shape[0], self.cell.hidden_size)
        outputs = []
        for t in range(x.shape[1]):
            h = self.cell(x[:, t], h)
            outputs.append(h)
        return self.head(torch.stack(outputs, 1))


def rnns(size: Size, dtype: torch.dtype = torch.float32) -> list[ModelSpec]:
    vocab = size.vocab or 10000
    # the suite's RNNs: hidden 512 over 32 steps (an unrolled cell, and Dynamo's LSTM, trace one step each)
    hidden, seq = (512, 32) if size is SUITE else (size.hidden, size.seq)

    def spec(name: str, make: Callable[[], nn.Module]) -> ModelSpec:
        def build() -> nn.Module:
            torch.manual_seed(0)
            return make().eval()

        def inputs(batch, device, dtype, train):
            return dict(input_ids=_ids(batch, seq, vocab, device))
        return ModelSpec(name, "rnn", dtype, build, inputs, logits=lambda out: out)
    return [spec("lstm", lambda: RecurrentLanguageModel(vocab, hidden)),
            spec("grucell-unrolled", lambda: GRUCellLanguageModel(vocab, hidden))]


# --------------------------------------------------------------------------------- whole CNNs (GPU suite)

def vision_cnns(dtype: torch.dtype = torch.float16) -> list[ModelSpec]:
    """torchvision's ResNet-50, MobileNetV3-Large, EfficientNet-B0, DenseNet-121 and ConvNeXt-T at 224x224
    (timm's when torchvision is missing), random weights, BatchNorm calibrated on random images."""
    names = {  # suite name: (torchvision builder, timm name)
        "resnet50": ("resnet50", "resnet50"),
        "mobilenetv3": ("mobilenet_v3_large", "mobilenetv3_large_100"),
        "efficientnet-b0": ("efficientnet_b0", "efficientnet_b0"),
        "densenet121": ("densenet121", "densenet121"),
        "convnext-t": ("convnext_tiny", "convnext_tiny"),
    }

    def spec(name: str, tv: str, tm: str) -> ModelSpec:
        def build() -> nn.Module:
            torch.manual_seed(0)
            try:
                import torchvision
                model = getattr(torchvision.models, tv)(weights=None)
            except ImportError:
                import timm
                model = timm.create_model(tm, pretrained=False)
            return as_trained(model, *(_image(8, 3, 224, "cpu", torch.float32) for _ in range(2)))

        def inputs(batch, device, dtype, train):
            return dict(x=_image(batch, 3, 224, device, dtype))
        return ModelSpec(name, "cnn", dtype, build, inputs, logits=lambda out: out, batches=(1, 32))
    return [spec(name, tv, tm) for name, (tv, tm) in names.items()]
