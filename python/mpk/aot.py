"""Warm starts without Dynamo: compile a model's step once, save it, load it in
a later process.

torch.compile traces the model's Python code again in every process (Dynamo:
6.6-9.4 s for Qwen3-8B on the H100 host), and no backend can skip that.
Dynamo's AOT precompile can: it saves the bytecode Dynamo generated around the
graph, the guards, and the backend's result. mpk's result saves as its wire
request (the exported ATen graph); a load finds the Go core's result and the
nvcc module in mpk's caches (or rebuilds them, slower, when the cache is gone).

    step = mpk.precompile(model, "step.mpk", input_ids=tok, cache=cache)
    # in a later process, with the same model code, shapes and dtypes:
    step = mpk.load(model, "step.mpk")
    out = step(input_ids=tok, cache=cache)

Guards on module globals and on object identity cannot cross a process and
are left out; the guards on the arguments (tensor shapes, dtypes, devices,
strides, Python values the trace specialised on) stay, and every call's tensors
are also checked against the compiled layouts."""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib
import io
import json
import os
import re
import types
from builtins import type  # noqa: A004 - see _forward
from typing import Any, Sequence

import torch

from . import savable
from .savable import FORMAT, SavableGraph  # noqa: F401  (files saved before savable.py name mpk.aot.SavableGraph)
from .errors import ArgumentError, MpkError

MAGIC = b"mpk-precompiled-step\n"

def _forward(model, *args, **kwargs):
    # What is traced and saved. Dynamo's bytecode around the graph loads
    # builtins such as `type` as globals, and torch 2.11 resolves them in this
    # module's dict only; hence the explicit import above.
    return model(*args, **kwargs)


def _portable_guards(entries) -> list[bool]:
    """Keeps the guards that mean the same in another process: drops those on
    globals and those whose check compares object identity (ID_MATCH and the
    kinds derived from it), which torch cannot save."""
    from torch._dynamo.guards import CheckFunctionManager
    unsavable = set(CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES)
    return [not (e.is_global or e.guard_type in unsavable
                 or unsavable.intersection(e.derived_guard_types or ())) for e in entries]


@contextlib.contextmanager
def _aot_enabled():
    cfg = torch._dynamo.config
    with cfg.patch(enable_aot_compile=True) if hasattr(cfg, "enable_aot_compile") else contextlib.nullcontext():
        yield


class Precompiled:
    """A model's compiled step: call it as the model. Holds the model, whose
    parameters and buffers are the graph's inputs, and `graphs`, the compiled
    callables behind it (their summaries, modules and timings).

    With check_guards=False (unsafe, see load) the calls after the first one
    that passed skip Dynamo's guard check."""

    def __init__(self, model: torch.nn.Module, fn: Any, graphs: Sequence[Any] = (), check_guards: bool = True):
        self.model = model
        self._fn = fn
        self.graphs = list(graphs)
        self._unguarded = None
        if not check_guards:
            if not hasattr(fn, "disable_guard_check"):
                raise MpkError(f"torch {torch.__version__} cannot turn off a precompiled step's guard check",
                               hint="load it with check_guards=True", kind="bad_request")
            self._unguarded = copy.copy(fn)  # the same compiled step; fn itself stays guarded
            self._unguarded.disable_guard_check()

    def __call__(self, *args, **kwargs):
        try:
            if not torch.is_grad_enabled():  # the usual case: 1.5 us less than entering no_grad
                out = self._fn(self.model, *args, **kwargs)
            else:
                with torch.no_grad():  # as it was traced; mpk compiles inference only
                    out = self._fn(self.model, *args, **kwargs)
        except RuntimeError as e:
            if not str(e).startswith("GuardManager check failed"):
                raise
            failed = re.search(r"verbose_code_parts=\[(.*?)\],", str(e), re.S)
            raise ArgumentError("this call does not match the precompiled graph: failed check "
                                f"{failed.group(1) if failed else e}",
                                hint="call with the shapes, dtypes and options it was precompiled "
                                     "with, or precompile again") from None
        if self._unguarded is not None:  # check_guards=False: the first call passed the guards
            self._fn, self._unguarded = self._unguarded, None
        return out

    def save(self, path: str) -> None:
        """Writes the step to `path` (atomically): mpk's header, then torch's payload."""
        header = json.dumps({"format": FORMAT, "torch": torch.__version__,
                             "globals": _minted_globals(self._fn)}).encode()
        payload = type(self._fn).serialize(self._fn).serialized_data
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(MAGIC + len(header).to_bytes(8, "little") + header + payload)
        os.replace(tmp, path)


def _minted_globals(fn) -> dict[str, str]:
    """The globals Dynamo minted while tracing (names like
    ___module_collections_<id>_c0) that the saved bytecode loads and torch's
    payload does not carry (torch 2.15 mints some); each as "module" or
    "module:qualified.name", to import when loading."""
    env = fn._artifacts.runtime_env
    provided = set(env.import_sources) | set(env.used_globals) | {fn._artifacts.backend_id}
    scope = globals()
    out = {}
    for name in sorted(set(getattr(env, "external_refs", ())) - provided):
        if name not in scope or name.startswith("__compiled_fn"):
            continue  # a builtin, resolved through __builtins__; or the graph itself
        value = scope[name]
        if isinstance(value, types.ModuleType):
            out[name] = value.__name__
        elif _importable(value):
            out[name] = f"{value.__module__}:{value.__qualname__}"
        else:
            raise MpkError(f"cannot save the step: its bytecode loads the global {name} "
                           f"({type(value).__name__}), which cannot be imported by name", kind="bad_request")
    return out


