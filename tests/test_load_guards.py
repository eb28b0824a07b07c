"""mpk.load(..., check_guards=False): the opt-in that skips Dynamo's guard
check after the first call; mpk's own argument checks stay."""

from __future__ import annotations

import pytest
import torch

import mpk
from mpk import check
from mpk.errors import ArgumentError


def _load(tmp_path, check_guards: bool):
    m, cache = check.decode_setup("tiny-llama", 16, dtype=torch.float32, device="cpu")
    path = str(tmp_path / "s.mpk")
    mpk.precompile(m, path, input_ids=torch.tensor([[1]]), past_key_values=cache, use_cache=True,
                   options={"target": "reference"})
    return m, cache, mpk.load(m, path, check_guards=check_guards)


@torch.no_grad()
def test_unguarded_load_checks_the_first_call_then_only_tensors(core_lib, fresh_dynamo, tmp_path):
    m, cache, step = _load(tmp_path, check_guards=False)
    two = torch.tensor([[1, 2]])
    with pytest.raises(ArgumentError, match="does not match the precompiled graph.*input_ids"):
        step(input_ids=two, past_key_values=cache, use_cache=True)  # the guards see the first call
    state = check.snapshot(cache)
    got = step(input_ids=torch.tensor([[7]]), past_key_values=cache, use_cache=True).logits
    check.restore(cache, state)
    want = m(input_ids=torch.tensor([[7]]), past_key_values=cache, use_cache=True).logits
    assert check.rel_err(got, want) <= 1e-5
    # Later calls skip the guards: the same mismatch reaches mpk's own check of the tensor.
    with pytest.raises(ArgumentError, match=r"has shape \[1, 2\], compiled for \[1, 1\]"):
        step(input_ids=two, past_key_values=cache, use_cache=True)


@torch.no_grad()
def test_guarded_load_keeps_checking_guards(core_lib, fresh_dynamo, tmp_path):
    _, cache, step = _load(tmp_path, check_guards=True)
    step(input_ids=torch.tensor([[7]]), past_key_values=cache, use_cache=True)
    with pytest.raises(ArgumentError, match="does not match the precompiled graph.*input_ids"):
        step(input_ids=torch.tensor([[1, 2]]), past_key_values=cache, use_cache=True)
