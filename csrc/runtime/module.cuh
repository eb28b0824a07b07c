// The megakernel and the module's C ABI (module_abi.h). Included at the end
// of a generated module.cu, after the mpk_gen tables and run_task.
//
// A worker (one CTA, kept resident by the occupancy check) has four roles:
//  - the fetcher warp walks the worker's static queue one task ahead of the
//    consumers: it copies the next task's descriptor into shared memory and
//    waits for its event, so a task starts without a memory round trip;
//  - consumer warps run the tasks the fetcher hands them, and hand each
//    finished task to the signaller;
//  - the loader warp streams the weights of the queue's Linear tasks into the
//    ring (runtime/ring.cuh) ahead of the consumers, across task boundaries,
//    waiting only for a free page: weights are never written in a launch, so
//    the next task's weights arrive while its inputs are still being made;
//  - the signaller warp publishes each finished task (its event's release
//    add), so the consumers never wait for the release to land.
#pragma once
#include <cuda.h>  // CUtensorMap and its encoder's types (the encoder itself: the runtime's driver entry point)
#include <stdio.h>
#include <string.h>

#include "runtime/ring.cuh"
#include "runtime/tmaps.cuh"

#if defined(MPK_WG_SW128) && !MPK_WG_SW128
#error "MPK_WG_SW128=0 is bench/gemm_task.cu's A/B: codegen's page maps are 128-byte swizzled (stream.WgmmaRowBytes)"
#endif

