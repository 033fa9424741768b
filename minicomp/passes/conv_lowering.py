"""Convolutions in minicomp's IR: rewrite chosen ``aten.convolution`` externs (2-D, not transposed) into
nodes the templates already run, so bias, batch norm, activations and casts fuse into the same kernel.

* **1x1** (stride 1, no padding, groups 1) and **groups=1** convolutions become a ``matmul`` over
  views, accumulated in fp32: the input read through an *im2col* index map (each output position's
  ``Cin*KH*KW`` window, out-of-bounds taps masked to 0; for a 1x1 convolution a plain reshape), the
  weight through a reshape. K is ordered ``c, kh, kw`` for an NCHW input and ``kh, kw, c`` for a
  channels-last one, so the operand loads run along the input's contiguous dimension. Two forms
  (``matmul_form``):

  - ``batched``: per image ``W[Cout, K] @ X[K, OH*OW]``, batched over N. The product is the output
    in NCHW order, so its pointwise consumers (bias, batch norm, activation: NCHW-indexed) fuse as
    GEMM epilogue, and the kernel stores at whatever strides the result gets.
  - ``rows``: ``X[N*OH*OW, K] @ Wt[K, Cout]``: taller tiles, the product in NHWC order, viewed back
    to ``N, Cout, OH, OW``. NCHW-indexed consumers would read it transposed in a kernel of their own,
    so it is taken only for a channels-last input with nothing to fuse.

* **grouped** (1 < groups < Cin, at least ``GROUPED_MIN_WIDTH`` output channels and K per group):
  the ``batched`` form with the group as a second batch dim, ``W_g[Cout/G, K] @ X_g[K, OH*OW]`` per
  image and group: RegNet's 3x3 convolutions of 24 channels per group. Over NHWC data cuDNN runs these
  poorly (two thirds of its time in layout transforms, or NCHW with copies to and from the graph's
  channels-last buffers), so ``auto`` lowers them there; over NCHW data cuDNN's own kernel is faster.

* **depthwise** (groups == Cin, Cout a multiple of Cin) becomes ``sum`` over a ``[N, Cout, OH, OW,
  KH, KW]`` window view of the input times the broadcast weight: the reduction template, with
  batch norm and activation fused as reduction epilogue.

Bias is an ordinary add after the product and the result is cast to the input's dtype, as eager
computes (fp32 accumulation, one rounding). Narrower grouped convolutions stay in cuDNN (see
``GROUPED_REASON``).

A convolution kept in cuDNN on the GPU loses its bias to an ordinary add after it (``_bias_after``):
PyTorch's cuDNN path adds the bias in a kernel of its own (53 extra launches per ResNet-50 call under
``freeze``, measured), where minicomp's add fuses into the kernel that follows (batch norm,
activation, residual). oneDNN on the CPU fuses the bias itself, so there it stays an argument.

Which convolutions are rewritten: ``MINICOMP_CONV`` = ``cudnn`` (none), ``ir`` (every one this
pass can lower) or ``auto`` (default: the choice max-autotune measured, as for matmuls, in
``graph.gemm_choices``; else the rule ``ir/choices.CONV``, with its measurements). Every choice is a
decision in the report; a convolution kept as extern has its fallback reason replaced by the choice's.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from .. import config
from ..ir import choices
from ..ir.expr import Affine, Range, index_vars, unravel
from ..ir.graph import Graph, Node, extern_call
from ..ir.target import Target
from ..ir.types import short_dtype
from .gemm_choice import ATEN
from .layout_plan import channels_last_pays, conv_precision
from .simplify import view_folding

MODES = config.SETTINGS["conv"].choices
GROUPED_MIN_WIDTH = 16
GROUPED_REASON = (f"grouped convolution with fewer than {GROUPED_MIN_WIDTH} output channels (or products of K) per "
                  f"group: its per-group products are too narrow for tensor-core tiles (tl.dot needs 16); kept in "
                  f"cuDNN")
_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def conv_mode() -> str:
    """``MINICOMP_CONV`` (``cudnn``, ``ir`` or ``auto``, the default; ``config.conv``)."""
    return config.conv


@dataclass(frozen=True)
class Conv:
    """One 2-D convolution extern, read off its arguments."""
    node: Node
    x: Node
    w: Node
    bias: Node | None
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    groups: int
    channels_last: bool  # the layout eager hands the input in

    @property
    def kind(self) -> str:
        """``1x1``, ``im2col`` (any other groups=1), ``depthwise`` or ``grouped``."""
        cin, (kh, kw) = self.x.shape[1], self.w.shape[2:]
        if self.groups == 1:
            plain = (kh, kw) == (1, 1) and self.stride == (1, 1) and self.padding == (0, 0)
            return "1x1" if plain else "im2col"
        if self.groups == cin and self.w.shape[0] % cin == 0:
            return "depthwise"
        return "grouped"

    def describe(self) -> str:
        n, cin, h, w = self.x.shape
        cout, _, kh, kw = self.w.shape
        return (f"conv {self.node.name} {self.kind} {n}x{cin}x{h}x{w} -> {cout} {kh}x{kw} stride={self.stride} "
                f"padding={self.padding} dilation={self.dilation} groups={self.groups} {short_dtype(self.x.dtype)}"
                f"{' channels-last' if self.channels_last else ''}")


def parse(node: Node) -> tuple[Conv | None, str]:
    """The convolution of an extern node, or None and why this pass cannot lower it."""
    target = node.attrs.get("target")
    if target is not torch.ops.aten.convolution.default:
        return None, "not a convolution"
    args, kwargs = node.attrs["arg_tree"]
    names = [a.name for a in target._schema.arguments]
    bound = {**dict(zip(names, args)), **kwargs}
    x, w, bias = bound["input"], bound["weight"], bound.get("bias")
    if bound.get("transposed"):
        return None, "transposed convolution"
    if not isinstance(x, Node) or x.type.ndim != 4 or w.type.ndim != 4:
        return None, "not a 2-D convolution"
    if x.dtype not in _FLOATS or w.dtype != x.dtype or (bias is not None and bias.dtype != x.dtype):
        return None, f"dtypes {x.dtype}/{w.dtype}"
    if node.type.numel == 0 or x.type.numel == 0 or w.type.numel == 0:
        return None, "zero-size"
    params = [bound.get(k) for k in ("stride", "padding", "dilation")]
    if not all(isinstance(p, (list, tuple)) and len(p) == 2 and all(isinstance(v, int) for v in p) for p in params):
        return None, "stride/padding/dilation not two ints each"
    strides = (node.attrs.get("input_strides") or [None])[0] or x.attrs.get("strides")
    n, c, h, wd = x.shape
    channels_last = strides is not None and c > 1 and h * wd > 1 and strides[1] == 1
    return Conv(node, x, w, bias, *(tuple(p) for p in params), bound["groups"], channels_last), ""


def facts(conv: Conv, target: Target, channels_last: bool = False) -> choices.ConvFacts:
    """What the convolution rule reads of ``conv``; ``channels_last``: the graph's library convolutions
    will run NHWC (``layout_plan.channels_last_pays``), so cuDNN would read NHWC data (as it would an
    input given channels-last)."""
    n, cin, h, w = conv.x.shape
    return choices.ConvFacts(conv.kind, conv.x.dtype, conv_precision(conv.x.dtype, target), cin, conv.w.shape[0],
                             h, w, channels_last or conv.channels_last, conv.w.shape[2] * conv.w.shape[3], conv.groups)


def tunable(node: Node) -> bool:
    """Whether max-autotune should measure ``node`` both ways (a convolution this pass can lower, under
    ``auto``): the compiler's GEMM tuner then fixes ``graph.gemm_choices[node.id]`` (``aten``: cuDNN)."""
    conv, _ = parse(node) if node.op == "extern" else (None, "")
    return conv is not None and (conv.kind != "grouped" or grouped_fits(conv)) and conv_mode() == "auto"


