"""The call path of the cuda target's callable (launcher.Call: the host work of
one call in C++), on CPU tensors against a fake module in plain C: the pointer
table, the fast path for arguments unchanged since the last call that passed,
the checks of changed ones (each refusal named by the Python checks as the
reference target words them), the outputs, the status poll and a failed
launch. On a GPU: a step that aborts without `sync` raises at the next call,
and decode steps recheck only the arguments that changed."""

from __future__ import annotations

import ctypes
import inspect

import pytest
import torch

from mpk import build, check
from mpk.errors import MpkRuntimeError
from mpk.models import cache_kw
from test_hardening import _compile_affine, _two_writes

FAKE = r"""
#include <string.h>
#include <stdlib.h>
#include "runtime/module_abi.h"
struct MpkInstance { int pending, aborted; };
void* fake_slots[N_IN + N_OUT + 1];
void* fake_stream;
int fake_launches, fake_abort, fake_fail;
int32_t mpk_num_slots(void) { return N_IN + N_OUT + 1; }
int32_t mpk_num_inputs(void) { return N_IN; }
int32_t mpk_num_outputs(void) { return N_OUT; }
int32_t mpk_num_workers(void) { return 1; }
int32_t mpk_num_tasks(void) { return 1; }
uint64_t mpk_arena_bytes(void) { return 256; }
int32_t mpk_create(uint64_t budget, MpkInstance** out, char* err, int32_t n) {
  *out = calloc(1, sizeof(MpkInstance));
  return 0;
}
int32_t mpk_launch(MpkInstance* in, void* const* slots, void* stream, char* err, int32_t n) {
  if (fake_fail) { strncpy(err, "fake failure", n); return 7; }
  memcpy(fake_slots, slots, sizeof fake_slots);
  fake_stream = stream;
  fake_launches++;
  in->pending = 1;
  in->aborted = fake_abort;
  return 0;
}
void mpk_status(const MpkInstance* in, MpkStatus* s) {
  memset(s, 0, sizeof *s);
  s->aborted = in->aborted; s->worker = 1; s->event = 2; s->count = 3; s->needed = 4;
}
int32_t mpk_poll(MpkInstance* in, void* stream, MpkStatus* s) {
  if (!in->pending) return 0;
  in->pending = 0;
  mpk_status(in, s);
  return 1;
}
int32_t mpk_reset(MpkInstance* in) { in->aborted = in->pending = 0; return 0; }
void mpk_destroy(MpkInstance* in) { free(in); }
int32_t mpk_trace(void* out, int32_t n) { return 0; }
"""


@pytest.fixture(scope="module")
def fake_module(tmp_path_factory, build_shared):
    """fake_module(n_in, n_out): the path of a fake module taking that many."""
    d = tmp_path_factory.mktemp("fakecall")
    (d / "m.c").write_text(FAKE)
    built = {}

    def make(n_in: int, n_out: int):
        if (n_in, n_out) not in built:
            built[n_in, n_out] = build_shared(d / "m.c", d / f"m{n_in}_{n_out}.so", f"-DN_IN={n_in}",
                                              f"-DN_OUT={n_out}", f"-I{build.csrc_dir()}")
        return built[n_in, n_out]
    return make


class Fake:
    """A launcher.Call on an instance of a fake module, and the module's globals."""

    def __init__(self, path, layout, device=torch.device("cpu"), poison=False, returns_sequence=True):
        self.L = build.load_launcher()
        module = self.L.Module(str(path))
        self.instance = module.create(1)
        self.call = self.L.Call(self.instance, device, *layout, module.arena_bytes, poison, returns_sequence)
        self.lib = ctypes.CDLL(str(path))  # the same library the launcher loaded: its globals are shared
        for name in ("fake_launches", "fake_abort", "fake_fail"):
            self.int(name).value = 0

    def int(self, name: str) -> ctypes.c_int:
        return ctypes.c_int.in_dll(self.lib, name)

    def slots(self) -> list[int]:
        n = len(self.call.slots)
        return [p or 0 for p in (ctypes.c_void_p * n).in_dll(self.lib, "fake_slots")]

    def refused(self, args) -> tuple[int, str]:
        with pytest.raises(self.L.ArgumentRefused) as ei:
            self.call(tuple(args), 0)
        return ei.value.args


