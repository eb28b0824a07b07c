"""Export of ATen graphs to the wire format (no Go core needed: core.compile is faked)."""

from __future__ import annotations

import re

import pytest
import torch

from mpk import backend, export


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8, bias=False)
        self.register_buffer("state", torch.zeros(2, 8))

    def forward(self, x):
        h = self.proj(x)
        vals, idx = torch.topk(h, 2, dim=-1)
        y = h.to(torch.float64).sum(-1)
        self.state.copy_(h)
        return vals * 2, idx, y


def _node(req, target):
    return next(n for n in req["graph"]["nodes"] if n["target"] == target)


def test_export_small_graph(fake_core):
    m = Small()
    x = torch.randn(2, 8)
    with torch.no_grad():
        out = torch.compile(m, backend=backend.mpk_backend, options={"target": "reference"},
                            fullgraph=True, dynamic=False)(x)
    assert len(fake_core) == 1
    req = fake_core[0]
    assert req["version"] == 1
    assert req["options"] == {"target": "reference", "num_workers": 132, "seed": 0,
                              "skip_validate": False, "drop_dependency": False, "check_ir": False, "trace": False,
                              "round_intermediates": False, "split_rows": True,
                              "prefill_rows": True, "split_k": True, "gemm": True, "wgmma": True,
                              "gemm_row_blocks": True, "gemm_siblings": True, "long_attention_chunks": True,
                              "round_gemm_inputs": False, "coarse_events": True, "fresh_rows": True,
                              "pair_linears": True, "pair_gemm": True, "balance_gemm_tail": True, "kv_pages": True, "weight_affinity": False,
                              "arena_reuse": True, "timed_schedule": True, "split_gemm_x": True, "gemm_batch": False,
                              "kv_pages_batch": True, "tile_x_parts": True, "pair_tiles": True,
                              "wide_x_parts": False, "kv_swizzle": False}
    g = req["graph"]
    kinds = [i["kind"] for i in g["inputs"]]
    assert kinds.count("param") == 1 and kinds.count("input") == 1 and kinds.count("buffer") == 1
    x_in = next(i for i in g["inputs"] if i["kind"] == "input")
    assert x_in["meta"] == {"dtype": "float32", "shape": [2, 8], "strides": [8, 1], "offset": 0}

    targets = [n["target"] for n in g["nodes"]]
    assert "aten.mm.default" in targets
    assert "aten.topk.default" in targets
    assert "aten.copy_.default" in targets
    assert not any("getitem" in t for t in targets)

    topk = _node(req, "aten.topk.default")
    assert topk["args"][1] == {"k": "int", "i": 2}
    assert len(topk["outs"]) == 2 and topk["outs"][1]["dtype"] == "int64"
    # getitem resolved: outputs reference topk's results by index
    refs = [o for o in g["outputs"] if o["node"] == topk["name"]]
    assert {"k": "node", "node": topk["name"], "index": 1} in refs
    mul = _node(req, "aten.mul.Tensor")
    assert mul["args"][0] == {"k": "node", "node": topk["name"], "index": 0}

    to = _node(req, "aten._to_copy.default")
    assert to["kwargs"]["dtype"] == {"k": "dtype", "s": "float64"}

    # the buffer write: copy_ into the buffer input
    cp = _node(req, "aten.copy_.default")
    buf = next(i for i in g["inputs"] if i["kind"] == "buffer")
    assert cp["args"][0] == {"k": "node", "node": buf["name"], "index": 0}

    # source lines point at this file
    mm = _node(req, "aten.mm.default")
    assert mm["source"].startswith("test_export.py:") and "self.proj(x)" in mm["source"]
    assert "torch.topk" in topk["source"]
    assert len(out) == 3


def test_unknown_option(fake_core):
    with pytest.raises(Exception) as ei:
        torch.compile(lambda x: x + 1, backend=backend.mpk_backend,
                      options={"target": "reference", "bogus": 1})(torch.randn(2))
    assert "bogus" in str(ei.value)