namespace mpk_gen {

using Ring = mpk::Ring<kRingSlots>;
constexpr int kScratchOffset = mpk::ring_bars_bytes<kRingSlots>() + kRingPages * mpk::kPageBytes;
// With wgmma streams the ring's pages start 1,024-byte aligned (the pattern
// of their 128-byte-swizzled pages, which the tensor map's copy and wgmma
// both take from the address): the worker skips up to kRingAlign bytes
// (codegen's ringBarsBytes counts them). Other modules keep the ring at the
// start of shared memory, where every address is a constant (aligned at run
// time, every decode step was 4-5% slower: bench/NOTES.md thirty-fourth
// session).
// Swizzled kv pages (kKVSwizzle) take the pattern from the address as the
// copy does (mpk::DecodeMma's BLOCK), so they keep the ring where it is;
// MPK_KV_SWIZZLE_ALIGN=1 (an A/B knob, not yet run) aligns it anyway, in
// case the copies want their pattern's 1,024 bytes (the budget has them).
#ifndef MPK_KV_SWIZZLE_ALIGN
#define MPK_KV_SWIZZLE_ALIGN 0
#endif
constexpr int kRingAlign = kWgmmaStreams || (kKVSwizzle && MPK_KV_SWIZZLE_ALIGN) ? 1024 : 1;
constexpr int kDynamicSharedBytes = (kRingAlign > 1 ? kRingAlign : 0) + kScratchOffset + kSharedBytes;
// Pages in flight per worker: enough for HBM, few enough that the other L2
// traffic (activations, counters) does not queue behind them (bench/NOTES.md);
// MPK_QUIET_PAGES outside the consumers' dots (runtime/runtime.cuh).
constexpr uint32_t kInFlightPages = MPK_INFLIGHT_PAGES;
constexpr uint32_t kQuietPages = MPK_QUIET_PAGES;
#ifndef MPK_INFLIGHT_BYTES
#define MPK_INFLIGHT_BYTES 1  // in_flight_pages: depth by bytes, not pages
#endif

// With MPK_TRACE, per task: when its wait began, when it started, when it
// ended (globaltimer ns), its op and worker, how many pages of the ring had
// landed ahead of the consumers when it started, how long its first warp
// waited for pages, and when it had staged x and finished the dots (streamed
// tasks); mpk_trace copies them out.
struct TraceRecord {
  unsigned long long wait_ns, start_ns, end_ns;
  int32_t op, worker;
  int32_t landed;
  uint32_t stall_ns;
  uint32_t staged_ns, dots_ns;  // streamed tasks: when x was staged, when the dots were done (from the start)
};
#ifdef MPK_TRACE
__device__ TraceRecord trace_records[kNumTasks];
#endif

// in_flight_pages is how many of a stream's pages the loader keeps in flight
// while the consumers multiply pages: kInFlightPages of full ones' bytes (a
// page of whole rows holds less where a row does not divide it: qwen3's down
// projections, K = 3,072 to 12,288, fill 12 KB of 16).
// A GEMM stream takes the same (five in flight measured no faster for a
// 64-token chunk, bench/NOTES.md thirtieth session).
__device__ __forceinline__ uint32_t in_flight_pages(const mpk::Stream& sd) {
  const int64_t page = sd.tile_rows > 0 ? (int64_t)sd.tile_rows * sd.page_bytes : sd.page_bytes;
  if (!MPK_INFLIGHT_BYTES || page <= 0 || page >= mpk::kPageBytes) return kInFlightPages;
  return (uint32_t)((kInFlightPages * mpk::kPageBytes + page - 1) / page);
}

// MPK_TMA_PAGES (1 by default; 0 an A/B knob): a tile or GEMM page whose
// weights have a tensor map (codegen's tmapOf) is one 2-D copy of its box,
// not a bulk copy a row: 32 row copies of 512 bytes a page kept a GEMM
// stream at 0.41 of the copy rate, one box copy at 0.88-0.96
// (bench/gemm_pages.cu, bench/NOTES.md thirty-first session).
#ifndef MPK_TMA_PAGES
#define MPK_TMA_PAGES 1
#endif
static_assert(!kWgmmaStreams || (MPK_TMA_PAGES && MPK_GEMM_BLOCKED_PAGES),
              "a wgmma stream's pages are swizzled tensor-map boxes in column blocks");

// load_weights is the loader's loop (one lane): every page of every streamed
// task of worker w, in queue order, at most in_flight_pages in flight. A slot
// that stays busy past the budget means the consumers stopped: it gives up.
// A stream's pages are contiguous bytes, or tile pages (tasks/tiles.cuh):
// row groups in order, each group's column blocks left to right (a pair:
// the first weight's, then the second's; x in parts of K: so for each
// part's columns, part after part); or, for a
// GEMM stream (tasks/gemm.cuh), column blocks in order, each block's row
// groups top to bottom.
__device__ __noinline__ void load_weights(const Ring ring, const mpk::Slots<kNumSlots>& slots, const mpk::State& st,
                                          int w) {
  const uint64_t policy = mpk::weight_policy();
  uint32_t seq = 0;
  uint32_t full = kInFlightPages;  // the current stream's depth in the dots (in_flight_pages)
  // acquire waits until page seq may be issued; false: the launch is over.
  // may_issue: page seq's slot is free and fewer than the phase's depth are in flight.
  auto may_issue = [&]() {
    const uint32_t depth = !mpk::kQuietStream || *(volatile uint32_t*)&mpk::s_dots ? full : kQuietPages;
    return ring.slot_free(seq) && depth > 0 && (seq < depth || ring.ready(seq - depth));
  };
  // poll_until(t, ready) polls until ready() holds; false: the launch is over
  // (aborted, or the wait outlasted the budget: the loader gives up).
  auto poll_until = [&](int t, auto ready) {
    uint64_t start = 0;
    for (uint32_t polls = 0; !ready(); ++polls) {
      if ((polls & 1023) != 1023) continue;
      const uint64_t now = mpk::globaltimer();
      if (start == 0) start = now;
      if (mpk::aborting(st.abort) || now - start > st.budget_ns) {
        if (!mpk::aborting(st.abort)) mpk::give_up(st, MPK_ABORT_WAIT, w, t, -1, seq, 0, now - start);
        // Pages in flight land on their own; wait for every slot's last fill
        // (page s for s in [seq - slots, seq)) before the CTA's shared memory goes away.
        for (uint32_t s = seq > kRingSlots ? seq - kRingSlots : 0; s < seq; ++s)
          while (!ring.ready(s)) {
          }
        return false;
      }
    }
    return true;
  };
  auto acquire = [&](int t) { return poll_until(t, may_issue); };
  for (int q = queue_start[w]; q < queue_start[w + 1]; ++q) {
    const mpk::Stream sd = streams[queue[q]];
    full = in_flight_pages(sd);
    const char* src = static_cast<const char*>(slots.p[sd.slot]) + sd.offset;
    if (sd.tile_rows == 0) {
      int64_t bytes = sd.bytes;
      if (sd.kv_j0 >= 0) {  // a kv chunk's rows below the extent, once a task has read it
        int32_t extent = -1;
        if (!poll_until(queue[q], [&] { return (extent = *(volatile int32_t*)&mpk::s_kv_extent) >= 0; })) return;
        bytes = min(bytes, max((int64_t)0, (int64_t)extent - sd.kv_j0) * sd.row_bytes);
      }
      // A kv chunk taken round by round (kv_interleave): a page of K rows,
      // then the page of V of the same rows (mpk::KVPages' STREAM); with
      // tensor maps (codegen's kvStream.Swizzle), a page is one box of
      // each (whole: rows past the chunk's land too, and are never read),
      // 128-byte swizzled.
      if (sd.kv_interleave) {
        const char* vsrc = static_cast<const char*>(slots.p[sd.pair_slot]) + sd.pair_offset;
        const char* maps = static_cast<const char*>(st.tmaps);
        for (int64_t off = 0; off < bytes; off += sd.page_bytes)
          for (int part = 0; part < 2; ++part, ++seq) {
            if (!acquire(queue[q])) return;
            if (kKVSwizzle && sd.tmap >= 0)
              ring.fill_box(seq, maps + 128 * (part ? sd.pair_tmap : sd.tmap), 0,
                            sd.tmap_row + (int)(off / sd.row_bytes), (uint32_t)sd.page_bytes, policy, true);
            else
              ring.fill(seq, (part ? vsrc : src) + off, (uint32_t)min((int64_t)sd.page_bytes, bytes - off), policy);
          }
        continue;
      }
      // A paired Linear's second weight (pair_slot >= 0), or a kv chunk's V:
      // the same rows' bytes, pages of their own after the first's.
      for (int part = 0; part < (sd.pair_slot >= 0 ? 2 : 1); ++part) {
        if (part == 1) src = static_cast<const char*>(slots.p[sd.pair_slot]) + sd.pair_offset;
        for (int64_t off = 0; off < bytes; off += sd.page_bytes, ++seq) {
          if (!acquire(queue[q])) return;
          ring.fill(seq, src + off, (uint32_t)min((int64_t)sd.page_bytes, bytes - off), policy);
        }
      }
      continue;
    }
    const int64_t rows = sd.bytes / sd.row_bytes;
    // A tile page: one copy of its tensor map's box (codegen's tmapOf), or
    // its rows' segments one bulk copy each.
    // A GEMM page lands in column blocks (tasks/gemm.cuh's gemm_page_at).
    const bool boxes = MPK_TMA_PAGES && sd.tmap >= 0, blocked = MPK_GEMM_BLOCKED_PAGES && sd.block_bytes > 0;
    auto fill_tile = [&](int part, int64_t r, int64_t col) {
      if (boxes) {
        const char* maps = static_cast<const char*>(st.tmaps);
        ring.fill_box(seq, maps + 128 * (part ? sd.pair_tmap : sd.tmap), mpk::page_map_x(col, blocked ? sd.block_bytes : 0),
                      sd.tmap_row + (int)r, (uint32_t)(sd.tile_rows * sd.page_bytes), policy, blocked);
      } else {
        const char* from = (part ? static_cast<const char*>(slots.p[sd.pair_slot]) + sd.pair_offset : src) +
                           r * sd.row_bytes + col;
        const int n = (int)min((int64_t)sd.tile_rows, rows - r);
        if (blocked)
          ring.fill_rows_blocked(seq, from, n, sd.row_bytes, (uint32_t)sd.page_bytes, sd.block_bytes, sd.tile_rows,
                                 policy);
        else
          ring.fill_rows(seq, from, n, sd.row_bytes, (uint32_t)sd.page_bytes, policy);
      }
    };
    if (sd.block_bytes > 0) {  // a GEMM stream (tasks/gemm.cuh): each block of columns' row groups, block after block
      // A pair's block: the first weight's row groups, then the second's.
      for (int64_t col = 0; col < sd.row_span; col += sd.page_bytes)
        for (int part = 0; part < (sd.pair_slot >= 0 ? 2 : 1); ++part)
          for (int64_t r = 0; r < rows; r += sd.tile_rows, ++seq) {
            if (!acquire(queue[q])) return;
            fill_tile(part, r, col);
          }
      continue;
    }
    // x staged in parts of K (mpk::linear_tiles' XP): each part's row
    // groups in order, part after part; else one part, K whole. A pair:
    // each row group's pages of the first weight, then of the second (in
    // parts: the part's columns of each).
    const int64_t part_span = sd.row_span / max(1, sd.x_parts);
    for (int64_t c0 = 0; c0 < sd.row_span; c0 += part_span)
      for (int64_t r = 0; r < rows; r += sd.tile_rows)
        for (int part = 0; part < (sd.pair_slot >= 0 ? 2 : 1); ++part)
          for (int64_t col = c0; col < c0 + part_span; col += sd.page_bytes, ++seq) {
            if (!acquire(queue[q])) return;
            fill_tile(part, r, col);
          }
  }
}

// signal_tasks is the signaller's loop (one lane): once the consumers have
// finished the j-th task of worker w's queue (*done > j), its event gets the
// release add. Its poll of shared memory shares a scheduler with consumer
// warps; a pause between polls measured neutral (bench/NOTES.md, eighteenth
// session).
__device__ __noinline__ void signal_tasks(const mpk::State& st, int w, const uint32_t* done) {
  const int q0 = queue_start[w];
  for (int q = q0; q < queue_start[w + 1]; ++q) {
    const int e = tasks[queue[q]].trigger;
    if (e < 0) continue;
    for (uint32_t polls = 0; mpk::ld_acquire_cta(done) <= (uint32_t)(q - q0); ++polls) {
      if ((polls & 1023) == 1023 && mpk::aborting(st.abort)) return;
    }
    mpk::red_release(st.counters + e, 1);
  }
}

// The fetcher's handoff of a task to the consumers: its descriptor and its
// queue entry, in one of two buffers (task i of the queue uses buffer i & 1).
struct Fetched {
  mpk::Op op;
  mpk::Task task;
  int t;  // the task's index in the task table
};
constexpr int kOpWords = sizeof(mpk::Op) / sizeof(int2);
static_assert(sizeof(mpk::Op) % sizeof(int2) == 0, "the op descriptor is copied as int2 words");
constexpr uint32_t kFetchAborted = 0xffffffffu;  // s_ready when the fetcher gave up

// fetch_tasks is the fetcher warp's loop: for each task of worker w's queue,
// in order, once the consumers are done with its buffer (task i - 2), it
// copies the task's entry and op descriptor into buffer i & 1, waits for its
// event, and publishes it (s_ready = i + 1). The consumers then start a task
// without a memory round trip: the table loads and the event poll of the
// next task overlap the task before it (a transition cost ~1.5 us of
// dependent L2 loads when the consumers did them).
__device__ __noinline__ void fetch_tasks(const mpk::State& st, int w, uint32_t step, Fetched* buf,
                                         uint32_t* ready, const uint32_t* done) {
  const int lane = threadIdx.x % 32, q0 = queue_start[w];
  for (int q = q0; q < queue_start[w + 1]; ++q) {
    const uint32_t i = (uint32_t)(q - q0);
    const int t = queue[q];
    const mpk::Task task = tasks[t];
    int2 words[(kOpWords + 31) / 32];
    if (task.op >= 0) {
      const int2* src = reinterpret_cast<const int2*>(&ops[task.op]);
#pragma unroll
      for (int k = 0; k < (kOpWords + 31) / 32; ++k)
        if (lane + 32 * k < kOpWords) words[k] = src[lane + 32 * k];
    }
    // Buffer i & 1 last held task i - 2: wait until the consumers finished it.
    if (i >= 2)
      for (uint32_t polls = 0; mpk::ld_acquire_cta(done) < i - 1; ++polls)
        if ((polls & 1023) == 1023 && mpk::aborting(st.abort)) {
          if (lane == 0) mpk::st_release_cta(ready, kFetchAborted);
          return;
        }
    Fetched& f = buf[i & 1];
    if (task.op >= 0) {
      int2* dst = reinterpret_cast<int2*>(&f.op);
#pragma unroll
      for (int k = 0; k < (kOpWords + 31) / 32; ++k)
        if (lane + 32 * k < kOpWords) dst[lane + 32 * k] = words[k];
    }
    bool go = true;
    if (lane == 0) {
      f.task = task;
      f.t = t;
      if (task.wait >= 0) go = mpk::wait_event(st, task.wait, event_needed[task.wait] * step, w, t);
    }
    go = __shfl_sync(0xffffffffu, go, 0);
    __syncwarp();
    if (lane == 0) mpk::st_release_cta(ready, go ? i + 1 : kFetchAborted);
    if (!go) return;
  }
}

// Thresholds grow with the launch count, so counters are never reset
// between steps.
__global__ void __launch_bounds__(mpk::kWorkerThreads, 1)
    megakernel(const __grid_constant__ mpk::Slots<kNumSlots> slots, const mpk::State st) {
  extern __shared__ __align__(128) char smem_base[];
  __shared__ uint32_t s_step, s_done, s_ready, s_tasks;
  __shared__ int s_go, s_xkey, s_next_xkey;
  // The next two tasks, as the fetcher warp hands them over: the task code
  // reads its op descriptor's shapes and strides many times.
  __shared__ __align__(16) Fetched s_fetched[2];
  // The slot pointers, copied: a task indexes them at run time, and an
  // indexed read of the kernel parameter is a generic load, one more
  // dependent round trip before its first load of data (codegen's ring
  // sizing leaves room for them).
  __shared__ mpk::Slots<kNumSlots> s_slots;
  const int w = blockIdx.x, warp = threadIdx.x / 32;
  for (int i = threadIdx.x; i < kNumSlots; i += blockDim.x) s_slots.p[i] = slots.p[i];

  char* const smem = smem_base + (kRingAlign - (mpk::smem_u32(smem_base) + mpk::ring_bars_bytes<kRingSlots>()) % kRingAlign) % kRingAlign;
  const Ring ring = mpk::ring_at<kRingSlots>(smem);
  if (threadIdx.x == 0) {
    s_step = *(volatile uint32_t*)st.epoch + 1;
    s_done = 0;
    s_ready = 0;
    s_tasks = (uint32_t)(queue_start[w + 1] - queue_start[w]);
    s_xkey = -1;
    mpk::s_dots = 0;
    mpk::s_kv_extent = -1;
    mpk::s_fault = mpk::Fault{st.abort, st.status, w, -1, -1};
    if (kRingPages > 0) ring.init(mpk::kConsumerWarps);
  }
  __syncthreads();  // the last barrier of all warps: the roles part here
  const uint32_t step = s_step;
  if (warp == mpk::kLoaderWarp) {
    if (threadIdx.x % 32 == 0 && kRingPages > 0) load_weights(ring, slots, st, w);
    return;
  }
  if (warp == mpk::kSignalWarp) {
    if (threadIdx.x % 32 == 0) signal_tasks(st, w, &s_done);
    return;
  }
  if (warp == mpk::kFetchWarp) {
    fetch_tasks(st, w, step, s_fetched, &s_ready, &s_done);
    return;
  }
  // The loop keeps no state in registers across a task's call (which
  // clobbers them): the task's index is s_done, the tasks finished, and the
  // count is s_tasks. Held in registers, ptxas kept the loop's bounds and
  // index in local memory, and their reload (an L1 miss: L1 is what the
  // shared-memory carve-out leaves) was a dependent round trip at every
  // task's start and end. seq comes back from run_task.
  uint32_t seq = 0;  // the consumers' place in the ring
  for (;;) {
#ifdef MPK_TRACE
    unsigned long long wait_ns = mpk::globaltimer();
#endif
    if (threadIdx.x == 0) {
      const uint32_t i = s_done;
      uint32_t r = 0;
      if (i < s_tasks)
        while ((r = mpk::ld_acquire_cta(&s_ready)) <= i) {
        }
      s_go = i < s_tasks && r != kFetchAborted;
    }
    mpk::consumer_sync();
    if (!s_go) break;
    const Fetched& f = s_fetched[s_done & 1];
    const int t = f.t;
    const mpk::Task task = f.task;
#ifdef MPK_TRACE
    if (threadIdx.x == 0) {
      trace_records[t].wait_ns = wait_ns, trace_records[t].start_ns = mpk::globaltimer();
      int landed = 0;
      while (kRingPages > 0 && landed < kRingSlots && ring.ready(seq + landed)) ++landed;
      trace_records[t].landed = landed;
      mpk::s_trace_stall = 0;
      mpk::s_trace_start = trace_records[t].start_ns;
      mpk::s_trace_staged = mpk::s_trace_dots = 0;
    }
#endif
    // The task a bad index is blamed on (read after the task's barriers),
    // and the x it leaves staged (s_xkey once it ends).
    if (threadIdx.x == 0) {
      mpk::s_fault.task = t, mpk::s_fault.op = task.op;
      s_next_xkey = task.op >= 0 ? f.op.xkey : -1;
    }
    if (task.op >= 0) {
      // A streamed Linear finds x already staged when the previous task
      // staged the same x (q, k and v read one normalised row).
      const mpk::Ctx c{smem + kScratchOffset, smem, seq, st.abort, f.op.xkey >= 0 && f.op.xkey == s_xkey,
                       static_cast<const char*>(st.tmaps)};
#if defined(MPK_TRACE) && defined(MPK_PROBE_WARM)
      // Probe (not for use): an attention task runs twice and is timed the
      // second time, its code and data warm; what it writes is the same.
      if (f.op.kind == mpk::OP_ATTENTION) {
        run_task(f.op, task.lo, task.hi, s_slots, c);
        mpk::consumer_sync();
        if (threadIdx.x == 0) trace_records[t].start_ns = mpk::globaltimer();
      }
#endif
      seq = run_task(f.op, task.lo, task.hi, s_slots, c);
    }
    mpk::set_dots_phase(0);  // a task that ended in its dots (aborting) leaves the stream quiet
    mpk::consumer_sync();
    if (threadIdx.x == 0) {
      // s_done is unchanged until the release below, so the buffer is the
      // task's still (the fetcher refills it after that release).
      const uint32_t done = s_done;
#ifdef MPK_TRACE
      const Fetched& e = s_fetched[done & 1];
      trace_records[e.t].end_ns = mpk::globaltimer();
      trace_records[e.t].op = e.task.op;
      trace_records[e.t].worker = w;
      trace_records[e.t].stall_ns = mpk::s_trace_stall;
      trace_records[e.t].staged_ns = mpk::s_trace_staged;
      trace_records[e.t].dots_ns = mpk::s_trace_dots;
#endif
      s_xkey = s_next_xkey;
      mpk::st_release_cta(&s_done, done + 1);
    }
  }
  mpk::consumer_sync();
  if (threadIdx.x == 0) {
    __threadfence();
    // The last worker to finish has seen every worker start, so all have
    // read the old epoch: it may now advance it.
    if (atomicAdd(st.finished, 1) + 1 == gridDim.x * step) atomicExch(st.epoch, step);
  }
}

static int32_t fail(char* err, int32_t errlen, const char* what, cudaError_t e) {
  if (err && errlen > 0) snprintf(err, errlen, "%s: %s", what, cudaGetErrorString(e));
  return 1;
}

}  // namespace mpk_gen

