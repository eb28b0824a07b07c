"""Graphs with dynamic shapes (python/mpk/specialize.py): torch.compile's
default (dynamic=None) hands mpk a graph with symbolic sizes once a size
changes between calls, as a prompt and its decode steps do; dynamic=True does
so from the first call. Each concrete shape gets a static compile of its own,
made on first use, and later calls of that shape reuse it."""

from __future__ import annotations

import warnings

import pytest
import torch

from mpk import check, specialize
from mpk.errors import MpkError
from mpk.models import cache_kw

REL = 1e-4  # float32 on the reference target against eager


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12)).item()


def _generate(step, model, chunks):
    """Feeds the token chunks through `step` over a fresh StaticCache; each
    call's logits, and the cache's keys and values at the end."""
    from transformers import StaticCache
    cache = StaticCache(config=model.config, max_cache_len=64)
    logits = []
    with torch.no_grad():
        for ids in chunks:
            logits.append(step(input_ids=ids, **cache_kw(cache), use_cache=True).logits)
    return logits, [t for layer in cache.layers for t in (layer.keys, layer.values)]


def test_prompt_then_decode_under_the_default_dynamic(core_lib, fresh_dynamo):
    """A prompt of 8, three decode steps, a chunk of 4, a step, another chunk
    of 4, under torch.compile's default: the decode graph Dynamo recompiles
    with symbolic sizes is compiled once for its one shape, each chunk length
    once; logits and cache match eager's."""
    check.ensure_backend_registered()
    model, _ = check.decode_setup("tiny-llama", 0, dtype=torch.float32, device="cpu")
    ids = torch.randint(0, model.config.vocab_size, (1, 40), generator=torch.Generator().manual_seed(1))
    # Slices of one tensor, as a generate loop passes them (storage offsets differ).
    chunks = [ids[:, :8], ids[:, 8:9], ids[:, 9:10], ids[:, 10:11], ids[:, 11:15], ids[:, 15:16], ids[:, 16:20]]
    want, want_cache = _generate(model, model, chunks)
    compiled = []
    step = torch.compile(model, backend="mpk", options={"target": "reference", "on_compile": compiled.append})
    got, got_cache = _generate(step, model, chunks)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape and _rel(g, w) < REL, (i, _rel(g, w))
    for g, w in zip(got_cache, want_cache):
        assert _rel(g, w) < REL
    rows = sorted(f.inputs[next(i for i, n in enumerate(f.display_names) if "input_ids" in n)]["meta"]["shape"][1]
                  for f in compiled)
    assert rows == [1, 4, 8], rows  # the prompt, one decode step, one chunk of 4


def test_generate_prompts_of_several_lengths(core_lib, fresh_dynamo):
    """Hugging Face's recipe (a static cache, the forward compiled) for three
    prompts of different lengths, as a server meets them: the second length
    makes Dynamo retrace with a symbolic size, which failed before
    specialize.py; now the tokens equal eager generate's, one compile a prompt
    length and one for the decode step."""
    check.ensure_backend_registered()
    model, _ = check.decode_setup("tiny-llama", 0, dtype=torch.float32, device="cpu")
    model.generation_config.pad_token_id = 0
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(1, model.config.vocab_size, (1, n), generator=g) for n in (7, 5, 9)]

    def generate():
        with torch.no_grad():
            return [model.generate(p, max_new_tokens=6, do_sample=False, cache_implementation="static")
                    for p in prompts]
    want = generate()
    compiled = []
    model.forward = torch.compile(model.forward, backend="mpk",
                                  options={"target": "reference", "on_compile": compiled.append})
    got = generate()
    for w, o in zip(want, got):
        assert torch.equal(w, o), (w, o)
    assert len(compiled) == 4, len(compiled)


def test_sliding_window_cache_under_the_default_dynamic(core_lib, fresh_dynamo):
    """A sliding-window cache keeps its position in a Python int: the graph
    takes it as a symbolic argument and returns the next one, worked out
    per call, so it keys no compile (the tensors never read it): a compile
    for the prompt, and a few for the decode steps (before, at and past the
    window's end, 16, where HF's Python branches differ), not one a step;
    every step matches eager."""
    check.ensure_backend_registered()
    model, _ = check.decode_setup("tiny-mistral-sw", 0, dtype=torch.float32, device="cpu")
    assert model.config.sliding_window == 16
    ids = torch.randint(0, model.config.vocab_size, (1, 40), generator=torch.Generator().manual_seed(2))
    chunks = [ids[:, :8]] + [ids[:, i:i + 1] for i in range(8, 22)]
    want, want_cache = _generate(model, model, chunks)
    compiled = []
    step = torch.compile(model, backend="mpk", options={"target": "reference", "max_shapes": 32,
                                                        "on_compile": compiled.append})
    got, got_cache = _generate(step, model, chunks)
    for i, (g, w) in enumerate(zip(got, want)):
        assert _rel(g, w) < REL, (i, _rel(g, w))
    for g, w in zip(got_cache, want_cache):
        assert _rel(g, w) < REL
    assert len(compiled) <= 3, len(compiled)  # 15 calls: one a step before


