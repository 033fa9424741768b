"""A broad performance corpus (issue 41): ops and whole models, each row eager / Inductor / minicomp on one
GPU, one table per command.

    python benchmarks/corpus.py ops                        # -> benchmarks/results/corpus-ops.{json,md}
    python benchmarks/corpus.py models-infer --resume      # the rows an earlier (cut-short) run lacks
    python benchmarks/corpus.py models-train --only timm:resnet50d,mistral --merge
    python benchmarks/corpus.py models-infer --gpus 8 --resume   # 8 shards at once, one per GPU: one table
    python benchmarks/corpus.py ops --dry-run --no-inductor --out /tmp/corpus   # CPU check of the script

Tables (random weights, no downloads):

* ``ops`` (``corpus_ops.py``): single ops and short fusion chains over a grid of shapes with the
  extremes (rows of 16 to 1,048,576 elements, a 2^26-element 1-D signal, 3 to 2048 channels, groups,
  4095-wide rows), fp32 and bf16: pointwise chains, reductions (sum over the last dim, dim 0 and all;
  mean, amax, amin, var, std, prod, logsumexp, vector_norm), argmax/argmin, cumsum, softmax/log_softmax,
  norms (layer, group, instance, batch in training and eval, RMS as ``nn.RMSNorm`` and as transformers'
  Llama writes it), pooling 1/2/3-D (max, avg), losses (cross-entropy, weighted NLL with
  ignore_index, MSE, Huber, BCE with logits, KL), convolutions followed by norms and activations, and
  attention written out (q·kᵀ/√d, softmax, ·v: plain, causal through a tril buffer, padding-masked, with
  an additive bias; B8 H12 T512 D64, B256 T64, B2 T2048).
* ``models-infer``: every model ``architectures.py`` builds — its 30 transformers architectures at
  realistic sizes (``architectures.GPU``: hidden 768, 12 heads (4 key/value heads where grouped),
  4 layers, FFN 3072, vocabulary 32000, sequence 512; vision models on 224x224, the convolutional and
  hybrid ones at their configs' defaults) and its 51 timm models at their own input sizes — inference
  (eval, ``torch.no_grad()``) in fp32 and bf16 (weights and inputs), at batch 1 and a large batch
  (8 sequences, 32 images). Rows ordered by configuration (fp32 large batch, bf16 large batch, fp32 B1,
  bf16 B1), then model, so that a partial run covers every model once first. The compared tensor:
  the logits (else the pooled output, else the last hidden state).
* ``models-train``: a training step (``zero_grad``, forward, cross-entropy on random labels outside the
  compiled module — next-token or masked-token over the vocabulary, image classes, segmentation
  classes per pixel — and ``backward()``; no optimizer step) for 20 of them at the large batch, in fp32
  and under bf16 autocast (fp32 weights). Every backend starts from the same weights.

fp32 is PyTorch's default precision: no TF32 for matmuls, ``torch.backends.cudnn.allow_tf32`` as PyTorch
sets it (on); both recorded in the results.

Measures (``harness.py``): Inductor is ``torch.compile(m)``, minicomp ``torch.compile(m, backend="minicomp")``.
Times: median of ``--rounds`` (ops 2, models 3) interleaved rounds of ``triton.testing.do_bench`` (median,
warmup 25 ms, rep 100 ms, L2 flushed), plain calls, no CUDA graphs; a row above 1.10x Inductor's time is
timed again as calls back to back (``<backend>_loop_ms``, ``harness.back_to_back``). ``correct``: against eager as in
``harness.py`` (inference: ‖a − b‖/‖b‖ ≤ 1e-4 fp32, 3e-2 bf16, else a float64 referee; integer outputs
exact; training: loss and gradients 1e-3 fp32, 5e-2 bf16 autocast, float64 referee). ``kernels``:
minicomp's compiled kernels over the row's graphs; ``minicomp_vs_eager``, ``minicomp_vs_inductor``: time
ratios (below 1: minicomp faster). The Markdown's summary: geomean minicomp ÷ Inductor, rows above 1.10×
and 1.25× Inductor's time, rows slower than eager where Inductor is faster than eager, incorrect rows.

Chunks: a table need not fit one run. The results are rewritten after every row; ``--time-limit`` (default
500 s of the process) starts no row after it, ``--deadline`` (540 s) stops the row still running (it says
"not run"); ``--resume`` adds only the rows the file lacks; ``--shard I/N`` takes every N-th selected row;
``--only`` selects rows by name; ``--merge`` measures selected rows again into the existing file;
``--row-timeout`` (ops 120 s, models 300 s, training 420 s) records a slower row as a timeout. A crash
that loses the CUDA context hands the remaining rows to a new process.

``--dry-run``: the CPU at tiny sizes (``corpus_ops``' dry shapes, ``architectures.TINY``), minicomp in
Triton's interpreter, Inductor's C++ (``--no-inductor`` skips it), ``time.perf_counter`` timing, rows
whose packages are missing (timm) skipped; it checks the script, not the compilers. Files:
``corpus-<table>-dry.{json,md}`` in ``--out`` (required; never ``benchmarks/results``).
"""
from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmark the checkout this script is in

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import architectures as arch  # noqa: E402
import corpus_ops  # noqa: E402
import harness  # noqa: E402
from common import RESULTS  # noqa: E402
from harness import DTYPES, Case, Work  # noqa: E402

TRAIN = ["mistral", "qwen3", "gemma2", "phi", "gpt_neox", "opt", "roberta", "deberta_v2",
         "deit", "swinv2", "convnextv2", "segformer",
         "timm:resnet50d", "timm:efficientnet_b0", "timm:mobilenetv3_large_100", "timm:convnext_tiny",
         "timm:vit_tiny_patch16_224", "timm:densenet121", "timm:regnety_016", "timm:maxvit_nano_rw_256"]
