"""`python -m mpk build`: the compile path of the cuda target on the CPU, no
GPU needed. Compiles one step of a model (the inputs `python -m mpk check`
gives it) with the build_only option, writes the generated sources to a
directory, and module.so where nvcc is found."""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path
from typing import Sequence

import torch

from . import build, check, models
from .errors import MpkError


def export_for_cuda(model_name: str, dtype: str = "bfloat16", workers: int = 132, seed: int = 0,
                    cache_tokens: int = 64, prefill: int = 1, extra: dict | None = None,
                    batch: int = 1, mask: bool = False, capacity: int = 0):
    """Compiles one step of a model (a named model or a local HF config; the
    inputs `python -m mpk check` gives it) for the cuda target on the CPU
    (build_only) and returns the BuildOnlyGraph holding the core's result.
    capacity > 0 sets the cache's length (at least the tokens it must hold)."""
    check.ensure_backend_registered()
    m = models.build(model_name, dtype=check.DTYPES[dtype], device="cpu", seed=seed)
    max_len = (max(cache_tokens + prefill, capacity) + 63) // 64 * 64
    plan = check.plan_inputs(m.config.vocab_size, batch, cache_tokens, prefill, 1, mask, max_len, seed)
    cache = check._make_cache(m, max_len, "cpu", plan.fill, **plan.fill_inputs)
    compiled: list = []
    opts = {"target": "cuda", "build_only": True, "num_workers": workers, "seed": seed,
            "on_compile": compiled.append, **(extra or {})}
    torch._dynamo.reset()
    cm = torch.compile(m, backend="mpk", options=opts, fullgraph=True, dynamic=False)
    with torch.no_grad():
        cm(**plan.steps[0], **models.cache_kw(cache), use_cache=True)
    if not compiled:
        raise MpkError("the mpk backend was not called (nothing compiled)", kind="internal")
    return compiled[-1]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mpk build",
                                description="Compile a model's decode step for the cuda target on the "
                                            "CPU (no GPU needed); write module.cu and friends to --out, "
                                            "and module.so where nvcc is found.")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--model", default="tiny-llama", choices=models.MODELS)
    which.add_argument("--config", default=None, metavar="PATH", help="a local HF config.json instead")
    p.add_argument("--out", required=True, help="directory for the generated files")
    p.add_argument("--workers", type=int, default=132, help="num_workers (default 132, an H100's SMs)")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prefill", type=int, default=1, help="tokens per step")
    p.add_argument("--cache-tokens", type=int, default=64)
    p.add_argument("--capacity", type=int, default=0,
                   help="the cache's length (default: cache tokens + prefill, to a multiple of 64)")
    p.add_argument("--batch", type=int, default=1, help="sequences per step")
    p.add_argument("--mask", action="store_true", help="a 2-D attention mask, as `mpk check --mask`")
    check.add_lowering_flags(p)
    p.add_argument("--arch", default=None, help="e.g. 90a (default: $MPK_CUDA_ARCH, the GPU, else 90a)")
    p.add_argument("--no-nvcc", action="store_true", help="write the sources only")
    a = p.parse_args(argv)

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        fn = export_for_cuda(a.config or a.model, a.dtype, a.workers, a.seed, a.cache_tokens, a.prefill,
                             extra=check.lowering_options(a),
                             batch=a.batch, mask=a.mask, capacity=a.capacity)
    except MpkError as e:
        print(f"mpk error ({e.kind}): {e}")
        print("BUILT 0 tasks, cuda 0 bytes, nvcc skipped")
        return 1
    summary = fn.summary or {}
    tasks = int(summary.get("tasks", 0))
    text = summary.get("text", "")
    (out / "summary.txt").write_text(text)
    if text:
        print(text.rstrip("\n"))
    sources = fn.sources
    for name, body in sources.items():
        if "/" in name or name.startswith("."):
            print(f"skipping generated file with odd name {name!r}")
            continue
        (out / name).write_text(body)
    nbytes = sum(len(s.encode()) for s in sources.values())
    rc, status = 0, "skipped"
    if not sources:
        print("the core returned no CUDA sources for the cuda target")
        rc = 1
    elif a.no_nvcc:
        pass
    elif build.find_nvcc() is None:
        print("nvcc not found: sources written, module.so not built")
    else:
        try:
            info = build.build_module_info(sources, build.cuda_arch(a.arch or os.environ.get("MPK_CUDA_ARCH")
                                                                    or build.DEFAULT_ARCH))
            shutil.copyfile(info.path, out / build.MODULE_SO)
            print(f"{info.describe()}: {' '.join(info.command)}")
            status = "ok"
        except MpkError as e:
            print(f"mpk error ({e.kind}): {e}")
            status, rc = "failed", 1
    print(f"BUILT {tasks} tasks, cuda {nbytes} bytes, nvcc {status}")
    return rc
