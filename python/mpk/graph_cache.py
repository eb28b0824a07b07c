"""On-disk cache of exported ATen graphs, keyed by the Dynamo graph.

A warm start still runs Dynamo (torch.compile traces the Python code every
time), but AOTAutograd's trace that turns Dynamo's graph into an ATen graph is
a function of that graph, its inputs' metadata and the torch version, and on an
8B model it costs seconds. When the key matches, the backend skips AOTAutograd
and hands the stored wire request to the core.

Only graphs whose AOTAutograd wrapper does nothing at run time are stored
(input mutations kept in the graph, no aliased outputs, no duplicate or
lifted-then-reordered inputs): for those, the compiled callable takes Dynamo's
arguments as they are. See `trivial_wrapper`."""

from __future__ import annotations

import hashlib
import os
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from . import cachefile

FORMAT = 1
# Edits to these change what a request holds or means; their text is in the key.
_KEYED_SOURCES = ("backend.py", "export.py", "graph_cache.py")


@dataclass
class Entry:
    request: dict  # the wire request without options (they are the caller's)
    returns_sequence: bool
    display_names: list[str]


def enabled() -> bool:
    return os.environ.get("MPK_GRAPH_CACHE", "1") != "0"


def _put(h, tag: str, data: str | bytes) -> None:
    b = data.encode() if isinstance(data, str) else data
    h.update(tag.encode() + b"\0" + len(b).to_bytes(8, "little") + b)


def _tensor_meta(t: torch.Tensor) -> str:
    return (f"{type(t).__name__} {t.dtype} {t.device.type} {tuple(t.shape)} {t.stride()} "
            f"{t.storage_offset()} {t.requires_grad}")


def _code_digest(code: types.CodeType) -> str:
    """The bytecode and constants of a function (nested code objects too)."""
    h = hashlib.sha256(code.co_code)
    for c in code.co_consts:
        _put(h, "const", _code_digest(c) if isinstance(c, types.CodeType) else repr(c))
    return h.hexdigest()


def _target_identity(t: Any) -> str:
    """What a call_function target is: its name, and for a Python function its
    code (Dynamo can put user functions in the graph under their own name)."""
    name = f"{getattr(t, '__module__', '')}.{getattr(t, '__qualname__', repr(t))}"
    code = getattr(t, "__code__", None)
    return name + (" " + _code_digest(code) if isinstance(code, types.CodeType) else "")


def _put_graph(h, gm: torch.fx.GraphModule, lifted: frozenset[str] = frozenset()) -> bool:
    """Hashes a graph module's code, targets and constant attributes (not the
    values of `lifted` ones: parameters and buffers AOTAutograd passes as
    inputs, keyed by their layout); False when it holds something the key
    cannot describe."""
    _put(h, "code", gm.code)
    for node in gm.graph.nodes:
        if node.op == "call_function":
            _put(h, "target", _target_identity(node.target))
        elif node.op == "call_module":
            return False  # a module's forward is not in gm.code
        elif node.op == "get_attr":
            if node.target in lifted:
                continue
            v = gm
            for part in str(node.target).split("."):
                v = getattr(v, part)
            if isinstance(v, torch.fx.GraphModule):
                if not _put_graph(h, v):
                    return False
            elif isinstance(v, torch.Tensor):
                _put(h, "const", _tensor_meta(v))
                _put(h, "bytes", v.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
            else:
                return False
    return True


def key(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> str | None:
    """The cache key of a Dynamo graph and its example inputs, or None when the
    graph cannot be keyed safely."""
    h = hashlib.sha256()
    _put(h, "format", str(FORMAT))
    _put(h, "torch", torch.__version__)
    here = Path(__file__).parent
    for name in _KEYED_SOURCES:
        _put(h, name, (here / name).read_bytes())
    lifted = [*gm.named_parameters(remove_duplicate=False), *gm.named_buffers(remove_duplicate=False)]
    for n, p in lifted:
        _put(h, "lifted", f"{n} {_tensor_meta(p)}")
    for x in example_inputs:
        if type(x) not in (torch.Tensor, torch.nn.Parameter):
            return None  # SymInts, subclasses: AOTAutograd does more than trace
        _put(h, "input", _tensor_meta(x))
    if not _put_graph(h, gm, frozenset(n for n, _ in lifted)):
        return None
    return h.hexdigest()


def trivial_wrapper(n_inputs: int, n_outputs: int, aten_inputs: int, aten_outputs: int) -> bool:
    """Whether AOTAutograd's run-time wrapper around the forward just passes
    arguments and results through: its metadata (from the tracing context)
    shows no mutation applied outside the graph, no aliased output, no
    intermediate base, no effect token; and the ATen graph takes one input per
    Dynamo input (none deduplicated) and returns one output per Dynamo output."""
    from torch._guards import TracingContext
    ctx = TracingContext.try_get()
    meta = getattr(ctx, "fw_metadata", None) if ctx is not None else None
    if meta is None:
        return False
    try:
        return (meta.num_mutated_inp_runtime_indices == 0 and meta.num_outputs_aliased == 0
                and meta.num_intermediate_bases == 0 and not meta.tokens
                and aten_inputs == n_inputs and aten_outputs == n_outputs)
    except AttributeError:  # another torch's metadata: do not guess
        return False


def _path(root: Path, k: str) -> Path:
    return root / "graphs" / f"{k}.json.z"


def load(root: Path, k: str) -> Entry | None:
    """The stored entry, or None (missing or unreadable: a miss, never an error)."""
    p = _path(root, k)
    d = cachefile.read(p)
    if d is None:
        return None
    try:
        if d.get("format") != FORMAT or d.get("key") != k:
            return None
        return Entry(d["request"], bool(d["returns_sequence"]), list(d["display_names"]))
    except (AttributeError, KeyError, TypeError):
        cachefile.discard(p)
        return None


def store(root: Path, k: str, request: dict, returns_sequence: bool, display_names: Sequence[str]) -> None:
    """Writes an entry (see cachefile: atomic, and never an error)."""
    body = {k2: v for k2, v in request.items() if k2 != "options"}
    cachefile.write(_path(root, k), {"format": FORMAT, "key": k, "request": body,
                                     "returns_sequence": returns_sequence,
                                     "display_names": list(display_names)})
