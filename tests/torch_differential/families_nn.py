"""torch.nn families: convolutions, pooling, normalisation, losses, embedding, attention, RNNs."""

from __future__ import annotations

from .state import State, Value

LOSSES = [
    "F.mse_loss({0}, {1}, reduction='{r}')",
    "F.l1_loss({0}, {1}, reduction='{r}')",
    "F.smooth_l1_loss({0}, {1}, reduction='{r}', beta=0.5)",
    "F.huber_loss({0}, {1}, reduction='{r}', delta=0.75)",
    "F.binary_cross_entropy_with_logits({0}, torch.sigmoid({1}), reduction='{r}')",
    "F.binary_cross_entropy(torch.sigmoid({0}), torch.sigmoid({1}), reduction='{r}')",
    "F.kl_div(F.log_softmax({0}, dim=-1), F.softmax({1}, dim=-1), reduction='{r}'.replace('mean', 'batchmean'))",
    # torch refuses a soft-margin target that requires grad (program 7500022633).
    "F.soft_margin_loss({0}, torch.sign({1}.detach()) + ({1} == 0).float(), reduction='{r}')",
    "F.cross_entropy({0}, F.softmax({1}, dim=1), reduction='{r}')",
    "F.poisson_nll_loss({0}, {1}.abs(), reduction='{r}')",
    "F.cosine_embedding_loss({0}, {1}, torch.ones({0}.shape[0]), reduction='{r}')",
    "F.margin_ranking_loss({0}, {1}, torch.sign({1}.detach()) + 0.5, reduction='{r}', margin=0.1)",
    "F.hinge_embedding_loss({0}, torch.sign({1}.detach()) + ({1} == 0).float(), reduction='{r}')",
    "F.multilabel_soft_margin_loss({0}, ({1} > 0).float(), reduction='{r}')",
    "F.gaussian_nll_loss({0}, {1}, {1}.detach().abs() + 0.5, reduction='{r}')",
    "F.triplet_margin_loss({0}, {1}, {1}.flip(0), reduction='{r}')",
]
REDUCTION = ["none", "mean", "sum"]


def _spatial(s: State, lo: int = 3, hi: int = 5) -> Value | None:
    """A float value shaped (N, C, *spatial) with 1-3 spatial dims."""
    return s.pick(lambda v: v.is_float and lo <= v.tensor.dim() <= hi and min(v.shape[2:]) >= 2)


def conv(s: State) -> Value | None:
    x = _spatial(s)
    if x is None:
        return None
    d = x.tensor.dim() - 2
    c = x.shape[1]
    groups = s.choice([g for g in (1, 2, 3) if c % g == 0])
    out = groups * s.rng.randint(1, 3)
    k = s.rng.randint(1, min(3, *x.shape[2:]))
    stride, pad, dil = s.rng.randint(1, 2), s.rng.randint(0, 1), s.rng.randint(1, 2)
    extra = "" if x.dtype == "float32" else f", dtype=torch.{x.dtype}"
    if s.rng.random() < 0.3:
        outpad = s.rng.randint(0, max(0, max(stride, dil) - 1))
        ctor = (
            f"torch.nn.ConvTranspose{d}d({c}, {out}, {k}, stride={stride}, padding={pad}, "
            f"output_padding={outpad}, groups={groups}, dilation={dil}{extra})"
        )
    else:
        mode = s.choice(["zeros", "zeros", "reflect", "replicate", "circular"]) if pad else "zeros"
        ctor = (
            f"torch.nn.Conv{d}d({c}, {out}, {k}, stride={stride}, padding={pad}, dilation={dil}, "
            f"groups={groups}, bias={s.rng.random() < 0.7}, padding_mode='{mode}'{extra})"
        )
    name = s.attribute("conv", ctor)
    return s.emit(f"self.{name}({{0}})", [x], "conv", trained=True) if name else None


