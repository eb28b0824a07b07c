// Page-consumer micro-benchmark: how long a streamed Linear task takes to
// consume PAGES weight pages that have already landed in its ring (the
// usual case for q/k/v, o and a small model's MLP at batch 1: the loader
// filled the ring while the task waited), with csrc/tasks/stream.cuh's
// stream_dots (each of the 16 consumer warps takes a span of every page)
// and with a candidate (a page's rows by one warp). One CTA per SM, as the
// megakernel: 16 consumer warps and a loader warp that fills the ring with
// bulk copies (csrc/runtime/ring.cuh) and runs ahead into the next
// repetition's pages. Per repetition, thread 0 waits until the task's pages
// have landed, then the consumers run, timed from a barrier to a barrier
// (globaltimer, mean over the SMs):
//   dots   stream_dots as the megakernel runs it (checked against a GEMV)
//   ring   each warp only waits for and releases every page: the ring
//          protocol's share
//   owned  owner_dots: each page's whole rows computed by one warp, which
//          alone waits for the page and releases it (~1.6x faster here, and
//          slower in the megakernel: bench/NOTES.md, eighteenth session)
//   +spin  / +sleep: the same with a warp in the signaller's place polling
//          shared memory without a pause / with 32 ns sleeps (the megakernel's
//          signaller polls without one)
// The first repetition runs cold (code and x not yet cached); the median of
// the others warm.
//
//   nvcc -O3 -std=c++17 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -Icsrc \
//     bench/page_consume.cu -o /tmp/pc && /tmp/pc
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <vector>

#include "cuda_check.h"
#include "runtime/ring.cuh"
#include "runtime/roles.cuh"
#include "runtime/runtime.cuh"
#include "tasks/linear.cuh"
#include "tasks/stream.cuh"


using bf16 = __nv_bfloat16;
constexpr int kSlots = 10;  // the megakernel's ring at batch 1
constexpr int kReps = 16;
using Ring = mpk::Ring<kSlots>;

// The consumers wait for a page as the megakernel's do (linear.cuh's
// wait_page); nothing aborts here.
__device__ int32_t g_no_abort = 0;
__device__ __forceinline__ void wait_landed(const Ring& ring, uint32_t q) { mpk::wait_page(ring, q, &g_no_abort); }

// owner_dots (a candidate design, bench/NOTES.md eighteenth session): page
// p of the task belongs to warp p % 16, which alone waits for it, computes
// its R = E / K whole rows (the lanes sweep a row 16 bytes each, x read from
// shared memory once a step for all rows, one warp sum a row) and releases
// it; the ring's empty barriers then count one arrival (mode 2's init). A
// page's owner may wait on its slot because a task's pages fit the ring:
// the slot's previous page belongs to a repetition already done.
template <int K, int E>
__device__ __forceinline__ void owner_dots(const Ring& ring, uint32_t seq, int pages, const float* xs, float* part) {
  constexpr int R = E / K, STEPS = K / 256;  // rows a page, 16-byte loads a lane a row
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int p = warp; p < pages; p += mpk::kConsumerWarps) {
    wait_landed(ring, seq + p);
    const uint32_t pg = mpk::smem_u32(ring.page(seq + p));
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.f;
#pragma unroll 1
    for (int i = 0; i < STEPS; ++i) {
      const int col = i * 256 + lane * 8;
      float xv[8];
#pragma unroll
      for (int v = 0; v < 8; ++v) xv[v] = xs[col + v];
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r] += mpk::dot_regs<bf16>(mpk::ld_shared_16(pg + (r * K + col) * 2), xv);
    }
    ring.release(seq + p);
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = mpk::warp_sum(acc[r]);
    if (lane == 0)
#pragma unroll
      for (int r = 0; r < R; ++r) part[p * R + r] = acc[r];
  }
}

