"""The cuda target: nvcc with an on-disk cache, the launcher, and the callable.

build_module() compiles the core's generated CUDA (module.cu, which includes
headers from csrc/runtime and csrc/tasks) into module.so under a cache
directory keyed by the content hash of everything that affects the binary.
cuda_callable() loads it through the launcher (mpk._launcher, a torch C++
extension, see csrc/launcher) and returns the callable torch.compile hands
back, whose calls run in the launcher."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch

from .compiled import CompiledGraph, unbox
from .errors import MpkError

MODULE_SO = "module.so"
MODULE_CU = "module.cu"
SIDECAR = "module.so.sha256"
NVCC_FLAGS = ("-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", "-lineinfo",
              "--expt-relaxed-constexpr")
DEFAULT_ARCH = "90a"  # the H100: what `mpk build` targets without a GPU
_HEADER_SUFFIXES = (".h", ".cuh", ".hpp", ".inl")


class BuildError(MpkError):
    kind = "build"


# --------------------------------------------------------------------------
# Finding things: csrc, nvcc, the target architecture.
# --------------------------------------------------------------------------

def csrc_dir() -> Path:
    """The csrc/ include root: $MPK_CSRC, else the copy installed as package
    data (mpk/csrc), else the source tree's csrc/ (editable installs)."""
    env = os.environ.get("MPK_CSRC")
    candidates = [Path(env)] if env else []
    here = Path(__file__).resolve().parent
    candidates += [here / "csrc", here.parents[1] / "csrc"]
    for c in candidates:
        if (c / "runtime" / "module_abi.h").is_file():
            return c
    raise BuildError("the mpk CUDA headers (csrc/runtime/module_abi.h) are missing",
                     hint="reinstall mpk, or set MPK_CSRC to the repository's csrc directory; "
                          "looked in " + ", ".join(str(c) for c in candidates), kind="build")


def find_nvcc() -> str | None:
    """$MPK_NVCC, $CUDA_HOME/bin/nvcc, nvcc on PATH, the pip nvidia-cuda-nvcc
    package, /usr/local/cuda/bin/nvcc; None when there is none."""
    env = os.environ.get("MPK_NVCC")
    if env:
        return env if os.access(env, os.X_OK) else None
    cands = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            cands.append(Path(os.environ[var]) / "bin" / "nvcc")
    on_path = shutil.which("nvcc")
    if on_path:
        cands.append(Path(on_path))
    cands += _pip_nvcc_candidates()
    cands.append(Path("/usr/local/cuda/bin/nvcc"))
    for c in cands:
        if c.is_file() and os.access(c, os.X_OK):
            return str(c)
    return None


def _pip_nvcc_candidates() -> list[Path]:
    """Where the nvidia-cuda-nvcc wheels put nvcc (cu12: nvidia/cuda_nvcc/bin, cu13: nvidia/cu13/bin)."""
    out = []
    try:
        import nvidia  # namespace package of the NVIDIA wheels
        roots = [Path(p) for p in getattr(nvidia, "__path__", [])]
    except ImportError:
        roots = []
    for r in roots:
        out += [r / "cuda_nvcc" / "bin" / "nvcc", *sorted(r.glob("cu*/bin/nvcc"), reverse=True)]
    return out


def cuda_arch(arch: str | None = None, device: Any = None) -> str:
    """The architecture suffix, e.g. "90a": the argument, $MPK_CUDA_ARCH
    ("90a", "sm_90a" or "9.0"), else the device's compute capability (9.0 →
    90a, the Hopper features the runtime uses; other X.Y → XY), else 90a."""
    a = arch or os.environ.get("MPK_CUDA_ARCH")
    if a:
        a = a.strip().lower().removeprefix("sm_").removeprefix("compute_")
        if "." in a:
            major, minor = a.split(".", 1)
            a = f"{major}{minor}"
            return "90a" if a == "90" else a
        return a
    try:
        import torch
        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability(device)
            return "90a" if (major, minor) == (9, 0) else f"{major}{minor}"
    except Exception:  # pragma: no cover - a broken CUDA install: fall back to the H100
        pass
    return DEFAULT_ARCH


