"""ctypes binding to the Go core (libmpkcore.so).

Every result buffer the core returns is freed with mpk_free; a compiled graph
lives in Go, named by a handle, until Compiled is garbage collected."""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from . import cachefile, errors

try:  # zstd is optional: the core also accepts raw JSON.
    import zstandard as _zstd
except ImportError:  # pragma: no cover - exercised only without the package
    _zstd = None

LIB_NAME = "libmpkcore.so"
_lib = None
_lib_lock = threading.Lock()


def library_path() -> Path:
    """Where the core library is loaded from: $MPK_CORE_LIB, else next to this file."""
    env = os.environ.get("MPK_CORE_LIB")
    return Path(env) if env else Path(__file__).with_name(LIB_NAME)


def _load():
    global _lib
    with _lib_lock:
        if _lib is not None:
            return _lib
        path = library_path()
        if not path.exists():
            raise errors.MpkError(
                f"the mpk core library is missing: {path}",
                hint="build it with `go build -buildmode=c-shared -o python/mpk/libmpkcore.so "
                     "./gocore/cmd/libmpkcore` from the repository root, reinstall with "
                     "`pip install .`, or set MPK_CORE_LIB", kind="internal")
        lib = ctypes.CDLL(str(path))
        out_t = ctypes.POINTER(ctypes.c_void_p)
        lib.mpk_compile.argtypes = [ctypes.c_char_p, ctypes.c_size_t, out_t,
                                    ctypes.POINTER(ctypes.c_size_t)]
        lib.mpk_compile.restype = ctypes.c_int64
        lib.mpk_run_reference.argtypes = [ctypes.c_int64, ctypes.POINTER(ctypes.c_size_t),
                                          ctypes.c_int, ctypes.c_int64, out_t,
                                          ctypes.POINTER(ctypes.c_size_t)]
        lib.mpk_run_reference.restype = None
        lib.mpk_release.argtypes = [ctypes.c_int64]
        lib.mpk_release.restype = None
        lib.mpk_free.argtypes = [ctypes.c_void_p]
        lib.mpk_free.restype = None
        _lib = lib
        return lib


def _take(lib, out: ctypes.c_void_p, n: ctypes.c_size_t) -> dict:
    """Copies a result buffer out of C memory, frees it, and parses the JSON."""
    if not out.value:
        raise errors.InternalError("the mpk core returned no result buffer")
    try:
        data = ctypes.string_at(out.value, n.value)
    finally:
        lib.mpk_free(out)
    try:
        return json.loads(data)
    except ValueError as e:
        raise errors.InternalError(f"the mpk core returned malformed JSON: {e}") from None


def request_json(request: dict) -> bytes:
    """A request as the JSON the core reads (before compression). Keys are
    sorted: the same request must give the same bytes (the core-result cache
    keys on them), however its dicts were assembled."""
    return json.dumps(request, separators=(",", ":"), allow_nan=False, sort_keys=True).encode()


def _compress(raw: bytes) -> bytes:
    return raw if _zstd is None else _zstd.ZstdCompressor(level=3).compress(raw)


def encode_request(request: dict) -> bytes:
    return _compress(request_json(request))


@dataclass
class Compiled:
    """A graph compiled by the core. Released when garbage collected."""

    handle: int
    summary: dict
    outputs: list[dict]
    result: dict = field(repr=False)
    _lib: Any = field(default=None, repr=False)

    def run_reference(self, tensors: Sequence, seed: int = 0) -> dict:
        """Runs the CPU reference executor on the data pointers of `tensors`
        (graph inputs in order, then outputs). Returns the wire.RunResult dict."""
        lib = self._lib
        n = len(tensors)
        ptrs = (ctypes.c_size_t * max(n, 1))(*[t.data_ptr() for t in tensors])
        out, out_len = ctypes.c_void_p(), ctypes.c_size_t()
        lib.mpk_run_reference(self.handle, ptrs, n, int(seed), ctypes.byref(out), ctypes.byref(out_len))
        res = _take(lib, out, out_len)
        if not res.get("ok"):
            raise errors.from_wire(res.get("error"))
        return res

    def release(self) -> None:
        if self.handle and self._lib is not None:
            self._lib.mpk_release(self.handle)
            self.handle = 0

    def __del__(self):
        try:
            self.release()
        except Exception:  # interpreter shutdown: the library may be gone
            pass


def compile(request: dict) -> Compiled:
    """Compiles a wire request (a dict per gocore/wire) and returns the handle."""
    return compile_bytes(encode_request(request))


def compile_bytes(data: bytes) -> Compiled:
    """Compiles an already encoded request (zstd or raw JSON bytes), as sent on
    the wire; tests use it to send malformed input to the core."""
    lib = _load()
    out, out_len = ctypes.c_void_p(), ctypes.c_size_t()
    handle = lib.mpk_compile(data, len(data), ctypes.byref(out), ctypes.byref(out_len))
    res = _take(lib, out, out_len)
    if not res.get("ok") or not handle:
        if handle:
            lib.mpk_release(handle)
        raise errors.from_wire(res.get("error"))
    return Compiled(handle=int(handle), summary=res.get("summary") or {},
                    outputs=res.get("outputs") or [], result=res, _lib=lib)


_lib_digest: str | None = None


def _library_digest() -> str:
    """sha256 of the core library file (once per process): a rebuilt core
    invalidates every cached result."""
    global _lib_digest
    if _lib_digest is None:
        h = hashlib.sha256()
        with open(library_path(), "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        _lib_digest = h.hexdigest()
    return _lib_digest


def compile_cached(request: dict, root: Path) -> Compiled:
    """compile() for requests whose result is used without the core afterwards
    (the cuda target: sources, tables and output specs; no handle to run).
    The result is stored under root/core, keyed by the core library's digest
    and the request (options included); a hit returns it with handle 0 and
    summary["core_cache_hit"] set (and core_ms 0), skipping the core (most of a second on an
    8B model). A missing or unreadable entry is a miss, never an error."""
    raw = request_json(request)
    key = hashlib.sha256(_library_digest().encode() + b"\0" + raw).hexdigest()
    path = root / "core" / f"{key}.json.z"
    res = cachefile.read(path)
    if isinstance(res, dict):
        summary = dict(res.get("summary") or {}, core_cache_hit=True, core_ms=0.0)
        return Compiled(handle=0, summary=summary, outputs=res.get("outputs") or [], result=res)
    compiled = compile_bytes(_compress(raw))
    cachefile.write(path, compiled.result)
    return compiled
