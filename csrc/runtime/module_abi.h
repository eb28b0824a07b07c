// The C ABI of a generated mpk module (module.cu compiled by nvcc into
// module.so). The pybind11 launcher (csrc/launcher) dlopens a module and
// calls these; nothing else crosses this boundary.
//
// Pointer slots, in order: the graph inputs (by input index), the graph
// outputs (by output index), then one scratch arena of mpk_arena_bytes()
// bytes that the caller allocates (no initialisation needed).
//
// Every compiled callable owns an instance: its event counters, epoch and
// status. Two instances of one module never share device state, so they may
// run interleaved, on one stream or on several.
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Why a launch aborted (MpkStatus.aborted).
#define MPK_ABORT_WAIT 1   // a spin-wait ran past its budget (event -1: the weight ring)
#define MPK_ABORT_INDEX 2  // an index was out of range

// What the first worker to give up saw.
typedef struct MpkStatus {
  int32_t aborted;   // 0: healthy, else MPK_ABORT_*
  int32_t worker;    // the worker (block) that gave up
  int32_t task;      // the task it was running or about to run
  int32_t event;     // the event it waited on (WAIT), or the op (INDEX)
  uint32_t count;    // the event counter it last read (WAIT), or the offending index's low bits (INDEX)
  uint32_t needed;   // the count it needed (WAIT), or the size the index indexes (INDEX)
  uint64_t waited_ns;  // how long it waited (WAIT), or the index as an int64 (INDEX)
} MpkStatus;

typedef struct MpkInstance MpkInstance;

int32_t mpk_num_slots(void);      // inputs + outputs + 1 (the arena)
int32_t mpk_num_inputs(void);
int32_t mpk_num_outputs(void);
int32_t mpk_num_workers(void);
int32_t mpk_num_tasks(void);
uint64_t mpk_arena_bytes(void);

// Creates an instance on the current device: kernel attributes, an occupancy
// check proving all workers are co-resident, and the instance's device state
// and pinned status. budget_ns bounds how long one spin-wait may last before
// the kernel aborts. Returns 0 and *out, or non-zero with a message in err.
int32_t mpk_create(uint64_t budget_ns, MpkInstance** out, char* err, int32_t errlen);

// One cooperative launch of the megakernel on stream (a cudaStream_t) with
// slots[mpk_num_slots()] device pointers, followed on the same stream by a
// copy of the device status into the instance's pinned host memory.
// Asynchronous and capturable in a CUDA graph; 0 or an error.
int32_t mpk_launch(MpkInstance* inst, void* const* slots, void* stream, char* err, int32_t errlen);

// The status as of the last status copy that completed: the caller first
// waits for the launch (an event or a stream synchronisation). No device
// synchronisation here.
void mpk_status(const MpkInstance* inst, MpkStatus* out);

// Whether the last launch made outside a stream capture has finished: 1 and
// its status in *out (once per launch), else 0 (still running, already
// polled, or stream is being captured, when nothing may be queried). A
// launch records the instance's event after its status copy; this queries
// it. Never synchronises: the host's cheap look before each call.
int32_t mpk_poll(MpkInstance* inst, void* stream, MpkStatus* out);

// Clears the instance's counters, epoch and status after an abort, so it can
// run again (synchronises the device).
int32_t mpk_reset(MpkInstance* inst);

void mpk_destroy(MpkInstance* inst);

// Copies up to n trace records (32 bytes each: wait, start, end ns, then op
// and worker as int32) of the last launch; 0 unless built with the trace
// option (its records are the module's, shared by its instances).
int32_t mpk_trace(void* out, int32_t n);

#ifdef __cplusplus
}
#endif
