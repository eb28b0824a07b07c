"""mpk.precompile / mpk.load: a compiled step saved to a file and run in a new
process without Dynamo tracing the model again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import mpk
from mpk import aot, backend, check
from mpk.errors import ArgumentError, MpkError
from mpk.models import cache_kw

ROOT = Path(__file__).resolve().parents[1]

# The new process: the same seeded model and cache; the saved step loaded and
# run for three tokens; then eager on the same tokens from the same cache
# contents. float32 must match eager; bf16 is judged by check's bf16 rule.
# Prints one JSON line.
CHILD = r"""
import json, sys, time
import torch, mpk
from mpk import check
path, name, device, dtype = sys.argv[1], sys.argv[2], sys.argv[3], getattr(torch, sys.argv[4])
m, cache = check.decode_setup(name, 16, dtype=dtype, device=device)
state = check.snapshot(cache)
toks = [torch.tensor([[3 + 5 * i]]) for i in range(3)]
t0 = time.perf_counter()
step = mpk.load(m, path)
load_s = time.perf_counter() - t0
times = []
got = check._steps(step, cache, toks, device, times)
check.restore(cache, state)
eager = check._steps(m, cache, toks, device)
errs = [check.rel_err(g, e) for g, e in zip(got, eager)]
if dtype == torch.float32:
    problems = [f"step {i}: rel_err {e:.3e} vs eager" for i, e in enumerate(errs) if not e <= 1e-5]
else:
    problems = check._bf16_rule(m, name, toks[0], state, toks, 32, eager, got, log=lambda s: None)
print(json.dumps({"problems": problems, "errs": errs, "front": step.graphs[-1].front_timing,
                  "dynamo_graphs": torch._dynamo.utils.counters["stats"]["unique_graphs"],
                  "load_s": load_s, "first_step_s": times[0]}))
"""


# A process that saves the step (after building `first`, when named): what
# a process has run before shapes what torch saves with the guards.
SAVER = r"""
import json, sys
import torch, mpk
from mpk import check
from mpk.models import cache_kw
path, name, device, dtype, first = sys.argv[1], sys.argv[2], sys.argv[3], getattr(torch, sys.argv[4]), sys.argv[5]
if first:
    check.decode_setup(first, 8, dtype=dtype, device=device)
m, cache = check.decode_setup(name, 16, dtype=dtype, device=device)
mpk.precompile(m, path, input_ids=torch.tensor([[1]], device=device), **cache_kw(cache), use_cache=True,
               options=json.loads(sys.argv[6]))
