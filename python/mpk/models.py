"""Hugging Face models built from configs with seeded random weights.

Construction skips HF's weight init (no_init_weights) and fills every weight
with one seeded normal draw (std 0.02; norm weights 1), so even the 8B shapes
build in seconds rather than minutes."""

from __future__ import annotations

import os
from typing import Callable

import torch

from . import families

_LLAMA3_ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def _llama(**kw):
    from transformers import LlamaConfig
    return LlamaConfig(**kw)


def _qwen3(**kw):
    from transformers import Qwen3Config
    return Qwen3Config(**kw)


def _llama32_1b():
    cfg = _llama(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                 num_attention_heads=32, num_key_value_heads=8, head_dim=64, rms_norm_eps=1e-5,
                 tie_word_embeddings=True, max_position_embeddings=131072,
                 rope_theta=500000.0, rope_scaling=dict(_LLAMA3_ROPE))
    # transformers 5 keeps rope settings in rope_parameters; make sure both spellings agree.
    rp = getattr(cfg, "rope_parameters", None)
    if isinstance(rp, dict) and rp.get("rope_type") != "llama3":
        cfg.rope_parameters = {**_LLAMA3_ROPE, "rope_theta": 500000.0}
    return cfg


CONFIGS: dict[str, Callable] = {
    **families.CONFIGS,  # tiny-llama, tiny-qwen3, tiny-phi3, ...: one per tested family
    # Wide enough for the weight-streaming Linear (K a multiple of a warp's
    # 256-element chunk); small-qwen3's 768 gives pages of 10 rows, a
    # partial last load per page.
    "small-llama": lambda: _llama(vocab_size=1024, hidden_size=256, intermediate_size=512,
                                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                  max_position_embeddings=1024),
    "small-qwen3": lambda: _qwen3(vocab_size=1024, hidden_size=256, intermediate_size=768,
                                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                  head_dim=64, max_position_embeddings=1024),
    # The tensor-core Linear for several rows of x (batches, prompt chunks)
    # needs K a multiple of 512: pages of 1,024 columns (hidden 1,024) and of
    # 512 (intermediate 1,536, three pages a row group).
    "wide-llama": lambda: _llama(vocab_size=2048, hidden_size=1024, intermediate_size=1536,
                                 num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4,
                                 max_position_embeddings=1024),
    # Qwen3's rows of 128 (head_dim as qwen3-0.6b to 8b's): the q/k norm and
    # RoPE take half a warp a row there (tasks/generic.cuh rope_lane_rows)
    "wide-qwen3": lambda: _qwen3(vocab_size=2048, hidden_size=1024, intermediate_size=1536,
                                 num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4,
                                 head_dim=128, max_position_embeddings=1024),
    # an MLP 8 times as wide as the model: its down projection's x (batch 32 × 4,096) is too
    # large for one tile stream even rounded (option split_k)
    "long-mlp-llama": lambda: _llama(vocab_size=2048, hidden_size=512, intermediate_size=4096,
                                     num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4,
                                     max_position_embeddings=1024),
    "llama-3.2-1b": _llama32_1b,
    "qwen3-0.6b": lambda: _qwen3(vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                                 num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                                 head_dim=128, tie_word_embeddings=True, rope_theta=1000000.0,
                                 rms_norm_eps=1e-6, max_position_embeddings=40960),
    "qwen3-1.7b": lambda: _qwen3(vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                                 num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                                 head_dim=128, tie_word_embeddings=True, rope_theta=1000000.0,
                                 rms_norm_eps=1e-6, max_position_embeddings=40960),
    "qwen3-8b": lambda: _qwen3(vocab_size=151936, hidden_size=4096, intermediate_size=12288,
                               num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                               head_dim=128, tie_word_embeddings=False, rope_theta=1000000.0,
                               rms_norm_eps=1e-6, max_position_embeddings=40960),
}

MODELS = tuple(CONFIGS)


def config(name: str):
    """The config of a named model, or of a local HF config: a config.json file
    or a directory holding one (what save_pretrained writes)."""
    if name in CONFIGS:
        cfg = CONFIGS[name]()
    elif os.path.exists(name):
        from transformers import AutoConfig
        cfg = AutoConfig.from_pretrained(name)
    else:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}, or a path to a config.json")
    cfg._attn_implementation = "sdpa"
    return cfg


def attention_implementation(cfg) -> str:
    """SDPA where the model class supports it (Gemma 2 does not: its soft-capping
    needs the eager attention), else eager."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING
    cls = MODEL_FOR_CAUSAL_LM_MAPPING.get(type(cfg), None)
    return "sdpa" if cls is None or getattr(cls, "_supports_sdpa", True) else "eager"


@torch.no_grad()
def fill_random(model: torch.nn.Module, seed: int = 0, std: float = 0.02) -> None:
    """Seeded weights: norm weights (1-D, name contains 'norm') are 1, the rest
    (biases included) N(0, std)."""
    gens: dict[torch.device, torch.Generator] = {}
    seen = set()
    for name, p in model.named_parameters():
        if id(p) in seen:  # tied weights
            continue
        seen.add(id(p))
        if p.dim() == 1 and "norm" in name and not name.endswith("bias"):
            p.fill_(1.0)
        else:
            g = gens.get(p.device)
            if g is None:
                g = gens[p.device] = torch.Generator(device=p.device).manual_seed(seed)
            if p.dtype in (torch.float32, torch.float64):
                p.normal_(0.0, std, generator=g)
            else:  # draw in float32 for the same values in every dtype
                p.copy_(torch.empty(p.shape, dtype=torch.float32, device=p.device)
                        .normal_(0.0, std, generator=g))


def build(name: str, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
          seed: int = 0):
    """An eval-mode causal LM with seeded random weights."""
    from transformers import AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    cfg = config(name)
    attn = attention_implementation(cfg)
    cfg._attn_implementation = attn
    with no_init_weights(), torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation=attn)
    model.to(dtype)
    # no_init_weights also skips init_weights' tie_weights(): tie here, before filling.
    if getattr(cfg, "tie_word_embeddings", False):
        model.tie_weights()
    fill_random(model, seed)
    return model.eval()


def cache_kw(cache) -> dict:
    """The keyword argument that passes a cache to a Hugging Face causal
    LM's forward: `cache` where forward takes it (transformers renamed
    `past_key_values`, which it removes in 5.40), else `past_key_values`.
    Use as `model(input_ids=ids, **cache_kw(cache), use_cache=True)`."""
    return {_cache_name(): cache}


_CACHE_NAME: list[str] = []


def _cache_name() -> str:
    if not _CACHE_NAME:
        import inspect

        from transformers import LlamaForCausalLM
        params = inspect.signature(LlamaForCausalLM.forward).parameters
        _CACHE_NAME.append("cache" if "cache" in params else "past_key_values")
    return _CACHE_NAME[0]
