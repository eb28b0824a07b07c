// mpk._launcher: loads a generated module (module.so, see
// csrc/runtime/module_abi.h) and calls its C ABI from Python.
//
// Plain C++ on purpose: no CUDA headers, no CUDA libraries. The module is
// dlopened, the stream arrives as an integer (torch's cudaStream_t), and
// tensors arrive as data pointers, so this builds with a C++ compiler and
// pybind11 alone.
#include <dlfcn.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "runtime/module_abi.h"

namespace py = pybind11;

namespace {

constexpr int kErrLen = 4096;

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

  // The status as of the last completed launch (no synchronisation).
  py::dict status() {
    MpkStatus s{};
    abi_.status(inst_, &s);
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

  void reset() {
    int32_t rc;
    {
      py::gil_scoped_release nogil;
      rc = abi_.reset(inst_);
    }
    if (rc != 0) throw std::runtime_error("mpk_reset failed (code " + std::to_string(rc) + ")");
  }

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

}  // namespace

PYBIND11_MODULE(_launcher, m) {
  m.doc() = "Loads a generated mpk module (module.so) and calls its C ABI.";
  py::class_<Instance>(m, "Instance")
      .def("launch", &Instance::launch, py::arg("slots"), py::arg("stream"),
           "One cooperative launch on stream (an integer cudaStream_t), then an async copy of the "
           "status to pinned memory; capturable in a CUDA graph.")
      .def("status", &Instance::status, "The status as of the last completed launch (no synchronisation).")
      .def("reset", &Instance::reset, "Clears counters, epoch and status after an abort.");
  py::class_<Module>(m, "Module")
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
}
