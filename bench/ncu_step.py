"""One mpk decode step for Nsight Compute (bench/gpu_profile.sh profiles
it): builds the model and its cache, compiles, runs warm-up steps, then the
profiled step (the launch ncu is told to pick).

    ncu -k regex:megakernel --launch-skip 3 --launch-count 1 python bench/ncu_step.py --model llama-3.2-1b"""

from __future__ import annotations

import argparse

import torch

from mpk import check


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="llama-3.2-1b")
    p.add_argument("--cache-tokens", type=int, default=512)
    p.add_argument("--steps", type=int, default=5)
    a = p.parse_args()
    check.ensure_backend_registered()
    m, cache = check.decode_setup(a.model, a.cache_tokens)
    step = torch.compile(m, backend="mpk", fullgraph=True, dynamic=False)
    tok = torch.randint(0, m.config.vocab_size, (1, 1), device="cuda")
    with torch.no_grad():
        for _ in range(a.steps):
            step(input_ids=tok, past_key_values=cache, use_cache=True)
    torch.cuda.synchronize()
    print("done")


if __name__ == "__main__":
    main()
