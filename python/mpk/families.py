"""Tiny configs of the Hugging Face decoder families mpk is tested on.

Each family is a small model (hidden 64, 2 layers, a small vocabulary) with
the features that set the family apart switched on: biases, partial rotary
embeddings, parallel blocks, soft-capping, sliding windows, multipliers. The
family test suite (tests/test_families.py) runs every one of them through
the four calls of `python -m mpk check`, and the README's table of families
is this list (a test keeps the two equal)."""

from __future__ import annotations

from typing import Callable

# Shared tiny sizes; sliding windows are shorter than the cache the checks
# fill, so the sliding-window layers run full (the roll/cat update paths).
_TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
             pad_token_id=0, bos_token_id=1, eos_token_id=2)
WINDOW = 16


def _cfg(cls: str, **kw):
    import transformers
    return getattr(transformers, cls)(**{**_TINY, **kw})


# (README name, model name, config builder)
FAMILIES: list[tuple[str, str, Callable]] = [
    ("Llama", "tiny-llama", lambda: _cfg("LlamaConfig")),
    ("Mistral", "tiny-mistral", lambda: _cfg("MistralConfig", head_dim=16, sliding_window=None)),
    ("Mistral (sliding window)", "tiny-mistral-sw",
     lambda: _cfg("MistralConfig", head_dim=16, sliding_window=WINDOW)),
    ("Qwen2", "tiny-qwen2", lambda: _cfg("Qwen2Config")),
    ("Qwen3", "tiny-qwen3", lambda: _cfg("Qwen3Config", head_dim=16)),
    ("Phi-3", "tiny-phi3", lambda: _cfg("Phi3Config")),
    ("Phi", "tiny-phi", lambda: _cfg("PhiConfig")),
    ("Gemma", "tiny-gemma", lambda: _cfg("GemmaConfig", head_dim=16)),
    ("Gemma 2", "tiny-gemma2",
     lambda: _cfg("Gemma2Config", head_dim=16, query_pre_attn_scalar=16, sliding_window=WINDOW)),
    ("Gemma 3", "tiny-gemma3",
     lambda: _cfg("Gemma3TextConfig", head_dim=16, query_pre_attn_scalar=16, sliding_window=WINDOW,
                  layer_types=["sliding_attention", "full_attention"])),
    ("Granite", "tiny-granite",
     lambda: _cfg("GraniteConfig", embedding_multiplier=12.0, residual_multiplier=0.22,
                  attention_multiplier=0.0078125, logits_scaling=8.0)),
    ("OLMo", "tiny-olmo", lambda: _cfg("OlmoConfig", clip_qkv=8.0)),
    ("OLMo 2", "tiny-olmo2", lambda: _cfg("Olmo2Config")),
    ("SmolLM3", "tiny-smollm3", lambda: _cfg("SmolLM3Config", no_rope_layer_interval=2)),
    ("StableLM", "tiny-stablelm", lambda: _cfg("StableLmConfig", use_qkv_bias=True)),
    ("GPT-NeoX", "tiny-gpt-neox", lambda: _cfg("GPTNeoXConfig", num_attention_heads=4)),
]

CONFIGS: dict[str, Callable] = {model: build for _, model, build in FAMILIES}