"""


def _python(script: str, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python")}
    return subprocess.run([sys.executable, "-c", script, *argv], env=env, capture_output=True, text=True,
                          timeout=600)


def run_child(path: Path, name: str, device: str, dtype: str) -> dict:
    p = _python(CHILD, str(path), name, device, dtype)
    assert p.returncode == 0, p.stderr[-4000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def save_in_child(path: Path, name: str, device: str, dtype: str, options: dict, first: str = "") -> None:
    p = _python(SAVER, str(path), name, device, dtype, first, json.dumps(options))
    assert p.returncode == 0, p.stderr[-4000:]
    assert path.read_bytes().startswith(aot.MAGIC)


def precompile_step(path: Path, name: str, device: str, dtype: torch.dtype, options: dict):
    m, cache = check.decode_setup(name, 16, dtype=dtype, device=device)
    tok = torch.tensor([[1]], device=device)
    return m, cache, mpk.precompile(m, str(path), input_ids=tok, **cache_kw(cache), use_cache=True,
                                    options=options)


def test_precompiled_step_runs_in_a_new_process_without_dynamo(core_lib, tmp_path):
    path = tmp_path / "tiny-llama.mpk"
    save_in_child(path, "tiny-llama", "cpu", "float32", {"target": "reference"})
    r = run_child(path, "tiny-llama", "cpu", "float32")
    assert r["problems"] == [], r
    assert r["front"] == "loaded from a precompiled file"
    assert r["dynamo_graphs"] == 0  # nothing traced in the new process


def test_a_step_saved_after_another_model_loads_or_says_why(core_lib, tmp_path):
    """torch saves the key order of the global dicts a trace iterated (HF's
    registry of the model classes a process has used) whatever the guard
    filter says: a step saved in a process that had built another model may
    not rebuild its guards where that model was never built. The load then
    says so, rather than blaming the torch version."""
    path = tmp_path / "tiny-llama.mpk"
    save_in_child(path, "tiny-llama", "cpu", "float32", {"target": "reference"}, first="tiny-qwen3")
    p = _python(CHILD, str(path), "tiny-llama", "cpu", "float32")
    if p.returncode == 0:
        assert json.loads(p.stdout.strip().splitlines()[-1])["problems"] == []
    else:
        assert "precompile in a process that has built or run no other model" in p.stderr, p.stderr[-4000:]


def test_precompiled_step_in_process_matches_eager(core_lib, fresh_dynamo, tmp_path):
    m, cache, step = precompile_step(tmp_path / "s.mpk", "tiny-qwen3", "cpu", torch.float32,
                                     {"target": "reference"})
    assert isinstance(step, aot.Precompiled)
    state = check.snapshot(cache)
    toks = [torch.tensor([[7]]), torch.tensor([[9]])]
    got = check._steps(step, cache, toks, "cpu")
    check.restore(cache, state)
    want = check._steps(m, cache, toks, "cpu")
    assert max(check.rel_err(g, w) for g, w in zip(got, want)) <= 1e-5


def test_backend_result_saves_and_loads(core_lib, fresh_dynamo):
    """What the backend returns for a plain graph is savable on its own (the
    payload torch's precompile stores) and loads into an equal callable."""
    lin = torch.nn.Linear(8, 4)
    x = torch.randn(2, 8)
    grabbed = {}

    def grab(gm, example_inputs):
        grabbed["fn"] = backend.mpk_backend(gm, example_inputs, options={"target": "reference"})
        return grabbed["fn"]
    with torch.no_grad():
        got = torch.compile(lin, backend=grab, fullgraph=True, dynamic=False)(x)
        fn = grabbed["fn"]
        assert isinstance(fn, aot.SavableGraph)
        again = aot.SavableGraph.deserialize_compile_artifacts(aot.SavableGraph.serialize_compile_artifacts(fn))
        torch.testing.assert_close(got, lin(x), rtol=1e-5, atol=1e-5)
        args = [lin.weight, lin.bias, x] if len(fn.graph.inputs) == 3 else [x]
        torch.testing.assert_close(again(*args)[0], got, rtol=0, atol=0)


def test_call_with_another_shape_names_the_mismatch(core_lib, fresh_dynamo, tmp_path):
    _, cache, step = precompile_step(tmp_path / "s.mpk", "tiny-llama", "cpu", torch.float32,
                                     {"target": "reference"})
    with pytest.raises(ArgumentError, match="does not match the precompiled graph.*input_ids"):
        step(input_ids=torch.tensor([[1, 2]]), **cache_kw(cache), use_cache=True)


def test_load_rejects_other_files(tmp_path):
    bad = tmp_path / "junk.mpk"
    bad.write_bytes(b"not a step")
    with pytest.raises(MpkError, match="not a step saved by mpk.precompile"):
        mpk.load(torch.nn.Linear(2, 2), str(bad))
    truncated = tmp_path / "cut.mpk"
    truncated.write_bytes(aot.MAGIC + (5).to_bytes(8, "little") + b'{"format": 1, "globals": {}}'[:5])
    with pytest.raises(MpkError, match="unreadable header"):
        mpk.load(torch.nn.Linear(2, 2), str(truncated))


def test_graph_needing_the_runtime_wrapper_is_refused(core_lib, fresh_dynamo, tmp_path):
    """An output that aliases an input needs AOTAutograd's wrapper at run
    time; precompile says so instead of saving something that would differ."""
    class Alias(torch.nn.Module):
        def forward(self, x):
            return x + 1, x.view(-1)

    with pytest.raises(MpkError, match="cannot be precompiled"):
        mpk.precompile(Alias(), str(tmp_path / "a.mpk"), torch.randn(2, 3), options={"target": "reference"})


@pytest.mark.gpu
def test_precompiled_cuda_step_warm_start(core_lib, fresh_dynamo, tmp_path):
    path = tmp_path / "tiny-qwen3.mpk"
    save_in_child(path, "tiny-qwen3", "cuda", "bfloat16", {})
    r = run_child(path, "tiny-qwen3", "cuda", "bfloat16")
    print("precompiled cuda step in a new process:", r)
    assert r["problems"] == [], r
    assert r["front"] == "loaded from a precompiled file" and r["dynamo_graphs"] == 0
    assert r["first_step_s"] < 5.0  # caches hit: no Dynamo, no Go core, no nvcc
