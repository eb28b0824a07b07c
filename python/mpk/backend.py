"""The torch.compile backend: torch.compile(model, backend="mpk", options={...}).

Dynamo hands us an FX graph; aot_autograd turns it into an ATen inference graph
with parameters lifted as inputs and in-place cache writes kept as aten.copy_
nodes; export.py writes it to the wire format; the Go core compiles it."""

from __future__ import annotations

import time
from typing import Any, Sequence

import torch

from . import build, export, graph_cache, savable, specialize
from .compiled import CompiledGraph
from .errors import MpkError
from .targets import compile_request

TARGETS = ("cuda", "reference")
DEFAULT_REFERENCE_WORKERS = 132
_PASS_THROUGH = ("skip_validate", "drop_dependency", "check_ir", "trace", "round_intermediates", "split_rows",
                 "prefill_rows", "split_k", "gemm", "wgmma", "gemm_row_blocks", "gemm_siblings", "long_attention_chunks",
                 "round_gemm_inputs", "coarse_events", "fresh_rows", "pair_linears", "pair_gemm", "balance_gemm_tail", "kv_pages",
                 "weight_affinity", "arena_reuse", "timed_schedule", "split_gemm_x", "gemm_batch",
                 "kv_pages_batch", "tile_x_parts", "pair_tiles", "wide_x_parts",
                 "kv_swizzle")
_ON_BY_DEFAULT = ("split_rows", "prefill_rows", "split_k", "gemm", "wgmma", "gemm_row_blocks", "gemm_siblings",
                  "long_attention_chunks", "coarse_events", "fresh_rows", "pair_linears", "pair_gemm",
                  "balance_gemm_tail", "kv_pages", "arena_reuse", "timed_schedule", "split_gemm_x", "kv_pages_batch",
                  "tile_x_parts", "pair_tiles")
# Python-side only: poison (NaN-fill float outputs before a run; default on for
# reference, off for cuda), sync (cuda: synchronise after each launch and read
# the status), build_only (cuda: compile, keep the core's result, run the ATen
# graph eagerly; `python -m mpk build` uses it on machines without a GPU),
# wait_budget_ms (cuda: how long one spin-wait of the kernel may last before
# it aborts and the call raises), on_compile (a function called with each
# compiled callable: the handle to its summary, module and timings; never
# stored with the compile).
# max_shapes: how many static compiles a graph with dynamic shapes may make,
# one per concrete shape (specialize.py); calls of further shapes run eagerly.
_FRONT_OPTIONS = ("poison", "sync", "build_only", "wait_budget_ms", "on_compile", "max_shapes")

def resolve_options(options: dict | None) -> dict:
    """Checks user options and fills defaults; returns the wire options plus front-end keys."""
    opts = dict(options or {})
    unknown = set(opts) - {"target", "num_workers", "seed", *_PASS_THROUGH, *_FRONT_OPTIONS}
    if unknown:
        raise MpkError(f"unknown mpk option(s): {', '.join(sorted(unknown))}",
                       hint="known options: target, num_workers, seed, " + ", ".join(_PASS_THROUGH + _FRONT_OPTIONS),
                       kind="bad_request")
    target = opts.get("target", "cuda")
    if target not in TARGETS:
        raise MpkError(f"unknown mpk target {target!r}", hint="use target='cuda' or 'reference'",
                       kind="bad_request")
    workers = opts.get("num_workers")
    if workers is None:
        if target == "cuda" and opts.get("build_only") and not torch.cuda.is_available():
            workers = DEFAULT_REFERENCE_WORKERS
        elif target == "cuda":
            if not torch.cuda.is_available():
                raise MpkError("target 'cuda' needs a CUDA device, and none is available",
                               hint="use options={'target': 'reference'} to run on the CPU",
                               kind="bad_request")
            workers = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
        else:
            workers = DEFAULT_REFERENCE_WORKERS
    if int(workers) < 1:
        raise MpkError(f"num_workers must be positive, got {workers}", kind="bad_request")
    wire = {"target": target, "num_workers": int(workers), "seed": int(opts.get("seed", 0))}
    for k in _PASS_THROUGH:
        wire[k] = bool(opts.get(k, k in _ON_BY_DEFAULT))
    hook = opts.get("on_compile")
    if hook is not None and not callable(hook):
        raise MpkError(f"option on_compile={hook!r}: want a function of the compiled callable", kind="bad_request")
    budget = opts.get("wait_budget_ms", build.DEFAULT_WAIT_BUDGET_MS)
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not budget > 0:
        raise MpkError(f"option wait_budget_ms={budget!r}: want a positive number of milliseconds",
                       kind="bad_request")
    max_shapes = opts.get("max_shapes", specialize.DEFAULT_LIMIT)
    if isinstance(max_shapes, bool) or not isinstance(max_shapes, int) or max_shapes < 1:
        raise MpkError(f"option max_shapes={max_shapes!r}: want a positive number of shapes", kind="bad_request")
    return {"wire": wire, "poison": bool(opts.get("poison", target == "reference")),
            "sync": bool(opts.get("sync", False)), "build_only": bool(opts.get("build_only", False)),
            "wait_budget_ms": float(budget), "max_shapes": max_shapes}