"""The models of ``models-train``: 8 language models, 4 transformers vision models, 8 timm models."""


@functools.cache
def _vision() -> tuple[str, ...]:
    return tuple(arch.vision_architectures())


def model_names() -> list[str]:
    return [*arch.architectures(), *_vision(), *(f"timm:{n}" for n in arch.TIMM)]


def large_batch(name: str, dims: arch.Dims) -> int:
    if name.startswith("timm:"):
        return dims.timm_images
    return dims.images if name in _vision() else dims.batch


def _built(name: str, device: str, dry: bool, batch: int | None) -> tuple[torch.nn.Module, dict, str]:
    """``architectures.build`` at the row's dims: the model, its inputs and the row's shape label."""
    dims = arch.TINY if dry else arch.GPU
    model, inputs = arch.build(name, device, dims, batch=batch)
    x = next(iter(inputs.values()))
    shape = (f"B{x.shape[0]} T{x.shape[1]} C{dims.hidden} L{dims.layers}" if x.dim() == 2
             else f"B{x.shape[0]} {x.shape[-2]}x{x.shape[-1]}")
    return model, inputs, shape


def _inference(name: str, dtype: str, batch: int | None) -> Callable[[str, bool], Work]:
    """``batch`` None: the large batch."""
    def make(device: str, dry: bool) -> Work:
        model, inputs, shape = _built(name, device, dry, batch)
        t = DTYPES[dtype]
        inputs = {k: v.to(t) if v.is_floating_point() else v for k, v in inputs.items()}
        return Work(model.to(t), (), shape, kwargs=inputs, select=arch._output)
    return make


class ClassLoss:
    """Cross-entropy of the output's logits against random labels (drawn once per shape): [B, T, V]
    next/masked tokens, [B, C] classes, [B, C, H, W] classes per pixel; a model without logits: the
    mean square of its output."""

    def __init__(self):
        self.labels: dict[tuple, torch.Tensor] = {}

    def __call__(self, out: object) -> torch.Tensor:
        x = arch._output(out)
        x = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        if not isinstance(out, torch.Tensor) and getattr(out, "logits", None) is None:
            return x.pow(2).mean()
        if x.dim() == 3:
            x = x.flatten(0, 1)
        key = (tuple(x.shape), str(x.device))
        if key not in self.labels:
            shape = (x.shape[0], *x.shape[2:])
            self.labels[key] = torch.randint(0, x.shape[1], shape, generator=torch.Generator().manual_seed(5)).to(x.device)
        return F.cross_entropy(x, self.labels[key])


def _training(name: str, dtype: str) -> Callable[[str, bool], Work]:
    def make(device: str, dry: bool) -> Work:
        model, inputs, shape = _built(name, device, dry, None)
        return Work(model.train(), (), shape, kwargs=inputs, loss=ClassLoss(), amp=dtype == "bf16")
    return make


def models_infer() -> list[Case]:
    rows = []
    for batch in (None, 1):
        for dtype in DTYPES:
            for name in model_names():
                b = large_batch(name, arch.GPU) if batch is None else batch
                rows.append(Case(f"{name} {dtype} B{b}", "inference", dtype, _inference(name, dtype, batch),
                                 ("timm",) if name.startswith("timm:") else ()))
    return rows


def models_train() -> list[Case]:
    return [Case(f"{name} train {dtype}{' autocast' if dtype == 'bf16' else ''} B{large_batch(name, arch.GPU)}",
                 "train", dtype, _training(name, dtype), ("timm",) if name.startswith("timm:") else ())
            for dtype in DTYPES for name in TRAIN]


TABLES = {  # table: (rows, its words in the Markdown, --rounds, --row-timeout)
    "ops": (corpus_ops.cases, "Op-level corpus: single ops and short fusion chains over a grid of shapes with the "
            "extremes, fp32 and bf16 (rows: `benchmarks/corpus_ops.py`).", 2, 120),
    "models-infer": (models_infer, "Models, inference: `architectures.py`'s 30 transformers architectures "
                     "(hidden 768, 12 heads, 4 layers, sequence 512; vision 224x224) and 51 timm models at their "
                     "own input sizes; fp32 and bf16, batch 1 and 8 sequences / 32 images.", 3, 300),
    "models-train": (models_train, "Models, training step (zero_grad, forward, cross-entropy on random labels, "
                     "backward; no optimizer step) at 8 sequences / 32 images, fp32 and bf16 autocast.", 3, 420),
}
MEASURES = harness.measures(
    "", "‖a − b‖/‖b‖ above 1e-4 fp32, 3e-2 bf16 and not as close to float64 as eager's; integer outputs: any "
    "differs; training: loss or a gradient above 1e-3 fp32, 5e-2 bf16 autocast, not as close to float64's as "
    "eager's or the aot_eager trace's", "corpus.py")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("table", choices=list(TABLES))
    harness.add_arguments(p, time_limit=500, row_timeout=None)
    args = p.parse_args(argv)
    _, _, rounds, row_timeout = TABLES[args.table]
    args.rounds = args.rounds or (None if args.dry_run else rounds)
    args.gpu_row_timeout = row_timeout
    return harness.finish_args(args, argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dry_run and (args.out is None or Path(args.out).resolve() == RESULTS.resolve()):
        print("--dry-run writes its files to --out DIR, never to benchmarks/results", file=sys.stderr)
        return 1
    rows, words, _, _ = TABLES[args.table]
    return harness.run(rows(), args, script=Path(__file__).resolve(), stem=f"corpus-{args.table}",
                       title=f"Corpus: {args.table}", description=f"{words} {MEASURES}")


if __name__ == "__main__":
    sys.exit(main())
