// GEMM task micro-benchmark (issue 13): mpk::linear_gemm itself (the
// megakernel's task body for a prompt chunk's Linears, tasks/gemm.cuh) run
// alone, to say what bounds its ~2-6 us a block in the traces: the
// consumers' dots, or the weights' stream.
//
// One persistent launch of one CTA per SM (16 consumer warps and a loader
// warp, as the megakernel's workers) runs the tasks of L layers of one
// shape, dealt round-robin to the CTAs: the consumers call linear_gemm for
// each task, with x (M rows of fp32, as every intermediate) read from global
// memory; the loader's lane fills the ring of RING pages with one tensor-map
// box a page (3-D, in column blocks, as mpk_launch encodes a GEMM page's map
// with MPK_GEMM_BLOCKED_PAGES; 2-D with 0), as the megakernel's loader does.
// Two weight sources:
//   hbm  every task its own rows of L layers' weights (many times the L2):
//        the megakernel's stream
//   l2   every task the same 64 rows (L2-resident): the consumers' own
//        speed, the stream no bound
// The shapes are llama-3.2-1b's 64-token chunk's GEMM streams: the gate and
// up pair (4 pages a block, SiLU(gate)·up stored), a K slice of the down
// projection (64 rows) and a row block of the o projection (32 rows); with
// -DQWEN8B qwen3-8b's (the pair, row blocks of down and o); -DDECODE_BATCH=M a decode
// batch's (the pair and the LM head over M rows, as option gemm_batch streams them).
// Reported: us a block of 256 columns (a task's K/256 blocks, the CTA's
// tasks one after another) and weight bytes a second against the device copy
// rate; hbm's first launch is checked against a host reference at sampled
// outputs (fp64 from the same bf16 weights and fp32 x).
// Variants are nvcc defines, as for the megakernel (MPK_GEMM_HI_ONLY=1,
// MPK_GEMM_WARP_MTILES=2, MPK_GEMM_BLOCKED_PAGES=0, -DRING=8), and the
// task's probes, whose results are wrong and not checked (-DMPK_TRACE with
// -DMPK_PROBE_GEMM_NO_X: x staged once, every block reads it;
// -DMPK_PROBE_GEMM_NO_SYNC: no barrier between blocks). -DWGMMA=1 runs
// mpk::linear_wgmma (the wgmma option's task body: 64-row pages of 128
// columns, 128-byte swizzled) instead; -DWGMMA=2 / 3 the experimental bodies
// of bench/wgmma_ss.cuh (with -DMPK_WG_SW128=0: pages 64-byte swizzled, 64
// rows x 128 columns for 3; probes MPK_PROBE_SS_NO_MMA, _NO_XLOAD, _NO_FENCE, _NO_SYNC,
// _NO_XSTORE, _NO_EPI, _WAIT_ALL with -DMPK_TRACE, not all in every body;
// for WGMMA=1 MPK_PROBE_GEMM_NO_X, _GEMM_NO_SYNC, _WG_NO_MMA, _WG_NO_EPI);
// -DWGMMA=4 the experimental body of bench/wgmma_dx.cuh (no barrier a
// block: x by bulk copies on barriers of its own, pages released in order);
// -DWGMMA=5 the pair as bench/wgmma_p128.cuh's m64n128k16 (a page a column
// block of both weights, x's fragments loaded once for both), the other
// shapes as WGMMA=1; -DWGMMA=6 mpk::linear_wgmma with a split x (the
// split_gemm_x option's body, linear_wgmma_split: x stored as bf16 hi and lo
// planes, made here by the host, staged by its tensor map as wgmma's B);
// -DMPK_WG_SW128=0 (WGMMA=1 or 4) pages of 64-byte swizzled column blocks;
// probe MPK_PROBE_WG_NO_ALOAD (trace builds): no loads of x's fragments.
// Trace builds also print a task's phases (x staged, dots done, its end,
// thread 0's page stalls) from the first launch. -DSTREAM_ONLY:
// the consumers only wait for each page and release it (the loader's rate
// for that page layout).
//
//   nvcc -O3 -std=c++17 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -Icsrc \
//     bench/gemm_task.cu -o /tmp/gt -lcuda && /tmp/gt
//   (gpu_run.sh: JOBS="cu:gemm_task.cu:-lcuda")
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <vector>