def _input_names_and_kinds(gm: torch.fx.GraphModule) -> tuple[list[str], list[str]]:
    """Names and kinds of the flat inputs aot_module_simplified will give the
    forward graph: module parameters, module buffers, then Dynamo's placeholders."""
    names, kinds = [], []
    for n, _ in gm.named_parameters(remove_duplicate=False):
        names.append(n)
        kinds.append("param")
    for n, _ in gm.named_buffers(remove_duplicate=False):
        names.append(n)
        kinds.append("buffer")
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            names.append(node.name)
            kinds.append(export._guess_kind(node.name))
    return names, kinds


_passthrough_classes: dict[type, type] = {}


def _passthrough(e: MpkError) -> MpkError:
    """The same error, as a class Dynamo re-raises unwrapped.

    Dynamo wraps a backend's exception in BackendCompilerFailed unless it is a
    ShortenTraceback; the user should catch mpk.UnsupportedOpError, not dig in
    .inner_exception. The new class subclasses both, so isinstance still holds."""
    try:
        from torch._dynamo.exc import ShortenTraceback
    except ImportError:  # pragma: no cover - older torch: the error arrives wrapped
        return e
    if isinstance(e, ShortenTraceback):
        return e
    cls = type(e)
    sub = _passthrough_classes.get(cls)
    if sub is None:
        def __init__(self, *a, **k):  # ShortenTraceback needs first_useful_frame
            cls.__init__(self, *a, **k)
            self.first_useful_frame = None

        sub = type(cls.__name__, (cls, ShortenTraceback), {"__init__": __init__,
                                                           "__module__": cls.__module__})
        _passthrough_classes[cls] = sub
    new = sub(e.message, node=e.node, op=e.op, source=e.source, hint=e.hint, kind=e.kind)
    return new


def mpk_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], options: dict | None = None,
                mode: str | None = None, **kwargs):
    """Dynamo backend entry point (registered as "mpk").

    torch.compile passes `options` as a keyword (torch 2.11 and later; newer
    versions may add `name`); `mode` is accepted and ignored. An MpkError
    reaches the caller of the compiled model as itself, not wrapped by Dynamo."""
    try:
        return _mpk_backend(gm, example_inputs, options, mode, **kwargs)
    except MpkError as e:
        raise _passthrough(e) from None


