// Staging micro-benchmark (issue 13, forty-eighth session): what a decode
// batch's tile stream spends staging x (tasks/tiles.cuh stage_rows), which
// the traces put at 4-8 us of a 10-20 us task. There the RMSNorm prologue's
// staging (norm_rows: the gate and q/k/v projections) ran at ~16 GB/s a
// worker and plain rows (the down projection's SiLU·mul output) at 29-46,
// with all 132 workers staging the same x after a stage boundary.
//
// One CTA per SM with the megakernel's worker size; its 16 consumer warps
// stage x (M rows of K fp32, L2-resident, read with ld.global.cg as the
// megakernel does) into shared memory REPS times, each followed by the
// consumers' barrier, as a task's staging is; the rows are split into bf16
// hi + lo (the tile stream's HiLo) or rounded (K = 8,192: hi + lo do not
// fit). Cases: through the norm prologue, the deferred norm (x·w staged,
// the rows' warp partial sums in their pads: tiles.cuh norm_rows_deferred)
// or plain; on one worker or on
// every SM at once; with the loader warp keeping 0 or 2 pages of 16 KB in
// flight from a 1 GiB buffer (the megakernel's MPK_INFLIGHT_PAGES: the
// weights' stream beside the staging). Block 0's first staging is checked
// against the host (fp64 norm, then the split; deferred: x·w, and the
// pads' partials summed against x's sums of squares).
// Reported: us a staging (the mean over the active workers) and x's bytes
// a us a worker. If norm rows take ~3x plain rows alone, the prologue's own
// code is the bound; if both slow down together with every SM or the
// stream, L2 or the round trips are.
//
//   nvcc -O3 -std=c++17 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -Icsrc \
//     bench/stage_probe.cu -o /tmp/sp && /tmp/sp
//   (gpu_run.sh: JOBS="cu:stage_probe.cu")
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "cuda_check.h"
#include "runtime/runtime.cuh"
#include "tasks/tasks.cuh"

constexpr int kSlots = 2;  // x, the norm's weight
constexpr int kReps = 50;
constexpr size_t kStreamBytes = size_t(1) << 30;
constexpr int kStreamPages = 2;

struct Args {
  mpk::Op op;
  mpk::Slots<kSlots> slots;
  const char* weights;               // the background stream's source
  int active, stream;                // workers staging; pages in flight (0: none)
  unsigned long long* ns;            // summed over the active workers
  __nv_bfloat16* check;              // block 0's first staging: hi rows, then lo rows (or the rounded rows)
  float* sums;                       // deferred: 1 / scale² = mean(x²) + eps of each row, from its pad
};

__shared__ int s_stop;

// stream_pages keeps a.stream bulk copies in flight until s_stop.
__device__ void stream_pages(const Args& a, char* pages, uint64_t* bars) {
  const uint64_t policy = mpk::weight_policy();
  const size_t per_cta = kStreamBytes / gridDim.x / mpk::kPageBytes * mpk::kPageBytes;
  const char* src = a.weights + per_cta * blockIdx.x;
  uint32_t seq = 0;
  const uint32_t depth = (uint32_t)a.stream;
  for (; !*(volatile int*)&s_stop; ++seq) {
    if (seq >= depth)  // page seq - depth has landed
      while (!mpk::mbar_test(&bars[(seq - depth) % kStreamPages], ((seq - depth) / kStreamPages) & 1)) {
      }
    mpk::mbar_expect_bytes(&bars[seq % kStreamPages], mpk::kPageBytes);
    mpk::bulk_load(pages + seq % kStreamPages * mpk::kPageBytes, src + (size_t)seq * mpk::kPageBytes % per_cta,
                   mpk::kPageBytes, &bars[seq % kStreamPages], policy);
  }
  for (uint32_t q = seq > depth ? seq - depth : 0; q < seq; ++q)
    while (!mpk::mbar_test(&bars[q % kStreamPages], (q / kStreamPages) & 1)) {
    }
}

enum Mode { kPlain, kNorm, kDeferred };

