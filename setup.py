"""Build steps pyproject.toml cannot express: the Go core and (later) the CUDA launcher.

* The Go core: `go build -buildmode=c-shared -o python/mpk/libmpkcore.so ./gocore/cmd/libmpkcore`,
  or, when MPK_PREBUILT_CORE=/path/libmpkcore.so is set, a copy of that file (no Go needed).
* The pybind11 CUDA launcher (csrc/launcher): built only when nvcc is found. See
  LAUNCHER HOOK below.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.develop import develop

try:  # setuptools >= 64 editable installs run build_ext/build_py through this command
    from setuptools.command.editable_wheel import editable_wheel
except ImportError:  # pragma: no cover
    editable_wheel = None

ROOT = Path(__file__).resolve().parent
PKG = ROOT / "python" / "mpk"
CORE = PKG / "libmpkcore.so"


def _newest_go_source() -> float:
    paths = [ROOT / "go.mod", ROOT / "go.sum", *(ROOT / "gocore").rglob("*.go")]
    return max((p.stat().st_mtime for p in paths if p.exists()), default=0.0)


def build_core(dest: Path = CORE, force: bool = False) -> Path:
    """Puts libmpkcore.so at dest: a copy of $MPK_PREBUILT_CORE, else go build
    (into python/mpk, skipped when up to date, then copied to dest)."""
    prebuilt = os.environ.get("MPK_PREBUILT_CORE")
    if prebuilt:
        src = Path(prebuilt)
        if not src.is_file():
            sys.exit(f"mpk: MPK_PREBUILT_CORE={prebuilt} is not a file")
        dest.parent.mkdir(parents=True, exist_ok=True)
        if not dest.exists() or src.resolve() != dest.resolve():
            shutil.copyfile(src, dest)
        print(f"mpk: using prebuilt core {src} -> {dest}")
        return dest
    _go_build(force)
    if dest.resolve() != CORE.resolve():
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(CORE, dest)
    return dest


def _go_build(force: bool) -> None:
    if not force and CORE.exists() and CORE.stat().st_mtime >= _newest_go_source():
        print(f"mpk: core is up to date: {CORE}")
        return
    go = shutil.which("go")
    if go is None:
        sys.exit("mpk: building the core needs Go (https://go.dev/dl/), or set "
                 "MPK_PREBUILT_CORE=/path/to/libmpkcore.so")
    cmd = [go, "build", "-buildmode=c-shared", "-o", str(CORE), "./gocore/cmd/libmpkcore"]
    print("mpk: " + " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True)
    header = CORE.with_suffix(".h")
    if header.exists():  # cgo writes a header we do not ship
        header.unlink()


# ---------------------------------------------------------------------------
# LAUNCHER HOOK: the pybind11 CUDA launcher extension (csrc/launcher).
# Filled in later. It is built only when nvcc is on PATH (or $CUDA_HOME/bin),
# so CPU-only machines install without it; mpk.build imports it lazily.
# ---------------------------------------------------------------------------
def launcher_extensions() -> list:
    nvcc = shutil.which("nvcc") or (os.environ.get("CUDA_HOME") and
                                    shutil.which("nvcc", path=os.path.join(os.environ["CUDA_HOME"], "bin")))
    sources = sorted((ROOT / "csrc" / "launcher").glob("*.cpp")) + sorted((ROOT / "csrc" / "launcher").glob("*.cu"))
    if not nvcc or not sources:
        return []
    # TODO(launcher): return [torch.utils.cpp_extension.CUDAExtension("mpk._launcher", ...)]
    # with cmdclass build_ext = torch.utils.cpp_extension.BuildExtension.
    return []


class BuildPy(build_py):
    """Regular installs and wheels: the core goes into build_lib only, so a
    prebuilt core never replaces the one in the source tree."""

    def run(self):
        super().run()
        if not self.editable_mode:
            build_core(Path(self.build_lib) / "mpk" / CORE.name)


class Develop(develop):
    def run(self):
        build_core()
        super().run()


cmdclass = {"build_py": BuildPy, "develop": Develop}

if editable_wheel is not None:
    class EditableWheel(editable_wheel):
        def run(self):
            build_core()
            super().run()

    cmdclass["editable_wheel"] = EditableWheel

setup(cmdclass=cmdclass, ext_modules=launcher_extensions())