// An instance's device state: counters, epoch, finished, abort and status in
// one allocation, the pinned copy of the status the host reads, and the event
// that says the copy landed (recorded by launches outside a capture); and the
// tensor maps of its tile pages (kTmaps), encoded from the slot pointers of
// the last launch that changed them, a pinned copy and the device's.
struct MpkInstance {
  mpk::State st;
  void* block;
  size_t bytes;
  MpkStatus* host_status;
  cudaEvent_t copied;
  bool pending;  // copied was recorded and not yet polled
  CUtensorMap* tmaps_host;
  void* tmaps_dev;
  const char* tmap_bases[mpk_gen::kNumTmaps > 0 ? mpk_gen::kNumTmaps : 1];  // what each map describes now
};

namespace mpk_gen {

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// encode_tiled is the driver's cuTensorMapEncodeTiled (null if the driver
// lacks it), found through the runtime so the module needs no -lcuda.
static EncodeTiled encode_tiled() {
  static const EncodeTiled fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      return EncodeTiled(nullptr);
    }
    return reinterpret_cast<EncodeTiled>(p);
  }();
  return fn;
}

// update_tmaps re-encodes the tensor maps when a weight they describe moved
// (the first launch: all) and copies them to the device on stream s ahead of
// the launch. Weights rarely move, so most launches only compare pointers.
// (A graph captured over a launch replays the copy it recorded, which reads
// the pinned maps as they are at replay: the launch's own, unless a later
// launch of this instance moved the weights, and then the graph's slot
// pointers are stale too.)
static int32_t update_tmaps(MpkInstance* inst, void* const* slot_ptrs, cudaStream_t s, char* err, int32_t errlen) {
  bool moved = false;
  for (int i = 0; i < kNumTmaps && !moved; ++i)
    moved = static_cast<const char*>(slot_ptrs[kTmaps[i].slot]) + kTmaps[i].offset != inst->tmap_bases[i];
  if (!moved) return 0;
  // The last copy may still read the pinned maps: let it land first (a
  // capture may not wait, and records no launch before this one's copy).
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(s, &capture) != cudaSuccess) (void)cudaGetLastError();
  if (capture == cudaStreamCaptureStatusNone) {
    const cudaError_t e = cudaStreamSynchronize(s);
    if (e != cudaSuccess) return fail(err, errlen, "cudaStreamSynchronize(before re-encoding tensor maps)", e);
  }
  for (int i = 0; i < kNumTmaps; ++i) {
    const mpk::TmapSpec& m = kTmaps[i];
    const char* base = static_cast<const char*>(slot_ptrs[m.slot]) + m.offset;
    if (reinterpret_cast<uintptr_t>(base) % 16 != 0) {
      snprintf(err, errlen, "pointer slot %d: the streamed weights at %p are not 16-byte aligned", m.slot,
               static_cast<const void*>(base));
      return 1;
    }
    const bool blocks = MPK_GEMM_BLOCKED_PAGES && m.block_cols > 0;  // a GEMM page's map: 3-D
    const CUresult r = m.split_x ? mpk::encode_split_x_map(encode_tiled(), &inst->tmaps_host[i], m, base)
                                 : mpk::encode_page_map(encode_tiled(), &inst->tmaps_host[i], m, base, blocks);
    if (r != CUDA_SUCCESS) {
      snprintf(err, errlen, "cuTensorMapEncodeTiled (pointer slot %d, %lld x %lld %s, rank %d): CUresult %d", m.slot,
               (long long)m.rows, (long long)m.cols, m.split_x ? "groups of a split x" : "units of 8 bytes",
               m.split_x ? 4 : blocks ? 3 : 2, (int)r);
      return 1;
    }
    inst->tmap_bases[i] = base;
  }
  const cudaError_t e =
      cudaMemcpyAsync(inst->tmaps_dev, inst->tmaps_host, sizeof(CUtensorMap) * kNumTmaps, cudaMemcpyHostToDevice, s);
  if (e != cudaSuccess) {
    for (int i = 0; i < kNumTmaps; ++i) inst->tmap_bases[i] = nullptr;  // not on the device: encode again next time
    return fail(err, errlen, "cudaMemcpyAsync(tensor maps)", e);
  }
  return 0;
}

}  // namespace mpk_gen

