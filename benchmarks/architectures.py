"""More transformers architectures than the models suite, as a new user would try them: tiny configs on
the CPU (kernels in Triton's interpreter), minicomp against eager, the forward's logits and a training
step's gradients; language models on token ids, vision models on 64x64 images. A correctness sweep,
not a benchmark: it times nothing but the whole check.

    python benchmarks/architectures.py                 # every architecture below, one process each
    python benchmarks/architectures.py mistral levit   # some of them

Each architecture runs in a process of its own (a crash is a result). Per architecture: ``fwd`` the
relative error ‖a − b‖/‖b‖ of the logits (``torch.no_grad()``, eval), ``grads`` the parameters whose
gradients differ after ``(logits * cotangent).sum().backward()`` in train mode
(``model_zoo.gradient_mismatches``), with every dropout and layer-drop probability of the config set
to 0 (random masks would differ between the two runs), and the fallback ops and whole-graph
fallbacks of the compiled forward. OK: ``fwd`` <= 1e-4, no gradient mismatch, no whole-graph fallback.
"""
from __future__ import annotations

import copy
import subprocess
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # check the checkout this script is in

import torch  # noqa: E402

import minicomp  # noqa: E402
import model_zoo as zoo  # noqa: E402

HIDDEN, LAYERS, HEADS, KV_HEADS, FFN, VOCAB, SEQ, BATCH = 32, 2, 4, 2, 64, 96, 16, 2
IMAGE, IMAGES = 64, 4  # batch norm in training over fewer pixels is ill-conditioned: eager's own
# gradients then differ from float64 by several percent (ResNet at 32x32, batch 2: 5.8 %)


def architectures() -> dict:
    """name -> (model class, config): decoders (rotary, grouped-query heads, sliding windows, parallel
    blocks, ALiBi) and encoders (relative positions, shared layers, factorised embeddings)."""
    import transformers as T
    T.logging.set_verbosity_error()  # tiny vocabularies: the configs' default special-token ids are out of range
    common = dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                  intermediate_size=FFN)
    decoder = dict(common, num_key_value_heads=KV_HEADS, max_position_embeddings=64)
    encoder = dict(common, max_position_embeddings=64)
    return {
        "mistral": (T.MistralForCausalLM, T.MistralConfig(**decoder, sliding_window=8)),
        "qwen2": (T.Qwen2ForCausalLM, T.Qwen2Config(**decoder)),
        "qwen3": (T.Qwen3ForCausalLM, T.Qwen3Config(**decoder, head_dim=8)),
        "gemma": (T.GemmaForCausalLM, T.GemmaConfig(**decoder, head_dim=8)),
        "gemma2": (T.Gemma2ForCausalLM, T.Gemma2Config(**decoder, head_dim=8, sliding_window=8)),
        "phi3": (T.Phi3ForCausalLM, T.Phi3Config(**decoder, pad_token_id=0)),
        "phi": (T.PhiForCausalLM, T.PhiConfig(**common, max_position_embeddings=64)),
        "gpt_neox": (T.GPTNeoXForCausalLM, T.GPTNeoXConfig(**encoder, rotary_pct=0.5)),
        "opt": (T.OPTForCausalLM, T.OPTConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                                              num_attention_heads=HEADS, ffn_dim=FFN, max_position_embeddings=64,
                                              word_embed_proj_dim=HIDDEN)),
        "falcon": (T.FalconForCausalLM, T.FalconConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                                                       num_attention_heads=HEADS)),
        "gptj": (T.GPTJForCausalLM, T.GPTJConfig(vocab_size=VOCAB, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS,
                                                 rotary_dim=4, n_positions=64)),
        "bloom": (T.BloomForCausalLM, T.BloomConfig(vocab_size=VOCAB, hidden_size=HIDDEN, n_layer=LAYERS, n_head=HEADS)),
        "distilbert": (T.DistilBertForMaskedLM, T.DistilBertConfig(vocab_size=VOCAB, dim=HIDDEN, n_layers=LAYERS,
                                                                   n_heads=HEADS, hidden_dim=FFN)),
        "roberta": (T.RobertaForMaskedLM, T.RobertaConfig(**encoder)),
        "electra": (T.ElectraForMaskedLM, T.ElectraConfig(**encoder, embedding_size=HIDDEN)),
        "albert": (T.AlbertForMaskedLM, T.AlbertConfig(**encoder, embedding_size=16)),
        "deberta_v2": (T.DebertaV2ForMaskedLM, T.DebertaV2Config(**encoder)),
        "mpnet": (T.MPNetForMaskedLM, T.MPNetConfig(**encoder)),
    }


