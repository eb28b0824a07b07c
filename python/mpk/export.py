"""FX ATen graph → wire request (version 1, see gocore/wire/wire.go)."""

from __future__ import annotations

import math
import operator
import re
from typing import Any, Sequence

import torch
import torch.fx

from .errors import MpkError, UnsupportedOpError

WIRE_VERSION = 1

DTYPE_NAMES = {
    torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16",
    torch.float64: "float64", torch.int64: "int64", torch.int32: "int32", torch.int16: "int16",
    torch.int8: "int8", torch.uint8: "uint8", torch.bool: "bool",
}
DTYPES_BY_NAME = {v: k for k, v in DTYPE_NAMES.items()}

_DYNAMIC_HINT = ("dynamic shapes are not supported yet; compile with "
                 "torch.compile(..., dynamic=False)")


class ExportError(MpkError):
    kind = "export"


def dtype_name(dt: torch.dtype, where: str = "") -> str:
    try:
        return DTYPE_NAMES[dt]
    except KeyError:
        raise ExportError(f"dtype {dt} is not supported by mpk{where}",
                          hint="supported dtypes: " + " ".join(DTYPE_NAMES.values())) from None


def _static_int(x: Any, what: str, node: torch.fx.Node | None = None) -> int:
    if isinstance(x, torch.SymInt):
        # A SymInt backed by a constant is fine; a free symbol is a dynamic shape.
        try:
            from torch.fx.experimental.symbolic_shapes import is_concrete_int
            if is_concrete_int(x):
                return int(x)
        except ImportError:  # pragma: no cover
            pass
        raise ExportError(f"symbolic {what} {x} found", node=node.name if node else "",
                          op=_target_name(node) if node else "",
                          source=source_line(node) if node else "", hint=_DYNAMIC_HINT)
    return int(x)


def tensor_meta(t: torch.Tensor, node: torch.fx.Node | None = None) -> dict:
    where = f" (node {node.name})" if node is not None else ""
    return {
        "dtype": dtype_name(t.dtype, where),
        "shape": [_static_int(s, "size", node) for s in t.shape],
        "strides": [_static_int(s, "stride", node) for s in t.stride()],
        "offset": _static_int(t.storage_offset(), "storage offset", node),
    }


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)')
_INTERNAL = ("/torch/", "/torch\\", "/functorch/", "<eval_with_key>")


def source_line(node: torch.fx.Node | None) -> str:
    """The innermost user frame of a node's stack trace: "file.py:LINE  code"."""
    if node is None:
        return ""
    trace = node.meta.get("stack_trace") or ""
    frames = _FRAME.findall(trace)
    if not frames:
        return ""
    user = [f for f in frames if not any(s in f[0] for s in _INTERNAL)] or frames
    path, line, _fn, code = user[-1]
    return f"{path.rsplit('/', 1)[-1]}:{line}  {code.strip()}"