def grouped_fits(conv: Conv) -> bool:
    """Whether a grouped convolution's per-group product fills tensor-core tiles: at least
    ``GROUPED_MIN_WIDTH`` output channels and reduction length per group."""
    cout, cin_g, kh, kw = conv.w.shape
    return cout // conv.groups >= GROUPED_MIN_WIDTH and cin_g * kh * kw >= GROUPED_MIN_WIDTH


def _fixed_choice(conv: Conv, graph: Graph) -> tuple[bool, str] | None:
    """The choice that does not depend on the graph's layout (None: the rule decides, knowing it)."""
    if conv.kind == "grouped" and not grouped_fits(conv):
        return False, GROUPED_REASON
    forced = choices.CONV.forced()
    if forced:
        return forced.template, str(forced)
    if conv.node.id in graph.gemm_choices:
        return graph.gemm_choices[conv.node.id] != ATEN, "measured (max-autotune)"
    return None


def _forecast_nhwc(graph: Graph, convs: dict) -> bool:
    """Whether the convolutions left to cuDNN/oneDNN would run channels-last (``layout_plan`` decides
    after fusion): those chosen for the IR skipped, the undecided grouped ones too (kept in cuDNN they
    make NHWC no likelier: ``CHANNELS_LAST_SPEEDUP``), the other undecided ones counted as library calls."""
    skip = {node for node, (conv, fixed) in convs.items() if (fixed[0] if fixed else conv.kind == "grouped")}
    return any(node not in skip for node in convs) and channels_last_pays(graph, skip=skip)[0]


