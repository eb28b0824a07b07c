"""Tiny configs of the Hugging Face decoder families mpk is tested on.

Each family is a small model (hidden 64, 2 layers, a small vocabulary) with
the features that set the family apart switched on: biases, partial rotary
embeddings, parallel blocks, soft-capping, sliding windows, multipliers. The
family test suite (tests/test_families.py) runs every one of them through
the four calls of `python -m mpk check`, and the README's table of families
is this list (a test keeps the two equal)."""

from __future__ import annotations

from dataclasses import dataclass
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


@dataclass(frozen=True)
class Family:
    name: str      # as the README's table names it
    model: str     # the model name for `python -m mpk check --model`
    features: str  # what it exercises beyond Llama
    config: Callable


FAMILIES: list[Family] = [
    Family("Llama", "tiny-llama", "RMSNorm, SwiGLU, RoPE, GQA",
           lambda: _cfg("LlamaConfig")),
    Family("Mistral", "tiny-mistral", "no sliding window",
           lambda: _cfg("MistralConfig", head_dim=16, sliding_window=None)),
    Family("Mistral (sliding window)", "tiny-mistral-sw",
           "sliding-window cache (roll, constant index), offset mask",
           lambda: _cfg("MistralConfig", head_dim=16, sliding_window=WINDOW)),
    Family("Qwen2", "tiny-qwen2", "q/k/v biases",
           lambda: _cfg("Qwen2Config")),
    Family("Qwen3", "tiny-qwen3", "per-head q/k RMSNorm",
           lambda: _cfg("Qwen3Config", head_dim=16)),
    Family("Phi-3", "tiny-phi3", "fused qkv and gate/up projections (split, chunk)",
           lambda: _cfg("Phi3Config")),
    Family("Phi", "tiny-phi",
           "LayerNorm, GELU (tanh formula), partial rotary, parallel attention + MLP, biases",
           lambda: _cfg("PhiConfig")),
    Family("Gemma", "tiny-gemma", "(1 + w) RMSNorm, GELU (tanh), scaled embeddings, tied head",
           lambda: _cfg("GemmaConfig", head_dim=16)),
    Family("Gemma 2", "tiny-gemma2",
           "attention and logit soft-capping (eager attention), sliding layers, sandwich norms",
           lambda: _cfg("Gemma2Config", head_dim=16, query_pre_attn_scalar=16, sliding_window=WINDOW)),
    Family("Gemma 3", "tiny-gemma3", "q/k norm, sliding and full layers with their own RoPE",
           lambda: _cfg("Gemma3TextConfig", head_dim=16, query_pre_attn_scalar=16, sliding_window=WINDOW,
                        layer_types=["sliding_attention", "full_attention"])),
    Family("Granite", "tiny-granite", "embedding, residual, attention and logit multipliers",
           lambda: _cfg("GraniteConfig", embedding_multiplier=12.0, residual_multiplier=0.22,
                        attention_multiplier=0.0078125, logits_scaling=8.0)),
    Family("OLMo", "tiny-olmo", "LayerNorm without parameters, q/k/v clipping",
           lambda: _cfg("OlmoConfig", clip_qkv=8.0)),
    Family("OLMo 2", "tiny-olmo2", "q/k RMSNorm over all heads, norms after attention and MLP",
           lambda: _cfg("Olmo2Config")),
    Family("SmolLM3", "tiny-smollm3", "layers without RoPE",
           lambda: _cfg("SmolLM3Config", no_rope_layer_interval=2)),
    Family("StableLM", "tiny-stablelm", "LayerNorm with bias, partial rotary, q/k/v biases",
           lambda: _cfg("StableLmConfig", use_qkv_bias=True)),
    Family("Cohere", "tiny-cohere",
           "interleaved-pair rotary (stack), LayerNorm without bias, parallel block, logit scale",
           lambda: _cfg("CohereConfig")),
    Family("GPT-J", "tiny-gptj", "interleaved-pair partial rotary from a position table (gather, repeat)",
           lambda: _cfg("GPTJConfig", n_embd=64, n_layer=2, n_head=4, rotary_dim=8)),
    Family("GPT-NeoX", "tiny-gpt-neox",
           "fused per-head qkv, LayerNorm, GELU, partial rotary, parallel residual, biases",
           lambda: _cfg("GPTNeoXConfig")),
]

CONFIGS: dict[str, Callable] = {f.model: f.config for f in FAMILIES}