def test_grad_required_is_rejected(fake_core):
    lin = torch.nn.Linear(4, 4)
    with pytest.raises(Exception) as ei:
        torch.compile(lin, backend=backend.mpk_backend, options={"target": "reference"})(torch.randn(1, 4))
    assert "inference only" in str(ei.value)


def test_source_line_innermost_user_frame():
    class N:
        meta = {"stack_trace": (
            '  File "/home/u/model.py", line 10, in forward\n    h = self.block(x)\n'
            '  File "/home/u/block.py", line 3, in forward\n    return self.proj(x)\n'
            '  File "/usr/lib/python3/site-packages/torch/nn/modules/linear.py", line 125, in forward\n'
            '    return F.linear(input, self.weight, self.bias)\n')}
    assert export.source_line(N()) == "block.py:3  return self.proj(x)"


def test_arg_encoding():
    ex = export._Exporter(None)
    node = torch.fx.Graph().placeholder("p")
    assert ex.arg(torch.bfloat16, node) == {"k": "dtype", "s": "bfloat16"}
    assert ex.arg(torch.device("cpu"), node) == {"k": "str", "s": "cpu"}
    assert ex.arg(torch.contiguous_format, node) == {"k": "str", "s": "torch.contiguous_format"}
    assert ex.arg(torch.strided, node) == {"k": "str", "s": "torch.strided"}
    assert ex.arg([1, 2.5, None, True], node) == {"k": "list", "list": [
        {"k": "int", "i": 1}, {"k": "float", "f": 2.5}, {"k": "none"}, {"k": "bool", "b": True}]}


def test_non_finite_floats_are_valid_json():
    import json
    ex = export._Exporter(None)
    node = torch.fx.Graph().placeholder("p")
    neg = ex.arg(float("-inf"), node)
    assert neg == {"k": "float", "f": -export.FLOAT64_MAX, "s": "-inf"}
    assert ex.arg(float("nan"), node) == {"k": "float", "f": 0.0, "s": "nan"}
    json.dumps([neg], allow_nan=False)


def _fake_cuda_graph(fn):
    """fn traced to ATen with a fake CUDA tensor x and a CPU scalar n (no GPU needed)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    with FakeTensorMode():
        x, n = torch.empty(4, device="cuda"), torch.tensor(3)
        # functionalized as AOTAutograd does: an input mutation is a copy_ into it
        return make_fx(torch.func.functionalize(fn, remove="mutations_and_views"))(x, n), [x, n]


def test_cpu_input_of_a_cuda_graph_is_marked_host():
    """HF's StaticCache holds its length on the CPU until the first call
    moves it: that input is copied to the device per call (marked host)."""
    gm, ex = _fake_cuda_graph(lambda x, n: x + n.to(x.device))
    inputs = export.export_graph(gm, ex)["graph"]["inputs"]
    assert [i.get("host", False) for i in inputs] == [False, True]


def test_cpu_graph_has_no_host_inputs():
    from torch.fx.experimental.proxy_tensor import make_fx
    x, n = torch.ones(4), torch.tensor(3)
    inputs = export.export_graph(make_fx(lambda x, n: x + n)(x, n), [x, n])["graph"]["inputs"]
    assert not any(i.get("host") for i in inputs)


@pytest.mark.parametrize("fn, what", [
    (lambda x, n: (x + n.to(x.device), n + 1), "graph output 1 (add_1) is a CPU tensor in a CUDA graph"),
    (lambda x, n: x + n.add_(1).to(x.device), "graph input n_1 is a CPU tensor that the CUDA graph writes"),
])
def test_cpu_tensor_a_cuda_graph_writes_or_returns_is_refused(fn, what):
    gm, ex = _fake_cuda_graph(fn)
    with pytest.raises(export.ExportError, match=re.escape(what)):
        export.export_graph(gm, ex)
