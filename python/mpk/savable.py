"""What the backend returns so that Dynamo's AOT precompile can save it
(aot.py): the compiled graph, saved as its wire request and compiled again
(from mpk's caches) when loaded. Below the backend; aot.py sits above both.

saving() says when the backend must return one (precompile is tracing);
collect() gathers the callables a load compiles, for the loaded step."""

from __future__ import annotations

import contextlib
import contextvars
import threading
from typing import Sequence

import torch

from . import cachefile
from .compiled import CompiledGraph, unbox
from .errors import MpkError
from .targets import compile_request

FORMAT = 1

try:  # torch >= 2.9
    from torch._dynamo.aot_compile_types import SerializableCallable as _Savable
except ImportError:  # pragma: no cover - older torch: graphs run but cannot be saved
    _Savable = object

_saving = threading.local()


def saving() -> bool:
    """True while `precompile` traces: the backend must return a SavableGraph."""
    return getattr(_saving, "on", False)


@contextlib.contextmanager
def precompiling():
    """The scope in which saving() is true (this thread)."""
    _saving.on = True
    try:
        yield
    finally:
        _saving.on = False


class SavableGraph(_Savable):
    """What the backend returns when AOTAutograd's runtime wrapper has nothing
    to do (see graph_cache.trivial_wrapper): the compiled graph, called with
    Dynamo's arguments. Parameters left on the graph module (not lifted to
    inputs by Dynamo) are passed first, as AOTAutograd would."""

    def __init__(self, graph, lifted: Sequence[torch.Tensor] = ()):
        self.graph = graph
        self.lifted = tuple(lifted)

    def __call__(self, *args):
        if not self.lifted:
            return self.graph(*args)
        return self.graph(*self.lifted, *unbox(args, len(self.graph.inputs) - len(self.lifted)))

    @classmethod
    def serialize_compile_artifacts(cls, fn: "SavableGraph") -> bytes:
        if fn.lifted:
            raise MpkError(f"cannot save a graph that holds {len(fn.lifted)} parameters or buffers "
                           "as graph-module attributes", kind="bad_request",
                           hint="keep torch._dynamo.config.inline_inbuilt_nn_modules=True (the default)")
        g = fn.graph
        return cachefile.encode({"format": FORMAT, "request": g.request, "opts": g.opts,
                                 "display_names": g.display_names, "returns_sequence": g.returns_sequence,
                                 "device": str(g.device)})

    @classmethod
    def deserialize_compile_artifacts(cls, data: bytes) -> "SavableGraph":
        try:
            saved = cachefile.decode(data)
        except ValueError as e:
            raise MpkError(f"the precompiled graph is unreadable: {e}", kind="bad_request") from None
        if saved.get("format") != FORMAT:
            raise MpkError(f"the precompiled graph has format {saved.get('format')}, this mpk reads {FORMAT}",
                           hint="precompile it again with this version of mpk", kind="bad_request")
        device = torch.device(saved["device"])
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        sink = _loaded.get()
        graph = compile_request(saved["request"], saved["opts"], saved["display_names"],
                                saved["returns_sequence"], device, on_compile=sink.append if sink is not None else None)
        graph.front_timing = "loaded from a precompiled file"
        return cls(graph)




_loaded: contextvars.ContextVar[list | None] = contextvars.ContextVar("mpk_loaded", default=None)


@contextlib.contextmanager
def collect():
    """The callables compiled while loading a precompiled step, in a list."""
    graphs: list[CompiledGraph] = []
    token = _loaded.set(graphs)
    try:
        yield graphs
    finally:
        _loaded.reset(token)
