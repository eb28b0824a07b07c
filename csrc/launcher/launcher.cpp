// mpk._launcher: loads a generated module (module.so, see
// csrc/runtime/module_abi.h), calls its C ABI, and does the host work of one
// call of a compiled graph (Call): argument checks against the compiled
// layout, the pointer table, the outputs, the status poll and the launch.
//
// A torch C++ extension without CUDA headers: the module is dlopened, the
// stream arrives as an integer (torch's cudaStream_t), and tensors are read
// through libtorch (the narrowest headers that unwrap a Python tensor).
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include "runtime/module_abi.h"

namespace py = pybind11;

namespace {

constexpr int kErrLen = 4096;

// Python exception types of this module (set at import).
PyObject* g_refused = nullptr;   // ArgumentRefused(index, reason)
PyObject* g_aborted = nullptr;   // PreviousLaunchAborted
PyObject* g_launch = nullptr;    // LaunchFailed(message)

[[noreturn]] void raise(PyObject* type, py::object value) {
  PyErr_SetObject(type, value.ptr());
  throw py::error_already_set();
}

// One function pointer per symbol of module_abi.h, resolved at load time.
struct Abi {
  int32_t (*num_slots)(void);
  int32_t (*num_inputs)(void);
  int32_t (*num_outputs)(void);
  int32_t (*num_workers)(void);
  int32_t (*num_tasks)(void);
  uint64_t (*arena_bytes)(void);
  int32_t (*create)(uint64_t, MpkInstance**, char*, int32_t);
  int32_t (*launch)(MpkInstance*, void* const*, void*, char*, int32_t);
  void (*status)(const MpkInstance*, MpkStatus*);
  int32_t (*poll)(MpkInstance*, void*, MpkStatus*);
  int32_t (*reset)(MpkInstance*);
  void (*destroy)(MpkInstance*);
};

template <typename Fn>
void resolve(void* lib, const std::string& path, const char* name, Fn* out) {
  dlerror();
  void* sym = dlsym(lib, name);
  const char* err = dlerror();
  if (err != nullptr || sym == nullptr) {
    throw std::runtime_error("mpk module " + path + " does not export " + name +
                             " (see csrc/runtime/module_abi.h)" +
                             (err ? std::string(": ") + err : std::string()));
  }
  *out = reinterpret_cast<Fn>(sym);
}

std::string message(const char* prefix, int32_t rc, const char* err) {
  std::string s = std::string(prefix) + " failed (code " + std::to_string(rc) + ")";
  if (err[0] != '\0') s += ": " + std::string(err);
  return s;
}

py::dict status_dict(const MpkStatus& s) {
  py::dict d;
  d["aborted"] = s.aborted;
  d["worker"] = s.worker;
  d["task"] = s.task;
  d["event"] = s.event;
  d["count"] = s.count;
  d["needed"] = s.needed;
  d["waited_ns"] = s.waited_ns;
  return d;
}

// Instance is one compiled callable's device state (module_abi.h): its own
// event counters, epoch and status.
class Instance {
 public:
  Instance(const Abi& abi, MpkInstance* inst) : abi_(abi), inst_(inst) {}
  Instance(const Instance&) = delete;
  Instance& operator=(const Instance&) = delete;
  ~Instance() { abi_.destroy(inst_); }

  void launch(const std::vector<uintptr_t>& slots, uintptr_t stream) {
    const int32_t want = abi_.num_slots();
    if (static_cast<int64_t>(slots.size()) != want) {
      throw std::runtime_error("mpk launch: got " + std::to_string(slots.size()) +
                               " pointer slots, the module takes " + std::to_string(want) +
                               " (inputs + outputs + arena)");
    }
    std::vector<void*> ptrs(slots.size());
    for (size_t i = 0; i < slots.size(); ++i) ptrs[i] = reinterpret_cast<void*>(slots[i]);
    char err[kErrLen] = {0};
    int32_t rc;
    {
      py::gil_scoped_release nogil;
      rc = abi_.launch(inst_, ptrs.data(), reinterpret_cast<void*>(stream), err, kErrLen);
    }
    if (rc != 0) throw std::runtime_error(message("mpk_launch", rc, err));
  }