def _target_name(node: torch.fx.Node) -> str:
    t = node.target
    if isinstance(t, str):
        return t
    if isinstance(t, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return str(t)
    mod = getattr(t, "__module__", None) or ""
    name = getattr(t, "__qualname__", None) or getattr(t, "__name__", None) or str(t)
    if mod in ("_operator", "operator"):
        mod = "operator"
    return f"{mod}.{name}" if mod else name


FLOAT64_MAX = 1.7976931348623157e308


def float_arg(x: float) -> dict:
    """A float Arg. JSON has no inf/nan: ±inf travel as ±FLOAT64_MAX (which is -inf
    again once rounded to float32, and exp() of it is 0) plus "s": "inf"/"-inf";
    nan travels as f=0 with "s": "nan". A core that reads "s" gets the exact value."""
    if math.isfinite(x):
        return {"k": "float", "f": x}
    if math.isnan(x):
        return {"k": "float", "f": 0.0, "s": "nan"}
    return {"k": "float", "f": math.copysign(FLOAT64_MAX, x), "s": "inf" if x > 0 else "-inf"}


class _Exporter:
    def __init__(self, gm: torch.fx.GraphModule):
        self.gm = gm
        # getitem node name -> (source node name, index)
        self.getitems: dict[str, tuple[str, int]] = {}

    def arg(self, a: Any, node: torch.fx.Node) -> dict:
        if isinstance(a, torch.fx.Node):
            if a.name in self.getitems:
                src, idx = self.getitems[a.name]
                return {"k": "node", "node": src, "index": idx}
            return {"k": "node", "node": a.name, "index": 0}
        if a is None:
            return {"k": "none"}
        if isinstance(a, bool):
            return {"k": "bool", "b": a}
        if isinstance(a, torch.SymInt):
            return {"k": "int", "i": _static_int(a, "integer argument", node)}
        if isinstance(a, torch.SymFloat) or isinstance(a, torch.SymBool):
            raise ExportError(f"symbolic value {a} found", node=node.name, op=_target_name(node),
                              source=source_line(node), hint=_DYNAMIC_HINT)
        if isinstance(a, int):
            return {"k": "int", "i": a}
        if isinstance(a, float):
            return float_arg(a)
        if isinstance(a, str):
            return {"k": "str", "s": a}
        if isinstance(a, torch.dtype):
            return {"k": "dtype", "s": dtype_name(a, f" (node {node.name})")}
        if isinstance(a, (torch.device, torch.layout, torch.memory_format)):
            return {"k": "str", "s": str(a)}
        if isinstance(a, (list, tuple)):
            return {"k": "list", "list": [self.arg(x, node) for x in a]}
        raise ExportError(f"argument of type {type(a).__name__} ({a!r}) cannot be exported",
                          node=node.name, op=_target_name(node), source=source_line(node))

    def constant(self, node: torch.fx.Node) -> dict:
        """A tensor constant the graph reads (get_attr, e.g. torch.tensor([-1]) in
        HF's cache code) travels inside the request as an "mpk.constant" node
        whose one argument lists its values in row-major order."""
        v = self.gm
        for part in str(node.target).split("."):
            v = getattr(v, part, None)
        where = dict(node=node.name, op="get_attr", source=source_line(node))
        if not isinstance(v, torch.Tensor):
            raise ExportError(f"graph reads attribute {node.target!r}, which is a {type(v).__name__}, "
                              "not a tensor", kind="internal", **where)
        if v.numel() > MAX_CONSTANT_ELEMENTS:
            raise UnsupportedOpError(f"mpk does not support a tensor constant of {v.numel()} elements "
                                     f"(it embeds up to {MAX_CONSTANT_ELEMENTS})",
                                     hint="pass the tensor as an input, or register it as a buffer", **where)
        meta = tensor_meta(v, node)
        meta["strides"], meta["offset"] = list(_contiguous_strides(meta["shape"])), 0
        from torch._subclasses.fake_tensor import unset_fake_temporarily
        with unset_fake_temporarily():  # AOTAutograd calls the compiler under its fake mode
            values = v.detach().cpu().flatten().tolist()
        return {"name": node.name, "target": "mpk.constant",
                "args": [{"k": "list", "list": [self.arg(x, node) for x in values]}],
                "kwargs": {}, "outs": [meta], "source": source_line(node)}

    def outs(self, node: torch.fx.Node) -> list:
        val = node.meta.get("val")
        if val is None:
            val = node.meta.get("example_value")
        vals = list(val) if isinstance(val, (list, tuple)) else [val]
        return [tensor_meta(v, node) if isinstance(v, torch.Tensor) else None for v in vals]


# Tensor constants are embedded value by value; larger ones belong in inputs.
MAX_CONSTANT_ELEMENTS = 4096


def _contiguous_strides(shape: Sequence[int]) -> list[int]:
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= max(n, 1)
    return strides[::-1]


def _guess_kind(name: str) -> str:
    if "_parameters_" in name or name.startswith("p_") or ".weight" in name or ".bias" in name:
        return "param"
    if "_buffers_" in name or name.startswith("b_"):
        return "buffer"
    return "input"


def export_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                 input_kinds: Sequence[str] | None = None,
                 options: dict | None = None) -> dict:
    """Builds the wire request for an ATen graph.

    input_kinds, one per placeholder, is "param", "buffer" or "input"; when absent
    it is guessed from placeholder names."""
    ex = _Exporter(gm)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(example_inputs):
        raise ExportError(f"graph has {len(placeholders)} inputs but {len(example_inputs)} "
                          "example inputs were given", kind="internal")
    # A CPU tensor among a CUDA graph's inputs (HF's StaticCache keeps its
    # length counter on the CPU until the first call moves it) is copied to
    # the graph's device at each call, as the graph's own .to() would.
    on_cuda = any(isinstance(t, torch.Tensor) and t.device.type == "cuda" for t in example_inputs)
    inputs = []
    for i, (ph, ex_in) in enumerate(zip(placeholders, example_inputs)):
        if not isinstance(ex_in, torch.Tensor):
            raise ExportError(f"graph input {i} ({ph.name}) is a {type(ex_in).__name__}, not a tensor",
                              node=ph.name, op="placeholder", hint=_DYNAMIC_HINT
                              if isinstance(ex_in, torch.SymInt) else "")
        kind = input_kinds[i] if input_kinds else _guess_kind(ph.name)
        inputs.append({"name": ph.name, "kind": kind, "meta": tensor_meta(ex_in, ph)})
        if on_cuda and ex_in.device.type == "cpu":
            inputs[-1]["host"] = True

    nodes, outputs = [], []
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            continue
        if node.op == "output":
            outs = node.args[0]
            outs = outs if isinstance(outs, (list, tuple)) else (outs,)
            outputs = [ex.arg(o, node) for o in outs]
            continue
        if node.op == "get_attr":
            nodes.append(ex.constant(node))
            continue
        if node.op != "call_function":
            raise ExportError(f"unexpected FX node kind {node.op}", node=node.name,
                              op=str(node.target), source=source_line(node), kind="internal")
        if node.target is operator.getitem:
            src, idx = node.args
            if isinstance(src, torch.fx.Node) and isinstance(idx, int):
                if src.name in ex.getitems:  # nested tuples are not produced by ATen ops
                    raise ExportError("nested getitem is not supported", node=node.name,
                                      op="operator.getitem", source=source_line(node))
                ex.getitems[node.name] = (src.name, idx)
                continue
        nodes.append({
            "name": node.name,
            "target": _target_name(node),
            "args": [ex.arg(a, node) for a in node.args],
            "kwargs": {k: ex.arg(v, node) for k, v in node.kwargs.items()},
            "outs": ex.outs(node),
            "source": source_line(node),
        })
    if on_cuda:
        _check_host_tensors(gm, inputs, nodes)
    return {"version": WIRE_VERSION, "options": dict(options or {}),
            "graph": {"inputs": inputs, "nodes": nodes, "outputs": outputs}}