def extra_flags() -> list[str]:
    """$MPK_NVCC_EXTRA: more nvcc flags for experiments (e.g. a runtime
    constant, -DMPK_INFLIGHT_PAGES=3); part of the cache key."""
    return os.environ.get("MPK_NVCC_EXTRA", "").split()


def nvcc_command(nvcc: str, arch: str, csrc: Path, src: str = MODULE_CU,
                 out: str = MODULE_SO) -> list[str]:
    return [nvcc, *NVCC_FLAGS, *extra_flags(), f"-gencode=arch=compute_{arch},code=sm_{arch}", f"-I{csrc}", src,
            "-o", out]


_nvcc_versions: dict[tuple, str] = {}


def nvcc_version(nvcc: str) -> str:
    st = os.stat(nvcc)
    key = (nvcc, st.st_mtime_ns, st.st_size)
    if key not in _nvcc_versions:
        try:
            r = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError) as e:
            raise BuildError(f"cannot run {nvcc} --version: {e}", hint="set MPK_NVCC to a working nvcc",
                             kind="build") from None
        _nvcc_versions[key] = r.stdout + r.stderr
    return _nvcc_versions[key]


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    return Path(cache_dir or os.environ.get("MPK_CACHE_DIR") or Path.home() / ".cache" / "mpk")


def _headers(csrc: Path) -> list[Path]:
    return sorted(p for p in csrc.rglob("*") if p.is_file() and p.suffix in _HEADER_SUFFIXES)


def cache_key(sources: Mapping[str, str], arch: str, version: str, csrc: Path) -> str:
    """sha256 over the sources, every header under csrc/, the nvcc flags, nvcc
    --version and the architecture. The -I path is left out: two installs
    with the same headers share entries."""
    h = hashlib.sha256()

    def put(tag: str, data: bytes) -> None:
        h.update(tag.encode() + b"\0" + len(data).to_bytes(8, "little") + data)

    put("format", b"mpk-build-1")
    for name in sorted(sources):
        put("source:" + name, sources[name].encode())
    for p in _headers(csrc):
        put("header:" + p.relative_to(csrc).as_posix(), p.read_bytes())
    put("flags", " ".join([*NVCC_FLAGS, *extra_flags()]).encode())
    put("nvcc", version.encode())
    put("arch", arch.encode())
    return h.hexdigest()