  // The launch of Call: slots has num_slots entries; an error is LaunchFailed.
  void launch_slots(void* const* slots, void* stream) {
    char err[kErrLen] = {0};
    const int32_t rc = abi_.launch(inst_, slots, stream, err, kErrLen);
    if (rc != 0) raise(g_launch, py::str(message("mpk_launch", rc, err)));
  }

  // True with *out when the last direct launch finished since the last poll.
  bool poll(void* stream, MpkStatus* out) { return abi_.poll(inst_, stream, out) != 0; }

  // The status as of the last completed launch (no synchronisation).
  py::dict status() {
    MpkStatus s{};
    abi_.status(inst_, &s);
    return status_dict(s);
  }

  void reset() {
    int32_t rc;
    {
      py::gil_scoped_release nogil;
      rc = abi_.reset(inst_);
    }
    if (rc != 0) throw std::runtime_error("mpk_reset failed (code " + std::to_string(rc) + ")");
  }

  const Abi& abi() const { return abi_; }

 private:
  const Abi& abi_;  // owned by the Module, which the Python object keeps alive
  MpkInstance* inst_;
};

class Module {
 public:
  explicit Module(const std::string& path) : path_(path) {
    lib_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib_ == nullptr) {
      const char* err = dlerror();
      throw std::runtime_error("cannot load mpk module " + path + ": " +
                               (err ? err : "unknown dlopen error"));
    }
    resolve(lib_, path_, "mpk_num_slots", &abi_.num_slots);
    resolve(lib_, path_, "mpk_num_inputs", &abi_.num_inputs);
    resolve(lib_, path_, "mpk_num_outputs", &abi_.num_outputs);
    resolve(lib_, path_, "mpk_num_workers", &abi_.num_workers);
    resolve(lib_, path_, "mpk_num_tasks", &abi_.num_tasks);
    resolve(lib_, path_, "mpk_arena_bytes", &abi_.arena_bytes);
    resolve(lib_, path_, "mpk_create", &abi_.create);
    resolve(lib_, path_, "mpk_launch", &abi_.launch);
    resolve(lib_, path_, "mpk_status", &abi_.status);
    resolve(lib_, path_, "mpk_poll", &abi_.poll);
    resolve(lib_, path_, "mpk_reset", &abi_.reset);
    resolve(lib_, path_, "mpk_destroy", &abi_.destroy);
  }

  // The library is never dlclosed: a kernel may still be running on the
  // device, and unloading registered CUDA code at interpreter exit races
  // the CUDA runtime's own teardown.
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // create makes an instance on the current device (kernel attributes,
  // occupancy check, its own device state).
  std::unique_ptr<Instance> create(uint64_t budget_ns) {
    char err[kErrLen] = {0};
    MpkInstance* inst = nullptr;
    int32_t rc;
    {
      py::gil_scoped_release nogil;
      rc = abi_.create(budget_ns, &inst, err, kErrLen);
    }
    if (rc != 0) throw std::runtime_error(message("mpk_create", rc, err));
    return std::make_unique<Instance>(abi_, inst);
  }

  const std::string& path() const { return path_; }
  int32_t num_slots() const { return abi_.num_slots(); }
  int32_t num_inputs() const { return abi_.num_inputs(); }
  int32_t num_outputs() const { return abi_.num_outputs(); }
  int32_t num_workers() const { return abi_.num_workers(); }
  int32_t num_tasks() const { return abi_.num_tasks(); }
  uint64_t arena_bytes() const { return abi_.arena_bytes(); }

 private:
  std::string path_;
  void* lib_ = nullptr;
  Abi abi_{};
};

// ---------------------------------------------------------------------------
// The call path.
// ---------------------------------------------------------------------------

// An input's compiled layout.
struct InputSpec {
  c10::ScalarType dtype;
  std::vector<int64_t> shape, strides;
  int64_t span;  // elements from the view's first to one past its last (0: empty)
  bool written;  // the graph writes it (aten.copy_ into the input)
  bool bulk;     // the kernel reads it with bulk copies: its data must be 16-byte aligned
};

