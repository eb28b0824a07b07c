"""Graphs with dynamic shapes: one static compile per concrete shape.

A megakernel's task tables, tiles and buffers are fixed at compile time, so
mpk compiles static shapes. Dynamo hands the backend a graph with symbolic
sizes whenever a traced size changed between calls under torch.compile's
default (dynamic=None: a prompt, then its decode steps), or when asked to
(dynamic=True, torch._dynamo.mark_dynamic). For such a graph the backend
returns a Specializing callable: each call's concrete sizes (the values of the
symbolic arguments the graph uses, and the shapes and strides of its inputs
whose sizes are symbolic) pick a static compile, made on first use from the
graph with those values written in, as if Dynamo had traced that call with
dynamic=False. A decode loop thus runs one module; each new prompt length
compiles one more. An int the graph only returns (a sliding-window cache's
position) is worked out per call, and one its tensors read only as a number
is passed as a 0-d tensor: neither keys a compile. A float Dynamo passes as
a 0-d tensor (dynamic=True) that the graph reads back with .item() is written
in, as a scalar. Past `limit` shapes the
graph runs eagerly (with a warning,
once), as Dynamo falls back at its recompile limit; so do new shapes once the
inputs have grown by the same sizes at three calls in a row (a Hugging Face
DynamicCache: a compile a token), the warning saying to keep the cache static."""

from __future__ import annotations

import operator
import warnings
from typing import Any, Callable, Sequence

import torch

from .compiled import unbox
from .errors import MpkError

DEFAULT_LIMIT = 8


def _is_symbolic(x: Any) -> bool:
    """Whether x is a SymInt (SymFloat, SymBool) with a free symbol."""
    if not isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return False
    from torch.fx.experimental.symbolic_shapes import free_symbols
    return bool(free_symbols(x))


def _placeholders(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "placeholder"]


def _output(graph: torch.fx.Graph) -> torch.fx.Node:
    return next(n for n in reversed(graph.nodes) if n.op == "output")


def _traced_value(node: torch.fx.Node, example: Any) -> Any:
    """What Dynamo traced a placeholder as (its fake value, symbolic sizes and
    all); the example input itself where the node has no record of it."""
    return node.meta.get("example_value", node.meta.get("val", example))