def test_dynamic_true_compiles_each_shape_once(core_lib, fresh_dynamo):
    """dynamic=True: symbolic sizes from the first call; a size the graph uses
    as a value (x.shape[0]) is written into each static compile."""
    def f(x, w):
        return torch.relu(x @ w) * x.shape[0] + x.sum(0)

    compiled = []
    step = torch.compile(f, backend="mpk", dynamic=True,
                         options={"target": "reference", "on_compile": compiled.append})
    w = torch.randn(6, 6)
    with torch.no_grad():
        for rows in (4, 5, 4, 7, 5):
            x = torch.randn(rows, 6)
            assert _rel(step(x, w), f(x, w)) < REL, rows
    assert sorted(c.inputs[0]["meta"]["shape"][0] for c in compiled) == [4, 5, 7]


def test_past_max_shapes_the_graph_runs_eagerly(core_lib, fresh_dynamo):
    """Past max_shapes static compiles, calls of a new shape run the graph
    eagerly (a warning, once) and still compute the same function."""
    def f(x):
        return torch.tanh(x) * 2 + 1

    compiled = []
    step = torch.compile(f, backend="mpk", dynamic=True,
                         options={"target": "reference", "on_compile": compiled.append, "max_shapes": 2})
    with torch.no_grad():
        for rows in (2, 3):
            x = torch.randn(rows, 4)
            assert _rel(step(x), f(x)) < REL
        with pytest.warns(UserWarning, match="max_shapes"):
            x = torch.randn(5, 4)
            assert _rel(step(x), f(x)) < REL
        x = torch.randn(6, 4)
        assert _rel(step(x), f(x)) < REL
        x = torch.randn(3, 4)
        assert _rel(step(x), f(x)) < REL  # a compiled shape still runs its module
    assert len(compiled) == 2


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "8"])
def test_max_shapes_must_be_a_positive_count(bad, core_lib, fresh_dynamo):
    step = torch.compile(lambda x: x + 1, backend="mpk", dynamic=True,
                         options={"target": "reference", "max_shapes": bad})
    with pytest.raises(MpkError, match="max_shapes"):
        step(torch.randn(3))


def test_with_values_writes_the_scalars_in():
    """The static graph: the symbolic placeholders gone, their uses constants,
    and nothing left of Dynamo's symbolic record on the other placeholders."""
    g = torch.fx.Graph()
    n, x = g.placeholder("n"), g.placeholder("x")
    x.meta["example_value"] = "symbolic"
    g.output(g.call_function(torch.mul, (x, n)))
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    static = specialize.with_values(gm, {0: 3})
    assert [p.name for p in static.graph.nodes if p.op == "placeholder"] == ["x"]
    assert all("example_value" not in p.meta for p in static.graph.nodes)
    assert torch.equal(static(torch.ones(2)), torch.full((2,), 3.0))


@pytest.mark.gpu
def test_cuda_prompt_then_decode_under_the_default_dynamic(core_lib, fresh_dynamo):
    """The same on the GPU, in float32 with TF32 off (docs/architecture.md:
    1e-3 against eager): one module for the decode steps, one a prompt length."""
    compiles = _cuda_against_eager("tiny-llama", 3, lambda ids: [ids[:, :8], ids[:, 8:9], ids[:, 9:10],
                                                                 ids[:, 10:14], ids[:, 14:15]])
    assert compiles == 3  # 8 rows, 1, 4


def _cuda_against_eager(name: str, seed: int, chunks_of) -> int:
    """Feeds a model's token chunks through mpk's cuda target and eager
    (float32, TF32 off: 1e-3, docs/architecture.md); asserts every step's
    logits and the cache agree and returns how many compiles it took."""
    check.ensure_backend_registered()
    model, _ = check.decode_setup(name, 0, dtype=torch.float32, device="cuda")
    ids = torch.randint(0, model.config.vocab_size, (1, 40), generator=torch.Generator().manual_seed(seed)).cuda()
    chunks = chunks_of(ids)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        want, want_cache = _generate(model, model, chunks)
        compiled = []
        step = torch.compile(model, backend="mpk", options={"target": "cuda", "on_compile": compiled.append})
        got, got_cache = _generate(step, model, chunks)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    for i, (g, w) in enumerate(zip(got, want)):
        assert _rel(g, w) < 1e-3, (i, _rel(g, w))
    for g, w in zip(got_cache, want_cache):
        assert _rel(g, w) < 1e-3
    return len(compiled)