#include "cuda_check.h"
#include "runtime/runtime.cuh"
#include "runtime/tmaps.cuh"
#include "tasks/tasks.cuh"
#include "wgmma_dx.cuh"  // the experimental task bodies (bench-only)
#include "wgmma_p128.cuh"
#include "wgmma_ss.cuh"

#if defined(MPK_PROBE_GEMM_NO_X) || defined(MPK_PROBE_GEMM_NO_SYNC) || defined(MPK_PROBE_SS_NO_XLOAD) || \
    defined(MPK_PROBE_SS_NO_MMA) || defined(STREAM_ONLY) || defined(MPK_PROBE_SS_NO_FENCE) || \
    defined(MPK_PROBE_SS_NO_SYNC) || defined(MPK_PROBE_SS_NO_XSTORE) || defined(MPK_PROBE_SS_NO_EPI) || \
    defined(MPK_PROBE_WG_NO_MMA) || defined(MPK_PROBE_WG_NO_EPI) || defined(MPK_PROBE_WG_NO_ALOAD)
constexpr bool kProbe = true;  // wrong results by design: not checked
#else
constexpr bool kProbe = false;
#endif

#ifndef WGMMA
#define WGMMA 0
#endif
// scratch_bytes is the task's shared memory besides the ring.
// WGMMA: the pages 64-byte swizzled, the ring and x 1,024-byte aligned.
__host__ __device__ constexpr int scratch_bytes(int M) {
  return WGMMA == 5 ? mpk::wgmma_p128_scratch_bytes()
         : WGMMA == 4 ? mpk::wgmma_dx_scratch_bytes()
         : WGMMA == 3 ? mpk::wgmma_ss64_scratch_bytes(!MPK_GEMM_HI_ONLY)
         : WGMMA == 2 ? mpk::wgmma_ss_scratch_bytes(!MPK_GEMM_HI_ONLY)
         : WGMMA    ? mpk::wgmma_scratch_bytes()
                    : mpk::gemm_scratch_bytes(M, true);
}
static_assert(!MPK_WG_SW128 || WGMMA == 0 || WGMMA == 1 || WGMMA >= 4,
              "bench/wgmma_ss.cuh's bodies read 64-byte swizzled pages: build WGMMA=2 and 3 with -DMPK_WG_SW128=0");
constexpr int kAlignPad = WGMMA ? 1024 : 0;  // ring_bars_bytes rounded up to 1,024 besides

#ifndef RING
#define RING 5  // llama-3.2-1b's 64-token chunk module: kRingPages
#endif
// The megakernel's worker size (its register budget: 96), the warps past the
// loader idle.
constexpr int kThreads = mpk::kWorkerThreads;
constexpr int kSlots = 3;  // x, the first weight (unread: pages come from the maps), out

// The pair's store: SiLU of the second weight's product times the first's
// (what the chunk's paired gate and up store), SiLU in fp32 as the
// megakernel's generated epilogue computes it (a double exp made the
// epilogue ~5 us a task).
struct SiluMul {
  static __device__ __forceinline__ double eval(const double* in, const int64_t*) {
    return (double)mpk::siluf((float)in[1]) * in[0];
  }
};

struct Args {
  mpk::Slots<kSlots> slots;
  const CUtensorMap* maps;  // the first weight's, the pair's second, then x's (WGMMA=4 and 6)
  const int32_t* abort;
  int tasks, per_layer, N;  // tasks in all; a layer's; weight rows a layer
  bool l2;                  // every task the same rows
  unsigned long long* phases;  // trace builds: ns summed over tasks (staged, dots, end, page stall), and tasks
};

