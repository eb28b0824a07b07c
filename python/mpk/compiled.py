"""The callable a compile returns for the reference target, and what every
target's callable shares: the compiled layout (what each argument must be,
what each output is), argument checks against it, output allocation, and the
two calling conventions (one argument per input, or AOTAutograd's boxed
list). The cuda target's callables (build.py) subclass CompiledGraph; their
calls check and allocate in the launcher (C++) by the same layout, and the
checks here name what the launcher refused."""

from __future__ import annotations

import weakref
from typing import Any, Sequence

import torch

from . import core, export
from .errors import ArgumentError, MpkError


def unbox(args: tuple, n_inputs: int) -> tuple:
    """The arguments of a call made in either convention: one per input, or
    (AOTAutograd's boxed convention) one list holding them all."""
    if len(args) == 1 and isinstance(args[0], list) and n_inputs != 1:
        return tuple(args[0])
    return args


def _span(shape: Sequence[int], strides: Sequence[int]) -> int:
    """Elements from a view's first element to one past its last (0 when empty)."""
    if any(sz == 0 for sz in shape):
        return 0
    return 1 + sum((sz - 1) * st for sz, st in zip(shape, strides))


class CompiledGraph:
    """The callable for the reference target: checks arguments, allocates
    outputs per the core's output specs, runs the CPU reference executor.
    build.CudaGraph subclasses it (device, _run)."""

    device = torch.device("cpu")

    front_timing = ""  # how the ATen graph was obtained (AOTAutograd time, or the graph cache)

    def __init__(self, request: dict, compiled: core.Compiled, opts: dict,
                 display_names: Sequence[str] | None, returns_sequence: bool):
        self.request = request
        self.opts = opts
        self.compiled = compiled
        self.summary = compiled.summary
        self.seed = opts["wire"]["seed"]
        self.poison = opts.get("poison", True)
        self.inputs = request["graph"]["inputs"]
        self.display_names = list(display_names) if display_names else [i["name"] for i in self.inputs]
        self.output_specs = compiled.outputs
        self.n_outputs, self.returns_sequence = len(request["graph"]["outputs"]), returns_sequence
        if len(self.output_specs) != self.n_outputs:
            raise MpkError(f"the core described {len(self.output_specs)} outputs, the graph has "
                           f"{self.n_outputs}", kind="internal")
        self.last_run: dict | None = None
        self.calls = 0
        # Elements each input's view spans (from its compiled layout), and the
        # inputs the graph writes (aten.copy_ into an input), for check_args.
        self._spans = [_span(i["meta"]["shape"], i["meta"]["strides"]) for i in self.inputs]
        index = {inp["name"]: k for k, inp in enumerate(self.inputs)}
        self._passed: list[tuple | None] = [None] * len(self.inputs)  # see check_args
        self._written = frozenset(index[name] for name in export.written_inputs(self.inputs, request["graph"]["nodes"]))
        # The inputs the kernel reads with bulk copies (cuda: streamed weights,
        # kv_pages caches): their data must be 16-byte aligned.
        self._bulk = frozenset(compiled.result.get("bulk_inputs") or [])
        # CPU inputs of a CUDA graph (export marks them), copied over per call.
        self._host = tuple(k for k, i in enumerate(self.inputs) if i.get("host"))
        self.layout = self._layout()

    def _layout(self) -> tuple[list[tuple], list[tuple]]:
        """What a call checks and allocates, as the launcher takes it (see
        launcher.Call): per input (dtype, shape, strides, written, bulk), per output
        (kind, dtype, shape, strides, offset, buffer elements, input index): a
        new tensor (a view at `offset` into a buffer when offset is nonzero),
        or a view of an input at `offset` from that input's own offset."""
        inputs = [(export.DTYPES_BY_NAME[i["meta"]["dtype"]], i["meta"]["shape"], i["meta"]["strides"],
                   k in self._written, k in self._bulk) for k, i in enumerate(self.inputs)]
        outputs = []
        for j, spec in enumerate(self.output_specs):
            shape, strides, off = spec["shape"], spec["strides"], int(spec.get("offset", 0))
            if spec["kind"] == "input":
                idx = int(spec.get("input", 0))
                rel = off - int(self.inputs[idx]["meta"].get("offset", 0))
                outputs.append(("input", inputs[idx][0], shape, strides, rel, 0, idx))
            elif spec["kind"] == "new":
                buffer = off + 1 + sum((s - 1) * st for s, st in zip(shape, strides) if s > 0) if off else 0
                outputs.append(("new", export.DTYPES_BY_NAME[spec["dtype"]], shape, strides, off, buffer, -1))
            else:
                raise MpkError(f"output {j} has unknown kind {spec['kind']!r}", kind="internal")
        return inputs, outputs

    def timing(self) -> str:
        """Compile cost after Dynamo (the cuda target adds the Go core, nvcc, loading)."""
        return self.front_timing or "compiled"

    def _describe(self, i: int) -> str:
        name = self.inputs[i]["name"]
        disp = self.display_names[i]
        return f"argument {i} ({name}" + (f", {disp})" if disp != name else ")")

    def check_args(self, args: Sequence[Any]) -> None:
        """Checks every argument against its compiled layout. An argument that
        is the same tensor as at the last call that passed, with the same data
        pointer, shape and strides, is not checked again: a decode step passes
        the same parameters and cache every time, and the full check of a few
        hundred tensors would cost more host time than the kernel itself."""
        self._check_count(args)
        changed = []
        for i, a in enumerate(args):
            s = self._passed[i]
            if s is None or s[0]() is not a or a.data_ptr() != s[1] or a.shape != s[2] or a.stride() != s[3]:
                changed.append(i)
        if not changed:
            return
        self._check_each(args, changed)
        if self._written:
            if len(changed) > 8:
                self._check_aliasing(args)
            else:  # the unchanged arguments were checked against each other before
                self._check_aliasing_of(args, changed)
        for i in changed:
            a, span = args[i], self._spans[i]
            rng = (a.data_ptr(), a.data_ptr() + span * a.element_size()) if span else None
            self._passed[i] = (weakref.ref(a), a.data_ptr(), a.shape, a.stride(), rng)

    def argument_error(self, args: Sequence[Any], index: int, reason: str) -> ArgumentError:
        """The error for arguments the launcher refused (argument `index`, or
        -1 for their number): the checks below name the problem as the
        reference target's calls do; the launcher's reason if they all pass."""
        try:
            self._check_count(args)
            if 0 <= index < len(args):
                self._check_each(args, [index])
            self._check_each(args, range(len(args)))
            if self._written:
                self._check_aliasing(args)
        except ArgumentError as e:
            return e
        return ArgumentError(f"{self._describe(index)} {reason}" if 0 <= index < len(self.inputs) else reason)

    def _check_count(self, args: Sequence[Any]) -> None:
        if len(args) != len(self.inputs):
            raise ArgumentError(f"compiled graph takes {len(self.inputs)} arguments, got {len(args)}")

    def _check_aliasing_of(self, args: Sequence[torch.Tensor], changed: Sequence[int]) -> None:
        """_check_aliasing for the pairs that involve a changed argument."""
        def byte_range(k):
            a, span = args[k], self._spans[k]
            return (a.data_ptr(), a.data_ptr() + span * a.element_size()) if span else None

        fresh = set(changed)
        ranges = [byte_range(k) if k in fresh or self._passed[k] is None else self._passed[k][4]
                  for k in range(len(args))]
        for i in changed:
            if ranges[i] is None:
                continue
            lo, hi = ranges[i]
            for j, r in enumerate(ranges):
                if j == i or r is None or r[0] >= hi or lo >= r[1]:
                    continue
                if i in self._written or j in self._written:
                    raise self._overlap_error(i, j)

    def _check_each(self, args: Sequence[Any], which: Sequence[int]) -> None:
        for i in which:
            a, spec = args[i], self.inputs[i]
            meta = spec["meta"]
            if not isinstance(a, torch.Tensor):
                raise ArgumentError(f"{self._describe(i)} must be a tensor, got {type(a).__name__}")
            if a.device != self.device:
                raise ArgumentError(f"{self._describe(i)} is on {a.device}, the graph was compiled "
                                    f"for {self.device}",
                                    hint=f"move the model and inputs to {self.device}")
            dt = export.DTYPE_NAMES.get(a.dtype, str(a.dtype))
            if dt != meta["dtype"]:
                raise ArgumentError(f"{self._describe(i)} has dtype {dt}, compiled for {meta['dtype']}")
            if list(a.shape) != meta["shape"]:
                raise ArgumentError(f"{self._describe(i)} has shape {list(a.shape)}, compiled for "
                                    f"{meta['shape']}",
                                    hint="shapes are static; a new shape needs a new compile")
            if a.numel() > 1 and any(st != ms for st, ms, sz in zip(a.stride(), meta["strides"], a.shape)
                                     if sz > 1):
                raise ArgumentError(f"{self._describe(i)} has strides {list(a.stride())}, compiled for "
                                    f"{meta['strides']}", hint="pass a tensor with the same layout "
                                    "(e.g. .contiguous())")
            if i in self._bulk and a.data_ptr() % 16:
                raise ArgumentError(f"{self._describe(i)} has its data at an address that is not 16-byte aligned "
                                    f"(0x{a.data_ptr():x}); the kernel reads it with bulk copies",
                                    hint="pass a tensor whose data starts on a 16-byte boundary (e.g. .clone())")
            span = self._spans[i]
            if span:  # the core reads and writes through the raw pointer: the storage must hold the view
                if a.data_ptr() == 0:
                    raise ArgumentError(f"{self._describe(i)} has no storage (freed, or resized to 0 bytes)",
                                        hint="pass a live tensor; do not resize or free inputs between calls")
                need = (a.storage_offset() + span) * a.element_size()
                have = a.untyped_storage().nbytes()
                if need > have:
                    raise ArgumentError(f"{self._describe(i)} needs {need} bytes of storage, its storage "
                                        f"holds {have} (resized?)",
                                        hint="pass a live tensor; do not resize or free inputs between calls")

    def _overlap_error(self, i: int, j: int) -> ArgumentError:
        """The error for inputs i and j sharing memory while one is written;
        it names the written one first (the lower index when both are)."""
        wi, wj = i in self._written, j in self._written
        w, o = (min(i, j), max(i, j)) if wi and wj else (i, j) if wi else (j, i)
        return ArgumentError(f"{self._describe(w)} overlaps {self._describe(o)} in memory, and the "
                             f"graph writes argument {w}",
                             hint="pass separate tensors (e.g. .clone() one of them)")

    def _check_aliasing(self, args: Sequence[torch.Tensor]) -> None:
        """Rejects a written input whose memory overlaps another input: the core
        reads every input as it was when the call began, so aliasing would give
        silently wrong results. (Through torch.compile aot_autograd already
        dedups aliased inputs; this guards direct calls.) Byte ranges are
        compared, so interleaved views of one buffer count as overlapping."""
        spans = []
        for i, a in enumerate(args):
            if self._spans[i]:
                lo = a.data_ptr()
                spans.append((lo, lo + self._spans[i] * a.element_size(), i))
        spans.sort()
        hi_any, hi_any_i, hi_w, hi_w_i = 0, -1, 0, -1
        for lo, hi, i in spans:
            written = i in self._written
            other = hi_any_i if written and hi_any > lo else hi_w_i if hi_w > lo else -1
            if other >= 0:
                raise self._overlap_error(i, other)
            if hi > hi_any:
                hi_any, hi_any_i = hi, i
            if written and hi > hi_w:
                hi_w, hi_w_i = hi, i

    def _outputs(self, args: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        outs = []
        for kind, dtype, shape, strides, off, buffer, idx in self.layout[1]:
            if kind == "input":
                base = args[idx]
                outs.append(base.as_strided(shape, strides, base.storage_offset() + off))
                continue
            if buffer:
                t = torch.empty(buffer, dtype=dtype, device=self.device).as_strided(shape, strides, off)
            else:
                t = torch.empty_strided(shape, strides, dtype=dtype, device=self.device)
            if self.poison and t.is_floating_point():
                t.fill_(float("nan"))
            outs.append(t)
        return outs

    def _run(self, args: Sequence[torch.Tensor], outs: list[torch.Tensor]) -> None:
        # args and outs stay referenced by the caller's frame until the core returns.
        self.last_run = self.compiled.run_reference(list(args) + outs, self.seed)

    def __call__(self, *args):
        args = unbox(args, len(self.inputs))
        self.check_args(args)
        outs = self._outputs(args)
        self._run(args, outs)
        self.calls += 1
        if self.returns_sequence:
            return tuple(outs)
        return outs[0]