def _decide(graph: Graph, convs: dict, grouped: bool) -> None:
    """The rule's choice for the undecided (grouped, or other) convolutions, given the forecast layout:
    the others first, then the grouped ones knowing which others stay library calls."""
    nhwc = _forecast_nhwc(graph, convs)
    for node, (conv, fixed) in convs.items():
        if fixed is None and (conv.kind == "grouped") == grouped:
            choice = choices.CONV(facts(conv, graph.target, nhwc), graph.target)
            convs[node] = (conv, (choice.template, str(choice)))


def conv_lowering(graph: Graph) -> Graph:
    """Rewrite the chosen convolution externs into IR (see the module docstring)."""
    graph.recompute_users()
    convs = {}
    for node in [n for n in graph.nodes if n.op == "extern"]:
        conv, why_not = parse(node)
        if conv is not None:
            convs[node] = (conv, _fixed_choice(conv, graph))
        elif node.attrs.get("target") is torch.ops.aten.convolution.default:
            graph.decisions.append(f"conv {node.name}: cuDNN/oneDNN extern (not lowered: {why_not})")
    _decide(graph, convs, grouped=False)
    _decide(graph, convs, grouped=True)
    channels_last = _forecast_nhwc(graph, convs)  # every choice made: the layout the IR's loads follow
    moved: dict[Node, Node] = {}  # a convolution rewritten (or kept, its bias moved after it) -> its result now
    for node, (conv, fixed) in convs.items():
        use_ir, reason = fixed
        conv = replace(conv, x=moved.get(conv.x, conv.x))  # (ConvNeXt, EdgeNeXt: a dwconv right after a conv)
        if not use_ir:
            graph.decisions.append(f"{conv.describe()}: cuDNN/oneDNN extern ({reason})")
            _note_reason(graph, node, f"convolution kept as extern: {reason}")
            if conv.bias is not None and graph.target.is_cuda:
                moved[node] = _bias_after(graph, conv)
            continue
        if conv.kind == "depthwise":
            how, result = "window sum (reduction)", _depthwise(graph, conv)
        else:
            form = matmul_form(conv)
            view = "a reshape" if conv.kind == "1x1" else "an im2col view"
            how = f"{form} matmul{' per group' if conv.groups > 1 else ''} over {view}"
            result = _as_matmul(graph, conv, form, conv.channels_last or channels_last)
        graph.decisions.append(f"{conv.describe()}: IR {how} ({reason})")
        graph.replace_all_uses(node, result)
        graph.nodes.remove(node)
        moved[node] = result
        _drop_fallback(graph, node)
    graph.recompute_users()
    # the views made over a view (the rows of a permuted input) as one view of a buffer: cuBLAS and the
    # program read an extern's operand as a strided view of the buffer itself
    return view_folding(graph)


