// mpk._launcher: loads a generated module (module.so, see
// csrc/runtime/module_abi.h) and calls its C ABI from Python.
//
// Plain C++ on purpose: no CUDA headers, no CUDA libraries. The module is
// dlopened, the stream arrives as an integer (torch's cudaStream_t), and
// tensors arrive as data pointers, so this builds with a C++ compiler and
// pybind11 alone.
#include <dlfcn.h>

#include <cstdint>
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
  int32_t (*init)(char*, int32_t);
  int32_t (*launch)(void* const*, void*, char*, int32_t);
  int32_t (*status)(MpkStatus*);
  int32_t (*reset)(void);
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
    resolve(lib_, path_, "mpk_init", &abi_.init);
    resolve(lib_, path_, "mpk_launch", &abi_.launch);
    resolve(lib_, path_, "mpk_status", &abi_.status);
    resolve(lib_, path_, "mpk_reset", &abi_.reset);
  }

  // The library is never dlclosed: a kernel may still be running on the
  // device, and unloading registered CUDA code at interpreter exit races
  // the CUDA runtime's own teardown.
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  void init() {
    char err[kErrLen] = {0};
    int32_t rc;
    {
      py::gil_scoped_release nogil;
      rc = abi_.init(err, kErrLen);
    }
    if (rc != 0) throw std::runtime_error(message("mpk_init", rc, err));
  }

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
      rc = abi_.launch(ptrs.data(), reinterpret_cast<void*>(stream), err, kErrLen);
    }
    if (rc != 0) throw std::runtime_error(message("mpk_launch", rc, err));
  }

  py::dict status() {
    MpkStatus s{};
    int32_t rc;
    {
      py::gil_scoped_release nogil;
      rc = abi_.status(&s);
    }
    if (rc != 0) throw std::runtime_error("mpk_status failed (code " + std::to_string(rc) + ")");
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
      rc = abi_.reset();
    }
    if (rc != 0) throw std::runtime_error("mpk_reset failed (code " + std::to_string(rc) + ")");
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
  py::class_<Module>(m, "Module")
      .def(py::init<const std::string&>(), py::arg("path"))
      .def("init", &Module::init, "Kernel attributes, occupancy check, device state.")
      .def("launch", &Module::launch, py::arg("slots"), py::arg("stream"),
           "One cooperative launch on stream (an integer cudaStream_t); asynchronous.")
      .def("status", &Module::status, "The device status (synchronises the device).")
      .def("reset", &Module::reset, "Clears counters, epoch and status after an abort.")
      .def_property_readonly("path", &Module::path)
      .def_property_readonly("num_slots", &Module::num_slots)
      .def_property_readonly("num_inputs", &Module::num_inputs)
      .def_property_readonly("num_outputs", &Module::num_outputs)
      .def_property_readonly("num_workers", &Module::num_workers)
      .def_property_readonly("num_tasks", &Module::num_tasks)
      .def_property_readonly("arena_bytes", &Module::arena_bytes);
}