// An output: a new tensor, or a view of an input (kind "input").
struct OutputSpec {
  bool is_new;
  c10::ScalarType dtype;
  std::vector<int64_t> shape, strides;
  int64_t offset;  // new: into its own buffer of `buffer` elements; view: from the input's own offset
  int64_t buffer;  // new: 0 unless the view starts at an offset
  int input;
};

// What an argument was at the last call that passed: a later argument that is
// the same tensor with the same storage and layout needs no check.
struct Seen {
  py::object type;  // held, so an equal type pointer is this type
  // Held weakly: the TensorImpl's memory outlives its tensor while this is
  // kept, so a live argument at this address is this tensor. Its storage is
  // released as usual.
  std::optional<c10::weak_intrusive_ptr<c10::TensorImpl>> weak;
  const c10::TensorImpl* impl = nullptr;
  const void* base = nullptr;  // the storage's memory
  size_t nbytes = 0;
  int64_t offset = 0;
  caffe2::TypeMeta dtype;
  std::vector<int64_t> strides;  // as passed (dims of size 1 may differ from the layout)
  uintptr_t lo = 0, hi = 0;      // the view's bytes (lo == hi: none)
  void* data = nullptr;          // its first element: the slot
};

bool same_layout(const c10::TensorImpl* t, const Seen& s, const InputSpec& spec) {
  const c10::Storage& st = t->unsafe_storage();
  return st.data_ptr().get() == s.base && st.nbytes() == s.nbytes && t->storage_offset() == s.offset &&
         t->dtype() == s.dtype && t->sizes().equals(spec.shape) && t->strides().equals(s.strides);
}

class Call {
 public:
  Call(py::object instance, c10::Device device, const std::vector<py::tuple>& inputs,
       const std::vector<py::tuple>& outputs, uint64_t arena_bytes, bool poison, bool returns_sequence)
      : instance_obj_(std::move(instance)),
        instance_(instance_obj_.cast<Instance*>()),
        device_(device),
        arena_bytes_(arena_bytes),
        poison_(poison),
        returns_sequence_(returns_sequence) {
    for (const py::tuple& t : inputs) {
      InputSpec s{t[0].cast<c10::ScalarType>(), t[1].cast<std::vector<int64_t>>(),
                  t[2].cast<std::vector<int64_t>>(), 0, t[3].cast<bool>(), t.size() > 4 && t[4].cast<bool>()};
      if (s.shape.size() != s.strides.size()) throw std::invalid_argument("input shape and strides differ in rank");
      s.span = 1;
      for (size_t d = 0; d < s.shape.size(); ++d) {
        if (s.shape[d] == 0) s.span = 0;
        if (s.span) s.span += (s.shape[d] - 1) * s.strides[d];
      }
      if (s.written) written_.push_back(static_cast<int>(inputs_.size()));
      inputs_.push_back(std::move(s));
    }
    for (const py::tuple& t : outputs) {
      OutputSpec o{t[0].cast<std::string>() == "new", t[1].cast<c10::ScalarType>(),
                   t[2].cast<std::vector<int64_t>>(), t[3].cast<std::vector<int64_t>>(),
                   t[4].cast<int64_t>(), t[5].cast<int64_t>(), t[6].cast<int>()};
      if (!o.is_new && (o.input < 0 || o.input >= static_cast<int>(inputs_.size())))
        throw std::invalid_argument("an output views input " + std::to_string(o.input) + ", which does not exist");
      outputs_.push_back(std::move(o));
    }
    const Abi& abi = instance_->abi();
    if (abi.num_inputs() != static_cast<int32_t>(inputs_.size()) ||
        abi.num_outputs() != static_cast<int32_t>(outputs_.size()) ||
        abi.num_slots() != static_cast<int32_t>(inputs_.size() + outputs_.size() + 1)) {
      throw std::invalid_argument("the module takes " + std::to_string(abi.num_inputs()) + " inputs and " +
                                  std::to_string(abi.num_outputs()) + " outputs, the layout has " +
                                  std::to_string(inputs_.size()) + " and " + std::to_string(outputs_.size()));
    }
    seen_.resize(inputs_.size());
    slots_.assign(inputs_.size() + outputs_.size() + 1, nullptr);
  }

