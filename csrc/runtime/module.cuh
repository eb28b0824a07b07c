// The megakernel and the module's C ABI (module_abi.h). Included at the end
// of a generated module.cu, after the mpk_gen tables and run_task.
#pragma once
#include <stdio.h>

namespace mpk_gen {

// With MPK_TRACE, per task: when its wait began, when it started, when it
// ended (globaltimer ns), its op and worker; mpk_trace copies them out.
struct TraceRecord {
  unsigned long long wait_ns, start_ns, end_ns;
  int32_t op, worker;
};
#ifdef MPK_TRACE
__device__ TraceRecord trace_records[kNumTasks];
#endif

// Every worker runs its static queue: wait for the task's event, run it,
// signal its event. Thresholds grow with the launch count, so counters are
// never reset between steps.
__global__ void __launch_bounds__(MPK_THREADS, 1)
    megakernel(const __grid_constant__ mpk::Slots<kNumSlots> slots, const mpk::State st) {
  extern __shared__ __align__(16) char smem[];
  __shared__ uint32_t s_step;
  __shared__ int s_go;
  // The running task's op descriptor, copied from global memory once per
  // task: the task code reads its views' shapes and strides many times.
  __shared__ __align__(16) mpk::Op s_op;
  const int w = blockIdx.x;
  if (threadIdx.x == 0) s_step = *(volatile uint32_t*)st.epoch + 1;
  __syncthreads();
  const uint32_t step = s_step;
  const int q_end = queue_start[w + 1];
  for (int q = queue_start[w]; q < q_end; ++q) {
    const int t = queue[q];
    const mpk::Task task = tasks[t];
    if (threadIdx.x == 0) {  // weights one task ahead (the first task's own as well)
      if (q == queue_start[w] && task.op >= 0) mpk::prefetch_weights(ops[task.op], task.lo, task.hi, slots);
      if (q + 1 < q_end) {
        const mpk::Task next = tasks[queue[q + 1]];
        if (next.op >= 0) mpk::prefetch_weights(ops[next.op], next.lo, next.hi, slots);
      }
    }
#ifdef MPK_TRACE
    if (threadIdx.x == 0) trace_records[t].wait_ns = mpk::globaltimer();
#endif
    if (task.wait >= 0) {
      if (threadIdx.x == 0) s_go = mpk::wait_event(st, task.wait, event_needed[task.wait] * step, w, t);
      __syncthreads();
      if (!s_go) break;
    }
#ifdef MPK_TRACE
    if (threadIdx.x == 0) trace_records[t].start_ns = mpk::globaltimer();
#endif
    if (task.op >= 0) {
      const int2* src = reinterpret_cast<const int2*>(&ops[task.op]);
      int2* dst = reinterpret_cast<int2*>(&s_op);
      for (int i = threadIdx.x; i < (int)(sizeof(mpk::Op) / sizeof(int2)); i += blockDim.x) dst[i] = src[i];
      __syncthreads();
      run_task(s_op, task.lo, task.hi, slots, smem);
    }
    __syncthreads();
#ifdef MPK_TRACE
    if (threadIdx.x == 0) {
      trace_records[t].end_ns = mpk::globaltimer();
      trace_records[t].op = task.op;
      trace_records[t].worker = w;
    }
#endif
    if (task.trigger >= 0 && threadIdx.x == 0) mpk::signal_event(st, task.trigger);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    // The last worker to finish has seen every worker start, so all have
    // read the old epoch: it may now advance it.
    if (atomicAdd(st.finished, 1) + 1 == gridDim.x * step) atomicExch(st.epoch, step);
  }
}

struct DeviceState {
  mpk::State st{};
  void* block = nullptr;
  bool ready = false;
};
static DeviceState g_state;

static int32_t fail(char* err, int32_t errlen, const char* what, cudaError_t e) {
  if (err && errlen > 0) snprintf(err, errlen, "%s: %s", what, cudaGetErrorString(e));
  return 1;
}

}  // namespace mpk_gen