def _message(fn, fake: Fake, args) -> str:
    """What the cuda target's callable raises for args the launcher refuses."""
    return str(fn.argument_error(args, *fake.refused(args)))


def test_pointer_table_and_fast_path(core_lib, fresh_dynamo, fake_module):
    _, fn = _compile_affine()
    f = Fake(fake_module(2, 1), fn.layout)
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    (out,) = f.call((x, y), 1234)
    assert out.shape == (4, 8) and out.dtype == torch.float32 and f.call.checked == 2
    arena = f.slots()[3]
    assert f.slots() == [x.data_ptr(), y.data_ptr(), out.data_ptr(), arena] == f.call.slots and arena != 0
    assert ctypes.c_void_p.in_dll(f.lib, "fake_stream").value == 1234
    for _ in range(3):  # the same tensors: no check, the same table
        (out,) = f.call((x, y), 0)
    (out,) = f.call(([x, y],), 0)  # AOTAutograd's boxed convention
    assert f.call.checked == 2 and f.call.launches == 5 and f.int("fake_launches").value == 5
    assert f.slots() == [x.data_ptr(), y.data_ptr(), out.data_ptr(), arena]
    y2 = torch.randn(4, 8)
    (out,) = f.call((x, y2), 0)  # a new tensor is checked, the other is not
    assert f.call.checked == 3 and f.slots() == [x.data_ptr(), y2.data_ptr(), out.data_ptr(), arena]
    v = torch.randn(5, 8)[1:]  # a view: its slot is its first element
    f.call((v, y2), 0)
    assert f.call.checked == 4 and f.slots()[0] == v.data_ptr() != v.untyped_storage().data_ptr()


def _resize(t):
    t.resize_(2, 8)


def _free(t):
    t.untyped_storage().resize_(0)


def _shrink(t):
    t.untyped_storage().resize_(16 * 4)


def _transpose(t):
    t.as_strided_((4, 8), (1, 4))


def _retype(t):
    t.data = t.view(torch.int32)  # the same tensor object, its storage now read as int32


@pytest.mark.parametrize("change,expect", [
    (_resize, "argument 0 (arg0_1, l_x_) has shape [2, 8], compiled for [4, 8]"),
    (_free, "argument 0 (arg0_1, l_x_) has no storage (freed, or resized to 0 bytes)"),
    (_shrink, "argument 0 (arg0_1, l_x_) needs 128 bytes of storage, its storage holds 64"),
    (_transpose, "argument 0 (arg0_1, l_x_) has strides [1, 4], compiled for [8, 1]"),
    (_retype, "argument 0 (arg0_1, l_x_) has dtype int32, compiled for float32"),
])
def test_a_changed_tensor_is_checked_again(core_lib, fresh_dynamo, fake_module, change, expect):
    """The same tensor object, changed in place after a call that passed,
    leaves the fast path and is refused."""
    _, fn = _compile_affine()
    f = Fake(fake_module(2, 1), fn.layout)
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    f.call((x, y), 0)
    change(x)
    assert f.refused((x, y))[0] == 0
    assert expect in _message(fn, f, (x, y))
    assert f.int("fake_launches").value == 1  # nothing launched
    x = torch.randn(4, 8)
    f.call((x, y), 0)  # still usable
    assert f.call.launches == 2


def test_bad_arguments_are_named(core_lib, fresh_dynamo, fake_module):
    _, fn = _compile_affine()
    f = Fake(fake_module(2, 1), fn.layout)
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    cases = [
        ((x, y.double()), 1, "argument 1 (arg1_1, l_y_) has dtype float64, compiled for float32"),
        ((x, torch.randn(4, 8, device="meta")), 1,
         "argument 1 (arg1_1, l_y_) is on meta, the graph was compiled for cpu"),
        ((x, torch.randn(8, 4).t()), 1, "argument 1 (arg1_1, l_y_) has strides [1, 4], compiled for [8, 1]"),
        ((2.0, y), 0, "argument 0 (arg0_1, l_x_) must be a tensor, got float"),
        ((x,), -1, "compiled graph takes 2 arguments, got 1"),
    ]
    for args, index, expect in cases:
        assert f.refused(args)[0] == index, expect
        assert expect in _message(fn, f, args)
    # Inputs that are only read may share memory.
    x1 = torch.randn(4, 8)
    f.call((x1, x1), 0)
    assert f.int("fake_launches").value == 1


