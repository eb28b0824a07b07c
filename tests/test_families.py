"""Every HF decoder family of mpk.families, called the four ways users call it,
on the reference target against eager in float32: logits and the KV cache
after the step within 1e-4 (relative L2), one compile. The README's table of
families is generated from the same lists (test_readme_table)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mpk import check, families
from mpk.models import cache_kw

# The cache holds more tokens than a sliding window, so sliding-window layers
# run full (their roll-and-overwrite update and an offset mask).
CACHE_TOKENS = 32

# README column → check.run_check arguments.
CALLS = {
    "decode": {},
    "decode, 2-D mask": {"mask": True},
    "4-token chunk, mask": {"mask": True, "prefill": 4},
    "batch 4, left padding": {"mask": True, "batch": 4},
}

MODELS = [f.model for f in families.FAMILIES]


@pytest.mark.parametrize("call", CALLS)
@pytest.mark.parametrize("model", MODELS)
def test_family(core_lib, fresh_dynamo, model, call):
    lines = []
    res = check.run_check(model=model, target="reference", cache_tokens=CACHE_TOKENS, seed=0,
                          log=lines.append, **CALLS[call])
    assert res.ok, "\n".join(lines)
    assert res.rel_err <= 1e-4 and res.cache_err <= 1e-4 and res.compiles == 1
    assert res.executed == res.tasks > 0


@pytest.mark.parametrize("model", MODELS)
def test_left_padded_prefill_into_an_empty_cache(core_lib, fresh_dynamo, model):
    """A compiled prefill of a left-padded batch into a fresh StaticCache (its
    tensors are made inside the step): padded queries see no key at all, and
    attention gives them 0, as eager does."""
    import torch
    from transformers import StaticCache

    from mpk import models
    check.ensure_backend_registered()
    m = models.build(model)
    ids = torch.randint(0, m.config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, :3] = 0
    inputs = dict(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp_min(0))

    def run(fn):
        cache = StaticCache(config=m.config, max_cache_len=64)
        with torch.no_grad():
            logits = fn(**inputs, **cache_kw(cache), use_cache=True).logits
        return logits, [t for layer in cache.layers for t in (layer.keys, layer.values)]

    want, want_cache = run(m)
    got, got_cache = run(torch.compile(m, backend="mpk", options={"target": "reference"}, fullgraph=True,
                                       dynamic=False))
    assert check.rel_err(got, want) <= 1e-4
    assert max(check.rel_err(g, w) for g, w in zip(got_cache, want_cache)) <= 1e-4


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-mistral-sw", "tiny-gemma2"])
def test_decode_with_a_growing_mask(core_lib, fresh_dynamo, model):
    """A decode step whose 2-D mask covers the tokens so far, not the whole
    cache (a tokenizer's mask with a 1 appended per step; HF pads it to the
    cache), with left padding."""
    import torch

    from mpk import models
    check.ensure_backend_registered()
    m = models.build(model)
    ids = torch.randint(0, m.config.vocab_size, (2, CACHE_TOKENS), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, CACHE_TOKENS, dtype=torch.long)
    mask[1, :5] = 0
    pos = (mask.cumsum(-1) - 1).clamp_min(0)
    cache = check._make_cache(m, 64, "cpu", ids, attention_mask=mask, position_ids=pos)
    state = check.snapshot(cache)
    step = dict(input_ids=torch.tensor([[3], [4]]), position_ids=pos[:, -1:] + 1,
                attention_mask=torch.cat([mask, torch.ones(2, 1, dtype=torch.long)], -1))
    want = check._steps(m, cache, [step], "cpu")[0]
    want_cache = check.snapshot(cache)
    check.restore(cache, state)
    compiled = torch.compile(m, backend="mpk", options={"target": "reference"}, fullgraph=True, dynamic=False)
    got = check._steps(compiled, cache, [step], "cpu")[0]
    assert check.rel_err(got, want) <= 1e-4
    for a, b in zip(check.snapshot(cache), want_cache):
        assert check.rel_err(a["keys"], b["keys"]) <= 1e-4 and check.rel_err(a["values"], b["values"]) <= 1e-4


# The cuda target's acceptance runs of the same calls (skipped without a GPU):
# the bf16 rule on the four calls, and generate's tokens in float32.
GPU_MODELS = ["tiny-llama", "tiny-qwen3", "tiny-phi3", "tiny-gemma3", "tiny-gpt-neox", "tiny-mistral-sw"]


@pytest.mark.gpu
@pytest.mark.parametrize("call", CALLS)
@pytest.mark.parametrize("model", GPU_MODELS)
def test_family_cuda(core_lib, fresh_dynamo, model, call):
    lines = []
    res = check.run_check(model=model, target="cuda", cache_tokens=CACHE_TOKENS, seed=0, log=lines.append,
                          **CALLS[call])
    assert res.ok and res.compiles == 1, "\n".join(lines)


@pytest.mark.parametrize("target,tokens", [("reference", 8), pytest.param("cuda", 32, marks=pytest.mark.gpu)])
@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("model", ["tiny-llama", "tiny-qwen3"])
def test_generate(core_lib, fresh_dynamo, model, batch, target, tokens):
    """HF generate with a tokenizer-style attention_mask (left padding at batch
    4), a static cache and CompileConfig(backend="mpk") gives eager's greedy
    tokens (float32), through one mpk compile (generate builds the 4-D mask
    outside the compiled step)."""
    import torch
    from transformers import CompileConfig

    from mpk import models
    check.ensure_backend_registered()
    device = "cpu" if target == "reference" else "cuda"
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    m = models.build(model, device=device)
    ids = torch.randint(3, m.config.vocab_size, (batch, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(batch, 12, dtype=torch.long)
    for b in range(batch):
        mask[b, :3 * b] = 0
    ids = ids * mask
    kw = dict(input_ids=ids.to(device), attention_mask=mask.to(device), max_new_tokens=tokens, do_sample=False,
              cache_implementation="static", pad_token_id=0)
    with torch.no_grad():
        want = m.generate(**kw)
        compiled = []
        m.generation_config.compile_config = CompileConfig(
            backend="mpk", mode=None, fullgraph=True, dynamic=False,
            options={"target": target, "on_compile": compiled.append})
        m.generation_config.compile_config._compile_all_devices = True  # generate compiles on GPUs only otherwise
        got = m.generate(**kw)
    assert len(compiled) == 1
    assert torch.equal(got, want)


def test_sliding_windows_run_full():
    assert families.WINDOW < CACHE_TOKENS


def readme_table() -> str:
    head = ["Family", "`--model`", "exercises", *CALLS]
    rows = [head, ["---"] * len(head)]
    rows += [[f.name, f"`{f.model}`", f.features, *["pass"] * len(CALLS)] for f in families.FAMILIES]
    return "\n".join("| " + " | ".join(r) + " |" for r in rows)


def test_readme_table():
    """The README lists exactly the families test_family checks, each with all four calls."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    m = re.search(r"<!-- families -->\n(.*?)\n<!-- /families -->", readme, re.S)
    assert m, "README.md has no <!-- families --> table"
    assert m.group(1) == readme_table(), ("the README's table of families is out of date; replace it with:\n"
                                          + readme_table())