def _importable(value: Any) -> bool:
    mod, qual = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    if not mod or not qual or "<" in qual:
        return False
    try:
        return _resolve(f"{mod}:{qual}") is value
    except Exception:  # noqa: BLE001 - any import or lookup failure means "not importable"
        return False


def _resolve(spec: str) -> Any:
    mod, _, qual = spec.partition(":")
    obj = importlib.import_module(mod)
    for part in qual.split(".") if qual else ():
        obj = getattr(obj, part)
    return obj


def precompile(model: torch.nn.Module, path: str | None, *args, options: dict | None = None,
               **kwargs) -> Precompiled:
    """Compiles `model(*args, **kwargs)` with the mpk backend (as torch.compile
    would, fullgraph, static shapes) and saves it to `path` (unless None).
    Nothing runs: the example arguments give shapes, dtypes and devices."""
    from .backend import mpk_backend
    graphs: list = []
    user_hook = (options or {}).get("on_compile")

    def on_compile(g):
        graphs.append(g)
        if user_hook is not None:
            user_hook(g)
    options = {**(options or {}), "on_compile": on_compile}
    with _aot_enabled():  # torch 2.11 attaches .aot_compile only when enabled at torch.compile
        compile_fn = torch.compile(_forward, backend=functools.partial(mpk_backend, options=options),
                                   fullgraph=True, dynamic=False,
                                   options={"guard_filter_fn": _portable_guards})
    if not hasattr(compile_fn, "aot_compile"):
        raise MpkError(f"torch {torch.__version__} has no AOT precompile (torch.compile(...).aot_compile)",
                       hint="use torch >= 2.10, or torch.compile(model, backend='mpk')", kind="bad_request")
    with savable.precompiling(), _aot_enabled(), torch.no_grad():
        fn = compile_fn.aot_compile(((model, *args), kwargs))
    step = Precompiled(model, fn, graphs)
    if path is not None:
        step.save(path)
    return step


def load(model: torch.nn.Module, path: str, check_guards: bool = True) -> Precompiled:
    """The step `precompile` saved to `path`, bound to `model` (the same
    architecture, shapes and dtypes; its weights may differ).

    check_guards=False is UNSAFE and off by default: the first call is checked
    by the saved guards as always, every later call skips Dynamo's guard check
    (torch's disable_guard_check; on qwen3-8b most of a loaded call's host
    time). mpk still checks every tensor the graph takes (device, dtype, shape,
    strides, storage, overlaps with written inputs) on every call, but nothing
    checks what the trace specialised on besides tensors: a later call with
    another keyword set, other Python values (use_cache, an int), another cache
    class or another number of cache layers runs the graph traced for the first
    call and can return wrong results without an error. Use it only for a
    loop that repeats the first call's arguments with new tensor contents (a
    decode loop)."""
    with open(path, "rb") as f:
        data = f.read()
    if not data.startswith(MAGIC) or len(data) < len(MAGIC) + 8:
        raise MpkError(f"{path} is not a step saved by mpk.precompile", kind="bad_request")
    n = int.from_bytes(data[len(MAGIC):len(MAGIC) + 8], "little")
    start = len(MAGIC) + 8
    try:
        header = json.loads(data[start:start + n])
    except ValueError:
        raise MpkError(f"{path} has an unreadable header", kind="bad_request") from None
    if header.get("format") != FORMAT:
        raise MpkError(f"{path} has format {header.get('format')}, this mpk reads {FORMAT}",
                       hint="precompile it again with this version of mpk", kind="bad_request")
    try:
        scope = {**globals(), **{k: _resolve(v) for k, v in header.get("globals", {}).items()}}
        with _aot_enabled(), savable.collect() as graphs:
            fn = torch.compiler.load_compiled_function(io.BytesIO(data[start + n:]), f_globals=scope)
    except MpkError:
        raise
    except Exception as e:  # unpickling, imports and torch's compatibility checks raise many kinds
        hint = (f"precompile it again with this torch ({torch.__version__}; it was saved "
                f"with {header.get('torch')}), mpk and GPU")
        if _in_guard_rebuild(e):
            # torch saves the key order of the global dicts a trace iterated,
            # whatever the guard filter says; HF's registry of the model
            # classes a process has used is one.
            hint = ("its guards could not be rebuilt here: they can refer to the state of the process that "
                    "saved it (e.g. Hugging Face's registry of the model classes that process had used); "
                    "precompile in a process that has built or run no other model")
        raise MpkError(f"cannot load the precompiled step {path}: {type(e).__name__}: {e}",
                       hint=hint, kind="bad_request") from e
    return Precompiled(model, fn, graphs, check_guards=check_guards)


def _in_guard_rebuild(e: BaseException) -> bool:
    """Whether e was raised while torch rebuilt a loaded step's guards."""
    tb = e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name == "load_guard_manager":
            return True
        tb = tb.tb_next
    return False
