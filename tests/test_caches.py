"""The warm-start caches: the exported-graph cache (a hit skips AOTAutograd)
and the core-result cache of the cuda target (a hit skips the Go core)."""

from __future__ import annotations

import torch

from mpk import backend, check, graph_cache


def test_second_compile_hits_and_matches(core_lib, fresh_dynamo, monkeypatch, tmp_path):
    monkeypatch.setenv("MPK_CACHE_DIR", str(tmp_path))
    first = check.run_check(model="tiny-llama", target="reference", steps=2, seed=2, log=lambda s: None)
    assert first.ok, first.line
    assert first.compiled.front_timing.startswith("AOTAutograd ")
    assert len(list((tmp_path / "graphs").iterdir())) == 1
    torch._dynamo.reset()
    second = check.run_check(model="tiny-llama", target="reference", steps=2, seed=2, log=lambda s: None)
    assert second.ok, second.line
    assert second.compiled.front_timing == "AOTAutograd skipped (graph cache hit)"
    assert second.rel_err == first.rel_err  # same graph, same seeded executor
    # A different shape (16 tokens a step) is a different key, traced afresh.
    torch._dynamo.reset()
    third = check.run_check(model="tiny-llama", target="reference", prefill=16, seed=2, log=lambda s: None)
    assert third.ok, third.line
    assert third.compiled.front_timing.startswith("AOTAutograd ")


def _dynamo_graph(fn, *args):
    got = {}

    def grab(gm, example_inputs):
        got["gm"], got["ex"] = gm, example_inputs
        return gm.forward
    torch._dynamo.reset()
    torch.compile(fn, backend=grab, fullgraph=True, dynamic=False)(*args)
    return got["gm"], got["ex"]


def test_key_follows_code_constants_and_input_layout(fresh_dynamo):
    x = torch.randn(4, 8)
    k1 = graph_cache.key(*_dynamo_graph(lambda a: a * 2 + 1, x))
    assert k1 is not None and k1 == graph_cache.key(*_dynamo_graph(lambda a: a * 2 + 1, x))
    assert k1 != graph_cache.key(*_dynamo_graph(lambda a: a * 3 + 1, x))          # a constant
    assert k1 != graph_cache.key(*_dynamo_graph(lambda a: a * 2 - 1, x))          # an op
    assert k1 != graph_cache.key(*_dynamo_graph(lambda a: a * 2 + 1, torch.randn(4, 9)))  # a shape
    assert k1 != graph_cache.key(*_dynamo_graph(lambda a: a * 2 + 1, torch.randn(8, 4).t()))  # strides
    assert k1 != graph_cache.key(*_dynamo_graph(lambda a: a * 2 + 1, x.double()))  # a dtype


def test_unreadable_entry_is_a_miss_and_removed(tmp_path):
    graph_cache.store(tmp_path, "k" * 64, {"version": 1, "options": {"target": "x"}, "graph": {}}, True, ["a"])
    e = graph_cache.load(tmp_path, "k" * 64)
    assert e is not None and e.request == {"version": 1, "graph": {}} and e.returns_sequence
    p = tmp_path / "graphs" / ("k" * 64 + ".json.z")
    p.write_bytes(p.read_bytes()[:10])
    assert graph_cache.load(tmp_path, "k" * 64) is None
    assert not p.exists()
    assert graph_cache.load(tmp_path, "j" * 64) is None


def test_aliased_output_is_not_stored(core_lib, fresh_dynamo, monkeypatch, tmp_path):
    """AOTAutograd regenerates an output that is a view of an input at run
    time; such a graph is compiled as usual but never cached."""
    monkeypatch.setenv("MPK_CACHE_DIR", str(tmp_path))

    def f(a, b):
        return a.t(), a + b

    a, b = torch.randn(4, 8), torch.randn(4, 8)
    out = torch.compile(f, backend="mpk", options={"target": "reference"}, fullgraph=True)(a, b)
    torch.testing.assert_close(out[0], a.t())
    torch.testing.assert_close(out[1], a + b)
    assert not (tmp_path / "graphs").exists() or not list((tmp_path / "graphs").iterdir())


