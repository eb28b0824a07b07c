"""Build steps pyproject.toml cannot express: the Go core, the launcher, csrc/ as package data.

* The Go core: `go build -buildmode=c-shared -o python/mpk/libmpkcore.so ./gocore/cmd/libmpkcore`,
  or, when MPK_PREBUILT_CORE=/path/libmpkcore.so is set, a copy of that file (no Go needed).
* The launcher mpk._launcher (csrc/launcher/launcher.cpp): a torch C++
  extension, built when torch is importable; no CUDA toolkit needed.
* csrc/ (the CUDA runtime and task headers that generated modules include) is
  copied into the package as mpk/csrc; editable installs use the source tree.
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
# The launcher extension (csrc/launcher): a torch C++ extension without CUDA
# headers (it dlopens the generated module), built against the torch of the
# build environment. pip's build isolation hides the installed torch (install
# with --no-build-isolation to build it here); without torch the launcher is
# compiled on first use, and mpk.build also does that when the installed one
# was built against another torch.
# ---------------------------------------------------------------------------
def launcher_extensions() -> tuple[list, dict]:
    """The extension and the build_ext command that builds it (none without torch)."""
    src = ROOT / "csrc" / "launcher" / "launcher.cpp"
    if not src.is_file() or os.environ.get("MPK_NO_LAUNCHER"):
        return [], {}
    try:
        import torch
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError:
        print("mpk: torch is not importable here (pip build isolation?); mpk._launcher will be compiled on "
              "first use")
        return [], {}
    ext = CppExtension("mpk._launcher", [os.path.relpath(src, ROOT)], include_dirs=["csrc"],
                       define_macros=[("MPK_TORCH_VERSION", f'"{torch.__version__}"')],
                       extra_compile_args=["-O2", "-g0"], libraries=["dl"])  # BuildExtension picks torch's -std
    return [ext], {"build_ext": BuildExtension.with_options(use_ninja=False)}


def copy_csrc(dest: Path) -> None:
    """The CUDA headers (and the launcher source) as package data: mpk/csrc."""
    src = ROOT / "csrc"
    if not src.is_dir():
        return
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("*.so", "*.o", "__pycache__"))


class BuildPy(build_py):
    """Regular installs and wheels: the core goes into build_lib only, so a
    prebuilt core never replaces the one in the source tree."""

    def run(self):
        super().run()
        if not self.editable_mode:  # editable installs read csrc/ from the source tree
            build_core(Path(self.build_lib) / "mpk" / CORE.name)
            copy_csrc(Path(self.build_lib) / "mpk" / "csrc")


class Develop(develop):
    def run(self):
        build_core()
        super().run()


ext_modules, ext_cmdclass = launcher_extensions()
cmdclass = {"build_py": BuildPy, "develop": Develop, **ext_cmdclass}

if editable_wheel is not None:
    class EditableWheel(editable_wheel):
        def run(self):
            build_core()
            super().run()

    cmdclass["editable_wheel"] = EditableWheel

setup(cmdclass=cmdclass, ext_modules=ext_modules)
