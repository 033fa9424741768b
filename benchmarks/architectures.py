"""More architectures than the models suite, as a new user would try them: transformers models at tiny
configs on the CPU (kernels in Triton's interpreter) and, on a GPU, also timm's image models at their
own sizes; minicomp against eager, the forward's logits and a training step's gradients; language
models on token ids, vision models on images (transformers': 64x64). A correctness sweep, not a
benchmark: it times nothing but the whole check. On a GPU everything runs in fp32 without TF32.

    python benchmarks/architectures.py                 # every architecture below, one process each
    python benchmarks/architectures.py mistral levit   # some of them
    python benchmarks/architectures.py --device cuda --jobs 8 transformers timm   # on a GPU, also timm's

Each architecture runs in a process of its own (a crash is a result). Per architecture: ``fwd`` the
relative error ‖a − b‖/‖b‖ of the logits (``torch.no_grad()``, eval), ``grads`` the parameters whose
gradients differ after ``(logits * cotangent).sum().backward()`` in train mode
(``model_zoo.gradient_mismatches``; where some differ from eager's, the same step in float64 referees:
a gradient as close to float64's as eager's is right — for image models, as eager's NCHW or
channels-last run, whichever is further: training-mode batch norm makes these steps ill-conditioned
in their own rounding), with every dropout and layer-drop probability
of the config set to 0 (random masks would differ between the two runs), and the fallback ops and
whole-graph fallbacks of the compiled forward. OK: ``fwd`` <= 1e-4, no gradient mismatch, no
whole-graph fallback.

The builders take a size (``Dims``): ``TINY``, this sweep's, or ``GPU``, realistic sizes for timing
(hidden 768, 12 heads, 4 layers, sequence 512, vocabulary 32000, 224x224 images with the convolutional
and hybrid vision models at their configs' defaults), which ``corpus.py`` measures.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import copy
import os
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # check the checkout this script is in

import torch  # noqa: E402

import minicomp  # noqa: E402
import model_zoo as zoo  # noqa: E402

os.environ.setdefault("MINICOMP_CPU", "interpret")  # on the CPU: minicomp's kernels, in Triton's interpreter


@dataclass(frozen=True)
class Dims:
    """The sizes the builders take: ``TINY``, the CPU sweep's; ``GPU``, realistic ones (``corpus.py``)."""
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    seq: int
    positions: int    # max_position_embeddings
    batch: int        # language models' batch
    image: int        # image side (timm models: their own)
    images: int       # transformers vision models' batch
    timm_images: int  # timm models' batch

    @property
    def tiny(self) -> bool:
        """Tiny stages for the convolutional and hybrid vision models (else their configs' defaults)."""
        return self.image < 128


TINY = Dims(hidden=32, layers=2, heads=4, kv_heads=2, ffn=64, vocab=96, seq=16, positions=64, batch=2, image=64,
            images=4, timm_images=2)
# batch norm in training over fewer pixels is ill-conditioned: eager's own gradients then differ from
# float64 by several percent (ResNet at 32x32, batch 2: 5.8 %), hence TINY's 64x64 images, 4 of them
GPU = Dims(hidden=768, layers=4, heads=12, kv_heads=4, ffn=3072, vocab=32000, seq=512, positions=1024, batch=8,
           image=224, images=32, timm_images=32)