// MODE 0: stream_dots; 1: the ring protocol alone; 2: owner_dots. w holds kReps tasks'
// weights back to back (PAGES pages of E elements each); out[rep][row] the
// last block's dots; ns[rep][block] the consumers' time. SPIN: a warp in the
// signaller's place (warp 17) polls a shared-memory word all along, as
// module.cuh's signal_tasks waits for its consumers: 0 none, 1 without a
// pause, 2 with a 32 ns __nanosleep between polls.
template <int K, int PAGES, int MODE, int SPIN = 0>
__global__ void __launch_bounds__(MPK_THREADS + 64, 1)
    consume(const bf16* w, const float* x, float* out, uint64_t* ns) {
  constexpr int E = mpk::page_elems(K, mpk::kPageBytes / 2, mpk::StreamOf<bf16>::CHUNK);
  constexpr int ROWS = PAGES * E / K;
  extern __shared__ __align__(128) char smem[];
  const Ring ring = mpk::ring_at<kSlots>(smem);
  float* xs = reinterpret_cast<float*>(smem + mpk::ring_bars_bytes<kSlots>() + kSlots * mpk::kPageBytes);
  float* part = xs + K;
  __shared__ uint32_t s_stop;
  if (threadIdx.x == 0) ring.init(MODE == 2 ? 1 : mpk::kConsumerWarps), s_stop = 0;
  for (int k = threadIdx.x; k < K; k += blockDim.x) xs[k] = x[k];
  __syncthreads();
  if (threadIdx.x / 32 == mpk::kConsumerWarps + 1) {  // the spinner
    if (SPIN > 0 && threadIdx.x % 32 == 0)
      while (mpk::ld_acquire_cta(&s_stop) == 0)
        if (SPIN == 2) __nanosleep(32);
    return;
  }
  if (threadIdx.x / 32 == mpk::kConsumerWarps) {  // the loader: every repetition's pages, in order
    if (threadIdx.x % 32 == 0) {
      const uint64_t policy = mpk::weight_policy();  // evict-first, as the megakernel's weights
      for (uint32_t seq = 0; seq < (uint32_t)(kReps * PAGES); ++seq) {
        while (!ring.slot_free(seq)) {
        }
        ring.fill(seq, w + (int64_t)seq * E, E * 2, policy);
      }
    }
    return;
  }
  uint32_t seq = 0;
  __shared__ uint64_t t0;
  for (int rep = 0; rep < kReps; ++rep) {
    if (threadIdx.x == 0)
      for (int p = 0; p < PAGES; ++p)
        while (!ring.ready(seq + p)) {
        }
    mpk::consumer_sync();
    if (threadIdx.x == 0) t0 = mpk::globaltimer();
    if constexpr (MODE == 0) {
      mpk::stream_dots<bf16, K, 1>(ring, seq, (uint64_t)PAGES * E, xs, part, [&](uint32_t q) { wait_landed(ring, q); });
    } else if constexpr (MODE == 1) {
      for (int p = 0; p < PAGES; ++p, ++seq) {
        wait_landed(ring, seq);
        ring.release(seq);
      }
    } else {
      owner_dots<K, E>(ring, seq, PAGES, xs, part);
      seq += PAGES;
    }
    mpk::consumer_sync();
    if (threadIdx.x == 0) ns[rep * gridDim.x + blockIdx.x] = mpk::globaltimer() - t0;
    if (MODE != 1 && blockIdx.x == gridDim.x - 1)
      for (int r = threadIdx.x; r < ROWS; r += MPK_THREADS)
        out[rep * ROWS + r] = MODE == 0 ? mpk::row_dot<bf16, K, 1>(part, r, 0) : part[r];
    mpk::consumer_sync();  // part is rewritten by the next repetition
  }
  if (threadIdx.x == 0) mpk::st_release_cta(&s_stop, 1);
}

