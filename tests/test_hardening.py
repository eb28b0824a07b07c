"""Hardening at every boundary: malformed wire input, absurd sizes, bad call
arguments (layout, aliasing, device, freed or resized storage) each raise a
clear Python exception and leave the process usable; a loop of 1,000 compiles
does not grow memory."""

from __future__ import annotations

import copy
import json
import os
import time

import pytest
import torch

import mpk
from mpk import backend, core, errors

OPTS = {"target": "reference"}


def _affine(x, y):
    return x * 2 + y


def _compile_affine():
    """torch.compile of _affine for (4, 8) float32 inputs; returns (compiled fn, CompiledGraph)."""
    compiled = []
    cf = torch.compile(_affine, backend="mpk", options={**OPTS, "on_compile": compiled.append}, fullgraph=True,
                       dynamic=False)
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    with torch.no_grad():
        torch.testing.assert_close(cf(x, y), _affine(x, y))
    fn = compiled[-1]
    assert isinstance(fn, backend.CompiledGraph) and len(fn.inputs) == 2
    cf.compiled = compiled  # every compile of cf, later ones included
    return cf, fn


def _assert_usable():
    """A small valid compile + run still works (the process survived the failure)."""
    torch._dynamo.reset()
    cf = torch.compile(lambda a: torch.relu(a) - 1.0, backend="mpk", options=OPTS, fullgraph=True,
                       dynamic=False)
    a = torch.randn(3, 5)
    with torch.no_grad():
        torch.testing.assert_close(cf(a), torch.relu(a) - 1.0)


@pytest.fixture(scope="module")
def request_dict(core_lib):
    """A small valid wire request (x * 2 + y on (4, 8) float32), exported once."""
    torch._dynamo.reset()
    _, fn = _compile_affine()
    torch._dynamo.reset()
    return copy.deepcopy(fn.request)


# --- malformed wire input (straight to the core's C ABI) --------------------------------

@pytest.mark.parametrize("data,message", [
    (b"\x00\x01\x02 not a request", "neither zstd nor JSON"),
    (b"", "neither zstd nor JSON (0 bytes)"),
    (b'{"version": 1, "graph": {"inputs": [', "malformed request JSON"),
], ids=["garbage", "empty", "truncated-json"])
def test_malformed_bytes(request_dict, fresh_dynamo, data, message):
    with pytest.raises(errors.BadRequestError) as ei:
        core.compile_bytes(data)
    assert ei.value.kind == "bad_request" and isinstance(ei.value, mpk.MpkError)
    assert message in str(ei.value)
    _assert_usable()