def test_bulk_inputs_must_be_aligned(core_lib, fresh_dynamo, fake_module):
    """An input the kernel reads with bulk copies (the cuda target's streamed
    weights and kv_pages caches: the core's bulk_inputs) must start on a
    16-byte boundary: a view 4 bytes in is refused and named, where the bulk
    copy would fault on the GPU; the same view of another input passes."""
    _, fn = _compile_affine()
    fn._bulk = frozenset({1})
    f = Fake(fake_module(2, 1), fn._layout())
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    off = torch.randn(33)[1:].view(4, 8)  # 4 bytes past an aligned allocation
    assert f.refused((x, off))[0] == 1
    assert "argument 1 (arg1_1, l_y_) has its data at an address that is not 16-byte aligned" in _message(fn, f, (x, off))
    f.call((off, y), 0)  # argument 0 is not read in bulk
    assert f.int("fake_launches").value == 1


def test_written_inputs_may_not_overlap(core_lib, fresh_dynamo, fake_module):
    compiled = []
    cf = torch.compile(_two_writes, backend="mpk", options={"target": "reference", "on_compile": compiled.append},
                       fullgraph=True, dynamic=False)
    with torch.no_grad():
        cf(torch.ones(3, 4), torch.ones(3, 4))
    fn = compiled[-1]
    assert fn._written == {0, 1}
    f = Fake(fake_module(2, 1), fn.layout)
    x = torch.ones(3, 4)
    assert "argument 0 (arg0_1, l_a_) overlaps argument 1 (arg1_1, l_b_) in memory" in _message(fn, f, (x, x))
    buf = torch.ones(5, 4)
    assert "overlaps" in _message(fn, f, (buf[0:3], buf[2:5]))
    buf = torch.ones(6, 4)
    a, b = buf[0:3], buf[3:6]
    f.call((a, b), 0)  # disjoint views of one buffer
    # One argument changes to overlap the other, which is unchanged.
    assert f.refused((a, buf[2:5]))[0] == 1
    assert "overlaps" in _message(fn, f, (a, buf[2:5]))
    assert f.call.launches == 1


def test_outputs_views_of_inputs_and_offsets(fake_module):
    """A view of an input (kind "input") and a new tensor at an offset into its
    own buffer, NaN-filled with poison; the arena is allocated once."""
    f32 = torch.float32
    layout = ([(f32, [4, 8], [8, 1], False)],
              [("input", f32, [8], [1], 8, 0, 0), ("new", f32, [2, 2], [1, 2], 3, 7, -1)])
    f = Fake(fake_module(1, 2), layout, poison=True)
    base = torch.randn(5, 8)
    x = base[1:]
    row, new = f.call((x,), 0)
    assert row.data_ptr() == x[1].data_ptr() and torch.equal(row, x[1])
    assert new.shape == (2, 2) and new.stride() == (1, 2) and new.storage_offset() == 3
    assert new.untyped_storage().nbytes() == 7 * 4 and bool(new.isnan().all())
    arena = f.slots()[3]
    assert f.slots()[:3] == [x.data_ptr(), row.data_ptr(), new.data_ptr()]
    f.call((x,), 0)
    assert f.slots()[3] == arena
    single = Fake(fake_module(1, 1), (layout[0], layout[1][1:]), returns_sequence=False)
    assert isinstance(single.call((x,), 0), torch.Tensor)


def test_status_poll_and_failed_launch(fake_module):
    layout = ([(torch.float32, [2], [1], False)], [("new", torch.float32, [2], [1], 0, 0, -1)])
    f = Fake(fake_module(1, 1), layout)
    x = torch.randn(2)
    f.int("fake_abort").value = 1
    f.call((x,), 0)  # launches; the fake's status says it aborted
    f.int("fake_abort").value = 0
    with pytest.raises(f.L.PreviousLaunchAborted):  # seen before the next launch
        f.call((x,), 0)
    assert f.instance.status()["aborted"] == 1 and f.call.launches == 1
    f.instance.reset()
    f.call((x,), 0)
    f.call((x,), 0)  # the poll saw a healthy status
    f.int("fake_fail").value = 1
    with pytest.raises(f.L.LaunchFailed, match=r"mpk_launch failed \(code 7\): fake failure"):
        f.call((x,), 0)
    assert f.call.launches == 3


