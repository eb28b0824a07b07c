"""Shared fixtures: the gpu marker and the Go core library, built once per session."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))  # run from a source tree without installing

CORE = ROOT / "python" / "mpk" / "libmpkcore.so"


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped without one)")


def pytest_collection_modifyitems(config, items):
    import torch
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _newest_go_source() -> float:
    paths = [ROOT / "go.mod", ROOT / "go.sum", *(ROOT / "gocore").rglob("*.go")]
    return max((p.stat().st_mtime for p in paths if p.exists()), default=0.0)


@pytest.fixture(scope="session", autouse=True)
def private_cache_dir(tmp_path_factory):
    """Every test session gets its own mpk cache (nvcc modules, exported graphs),
    so a test never passes on an entry a previous run left behind."""
    old = os.environ.get("MPK_CACHE_DIR")
    os.environ["MPK_CACHE_DIR"] = str(tmp_path_factory.mktemp("mpk-cache"))
    yield
    if old is None:
        os.environ.pop("MPK_CACHE_DIR", None)
    else:
        os.environ["MPK_CACHE_DIR"] = old


@pytest.fixture(scope="session")
def core_lib() -> Path:
    """The Go core: $MPK_CORE_LIB if set, else python/mpk/libmpkcore.so, rebuilt
    when missing or older than the Go sources. Skips only when Go is absent."""
    env = os.environ.get("MPK_CORE_LIB")
    if env:
        if not Path(env).is_file():
            pytest.fail(f"MPK_CORE_LIB={env} is not a file")
        return Path(env)
    if CORE.exists() and CORE.stat().st_mtime >= _newest_go_source():
        return CORE
    go = shutil.which("go")
    if go is None:
        if CORE.exists():
            return CORE  # stale but usable (e.g. installed from MPK_PREBUILT_CORE)
        pytest.skip("the Go core library is missing and Go is not installed")
    r = subprocess.run([go, "build", "-buildmode=c-shared", "-o", str(CORE), "./gocore/cmd/libmpkcore"],
                       cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        pytest.fail("go build of the core failed:\n" + r.stdout + r.stderr, pytrace=False)
    CORE.with_suffix(".h").unlink(missing_ok=True)
    return CORE


@pytest.fixture
def fresh_dynamo():
    import torch
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class FakeCompiled:
    """Stands in for core.Compiled: records the request, outputs fresh tensors."""

    def __init__(self, request):
        self.request = request
        self.summary = {"text": "fake", "tasks": 0}
        self.result = {}
        metas = {n["name"]: n["outs"] for n in request["graph"]["nodes"]}
        metas.update({i["name"]: [i["meta"]] for i in request["graph"]["inputs"]})
        self.outputs = []
        for o in request["graph"]["outputs"]:
            m = metas[o["node"]][o["index"]]
            self.outputs.append({"kind": "new", "dtype": m["dtype"], "shape": m["shape"],
                                 "strides": m["strides"], "offset": 0})
        self.runs = []

    def run_reference(self, tensors, seed=0):
        self.runs.append([t.data_ptr() for t in tensors])
        return {"ok": True, "executed": 0, "ms": 0.0}


@pytest.fixture
def fake_core(monkeypatch, fresh_dynamo):
    """Replaces core.compile with a fake that records requests (no Go needed)."""
    import json

    from mpk import core
    reqs = []

    def fake_compile(request):
        json.dumps(request)  # must be plain JSON
        reqs.append(request)
        return FakeCompiled(request)

    monkeypatch.setattr(core, "compile", fake_compile)
    return reqs


@pytest.fixture(scope="session")
def build_shared():
    """build_shared(src, out, *flags) compiles C source src into the shared
    library out with the system C compiler (the fake modules of the call-path
    tests); a test that asks for it is skipped where there is none."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")

    def build(src: Path, out: Path, *flags: str) -> Path:
        subprocess.run([cc, "-shared", "-fPIC", *flags, str(src), "-o", str(out)], check=True)
        return out
    return build
