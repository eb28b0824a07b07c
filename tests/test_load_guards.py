"""Opt-ins that skip some of Dynamo's guard checks (each documented as unsafe): mpk.load(...,
check_guards=False) and torch's guard filter on torch.compile; mpk's own argument checks stay."""

from __future__ import annotations

import pytest
import torch

import mpk
from mpk import check
from mpk.errors import ArgumentError
from mpk.models import cache_kw


def _load(tmp_path, check_guards: bool):
    m, cache = check.decode_setup("tiny-llama", 16, dtype=torch.float32, device="cpu")
    path = str(tmp_path / "s.mpk")
    mpk.precompile(m, path, input_ids=torch.tensor([[1]]), **cache_kw(cache), use_cache=True,
                   options={"target": "reference"})
    return m, cache, mpk.load(m, path, check_guards=check_guards)


@torch.no_grad()
def test_unguarded_load_checks_the_first_call_then_only_tensors(core_lib, fresh_dynamo, tmp_path):
    m, cache, step = _load(tmp_path, check_guards=False)
    two = torch.tensor([[1, 2]])
    with pytest.raises(ArgumentError, match="does not match the precompiled graph.*input_ids"):
        step(input_ids=two, **cache_kw(cache), use_cache=True)  # the guards see the first call
    state = check.snapshot(cache)
    got = step(input_ids=torch.tensor([[7]]), **cache_kw(cache), use_cache=True).logits
    check.restore(cache, state)
    want = m(input_ids=torch.tensor([[7]]), **cache_kw(cache), use_cache=True).logits
    assert check.rel_err(got, want) <= 1e-5
    # Later calls skip the guards: the same mismatch reaches mpk's own check of the tensor.
    with pytest.raises(ArgumentError, match=r"has shape \[1, 2\], compiled for \[1, 1\]"):
        step(input_ids=two, **cache_kw(cache), use_cache=True)


@torch.no_grad()
def test_guarded_load_keeps_checking_guards(core_lib, fresh_dynamo, tmp_path):
    _, cache, step = _load(tmp_path, check_guards=True)
    step(input_ids=torch.tensor([[7]]), **cache_kw(cache), use_cache=True)
    with pytest.raises(ArgumentError, match="does not match the precompiled graph.*input_ids"):
        step(input_ids=torch.tensor([[1, 2]]), **cache_kw(cache), use_cache=True)


@torch.no_grad()
def test_torch_compile_without_module_guards_still_checks_parameters(core_lib, fresh_dynamo):
    """torch's unsafe guard filter skip_guard_on_all_nn_modules_unsafe (the
    README's opt-in) passes through torch.compile's options to Dynamo, not to
    mpk; a parameter changed after the compile, which Dynamo no longer
    guards, is refused by mpk's own argument check."""
    check.ensure_backend_registered()
    m, cache = check.decode_setup("tiny-llama", 8, dtype=torch.float32, device="cpu", extra=4)
    step = torch.compile(m, backend="mpk", fullgraph=True, dynamic=False,
                         options={"target": "reference",
                                  "guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe})
    tok = torch.tensor([[5]])
    state = check.snapshot(cache)
    got = step(input_ids=tok, **cache_kw(cache), use_cache=True).logits
    check.restore(cache, state)
    assert check.rel_err(got, m(input_ids=tok, **cache_kw(cache), use_cache=True).logits) <= 1e-5
    w = m.model.layers[0].mlp.up_proj.weight
    w.data = w.data.double()
    with pytest.raises(ArgumentError, match="has dtype float64, compiled for float32"):
        step(input_ids=tok, **cache_kw(cache), use_cache=True)