def test_decode_step_reaches_the_callable_without_aot_autograd(core_lib, fresh_dynamo, monkeypatch):
    """Through torch.compile, a decode step's arguments go from Dynamo's code to
    the compiled callable with no AOTAutograd runtime wrapper between them (it
    would walk every argument in Python each call)."""
    from mpk import compiled as compiled_mod
    check.ensure_backend_registered()
    m, cache = check.decode_setup("tiny-llama", 8, dtype=torch.float32, device="cpu", extra=4)
    step = torch.compile(m, backend="mpk", fullgraph=True, dynamic=False, options={"target": "reference"})
    tok = torch.tensor([[5]])
    with torch.no_grad():
        step(input_ids=tok, **cache_kw(cache), use_cache=True)
        callers = []
        plain = compiled_mod.CompiledGraph.__call__

        def spy(self, *args):
            callers.extend(f.filename for f in inspect.stack()[1:8])
            return plain(self, *args)
        monkeypatch.setattr(compiled_mod.CompiledGraph, "__call__", spy)
        step(input_ids=tok, **cache_kw(cache), use_cache=True)
    assert callers and not [f for f in callers if "_functorch" in f], callers


# --- on a GPU ---------------------------------------------------------------------------

@pytest.mark.gpu
@torch.no_grad()
def test_abort_without_sync_raises_at_the_next_call(core_lib, fresh_dynamo):
    """A step with a token id at the vocabulary size aborts; without `sync`
    the call returns, and the next call (which finds the launch finished)
    raises MpkRuntimeError naming the op and index; then steps run again."""
    check.ensure_backend_registered()
    m, cache = check.decode_setup("tiny-llama", 8, extra=8)
    compiled = []
    step = torch.compile(m, backend="mpk", fullgraph=True, dynamic=False,
                         options={"target": "cuda", "on_compile": compiled.append})
    good = torch.tensor([[5]], device="cuda")
    step(input_ids=good, **cache_kw(cache), use_cache=True)
    step(input_ids=torch.tensor([[m.config.vocab_size]], device="cuda"), **cache_kw(cache), use_cache=True)
    torch.cuda.synchronize()
    with pytest.raises(MpkRuntimeError) as e:
        step(input_ids=good, **cache_kw(cache), use_cache=True)
    assert "embedding" in str(e.value) and f"index {m.config.vocab_size}" in str(e.value), str(e.value)
    step(input_ids=good, **cache_kw(cache), use_cache=True)
    torch.cuda.synchronize()
    fn = compiled[-1]
    assert fn.instance.status()["aborted"] == 0 and fn.launches == 3


@pytest.mark.gpu
@torch.no_grad()
def test_decode_steps_recheck_only_what_changed(core_lib, fresh_dynamo):
    """Through torch.compile, a step rechecks no argument when called with the
    same tensors, and only the new token ids (a tensor or two) otherwise."""
    check.ensure_backend_registered()
    m, cache = check.decode_setup("tiny-llama", 8, extra=8)
    compiled = []
    step = torch.compile(m, backend="mpk", fullgraph=True, dynamic=False,
                         options={"target": "cuda", "on_compile": compiled.append})
    tok = torch.tensor([[5]], device="cuda")
    step(input_ids=tok, **cache_kw(cache), use_cache=True)
    fn = compiled[-1]
    assert fn._call.checked == len(fn.inputs)
    rechecked = []
    for t in [tok, tok, tok] + [torch.tensor([[i]], device="cuda") for i in range(3)]:
        before = fn._call.checked
        step(input_ids=t, **cache_kw(cache), use_cache=True)
        rechecked.append(fn._call.checked - before)
    torch.cuda.synchronize()
    assert rechecked[:3] == [0, 0, 0] and all(1 <= n <= 2 for n in rechecked[3:]), rechecked