def written_inputs(inputs: list[dict], nodes: list[dict]) -> dict[str, dict]:
    """The graph inputs the graph writes (an aten.copy_ into them), by name,
    each with the first node that writes it."""
    names = {i["name"] for i in inputs}
    writes: dict[str, dict] = {}
    for n in nodes:
        a = n["args"][0] if n["target"] == "aten.copy_.default" and n["args"] else {}
        if a.get("k") == "node" and a.get("node") in names:
            writes.setdefault(a["node"], n)
    return writes


def _check_host_tensors(gm: torch.fx.GraphModule, inputs: list[dict], nodes: list[dict]) -> None:
    """A CUDA graph's CPU inputs are copied to the device per call, so the
    graph may only read them, and every output is on the device."""
    writes = written_inputs(inputs, nodes)
    for name in (i["name"] for i in inputs if i.get("host") and i["name"] in writes):
        n = writes[name]
        raise ExportError(f"graph input {name} is a CPU tensor that the CUDA graph writes",
                          node=n["name"], op=n["target"], source=n["source"],
                          hint="move that tensor to the GPU before the first call")
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    outs = out.args[0] if isinstance(out.args[0], (list, tuple)) else (out.args[0],)
    for k, o in enumerate(outs):
        val = o.meta.get("val") if isinstance(o, torch.fx.Node) else None
        if isinstance(val, torch.Tensor) and val.device.type == "cpu":
            raise ExportError(f"graph output {k} ({o.name}) is a CPU tensor in a CUDA graph",
                              node=o.name, op=_target_name(o) if o.op == "call_function" else o.op,
                              source=source_line(o), hint="keep the model's tensors on one device")


def output_structure(gm: torch.fx.GraphModule) -> tuple[int, bool]:
    """(number of outputs, whether the graph returns a sequence)."""
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    val = out.args[0]
    if isinstance(val, (list, tuple)):
        return len(val), True
    return 1, False