def test_a_growing_cache_stops_compiling(core_lib, fresh_dynamo):
    """Hugging Face's default DynamicCache grows its keys and values a token
    a call: each size would be a compile of its own (an nvcc build each on
    the GPU). From the third growth by the same sizes in a row, new sizes
    run eagerly, with a warning that says to keep the cache static; generate
    still returns eager's tokens."""
    check.ensure_backend_registered()
    model, _ = check.decode_setup("tiny-llama", 0, dtype=torch.float32, device="cpu")
    ids = torch.randint(0, model.config.vocab_size, (1, 7), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = model.generate(ids, max_new_tokens=12, do_sample=False)
    compiled = []
    forward = model.forward
    model.forward = torch.compile(forward, backend="mpk",
                                  options={"target": "reference", "on_compile": compiled.append})
    try:
        with torch.no_grad(), pytest.warns(UserWarning, match="cache_implementation='static'"):
            got = model.generate(ids, max_new_tokens=12, do_sample=False)
    finally:
        model.forward = forward
    assert torch.equal(got, want)
    assert len(compiled) <= 5, len(compiled)  # was 10: one a size up to max_shapes


def test_sizes_that_grow_by_other_steps_keep_compiling(core_lib, fresh_dynamo):
    """Only the same growth three calls in a row counts: sizes 2, 3, 5, 8
    (dynamic=True) each compile, and 9, 10, 11 after a compiled size (2)
    start a new run, so 11 is still compiled."""
    def f(x):
        return torch.tanh(x) * 2 + 1

    compiled = []
    step = torch.compile(f, backend="mpk", dynamic=True,
                         options={"target": "reference", "on_compile": compiled.append, "max_shapes": 16})
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")
        for rows in (2, 3, 5, 8, 2, 9, 10, 11):
            x = torch.randn(rows, 4)
            assert _rel(step(x), f(x)) < REL
    assert sorted(c.inputs[0]["meta"]["shape"][0] for c in compiled) == [2, 3, 5, 8, 9, 10, 11]


def test_an_int_read_as_a_number_is_passed_not_compiled(core_lib, fresh_dynamo):
    """An int argument the tensors read only as a number (positions: arange
    + n, through max) is passed to one compile as a 0-d tensor; an int used
    as a size still compiles per value."""
    def positions(x, n):
        return (torch.arange(4) + max(n - 3, 0)) * x

    def sized(x, n):
        return torch.ones(n).sum() * x

    for f, values, compiles in ((positions, (1, 5, 9, 2), 1), (sized, (2, 3, 2), 2)):
        compiled = []
        step = torch.compile(f, backend="mpk", dynamic=True,
                             options={"target": "reference", "on_compile": compiled.append})
        x = torch.arange(4)
        with torch.no_grad():
            for n in values:
                assert torch.equal(step(x, n), f(x, n)), (f.__name__, n)
        assert len(compiled) == compiles, (f.__name__, len(compiled))
        torch._dynamo.reset()


def test_a_returned_int_keys_no_compile(core_lib, fresh_dynamo):
    """An int the graph only returns (n + 1, as a sliding-window cache's
    position) is worked out per call: one compile for every value."""
    compiled = []
    step = torch.compile(lambda x, n: (x * 2, n + 1), backend="mpk", dynamic=True,
                         options={"target": "reference", "on_compile": compiled.append})
    x = torch.randn(3)
    with torch.no_grad():
        for n in (4, 7, 11):
            out, m = step(x, n)
            assert m == n + 1 and torch.equal(out, x * 2)
    assert len(compiled) == 1


@pytest.mark.gpu
def test_cuda_sliding_window_decode_loop(core_lib, fresh_dynamo):
    """On the GPU, a decode loop over a sliding-window cache without
    cache_position (float32, TF32 off): its position, a Python int, reaches
    the kernel as a 0-d tensor filled on the device per call, so the steps
    before, at and past the window's end (16) share 3 compiles; every
    step's logits and the cache match eager's."""
    compiles = _cuda_against_eager("tiny-mistral-sw", 2,
                                   lambda ids: [ids[:, :8]] + [ids[:, i:i + 1] for i in range(8, 22)])
    assert compiles <= 3, compiles


def test_generate_under_dynamic_true(core_lib, fresh_dynamo):
    """dynamic=True makes Dynamo pass Python floats as 0-d tensors; one the
    model reads back with .item() (nn.Embedding's norm_type) is written into
    each compile as a number: generate failed with DataDependentOutputException,
    now its tokens equal eager's."""
    check.ensure_backend_registered()
    model, _ = check.decode_setup("tiny-llama", 0, dtype=torch.float32, device="cpu")
    ids = torch.randint(3, model.config.vocab_size, (1, 7), generator=torch.Generator().manual_seed(1))
    kw = dict(max_new_tokens=6, do_sample=False, cache_implementation="static")
    with torch.no_grad():
        want = model.generate(ids, **kw)
    compiled = []
    forward = model.forward
    model.forward = torch.compile(forward, backend="mpk", dynamic=True,
                                  options={"target": "reference", "on_compile": compiled.append})
    try:
        with torch.no_grad():
            got = model.generate(ids, **kw)
    finally:
        model.forward = forward
    assert torch.equal(got, want)
    assert len(compiled) == 2  # the prompt, the decode step
