"""The model registry: configs as specified, seeded weights, tied embeddings."""

from __future__ import annotations

import torch

from mpk import models


def test_configs():
    c = models.config("llama-3.2-1b")
    assert (c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.num_attention_heads,
            c.num_key_value_heads, c.head_dim, c.vocab_size) == (2048, 8192, 16, 32, 8, 64, 128256)
    assert c.tie_word_embeddings and c.rms_norm_eps == 1e-5
    assert c.rope_parameters["rope_type"] == "llama3" and c.rope_parameters["rope_theta"] == 500000.0
    q = models.config("qwen3-8b")
    assert (q.hidden_size, q.num_hidden_layers, q.head_dim, q.tie_word_embeddings) == (4096, 36, 128, False)
    assert models.config("qwen3-0.6b").rope_parameters["rope_theta"] == 1000000.0
    assert all(models.config(n)._attn_implementation == "sdpa" for n in models.MODELS)


def test_build_is_seeded_and_ties(monkeypatch):
    monkeypatch.setitem(models.CONFIGS, "tied", lambda: models._qwen3(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, tie_word_embeddings=True))
    a, b = models.build("tied", seed=3), models.build("tied", seed=3)
    assert a.lm_head.weight is a.model.embed_tokens.weight
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(p, q), n
    assert torch.equal(a.model.norm.weight, torch.ones_like(a.model.norm.weight))
    assert abs(a.model.embed_tokens.weight.std().item() - 0.02) < 0.005