extern "C" {

int32_t mpk_num_slots(void) { return mpk_gen::kNumSlots; }
int32_t mpk_num_inputs(void) { return mpk_gen::kNumInputs; }
int32_t mpk_num_outputs(void) { return mpk_gen::kNumOutputs; }
int32_t mpk_num_workers(void) { return mpk_gen::kNumWorkers; }
int32_t mpk_num_tasks(void) { return mpk_gen::kNumTasks; }
uint64_t mpk_arena_bytes(void) { return mpk_gen::kArenaBytes; }

void mpk_destroy(MpkInstance* inst) {
  if (inst == nullptr) return;
  if (inst->block) cudaFree(inst->block);
  if (inst->host_status) cudaFreeHost(inst->host_status);
  if (inst->copied) cudaEventDestroy(inst->copied);
  if (inst->tmaps_dev) cudaFree(inst->tmaps_dev);
  if (inst->tmaps_host) cudaFreeHost(inst->tmaps_host);
  delete inst;
}

int32_t mpk_reset(MpkInstance* inst) {
  cudaError_t e = cudaMemset(inst->block, 0, inst->bytes);
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  memset(inst->host_status, 0, sizeof(MpkStatus));
  inst->pending = false;
  return e == cudaSuccess ? 0 : 1;
}

int32_t mpk_create(uint64_t budget_ns, MpkInstance** out, char* err, int32_t errlen) {
  using namespace mpk_gen;
  *out = nullptr;
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
  e = cudaFuncSetAttribute(megakernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kDynamicSharedBytes);
  if (e != cudaSuccess) return fail(err, errlen, "cudaFuncSetAttribute(shared memory)", e);
  int per_sm = 0;
  e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, megakernel, mpk::kWorkerThreads, kDynamicSharedBytes);
  if (e != cudaSuccess) return fail(err, errlen, "cudaOccupancyMaxActiveBlocksPerMultiprocessor", e);
  // A persistent kernel whose workers are not all resident deadlocks.
  if ((long long)per_sm * sms < kNumWorkers) {
    snprintf(err, errlen,
             "occupancy check failed: %d workers need to be resident at once but the device fits %d per SM x %d SMs "
             "(%d threads, %d bytes of shared memory each); compile with fewer workers",
             kNumWorkers, per_sm, sms, mpk::kWorkerThreads, kDynamicSharedBytes);
    return 1;
  }
  MpkInstance* inst = new MpkInstance{};
  inst->bytes = sizeof(uint32_t) * (kNumEvents + 2) + sizeof(int32_t) + sizeof(MpkStatus) + 64;
  e = cudaMalloc(&inst->block, inst->bytes);
  if (e == cudaSuccess) e = cudaHostAlloc(reinterpret_cast<void**>(&inst->host_status), sizeof(MpkStatus), cudaHostAllocDefault);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&inst->copied, cudaEventDisableTiming);
  if (e == cudaSuccess && kNumTmaps > 0) e = cudaMalloc(&inst->tmaps_dev, sizeof(CUtensorMap) * kNumTmaps);
  if (e == cudaSuccess && kNumTmaps > 0)
    e = cudaHostAlloc(reinterpret_cast<void**>(&inst->tmaps_host), sizeof(CUtensorMap) * kNumTmaps, cudaHostAllocDefault);
  if (e != cudaSuccess) {
    mpk_destroy(inst);
    return fail(err, errlen, "allocating the instance state", e);
  }
  char* p = static_cast<char*>(inst->block);
  inst->st.counters = reinterpret_cast<uint32_t*>(p);
  inst->st.epoch = inst->st.counters + kNumEvents;
  inst->st.finished = inst->st.epoch + 1;
  inst->st.abort = reinterpret_cast<int32_t*>(inst->st.finished + 1);
  inst->st.status = reinterpret_cast<MpkStatus*>((reinterpret_cast<uintptr_t>(inst->st.abort + 1) + 15) & ~uintptr_t(15));
  inst->st.budget_ns = budget_ns;
  inst->st.tmaps = inst->tmaps_dev;
  if (kNumTmaps > 0 && encode_tiled() == nullptr) {
    mpk_destroy(inst);
    snprintf(err, errlen, "the CUDA driver has no cuTensorMapEncodeTiled (tile pages need a driver of CUDA 12 or later)");
    return 1;
  }
  if (mpk_reset(inst) != 0) {
    mpk_destroy(inst);
    return fail(err, errlen, "clearing the instance state", cudaGetLastError());
  }
  *out = inst;
  return 0;
}