def _sha256_file(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def entry_valid(entry: Path) -> bool:
    """A cache entry is usable when module.so's bytes match its recorded sha256."""
    so, side = entry / MODULE_SO, entry / SIDECAR
    try:
        return so.is_file() and side.is_file() and side.read_text().strip() == _sha256_file(so)
    except OSError:
        return False


@contextlib.contextmanager
def _file_lock(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


@dataclass
class BuildInfo:
    path: Path          # module.so
    key: str
    cache_hit: bool
    nvcc_s: float       # seconds in nvcc (0 on a cache hit)
    command: list[str]

    def describe(self) -> str:
        return "nvcc cache hit" if self.cache_hit else f"nvcc {self.nvcc_s:.1f} s"


def build_module(sources: Mapping[str, str], arch: str | None = None,
                 cache_dir: str | os.PathLike | None = None) -> Path:
    """Compiles sources["module.cu"] into module.so (cached); returns its path."""
    return build_module_info(sources, arch, cache_dir).path


def build_module_info(sources: Mapping[str, str], arch: str | None = None,
                      cache_dir: str | os.PathLike | None = None) -> BuildInfo:
    """build_module with the details: cache hit or nvcc time, key, command."""
    if MODULE_CU not in sources:
        raise BuildError(f"no {MODULE_CU} among the generated files ({', '.join(sorted(sources)) or 'none'})",
                         kind="build")
    for name in sources:
        if "/" in name or "\\" in name or name.startswith(".") or name in (MODULE_SO, SIDECAR):
            raise BuildError(f"generated file name {name!r} is not a plain file name", kind="internal")
    nvcc = find_nvcc()
    if nvcc is None:
        raise BuildError("nvcc not found, so the cuda target cannot be built",
                         hint="install the CUDA toolkit or `pip install nvidia-cuda-nvcc`, or set "
                              "MPK_NVCC / CUDA_HOME", kind="build")
    arch = cuda_arch(arch)
    csrc = csrc_dir()
    key = cache_key(sources, arch, nvcc_version(nvcc), csrc)
    root = cache_root(cache_dir)
    entry = root / key[:2] / key
    cmd = nvcc_command(nvcc, arch, csrc)
    if entry_valid(entry):
        return BuildInfo(entry / MODULE_SO, key, True, 0.0, cmd)
    with _file_lock(root / "locks" / (key + ".lock")):
        if entry_valid(entry):  # another process built it while we waited
            return BuildInfo(entry / MODULE_SO, key, True, 0.0, cmd)
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key[:12]}-", dir=entry.parent))
        try:
            for name, text in sources.items():
                (tmp / name).write_text(text)
            nvcc_s, log = _run_nvcc(cmd, tmp, root, key)
            # ptxas's remarks (e.g. C7510: wgmma serialised) are kept beside the module.
            (tmp / "nvcc.log").write_text(log)
            (tmp / SIDECAR).write_text(_sha256_file(tmp / MODULE_SO) + "\n")
            (tmp / "command.txt").write_text(" ".join(cmd) + "\n")
            if entry.exists():  # a corrupted or truncated entry: move it aside, then drop it
                trash = entry.parent / f".trash-{key[:12]}-{os.getpid()}-{time.monotonic_ns()}"
                os.replace(entry, trash)
                shutil.rmtree(trash, ignore_errors=True)
            os.replace(tmp, entry)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return BuildInfo(entry / MODULE_SO, key, False, nvcc_s, cmd)


def _run_nvcc(cmd: list[str], cwd: Path, root: Path, key: str) -> tuple[float, str]:
    """Runs nvcc in cwd; returns its seconds and output."""
    timeout = float(os.environ.get("MPK_NVCC_TIMEOUT", "1800"))
    t0 = time.perf_counter()
    try:
        r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise BuildError(f"nvcc ran past {timeout:.0f} s", hint="set MPK_NVCC_TIMEOUT", kind="build") from None
    except OSError as e:
        raise BuildError(f"cannot run nvcc: {e}", hint="set MPK_NVCC to a working nvcc", kind="build") from None
    dt = time.perf_counter() - t0
    if r.returncode != 0 or not (cwd / MODULE_SO).is_file():
        kept = root / "failed" / key
        shutil.rmtree(kept, ignore_errors=True)
        kept.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(cwd, kept)
        (kept / "nvcc.log").write_text(r.stdout + r.stderr)
        tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-30:])
        raise BuildError(f"nvcc failed (exit {r.returncode}) on the generated module:\n{tail}",
                         hint=f"sources and the full log are in {kept}; command: {' '.join(cmd)}",
                         kind="build")
    return dt, r.stdout + r.stderr


# --------------------------------------------------------------------------
# The launcher extension.
# --------------------------------------------------------------------------

_launcher = None
# The launcher compiled on first use is named apart from the installed one,
# which may be loaded already (built for another torch).
JIT_LAUNCHER = "_launcher_jit"