def is_dynamic(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> bool:
    """Whether Dynamo traced any input of gm with a symbolic value or size."""
    return any(_is_symbolic(v) or _symbolic_tensor(v)
               for v in (_traced_value(n, x) for n, x in zip(_placeholders(gm), example_inputs)))


def _number(x: Any) -> Any:
    """A scalar argument as a key: a 0-d tensor (a Python float Dynamo
    wrapped) by its value."""
    return x.item() if isinstance(x, torch.Tensor) else x


def _size_symbols(values: Sequence[Any]) -> set:
    """The free symbols of SymInts, and of tensors' sizes, strides and offsets."""
    from torch.fx.experimental.symbolic_shapes import free_symbols
    out = set()
    for v in values:
        for x in (v.shape, v.stride(), (v.storage_offset(),)) if isinstance(v, torch.Tensor) else ((v,),):
            for s in x:
                if isinstance(s, torch.SymInt):
                    out |= free_symbols(s)
    return out


def _symbolic_tensor(v: Any) -> bool:
    return isinstance(v, torch.Tensor) and any(
        _is_symbolic(s) for s in (*v.shape, *v.stride(), v.storage_offset()))


def with_values(gm: torch.fx.GraphModule, values: dict[int, Any]) -> torch.fx.GraphModule:
    """A copy of gm whose placeholders at the given indices are gone, each use
    replaced by its concrete value (the graph Dynamo would have traced with
    these values static). gm's attributes are shared, not copied."""
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    out = graph.graph_copy(gm.graph, env)
    graph.output(out)
    for i, node in enumerate(_placeholders(gm)):
        copy = env[node]
        # What Dynamo traced (symbolic sizes) does not describe the copy's inputs.
        copy.meta.pop("example_value", None)
        copy.meta.pop("val", None)
        if i not in values:
            continue
        _replace(graph, copy, values[i])
    graph.lint()
    return torch.fx.GraphModule(gm, graph)


def _replace(graph: torch.fx.Graph, node: torch.fx.Node, value: Any) -> None:
    """Writes value in for each use of node, then erases node."""
    for user in list(node.users):
        user.args = torch.fx.node.map_arg(user.args, lambda a: value if a is node else a)
        user.kwargs = torch.fx.node.map_arg(user.kwargs, lambda a: value if a is node else a)
    graph.erase_node(node)


def _copy(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of gm's graph (nodes' records kept); attributes shared."""
    graph = torch.fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    return torch.fx.GraphModule(gm, graph)


class ScalarOutputs:
    """A graph's outputs that are not tensors (sizes: a sliding-window
    cache's position, kept in a Python int): `graph` is a copy of the graph
    returning its tensor outputs only, and calling this with the graph's
    arguments gives the others, by their nodes, which compute on sizes and
    Python numbers, never on tensor data. Worked out per call (a few
    microseconds), a position that is only returned, not used, keys no
    compile of its own."""

    def __init__(self, gm: torch.fx.GraphModule):
        self.graph = _copy(gm)
        graph = self.graph.graph
        out = _output(graph)
        results = out.args[0]
        self.at: list[int] = []
        self.total = len(results) if isinstance(results, (tuple, list)) else 1
        self._sizes = None
        if not isinstance(results, (tuple, list)):
            return

        def is_tensor(a):  # as Dynamo traced it (a node without a record: taken for one)
            return isinstance(a, torch.fx.Node) and isinstance(_traced_value(a, torch.empty(0)), torch.Tensor)

        self.at = [i for i, a in enumerate(results) if not is_tensor(a)]
        if not self.at:
            return
        # The nodes the scalars come from; then a graph of them alone.
        need, stack = set(), [a for a in (results[i] for i in self.at) if isinstance(a, torch.fx.Node)]
        while stack:
            n = stack.pop()
            if n in need or n.op == "placeholder":
                continue
            if is_tensor(n) or n.op not in ("call_function", "call_method"):
                raise MpkError(f"a graph output that is not a tensor depends on {n.op} {n.name}, not on "
                               "sizes alone", kind="unsupported_op")
            need.add(n)
            stack.extend(n.all_input_nodes)
        sizes = torch.fx.Graph()
        env: dict[torch.fx.Node, torch.fx.Node] = {}
        for n in graph.nodes:
            if n.op == "placeholder" or n in need:
                env[n] = sizes.node_copy(n, lambda x: env[x])
        sizes.output(tuple(torch.fx.node.map_arg(results[i], lambda x: env[x]) for i in self.at))
        self._sizes = torch.fx.GraphModule(self.graph, sizes)
        out.args = (tuple(a for i, a in enumerate(results) if i not in self.at),)
        for n in reversed(list(graph.nodes)):  # the scalars' nodes, now unused
            if n in need and not n.users:
                graph.erase_node(n)
        self.graph.recompile()

    def merge(self, tensors: Sequence[Any], args: Sequence[Any]) -> Any:
        """The graph's outputs in its order: the tensor graph's, and the
        scalars for this call's arguments."""
        if self._sizes is None:
            return tensors
        scalars = dict(zip(self.at, self._sizes(*args)))
        rest = iter(tensors)
        return [scalars[i] if i in scalars else next(rest) for i in range(self.total)]


def _maximum(a: Any, b: Any) -> Any:
    """torch.sym_max for a number passed as a 0-d tensor (sym_max would
    branch on its value)."""
    if not isinstance(a, torch.Tensor):
        a, b = b, a
    return torch.maximum(a, b) if isinstance(b, torch.Tensor) else torch.clamp(a, min=b)


def _minimum(a: Any, b: Any) -> Any:
    if not isinstance(a, torch.Tensor):
        a, b = b, a
    return torch.minimum(a, b) if isinstance(b, torch.Tensor) else torch.clamp(a, max=b)


# Python arithmetic and comparisons: on two ints an int, with a tensor a
# tensor; sym_max and sym_min become _maximum and _minimum on a 0-d tensor.
_AS_TENSOR_OPS = {torch.sym_max: _maximum, torch.sym_min: _minimum}
_NUMBER_OPS = {operator.add, operator.sub, operator.mul, operator.floordiv, operator.mod, operator.neg,
               operator.lt, operator.le, operator.gt, operator.ge, operator.eq, operator.ne, *_AS_TENSOR_OPS}


def as_tensor_ops(gm: torch.fx.GraphModule, numbers: Sequence[int]) -> torch.fx.GraphModule:
    """gm with the int placeholders at `numbers` (taken as 0-d tensors) read
    by ops that take tensors: sym_max and sym_min downstream of them."""
    nodes = _placeholders(gm)
    reached, stack = set(), [nodes[i] for i in numbers]
    while stack:
        for u in stack.pop().users:
            if u not in reached:
                reached.add(u)
                stack.append(u)
    for n in reached:
        if n.op == "call_function" and n.target in _AS_TENSOR_OPS:
            n.target = _AS_TENSOR_OPS[n.target]
    gm.recompile()
    return gm


def _read_as_a_number(node: torch.fx.Node) -> bool:
    """Whether every use of an int placeholder ends in arithmetic with a
    tensor (tensor + n, n - 1 < tensor), never in a size, a view or a
    Python decision: then a 0-d tensor of the same value computes the same."""
    stack, seen = [node], set()
    while stack:
        n = stack.pop()
        for u in n.users:
            if u in seen:
                continue
            seen.add(u)
            if u.op != "call_function" or u.target not in _NUMBER_OPS or u.kwargs:
                return False
            if not any(isinstance(a, torch.fx.Node) and isinstance(_traced_value(a, None), torch.Tensor)
                       for a in u.args):
                stack.append(u)  # int arithmetic: its result is read the same way
    return True


def _growth(before: tuple, after: tuple) -> tuple:
    """(input, dim, by how much) for each size that changed from the shapes
    in key part `before` to `after`, when every change is an increase; ()
    otherwise."""
    grew = []
    for i, ((a, _), (b, _)) in enumerate(zip(before, after)):
        if len(a) != len(b):
            return ()
        for d, (x, y) in enumerate(zip(a, b)):
            if y < x:
                return ()
            if y > x:
                grew.append((i, d, y - x))
    return tuple(grew)


class Specializing:
    """The callable a graph with dynamic shapes compiles to (module doc).
    `compile_static(graph, inputs)` compiles a graph without symbolic inputs
    for these example inputs and returns its callable; each one it returns
    is kept in `compiled`, by its key."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                 compile_static: Callable[[torch.fx.GraphModule, list], Callable], limit: int = DEFAULT_LIMIT):
        self.gm = gm
        self.compile_static = compile_static
        self.limit = limit
        self.n_inputs = len(example_inputs)
        self.outputs = ScalarOutputs(gm)
        nodes = _placeholders(gm)
        traced = [_traced_value(n, x) for n, x in zip(nodes, example_inputs)]
        # Scalars the graph takes as arguments, written into each static
        # graph; those its tensors never depend on (read by no node, or only
        # by the scalar outputs') do not tell its shapes apart.
        self.scalars = [i for i, v in enumerate(traced)
                        if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool))]
        used = _placeholders(self.outputs.graph)
        self.shaped = [i for i, v in enumerate(traced) if _symbolic_tensor(v)]
        # An int the tensors read only as a number (arange + position), and
        # that no input's shape fixes already, is passed as a 0-d tensor
        # instead: no compile a value.
        sized = _size_symbols([traced[i] for i in self.shaped])
        self.values = [i for i in self.scalars if used[i].users and isinstance(traced[i], torch.SymInt)
                       and not _size_symbols([traced[i]]) <= sized and _read_as_a_number(used[i])]
        self.keyed_scalars = [i for i in self.scalars if used[i].users and i not in self.values]
        # A Python float Dynamo passes as a 0-d tensor (dynamic=True) that the
        # graph reads back with .item() (nn.Embedding's norm_type): its value
        # is written in, and keys the compile, as a scalar's.
        self.items = [i for i, (n, v) in enumerate(zip(used, traced))
                      if isinstance(v, torch.Tensor) and v.dim() == 0 and n.users
                      and all(u.op == "call_method" and u.target == "item" for u in n.users)]
        self.keyed_scalars += self.items
        # The arguments a static compile takes, picked in C: a decode step
        # passes hundreds.
        fixed = set(self.scalars) - set(self.values) | set(self.items)
        static = [i for i in range(len(traced)) if i not in fixed]
        if len(static) == 1:  # itemgetter of one index returns the item, not a tuple
            pick = lambda args, i=static[0]: (args[i],)  # noqa: E731
        else:
            pick = operator.itemgetter(*static) if static else (lambda args: ())
        self._static_args = pick
        if self.values:
            at = [static.index(i) for i in self.values]
            # Made where the graph's tensors are (a fill on the stream: a
            # copy from pageable host memory would wait for the stream).
            device = next((t.device for t in example_inputs if isinstance(t, torch.Tensor) and t.is_cuda),
                          torch.device("cpu"))

            def with_tensors(args):
                picked = list(pick(args))
                for k in at:
                    picked[k] = torch.full((), picked[k], dtype=torch.int64, device=device)
                return picked
            self._static_args = with_tensors
        self.compiled: dict[tuple, Callable] = {}
        self._warned = False
        # A graph whose inputs grow by the same step at every call (the
        # keys and values of a Hugging Face DynamicCache) would compile a
        # module a call: from the third such growth in a row, new shapes
        # run eagerly (see _grown).
        self._last_new: tuple | None = None  # the previous call's key, when that call compiled
        self._growth: tuple = ()  # how the previous compile's shapes grew from the one before
        self._streak = 0  # calls in a row that grew by _growth
        self.growing = False

    def key(self, args: Sequence[Any]) -> tuple:
        """The concrete sizes of a call: what picks its static compile. A
        static compile takes any storage offset, and any stride along a dim
        of size 1 (a decode step's token, sliced from a longer tensor)."""
        return (tuple(_number(args[i]) for i in self.keyed_scalars),
                tuple((tuple(args[i].shape),
                       tuple(st if sz > 1 else 0 for st, sz in zip(args[i].stride(), args[i].shape)))
                      for i in self.shaped))

    def __call__(self, *args):
        args = unbox(args, self.n_inputs)
        k = self.key(args)
        fn = self.compiled.get(k)
        if fn is None:
            if self.growing or self._grown(k):
                return self._eager(args, growing=True)
            if len(self.compiled) >= self.limit:
                return self._eager(args)
            fn = self.compiled[k] = self._compile(args)
            self._last_new = k
        else:
            self._last_new, self._growth, self._streak = None, (), 0
        return self.outputs.merge(fn(*self._static_args(args)), args)

    def _grown(self, k: tuple) -> bool:
        """Whether the new key k is the third in a row of calls that each
        brought a shape grown from the last one's by the same sizes (a cache
        that grows a step a call); it notes k's growth for the next call."""
        growth = _growth(self._last_new[1], k[1]) if self._last_new is not None else ()
        self._streak = self._streak + 1 if growth and growth == self._growth else int(bool(growth))
        self._growth = growth
        self.growing = self._streak >= 3
        return self.growing

    def _compile(self, args: Sequence[Any]) -> Callable:
        static_args = list(self._static_args(args))
        graph = self.outputs.graph
        if self.items:  # each .item() of those inputs becomes the call's value
            graph = _copy(graph)
            nodes = _placeholders(graph)
            for i in self.items:
                value = args[i].item()
                for item in list(nodes[i].users):
                    _replace(graph.graph, item, value)
        static = with_values(graph, {i: args[i] for i in [*self.scalars, *self.items] if i not in self.values})
        if self.values:  # their placeholders, among the tensors', in the same order
            kept = [i for i in range(self.n_inputs) if i not in self.scalars or i in self.values]
            static = as_tensor_ops(static, [kept.index(i) for i in self.values])
        return self.compile_static(static, static_args)

    def _eager(self, args: Sequence[Any], growing: bool = False):
        if not self._warned:
            self._warned = True
            if growing:
                warnings.warn("mpk: this graph's inputs grow at every call (as a Hugging Face DynamicCache's "
                              "keys and values do, or a generate without a cache), and each size would compile "
                              "a megakernel of its own: calls of new sizes run eagerly. Keep the cache static: "
                              "model.generate(..., cache_implementation='static'), or pass a "
                              "transformers.StaticCache.", stacklevel=3)
            else:
                warnings.warn(f"mpk: this graph was compiled for {self.limit} shapes (option max_shapes); "
                              "calls of other shapes run eagerly. Pad inputs to a few fixed sizes, or raise "
                              "max_shapes.", stacklevel=3)
        with torch.no_grad():
            return self.gm(*args)