extern "C" {

int32_t mpk_num_slots(void) { return mpk_gen::kNumSlots; }
int32_t mpk_num_inputs(void) { return mpk_gen::kNumInputs; }
int32_t mpk_num_outputs(void) { return mpk_gen::kNumOutputs; }
int32_t mpk_num_workers(void) { return mpk_gen::kNumWorkers; }
int32_t mpk_num_tasks(void) { return mpk_gen::kNumTasks; }
uint64_t mpk_arena_bytes(void) { return mpk_gen::kArenaBytes; }

int32_t mpk_reset(void) {
  using namespace mpk_gen;
  if (!g_state.ready) return 0;
  size_t bytes = sizeof(uint32_t) * (kNumEvents + 2) + sizeof(int32_t) + sizeof(MpkStatus);
  cudaError_t e = cudaMemset(g_state.block, 0, bytes);
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  return e == cudaSuccess ? 0 : 1;
}

int32_t mpk_init(char* err, int32_t errlen) {
  using namespace mpk_gen;
  if (g_state.ready) return 0;
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return fail(err, errlen, "cudaGetDevice", e);
  int coop = 0, sms = 0;
  cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if (!coop) {
    snprintf(err, errlen, "device %d does not support cooperative launches", dev);
    return 1;
  }
  e = cudaFuncSetAttribute(megakernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytes);
  if (e != cudaSuccess) return fail(err, errlen, "cudaFuncSetAttribute(shared memory)", e);
  int per_sm = 0;
  e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, megakernel, MPK_THREADS, kSharedBytes);
  if (e != cudaSuccess) return fail(err, errlen, "cudaOccupancyMaxActiveBlocksPerMultiprocessor", e);
  // A persistent kernel whose workers are not all resident deadlocks.
  if ((long long)per_sm * sms < kNumWorkers) {
    snprintf(err, errlen,
             "occupancy check failed: %d workers need to be resident at once but the device fits %d per SM x %d SMs "
             "(%d threads, %d bytes of shared memory each); compile with fewer workers",
             kNumWorkers, per_sm, sms, MPK_THREADS, kSharedBytes);
    return 1;
  }
  size_t bytes = sizeof(uint32_t) * (kNumEvents + 2) + sizeof(int32_t) + sizeof(MpkStatus) + 64;
  e = cudaMalloc(&g_state.block, bytes);
  if (e != cudaSuccess) return fail(err, errlen, "cudaMalloc(state)", e);
  char* p = static_cast<char*>(g_state.block);
  g_state.st.counters = reinterpret_cast<uint32_t*>(p);
  g_state.st.epoch = g_state.st.counters + kNumEvents;
  g_state.st.finished = g_state.st.epoch + 1;
  g_state.st.abort = reinterpret_cast<int32_t*>(g_state.st.finished + 1);
  g_state.st.status = reinterpret_cast<MpkStatus*>((reinterpret_cast<uintptr_t>(g_state.st.abort + 1) + 15) & ~uintptr_t(15));
  g_state.ready = true;
  return mpk_reset() == 0 ? 0 : fail(err, errlen, "reset", cudaGetLastError());
}

int32_t mpk_launch(void* const* slot_ptrs, void* stream, char* err, int32_t errlen) {
  using namespace mpk_gen;
  if (!g_state.ready) {
    snprintf(err, errlen, "mpk_launch before mpk_init");
    return 1;
  }
  mpk::Slots<kNumSlots> slots;
  for (int i = 0; i < kNumSlots; ++i) slots.p[i] = slot_ptrs[i];
  mpk::State st = g_state.st;
  void* args[] = {&slots, &st};
  cudaError_t e = cudaLaunchCooperativeKernel((void*)megakernel, dim3(kNumWorkers), dim3(MPK_THREADS), args,
                                              kSharedBytes, static_cast<cudaStream_t>(stream));
  if (e != cudaSuccess) return fail(err, errlen, "cudaLaunchCooperativeKernel", e);
  return 0;
}

// Copies up to n trace records (32 bytes each: wait, start, end ns, then op
// and worker as int32) of the last launch; returns how many, 0 without MPK_TRACE.
int32_t mpk_trace(void* out, int32_t n) {
#ifdef MPK_TRACE
  using namespace mpk_gen;
  n = n < kNumTasks ? n : kNumTasks;
  if (cudaDeviceSynchronize() != cudaSuccess) return 0;
  if (cudaMemcpyFromSymbol(out, trace_records, sizeof(TraceRecord) * n) != cudaSuccess) return 0;
  return n;
#else
  (void)out;
  (void)n;
  return 0;
#endif
}

int32_t mpk_status(MpkStatus* out) {
  using namespace mpk_gen;
  memset(out, 0, sizeof(*out));
  if (!g_state.ready) return 0;
  cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) {
    out->aborted = 3;
    return 1;
  }
  e = cudaMemcpy(out, g_state.st.status, sizeof(MpkStatus), cudaMemcpyDeviceToHost);
  return e == cudaSuccess ? 0 : 1;
}

}  // extern "C"