def architectures(dims: Dims = TINY) -> dict:
    """name -> (model class, config): decoders (rotary, grouped-query heads, sliding windows, parallel
    blocks, ALiBi) and encoders (relative positions, shared layers, factorised embeddings)."""
    import transformers as T
    T.logging.set_verbosity_error()  # tiny vocabularies: the configs' default special-token ids are out of range
    d, head_dim = dims, dims.hidden // dims.heads
    common = dict(vocab_size=d.vocab, hidden_size=d.hidden, num_hidden_layers=d.layers, num_attention_heads=d.heads,
                  intermediate_size=d.ffn)
    decoder = dict(common, num_key_value_heads=d.kv_heads, max_position_embeddings=d.positions)
    encoder = dict(common, max_position_embeddings=d.positions)
    window = d.seq // 2  # sliding windows shorter than the sequence
    return {
        "mistral": (T.MistralForCausalLM, T.MistralConfig(**decoder, sliding_window=window)),
        "qwen2": (T.Qwen2ForCausalLM, T.Qwen2Config(**decoder)),
        "qwen3": (T.Qwen3ForCausalLM, T.Qwen3Config(**decoder, head_dim=head_dim)),
        "gemma": (T.GemmaForCausalLM, T.GemmaConfig(**decoder, head_dim=head_dim)),
        "gemma2": (T.Gemma2ForCausalLM, T.Gemma2Config(**decoder, head_dim=head_dim, sliding_window=window)),
        "phi3": (T.Phi3ForCausalLM, T.Phi3Config(**decoder, pad_token_id=0)),
        "phi": (T.PhiForCausalLM, T.PhiConfig(**common, max_position_embeddings=d.positions)),
        "gpt_neox": (T.GPTNeoXForCausalLM, T.GPTNeoXConfig(**encoder, rotary_pct=0.5)),
        "opt": (T.OPTForCausalLM, T.OPTConfig(vocab_size=d.vocab, hidden_size=d.hidden, num_hidden_layers=d.layers,
                                              num_attention_heads=d.heads, ffn_dim=d.ffn,
                                              max_position_embeddings=d.positions, word_embed_proj_dim=d.hidden)),
        "falcon": (T.FalconForCausalLM, T.FalconConfig(vocab_size=d.vocab, hidden_size=d.hidden,
                                                       num_hidden_layers=d.layers, num_attention_heads=d.heads)),
        "gptj": (T.GPTJForCausalLM, T.GPTJConfig(vocab_size=d.vocab, n_embd=d.hidden, n_layer=d.layers, n_head=d.heads,
                                                 rotary_dim=head_dim // 2, n_positions=d.positions)),
        "bloom": (T.BloomForCausalLM, T.BloomConfig(vocab_size=d.vocab, hidden_size=d.hidden, n_layer=d.layers,
                                                    n_head=d.heads)),
        "distilbert": (T.DistilBertForMaskedLM, T.DistilBertConfig(vocab_size=d.vocab, dim=d.hidden, n_layers=d.layers,
                                                                   n_heads=d.heads, hidden_dim=d.ffn)),
        "roberta": (T.RobertaForMaskedLM, T.RobertaConfig(**encoder)),
        "electra": (T.ElectraForMaskedLM, T.ElectraConfig(**encoder, embedding_size=d.hidden)),
        "albert": (T.AlbertForMaskedLM, T.AlbertConfig(**encoder, embedding_size=16 if d.tiny else 128)),
        "deberta_v2": (T.DebertaV2ForMaskedLM, T.DebertaV2Config(**encoder)),
        "mpnet": (T.MPNetForMaskedLM, T.MPNetConfig(**encoder)),
    }


def vision_architectures(dims: Dims = TINY) -> dict:
    """name -> (model class, config), on ``dims.image``-pixel images: ViT variants (relative position bias,
    layer scale), hybrid and convolutional ones (batch norm, grouped convolutions, pooling mixers); at
    full size (``dims.tiny`` false) the latter at their configs' defaults (ResNet-50, RegNetY-4GF,
    MobileViT-S, MiT-b0, Swin-V2-T, PoolFormer-S12, LeViT-128S, ConvNeXt-V2-T)."""
    import transformers as T
    T.logging.set_verbosity_error()
    d, tiny = dims, dims.tiny
    vit = dict(hidden_size=d.hidden, num_hidden_layers=d.layers, num_attention_heads=d.heads, intermediate_size=d.ffn,
               image_size=d.image, patch_size=8 if tiny else 16)
    stages = dict(hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 1, 1]) if tiny else {}

    def small(**kw) -> dict:
        return kw if tiny else {}
    return {
        "deit": (T.DeiTForImageClassification, T.DeiTConfig(**vit)),
        "beit": (T.BeitForImageClassification, T.BeitConfig(**vit, use_relative_position_bias=True)),
        "dinov2": (T.Dinov2Model, T.Dinov2Config(**vit)),
        "clip_vision": (T.CLIPVisionModel, T.CLIPVisionConfig(**vit)),
        "convnextv2": (T.ConvNextV2ForImageClassification, T.ConvNextV2Config(**stages, image_size=d.image)),
        "resnet": (T.ResNetForImageClassification, T.ResNetConfig(**stages, **small(embedding_size=8))),
        "regnet": (T.RegNetForImageClassification, T.RegNetConfig(**stages, **small(embedding_size=8, groups_width=8))),
        "mobilevit": (T.MobileViTForImageClassification, T.MobileViTConfig(
            image_size=d.image, **small(hidden_sizes=[16, 24, 32], neck_hidden_sizes=[8, 8, 16, 16, 24, 24, 32]))),
        "segformer": (T.SegformerForSemanticSegmentation, T.SegformerConfig(**small(
            hidden_sizes=[8, 16, 24, 32], decoder_hidden_size=32, depths=[1, 1, 1, 1], num_attention_heads=[1, 1, 2, 2]))),
        "swinv2": (T.Swinv2ForImageClassification, T.Swinv2Config(image_size=d.image, **small(
            patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4))),
        "poolformer": (T.PoolFormerForImageClassification, T.PoolFormerConfig(**stages, **small(num_encoder_blocks=4))),
        "levit": (T.LevitForImageClassification, T.LevitConfig(image_size=d.image, **small(
            hidden_sizes=[16, 24, 32], num_attention_heads=[1, 2, 2], depths=[1, 1, 1], key_dim=[8, 8, 8]))),
    }


TIMM = ["resnet18", "resnet50d", "seresnext26d_32x4d", "resnest14d", "res2net50_26w_4s", "skresnet18",
        "regnety_016", "repvgg_a0", "mobileone_s0", "dla34", "dpn68", "densenet121", "inception_v3",
        "vgg11_bn", "hrnet_w18_small", "cspresnet50", "selecsls42b", "efficientnet_b0", "efficientnetv2_rw_t",
        "mobilenetv2_100", "mobilenetv3_large_100", "ghostnet_100", "mnasnet_100", "lcnet_050", "rexnet_100",
        "tinynet_a", "hgnetv2_b0", "eca_nfnet_l0", "convnext_tiny", "convnextv2_atto", "edgenext_xx_small",
        "fastvit_t8", "efficientformer_l1", "mobilevit_xxs", "poolformer_s12", "vit_tiny_patch16_224",
        "deit_tiny_distilled_patch16_224", "eva02_tiny_patch14_224", "cait_xxs24_224", "xcit_nano_12_p16_224",
        "swin_tiny_patch4_window7_224", "levit_128s", "coat_lite_tiny", "pit_ti_224", "crossvit_tiny_240",
        "visformer_tiny", "mixer_b16_224", "resmlp_12_224", "gmlp_s16_224", "coatnet_0_rw_224",
        "maxvit_nano_rw_256"]
"""timm models (``timm:<name>``; the GPU machine has timm): one or two of each family, at their own
input size, batch ``Dims.timm_images``."""


def _output(out) -> torch.Tensor:
    """The tensor compared: logits, else the pooled output (which every parameter reaches; CLIP's
    last hidden state skips its final layer norm), else the last hidden state."""
    if isinstance(out, torch.Tensor):
        return out
    for key in ("logits", "pooler_output", "last_hidden_state"):
        if getattr(out, key, None) is not None:
            return getattr(out, key)
    return out[0]


def build(name: str, device: str, dims: Dims = TINY, batch: int | None = None) -> tuple[torch.nn.Module, dict]:
    """The model (eval mode, on ``device``) and its keyword inputs (``batch``: the dims' batch if None)."""
    if name.startswith("timm:"):
        import timm
        torch.manual_seed(0)
        try:
            model = timm.create_model(name[5:], pretrained=False, drop_rate=0.0, drop_path_rate=0.0)
        except TypeError:  # a model without those options has no dropout to turn off
            model = timm.create_model(name[5:], pretrained=False)
        model = model.to(device)
        size = model.pretrained_cfg.get("input_size", (3, 224, 224))
        examples = [torch.randn(2, *size, device=device) for _ in range(2)]
        model = zoo.as_trained(model, *examples)
        return model, dict(x=torch.randn(batch or dims.timm_images, *size, device=device))
    vision = vision_architectures(dims)
    cls, config = vision[name] if name in vision else architectures(dims)[name]
    for key, value in list(vars(config).items()):  # no random masks in training mode
        if "drop" in key and isinstance(value, float):
            setattr(config, key, 0.0)
    torch.manual_seed(0)
    model = cls(config).eval().to(device)
    if name in vision:  # batch-norm statistics calibrated on the device (GPU sizes: 32 images of 224x224)
        model = zoo.as_trained(model, torch.randn(dims.images, 3, dims.image, dims.image).to(device))
        shape = (batch or dims.images, 3, dims.image, dims.image)
        inputs = dict(pixel_values=torch.randn(*shape, generator=torch.Generator().manual_seed(0)))
    else:
        shape = (batch or dims.batch, dims.seq)
        inputs = dict(input_ids=torch.randint(0, dims.vocab, shape, generator=torch.Generator().manual_seed(0)))
    return model.to(device), {k: v.to(device) for k, v in inputs.items()}


def _training_step(model: torch.nn.Module, inputs: dict, cotangent: torch.Tensor) -> None:
    """``(output * cotangent).sum().backward()``."""
    (_output(model(**inputs)) * cotangent).sum().backward()


def check(name: str, device: str = "cpu") -> str:
    """One architecture's line."""
    model, inputs = build(name, device)
    start = time.perf_counter()
    before = len(minicomp.reports())
    with torch.no_grad():
        expected = _output(model(**inputs))
        actual = _output(minicomp.compile(model)(**inputs))
    fwd = zoo.relative_error(actual, expected)
    reports = minicomp.reports()[before:]
    fallbacks = sorted({f.op for r in reports for f in r.fallbacks})
    whole = [r.whole_graph_fallback[:120] for r in reports if r.whole_graph_fallback]
    reference, compiled = copy.deepcopy(model).train(), copy.deepcopy(model).train()
    cotangent = torch.randn(expected.shape, generator=torch.Generator().manual_seed(1)).to(device)
    _training_step(reference, inputs, cotangent)
    torch._dynamo.reset()
    _training_step(minicomp.compile(compiled), inputs, cotangent)
    wrong, referee = zoo.gradient_mismatches(reference, compiled), ""
    if wrong:  # judged against float64 as well: is eager's fp32 the closer one?
        exact = copy.deepcopy(model).double().train()
        doubled = {k: v.double() if v.is_floating_point() else v for k, v in inputs.items()}
        _training_step(exact, doubled, cotangent.double())
        differ, wrong = len(wrong), zoo.gradient_mismatches(reference, compiled, exact=exact)
        referee = f" ({differ} differ from eager's; float64 referee)"
        images = {k: v for k, v in inputs.items() if v.is_floating_point() and v.dim() == 4}
        if wrong and images:  # eager run channels-last too: how far eager's own valid ways spread
            other = copy.deepcopy(model).train().to(memory_format=torch.channels_last)
            last = {k: v.contiguous(memory_format=torch.channels_last) if k in images else v for k, v in inputs.items()}
            _training_step(other, last, cotangent)
            wrong = zoo.gradient_mismatches(reference, compiled, exact=exact, alternatives=(other,))
            referee = f" ({differ} differ from eager's; float64 referee, eager channels-last too)"
    ok = fwd <= 1e-4 and not wrong and not whole
    return (f"{name}: {'OK' if ok else 'FAIL'} fwd {fwd:.1e}, gradients wrong {len(wrong)}{referee} {wrong[:2]}, "
            f"fallback ops {fallbacks}, whole-graph fallbacks {whole}, {time.perf_counter() - start:.0f} s")


def _child(name: str, device: str, timeout: float) -> str:
    """``check(name)`` in a process of its own: a crash or a hang is that architecture's result."""
    try:
        run = subprocess.run([sys.executable, __file__, "--child", "--device", device, name],
                             capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"{name}: CRASH (over {timeout:.0f} s)"
    line = next((ln for ln in run.stdout.splitlines() if ln.startswith(f"{name}: ")), None)
    tail = run.stderr.strip().splitlines()[-1:]
    if line is None and any("Unknown model" in ln or "No module named 'timm'" in ln for ln in tail):
        return f"{name}: SKIP {tail}"
    return line or f"{name}: CRASH (exit {run.returncode}) {tail}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("names", nargs="*", help="architectures; 'transformers' (the default) or 'timm' for a family")
    p.add_argument("--device", default="cpu")
    p.add_argument("--jobs", type=int, default=1, help="architectures checked at once")
    p.add_argument("--time-limit", type=float, default=None, help="start no architecture after this many seconds")
    p.add_argument("--timeout", type=float, default=1800, help="seconds one architecture may take")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        warnings.filterwarnings("ignore")
        # fp32 without TF32 on a GPU too: a relative error of 1e-4 then means what it means on the CPU
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
        print(check(args.names[0], args.device), flush=True)
        return
    families = {"transformers": [*architectures(), *vision_architectures()], "timm": [f"timm:{n}" for n in TIMM]}
    names = [n for name in args.names or ["transformers"] for n in families.get(name, [name])]
    start = time.perf_counter()

    def one(name: str) -> str:
        if args.time_limit and time.perf_counter() - start > args.time_limit:
            return f"{name}: NOT RUN (time limit)"
        line = _child(name, args.device, args.timeout)
        print(line, flush=True)
        return line
    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        lines = list(pool.map(one, names))
    print("\n".join(["", *lines]))
    ran = [ln for ln in lines if ": SKIP" not in ln and ": NOT RUN" not in ln]
    print(f"{sum(': OK ' in ln for ln in ran)} of {len(ran)} OK ({len(lines) - len(ran)} skipped or not run)")


if __name__ == "__main__":
    main()