def load_launcher():
    """mpk._launcher, as installed by setup.py when it was built against this
    torch (a torch C++ extension works with the torch it was compiled for
    only); failing that, compiled here from csrc/launcher/launcher.cpp with
    the host C++ compiler (cached like modules), so a source checkout works
    without installing."""
    global _launcher
    if _launcher is not None:
        return _launcher
    try:
        from . import _launcher as mod  # type: ignore[attr-defined]
    except ImportError:  # not installed, or built against another torch (missing symbols)
        mod = None
    if getattr(mod, "torch_version", None) != torch.__version__:
        mod = _jit_launcher()
    _launcher = mod
    return mod


def launcher_flags() -> tuple[list[str], list[str]]:
    """The compile and link flags of the launcher as a torch C++ extension
    (setup.py's BuildExtension adds the same): torch's headers and libraries,
    the C++ standard and ABI torch builds extensions with, and the torch
    version it was built against."""
    from torch.utils import cpp_extension
    inc = [*cpp_extension.include_paths(), sysconfig.get_paths()["include"], str(csrc_dir())]
    major, minor = (int(v) for v in torch.__version__.split(".")[:2])
    std = "-std=c++20" if (major, minor) >= (2, 12) else "-std=c++17"  # torch's headers need C++20 from 2.12 on
    cflags = ["-O2", std, "-fPIC", f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
              f'-DMPK_TORCH_VERSION="{torch.__version__}"', *(f"-I{i}" for i in inc)]
    ldflags = [*(f"-L{d}" for d in cpp_extension.library_paths()), "-ltorch_python", "-ltorch_cpu", "-lc10", "-ldl"]
    return cflags, ldflags