def test_cache_can_be_turned_off(core_lib, fresh_dynamo, monkeypatch, tmp_path):
    monkeypatch.setenv("MPK_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("MPK_GRAPH_CACHE", "0")
    res = check.run_check(model="tiny-qwen3", target="reference", log=lambda s: None)
    assert res.ok, res.line
    assert not (tmp_path / "graphs").exists()


def test_hit_with_parameters_on_the_graph_module(core_lib, fresh_dynamo, monkeypatch, tmp_path):
    """A graph module that holds its parameters and buffers (AOTAutograd lifts
    them ahead of the inputs): a cache hit must pass them first too."""
    monkeypatch.setenv("MPK_CACHE_DIR", str(tmp_path))

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(8, 4), requires_grad=False)
            self.register_buffer("b", torch.randn(8))

        def forward(self, x):
            return (torch.nn.functional.linear(x, self.w) + self.b,)  # Dynamo graphs return tuples

    gm = torch.fx.symbolic_trace(M())
    assert len(list(gm.parameters())) == 1
    x = torch.randn(2, 4)
    fronts = []
    from torch._guards import TracingContext, tracing
    for i in range(2):
        if i == 1:  # new weights, same layout: the same key, and the call reads the new values
            with torch.no_grad():
                gm.w.mul_(-2.0)
                gm.b.add_(1.0)
        want = gm(x)[0]
        with torch.no_grad(), tracing(TracingContext(None)):  # as under Dynamo: AOTAutograd leaves its metadata there
            compiled = []
            fn = backend.mpk_backend(gm, [x], options={"target": "reference", "on_compile": compiled.append})
            out = fn(x)
        fronts.append(compiled[-1].front_timing)
        out = out[0] if isinstance(out, (list, tuple)) else out
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    assert fronts[0].startswith("AOTAutograd ") and fronts[1] == "AOTAutograd skipped (graph cache hit)"


def test_core_result_cache_for_the_cuda_target(core_lib, fresh_dynamo, monkeypatch, tmp_path):
    """`mpk build` (the cuda target's compile path, no GPU needed) twice: the
    second finds the core's result; a corrupt entry is a miss and is rebuilt."""
    from mpk import build_cli
    monkeypatch.setenv("MPK_CACHE_DIR", str(tmp_path))
    first = build_cli.export_for_cuda("tiny-qwen3", workers=8)
    assert not first.summary.get("core_cache_hit") and first.summary["core_ms"] > 0
    second = build_cli.export_for_cuda("tiny-qwen3", workers=8)
    assert second.summary.get("core_cache_hit") and second.summary["core_ms"] == 0.0
    assert second.sources == first.sources and second.output_specs == first.output_specs
    assert second.summary["tasks"] == first.summary["tasks"]
    other = build_cli.export_for_cuda("tiny-qwen3", workers=16)  # options are part of the key
    assert not other.summary.get("core_cache_hit") and other.sources != first.sources
    entries = list((tmp_path / "core").iterdir())
    assert len(entries) == 2
    for e in entries:
        e.write_bytes(b"not zlib")
    again = build_cli.export_for_cuda("tiny-qwen3", workers=8)
    assert not again.summary.get("core_cache_hit") and again.sources == first.sources


def test_core_cache_key_ignores_dict_order(core_lib, fresh_dynamo, monkeypatch, tmp_path):
    """A graph-cache hit rebuilds the request with the options added last; it
    must still find the core result the cold compile stored."""
    from mpk import build, build_cli, core
    monkeypatch.setenv("MPK_CACHE_DIR", str(tmp_path))
    req = build_cli.export_for_cuda("tiny-qwen3", workers=8).request
    reordered = {k: req[k] for k in reversed(list(req))}
    assert list(reordered) != list(req)
    assert core.compile_cached(reordered, build.cache_root()).summary.get("core_cache_hit")