template <int K, int M, int MODE, bool LO>
__global__ void __launch_bounds__(mpk::kWorkerThreads, 1) stage(const Args a) {
  using T = __nv_bfloat16;
  constexpr int PITCH = K + 32;
  extern __shared__ __align__(128) char smem[];
  __shared__ __align__(8) uint64_t bars[kStreamPages];
  char* pages = smem + mpk::tile_x_bytes<T>(K, M, LO);  // the stream's pages, after x
  if (blockIdx.x >= a.active) return;
  if (threadIdx.x == 0) {
    s_stop = 0;
    for (int i = 0; i < kStreamPages; ++i) mpk::mbar_init(&bars[i], 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  const int warp = threadIdx.x / 32;
  if (warp == mpk::kLoaderWarp) {
    if (threadIdx.x % 32 == 0 && a.stream) stream_pages(a, pages, bars);
    return;
  }
  if (warp > mpk::kLoaderWarp) return;
  T* xs = reinterpret_cast<T*>(smem);
  using Pro = typename std::conditional<MODE == kNorm, mpk::NormPro, mpk::NoPro>::type;
  auto stage_once = [&] {
    if constexpr (MODE == kDeferred) {
      if constexpr (LO) mpk::norm_rows_deferred<K, M, PITCH>(a.op, mpk::HiLo<T>{xs, xs + M * PITCH}, xs, a.slots);
      else mpk::norm_rows_deferred<K, M, PITCH>(a.op, xs, xs, a.slots);
    } else if constexpr (MODE == kNorm) {  // fp32 rows, a bf16 weight, an fp32 result: the dtypes as constants
      const mpk::View &x = a.op.in[0], &w = a.op.in[a.op.pro_first];
      if constexpr (LO)
        mpk::norm_rows<mpk::DT_FLOAT32, mpk::DT_BFLOAT16, mpk::DT_FLOAT32, K, M, PITCH>(
            a.op, x, w, true, mpk::HiLo<T>{xs, xs + M * PITCH}, a.slots);
      else
        mpk::norm_rows<mpk::DT_FLOAT32, mpk::DT_BFLOAT16, mpk::DT_FLOAT32, K, M, PITCH>(a.op, x, w, true, xs, a.slots);
    } else if constexpr (LO) {
      mpk::stage_rows<K, M, PITCH>(Pro{}, a.op, mpk::HiLo<T>{xs, xs + M * PITCH}, a.slots);
    } else {
      mpk::stage_rows<K, M, PITCH>(Pro{}, a.op, xs, a.slots);
    }
    mpk::consumer_sync();
  };
  stage_once();  // the check's copy; L2 warm
  if (blockIdx.x == 0)
    for (int i = threadIdx.x; i < (LO ? 2 : 1) * M * K; i += MPK_THREADS) {
      const int part = i / (M * K), m = i % (M * K) / K, k = i % K;
      a.check[i] = xs[part * M * PITCH + m * PITCH + k];
    }
  if (MODE == kDeferred && blockIdx.x == 0 && threadIdx.x < M)  // the row's partials summed
    a.sums[threadIdx.x] = 1.f / (mpk::tile_row_scale<K, PITCH>(a.op, xs, threadIdx.x) * mpk::tile_row_scale<K, PITCH>(a.op, xs, threadIdx.x));
  mpk::consumer_sync();
  uint64_t t0 = 0;
  if (threadIdx.x == 0) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
#pragma unroll 1
  for (int r = 0; r < kReps; ++r) stage_once();
  if (threadIdx.x == 0) {
    uint64_t t1;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
    atomicAdd(a.ns, (unsigned long long)(t1 - t0));
    *(volatile int*)&s_stop = 1;
  }
}

static float bf(__nv_bfloat16 v) { return __bfloat162float(v); }

template <int K, int M, int MODE, bool LO>
void run(const char* name, const char* weights, int sms) {
  using T = __nv_bfloat16;
  std::vector<float> hx((size_t)M * K);
  std::vector<T> hw(K);
  srand(7);
  for (auto& v : hx) v = (float)rand() / RAND_MAX * 4.f - 2.f;
  for (auto& v : hw) v = __float2bfloat16((float)rand() / RAND_MAX + 0.5f);
  float* dx;
  T *dw, *dcheck;
  float* dsums;
  unsigned long long* dns;
  CK(cudaMalloc(&dx, hx.size() * 4));
  CK(cudaMalloc(&dw, K * 2));
  CK(cudaMalloc(&dcheck, 2 * (size_t)M * K * 2));
  CK(cudaMalloc(&dns, 8));
  CK(cudaMalloc(&dsums, M * 4));
  CK(cudaMemcpy(dx, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dw, hw.data(), K * 2, cudaMemcpyHostToDevice));
  Args a;
  memset(&a, 0, sizeof(a));
  mpk::View& x = a.op.in[0];
  x.slot = 0, x.dtype = mpk::DT_FLOAT32, x.rank = 2, x.shape[0] = M, x.shape[1] = K, x.stride[0] = K, x.stride[1] = 1;
  mpk::View& w = a.op.in[1];  // one row broadcast over x's (stride 0), as the norm's weight
  w.slot = 1, w.dtype = mpk::DT_BFLOAT16, w.rank = 2, w.shape[0] = M, w.shape[1] = K, w.stride[0] = 0, w.stride[1] = 1;
  a.op.kind = mpk::OP_LINEAR, a.op.num_in = 2, a.op.pro_first = 1, a.op.pro_dtype = mpk::DT_FLOAT32;
  a.op.flags = MODE != kPlain ? mpk::FLAG_WEIGHT : 0, a.op.eps = 1e-5f;
  a.slots.p[0] = dx, a.slots.p[1] = dw;
  a.weights = weights, a.ns = dns, a.check = dcheck, a.sums = dsums;
  const int smem = mpk::tile_x_bytes<T>(K, M, LO) + kStreamPages * mpk::kPageBytes;
  CK(cudaFuncSetAttribute(stage<K, M, MODE, LO>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  bool checked = false;
  for (int stream : {0, kStreamPages})
    for (int active : {1, sms}) {
      a.active = active, a.stream = stream;
      CK(cudaMemset(dns, 0, 8));
      stage<K, M, MODE, LO><<<sms, mpk::kWorkerThreads, smem>>>(a);
      CK(cudaGetLastError());
      CK(cudaDeviceSynchronize());
      unsigned long long ns;
      CK(cudaMemcpy(&ns, dns, 8, cudaMemcpyDeviceToHost));
      if (!checked) {  // block 0's staging against the host: the norm in fp64, then hi + lo (or rounded)
        std::vector<T> got(2 * (size_t)M * K);
        CK(cudaMemcpy(got.data(), dcheck, got.size() * 2, cudaMemcpyDeviceToHost));
        std::vector<float> sums(M);
        CK(cudaMemcpy(sums.data(), dsums, M * 4, cudaMemcpyDeviceToHost));
        double worst = 0;
        for (int m = 0; m < M; ++m) {
          double ss = 0;
          for (int k = 0; k < K; ++k) ss += (double)hx[m * K + k] * hx[m * K + k];
          const double inv = 1 / sqrt(ss / K + 1e-5);
          if (MODE == kDeferred) worst = fmax(worst, fabs(sums[m] - (ss / K + 1e-5)) / (ss / K + 1e-5));
          for (int k = 0; k < K; ++k) {
            const double want = MODE == kNorm ? hx[m * K + k] * inv * bf(hw[k])
                                : MODE == kDeferred ? hx[m * K + k] * bf(hw[k]) : hx[m * K + k];
            const double v = bf(got[m * K + k]) + (LO ? bf(got[(size_t)M * K + m * K + k]) : 0.f);
            worst = fmax(worst, fabs(v - want) / (fabs(want) + 1e-3));
          }
        }
        if (worst > (LO ? 1e-4 : 1e-2)) {
          fprintf(stderr, "%s: wrong staging (worst relative error %.2e)\n", name, worst);
          exit(1);
        }
        checked = true;
      }
      const double us = (double)ns / active / kReps / 1e3;
      printf("%-6s K %5d M %2d %-7s  %3d workers  stream %d  %6.2f us a staging  %6.1f GB/s a worker\n", name, K, M,
             LO ? "hi+lo" : "rounded", active, stream, us, (double)M * K * 4 / us / 1e3);
    }
  CK(cudaFree(dx));
  CK(cudaFree(dw));
  CK(cudaFree(dcheck));
  CK(cudaFree(dns));
  CK(cudaFree(dsums));
}

int main() {
  int sms;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  char* weights;
  CK(cudaMalloc(&weights, kStreamBytes));
  CK(cudaMemset(weights, 1, kStreamBytes));
  printf("staging x (tasks/tiles.cuh stage_rows), %d reps; %d SMs\n", kReps, sms);
  run<2048, 8, kNorm, true>("norm", weights, sms);
  run<2048, 8, kDeferred, true>("defer", weights, sms);
  run<2048, 8, kPlain, true>("plain", weights, sms);
  run<2048, 16, kNorm, true>("norm", weights, sms);
  run<2048, 16, kDeferred, true>("defer", weights, sms);
  run<2048, 16, kPlain, true>("plain", weights, sms);
  run<8192, 8, kPlain, false>("plain", weights, sms);
  CK(cudaFree(weights));
  return 0;
}