def pool(s: State) -> Value | None:
    x = _spatial(s)
    if x is None:
        return None
    d = x.tensor.dim() - 2
    k = s.rng.randint(1, min(3, *x.shape[2:]))
    stride = s.rng.randint(1, k)
    pad = s.rng.randint(0, k // 2)
    ceil = s.rng.random() < 0.3
    kind = s.choice(["max", "avg", "adaptive_avg", "adaptive_max", "lp" if d < 3 else "avg"])
    if kind == "max":
        template = f"F.max_pool{d}d({{0}}, {k}, stride={stride}, padding={pad}, ceil_mode={ceil})"
    elif kind == "avg":
        inc = s.rng.random() < 0.5
        template = (
            f"F.avg_pool{d}d({{0}}, {k}, stride={stride}, padding={pad}, ceil_mode={ceil}, "
            f"count_include_pad={inc})"
        )
    elif kind == "lp":
        template = f"F.lp_pool{d}d({{0}}.abs() + 0.5, 2, {k}, stride={stride})"
    else:
        size = tuple(s.rng.randint(1, n) for n in x.shape[2:])
        template = f"F.{kind}_pool{d}d({{0}}, {size})"
    return s.emit(template, [x], "pool", exact=kind == "max")


def norm(s: State) -> Value | None:
    x = s.pick(lambda v: v.dtype == "float32" and v.tensor.dim() >= 2)
    if x is None:
        return None
    c, rank = x.shape[1], x.tensor.dim()
    kind = s.choice(["batch", "layer", "group", "instance", "normalize", "rms"])
    affine = s.rng.random() < 0.7
    if kind == "batch" and rank <= 5 and x.shape[0] > 1 and not s.replicated:
        d = max(1, rank - 2)
        ctor = f"torch.nn.BatchNorm{d}d({c}, affine={affine}, momentum={s.choice([0.1, 0.5])})"
    elif kind == "layer":
        shape = x.shape[-s.rng.randint(1, min(2, rank - 1)) :]
        ctor = f"torch.nn.LayerNorm({list(shape)}, elementwise_affine={affine})"
    elif kind == "group":
        groups = s.choice([g for g in (1, 2, 3) if c % g == 0])
        ctor = f"torch.nn.GroupNorm({groups}, {c}, affine={affine})"
    elif kind == "instance" and rank in (3, 4, 5):
        ctor = f"torch.nn.InstanceNorm{rank - 2}d({c}, affine={affine})"
    elif kind == "rms":
        ctor = f"torch.nn.RMSNorm({x.shape[-1]}, eps=1e-5)"
    else:
        return s.emit("F.normalize({0}, dim=1)", [x], "norm")
    name = s.attribute("norm", ctor)
    return s.emit(f"self.{name}({{0}})", [x], "norm", trained=affine) if name else None


def loss(s: State) -> Value | None:
    a = s.pick(lambda v: v.dtype == "float32" and v.tensor.dim() >= 2)
    b = s.pick(lambda v: v.dtype == "float32" and v.shape == a.shape) if a else None
    if a is None or b is None:
        return None
    template = s.choice(LOSSES).replace("{r}", s.choice(REDUCTION))
    return s.emit(template, [a, b], "loss")


def class_loss(s: State) -> Value | None:
    """Cross entropy / NLL with integer targets made from an integer value."""
    logits = s.pick(lambda v: v.dtype == "float32" and v.tensor.dim() == 2)
    target = s.pick(lambda v: v.dtype == "int64" and v.tensor.dim() == 1) if logits else None
    if logits is None or target is None or target.shape[0] != logits.shape[0]:
        return None
    c = logits.shape[1]
    r = s.choice(REDUCTION)
    template = s.choice(
        [
            f"F.cross_entropy({{0}}, {{1}} % {c}, reduction='{r}')",
            f"F.cross_entropy({{0}}, {{1}} % {c}, reduction='{r}', label_smoothing=0.1)",
            f"F.nll_loss(F.log_softmax({{0}}, dim=1), {{1}} % {c}, reduction='{r}')",
            f"F.cross_entropy({{0}}, {{1}} % {c}, reduction='{r}', ignore_index=0)",
        ]
    )
    return s.emit(template, [logits, target], "loss")


def embedding(s: State) -> Value | None:
    """Embedding lookups and one-hot codes of integer values (taken modulo the table size,
    as the inputs of later calls hold other values than the example)."""
    idx = s.pick(lambda v: v.dtype in ("int64", "int32") and v.exact and v.tensor.dim() <= 3)
    if idx is None:
        return None
    num = s.rng.randint(2, 6)
    dim = s.rng.randint(1, 5)
    if s.rng.random() < 0.3:
        return s.emit(
            f"F.one_hot({{0}}.long().abs() % {num}, {num})", [idx], "embedding", exact=True
        )
    pad = f", padding_idx={s.rng.randrange(num)}" if s.rng.random() < 0.3 else ""
    name = s.attribute("emb", f"torch.nn.Embedding({num}, {dim}{pad})")
    return (
        s.emit(f"self.{name}({{0}}.abs() % {num})", [idx], "embedding", trained=True)
        if name
        else None
    )


def attention(s: State) -> Value | None:
    q = s.pick(lambda v: v.dtype == "float32" and v.tensor.dim() in (3, 4))
    if q is None:
        return None
    kv = s.pick(
        lambda v: (
            v.dtype == "float32" and v.tensor.dim() == q.tensor.dim() and v.shape[-1] == q.shape[-1]
        )
    )
    if kv is None:
        return None
    lq, lk = q.shape[-2], kv.shape[-2]
    mask = s.choice(
        [
            "",
            ", is_causal=True",
            ", attn_mask=torch.ones({lq}, {lk}, dtype=torch.bool).tril()",
            ", attn_mask=torch.linspace(-1, 1, {lk}).expand({lq}, {lk})",
        ]
    )
    mask = mask.replace("{lq}", str(lq)).replace("{lk}", str(lk))
    scale = s.choice(["", ", scale=0.5"])
    return s.emit(
        f"F.scaled_dot_product_attention({{0}}, {{1}}, {{1}}{mask}{scale})", [q, kv], "attention"
    )


def multihead(s: State) -> Value | None:
    x = s.pick(lambda v: v.dtype == "float32" and v.tensor.dim() == 3 and v.shape[-1] % 2 == 0)
    if x is None:
        return None
    e = x.shape[-1]
    name = s.attribute(
        "mha", f"torch.nn.MultiheadAttention({e}, {s.choice([1, 2])}, batch_first=True)"
    )
    return (
        s.emit(
            f"self.{name}({{0}}, {{0}}, {{0}}, need_weights=False)[0]",
            [x],
            "attention",
            trained=True,
        )
        if name
        else None
    )


def rnn(s: State) -> Value | None:
    x = s.pick(lambda v: v.dtype == "float32" and v.tensor.dim() == 3)
    if x is None:
        return None
    kind = s.choice(["RNN", "LSTM", "GRU"])
    hidden = s.rng.randint(1, 4)
    layers = s.rng.randint(1, 2)
    bidir = s.rng.random() < 0.3
    ctor = f"torch.nn.{kind}({x.shape[-1]}, {hidden}, num_layers={layers}, batch_first=True, bidirectional={bidir})"
    name = s.attribute("rnn", ctor)
    part = s.choice(["[0]", "[0]", "[1]" if kind != "LSTM" else "[1][0]"])
    return s.emit(f"self.{name}({{0}}){part}", [x], "rnn", trained=True) if name else None


NN = {
    "conv": [conv],
    "pool": [pool],
    "norm": [norm],
    "loss": [loss, loss, class_loss],
    "embedding": [embedding],
    "attention": [attention, multihead],
    "rnn": [rnn],
}