def _mpk_backend(gm, example_inputs, options, mode, **kwargs):
    from torch._functorch.aot_autograd import aot_module_simplified

    kwargs.pop("name", None)
    if kwargs:  # e.g. someone calling the backend by hand with flat options
        options = {**(options or {}), **kwargs}
    opts = resolve_options(options)
    hook = (options or {}).get("on_compile")  # kept out of opts, which a precompile saves
    if opts["build_only"] and savable.saving():
        raise MpkError("the build_only option cannot be precompiled (it runs the graph eagerly)",
                       kind="bad_request")

    if torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad
                                       for x in example_inputs):
        raise MpkError("mpk compiles inference only, but this call would need gradients",
                       hint="run the compiled model under torch.no_grad() or torch.inference_mode()",
                       kind="bad_request")
    if specialize.is_dynamic(gm, example_inputs):
        if savable.saving():
            raise MpkError("a graph with dynamic shapes cannot be precompiled (mpk compiles one module a shape)",
                           hint="precompile with the shapes fixed (mpk.precompile traces with dynamic=False)",
                           kind="bad_request")

        def compile_static(static_gm, inputs):
            # At call time, outside Dynamo: a tracing context of static fake
            # tensors gives AOTAutograd somewhere to leave its metadata, so
            # graph_cache.trivial_wrapper can drop its run-time wrapper.
            from torch._guards import TracingContext, tracing
            from torch._subclasses.fake_tensor import FakeTensorMode
            with tracing(TracingContext(FakeTensorMode())):
                return _mpk_backend(static_gm, inputs, options, mode)

        return specialize.Specializing(gm, example_inputs, compile_static, limit=opts["max_shapes"])

    names, kinds = _input_names_and_kinds(gm)
    lifted = [t for _, t in (*gm.named_parameters(remove_duplicate=False),
                             *gm.named_buffers(remove_duplicate=False))]
    n_outputs, returns_sequence = export.output_structure(gm)
    cache_key = None
    if graph_cache.enabled() and not opts["build_only"]:
        cache_key = graph_cache.key(gm, example_inputs)
    if cache_key is not None:
        entry = graph_cache.load(build.cache_root(), cache_key)
        if entry is not None:
            request = {**entry.request, "options": opts["wire"]}
            fn = compile_request(request, opts, entry.display_names, entry.returns_sequence,
                                 _device_of([*lifted, *example_inputs]), on_compile=hook)
            fn.front_timing = "AOTAutograd skipped (graph cache hit)"
            return savable.SavableGraph(fn, lifted)

    t_aot = time.perf_counter()
    unwrapped: list[CompiledGraph] = []  # the graph, when AOTAutograd's wrapper has nothing to do

    def fw_compiler(fx_gm: torch.fx.GraphModule, fx_inputs: Sequence[Any]):
        aot_s = time.perf_counter() - t_aot
        n = len([p for p in fx_gm.graph.nodes if p.op == "placeholder"])
        k = kinds if len(kinds) == n else None
        disp = names if len(names) == n else None
        fn = compile_graph(fx_gm, fx_inputs, opts, input_kinds=k, display_names=disp, on_compile=hook)
        fn.front_timing = f"AOTAutograd {aot_s:.2f} s"
        if graph_cache.trivial_wrapper(len(lifted) + len(example_inputs), n_outputs, n, fn.n_outputs):
            unwrapped.append(fn)
            if cache_key is not None:
                graph_cache.store(build.cache_root(), cache_key, fn.request, returns_sequence, fn.display_names)
        return fn

    with torch.no_grad(), _no_autograd_cache():
        wrapped = aot_module_simplified(gm, example_inputs, fw_compiler=fw_compiler,
                                        keep_inference_input_mutations=True)
    if unwrapped and not opts["build_only"]:  # the same callable a graph-cache hit returns
        return savable.SavableGraph(unwrapped[0], lifted)
    if savable.saving():
        raise MpkError("this graph cannot be precompiled: it needs AOTAutograd's runtime wrapper "
                       "(an input mutation kept outside the graph, an output aliasing an input, or "
                       "duplicated inputs)", hint="use torch.compile(model, backend='mpk') for it",
                       kind="bad_request")
    return wrapped


def _no_autograd_cache():
    """AOTAutograd's own cache stores Inductor's output code, never mpk's
    callable; precompile (aot_compile) forces it on, which would fail on ours."""
    cfg = torch._functorch.config
    off = {k: False for k in ("enable_autograd_cache", "force_autograd_cache", "bundled_autograd_cache")
           if hasattr(cfg, k)}
    return cfg.patch(off)


def _device_of(tensors: Sequence[Any]) -> torch.device:
    """The device of the first CUDA tensor (the graph's device), else the CPU."""
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.device.type == "cuda":
            index = t.device.index if t.device.index is not None else torch.cuda.current_device()
            return torch.device("cuda", index)
    return torch.device("cpu")


def compile_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], opts: dict,
                  input_kinds: Sequence[str] | None = None,
                  display_names: Sequence[str] | None = None, on_compile=None) -> CompiledGraph:
    """Exports an ATen graph, compiles it in the core and returns the callable."""
    if "wire" not in opts:
        on_compile = on_compile or opts.get("on_compile")
        opts = resolve_options(opts)
    request = export.export_graph(gm, example_inputs, input_kinds, opts["wire"])
    _, returns_sequence = export.output_structure(gm)
    return compile_request(request, opts, display_names, returns_sequence, _device_of(example_inputs), gm,
                           on_compile=on_compile)
