"""Errors a user reads: unsupported ops name the op and the model line; bad call
arguments name the argument."""

from __future__ import annotations

import pytest
import torch

import mpk
from mpk import backend, errors
from mpk.models import cache_kw


class SortModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(16, 16, bias=False)

    def forward(self, x):
        h = self.proj(x)
        return torch.sort(h, dim=-1).values  # mpk-unsupported-line


def test_unsupported_op_names_op_and_line(core_lib, fresh_dynamo):
    m = SortModel()
    with pytest.raises(mpk.UnsupportedOpError) as ei, torch.no_grad():
        torch.compile(m, backend="mpk", options={"target": "reference"}, fullgraph=True,
                      dynamic=False)(torch.randn(1, 16))
    msg = str(ei.value)
    assert "aten.sort" in msg
    assert "test_errors.py:" in msg and "torch.sort(h, dim=-1)" in msg
    assert ei.value.kind == "unsupported_op"
    assert isinstance(ei.value, mpk.MpkError)


def test_unsupported_op_in_a_hf_model_names_its_line(core_lib, fresh_dynamo, monkeypatch):
    """A family mpk does not cover yet (a mixture of experts: data-dependent
    top-k routing) fails with the op and the line of the HF model."""
    from mpk import check, families, models
    monkeypatch.setitem(models.CONFIGS, "tiny-mixtral", lambda: families._cfg(
        "MixtralConfig", num_local_experts=4, num_experts_per_tok=2, head_dim=16, sliding_window=None))
    lines = []
    res = check.run_check(model="tiny-mixtral", target="reference", cache_tokens=8, log=lines.append)
    assert not res.ok and res.line.startswith("FAIL mpk error (unsupported_op)"), res.line
    text = "\n".join(lines)
    assert "aten.topk" in text and "modeling_mixtral.py:" in text and "torch.topk(" in text, text


def test_from_wire_builds_subclass_and_message():
    e = errors.from_wire({"kind": "validation", "message": "wait on event 3 is unsatisfiable",
                          "node": "mm", "op": "aten.mm.default", "source": "m.py:4  y = x @ w",
                          "hint": "report it"})
    assert isinstance(e, mpk.ValidationError)
    assert str(e) == ("wait on event 3 is unsatisfiable\n  at node mm (aten.mm.default)"
                      "\n  model line: m.py:4  y = x @ w\n  hint: report it")
    assert isinstance(errors.from_wire({"kind": "unsupported_op", "message": "x"}), mpk.UnsupportedOpError)
    assert type(errors.from_wire({"kind": "something_new", "message": "x"})) is mpk.MpkError
    assert isinstance(errors.from_wire(None), mpk.InternalError)


class Lin(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(8, 4))

    def forward(self, x):
        return (x @ self.w + 1.0,)


@pytest.fixture(params=["fake_core", "real_core"])
def compiled_lin(request, fresh_dynamo):
    """The Lin model compiled by a fake core (no Go) and by the real one."""
    if request.param == "fake_core":
        request.getfixturevalue("fake_core")
    else:
        request.getfixturevalue("core_lib")
    compiled = []
    with torch.no_grad():
        torch.compile(Lin(), backend="mpk", options={"target": "reference", "on_compile": compiled.append},
                      fullgraph=True, dynamic=False)(torch.randn(2, 8))
    fn = compiled[-1]
    assert isinstance(fn, backend.CompiledGraph)
    names = [i["name"] for i in fn.inputs]
    x_idx = next(i for i, inp in enumerate(fn.inputs) if inp["meta"]["shape"] == [2, 8])
    return fn, names, x_idx


def _args(fn):
    return [torch.zeros(i["meta"]["shape"], dtype=torch.float32) for i in fn.inputs]


def test_good_call_runs(compiled_lin):
    fn, _, _ = compiled_lin
    try:
        out = fn(*_args(fn))
    except mpk.MpkError as e:
        if "not implemented" in str(e):
            pytest.xfail(f"core: {e.message}")
        raise
    assert isinstance(out, tuple) and out[0].shape == (2, 4)


@pytest.mark.parametrize("bad,what", [
    (lambda t: torch.zeros(3, 8), "shape"),
    (lambda t: torch.zeros(2, 8, dtype=torch.float64), "dtype"),
    (lambda t: torch.zeros(8, 2).t(), "strides"),
    (lambda t: torch.zeros(2, 8, device="meta"), "meta"),
    (lambda t: 3.0, "tensor"),
])
def test_bad_argument_names_it(compiled_lin, bad, what):
    fn, names, x_idx = compiled_lin
    args = _args(fn)
    args[x_idx] = bad(args[x_idx])
    with pytest.raises((mpk.MpkError, TypeError, ValueError)) as ei:
        fn(*args)
    msg = str(ei.value)
    assert f"argument {x_idx} ({names[x_idx]}" in msg
    assert what in msg


def test_wrong_argument_count(compiled_lin):
    fn, _, _ = compiled_lin
    with pytest.raises(mpk.ArgumentError, match="arguments"):
        fn(*_args(fn)[:-1])


# Out-of-range indices: a KV-cache write past the cache's capacity and a token
# id at or above the vocabulary raise MpkRuntimeError naming the op and the
# index (tests/test_cuda.py runs the same on the GPU), and compiling and
# running go on afterwards.

def _index_error_steps(target: str, device: str, bad: str):
    """Steps of tiny-llama (a cache of 10 slots holding 8 tokens) until one
    raises: `bad` is "cache" (the third step writes slot 10) or "token" (the
    first step's token id is the vocabulary size)."""
    from mpk import check
    check.ensure_backend_registered()
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    m, cache = check.decode_setup("tiny-llama", 8, dtype=dtype, device=device, extra=2)
    step = torch.compile(m, backend="mpk", fullgraph=True, dynamic=False, options={"target": target, "sync": True})
    tok = torch.tensor([[m.config.vocab_size if bad == "token" else 5]], device=device)
    with torch.no_grad():
        for _ in range(3):
            step(input_ids=tok, **cache_kw(cache), use_cache=True)


@pytest.mark.parametrize("bad,op,index", [("cache", "kv_write", "10"), ("token", "embedding", "256")])
def test_index_out_of_range_raises_on_the_reference_target(core_lib, fresh_dynamo, bad, op, index):
    with pytest.raises(errors.MpkRuntimeError) as e:
        _index_error_steps("reference", "cpu", bad)
    assert op in str(e.value) and f"index {index}" in str(e.value), str(e.value)


def test_index_abort_status_names_the_op_and_index():
    """The cuda target's status of an index abort (MPK_ABORT_INDEX: the op in
    event, the index in waited_ns as an int64) reads as the reference's error."""
    from mpk.build import abort_error
    summary = {"op_labels": ["embedding", "kv_write"], "op_nodes": ["embedding", "index_copy_1"]}
    st = {"aborted": 2, "worker": 7, "task": 40, "event": 1, "count": 10, "needed": 10, "waited_ns": 10}
    msg = str(abort_error(st, summary))
    assert isinstance(abort_error(st, summary), errors.MpkRuntimeError)
    assert "kv_write#1 (index_copy_1)" in msg and "index 10" in msg and "size 10" in msg, msg
    st = {**st, "event": 0, "waited_ns": (1 << 64) - 3, "needed": 256}  # a negative index, as read
    assert "index -3" in str(abort_error(st, summary)) and "embedding#0" in str(abort_error(st, summary))
