"""Compressed JSON files in mpk's on-disk caches.

A cache file is written atomically (a reader sees the old file or the new
one) and read as a miss when missing or unreadable, never as an error: a
corrupt entry is removed, and a full disk or a read-only cache only costs the
next start its speed."""

from __future__ import annotations

import contextlib
import json
import os
import zlib
from pathlib import Path
from typing import Any


def encode(value: Any) -> bytes:
    """A JSON value as compressed bytes (also the payload of a precompiled graph)."""
    return zlib.compress(json.dumps(value, separators=(",", ":")).encode(), 1)


def decode(data: bytes) -> Any:
    """The value `encode` wrote; ValueError or zlib.error when the bytes are not one."""
    return json.loads(zlib.decompress(data))


def read(path: Path) -> Any | None:
    """The stored value, or None (missing, or unreadable and now removed)."""
    try:
        return decode(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError, zlib.error):
        discard(path)
        return None


def discard(path: Path) -> None:
    """Removes an entry whose content turned out unusable."""
    with contextlib.suppress(OSError):
        path.unlink(missing_ok=True)


def write(path: Path, value: Any) -> None:
    data = encode(value)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
