"""Exceptions a user reads. The Go core answers failures as structured data
(wire.Error); this module turns them into Python exceptions by kind."""

from __future__ import annotations


class MpkError(RuntimeError):
    """Any mpk failure. Carries the structured fields of the core's error."""

    kind = "error"

    def __init__(self, message: str, *, node: str = "", op: str = "", source: str = "",
                 hint: str = "", kind: str | None = None):
        self.message, self.node, self.op, self.source, self.hint = message, node, op, source, hint
        if kind is not None:
            self.kind = kind
        # Not super(): backend.py mixes in Dynamo's ShortenTraceback, whose __init__ differs.
        Exception.__init__(self, self._format())

    def _format(self) -> str:
        # Mirrors wire.Error.Error() on the Go side.
        s = self.message
        if self.node:
            s += f"\n  at node {self.node} ({self.op})"
        elif self.op:
            s += f"\n  op: {self.op}"
        if self.source:
            s += "\n  model line: " + self.source
        if self.hint:
            s += "\n  hint: " + self.hint
        return s


class UnsupportedOpError(MpkError):
    kind = "unsupported_op"


class InvalidGraphError(MpkError):
    kind = "invalid_graph"


class ValidationError(MpkError):
    kind = "validation"


class BadRequestError(MpkError):
    kind = "bad_request"


class MpkRuntimeError(MpkError):
    kind = "runtime"


class InternalError(MpkError):
    kind = "internal"


class ArgumentError(MpkError, ValueError):
    """A call argument does not match what the graph was compiled for."""

    kind = "argument"


_BY_KIND = {c.kind: c for c in (UnsupportedOpError, InvalidGraphError, ValidationError,
                                BadRequestError, MpkRuntimeError, InternalError)}


def from_wire(err: dict | None) -> MpkError:
    """Builds the exception for a wire.Error dict (None means the core gave no detail)."""
    if not err:
        return InternalError("the mpk core reported a failure without an error")
    kind = err.get("kind", "internal")
    cls = _BY_KIND.get(kind, MpkError)
    return cls(err.get("message", ""), node=err.get("node", ""), op=err.get("op", ""),
               source=err.get("source", ""), hint=err.get("hint", ""), kind=kind)