# --- the rewrites -----------------------------------------------------------------------------------

def _window(conv: Conv, n, c, oh, ow, kh, kw) -> tuple[tuple[Affine, ...], tuple[Range, ...]]:
    """The input index read by output position ``(oh, ow)``'s tap ``(kh, kw)`` of channel ``c`` of image
    ``n`` (expressions), and the conditions that it lies inside the input (padding reads 0)."""
    (sh, sw), (ph, pw), (dh, dw) = conv.stride, conv.padding, conv.dilation
    _, _, height, width = conv.x.shape
    h = Affine.of(oh) * sh + Affine.of(kh) * dh - ph
    w = Affine.of(ow) * sw + Affine.of(kw) * dw - pw
    mask = []
    for e, size in ((h, height), (w, width)):
        r = Range(e, 0, size).simplified()
        if r is not True:  # never valid (an output of padding only): the unsimplified range, read as the fill
            mask.append(Range(e, 0, size) if r is False else r)
    return (Affine.of(n), Affine.of(c), h, w), tuple(mask)


def matmul_form(conv: Conv) -> str:
    """``batched`` (per image ``W @ X``: the product is NCHW-ordered, so NCHW-indexed consumers fuse
    as epilogue) or ``rows`` (``X @ Wt`` over all ``N*OH*OW`` positions: NHWC-ordered, taller
    tiles). ``rows`` for a channels-last input whose result has no pointwise consumer to fuse
    (its bias and cast are applied before the view back), and over one output pixel (both orders are
    the same there); ``batched`` for a grouped convolution (the group a second batch dim)."""
    if conv.groups > 1:
        return "batched"
    if conv.node.shape[2] * conv.node.shape[3] == 1:  # one pixel: NHWC order is NCHW order
        return "rows"
    fusible = any(u.op == "pointwise" for u in conv.node.users)
    return "rows" if conv.channels_last and not fusible else "batched"


def _k_index(k, conv: Conv, channels_last: bool) -> tuple[Affine, Affine, Affine]:
    """``(c, kh, kw)`` of reduction index ``k`` (``c`` within the group): ordered ``c, kh, kw`` (NCHW
    input: runs of ``kw`` are contiguous) or ``kh, kw, c`` (channels-last input: runs of ``c`` are)."""
    cin, (kh, kw) = conv.w.shape[1], conv.w.shape[2:]
    if channels_last:
        r, s, c = unravel(k, (kh, kw, cin))
        return c, r, s
    return unravel(k, (cin, kh, kw))


