"""The exported-graph cache: a warm start skips AOTAutograd and computes the same."""

from __future__ import annotations

import torch

from mpk import backend, check, graph_cache


def test_second_compile_hits_and_matches(core_lib, fresh_dynamo, monkeypatch, tmp_path):
    monkeypatch.setenv("MPK_CACHE_DIR", str(tmp_path))
    first = check.run_check(model="tiny-llama", target="reference", steps=2, seed=2, log=lambda s: None)
    assert first.ok, first.line
    assert backend.last_compiled.front_timing.startswith("AOTAutograd ")
    assert len(list((tmp_path / "graphs").iterdir())) == 1
    torch._dynamo.reset()
    second = check.run_check(model="tiny-llama", target="reference", steps=2, seed=2, log=lambda s: None)
    assert second.ok, second.line
    assert backend.last_compiled.front_timing == "AOTAutograd skipped (graph cache hit)"
    assert second.rel_err == first.rel_err  # same graph, same seeded executor
    # A different shape (16 tokens a step) is a different key, traced afresh.
    torch._dynamo.reset()
    third = check.run_check(model="tiny-llama", target="reference", prefill=16, seed=2, log=lambda s: None)
    assert third.ok, third.line
    assert backend.last_compiled.front_timing.startswith("AOTAutograd ")


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
