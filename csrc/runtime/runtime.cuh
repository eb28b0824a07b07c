// Device runtime of an mpk megakernel: element access through the view
// descriptors of the op table, the event-counter protocol
// (docs/architecture.md, contract 4), and small math helpers shared by the
// task library.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "runtime/abi_gen.cuh"
#include "runtime/module_abi.h"
#include "runtime/roles.cuh"

namespace mpk {

// The pointer of every slot, passed by value as a __grid_constant__ kernel
// parameter: inputs, outputs, then the arena of temporaries.
template <int N>
struct Slots {
  void* p[N];
};

// What a task gets from its worker besides its op (by value: a reference
// would put it in local memory): the task scratch in shared memory, the
// worker's weight ring and the consumers' place in it, the abort flag,
// whether x for this (streamed Linear) task is already staged in scratch,
// and the tensor maps.
struct Ctx {
  char* smem;
  char* ring;
  uint32_t seq;
  const int32_t* abort;
  bool x_ready;
  const char* tmaps;  // the instance's tensor maps (State.tmaps): a split x's (View.tmap)
};

template <int N>
__device__ __forceinline__ char* base(const Slots<N>& s, const View& v) {
  return static_cast<char*>(s.p[v.slot]);
}

__device__ __forceinline__ int64_t dtype_size(int32_t dt) {
  switch (dt) {
    case DT_FLOAT32: case DT_INT32: case DT_SPLIT_BF16: return 4;
    case DT_BFLOAT16: case DT_FLOAT16: case DT_INT16: return 2;
    case DT_FLOAT64: case DT_INT64: return 8;
    default: return 1;
  }
}

// A split buffer (DT_SPLIT_BF16, codegen's splitX) is an fp32 temporary
// that wgmma GEMM streams read as x: element i (from its slot's base) is
// stored as hi = bf16(v) and lo = bf16(v - hi) (v to ~16 significant bits,
// the split the GEMM made in registers), each group of 64 elements as its
// 64 hi values, then its 64 lo values: 256 bytes, the group's fp32 bytes.
// split_at is where element i's hi value sits, in bf16 elements from the
// base; its lo value sits kSplitGroup after it.
constexpr int kSplitGroup = 64;
__host__ __device__ __forceinline__ int64_t split_at(int64_t i) { return 2 * i - (i & (kSplitGroup - 1)); }

// split_store stores v at element i of a split buffer.
__device__ __forceinline__ void split_store(char* p, int64_t i, float v) {
  const __nv_bfloat16 hi = __float2bfloat16_rn(v), lo = __float2bfloat16_rn(v - __bfloat162float(hi));
  __nv_bfloat16* at = reinterpret_cast<__nv_bfloat16*>(p) + split_at(i);
  at[0] = hi;
  at[kSplitGroup] = lo;
}

// dtype_of is the dtype code of a float element type.
template <typename X>
__host__ __device__ constexpr int32_t dtype_of();
template <>
__host__ __device__ constexpr int32_t dtype_of<float>() { return DT_FLOAT32; }
template <>
__host__ __device__ constexpr int32_t dtype_of<__nv_bfloat16>() { return DT_BFLOAT16; }
template <>
__host__ __device__ constexpr int32_t dtype_of<__half>() { return DT_FLOAT16; }

// The dtype-generic element helpers below are __noinline__: every task uses
// them, so one shared copy stays in the instruction cache, where inlined
// copies of their dtype switches made each task variant tens of KB of code
// that a task ran cold (fetched from L2) once per layer.

// Element loads of activations go through L2 only (ld.cg): another SM may
// have written them during this launch, and L1 is not coherent.
__device__ __noinline__ double load_elem(const char* p, int32_t dt, int64_t i) {
  switch (dt) {
    case DT_FLOAT32: return __ldcg(reinterpret_cast<const float*>(p) + i);
    case DT_BFLOAT16: {
      unsigned short b = __ldcg(reinterpret_cast<const unsigned short*>(p) + i);
      return __uint_as_float(static_cast<unsigned>(b) << 16);
    }
    case DT_FLOAT16: {
      unsigned short b = __ldcg(reinterpret_cast<const unsigned short*>(p) + i);
      return __half2float(__ushort_as_half(b));
    }
    case DT_FLOAT64: return __ldcg(reinterpret_cast<const double*>(p) + i);
    case DT_SPLIT_BF16: {
      const unsigned short* at = reinterpret_cast<const unsigned short*>(p) + split_at(i);
      return (double)__uint_as_float(static_cast<unsigned>(__ldcg(at)) << 16) +
             (double)__uint_as_float(static_cast<unsigned>(__ldcg(at + kSplitGroup)) << 16);
    }
    case DT_INT64: return (double)__ldcg(reinterpret_cast<const long long*>(p) + i);
    case DT_INT32: return (double)__ldcg(reinterpret_cast<const int*>(p) + i);
    case DT_INT16: return (double)reinterpret_cast<const volatile short*>(p)[i];
    case DT_INT8: return (double)reinterpret_cast<const volatile signed char*>(p)[i];
    default: return (double)reinterpret_cast<const volatile unsigned char*>(p)[i];
  }
}

__device__ __noinline__ void store_elem(char* p, int32_t dt, int64_t i, double v) {
  switch (dt) {
    case DT_FLOAT32: reinterpret_cast<float*>(p)[i] = (float)v; break;
    case DT_BFLOAT16: reinterpret_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn((float)v); break;
    case DT_FLOAT16: reinterpret_cast<__half*>(p)[i] = __float2half_rn((float)v); break;
    case DT_FLOAT64: reinterpret_cast<double*>(p)[i] = v; break;
    case DT_SPLIT_BF16: split_store(p, i, (float)v); break;
    case DT_INT64: reinterpret_cast<long long*>(p)[i] = (long long)v; break;
    case DT_INT32: reinterpret_cast<int*>(p)[i] = (int)v; break;
    case DT_INT16: reinterpret_cast<short*>(p)[i] = (short)v; break;
    case DT_INT8: reinterpret_cast<signed char*>(p)[i] = (signed char)v; break;
    case DT_UINT8: reinterpret_cast<unsigned char*>(p)[i] = (unsigned char)v; break;
    default: reinterpret_cast<unsigned char*>(p)[i] = v != 0.0; break;
  }
}

// round_to gives the value v takes when stored as dt (eager rounds every op).
__device__ __noinline__ double round_to(int32_t dt, double v) {
  switch (dt) {
    case DT_FLOAT32: case DT_SPLIT_BF16: return (double)(float)v;
    case DT_BFLOAT16: return (double)__bfloat162float(__float2bfloat16_rn((float)v));
    case DT_FLOAT16: return (double)__half2float(__float2half_rn((float)v));
    case DT_FLOAT64: return v;
    case DT_BOOL: return v != 0.0 ? 1.0 : 0.0;
    default: return isfinite(v) ? trunc(v) : 0.0;
  }
}

__device__ __forceinline__ double powd(double a, double b) { return b == 2.0 ? a * a : pow(a, b); }
__device__ __forceinline__ double silud(double a) { return a / (1.0 + exp(-a)); }
__device__ __forceinline__ double gelud(double a) { return 0.5 * a * (1.0 + erf(a * 0.70710678118654752)); }
__device__ __forceinline__ double gelu_tanhd(double a) {
  return 0.5 * a * (1.0 + tanh(0.79788456080286536 * (a + 0.044715 * a * a * a)));
}

// fp32 versions, for expressions over fp32 and narrower tensors.
__device__ __forceinline__ float powf_(float a, float b) { return b == 2.f ? a * a : powf(a, b); }
__device__ __forceinline__ float sigmoidf(float a) { return 1.f / (1.f + expf(-a)); }
__device__ __forceinline__ float siluf(float a) { return a / (1.f + expf(-a)); }
__device__ __forceinline__ float geluf(float a) { return 0.5f * a * (1.f + erff(a * 0.70710678f)); }
__device__ __forceinline__ float gelu_tanhf(float a) {
  return 0.5f * a * (1.f + tanhf(0.7978845608f * (a + 0.044715f * a * a * a)));
}

// offset of a multi-index in a view, in elements.
__device__ __forceinline__ int64_t offset_of(const View& v, const int64_t* idx) {
  int64_t off = v.offset;
#pragma unroll 1  // a compact loop: unrolled to MPK_MAX_RANK at every call site, it bloated each task's code
  for (int d = 0; d < v.rank; ++d) off += idx[d] * v.stride[d];
  return off;
}

// unflatten writes the multi-index of flat element r of a tile with extents
// ext (rank dims). Below 2^32 elements (every tile in practice) the
// arithmetic is 32-bit: a 64-bit division is a call of ~70 instructions, and
// a rank-4 index took four of them in a chain ahead of the element's loads
// (a one-element task of the step's preamble ran 5-9 us on the H100).
__device__ __noinline__ void unflatten_wide(int64_t* idx, int64_t r, const int64_t* ext, int rank) {
  for (int d = rank - 1; d >= 0; --d) {
    idx[d] = r % ext[d];
    r /= ext[d];
  }
}

__device__ __forceinline__ void unflatten(int64_t* idx, int64_t r, const int64_t* ext, int rank, int64_t count) {
  if (count > 0xffffffffll) {
    unflatten_wide(idx, r, ext, rank);
    return;
  }
  uint32_t u = (uint32_t)r;
#pragma unroll 1
  for (int d = rank - 1; d >= 0; --d) {
    const uint32_t e = (uint32_t)ext[d];
    idx[d] = e == 1 ? 0 : u % e;
    u = e == 1 ? u : u / e;
  }
}

// The tile of a task: the iteration shape with [lo, hi) along split_dim.
// for_each_index visits its indices, one per thread in turn.
template <typename F>
__device__ __forceinline__ void for_each_index(const int64_t* shape, int rank, int split, int lo, int hi, F f) {
  int64_t ext[MPK_MAX_RANK];
  int64_t count = 1;
  for (int d = 0; d < rank; ++d) {
    ext[d] = d == split ? (int64_t)(hi - lo) : shape[d];
    count *= ext[d];
  }
  for (int64_t flat = threadIdx.x; flat < count; flat += MPK_THREADS) {
    int64_t idx[MPK_MAX_RANK];
    unflatten(idx, flat, ext, rank, count);
    if (rank > 0) idx[split] += lo;
    f(idx);
  }
}

// ---- event counters -------------------------------------------------------

__device__ __forceinline__ uint32_t ld_acquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void red_release(uint32_t* p, uint32_t v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ uint64_t globaltimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Device state that outlives a launch, one per module instance.
struct State {
  uint32_t* counters;  // one per event, monotonic across launches
  uint32_t* epoch;     // launches completed
  uint32_t* finished;  // workers finished, monotonic
  int32_t* abort;      // set by the first worker that gives up
  MpkStatus* status;
  uint64_t budget_ns;  // how long one wait may spin before the kernel gives up
  const void* tmaps;   // the instance's tensor maps (CUtensorMap, 128 bytes each: module.cuh's kTmaps)
};

__device__ __forceinline__ bool aborting(const int32_t* abort) { return *(volatile const int32_t*)abort != 0; }

// Where a task reports a bad index: the instance's abort flag and status and
// the task running, kept in shared memory by the megakernel (thread 0 sets
// them before its first barrier; tasks read them only on the error path).
// Any other kernel that runs tasks which read indices must set s_fault first
// (status null: report nothing).
struct Fault {
  int32_t* abort;
  MpkStatus* status;
  int32_t worker, task, op;
};
__shared__ Fault s_fault;

#ifdef MPK_TRACE
// How long the first consumer warp of the running task waited for pages of
// the ring (ns), for the trace.
__shared__ uint32_t s_trace_stall;
// When the running streamed task had staged x and finished its dots (ns
// from s_trace_start, its start).
__shared__ uint64_t s_trace_start;
__shared__ uint32_t s_trace_staged, s_trace_dots;
#endif

// The weight stream's depth by phase (bench/hop.cu: pages in flight on every
// worker lengthen every other L2 round trip, a grid-wide hop 1.8 -> 2.7 us
// with one page in flight an SM, 3.9 with two): the loader keeps
// MPK_INFLIGHT_PAGES in flight while the consumers multiply pages (s_dots =
// 1, from a streamed task's staging done to its products done) and
// MPK_QUIET_PAGES otherwise (hops, staging, attention, stores), at least 1
// so a page always comes. Where the two are equal s_dots is never read.
#ifndef MPK_INFLIGHT_PAGES
#define MPK_INFLIGHT_PAGES 2
#endif
#ifndef MPK_QUIET_PAGES
#define MPK_QUIET_PAGES 1
#endif
static_assert(MPK_QUIET_PAGES >= 1, "a quiet stream still brings its pages (a task waiting for one must get it)");
constexpr bool kQuietStream = MPK_QUIET_PAGES != MPK_INFLIGHT_PAGES;
__shared__ uint32_t s_dots;
__device__ __forceinline__ void set_dots_phase(uint32_t on) {
  if (kQuietStream && threadIdx.x == 0) *(volatile uint32_t*)&s_dots = on;
}

// The live length: the loader streams a kv_pages chunk's rows below the
// mask's extent only (Stream.kv_j0 >= 0: codegen found one extent for every
// kv_pages attention), so 512 live tokens in a cache of 4,096 stream what a
// cache of 528 does (bench/NOTES.md twenty-eighth session). It learns the
// extent from the worker's first kv_pages task, which reads it after its
// event and hands it over in s_kv_extent (-1 until then); the task cuts its
// pages by the same arithmetic.
__shared__ int32_t s_kv_extent;

// index_error records the first out-of-range index of the launch (the op,
// the index as read, the size it indexes) and raises the abort flag: the
// launch finishes without the bad write and the host raises MpkRuntimeError.
__device__ __noinline__ void index_error(int64_t index, int64_t size) {
  const Fault f = s_fault;
  if (f.status == nullptr || atomicCAS(f.abort, 0, 1) != 0) return;
  f.status->worker = f.worker;
  f.status->task = f.task;
  f.status->event = f.op;
  f.status->count = (uint32_t)index;
  f.status->needed = (uint32_t)size;
  f.status->waited_ns = (uint64_t)index;
  __threadfence();
  f.status->aborted = MPK_ABORT_INDEX;
}

// give_up records why this worker stops (the first to give up wins) and
// raises the abort flag every worker polls.
__device__ __noinline__ void give_up(const State& st, int32_t code, int worker, int task, int event, uint32_t seen,
                                     uint32_t need, uint64_t waited) {
  if (atomicCAS(st.abort, 0, 1) == 0) {
    st.status->worker = worker;
    st.status->task = task;
    st.status->event = event;
    st.status->count = seen;
    st.status->needed = need;
    st.status->waited_ns = waited;
    __threadfence();
    st.status->aborted = code;
  }
}

// wait_event spins (one thread) until counter e reaches need. It returns
// false when the kernel is aborting: this wait ran out of budget (and recorded
// why) or another worker gave up. One thread a worker polls (the fetcher
// warp's, ahead of the consumers), always hot: a sleep's wake-up comes late
// (a back-off with __nanosleep(100) added ~0.9 us to every dependent task's
// start, bench/NOTES.md).
__device__ bool wait_event(const State& st, int e, uint32_t need, int worker, int task) {
  uint32_t seen = ld_acquire(st.counters + e);
  if ((int32_t)(seen - need) >= 0) return true;
  uint64_t start = globaltimer();
  for (unsigned polls = 0;; ++polls) {
    seen = ld_acquire(st.counters + e);
    if ((int32_t)(seen - need) >= 0) return true;
    if ((polls & 255) != 255) continue;
    if (aborting(st.abort)) return false;
    uint64_t waited = globaltimer() - start;
    if (waited > st.budget_ns) {
      give_up(st, MPK_ABORT_WAIT, worker, task, e, seen, need, waited);
      return false;
    }
  }
}

// Weights are read once per step and outnumber L2 (tens of MB a layer against
// 50 MB): their lines are marked evict-first, so streaming them does not push
// out what every task re-reads (op descriptors, code, activations, the KV cache).
__device__ __forceinline__ uint64_t weight_policy() {
  uint64_t p = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
#endif
  return p;
}

// ld_weight: a 16-byte non-coherent weight load under that policy.
__device__ __forceinline__ uint4 ld_weight(const void* p, uint64_t policy) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p), "l"(policy));
  return v;
#else
  return __ldg(reinterpret_cast<const uint4*>(p));
#endif
}

// The CTA-scope handoff from the consumers to the signaller warp: the
// consumers' writes, a consumer barrier, then a release store of the count of
// finished tasks; the signaller's acquire load of it, then its release add at
// gpu scope, makes every one of those writes visible to the acquiring waiter
// (the causality order is transitive), with no extra fence on the consumers.
__device__ __forceinline__ uint32_t ld_acquire_cta(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.cta.shared.u32 %0, [%1];" : "=r"(v) : "r"(static_cast<uint32_t>(__cvta_generic_to_shared(p))) : "memory");
  return v;
}

__device__ __forceinline__ void st_release_cta(uint32_t* p, uint32_t v) {
  asm volatile("st.release.cta.shared.u32 [%0], %1;" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(p))), "r"(v) : "memory");
}

}  // namespace mpk
