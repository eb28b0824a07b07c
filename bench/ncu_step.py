"""One mpk step for Nsight Compute (bench/gpu_profile.sh and
bench/gpu_ncu_source.sh profile it): builds the model and its cache,
compiles, runs warm-up steps, then the profiled step (the launch ncu is told
to pick). A decode step by default; --batch and --prefill make it a batch or
a prompt chunk (where the GEMM streams run), and the lowering flags of
`mpk check` apply.

    ncu -k regex:megakernel --launch-skip 3 --launch-count 1 python bench/ncu_step.py --model llama-3.2-1b --prefill 64"""

from __future__ import annotations

import argparse

import torch

from mpk import check
from mpk.models import cache_kw


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="llama-3.2-1b")
    p.add_argument("--cache-tokens", type=int, default=512)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--batch", type=int, default=1, help="sequences a step")
    p.add_argument("--prefill", type=int, default=1, help="tokens of each sequence a step (a prompt chunk)")
    check.add_lowering_flags(p)
    a = p.parse_args()
    check.ensure_backend_registered()
    # room in the cache for every step's tokens
    m, cache = check.decode_setup(a.model, a.cache_tokens, extra=max(16, a.steps * a.prefill + 12), batch=a.batch)
    step = torch.compile(m, backend="mpk", fullgraph=True, dynamic=False, options=check.lowering_options(a))
    tok = torch.randint(0, m.config.vocab_size, (a.batch, a.prefill), device="cuda")
    with torch.no_grad():
        for _ in range(a.steps):
            step(input_ids=tok, **cache_kw(cache), use_cache=True)
    torch.cuda.synchronize()
    print("done")


if __name__ == "__main__":
    main()