int32_t mpk_launch(MpkInstance* inst, void* const* slot_ptrs, void* stream, char* err, int32_t errlen) {
  using namespace mpk_gen;
  mpk::Slots<kNumSlots> slots;
  for (int i = 0; i < kNumSlots; ++i) slots.p[i] = slot_ptrs[i];
  mpk::State st = inst->st;
  void* args[] = {&slots, &st};
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (update_tmaps(inst, slot_ptrs, s, err, errlen) != 0) return 1;
  cudaError_t e = cudaLaunchCooperativeKernel((void*)megakernel, dim3(kNumWorkers), dim3(mpk::kWorkerThreads), args,
                                              kDynamicSharedBytes, s);
  if (e != cudaSuccess) return fail(err, errlen, "cudaLaunchCooperativeKernel", e);
  e = cudaMemcpyAsync(inst->host_status, inst->st.status, sizeof(MpkStatus), cudaMemcpyDeviceToHost, s);
  if (e != cudaSuccess) return fail(err, errlen, "cudaMemcpyAsync(status)", e);
  // An event recorded in a capture cannot be queried afterwards: a captured
  // launch (or one whose stream cannot say, e.g. the legacy stream while
  // another thread captures) leaves the last direct launch's event to mpk_poll.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(s, &capture) != cudaSuccess) {
    (void)cudaGetLastError();  // leave no error behind for torch's checks
    return 0;
  }
  if (capture == cudaStreamCaptureStatusNone) {
    e = cudaEventRecord(inst->copied, s);
    if (e != cudaSuccess) return fail(err, errlen, "cudaEventRecord(status copied)", e);
    inst->pending = true;
  }
  return 0;
}

void mpk_status(const MpkInstance* inst, MpkStatus* out) {
  memcpy(out, (const void*)inst->host_status, sizeof(MpkStatus));
}

int32_t mpk_poll(MpkInstance* inst, void* stream, MpkStatus* out) {
  if (!inst->pending) return 0;
  // Under a global-mode capture a query would invalidate the capture.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &capture) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  if (capture != cudaStreamCaptureStatusNone) return 0;
  const cudaError_t e = cudaEventQuery(inst->copied);
  if (e == cudaErrorNotReady) {
    (void)cudaGetLastError();  // not an error: leave none behind for torch's checks
    return 0;
  }
  inst->pending = false;
  if (e != cudaSuccess) return 0;  // a sticky error: the next launch reports it
  memcpy(out, (const void*)inst->host_status, sizeof(MpkStatus));
  return 1;
}

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

}  // extern "C"