template <int K, int PAGES, int MODE, int SPIN = 0>
void run(const char* name, int sms) {
  constexpr int E = mpk::page_elems(K, mpk::kPageBytes / 2, mpk::StreamOf<bf16>::CHUNK);
  constexpr int ROWS = PAGES * E / K;
  const int64_t welems = (int64_t)kReps * PAGES * E;
  std::vector<bf16> hw(welems);
  std::vector<float> hx(K);
  for (int64_t i = 0; i < welems; ++i) hw[i] = __float2bfloat16((float)((i * 2654435761u) % 1000) / 1000.f - 0.5f);
  for (int k = 0; k < K; ++k) hx[k] = (float)((k * 40503u) % 997) / 997.f - 0.5f;
  bf16* w;
  float *x, *out;
  uint64_t* ns;
  CK(cudaMalloc(&w, welems * 2));
  CK(cudaMalloc(&x, K * 4));
  CK(cudaMalloc(&out, kReps * ROWS * 4));
  CK(cudaMalloc(&ns, (size_t)kReps * sms * 8));
  CK(cudaMemcpy(w, hw.data(), welems * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(x, hx.data(), K * 4, cudaMemcpyHostToDevice));
  const int bytes = mpk::ring_bars_bytes<kSlots>() + kSlots * mpk::kPageBytes + (K + PAGES * E / 32) * 4;
  CK(cudaFuncSetAttribute(consume<K, PAGES, MODE, SPIN>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  consume<K, PAGES, MODE, SPIN><<<sms, MPK_THREADS + 64, bytes>>>(w, x, out, ns);
  CK(cudaDeviceSynchronize());
  std::vector<uint64_t> hns((size_t)kReps * sms);
  CK(cudaMemcpy(hns.data(), ns, hns.size() * 8, cudaMemcpyDeviceToHost));
  std::vector<double> per_rep(kReps);
  for (int r = 0; r < kReps; ++r) {
    double s = 0;
    for (int b = 0; b < sms; ++b) s += hns[(size_t)r * sms + b];
    per_rep[r] = s / sms;
  }
  std::vector<double> warm(per_rep.begin() + 1, per_rep.end());
  std::sort(warm.begin(), warm.end());
  double err = 0;
  if (MODE != 1) {  // every repetition's dots against a host GEMV of its rows
    std::vector<float> hout(kReps * ROWS);
    CK(cudaMemcpy(hout.data(), out, hout.size() * 4, cudaMemcpyDeviceToHost));
    double num = 0, den = 0;
    for (int r = 0; r < kReps; ++r)
      for (int row = 0; row < ROWS; ++row) {
        double ref = 0;
        for (int k = 0; k < K; ++k) ref += (double)__bfloat162float(hw[((int64_t)r * ROWS + row) * K + k]) * hx[k];
        num += (hout[r * ROWS + row] - ref) * (hout[r * ROWS + row] - ref), den += ref * ref;
      }
    err = sqrt(num / den);
  }
  printf("%-5s %-6s K %5d  pages %d (%d rows)  cold %6.0f ns  warm %6.0f ns  (%4.0f ns a page)%s", name,
         SPIN == 0 ? "" : SPIN == 1 ? "+spin" : "+sleep", K, PAGES, ROWS,
         per_rep[0], warm[warm.size() / 2], warm[warm.size() / 2] / PAGES, MODE == 1 ? "\n" : "");
  if (MODE != 1) printf("  rel err %.1e\n", err);
  CK(cudaFree(w));
  CK(cudaFree(x));
  CK(cudaFree(out));
  CK(cudaFree(ns));
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("device %s, %d SMs, one CTA each; %d-byte pages, %d slots\n", prop.name, sms, mpk::kPageBytes, kSlots);
  // qwen3-0.6b's q/k/v and gate (K 1,024, ~3 pages a task), llama-3.2-1b's q (2,048, 4), a down projection (8,192)
  run<1024, 1, 0>("dots", sms);
  run<1024, 3, 0>("dots", sms);
  run<1024, 3, 1>("ring", sms);
  run<1024, 3, 2>("owned", sms);
  run<2048, 4, 0>("dots", sms);
  run<2048, 4, 1>("ring", sms);
  run<2048, 4, 2>("owned", sms);
  // a warp spinning beside them (the signaller's wait), without and with a pause
  run<1024, 3, 0, 1>("dots", sms);
  run<1024, 3, 0, 2>("dots", sms);
  run<1024, 3, 2, 1>("owned", sms);
  run<1024, 3, 2, 2>("owned", sms);
  run<2048, 4, 2, 1>("owned", sms);
  run<2048, 4, 2, 2>("owned", sms);
  run<3072, 3, 0>("dots", sms);
  run<3072, 3, 2>("owned", sms);
  run<8192, 8, 0>("dots", sms);
  run<8192, 8, 1>("ring", sms);
  return 0;
}