def _as_matmul(graph: Graph, conv: Conv, form: str, channels_last: bool) -> Node:
    """The product over an im2col (or reshape) view; ``channels_last``: the input will be NHWC (eager's
    or ``layout_plan``'s), which orders K. Grouped: the batched form with the group as a second batch dim."""
    node, x, w = conv.node, conv.x, conv.w
    n = x.shape[0]
    cout, cin_g, kh, kw = w.shape
    groups = conv.groups
    cout_g = cout // groups
    _, _, oh, ow = node.shape
    k, p = cin_g * kh * kw, oh * ow
    add = _adder(graph, node)
    o = index_vars(node.shape)
    if form == "batched":  # per image (and group): W[Cout/G, K] @ X[K, OH*OW]
        batch = (n,) if groups == 1 else (n, groups)
        i = index_vars((*batch, k, p))
        group = Affine.of(i[1]) if groups > 1 else Affine.of(0)
        c, r, s = _k_index(i[-2], conv, channels_last)
        index, mask = _window(conv, i[0], group * cin_g + c, *unravel(i[-1], (oh, ow)), r, s)
        b = add("view", [x], x.type.with_(shape=(*batch, k, p)), index=index, mask=mask, fill=0.0, kind="im2col")
        j = index_vars((*batch, cout_g, k))
        c, r, s = _k_index(j[-1], conv, channels_last)
        co = Affine.of(j[1]) * cout_g + j[2] if groups > 1 else Affine.of(j[1])
        a = add("view", [w], w.type.with_(shape=(*batch, cout_g, k)), index=(co, c, r, s), mask=(),
                fill=None, kind="view")
        mm = add("matmul", [a, b], node.type.with_(shape=(*batch, cout_g, p), dtype=torch.float32),
                 precision=conv_precision(conv.x.dtype, graph.target))
        channel = (Affine.of(o[1]) // cout_g, Affine.of(o[1]) % cout_g) if groups > 1 else (Affine.of(o[1]),)
        back = (Affine.of(o[0]), *channel, Affine.of(o[2]) * ow + o[3])
        # bias and cast at the result's shape: as a graph result, that node gets eager's strides
        return _finish(graph, conv, add("view", [mm], mm.type.with_(shape=node.shape), index=back, mask=(),
                                        fill=None, kind="reshape"))
    else:  # all positions: X[N*OH*OW, K] @ Wt[K, Cout]
        i = index_vars((n * p, k))
        c, r, s = _k_index(i[1], conv, channels_last)
        img, y, z = unravel(i[0], (n, oh, ow))
        index, mask = _window(conv, img, c, y, z, r, s)
        a = add("view", [x], x.type.with_(shape=(n * p, k)), index=index, mask=mask, fill=0.0, kind="im2col")
        j = index_vars((k, cout))
        c, r, s = _k_index(j[0], conv, channels_last)
        b = add("view", [w], w.type.with_(shape=(k, cout)), index=(Affine.of(j[1]), c, r, s), mask=(), fill=None,
                kind="view")
        mm = add("matmul", [a, b], node.type.with_(shape=(n * p, cout), dtype=torch.float32),
                 precision=conv_precision(conv.x.dtype, graph.target))
        back = (Affine.of(o[0]) * p + Affine.of(o[2]) * ow + o[3], Affine.of(o[1]))
    out = _finish(graph, conv, mm)
    return add("view", [out], out.type.with_(shape=node.shape), index=back, mask=(), fill=None, kind="reshape")


def _depthwise(graph: Graph, conv: Conv) -> Node:
    """``sum over (kh, kw) of x[n, co // m, window] * w[co, 0, kh, kw]`` in fp32 (m: the channel multiplier)."""
    node, x, w = conv.node, conv.x, conv.w
    n, cin, _, _ = x.shape
    cout, _, kh, kw = w.shape
    _, _, oh, ow = node.shape
    add = _adder(graph, node)
    shape = (n, cout, oh, ow, kh, kw)
    i = index_vars(shape)
    index, mask = _window(conv, i[0], Affine.of(i[1]) // (cout // cin), i[2], i[3], i[4], i[5])
    xs = add("view", [x], x.type.with_(shape=shape), index=index, mask=mask, fill=0.0, kind="window")
    ws = add("view", [w], w.type.with_(shape=shape), index=(Affine.of(i[1]), Affine.of(0), Affine.of(i[4]),
                                                          Affine.of(i[5])), mask=(), fill=None, kind="expand")
    f32 = torch.float32
    xs, ws = _cast(add, xs, f32), _cast(add, ws, f32)
    prod = add("pointwise", [xs, ws], xs.type, fn="mul", args=(xs, ws), params={})
    # one tap (a 1x1 kernel: a per-channel scale) sums nothing: the product is the result, so its kernel is
    # pointwise (a reduction's schedule gave FastViT's 1x1 branches 96 one-warp programs at batch 1)
    total = prod if kh * kw == 1 else \
        add("reduce", [prod], prod.type.with_(shape=(n, cout, oh, ow, 1, 1)), fn="sum", axes=(4, 5))
    o = index_vars(node.shape)
    out = add("view", [total], total.type.with_(shape=node.shape),
              index=(*(Affine.of(v) for v in o), Affine.of(0), Affine.of(0)), mask=(), fill=None, kind="reshape")
    return _finish(graph, conv, out)


def _finish(graph: Graph, conv: Conv, acc: Node) -> Node:
    """``acc`` (fp32; output channels along dim 1) plus the bias, cast to the convolution's dtype."""
    add = _adder(graph, conv.node)
    if conv.bias is not None:
        bias = _cast(add, _channel_bias(add, conv.bias, acc.shape), torch.float32)
        acc = add("pointwise", [acc, bias], acc.type, fn="add", args=(acc, bias), params={})
    return _cast(add, acc, conv.node.dtype)


def _bias_after(graph: Graph, conv: Conv) -> Node:
    """Replace the extern ``conv(x, w, b)`` by ``conv(x, w, None) + b`` (b broadcast over channels), in
    the convolution's dtype: eager's cuDNN path rounds the product, then adds the bias. Returns the sum."""
    node = conv.node
    args, kwargs = node.attrs["arg_tree"]
    tree = ((*args[:2], None, *args[3:]), kwargs) if len(args) > 2 else (args, {**kwargs, "bias": None})
    keep = [k for k, v in enumerate(node.inputs) if v is not conv.bias]
    inputs = [node.inputs[k] for k in keep]
    attrs = dict(node.attrs, arg_tree=tree)
    if node.attrs.get("input_strides"):
        attrs["input_strides"] = [node.attrs["input_strides"][k] for k in keep]
    bare = graph.add("extern", inputs, node.type, node.origin, before=node, **attrs)
    bare.attrs["call"] = extern_call(node.attrs["target"], tree, inputs)
    add = _adder(graph, node)
    bias = _channel_bias(add, conv.bias, node.shape)
    out = add("pointwise", [bare, bias], node.type, fn="add", args=(bare, bias), params={})
    graph.decisions.append(f"conv {node.name}: bias added after the cuDNN call as {out.name} (fuses with what follows)")
    graph.replace_all_uses(node, out)
    graph.nodes.remove(node)
    return out


def _channel_bias(add, bias: Node, shape) -> Node:
    """The per-output-channel ``bias`` broadcast to a convolution result's ``shape`` (channels: dim 1)."""
    return add("view", [bias], bias.type.with_(shape=shape), index=(Affine.of(index_vars(shape)[1]),), mask=(),
               fill=None, kind="expand")


def _adder(graph: Graph, before: Node):
    """``graph.add`` placing nodes before ``before``, with its provenance."""
    def add(op, inputs, type, **attrs) -> Node:
        return graph.add(op, inputs, type, before.origin, before=before, **attrs)
    return add


def _cast(add, x: Node, dtype: torch.dtype) -> Node:
    if x.dtype == dtype:
        return x
    return add("pointwise", [x], x.type.with_(dtype=dtype), fn="cast", args=(x,), params={"to": dtype})


def _note_reason(graph: Graph, node: Node, reason: str) -> None:
    """The report's fallback entry for ``node`` says why it stayed an extern."""
    old = (node.origin[0] if node.origin else "convolution.default", node.attrs["reason"])
    if old in graph.fallbacks:
        graph.fallbacks[graph.fallbacks.index(old)] = (old[0], reason)
    node.attrs["reason"] = reason


def _drop_fallback(graph: Graph, node: Node) -> None:
    entry = (node.origin[0] if node.origin else "convolution.default", node.attrs["reason"])
    if entry in graph.fallbacks:
        graph.fallbacks.remove(entry)