template <int K, int M, bool PAIR>
__global__ void __launch_bounds__(kThreads, 1) gemm_tasks(const Args a) {
  using EPI = typename std::conditional<PAIR, mpk::PairEpi<SiluMul, 1, mpk::DT_FLOAT32>, mpk::NoEpi>::type;
  constexpr int SHARED = scratch_bytes(M);
  extern __shared__ __align__(128) char smem_raw[];
  // With WGMMA the pages start 1,024-byte aligned (the swizzle's pattern).
  char* smem = smem_raw;
  if (kAlignPad) {
    const uint32_t at = mpk::smem_u32(smem_raw) + mpk::ring_bars_bytes<RING>();
    smem += (1024 - at % 1024) % 1024;
  }
  const mpk::Ring<RING> ring = mpk::ring_at<RING>(smem);
  if (threadIdx.x == 0) ring.init(mpk::kConsumerWarps);
  __syncthreads();
  const int warp = threadIdx.x / 32;
  if (warp == mpk::kLoaderWarp) {  // one lane fills every page of this CTA's tasks, in the consumers' order
    if (threadIdx.x % 32 != 0) return;
    const uint64_t policy = mpk::weight_policy();
    uint32_t seq = 0;
    for (int t = blockIdx.x; t < a.tasks; t += gridDim.x) {
      const int row = a.l2 ? 0 : t / a.per_layer * a.N + t % a.per_layer * mpk::kGemmRows;
      if (WGMMA == 5 && PAIR) {  // a page a column block: the gate's rows, then the up's (two boxes)
        for (int cb = 0; cb < K / (mpk::kWgRowBytes / 2); ++cb, ++seq) {
          while (!ring.slot_free(seq)) {
          }
          uint64_t* bar = &ring.bars->full[seq % RING];
          mpk::mbar_expect_bytes(bar, 2 * mpk::kP128HalfBytes);
          for (int part = 0; part < 2; ++part)
            mpk::box_load_3d(ring.page(seq) + part * mpk::kP128HalfBytes, a.maps + part, 0, row, cb, bar, policy);
        }
        continue;
      }
      if (WGMMA == 1 || WGMMA >= 3) {  // 64 rows × 128 columns a page: column half after half, each weight's
        for (int h = 0; h < K / mpk::kWgPageCols; ++h)
          for (int part = 0; part < (PAIR ? 2 : 1); ++part, ++seq) {
            while (!ring.slot_free(seq)) {
            }
            const int x = mpk::page_map_x((int64_t)h * mpk::kWgPageCols * 2, mpk::kWgRowBytes);  // its first column block
            ring.fill_box(seq, a.maps + part, x, row, mpk::kPageBytes, policy, true);
          }
        continue;
      }
      for (int kb = 0; kb < K / mpk::kGemmCols; ++kb)
        for (int part = 0; part < (PAIR ? 2 : 1); ++part)
          for (int r = 0; r < mpk::kGemmRows; r += mpk::kGemmPageRows, ++seq) {
            while (!ring.slot_free(seq)) {
            }
            const int x = mpk::page_map_x((int64_t)kb * mpk::kGemmCols * 2, MPK_GEMM_BLOCKED_PAGES ? mpk::kGemmBlockBytes : 0);
            ring.fill_box(seq, a.maps + part, x, row + r, mpk::kPageBytes, policy, MPK_GEMM_BLOCKED_PAGES);
          }
    }
    return;
  }
  if (warp > mpk::kLoaderWarp) return;
  // The task's descriptor in shared memory, as the megakernel's fetcher
  // hands it to the consumers (a local copy of 1.6 KB sat on the stack).
  __shared__ mpk::Op op;
  auto view2 = [](int slot, int64_t offset, int64_t rows, int64_t cols) {
    mpk::View v = {};
    v.slot = slot, v.dtype = mpk::DT_FLOAT32, v.rank = 2, v.offset = offset;
    v.shape[0] = rows, v.shape[1] = cols, v.stride[0] = cols, v.stride[1] = 1;
    return v;
  };
  if (threadIdx.x == 0) {
    op = mpk::Op{};
    op.kind = mpk::OP_LINEAR;
    op.num_in = PAIR ? 3 : 2;
    op.epi_first = PAIR ? 2 : op.num_in;  // the pair's epilogue reads no memory (in[2]: a valid view all the same)
    op.epi_dtype = mpk::DT_FLOAT32;
    op.xkey = -1;
    op.in[0] = view2(0, 0, M, K);
    if (WGMMA == 6) op.in[0].dtype = mpk::DT_SPLIT_BF16, op.in[0].tmap = 1;  // maps[2]: Ctx.tmaps's first
    op.in[1] = view2(1, 0, a.N, K);
    op.in[1].dtype = mpk::DT_BFLOAT16;
  }
  mpk::Ctx c{smem + mpk::ring_bars_bytes<RING>() + RING * mpk::kPageBytes, smem, 0, a.abort, false,
             reinterpret_cast<const char*>(a.maps + 2)};
#ifdef MPK_TRACE
  unsigned long long phase[5] = {0, 0, 0, 0, 0};  // thread 0's sums: staged, dots, end, stall, tasks
#endif
  for (int t = blockIdx.x; t < a.tasks; t += gridDim.x) {
    const int layer = t / a.per_layer, lo = t % a.per_layer * mpk::kGemmRows;
    if (threadIdx.x == 0) op.out = op.in[2] = view2(2, (int64_t)layer * M * a.N, M, a.N);
#ifdef MPK_TRACE
    if (threadIdx.x == 0) mpk::s_trace_start = mpk::globaltimer(), mpk::s_trace_stall = 0;
#endif
    mpk::consumer_sync();
#ifdef STREAM_ONLY
    // Probe: the consumers only wait for each page and release it, so the
    // rate is the loader's stream of these pages alone.
    for (int p = 0; p < K / 128 * (PAIR ? 2 : 1); ++p, ++c.seq) {
      mpk::wait_page(ring, c.seq, a.abort);
      ring.release(c.seq);
    }
    continue;
#endif
    if constexpr (WGMMA == 6)
      c.seq = mpk::linear_wgmma<__nv_bfloat16, K, M, true, RING, false, EPI, true>(op, lo, lo + mpk::kGemmRows, a.slots, c);
    else if constexpr (WGMMA == 5 && PAIR)
      c.seq = mpk::linear_wgmma_p128<__nv_bfloat16, K, M, true, RING, false, EPI>(op, lo, lo + mpk::kGemmRows, a.slots, c);
    else if constexpr (WGMMA == 4)
      c.seq = mpk::linear_wgmma_dx<__nv_bfloat16, K, M, true, RING, false, EPI>(op, lo, lo + mpk::kGemmRows, a.slots, c,
                                                                                 a.maps + 2);
    else if constexpr (WGMMA == 3)
      c.seq = mpk::linear_wgmma_ss64<__nv_bfloat16, K, M, true, RING, false, EPI>(op, lo, lo + mpk::kGemmRows, a.slots, c);
    else if constexpr (WGMMA == 2)
      c.seq = mpk::linear_wgmma_ss<__nv_bfloat16, K, M, true, RING, false, EPI>(op, lo, lo + mpk::kGemmRows, a.slots, c);
    else if constexpr (WGMMA == 1 || WGMMA == 5)
      c.seq = mpk::linear_wgmma<__nv_bfloat16, K, M, true, RING, false, EPI, false>(op, lo, lo + mpk::kGemmRows, a.slots, c);
    else
      c.seq = mpk::linear_gemm<__nv_bfloat16, K, M, true, RING, false, EPI, SHARED>(op, lo, lo + mpk::kGemmRows, a.slots, c);
#ifdef MPK_TRACE
    if (threadIdx.x == 0) {
      phase[0] += mpk::s_trace_staged, phase[1] += mpk::s_trace_dots, phase[3] += mpk::s_trace_stall, ++phase[4];
      phase[2] += mpk::globaltimer() - mpk::s_trace_start;
    }
#endif
    mpk::consumer_sync();  // the next task's x goes where this one's partials were
  }
#ifdef MPK_TRACE
  if (threadIdx.x == 0)
    for (int i = 0; i < 5; ++i) atomicAdd(a.phases + i, phase[i]);
#endif
}

static uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}
static double from_bf16(uint16_t h) {
  const uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// encode_x maps x ([M][K] fp32) for bench/wgmma_dx.cuh's DX_XMAP: a block
// of 256 columns is one box of 32 floats × M rows × 8 groups of 32 columns,
// 128-byte swizzled.
static CUtensorMap encode_x(const float* x, int M, int K) {
  const cuuint64_t dims[3] = {32, (cuuint64_t)M, (cuuint64_t)K / 32}, strides[2] = {(cuuint64_t)K * 4, 128};
  const cuuint32_t box[3] = {32, (cuuint32_t)M, 8}, step[3] = {1, 1, 1};
  CUtensorMap m;
  CK_DRIVER(cuTensorMapEncodeTiled(&m, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3, const_cast<float*>(x), dims, strides, box,
                                   step, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                   CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
  return m;
}

// encode_split_x maps a split x as mpk_launch does (codegen's splitXMap).
static CUtensorMap encode_split_x(const float* x, int M, int K) {
  mpk::TmapSpec spec = {};
  spec.cols = K / mpk::kSplitGroup, spec.rows = M, spec.row_bytes = (int64_t)K * 4, spec.box_rows = mpk::split_box_rows(M);
  spec.swizzle = 128, spec.split_x = 1;
  CUtensorMap m;
  CK_DRIVER(mpk::encode_split_x_map(cuTensorMapEncodeTiled, &m, spec, x));
  return m;
}

// encode maps a [rows][K] bf16 matrix as mpk_launch does a GEMM page's
// (codegen's tmapOf spec, runtime/tmaps.cuh's encoding); one_block: a box
// of one column block (WGMMA=5's pair, two boxes a page).
static CUtensorMap encode(const void* w, int64_t rows, int K, bool one_block = false) {
  mpk::TmapSpec spec = {};
  spec.box_rows = WGMMA == 1 || WGMMA >= 3 ? mpk::kWgPageRows : mpk::kGemmPageRows;
  spec.cols = (int64_t)K * 2 / mpk::kTmapUnit, spec.rows = rows, spec.row_bytes = (int64_t)K * 2;
  spec.box_cols = (WGMMA == 1 || WGMMA >= 3 ? mpk::kWgPageCols : mpk::kGemmCols) * 2 / mpk::kTmapUnit;
  if (one_block) spec.box_cols = mpk::kWgRowBytes / mpk::kTmapUnit;
  spec.block_cols = (WGMMA == 1 || WGMMA >= 3 ? mpk::kWgRowBytes : mpk::kGemmBlockBytes) / mpk::kTmapUnit;
  spec.swizzle = WGMMA == 1 || WGMMA >= 3 ? mpk::kWgRowBytes : WGMMA ? 64 : 0;
  CUtensorMap m;
  CK_DRIVER(mpk::encode_page_map(cuTensorMapEncodeTiled, &m, spec, w, MPK_GEMM_BLOCKED_PAGES));
  return m;
}

template <int K, int M, bool PAIR>
static void run(const char* name, int N, int L, int sms, double copy) {
  const int per_layer = N / mpk::kGemmRows, tasks = per_layer * L, NW = PAIR ? 2 : 1;
  const int smem = mpk::ring_bars_bytes<RING>() + RING * mpk::kPageBytes + scratch_bytes(M) + kAlignPad;
  int most;
  CK(cudaDeviceGetAttribute(&most, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
  if (smem + (int)sizeof(mpk::Op) + 1024 > most) {  // the descriptor and the runtime's shared variables besides
    printf("%-10s M %2d  skipped: %d bytes of shared memory with a ring of %d pages\n", name, M, smem, RING);
    return;
  }
  const int64_t welems = (int64_t)L * N * K;
  // Weights: small random bf16 values (hash of the index), each weight its own buffer.
  std::vector<uint16_t> hw(welems);
  std::vector<float> hx((size_t)M * K);
  uint64_t st = 12345;
  auto rnd = [&] {
    st = st * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((st >> 40) & 0xffff) / 65536.f - 0.5f;
  };
  for (auto& v : hx) v = rnd();
  void* w[2] = {nullptr, nullptr};
  std::vector<std::vector<uint16_t>> host_w(NW);
  for (int p = 0; p < NW; ++p) {
    for (auto& v : hw) v = to_bf16(rnd() * 0.05f);
    host_w[p].assign(hw.begin(), hw.begin() + (size_t)std::min<int64_t>(welems, (int64_t)N * K));  // layer 0
    CK(cudaMalloc(&w[p], welems * 2));
    CK(cudaMemcpy(w[p], hw.data(), welems * 2, cudaMemcpyHostToDevice));
  }
  float *x, *out;
  int32_t* abort_flag;
  CUtensorMap* maps;
  CK(cudaMalloc(&x, hx.size() * 4));
  CK(cudaMemcpy(x, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMalloc(&out, (size_t)L * M * N * 4));
  CK(cudaMalloc(&abort_flag, 4));
  unsigned long long* phases;
  CK(cudaMalloc(&phases, 5 * sizeof(unsigned long long)));
  CK(cudaMemset(abort_flag, 0, 4));
  const bool one_block = WGMMA == 5 && PAIR;
  // WGMMA=6: x split as the megakernel's ops store it (runtime.cuh's
  // split_store: each group of 64 elements' hi values, then their lo), in
  // x's own buffer (the same bytes as fp32), and its tensor map.
  if (WGMMA == 6) {
    std::vector<uint16_t> hs(2 * hx.size());
    for (size_t i = 0; i < hx.size(); ++i) {
      const uint16_t hi = to_bf16(hx[i]);
      hs[mpk::split_at(i)] = hi, hs[mpk::split_at(i) + mpk::kSplitGroup] = to_bf16((float)(hx[i] - from_bf16(hi)));
    }
    CK(cudaMemcpy(x, hs.data(), hs.size() * 2, cudaMemcpyHostToDevice));
  }
  CUtensorMap hm[3] = {encode(w[0], (int64_t)L * N, K, one_block), encode(w[PAIR ? 1 : 0], (int64_t)L * N, K, one_block),
                       WGMMA == 6 ? encode_split_x(x, M, K) : encode_x(x, M, K)};
  CK(cudaMalloc(&maps, sizeof(hm)));
  CK(cudaMemcpy(maps, hm, sizeof(hm), cudaMemcpyHostToDevice));
  CK(cudaFuncSetAttribute(gemm_tasks<K, M, PAIR>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  for (int l2 = 0; l2 < 2; ++l2) {
    Args a = {};
    a.slots.p[0] = x, a.slots.p[1] = w[0], a.slots.p[2] = out;
    a.maps = maps, a.abort = abort_flag, a.tasks = tasks, a.per_layer = per_layer, a.N = N, a.l2 = l2;
    a.phases = phases;
    CK(cudaMemset(out, 0, (size_t)L * M * N * 4));
    CK(cudaMemset(phases, 0, 5 * sizeof(unsigned long long)));
    gemm_tasks<K, M, PAIR><<<sms, kThreads, smem>>>(a);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    if (!l2 && !kProbe) {  // layer 0 at sampled outputs against fp64
      std::vector<float> ho((size_t)M * N);
      CK(cudaMemcpy(ho.data(), out, ho.size() * 4, cudaMemcpyDeviceToHost));
      double worst = 0;
      for (int i = 0; i < 256; ++i) {
        const int m = (i * 37) % M, n = (i * 7919) % N;
        double dot[2] = {0, 0};
        for (int p = 0; p < NW; ++p)
          for (int k = 0; k < K; ++k) dot[p] += (double)hx[(size_t)m * K + k] * from_bf16(host_w[p][(size_t)n * K + k]);
        const double want = PAIR ? dot[0] * (dot[1] / (1 + exp(-dot[1]))) : dot[0];
        const double scale = PAIR ? fabs(dot[0]) * 0.3 + 1e-3 : fabs(dot[0]) + 1e-3;
        worst = fmax(worst, fabs(ho[(size_t)m * N + n] - want) / scale);
      }
      // x rounded to bf16 (MPK_GEMM_HI_ONLY) is ~2e-2 off at the worst
      // sample; a wrong layout is off by O(1).
      if (worst > (MPK_GEMM_HI_ONLY ? 5e-2 : 1e-3)) {
        fprintf(stderr, "%s: wrong outputs (worst relative error %.2e)\n", name, worst);
        exit(1);
      }
    }
#ifdef MPK_TRACE
    {  // a task's phases in the first launch (thread 0's clock): x staged, dots done, the end; page stalls
      unsigned long long h[5];
      CK(cudaMemcpy(h, phases, sizeof(h), cudaMemcpyDeviceToHost));
      const double n = h[4] > 0 ? (double)h[4] : 1.0;
      printf("%-10s %-3s phases a task (us): staged %.2f  dots %.2f  end %.2f  (epilogue %.2f)  page stalls %.2f\n", name,
             l2 ? "l2" : "hbm", h[0] / n / 1e3, h[1] / n / 1e3, h[2] / n / 1e3, (h[2] - (double)h[1]) / n / 1e3,
             h[3] / n / 1e3);
    }
#endif
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    const int reps = 5;
    CK(cudaEventRecord(e0));
    for (int i = 0; i < reps; ++i) gemm_tasks<K, M, PAIR><<<sms, kThreads, smem>>>(a);
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    const double s = ms / 1e3 / reps, blocks = (double)(tasks + sms - 1) / sms * (K / mpk::kGemmCols);
    const double bytes = (double)tasks * NW * mpk::kGemmRows * K * 2;
    printf("%-10s %-3s M %2d  %5d tasks  %8.1f us  %6.2f us a block  %7.0f GB/s  %.2f of copy\n", name,
           l2 ? "l2" : "hbm", M, tasks, s * 1e6, s * 1e6 / blocks, bytes / s / 1e9, bytes / s / copy);
  }
  CK(cudaFree(w[0]));
  if (PAIR) CK(cudaFree(w[1]));
  CK(cudaFree(x));
  CK(cudaFree(out));
  CK(cudaFree(abort_flag));
  CK(cudaFree(phases));
  CK(cudaFree(maps));
}

int main() {
  int sms;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const double copy = copy_bandwidth();  // as bench/decode.py's floor and gemm_pages.cu: bytes over the copy rate
  if (WGMMA == 4) printf("wgmma-dx: x %s\n", DX_XMAP ? "one 3-D box a block (DX_XMAP)" : "a bulk copy a row");
  printf("%s, ring %d pages, HI_ONLY %d, WARP_MTILES %d, BLOCKED_PAGES %d, probe %d; %d SMs, copy %.0f GB/s\n",
         WGMMA == 6 ? "wgmma-split" : WGMMA == 5 ? "wgmma-p128" : WGMMA == 4 ? "wgmma-dx" : WGMMA == 3 ? "wgmma-ss64" : WGMMA == 2 ? "wgmma-ss" : WGMMA ? "wgmma" : "mma.sync", RING, MPK_GEMM_HI_ONLY, MPK_GEMM_WARP_MTILES,
         MPK_GEMM_BLOCKED_PAGES, (int)kProbe, sms, copy / 1e9);
#if defined(DECODE_BATCH)
  // A decode batch of DECODE_BATCH rows as gemm_batch streams it (WGMMA=6: x's
  // boxes of 8, 16 or 32 rows): llama-3.2-1b's gate/up pair and LM head.
  run<2048, DECODE_BATCH, true>("gate+up", 8192, 4, sms, copy);
  run<2048, DECODE_BATCH, false>("lm head", 128256, 1, sms, copy);
#elif defined(QWEN8B)
  // qwen3-8b's 64-token chunk: the pair (192 tasks a layer, K 4,096), a row
  // block of 32 of the down projection (K 12,288) and of o (K 4,096); L
  // layers so that the tasks are whole rounds of 132 workers.
  run<4096, 64, true>("gate+up", 12288, 11, sms, copy);
  run<4096, 32, true>("gate+up/32", 12288, 11, sms, copy);  // the pair over 32 rows: a smaller x, room for a deeper ring
  run<12288, 32, false>("down rows", 4096, 33, sms, copy);
  run<4096, 32, false>("o rows", 4096, 66, sms, copy);
#else
  run<2048, 64, true>("gate+up", 8192, 4, sms, copy);
  run<2048, 64, false>("down/4", 2048, 32, sms, copy);
  run<2048, 32, false>("o rows", 2048, 32, sms, copy);
#endif
  return 0;
}