def _jit_launcher():
    src = Path(__file__).resolve().parent / "csrc" / "launcher" / "launcher.cpp"
    if not src.is_file():
        src = Path(__file__).resolve().parents[2] / "csrc" / "launcher" / "launcher.cpp"
    if not src.is_file():
        raise BuildError("the mpk launcher (mpk._launcher) is not installed and its source is missing",
                         hint="reinstall mpk", kind="build")
    csrc = csrc_dir()
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or "c++"
    cflags, ldflags = launcher_flags()
    cflags.append(f"-DMPK_LAUNCHER_NAME={JIT_LAUNCHER}")
    h = hashlib.sha256(src.read_bytes() + (csrc / "runtime" / "module_abi.h").read_bytes()
                       + " ".join([cxx, *cflags, *ldflags]).encode() + suffix.encode()
                       + sys.version.encode()).hexdigest()
    out_dir = cache_root() / "launcher" / h[:16]
    out = out_dir / (JIT_LAUNCHER + suffix)
    if not out.is_file():
        with _file_lock(cache_root() / "locks" / f"launcher-{h[:16]}.lock"):
            if not out.is_file():
                out_dir.mkdir(parents=True, exist_ok=True)
                tmp = out_dir / f".tmp-{os.getpid()}{suffix}"
                cmd = [cxx, *cflags, "-shared", str(src), "-o", str(tmp), *ldflags]
                r = subprocess.run(cmd, capture_output=True, text=True)
                if r.returncode != 0:
                    raise BuildError("building the mpk launcher failed:\n" +
                                     "\n".join((r.stdout + r.stderr).splitlines()[-20:]),
                                     hint=" ".join(cmd), kind="build")
                os.replace(tmp, out)
    name = f"mpk.{JIT_LAUNCHER}"
    loader = importlib.machinery.ExtensionFileLoader(name, str(out))
    spec = importlib.util.spec_from_file_location(name, str(out), loader=loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    sys.modules[name] = mod
    return mod


# --------------------------------------------------------------------------
# The callable.
# --------------------------------------------------------------------------

def cuda_callable(request, compiled, opts, display_names, returns_sequence, device, gm=None):
    """The callable for the cuda target (or, with the build_only option, a
    callable that holds the core's result and runs the ATen graph `gm` eagerly)."""
    if opts.get("build_only"):
        if gm is None:
            raise MpkError("build_only needs the ATen graph", kind="internal")
        return BuildOnlyGraph(request, compiled, opts, display_names, returns_sequence, gm)
    sources = compiled.result.get("cuda") or {}
    if not sources:
        raise MpkError("cuda target not built yet: the core returned no CUDA sources",
                       hint="use options={'target': 'reference'} for now", kind="not_implemented")
    return CudaGraph(request, compiled, opts, display_names, returns_sequence, device)


class BuildOnlyGraph(CompiledGraph):
    """What the backend returns with build_only: the core's result (for `mpk
    build`), and a call that runs the ATen graph eagerly so tracing code
    that calls the model once still works."""

    def __init__(self, request, compiled, opts, display_names, returns_sequence, gm):
        super().__init__(request, compiled, opts, display_names, returns_sequence)
        self.gm = gm
        self.sources = dict(compiled.result.get("cuda") or {})

    def __call__(self, *args):
        args = unbox(args, len(self.inputs))
        self.calls += 1
        with torch.no_grad():
            return self.gm(*args)

class CudaGraph(CompiledGraph):
    """Builds and loads the module once. A call is one call into the launcher
    (launcher.Call): it checks the arguments (those unchanged since the last
    call that passed skip the checks), looks at the previous launch's status,
    allocates the outputs and launches on torch's current stream. Python
    touches no argument unless the launcher refuses one, to name it."""

    def __init__(self, request, compiled, opts, display_names, returns_sequence, device):
        super().__init__(request, compiled, opts, display_names, returns_sequence)
        if device.type != "cuda":
            raise MpkError(f"target 'cuda' got a graph whose tensors are on {device}",
                           hint="move the model and inputs to a CUDA device, or use "
                                "options={'target': 'reference'}", kind="bad_request")
        self.device = device
        self.sync = bool(opts.get("sync", False))
        self.poison = bool(opts.get("poison", False))
        self.core_ms = float(self.summary.get("core_ms", 0.0))
        self.sources = dict(compiled.result.get("cuda") or {})
        self.build = build_module_info(self.sources, cuda_arch(device=self.device))
        t0 = time.perf_counter()
        self._launcher = load_launcher()
        budget_ms = float(opts.get("wait_budget_ms", DEFAULT_WAIT_BUDGET_MS))
        with torch.cuda.device(self.device):
            self.module = self._launcher.Module(str(self.build.path))
            self._check_module()
            # This callable's own device state: another compile of the same
            # graph loads the same module.so but never shares counters.
            self.instance = self.module.create(int(budget_ms * 1e6))
        self._call = self._launcher.Call(self.instance, self.device, *self.layout, int(self.module.arena_bytes),
                                         self.poison, self.returns_sequence)
        self._stream = torch._C._cuda_getCurrentRawStream  # torch.cuda.current_stream's handle, minus the object
        self._index = self.device.index
        self.load_s = time.perf_counter() - t0
        self.nvcc_s = None if self.build.cache_hit else self.build.nvcc_s
        self.last_status: dict | None = None

    @property
    def launches(self) -> int:
        return self._call.launches

    def _check_module(self) -> None:
        m = self.module
        n_in, n_out = len(self.inputs), len(self.output_specs)
        if (m.num_inputs, m.num_outputs, m.num_slots) != (n_in, n_out, n_in + n_out + 1):
            raise MpkError(f"module {self.build.path} takes {m.num_inputs} inputs, {m.num_outputs} "
                           f"outputs, {m.num_slots} slots; the graph has {n_in} inputs and "
                           f"{n_out} outputs (want {n_in + n_out + 1} slots)", kind="internal")

    def timing(self) -> str:
        """Compile cost after Dynamo: AOTAutograd (or the graph cache), the Go
        core, nvcc (or the cache), loading."""
        front = f"{self.front_timing}, " if self.front_timing else ""
        core = "core cache hit" if self.summary.get("core_cache_hit") else f"core {self.core_ms:.1f} ms"
        return f"{front}{core}, {self.build.describe()}, load {self.load_s:.2f} s"

    def check_status(self) -> None:
        """Reads the status the last finished launch copied to pinned memory
        (the caller made sure it finished); raises MpkRuntimeError (and
        resets the instance) when it aborted."""
        err = self._status_error()
        if err is not None:
            raise err

    def _status_error(self):
        st = self.instance.status()
        self.last_status = st
        if not st.get("aborted"):
            return None
        self.instance.reset()
        return abort_error(st, self.summary)

    def __call__(self, *args):
        if self._host:
            args = self._host_to_device(unbox(args, len(self.inputs)))
        try:
            out = self._call(args, self._stream(self._index))
        except Exception as e:  # noqa: BLE001 - the launcher's refusals become mpk's errors
            raise self._call_error(args, e) from None
        self.calls += 1
        if self.sync:
            torch.cuda.current_stream(self.device).synchronize()
            self.check_status()
        return out

    def _host_to_device(self, args: tuple) -> tuple:
        """The arguments with the graph's CPU inputs copied to its device, on
        the launch stream, as the traced .to() did; a wrong argument is left
        for the checks to name."""
        args = list(args)
        for k in self._host:
            a = args[k] if k < len(args) else None
            if isinstance(a, torch.Tensor) and a.device.type == "cpu":
                args[k] = a.to(self.device, non_blocking=a.is_pinned())
        return tuple(args)

    def _call_error(self, args: tuple, e: Exception) -> Exception:
        L = self._launcher
        if isinstance(e, L.ArgumentRefused):
            return self.argument_error(unbox(args, len(self.inputs)), *e.args)
        if isinstance(e, L.PreviousLaunchAborted):  # it finished since the last call
            return self._status_error() or MpkError("the launcher saw an aborted launch whose status reads "
                                                    "healthy", kind="internal")
        if isinstance(e, L.LaunchFailed):
            return MpkError(f"launching the megakernel failed: {e.args[0]}", kind="runtime")
        return e


# How long one spin-wait of the megakernel may last before it aborts: far
# above any wait of a step (microseconds), far below a hung GPU.
DEFAULT_WAIT_BUDGET_MS = 200.0


def abort_error(st: dict, summary: dict | None = None):
    """The MpkRuntimeError for a status dict from an aborted launch."""
    from .errors import MpkRuntimeError
    code = int(st.get("aborted", 0))
    if code == 2:  # MPK_ABORT_INDEX: event is the op, waited_ns the index (int64)
        op = int(st.get("event", -1))
        labels = (summary or {}).get("op_labels") or []
        nodes = (summary or {}).get("op_nodes") or []
        name = f"op {op}"
        if 0 <= op < len(labels):  # as the reference target names it: kv_write#17 (index_copy_1)
            name = f"{labels[op]}#{op}" + (f" ({nodes[op]})" if op < len(nodes) else "")
        index = int(st.get("waited_ns", 0))
        if index >= 1 << 63:
            index -= 1 << 64
        msg = (f"the megakernel stopped: {name} read index {index}, out of range for size {st.get('needed')} "
               f"(task {st.get('task')}, worker {st.get('worker')}); nothing was written at that index")
        return MpkRuntimeError(msg, hint="an input index is past its tensor: a token id at or above the vocabulary "
                                         "size, or a KV-cache write past the cache's capacity; the module was reset",
                               kind="runtime")
    what = {1: "a spin-wait ran past its budget"}.get(code, f"abort code {code}")
    ms = int(st.get("waited_ns", 0)) / 1e6
    msg = (f"the megakernel aborted: {what}\n"
           f"  worker {st.get('worker')} waited on event {st.get('event')} before task {st.get('task')}: "
           f"count {st.get('count')} of {st.get('needed')} needed, after {ms:.1f} ms")
    return MpkRuntimeError(msg, hint="the module was reset; a hang like this is a compiler bug: "
                                     "rerun with MPK_DUMP_REQUEST=req.json and report it",
                           kind="runtime")