@pytest.mark.parametrize("model", MODELS)
def test_check_config_file(core_lib, fresh_dynamo, tmp_path, capsys, model):
    """`python -m mpk check --config` takes the config.json save_pretrained writes."""
    from mpk import models
    models.config(model).save_pretrained(tmp_path)
    code = check.main(["--config", str(tmp_path / "config.json"), "--cache-tokens", str(CACHE_TOKENS), "--mask"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert code == 0 and last.startswith("PASS rel_err="), last


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-qwen3", "tiny-phi", "tiny-gemma2", "tiny-gpt-neox"])
def test_cuda_build(core_lib, fresh_dynamo, tmp_path, monkeypatch, capsys, model):
    """The cuda target's module for a left-padded batch builds (nvcc, where found)
    for families whose ops lower to the most kinds: split-KV decode attention
    on small heads (read element by element), layer norms, split heads,
    partial rotary, soft-capped eager attention, a sliding-window cache."""
    from mpk import build, build_cli
    monkeypatch.setenv("MPK_CACHE_DIR", str(tmp_path / "cache"))
    rc = build_cli.main(["--model", model, "--out", str(tmp_path / "out"), "--cache-tokens", str(CACHE_TOKENS),
                         "--batch", "4", "--mask"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert rc == 0 and last.startswith("BUILT "), last
    assert last.endswith("nvcc ok" if build.find_nvcc() else "nvcc skipped"), last


# A prompt chunk longer than a sliding window: HF's sliding cache hands the
# attention the window joined with the chunk's rows (a temporary, not the
# cache), which lower keeps in the cache's dtype (attentionKV) so that the
# chunk's attention takes 2-byte K and V rows; with it widened to fp32 the
# cuda target's codegen refused the attention.
CHUNK_PAST_WINDOW = {"model": "tiny-mistral-sw", "prefill": 64, "mask": True, "cache_tokens": 64}


def test_chunk_past_window_reference_bf16(core_lib, fresh_dynamo):
    lines = []
    res = check.run_check(target="reference", dtype="bfloat16", seed=0, log=lines.append, **CHUNK_PAST_WINDOW)
    assert res.ok, "\n".join(lines)


def test_chunk_past_window_builds(core_lib, fresh_dynamo, tmp_path, monkeypatch, capsys):
    from mpk import build, build_cli
    monkeypatch.setenv("MPK_CACHE_DIR", str(tmp_path / "cache"))
    c = CHUNK_PAST_WINDOW
    rc = build_cli.main(["--model", c["model"], "--out", str(tmp_path / "out"), "--cache-tokens", str(c["cache_tokens"]),
                         "--prefill", str(c["prefill"]), "--mask"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert rc == 0 and last.startswith("BUILT ") and int(last.split()[1]) > 0, last
    assert last.endswith("nvcc ok" if build.find_nvcc() else "nvcc skipped"), last


@pytest.mark.gpu
def test_chunk_past_window_cuda(core_lib, fresh_dynamo):
    lines = []
    res = check.run_check(target="cuda", seed=0, log=lines.append, **CHUNK_PAST_WINDOW)
    assert res.ok and res.compiles == 1, "\n".join(lines)
