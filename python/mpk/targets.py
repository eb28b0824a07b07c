"""The targets: a wire request compiled in the Go core, and the callable of
its target (the reference executor, or the cuda module). Below the backend
(Dynamo's entry) and the warm start (savable.py), which both compile through
compile_request."""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Sequence

import torch

from . import build, core
from .compiled import CompiledGraph


def compile_request(request: dict, opts: dict, display_names: Sequence[str] | None, returns_sequence: bool,
                    device: torch.device, gm: torch.fx.GraphModule | None = None,
                    on_compile: Callable[[CompiledGraph], Any] | None = None) -> CompiledGraph:
    """Compiles a wire request in the core and returns the callable, which is
    the handle to everything about this compile (summary, module, timings).
    `gm`, the ATen graph, is needed only by the build_only option (it runs
    eagerly); on_compile, the caller's hook, gets the callable."""
    dump = os.environ.get("MPK_DUMP_REQUEST")
    if dump:
        with open(dump, "w") as f:
            json.dump(request, f, indent=1)
    target = opts["wire"]["target"]
    # The reference target runs through the core's handle; the cuda target
    # only reads the result, which a warm start finds in the cache.
    compiled = core.compile_cached(request, build.cache_root()) if target == "cuda" else core.compile(request)
    if target == "reference":
        fn = CompiledGraph(request, compiled, opts, display_names, returns_sequence)
    else:
        fn = build.cuda_callable(request, compiled, opts, display_names, returns_sequence, device, gm)
    if on_compile is not None:
        on_compile(fn)
    return fn
