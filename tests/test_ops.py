"""Single ATen ops through the whole compile path on the reference target."""

import pytest
import torch
import torch.nn.functional as F

from mpk import check


@pytest.mark.parametrize("pad", [(1, 2), (1, 2, 0, 1), (-1, 2, 1, -1)])
def test_constant_pad(core_lib, fresh_dynamo, pad):
    check.ensure_backend_registered()

    def f(x):
        return F.pad(x * 2, pad, value=3.0) + 1

    x = torch.randn(3, 5)
    got = torch.compile(f, backend="mpk", options={"target": "reference"}, fullgraph=True, dynamic=False)(x)
    torch.testing.assert_close(got, f(x))


def _compiled(f):
    check.ensure_backend_registered()
    return torch.compile(f, backend="mpk", options={"target": "reference"}, fullgraph=True, dynamic=False)


@pytest.mark.parametrize("case", ["adjacent", "apart", "negative", "three"])
def test_index_with_several_tensors(core_lib, fresh_dynamo, case):
    """x[i, j] with broadcast index tensors, as HF's padding_mask[batch_idx, kv_idx]."""
    x = torch.randn(3, 4, 5)
    b = torch.arange(3).view(3, 1, 1)
    k = torch.tensor([[[4, 0, 2]]])
    fs = {
        "adjacent": lambda x, b, k: x[b, k.clamp(max=3)] * 2,
        "apart": lambda x, b, k: x[b, :, k] + 1,
        "negative": lambda x, b, k: x[:, k.clamp(max=3) - 4, k - 5] + 1,
        "three": lambda x, b, k: x[b, k.clamp(max=3), k] - 1,
    }
    got = _compiled(fs[case])(x, b, k)
    torch.testing.assert_close(got, fs[case](x, b, k))


def test_index_out_of_range_is_an_error(core_lib, fresh_dynamo):
    """An index past its own dim is rejected, even where the flat index would be in range."""
    x = torch.randn(3, 4)
    with pytest.raises(Exception, match="out of range"):
        _compiled(lambda x, i, j: x[i, j] + 1)(x, torch.tensor([0]), torch.tensor([4]))


@pytest.mark.parametrize("case", ["split", "split_sizes", "chunk", "chunk_uneven", "unbind", "stack"])
def test_split_and_stack(core_lib, fresh_dynamo, case):
    """Pieces of a tensor are views of it; stack is a concatenation along a new dim."""
    fs = {
        "split": lambda x: [p * (i + 1) for i, p in enumerate(x.split(3, dim=-1))],
        "split_sizes": lambda x: [p + i for i, p in enumerate(x.split([1, 5, 2], dim=-1))],
        "chunk": lambda x: (lambda a, b: a * torch.sigmoid(b))(*x.chunk(2, dim=-1)),
        "chunk_uneven": lambda x: [p - i for i, p in enumerate(x.chunk(3, dim=1))],
        "unbind": lambda x: (lambda a, b, c: a * b - c)(*(x * 2).unbind(0)),
        "stack": lambda x: torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2) + 1,
    }
    x = torch.randn(3, 5, 8)
    got = _compiled(fs[case])(x)
    torch.testing.assert_close(got, fs[case](x))


