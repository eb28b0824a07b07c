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
compiles one more. Past `limit` shapes the graph runs eagerly (with a warning,
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
        value = values[i]
        for user in list(copy.users):
            user.args = torch.fx.node.map_arg(user.args, lambda a: value if a is copy else a)
            user.kwargs = torch.fx.node.map_arg(user.kwargs, lambda a: value if a is copy else a)
        graph.erase_node(copy)
    graph.lint()
    return torch.fx.GraphModule(gm, graph)


def split_scalar_outputs(static: torch.fx.GraphModule, args: Sequence[Any]) -> tuple[torch.fx.GraphModule, dict[int, Any]]:
    """The static graph returning its tensor outputs only, and the values of
    the others by their place among all outputs. A graph of symbolic sizes
    may return sizes too (a sliding-window cache's position, kept in a Python
    int); with the sizes written in, they are constants of the shape, worked
    out once here from args (the static graph's arguments) by the nodes they
    come from, which compute on sizes, never on tensor data."""
    graph = static.graph
    out = _output(graph)
    results = out.args[0]
    if not isinstance(results, (tuple, list)):
        return static, {}

    def is_tensor(a):  # as Dynamo traced it (a node without a record: taken for one)
        return isinstance(a, torch.fx.Node) and isinstance(_traced_value(a, torch.empty(0)), torch.Tensor)

    scalar_at = [i for i, a in enumerate(results) if not is_tensor(a)]
    if not scalar_at:
        return static, {}
    # The nodes the scalars come from; then a graph of them alone, run once.
    need, stack = set(), [a for a in (results[i] for i in scalar_at) if isinstance(a, torch.fx.Node)]
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
    sizes.output(tuple(torch.fx.node.map_arg(results[i], lambda x: env[x]) for i in scalar_at))
    values = torch.fx.GraphModule(static, sizes)(*args)
    out.args = (tuple(a for i, a in enumerate(results) if i not in scalar_at),)
    for n in reversed(list(graph.nodes)):  # the scalars' nodes, now unused
        if n in need and not n.users:
            graph.erase_node(n)
    static.recompile()
    return static, dict(zip(scalar_at, values))


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
        nodes = _placeholders(gm)
        traced = [_traced_value(n, x) for n, x in zip(nodes, example_inputs)]
        # Scalars the graph takes as arguments, written into each static
        # graph; those it never reads do not tell its shapes apart.
        self.scalars = [i for i, v in enumerate(traced)
                        if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool))]
        self.keyed_scalars = [i for i in self.scalars if nodes[i].users]
        self.shaped = [i for i, v in enumerate(traced) if _symbolic_tensor(v)]
        # The arguments a static compile takes, picked in C: a decode step
        # passes hundreds.
        scalars = set(self.scalars)
        tensors = [i for i in range(len(traced)) if i not in scalars]
        if len(tensors) == 1:  # itemgetter of one index returns the item, not a tuple
            self._static_args = lambda args, i=tensors[0]: (args[i],)
        else:
            self._static_args = operator.itemgetter(*tensors) if tensors else (lambda args: ())
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
        return (tuple(args[i] for i in self.keyed_scalars),
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
        return fn(*self._static_args(args))

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
        static, scalars = split_scalar_outputs(with_values(self.gm, {i: args[i] for i in self.scalars}), static_args)
        fn = self.compile_static(static, static_args)
        if not scalars:
            return fn
        total = len(_output(static.graph).args[0]) + len(scalars)

        def with_scalars(*a):  # the outputs in the graph's order, the shape's constants among them
            tensors = iter(fn(*a))
            return [scalars[i] if i in scalars else next(tensors) for i in range(total)]
        return with_scalars

    def _eager(self, args: Sequence[Any], growing: bool = False):
        if not self._warned:
            self._warned = True
            if growing:
                warnings.warn("mpk: this graph's inputs grow at every call (as a Hugging Face DynamicCache's "
                              "keys and values do, or a generate without a cache), and each size would compile "
                              "a megakernel of its own: calls of new sizes run eagerly. Keep the cache static: "
                              "model.generate(..., cache_implementation='static'), or pass a "
                              "transformers.StaticCache as past_key_values.", stacklevel=3)
            else:
                warnings.warn(f"mpk: this graph was compiled for {self.limit} shapes (option max_shapes); "
                              "calls of other shapes run eagerly. Pad inputs to a few fixed sizes, or raise "
                              "max_shapes.", stacklevel=3)
        with torch.no_grad():
            return self.gm(*args)