  // One call: args are the call's positional arguments (one per input, or
  // AOTAutograd's boxed convention: one list of them all).
  py::object call(py::tuple args, uintptr_t stream_handle) {
    void* stream = reinterpret_cast<void*>(stream_handle);
    PyObject* seq = args.ptr();
    if (PyTuple_GET_SIZE(seq) == 1 && PyList_Check(PyTuple_GET_ITEM(seq, 0)) && inputs_.size() != 1)
      seq = PyTuple_GET_ITEM(seq, 0);
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n != static_cast<Py_ssize_t>(inputs_.size()))
      raise(g_refused, py::make_tuple(-1, "compiled graph takes " + std::to_string(inputs_.size()) +
                                              " arguments, got " + std::to_string(n)));
    PyObject** items = PySequence_Fast_ITEMS(seq);
    try {
      check(items);
      MpkStatus st{};
      if (instance_->poll(stream, &st) && st.aborted) raise(g_aborted, py::none());
      py::object out = make_outputs(items);
      instance_->launch_slots(slots_.data(), stream);
      ++launches_;
      return out;
    } catch (py::error_already_set&) {
      throw;
    } catch (const std::exception&) {  // ATen's errors (out of memory, ...) as torch raises them
      torch::translate_exception_to_python(std::current_exception());
      throw py::error_already_set();
    }
  }

  int64_t checked() const { return checked_; }
  int64_t launches() const { return launches_; }

  // The slot table of the last launch: inputs, outputs, the arena.
  std::vector<uintptr_t> slots() const {
    std::vector<uintptr_t> out;
    for (void* p : slots_) out.push_back(reinterpret_cast<uintptr_t>(p));
    return out;
  }

 private:
  // Checks the arguments not seen unchanged since the last call that passed;
  // on success they enter the table (their slots included). A refusal names
  // one argument; the caller builds the message.
  void check(PyObject** items) {
    changed_.clear();
    for (size_t i = 0; i < inputs_.size(); ++i) {
      PyObject* o = items[i];
      const Seen& s = seen_[i];
      if (Py_TYPE(o) == reinterpret_cast<PyTypeObject*>(s.type.ptr())) {
        const c10::TensorImpl* t = THPVariable_Unpack(o).unsafeGetTensorImpl();
        if (t == s.impl && same_layout(t, s, inputs_[i])) continue;
      }
      changed_.push_back(static_cast<int>(i));
    }
    if (changed_.empty()) return;
    fresh_.resize(changed_.size());
    for (size_t k = 0; k < changed_.size(); ++k) check_one(changed_[k], items[changed_[k]], fresh_[k]);
    check_aliasing();
    for (size_t k = 0; k < changed_.size(); ++k) {
      const int i = changed_[k];
      slots_[i] = fresh_[k].data;
      seen_[i] = std::move(fresh_[k]);
    }
    checked_ += static_cast<int64_t>(changed_.size());
  }

  [[noreturn]] void refuse(int i, const std::string& reason) { raise(g_refused, py::make_tuple(i, reason)); }

  void check_one(int i, PyObject* o, Seen& out) {
    const InputSpec& spec = inputs_[i];
    if (!THPVariable_Check(o)) refuse(i, "must be a tensor");
    const at::Tensor& t = THPVariable_Unpack(o);
    c10::TensorImpl* impl = t.unsafeGetTensorImpl();
    if (t.device() != device_) refuse(i, "is on " + t.device().str() + ", compiled for " + device_.str());
    if (t.scalar_type() != spec.dtype) refuse(i, "has dtype " + std::string(c10::toString(t.scalar_type())));
    if (!t.sizes().equals(spec.shape)) refuse(i, "has shape " + c10::str(t.sizes()));
    if (t.numel() > 1) {
      for (size_t d = 0; d < spec.shape.size(); ++d)
        if (spec.shape[d] > 1 && t.strides()[d] != spec.strides[d]) refuse(i, "has strides " + c10::str(t.strides()));
    }
    if (!impl->has_storage()) refuse(i, "has no storage");
    const c10::Storage& st = impl->storage();
    // The kernel writes through the pointer: a copy-on-write storage is
    // materialised here, as tensor.data_ptr() would.
    char* base = static_cast<char*>(st.mutable_data());
    const int64_t item = static_cast<int64_t>(t.element_size());
    char* data = base ? base + t.storage_offset() * item : nullptr;
    if (spec.bulk && (reinterpret_cast<uintptr_t>(data) & 15)) refuse(i, "is not 16-byte aligned");
    if (spec.span) {
      if (base == nullptr) refuse(i, "has no storage");
      const int64_t need = (t.storage_offset() + spec.span) * item;
      if (need > static_cast<int64_t>(st.nbytes()))
        refuse(i, "needs " + std::to_string(need) + " bytes of storage, its storage holds " +
                      std::to_string(st.nbytes()));
    }
    out.type = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(Py_TYPE(o)));
    out.weak.emplace(t.getIntrusivePtr());
    out.impl = impl;
    out.base = st.data_ptr().get();
    out.nbytes = st.nbytes();
    out.offset = t.storage_offset();
    out.dtype = t.dtype();
    out.strides = t.strides().vec();
    out.data = data;
    out.lo = reinterpret_cast<uintptr_t>(data);
    out.hi = spec.span ? out.lo + static_cast<uintptr_t>(spec.span * item) : out.lo;
  }

  // A written input may not share bytes with any other input: the kernel
  // reads every input as it was when the call began. The pairs without a
  // changed argument were checked at an earlier call.
  void check_aliasing() {
    if (written_.empty()) return;
    fresh_at_.assign(inputs_.size(), -1);
    for (size_t k = 0; k < changed_.size(); ++k) fresh_at_[changed_[k]] = static_cast<int>(k);
    auto now = [&](int j) -> const Seen& { return fresh_at_[j] >= 0 ? fresh_[fresh_at_[j]] : seen_[j]; };
    auto overlap = [](const Seen& a, const Seen& b) {
      return a.lo < a.hi && b.lo < b.hi && a.lo < b.hi && b.lo < a.hi;  // both non-empty, and they meet
    };
    for (int i : changed_) {
      const Seen& a = now(i);
      if (inputs_[i].written) {
        for (int j = 0; j < static_cast<int>(inputs_.size()); ++j)
          if (j != i && overlap(a, now(j))) refuse_overlap(i, j);
      } else {
        for (int j : written_)
          if (overlap(a, now(j))) refuse_overlap(i, j);
      }
    }
  }

  [[noreturn]] void refuse_overlap(int i, int j) {
    refuse(i, "overlaps argument " + std::to_string(j) + " in memory, and the graph writes one of them");
  }

  py::object make_outputs(PyObject** items) {
    const size_t n_in = inputs_.size();
    if (!arena_.defined())
      arena_ = at::empty({static_cast<int64_t>(std::max<uint64_t>(arena_bytes_, 1))},
                         at::TensorOptions().dtype(at::kByte).device(device_));
    slots_.back() = arena_.data_ptr();
    py::tuple outs(outputs_.size());
    for (size_t j = 0; j < outputs_.size(); ++j) {
      const OutputSpec& o = outputs_[j];
      at::Tensor t;
      if (o.is_new) {
        const auto opts = at::TensorOptions().dtype(o.dtype).device(device_);
        t = o.buffer ? at::empty({o.buffer}, opts).as_strided(o.shape, o.strides, o.offset)
                     : at::empty_strided(o.shape, o.strides, opts);
        if (poison_ && c10::isFloatingType(o.dtype)) t.fill_(NAN);
      } else {
        const at::Tensor& base = THPVariable_Unpack(items[o.input]);
        t = base.as_strided(o.shape, o.strides, base.storage_offset() + o.offset);
      }
      slots_[n_in + j] = t.data_ptr();
      outs[j] = py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(t)));
    }
    if (returns_sequence_) return std::move(outs);
    return outs[0];
  }

  py::object instance_obj_;  // keeps the Instance (and its Module) alive
  Instance* instance_;
  c10::Device device_;
  std::vector<InputSpec> inputs_;
  std::vector<OutputSpec> outputs_;
  std::vector<int> written_;
  uint64_t arena_bytes_;
  bool poison_, returns_sequence_;
  at::Tensor arena_;  // scratch, allocated at the first call (compiling runs under fake tensors)
  std::vector<Seen> seen_;
  std::vector<void*> slots_;
  std::vector<int> changed_;  // scratch of check()
  std::vector<Seen> fresh_;   // scratch of check()
  std::vector<int> fresh_at_;  // scratch of check_aliasing()
  int64_t checked_ = 0, launches_ = 0;
};