@pytest.mark.parametrize("affine", ["both", "weight", "none", "2d"])
def test_layer_norm(core_lib, fresh_dynamo, affine):
    x = torch.randn(2, 3, 16) * 3 + 1
    w, b = torch.randn(16), torch.randn(16)
    fs = {
        "both": lambda x: F.layer_norm(x, (16,), w, b, 1e-5),
        "weight": lambda x: F.layer_norm(x, (16,), w, None, 1e-6),
        "none": lambda x: F.layer_norm(x, (16,)),  # OLMo's non-parametric norm
        "2d": lambda x: F.layer_norm(x, (3, 16), w.expand(3, 16) * 2, None),
    }
    got = _compiled(fs[affine])(x)
    torch.testing.assert_close(got, fs[affine](x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("values", [[-1], [3.0, 1.0, 4.0, 1.0, 5.0], [[0, 2, 4], [6, 8, 10]],
                                    [float("-inf"), 0.0]])
def test_tensor_constant(core_lib, fresh_dynamo, values):
    """A tensor constant the graph reads (get_attr) is embedded in the compiled graph."""
    def f(x):
        c = torch.tensor(values, dtype=x.dtype)
        return x + c.flatten()[-1] + c.flatten()[0].clamp(min=-9)

    x = torch.randn(4)
    torch.testing.assert_close(_compiled(f)(x), f(x))


def test_tensor_constant_indexes_a_cache_row(core_lib, fresh_dynamo):
    """HF's sliding-window cache: roll the cache left by one, then write the new
    row at torch.tensor([-1]); the cache is an input written in place."""
    def f(cache, k):
        new = cache.roll(-1, dims=-2)
        new[:, :, torch.tensor([-1])] = k
        cache.copy_(new)
        return cache * 1

    cache, k = torch.randn(1, 2, 6, 4), torch.randn(1, 2, 1, 4)
    want_cache = cache.clone()
    want = f(want_cache, k)
    got = _compiled(f)(cache, k)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(cache, want_cache)


def test_too_many_constant_values_is_unsupported(core_lib, fresh_dynamo):
    import mpk
    values = [float(i * i % 37) for i in range(100)]

    def f(x):
        return x + torch.tensor(values)

    with pytest.raises(mpk.UnsupportedOpError, match="tensor constant of 100 distinct values"):
        _compiled(f)(torch.randn(100))


@pytest.mark.parametrize("shifts,dims", [(-1, -2), (2, 0), ((1, -3), (0, 2)), (5, None), (0, 1)])
def test_roll(core_lib, fresh_dynamo, shifts, dims):
    def f(x):
        return (x * 2).roll(shifts, dims) + 1

    x = torch.randn(3, 4, 5)
    torch.testing.assert_close(_compiled(f)(x), f(x))


@pytest.mark.parametrize("case", ["rows", "broadcast_values"])
def test_index_put(core_lib, fresh_dynamo, case):
    def f(x, v, i):
        y = x * 1
        if case == "rows":
            y[:, i] = v
        else:
            y[i] = v[0, 0]
        return y

    x, v = torch.randn(3, 5, 2), torch.randn(3, 2, 2)
    i = {"rows": torch.tensor([4, -5]), "broadcast_values": torch.tensor([2, -3])}[case]
    torch.testing.assert_close(_compiled(f)(x, v, i), f(x, v, i))


@pytest.mark.parametrize("reps", [(2, 1, 3), (2, 1, 1, 2), (1, 1, 1), (3, 1, 1, 1)])
def test_repeat(core_lib, fresh_dynamo, reps):
    x = torch.randn(3, 2, 4)
    f = lambda x: (x.transpose(0, 2) * 2).repeat(*reps) + 1  # noqa: E731
    torch.testing.assert_close(_compiled(f)(x), f(x))


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_gather(core_lib, fresh_dynamo, dim):
    x = torch.randn(4, 5, 6)
    idx = torch.randint(0, x.shape[dim], (3, 4, 2))
    f = lambda x, i: torch.gather(x * 2, dim, i) + 1  # noqa: E731
    torch.testing.assert_close(_compiled(f)(x, idx), f(x, idx))
    # a source that is a strided and broadcast view (GPT-J gathers from a repeated table)
    xt = torch.randn(5, 1, 6).transpose(0, 2)
    idx = torch.randint(0, xt.expand(6, 4, 5).shape[dim], (3, 4, 2))
    f = lambda x, i: torch.gather((x * 2).expand(6, 4, 5), dim, i) + 1  # noqa: E731
    torch.testing.assert_close(_compiled(f)(xt, idx), f(xt, idx))


def test_baddbmm(core_lib, fresh_dynamo):
    a, b, c = torch.randn(2, 3, 5), torch.randn(2, 3, 4), torch.randn(2, 4, 5)
    f = lambda a, b, c: torch.baddbmm(a, b, c, beta=0.5, alpha=2.0)  # noqa: E731
    torch.testing.assert_close(_compiled(f)(a, b, c), f(a, b, c))


def test_gather_rejects_a_negative_index(core_lib, fresh_dynamo):
    with pytest.raises(Exception, match="out of range"):
        _compiled(lambda x, i: torch.gather(x, 1, i) + 1)(torch.randn(2, 3), torch.tensor([[0], [-1]]))


def _repeat_kv(x, n_rep):
    """Hugging Face's repeat_kv: each KV head serves n_rep query heads."""
    b, kv, s, d = x.shape
    return x[:, :, None, :, :].expand(b, kv, n_rep, s, d).reshape(b, kv * n_rep, s, d)


@pytest.mark.parametrize("mask", ["per_head", "broadcast"])
@pytest.mark.parametrize("target", ["reference", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_decode_attention_gqa_batch(core_lib, fresh_dynamo, target, mask):
    """Decode attention of a batch on 16 workers: 4 rows, 8 query heads over
    2 KV heads, 256 positions in 2 chunks, so a KV head's 4 query heads share
    each unit (ir.Attrs.UnitHeads) and tasks cut the batch. A per-head float
    mask hides different positions from each head of a unit (the kernel reads
    each head's row); a broadcast bool mask is read once for them all."""
    check.ensure_backend_registered()
    gen = torch.Generator().manual_seed(0)
    B, H, KV, S, D = 4, 8, 2, 256, 64
    q = torch.randn(B, H, 1, D, generator=gen)
    k, v = torch.randn(B, KV, S, D, generator=gen), torch.randn(B, KV, S, D, generator=gen)
    if mask == "per_head":  # each head and row sees a different prefix, and some holes
        live = torch.randint(1, S + 1, (B, H, 1, 1), generator=gen)
        holes = torch.rand(B, H, 1, S, generator=gen) < 0.2
        hidden = (torch.arange(S).view(1, 1, 1, S) >= live) | holes
        m = torch.zeros(B, H, 1, S).masked_fill(hidden, torch.finfo(torch.float32).min)
    else:
        live = torch.randint(1, S + 1, (B, 1, 1, 1), generator=gen)
        m = torch.arange(S).view(1, 1, 1, S) < live

    def f(q, k, v, m):
        return F.scaled_dot_product_attention(q, _repeat_kv(k, H // KV), _repeat_kv(v, H // KV), attn_mask=m) * 2

    dev = "cuda" if target == "cuda" else "cpu"
    args = [t.to(dev) for t in (q, k, v, m)]
    compiled = []
    fn = torch.compile(f, backend="mpk", options={"target": target, "num_workers": 16, "on_compile": compiled.append},
                       fullgraph=True, dynamic=False)
    got = fn(*args).cpu()
    torch.testing.assert_close(got, f(q, k, v, m), atol=1e-3 if target == "cuda" else 1e-5, rtol=1e-3 if target == "cuda" else 1e-5)
    if target == "cuda":  # the units took the KV head's 4 query heads
        assert compiled and ", 4>(op, lo, hi, s, c.smem)" in compiled[-1].sources["module.cu"]


@pytest.mark.parametrize("case", ["bool_last", "int_first", "float_mid", "scalar"])
def test_cumsum(core_lib, fresh_dynamo, case):
    """cumsum along any dim (Hugging Face's packed-sequence detection counts
    (position_diff != 1) along the positions of a call without a cache)."""
    fs = {
        "bool_last": lambda x: (x.long().diff(dim=-1, prepend=x.long()[:, :1] - 1) != 1).cumsum(-1) * 3,
        "int_first": lambda x: (x.long() * 2 - 3).cumsum(0) - 1,
        "float_mid": lambda x: (x.float() * 0.5).view(2, 3, 4).cumsum(1) + 1,
        "scalar": lambda x: x.float().sum().cumsum(0) * 2,
    }
    x = torch.tensor([[0, 1, 2, 0, 1, 7], [3, 4, 5, 6, 0, 1], [2, 3, 4, 5, 6, 7], [9, 8, 1, 2, 3, 4]])
    got = _compiled(fs[case])(x)
    want = fs[case](x)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("rows", [1, 6])
def test_cross_entropy(core_lib, fresh_dynamo, reduction, rows):
    """log_softmax and nll_loss (a language model's loss for labels, as
    Hugging Face computes it for `labels=`), ignore_index rows included."""
    def f(x, t):
        if rows == 1:
            x, t = x[0], t[0]
        return F.cross_entropy(x.float() * 2, t, ignore_index=-100, reduction=reduction) + 1

    x = torch.randn(6, 11)
    t = torch.tensor([3, -100, 10, 0, 7, -100])
    torch.testing.assert_close(_compiled(f)(x, t), f(x, t))


def test_log_softmax_along_a_leading_dim(core_lib, fresh_dynamo):
    x = torch.randn(4, 3, 5)
    f = lambda x: torch.log_softmax(x * 3, dim=1) - 1  # noqa: E731
    torch.testing.assert_close(_compiled(f)(x), f(x))


def test_a_target_past_the_classes_is_an_error(core_lib, fresh_dynamo):
    x = torch.randn(3, 5)
    with pytest.raises(Exception, match="out of range|index"):
        _compiled(lambda x, t: F.cross_entropy(x, t))(x, torch.tensor([1, 5, 0]))


@pytest.mark.parametrize("case", ["remainder", "fmod", "floor_div", "trunc_div", "floor_divide", "rounding", "int_mod"])
def test_rounding_ops(core_lib, fresh_dynamo, case):
    """floor, ceil, trunc and the divisions and remainders built on them
    (Python's % takes the sign of the divisor, fmod that of the dividend)."""
    fs = {
        "remainder": lambda x, i: torch.remainder(x, 0.75) + x % -1.5,
        "fmod": lambda x, i: torch.fmod(x, 0.75) - torch.fmod(x, -2.0),
        "floor_div": lambda x, i: torch.div(x, 0.3, rounding_mode="floor"),
        "trunc_div": lambda x, i: torch.div(x, -0.3, rounding_mode="trunc"),
        "floor_divide": lambda x, i: i // 3 + torch.floor_divide(i, -4),
        "rounding": lambda x, i: torch.floor(x * 3) + torch.ceil(x * 3) * 10 + torch.trunc(x * 3) * 100,
        "int_mod": lambda x, i: (i % 5) * 2 - torch.remainder(i, -3),
    }
    x = torch.randn(5, 7)
    i = torch.arange(-17, 18).view(5, 7)
    got = _compiled(fs[case])(x, i)
    want = fs[case](x, i)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want)


_X = torch.tensor([[0.5, -1.25, 3.0, 0.0, -0.0, 2.5], [1.0, 1.0, -2.0, 7.5, -3.0, 0.25],
                   [-0.75, 4.0, 4.0, -4.0, 0.125, 9.0], [2.0, -6.0, 0.5, 1.5, -0.5, -1.0]])
_COMPOSITES = {
    "argmin": lambda x: x.argmin(-1) + x.argmin(),
    "max_min_dim": lambda x: (x.max(-1).values, x.max(0).indices, x.min(1, keepdim=True).values, x.min(1).indices),
    "var_std": lambda x: (x.var(-1), x.std(0, keepdim=True), x.var(), x.var(-1, correction=0)),
    "logsumexp": lambda x: (x.logsumexp(-1), x.masked_fill(x < 100, float("-inf")).logsumexp(1, keepdim=True)),
    "activations": lambda x: (F.softplus(x * 10), F.mish(x), F.leaky_relu(x, 0.1), F.elu(x), F.hardtanh(x), x.sign()),
    "exp_log": lambda x: (torch.exp2(x), x.abs().add(1).log2(), torch.sinh(x), torch.cosh(x)),
    "infinities": lambda x: (torch.isinf(x / x.trunc()), torch.nan_to_num(x / x.trunc(), nan=7.0)),
    "addc_lerp": lambda x: (torch.addcmul(x, x, x, value=0.5), torch.addcdiv(x, x, x + 10), torch.lerp(x, -x, 0.3)),
    "truth": lambda x: ((x > 0).any(-1), (x > -7).all(), (x != 0).all(0), torch.logical_xor(x > 0, x < 1)),
    "triangles": lambda x: (x.triu(1), x.tril(), x.view(2, 2, 6).triu(-1)),
    "norms": lambda x: (x.norm(dim=-1, keepdim=True), torch.linalg.vector_norm(x, ord=float("inf"), dim=0),
                        torch.linalg.vector_norm(x, ord=3), torch.linalg.vector_norm(x, ord=0, dim=1)),
    "index_select": lambda x: (x.index_select(1, torch.tensor([5, 0, 2], device=x.device)),
                                     x.index_select(0, torch.tensor([3, 3], device=x.device))),
    "one_hot": lambda x: F.one_hot(torch.tensor([0, 2, 5, 1], device=x.device), 6) * x,
    "round": lambda x: ((x * 2).round(), x.round(decimals=1), (x * 4 + 0.5).round()),
    "log1p_expm1": lambda x: ((x * 1e-7).log1p(), (x.abs() * 3).log1p(), (x * 1e-6).expm1(), x.expm1()),
    "flip": lambda x: (x.flip(-1), x.flip(0, 1), x.t().flip(0) * 2),
    "logic_bits": lambda x: (torch.logical_and(x, x * 3), torch.logical_or(x * 0, x), (x * 4).long() ^ 5,
                             (x > 0) ^ (x < 1), torch.atan2(x, x.flip(0))),
}


@pytest.mark.parametrize("case", sorted(_COMPOSITES))
def test_composite_ops(core_lib, fresh_dynamo, case):
    """Reductions and activations lowered as compositions of mpk's ops
    (edge values: signed zeros, ties, an all -inf row, NaN and infinities)."""
    f = _COMPOSITES[case]
    got, want = _compiled(f)(_X), f(_X)
    got, want = (got, want) if isinstance(want, tuple) else ((got,), (want,))
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, w.dtype, g.shape, w.shape)
        torch.testing.assert_close(g, w, equal_nan=True)
