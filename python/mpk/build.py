"""The cuda target's seam: turn the core's generated CUDA into a callable.

nvcc with an on-disk cache and the pybind11 launcher come later; until then
compiling for cuda fails with a clear error after the core has run."""

from __future__ import annotations

from .errors import MpkError


def cuda_callable(gm, request, compiled, opts, display_names=None):
    sources = compiled.result.get("cuda") or {}
    if not sources:
        raise MpkError("cuda target not built yet: the core returned no CUDA sources",
                       hint="use options={'target': 'reference'} for now", kind="not_implemented")
    raise MpkError(f"cuda target not built yet: the core emitted {len(sources)} file(s) "
                   f"({', '.join(sorted(sources))}) but nvcc/launcher support is not written",
                   hint="use options={'target': 'reference'} for now", kind="not_implemented")