PyObject* new_exception(py::module_& m, const char* name, const char* doc) {
  const std::string qualified = std::string("mpk._launcher.") + name;
  PyObject* e = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, PyExc_Exception, nullptr);
  if (e == nullptr) throw py::error_already_set();
  m.attr(name) = py::reinterpret_borrow<py::object>(e);  // the module holds it; e's own reference is never dropped
  return e;
}

}  // namespace

// The classes are module-local: they share pybind11's registry with torch,
// and two copies may be loaded: the installed mpk._launcher, built for
// another torch, and mpk._launcher_jit, which mpk.build compiles then.
#ifndef MPK_LAUNCHER_NAME
#define MPK_LAUNCHER_NAME _launcher
#endif
PYBIND11_MODULE(MPK_LAUNCHER_NAME, m) {
  m.doc() = "Loads a generated mpk module (module.so), calls its C ABI, and runs the host side of a call.";
  m.attr("torch_version") = MPK_TORCH_VERSION;
  g_refused = new_exception(m, "ArgumentRefused",
                            "A call's argument failed its check: args (index, reason); index -1: their number.");
  g_aborted = new_exception(m, "PreviousLaunchAborted", "The previous launch aborted: read the instance's status.");
  g_launch = new_exception(m, "LaunchFailed", "mpk_launch returned an error: args (message,).");
  py::class_<Instance>(m, "Instance", py::module_local())
      .def("launch", &Instance::launch, py::arg("slots"), py::arg("stream"),
           "One cooperative launch on stream (an integer cudaStream_t), then an async copy of the "
           "status to pinned memory; capturable in a CUDA graph.")
      .def("status", &Instance::status, "The status as of the last completed launch (no synchronisation).")
      .def("reset", &Instance::reset, "Clears counters, epoch and status after an abort.");
  py::class_<Module>(m, "Module", py::module_local())
      .def(py::init<const std::string&>(), py::arg("path"))
      .def("create", &Module::create, py::arg("budget_ns"), py::keep_alive<0, 1>(),
           "An instance with its own device state on the current device (kernel attributes, "
           "occupancy check); budget_ns bounds one spin-wait.")
      .def_property_readonly("path", &Module::path)
      .def_property_readonly("num_slots", &Module::num_slots)
      .def_property_readonly("num_inputs", &Module::num_inputs)
      .def_property_readonly("num_outputs", &Module::num_outputs)
      .def_property_readonly("num_workers", &Module::num_workers)
      .def_property_readonly("num_tasks", &Module::num_tasks)
      .def_property_readonly("arena_bytes", &Module::arena_bytes);
  py::class_<Call>(m, "Call", py::module_local())
      .def(py::init<py::object, c10::Device, const std::vector<py::tuple>&, const std::vector<py::tuple>&, uint64_t,
                    bool, bool>(),
           py::arg("instance"), py::arg("device"), py::arg("inputs"), py::arg("outputs"), py::arg("arena_bytes"),
           py::arg("poison"), py::arg("returns_sequence"),
           "The host side of a compiled graph's calls on an instance. inputs: (dtype, shape, strides, written, bulk) "
           "each; outputs: (kind 'new' or 'input', dtype, shape, strides, offset, buffer elements, input index).")
      .def("__call__", &Call::call, py::arg("args"), py::arg("stream"),
           "Checks args (those unchanged since the last call that passed skip the checks), polls the "
           "previous launch's status, allocates the outputs and launches on stream; returns the outputs "
           "(a tuple when the graph returns a sequence). Raises ArgumentRefused, PreviousLaunchAborted "
           "or LaunchFailed.")
      .def_property_readonly("checked", &Call::checked, "Arguments checked in full so far.")
      .def_property_readonly("launches", &Call::launches)
      .def_property_readonly("slots", &Call::slots, "The pointer table of the last launch.");
}