def test_truncated_zstd_request(request_dict, fresh_dynamo):
    data = core.encode_request(request_dict)
    if not data.startswith(b"\x28\xb5\x2f\xfd"):
        pytest.skip("zstandard is not installed: requests go as raw JSON")
    with pytest.raises(errors.BadRequestError) as ei:
        core.compile_bytes(data[: len(data) // 2])
    assert ei.value.kind == "bad_request"
    assert "corrupt zstd request" in str(ei.value)
    _assert_usable()


def test_wrong_version(request_dict, fresh_dynamo):
    data = json.dumps({**request_dict, "version": 2}).encode()
    with pytest.raises(errors.BadRequestError) as ei:
        core.compile_bytes(data)
    assert ei.value.kind == "bad_request"
    assert "request version 2 is not supported" in str(ei.value)
    _assert_usable()


def test_missing_version(request_dict, fresh_dynamo):
    req = {k: v for k, v in request_dict.items() if k != "version"}
    with pytest.raises(errors.BadRequestError) as ei:
        core.compile(req)  # zstd-compressed, as the front end sends it
    assert ei.value.kind == "bad_request"
    assert "request has no version" in str(ei.value)
    _assert_usable()


# --- absurd sizes ------------------------------------------------------------------------

def test_dimension_of_2_pow_40(request_dict, fresh_dynamo):
    req = copy.deepcopy(request_dict)
    inp = req["graph"]["inputs"][0]
    inp["meta"]["shape"] = [2 ** 40, 8]
    inp["meta"]["strides"] = [8, 1]
    with pytest.raises(errors.InvalidGraphError) as ei:
        core.compile(req)
    msg = str(ei.value)
    assert ei.value.kind == "invalid_graph"
    assert f"{inp['name']}: dimension 0 has size {2 ** 40}, outside [0, 2^36]" in msg
    _assert_usable()


def test_negative_stride(request_dict, fresh_dynamo):
    req = copy.deepcopy(request_dict)
    inp = req["graph"]["inputs"][1]
    inp["meta"]["strides"] = [-8, 1]
    with pytest.raises(errors.InvalidGraphError) as ei:
        core.compile(req)
    assert ei.value.kind == "invalid_graph"
    assert f"input {inp['name']}: negative stride -8 in dim 0" in str(ei.value)
    _assert_usable()


# --- call-time arguments -----------------------------------------------------------------

def test_non_contiguous_input(core_lib, fresh_dynamo):
    cf, fn = _compile_affine()
    xt = torch.randn(8, 4).t()  # same shape (4, 8), strides (1, 4)
    y = torch.randn(4, 8)
    # Directly on the compiled callable: an ArgumentError naming the argument.
    with pytest.raises(errors.ArgumentError) as ei:
        fn(xt, y)
    msg = str(ei.value)
    assert "argument 0 (arg0_1, l_x_) has strides [1, 4], compiled for [8, 1]" in msg
    assert ".contiguous()" in msg
    # Through torch.compile Dynamo guards on strides and recompiles: the result is right.
    with torch.no_grad():
        torch.testing.assert_close(cf(xt, y), _affine(xt, y))
    _assert_usable()


def _two_writes(a, b):
    a.add_(1)
    b.mul_(2)
    return a + b


def test_aliased_inputs(core_lib, fresh_dynamo):
    # Through torch.compile: Dynamo guards on input aliasing and aot_autograd
    # dedups the aliased pair (the graph it hands mpk has one input), so the
    # result must equal eager's, in the outputs and in the mutated input.
    compiled = []
    cf = torch.compile(_two_writes, backend="mpk", options={**OPTS, "on_compile": compiled.append}, fullgraph=True,
                       dynamic=False)
    with torch.no_grad():
        cf(torch.ones(3, 4), torch.ones(3, 4))  # compiled for two distinct inputs
        fn = compiled[-1]
        x_eager, x_mpk = torch.ones(3, 4), torch.ones(3, 4)
        expect = _two_writes(x_eager, x_eager)
        got = cf(x_mpk, x_mpk)
    torch.testing.assert_close(got, expect)
    torch.testing.assert_close(x_mpk, x_eager)

    # Directly on the callable compiled for two distinct inputs that it writes:
    # aliasing would silently give a wrong answer, so it is refused.
    assert len(fn.inputs) == 2 and fn._written == {0, 1}
    x = torch.ones(3, 4)
    with pytest.raises(errors.ArgumentError) as ei:
        fn(x, x)
    msg = str(ei.value)
    assert "argument 0 (arg0_1, l_a_) overlaps argument 1 (arg1_1, l_b_) in memory" in msg
    assert "graph writes argument" in msg
    torch.testing.assert_close(x, torch.ones(3, 4))  # nothing ran
    # Overlapping views of one buffer are refused too; disjoint ones run.
    buf = torch.ones(5, 4)
    with pytest.raises(errors.ArgumentError, match="overlaps"):
        fn(buf[0:3], buf[2:5])
    buf = torch.ones(6, 4)
    with torch.no_grad():
        (out,) = fn(buf[0:3], buf[3:6])
    torch.testing.assert_close(out, torch.full((3, 4), 4.0))
    torch.testing.assert_close(buf, torch.cat([torch.full((3, 4), 2.0)] * 2))
    _assert_usable()


def test_wrong_device(core_lib, fresh_dynamo):
    _, fn = _compile_affine()  # compiled for CPU; no GPU here, so "meta" plays the wrong device
    with pytest.raises(errors.ArgumentError) as ei:
        fn(torch.randn(4, 8), torch.randn(4, 8, device="meta"))
    msg = str(ei.value)
    assert "argument 1 (arg1_1, l_y_) is on meta, the graph was compiled for cpu" in msg
    _assert_usable()


def test_new_shape_recompiles_correctly(core_lib, fresh_dynamo):
    cf, _ = _compile_affine()
    n = len(cf.compiled)
    x, y = torch.randn(6, 8), torch.randn(6, 8)
    with torch.no_grad():
        out = cf(x, y)  # Dynamo's shape guard fails: a new static-shape compile
    assert len(cf.compiled) == n + 1
    torch.testing.assert_close(out, _affine(x, y))


def test_resized_or_freed_input(core_lib, fresh_dynamo):
    _, fn = _compile_affine()
    y = torch.randn(4, 8)

    t = torch.randn(4, 8)
    t.resize_(2, 8)  # the tensor itself resized: its shape no longer matches
    with pytest.raises(errors.ArgumentError) as ei:
        fn(t, y)
    assert "argument 0 (arg0_1, l_x_) has shape [2, 8], compiled for [4, 8]" in str(ei.value)

    t = torch.randn(4, 8)
    t.untyped_storage().resize_(0)  # storage freed under a live view
    with pytest.raises(errors.ArgumentError) as ei:
        fn(t, y)
    assert "argument 0 (arg0_1, l_x_) has no storage (freed, or resized to 0 bytes)" in str(ei.value)

    t = torch.randn(4, 8)
    t.untyped_storage().resize_(16 * 4)  # storage shrunk to half the view
    with pytest.raises(errors.ArgumentError) as ei:
        fn(y, t)
    assert "argument 1 (arg1_1, l_y_) needs 128 bytes of storage, its storage holds 64" in str(ei.value)

    # A view at an offset past what its storage holds.
    base = torch.randn(6, 8)
    v = base[2:]
    base.untyped_storage().resize_(5 * 8 * 4)
    with pytest.raises(errors.ArgumentError, match=r"argument 0 .* needs 192 bytes of storage"):
        fn(v, y)

    with torch.no_grad():
        x = torch.randn(4, 8)
        torch.testing.assert_close(fn(x, y)[0], _affine(x, y))  # the callable still works
    _assert_usable()


def test_inputs_changed_after_a_passing_call(core_lib, fresh_dynamo):
    """The callable skips the full check for arguments unchanged since the last
    passing call; a change to the same tensor object must still be caught."""
    _, fn = _compile_affine()
    with torch.no_grad():
        x, y = torch.randn(4, 8), torch.randn(4, 8)
        fn(x, y)
        x.resize_(2, 8)  # same object, new shape
        with pytest.raises(errors.ArgumentError, match=r"argument 0 .* has shape \[2, 8\]"):
            fn(x, y)
        x, y = torch.randn(4, 8), torch.randn(4, 8)
        fn(x, y)
        y.untyped_storage().resize_(0)  # same object, storage freed
        with pytest.raises(errors.ArgumentError, match=r"argument 1 .* has no storage"):
            fn(x, y)
        x, y = torch.randn(4, 8), torch.randn(4, 8)
        fn(x, y)
        x.untyped_storage().resize_(16 * 4)  # same object, storage shrunk
        with pytest.raises(errors.ArgumentError, match=r"argument 0 .* needs 128 bytes of storage"):
            fn(x, y)
        x = torch.randn(4, 8)
        torch.testing.assert_close(fn(x, y)[0], _affine(x, y))


# --- memory: a loop of 1,000 compiles ----------------------------------------------------

def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Tiny(torch.nn.Module):
    """A tiny model: norm, MLP, softmax and a buffer written in place."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.RMSNorm(16)
        self.up = torch.nn.Linear(16, 32, bias=False)
        self.down = torch.nn.Linear(32, 16, bias=False)
        self.register_buffer("state", torch.zeros(2, 16))

    def forward(self, x):
        h = self.down(torch.nn.functional.silu(self.up(self.norm(x))))
        self.state.copy_(h)
        return torch.softmax(h + x, dim=-1)


def test_thousand_compiles_memory_flat(core_lib, fresh_dynamo):
    torch.manual_seed(0)
    m = Tiny().eval()
    x = torch.randn(2, 16)
    compiled = []
    with torch.no_grad():
        torch.compile(m, backend="mpk", options={**OPTS, "on_compile": compiled.append}, fullgraph=True,
                      dynamic=False)(x)
        expect = m(x)
    fn = compiled[-1]
    req = fn.request  # exported once, reused for every compile
    # Dynamo orders the inputs by first use; its names say which is which.
    by_name = {"l_x_": x, "l_self_buffers_state_": m.state}
    for n, p in m.named_parameters():
        mod, attr = n.split(".")
        by_name[f"l_self_modules_{mod}_parameters_{attr}_"] = p.detach()
    args = [by_name[d] for d in fn.display_names]

    warmup, total = 100, 1000
    rss_warm = 0
    t0 = time.perf_counter()
    for k in range(total):
        c = core.compile(req)
        if k % 50 == 0:
            out = torch.full((2, 16), float("nan"))
            c.run_reference(args + [out])
            torch.testing.assert_close(out, expect)
        c.release()
        if k + 1 == warmup:
            rss_warm = _rss_bytes()
    rss_end = _rss_bytes()
    dt = time.perf_counter() - t0
    grew = rss_end - rss_warm
    print(f"\n{total} compiles in {dt:.1f} s: RSS after {warmup} warm-up compiles "
          f"{rss_warm / 2**20:.1f} MiB, at the end {rss_end / 2**20:.1f} MiB "
          f"({grew / 2**20:+.1f} MiB, {grew / rss_warm * 100:+.2f}%)")
    assert rss_end <= rss_warm * 1.10  # the acceptance bound
    # RSS is mostly torch, so 10% would hide a leak; a leaked compiled graph
    # costs about 30 KiB, 26 MiB over this loop: bound the growth absolutely too.
    assert grew <= 16 * 2**20