def vision_architectures() -> dict:
    """name -> (model class, config), on ``IMAGE``-pixel images: ViT variants (relative position bias,
    layer scale), hybrid and convolutional ones (batch norm, grouped convolutions, pooling mixers)."""
    import transformers as T
    T.logging.set_verbosity_error()
    vit = dict(hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS, intermediate_size=FFN,
               image_size=IMAGE, patch_size=8)
    stages = dict(hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 1, 1])
    return {
        "deit": (T.DeiTForImageClassification, T.DeiTConfig(**vit)),
        "beit": (T.BeitForImageClassification, T.BeitConfig(**vit, use_relative_position_bias=True)),
        "dinov2": (T.Dinov2Model, T.Dinov2Config(**vit)),
        "clip_vision": (T.CLIPVisionModel, T.CLIPVisionConfig(**vit)),
        "convnextv2": (T.ConvNextV2ForImageClassification, T.ConvNextV2Config(**stages, image_size=IMAGE)),
        "resnet": (T.ResNetForImageClassification, T.ResNetConfig(**stages, embedding_size=8)),
        "regnet": (T.RegNetForImageClassification, T.RegNetConfig(**stages, embedding_size=8, groups_width=8)),
        "mobilevit": (T.MobileViTForImageClassification, T.MobileViTConfig(
            image_size=IMAGE, hidden_sizes=[16, 24, 32], neck_hidden_sizes=[8, 8, 16, 16, 24, 24, 32])),
        "segformer": (T.SegformerForSemanticSegmentation, T.SegformerConfig(
            hidden_sizes=[8, 16, 24, 32], decoder_hidden_size=32, depths=[1, 1, 1, 1], num_attention_heads=[1, 1, 2, 2])),
        "swinv2": (T.Swinv2ForImageClassification, T.Swinv2Config(image_size=IMAGE, patch_size=4, embed_dim=16,
                                                                  depths=[1, 1], num_heads=[2, 2], window_size=4)),
        "poolformer": (T.PoolFormerForImageClassification, T.PoolFormerConfig(**stages, num_encoder_blocks=4)),
        "levit": (T.LevitForImageClassification, T.LevitConfig(image_size=IMAGE, hidden_sizes=[16, 24, 32],
                                                               num_attention_heads=[1, 2, 2], depths=[1, 1, 1],
                                                               key_dim=[8, 8, 8])),
    }


def _output(out) -> torch.Tensor:
    """The tensor compared: logits, else the pooled output (which every parameter reaches; CLIP's
    last hidden state skips its final layer norm), else the last hidden state."""
    for key in ("logits", "pooler_output", "last_hidden_state"):
        if getattr(out, key, None) is not None:
            return getattr(out, key)
    return out[0]


def check(name: str) -> str:
    """One architecture's line."""
    vision = vision_architectures()
    cls, config = vision[name] if name in vision else architectures()[name]
    for key, value in list(vars(config).items()):  # no random masks in training mode
        if "drop" in key and isinstance(value, float):
            setattr(config, key, 0.0)
    torch.manual_seed(0)
    model = cls(config).eval()
    if name in vision:
        model = zoo.as_trained(model, torch.randn(IMAGES, 3, IMAGE, IMAGE))
        inputs = dict(pixel_values=torch.randn(IMAGES, 3, IMAGE, IMAGE, generator=torch.Generator().manual_seed(0)))
    else:
        inputs = dict(input_ids=torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(0)))
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
    cotangent = torch.randn(expected.shape, generator=torch.Generator().manual_seed(1))
    (_output(reference(**inputs)) * cotangent).sum().backward()
    torch._dynamo.reset()
    (_output(minicomp.compile(compiled)(**inputs)) * cotangent).sum().backward()
    wrong = zoo.gradient_mismatches(reference, compiled)
    ok = fwd <= 1e-4 and not wrong and not whole
    return (f"{name}: {'OK' if ok else 'FAIL'} fwd {fwd:.1e}, gradients wrong {len(wrong)} {wrong[:2]}, "
            f"fallback ops {fallbacks}, whole-graph fallbacks {whole}, {time.perf_counter() - start:.0f} s")


def main() -> None:
    names = sys.argv[1:]
    if len(names) == 1:  # the child process
        warnings.filterwarnings("ignore")
        print(check(names[0]), flush=True)
        return
    lines = []
    for name in names or [*architectures(), *vision_architectures()]:
        run = subprocess.run([sys.executable, __file__, name], capture_output=True, text=True, timeout=1800)
        line = next((ln for ln in run.stdout.splitlines() if ln.startswith(f"{name}: ")), None)
        line = line or f"{name}: CRASH (exit {run.returncode}) {run.stderr.strip().splitlines()[-1:]}"
        print(line, flush=True)
        lines.append(line)
    print(f"{sum(': OK ' in ln for ln in lines)} of {len(lines)} OK")


if __name__ == "__main__":
    main()
