// The C ABI of a generated mpk module (module.cu compiled by nvcc into
// module.so). The pybind11 launcher (csrc/launcher) dlopens a module and
// calls these; nothing else crosses this boundary.
//
// Pointer slots, in order: the graph inputs (by input index), the graph
// outputs (by output index), then one scratch arena of mpk_arena_bytes()
// bytes that the caller allocates once (no initialisation needed).
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// What a spin-wait that ran past its budget saw before the kernel aborted.
typedef struct MpkStatus {
  int32_t aborted;   // 0: healthy; 1: a wait timed out; 2: an index was out of range
  int32_t worker;    // the worker (block) that gave up
  int32_t task;      // the task it was about to run
  int32_t event;     // the event it waited on
  uint32_t count;    // the event counter it last read
  uint32_t needed;   // the count it needed
  uint64_t waited_ns;
} MpkStatus;

int32_t mpk_num_slots(void);      // inputs + outputs + 1 (the arena)
int32_t mpk_num_inputs(void);
int32_t mpk_num_outputs(void);
int32_t mpk_num_workers(void);
int32_t mpk_num_tasks(void);
uint64_t mpk_arena_bytes(void);

// Prepares the module on the current device: kernel attributes, an occupancy
// check proving all workers are co-resident, and device state (event
// counters, epoch, status). Returns 0, or non-zero with a message in err.
int32_t mpk_init(char* err, int32_t errlen);

// One cooperative launch of the megakernel on stream (a cudaStream_t) with
// slots[mpk_num_slots()] device pointers. Asynchronous; 0 or an error.
int32_t mpk_launch(void* const* slots, void* stream, char* err, int32_t errlen);

// Copies the device status into *out (synchronising the device). Returns 0.
int32_t mpk_status(MpkStatus* out);

// Clears counters, epoch and status after an abort so the module can run again.
int32_t mpk_reset(void);

#ifdef __cplusplus
}
#endif
