"""The cuda target's build path, without a GPU: `python -m mpk build` (the Go
core's generated CUDA through the real nvcc, where one is found), the nvcc
cache (with a fake nvcc), and the launcher against a fake module in plain C."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mpk import backend, build, build_cli
from mpk.errors import MpkError

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------
# python -m mpk build: a codegen regression that nvcc rejects fails here.
# ---------------------------------------------------------------------------

def test_build_command_tiny_llama(core_lib, fresh_dynamo, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MPK_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "out"
    rc = build_cli.main(["--model", "tiny-llama", "--out", str(out)])
    text = capsys.readouterr().out
    last = text.strip().splitlines()[-1]
    if "the core returned no CUDA sources" in text:
        pytest.xfail("the Go core does not emit CUDA for the cuda target yet")
    assert last.startswith("BUILT "), text
    assert (out / "module.cu").is_file(), text
    assert (out / "summary.txt").read_text(), text
    if build.find_nvcc() is None:
        assert rc == 0 and last.endswith("nvcc skipped"), text
        return
    assert last.endswith("nvcc ok"), text
    assert rc == 0
    assert (out / "module.so").stat().st_size > 0
    n_tasks = int(last.split()[1])
    assert n_tasks > 0


def test_build_wgmma_not_serialised(core_lib, fresh_dynamo, tmp_path, monkeypatch, capsys):
    """Option wgmma (on by default): a 64-token chunk's GEMM streams become linear_wgmma,
    inlined into the megakernel, and ptxas keeps their wgmmas pipelined
    (it serialises every wgmma of a kernel when one sits in a called
    function, C7510, or lacks registers, C7512: a silent loss of the tensor
    cores' rate, so it fails here)."""
    if build.find_nvcc() is None:
        pytest.skip("no nvcc")
    monkeypatch.setenv("MPK_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "out"
    rc = build_cli.main(["--model", "wide-llama", "--prefill", "64", "--cache-tokens", "64",
                         "--out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0 and text.strip().splitlines()[-1].endswith("nvcc ok"), text
    src = (out / "module.cu").read_text()
    assert "__forceinline__ uint32_t variant" in src and "mpk::linear_wgmma<" in src
    logs = list((tmp_path / "cache").rglob("nvcc.log"))
    assert len(logs) == 1, logs
    assert "are serialized" not in logs[0].read_text(), logs[0].read_text()


@pytest.mark.parametrize("batch", [1, 4])
def test_build_head_dim_192(core_lib, fresh_dynamo, tmp_path, monkeypatch, capsys, batch):
    """A Llama config with head dim 192 (its RoPE folded into the decode
    attention, whose K and V rows suit neither the kv_pages task's vector
    loads nor whole ring pages) builds: codegen's kvPageDims keeps such rows
    off the ring, where nvcc used to stop at attention_kv_pages' static
    asserts."""
    if build.find_nvcc() is None:
        pytest.skip("no nvcc")
    from transformers import LlamaConfig
    LlamaConfig(vocab_size=512, hidden_size=768, intermediate_size=512, num_hidden_layers=1, num_attention_heads=4,
                num_key_value_heads=2, head_dim=192, max_position_embeddings=1024).save_pretrained(tmp_path / "cfg")
    monkeypatch.setenv("MPK_CACHE_DIR", str(tmp_path / "cache"))
    rc = build_cli.main(["--config", str(tmp_path / "cfg" / "config.json"), "--dtype", "bfloat16", "--cache-tokens",
                         "512", "--batch", str(batch), "--out", str(tmp_path / "out")])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert rc == 0 and last.endswith("nvcc ok"), last


def wide_x_config(path):
    """A one-layer Llama of hidden size 2,048 (llama-3.2-1b's): at batch 16
    its normed x with the low part (133 KB) is staged in two parts of K
    under wide_x_parts, the gate and up pair's too."""
    from transformers import LlamaConfig
    LlamaConfig(vocab_size=1024, hidden_size=2048, intermediate_size=2048, num_hidden_layers=1,
                num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=1024).save_pretrained(path)
    return str(path / "config.json")


def test_build_wide_x_parts(core_lib, fresh_dynamo, tmp_path, monkeypatch, capsys):
    """wide_x_parts builds for nvcc: batch 16's normed x (q/k/v, and the
    gate and up pair) staged in two parts of K beside the plain x of o and
    down, every tile stream's x within a part, so the ring keeps 8 pages."""
    if build.find_nvcc() is None:
        pytest.skip("no nvcc")
    monkeypatch.setenv("MPK_CACHE_DIR", str(tmp_path / "cache"))
    rc = build_cli.main(["--config", wide_x_config(tmp_path / "cfg"), "--dtype", "bfloat16", "--cache-tokens", "512",
                         "--batch", "16", "--wide-x-parts", "--out", str(tmp_path / "out")])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert rc == 0 and last.endswith("nvcc ok"), last
    src = (tmp_path / "out" / "module.cu").read_text()
    tiles = [ln for ln in src.splitlines() if "mpk::linear_tiles<" in ln]
    assert any("mpk::NormPro, mpk::NoEpi, 2>" in ln for ln in tiles), tiles
    assert any("mpk::NormPro, mpk::PairEpi<" in ln and ln.endswith(", 2>(op, lo, hi, s, c);") for ln in tiles), tiles
    assert all(ln.endswith(", 2>(op, lo, hi, s, c);") for ln in tiles), tiles
    assert "constexpr int kSizedRingPages = 8;" in src


def test_build_kv_swizzle(core_lib, fresh_dynamo, tmp_path, monkeypatch, capsys):
    """kv_swizzle builds for nvcc: a masked batch of small-llama (head dim 64)
    whose kv_pages tasks take swizzled pages (the loader's boxes of the
    caches' tensor maps, kv_batch_mma's swizzled ldmatrix addresses)."""
    if build.find_nvcc() is None:
        pytest.skip("no nvcc")
    monkeypatch.setenv("MPK_CACHE_DIR", str(tmp_path / "cache"))
    rc = build_cli.main(["--model", "small-llama", "--dtype", "bfloat16", "--cache-tokens", "300", "--batch", "4",
                         "--mask", "--workers", "16", "--kv-swizzle", "--out", str(tmp_path / "out")])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert rc == 0 and last.endswith("nvcc ok"), last
    src = (tmp_path / "out" / "module.cu").read_text()
    assert "kKVLive, true, true, true>(op, lo, hi, s, c)" in src
    assert re.search(r"\{\d+, 128, \d+, 16, \d+, 128, 16, 16, 128, 0\}", src), "no swizzled kv tensor map"


# The micro-benchmarks in bench/ include the task library: a change to it that
# breaks one (a name defined twice, a macro that shadows a template argument)
# fails here, not on the GPU machine. gemm_task.cu also as the split-x body
# of a decode batch (its template arguments differ the most).
@pytest.mark.parametrize("name,flags", [(p.name, ()) for p in sorted((ROOT / "bench").glob("*.cu"))] +
                         [("gemm_task.cu", ("-DWGMMA=6", "-DDECODE_BATCH=8"))])
def test_bench_sources_compile(tmp_path, name, flags):
    nvcc = build.find_nvcc()
    if nvcc is None:
        pytest.skip("no nvcc")
    cmd = [nvcc, "-O1", "-std=c++17", "--expt-relaxed-constexpr", "-gencode=arch=compute_90a,code=sm_90a",
           f"-I{ROOT / 'csrc'}", *flags, "-c", str(ROOT / "bench" / name), "-o", str(tmp_path / "b.o")]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:]


def test_cli_dispatch():
    from mpk.__main__ import main
    with pytest.raises(SystemExit) as ei:
        main(["build", "--help"])
    assert ei.value.code == 0
    with pytest.raises(SystemExit) as ei:
        main(["validate-suite", "--help"])
    assert ei.value.code == 0


# ---------------------------------------------------------------------------
# Options.
# ---------------------------------------------------------------------------

def test_options_build_only_without_gpu(monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    o = backend.resolve_options({"target": "cuda", "build_only": True})
    assert o["wire"]["num_workers"] == backend.DEFAULT_REFERENCE_WORKERS
    assert o["build_only"] and not o["sync"] and not o["poison"]
    with pytest.raises(MpkError, match="needs a CUDA device"):
        backend.resolve_options({"target": "cuda"})
    o = backend.resolve_options({"target": "reference", "sync": True})
    assert o["sync"] and o["poison"]  # reference poisons by default
    o = backend.resolve_options({"target": "cuda", "num_workers": 8, "poison": True})
    assert o["poison"] and o["wire"]["num_workers"] == 8
    with pytest.raises(MpkError, match="unknown mpk option"):
        backend.resolve_options({"target": "cuda", "synch": True})


def test_cuda_arch(monkeypatch):
    monkeypatch.delenv("MPK_CUDA_ARCH", raising=False)
    assert build.cuda_arch("9.0") == "90a"
    assert build.cuda_arch("sm_90a") == "90a"
    assert build.cuda_arch("8.9") == "89"
    assert build.cuda_arch("100a") == "100a"
    monkeypatch.setenv("MPK_CUDA_ARCH", "compute_80")
    assert build.cuda_arch() == "80"
    cmd = build.nvcc_command("nvcc", "90a", Path("/x/csrc"))
    assert "-gencode=arch=compute_90a,code=sm_90a" in cmd and "-I/x/csrc" in cmd
    assert cmd[-2:] == ["-o", "module.so"]


def test_csrc_dir_has_the_abi():
    assert (build.csrc_dir() / "runtime" / "module_abi.h").is_file()


# ---------------------------------------------------------------------------
# The cache, with a fake nvcc that counts its compiles.
# ---------------------------------------------------------------------------

FAKE_NVCC = """\
#!{python}
import os, sys, time
args = sys.argv[1:]
if args == ["--version"]:
    print("fake nvcc, release 0.0")
    sys.exit(0)
with open(os.environ["FAKE_NVCC_COUNT"], "a") as f:
    f.write("x")
time.sleep(float(os.environ.get("FAKE_NVCC_SLEEP", "0")))
if os.environ.get("FAKE_NVCC_FAIL"):
    sys.stderr.write("module.cu(3): error: boom\\n")
    sys.exit(2)
out = args[args.index("-o") + 1]
src = open(args[args.index("-o") - 1]).read()
with open(out, "wb") as f:
    f.write(b"\\x7fELF fake module " + src.encode() * 100)
"""


@pytest.fixture
def fake_nvcc(tmp_path, monkeypatch):
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text(FAKE_NVCC.format(python=sys.executable))
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    count = tmp_path / "count"
    count.write_text("")
    monkeypatch.setenv("MPK_NVCC", str(nvcc))
    monkeypatch.setenv("FAKE_NVCC_COUNT", str(count))
    monkeypatch.setenv("MPK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("FAKE_NVCC_FAIL", raising=False)
    return lambda: len(count.read_text())


SOURCES = {"module.cu": '#include "runtime/module_abi.h"\nint x;\n', "tables.txt": "t\n"}


def test_cache_hit_skips_nvcc(fake_nvcc):
    a = build.build_module_info(SOURCES, arch="90a")
    assert not a.cache_hit and fake_nvcc() == 1
    assert a.path.name == "module.so" and build.entry_valid(a.path.parent)
    assert (a.path.parent / "tables.txt").read_text() == "t\n"
    b = build.build_module_info(SOURCES, arch="90a")
    assert b.cache_hit and b.path == a.path and fake_nvcc() == 1
    assert build.build_module(SOURCES, arch="90a") == a.path and fake_nvcc() == 1
    # anything that changes the binary changes the key
    c = build.build_module_info({**SOURCES, "module.cu": SOURCES["module.cu"] + "int y;\n"}, arch="90a")
    d = build.build_module_info(SOURCES, arch="89")
    assert len({a.key, c.key, d.key}) == 3 and fake_nvcc() == 3


def test_cache_key_covers_headers(fake_nvcc, tmp_path, monkeypatch):
    csrc = tmp_path / "csrc"
    shutil.copytree(build.csrc_dir(), csrc)
    monkeypatch.setenv("MPK_CSRC", str(csrc))
    a = build.build_module_info(SOURCES, arch="90a")
    with open(csrc / "runtime" / "module_abi.h", "a") as f:
        f.write("\n// changed\n")
    b = build.build_module_info(SOURCES, arch="90a")
    assert a.key != b.key and fake_nvcc() == 2


@pytest.mark.parametrize("damage", ["truncate", "flip", "no_sidecar", "no_so"])
def test_corrupted_entry_is_rebuilt(fake_nvcc, damage):
    a = build.build_module_info(SOURCES, arch="90a")
    so = a.path
    data = so.read_bytes()
    if damage == "truncate":
        so.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        so.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    elif damage == "no_sidecar":
        (so.parent / build.SIDECAR).unlink()
    else:
        so.unlink()
    assert not build.entry_valid(so.parent)
    b = build.build_module_info(SOURCES, arch="90a")
    assert not b.cache_hit and fake_nvcc() == 2
    assert b.path == a.path and build.entry_valid(b.path.parent) and b.path.read_bytes() == data
    assert build.build_module_info(SOURCES, arch="90a").cache_hit


def test_nvcc_failure_raises_with_stderr(fake_nvcc, monkeypatch, tmp_path):
    monkeypatch.setenv("FAKE_NVCC_FAIL", "1")
    with pytest.raises(build.BuildError) as ei:
        build.build_module(SOURCES, arch="90a")
    e = ei.value
    assert "nvcc failed" in str(e) and "error: boom" in str(e) and e.kind == "build"
    kept = list((tmp_path / "cache" / "failed").iterdir())
    assert len(kept) == 1 and (kept[0] / "module.cu").is_file() and "boom" in (kept[0] / "nvcc.log").read_text()
    # nothing half-built is left in the cache: the next try compiles again
    monkeypatch.delenv("FAKE_NVCC_FAIL")
    assert not build.build_module_info(SOURCES, arch="90a").cache_hit


def test_missing_nvcc_and_module_cu(fake_nvcc, monkeypatch, tmp_path):
    with pytest.raises(build.BuildError, match="no module.cu"):
        build.build_module({"other.cu": ""})
    monkeypatch.setenv("MPK_NVCC", str(tmp_path / "nope"))
    assert build.find_nvcc() is None
    with pytest.raises(build.BuildError, match="nvcc not found"):
        build.build_module(SOURCES)


def test_two_processes_build_at_once(fake_nvcc, monkeypatch):
    monkeypatch.setenv("FAKE_NVCC_SLEEP", "1.0")
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT / 'python')!r})
        from mpk import build
        info = build.build_module_info({SOURCES!r}, arch="90a")
        print(info.path, info.cache_hit)
    """)
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(3)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    paths = {o.split()[0] for o, _ in outs}
    hits = sorted(o.split()[1] for o, _ in outs)
    assert len(paths) == 1 and hits == ["False", "True", "True"], outs
    assert fake_nvcc() == 1
    entry = Path(paths.pop()).parent
    assert build.entry_valid(entry)
    assert not [p for p in entry.parent.iterdir() if p.name.startswith((".tmp", ".trash"))]


# ---------------------------------------------------------------------------
# The launcher, against a fake module in plain C (no CUDA).
# ---------------------------------------------------------------------------

FAKE_MODULE = r"""
#include <stdlib.h>
#include <string.h>
#include "runtime/module_abi.h"
struct MpkInstance { int launches, aborted; void* last_stream; uint64_t budget; };
int32_t mpk_num_slots(void) { return 4; }
int32_t mpk_num_inputs(void) { return 2; }
int32_t mpk_num_outputs(void) { return 1; }
int32_t mpk_num_workers(void) { return 7; }
int32_t mpk_num_tasks(void) { return 11; }
uint64_t mpk_arena_bytes(void) { return 4096; }
int32_t mpk_create(uint64_t budget, MpkInstance** out, char* err, int32_t n) {
  if (budget == 0) { strncpy(err, "no budget", n); return 3; }
  *out = calloc(1, sizeof(MpkInstance));
  (*out)->budget = budget;
  return 0;
}
int32_t mpk_launch(MpkInstance* in, void* const* slots, void* stream, char* err, int32_t n) {
  if (slots[0] == 0) { strncpy(err, "slot 0 is null", n); return 5; }
  in->launches++; in->last_stream = stream;
  if ((long)slots[3] == 0xdead) in->aborted = 1;
  return 0;
}
void mpk_status(const MpkInstance* in, MpkStatus* s) {
  memset(s, 0, sizeof *s);
  s->aborted = in->aborted; s->worker = 3; s->task = in->launches; s->event = 9;
  s->count = 1; s->needed = 2; s->waited_ns = (uint64_t)(long)in->last_stream + in->budget;
}
int32_t mpk_poll(MpkInstance* in, void* stream, MpkStatus* s) { return 0; }
int32_t mpk_reset(MpkInstance* in) { in->aborted = 0; return 0; }
void mpk_destroy(MpkInstance* in) { free(in); }
int32_t mpk_trace(void* out, int32_t n) { return 0; }
"""


@pytest.fixture(scope="module")
def fake_module(tmp_path_factory, build_shared):
    d = tmp_path_factory.mktemp("fakemod")
    (d / "m.c").write_text(FAKE_MODULE)
    build_shared(d / "m.c", d / "m.so", f"-I{build.csrc_dir()}")
    (d / "bad.c").write_text("int mpk_num_slots(void) { return 1; }\n")
    build_shared(d / "bad.c", d / "bad.so")
    return d


def test_launcher_calls_the_module_abi(fake_module):
    L = build.load_launcher()
    m = L.Module(str(fake_module / "m.so"))
    assert (m.num_slots, m.num_inputs, m.num_outputs, m.num_workers, m.num_tasks, m.arena_bytes) == \
        (4, 2, 1, 7, 11, 4096)
    with pytest.raises(RuntimeError, match="mpk_create failed.*no budget"):
        m.create(0)
    a, b = m.create(1000), m.create(2000)
    with pytest.raises(RuntimeError, match="got 3 pointer slots, the module takes 4"):
        a.launch([1, 2, 3], 0)
    with pytest.raises(RuntimeError, match="slot 0 is null"):
        a.launch([0, 2, 3, 4], 0)
    a.launch([1, 2, 3, 4], 12345)
    assert a.status() == {"aborted": 0, "worker": 3, "task": 1, "event": 9, "count": 1, "needed": 2,
                          "waited_ns": 12345 + 1000}
    a.launch([1, 2, 3, 0xdead], 0)
    st = a.status()
    assert st["aborted"] == 1 and st["task"] == 2
    # Each instance has its own state: b neither launched nor aborted.
    assert b.status()["aborted"] == 0 and b.status()["task"] == 0
    err = build.abort_error(st)
    assert err.kind == "runtime"
    assert "worker 3 waited on event 9 before task 2: count 1 of 2 needed" in str(err)
    a.reset()
    assert a.status()["aborted"] == 0
    del m  # instances keep their module alive
    b.launch([1, 2, 3, 4], 7)
    assert b.status()["task"] == 1


def test_launcher_errors_name_the_problem(fake_module, tmp_path):
    L = build.load_launcher()
    with pytest.raises(RuntimeError, match="does not export mpk_num_inputs"):
        L.Module(str(fake_module / "bad.so"))
    with pytest.raises(RuntimeError, match="cannot load mpk module"):
        L.Module(str(tmp_path / "missing.so"))


def test_jit_launcher_builds_without_install(tmp_path, fake_module):
    """Without an installed mpk._launcher built for this torch, mpk compiles it
    (as mpk._launcher_jit, into the cache; in a fresh process, whose cache is
    empty)."""
    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("no C++ compiler")
    code = textwrap.dedent(f"""
        import sys
        import torch
        sys.path.insert(0, {str(ROOT / 'python')!r})
        from mpk import build
        mod = build._jit_launcher()
        assert mod.__name__ == "mpk._launcher_jit" and mod.torch_version == torch.__version__
        print(mod.Module({str(fake_module / 'm.so')!r}).num_tasks)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "MPK_CACHE_DIR": str(tmp_path)})
    assert r.returncode == 0 and r.stdout.strip() == "11", r.stdout + r.stderr
    assert list((tmp_path / "launcher").rglob("_launcher_jit*"))
