// A decode unit's attention rounds on the tensor cores, alone (issue 13,
// forty-ninth session): tasks/decode_mma.cuh's DecodeMma, which the batch
// kv_pages task could use for its rounds. In the megakernel a round (128
// positions of one row's KV head, its K and V pages landed; 4 warps a query
// head, a lane a position) takes ~3.2 us: a batch-8 task of 288 positions
// 9.6 us of its 15.3 (bench/NOTES.md). Here one CTA per SM, the
// megakernel's 16 consumer warps, holds one unit's K and V rows (N
// positions of head dim D, bf16) in shared memory and its G queries (fp32,
// pre-scaled); each round a warp folds 8 positions of all G heads
// (DecodeMma::fold), the mask's adds read from global memory as the
// megakernel's rounds read them (or, MASK_AHEAD, a round ahead); then the
// warps' states merge (merge_states) into each head's max, sum and output.
// Reported: us a task and a round (globaltimer, the mean over the CTAs and
// REPS repetitions); block 0's result against a host softmax attention in
// fp64 over the same bf16 K and V (relative error of o / l).
//
//   nvcc -O3 -std=c++17 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -Icsrc -Ibench \
//     bench/attn_round_mma.cu -o /tmp/arm && /tmp/arm      (gpu_run.sh: JOBS="cu:attn_round_mma.cu")
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <vector>

#include "cuda_check.h"
#include "runtime/runtime.cuh"
#include "tasks/tasks.cuh"
#include "tasks/decode_mma.cuh"

#ifndef MASK_AHEAD
#define MASK_AHEAD 1
#endif
// KV_SWZ=1: K and V rows stored as a 128-byte swizzle lands them (DecodeMma's
// BLOCK, kv_swizzle's pages), so an ldmatrix's 8 rows fall in distinct
// banks; 0: plain rows of D elements (8-way conflicts).
#ifndef KV_SWZ
#define KV_SWZ 0
#endif

constexpr int kWarps = MPK_THREADS / 32, kRoundRows = 8 * kWarps, kReps = 50;
// KV_SWZ: a 64-column block's rows (at most kMaxRows of them), a block apart
constexpr int kMaxRows = 296, kBlock = kMaxRows * 128;

template <int D, int G>
__global__ void __launch_bounds__(MPK_THREADS, 1)
    rounds(const __nv_bfloat16* k, const __nv_bfloat16* v, const float* q, const float* mask, int n,
           float* out, unsigned long long* ns) {
  using T = __nv_bfloat16;
  extern __shared__ __align__(128) char smem[];
  // K and V rows up to a whole 8 (zeros past n: a hidden position's
  // P is 0, and 0 times a V row must stay 0, so its bytes must be finite)
  const int n8 = (n + 7) / 8 * 8;
  constexpr int kv_elems = KV_SWZ ? D / 64 * kBlock / 2 : 0;  // KV_SWZ: the blocks of kMaxRows rows
  const int kve = KV_SWZ ? kv_elems : n8 * D;
  T* ks = reinterpret_cast<T*>(smem);  // [n8][D]
  T* vs = ks + kve;                    // [n8][D]
  float* qs = reinterpret_cast<float*>(vs + kve);  // [G][D]
  float* part = qs + G * D;                           // [warps][G][D + 2]
  T* qst = reinterpret_cast<T*>(part + kWarps * G * (D + 2));  // MPK_DECODE_MMA_QSMEM: [2][8][D + 8]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, t = lane % 4;
  const size_t unit = (size_t)blockIdx.x * n * D;
  for (int i = threadIdx.x; i < n8 * D; i += MPK_THREADS) {
    const bool in = i < n * D;
    // KV_SWZ: as a 128-byte swizzle lands a page (DecodeMma's BLOCK): 64-column
    // blocks kBlock bytes apart, rows 128 bytes apart, each row's chunks
    // swizzled (mpk::swizzle128)
    const int c = i % D / 8, row = i / D * 128 + c / 8 * kBlock;  // (row: bytes into the rows' region)
    auto to = [&](const T* rows) {  // element i's index in rows
      const uint32_t r0 = mpk::smem_u32(rows);
      return KV_SWZ ? (int)(mpk::swizzle128(r0 + row, c % 8) - r0) / 2 + i % 8 : i;
    };
    ks[to(ks)] = in ? k[unit + i] : __float2bfloat16(0.f);
    vs[to(vs)] = in ? v[unit + i] : __float2bfloat16(0.f);
  }
  for (int i = threadIdx.x; i < G * D; i += MPK_THREADS) qs[i] = q[(size_t)blockIdx.x * G * D + i];
  __syncthreads();
  mpk::DecodeMma<T, D, G, KV_SWZ ? kBlock : 0>::stage_q(qs, qst);
  __syncthreads();
  const float* mrow = mask + (size_t)blockIdx.x * n;
  // The lane's two positions of the warp's 8 in round r (past n: hidden).
  auto adds = [&](int r, float& a0, float& a1) {
    const int j = r * kRoundRows + 8 * warp + 2 * t;
    a0 = j < n ? __ldcg(mrow + j) : -INFINITY;
    a1 = j + 1 < n ? __ldcg(mrow + j + 1) : -INFINITY;
  };
  const int nr = (n + kRoundRows - 1) / kRoundRows;
  uint64_t t0 = 0;
  for (int rep = -1; rep < kReps; ++rep) {  // rep -1: warm, the checked result
    if (rep == 0 && threadIdx.x == 0) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    mpk::DecodeMma<T, D, G, KV_SWZ ? kBlock : 0> st;
    st.init(qs, qst);
    float a0, a1;
    if (MASK_AHEAD) adds(0, a0, a1);
    for (int r = 0; r < nr; ++r) {
      float b0 = a0, b1 = a1;
      if (MASK_AHEAD) {
        if (r + 1 < nr) adds(r + 1, a0, a1);
      } else {
        adds(r, b0, b1);
      }
      const int j0 = r * kRoundRows + 8 * warp;  // the warp's 8 positions (past n: hidden, zero rows)
      const int rb = KV_SWZ ? 64 : D;  // a row's elements in its first block
      if (j0 < n) st.fold(mpk::smem_u32(ks + j0 * rb), mpk::smem_u32(vs + j0 * rb), b0, b1);
    }
    st.stash(part, warp);
    mpk::consumer_sync();
    if (warp < G) {
      float o[(D + 31) / 32], M, L;
      mpk::merge_states<D, G>(part, 0, kWarps, warp, lane, o, M, L);
      if (rep == -1) mpk::store_partial<D>(out + ((size_t)blockIdx.x * G + warp) * (D + 2), 1, M, L, o, lane);
    }
    mpk::consumer_sync();  // part is read before the next repetition stashes
  }
  if (threadIdx.x == 0) {
    uint64_t t1;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
    atomicAdd(ns, (unsigned long long)(t1 - t0));
  }
}

static float bf(__nv_bfloat16 x) { return __bfloat162float(x); }

template <int D, int G>
void run(int n, int sms) {
  using T = __nv_bfloat16;
  std::vector<T> hk((size_t)sms * n * D), hv(hk.size());
  std::vector<float> hq((size_t)sms * G * D), hm((size_t)sms * n);
  srand(11);
  auto uni = [] { return (float)rand() / RAND_MAX * 2.f - 1.f; };
  for (auto& x : hk) x = __float2bfloat16(uni());
  for (auto& x : hv) x = __float2bfloat16(uni());
  for (auto& x : hq) x = uni() * 0.5f;
  for (size_t i = 0; i < hm.size(); ++i) hm[i] = i % 7 == 3 ? -INFINITY : 0.f;  // some hidden positions
  T *dk, *dv;
  float *dq, *dm, *dout;
  unsigned long long* dns;
  CK(cudaMalloc(&dk, hk.size() * 2));
  CK(cudaMalloc(&dv, hv.size() * 2));
  CK(cudaMalloc(&dq, hq.size() * 4));
  CK(cudaMalloc(&dm, hm.size() * 4));
  CK(cudaMalloc(&dout, (size_t)sms * G * (D + 2) * 4));
  CK(cudaMalloc(&dns, 8));
  CK(cudaMemcpy(dk, hk.data(), hk.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dv, hv.data(), hv.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dq, hq.data(), hq.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dm, hm.data(), hm.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemset(dns, 0, 8));
  const int smem = 2 * (KV_SWZ ? D / 64 * kBlock : (n + 7) / 8 * 8 * D * 2) + G * D * 4 + kWarps * G * (D + 2) * 4 + mpk::decode_mma_q_bytes(D);
  CK(cudaFuncSetAttribute(rounds<D, G>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  rounds<D, G><<<sms, MPK_THREADS, smem>>>(dk, dv, dq, dm, n, dout, dns);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<float> out((size_t)sms * G * (D + 2));
  unsigned long long ns;
  CK(cudaMemcpy(out.data(), dout, out.size() * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(&ns, dns, 8, cudaMemcpyDeviceToHost));
  double worst = 0;
  for (int b = 0; b < 2; ++b)  // the first two units against fp64
    for (int h = 0; h < G; ++h) {
      const float* q = hq.data() + ((size_t)b * G + h) * D;
      std::vector<double> sc(n);
      double mx = -INFINITY;
      for (int j = 0; j < n; ++j) {
        double d = 0;
        for (int c = 0; c < D; ++c) d += (double)q[c] * bf(hk[((size_t)b * n + j) * D + c]);
        sc[j] = hm[(size_t)b * n + j] == -INFINITY ? -INFINITY : d + hm[(size_t)b * n + j];
        mx = fmax(mx, sc[j]);
      }
      double l = 0;
      std::vector<double> o(D, 0.0);
      for (int j = 0; j < n; ++j) {
        if (sc[j] == -INFINITY) continue;
        const double p = exp(sc[j] - mx);
        l += p;
        for (int c = 0; c < D; ++c) o[c] += p * bf(hv[((size_t)b * n + j) * D + c]);
      }
      const float* got = out.data() + ((size_t)b * G + h) * (D + 2);
      double num = 0, den = 0;
      for (int c = 0; c < D; ++c) {
        const double e = got[2 + c] / got[1] - o[c] / l;
        num += e * e, den += (o[c] / l) * (o[c] / l);
      }
      worst = fmax(worst, sqrt(num / den));
    }
  const double us = (double)ns / sms / kReps / 1e3, nr = (n + kRoundRows - 1) / kRoundRows;
  printf("KV_SWZ %d D %3d G %d positions %4d mask %s: %6.2f us a task, %5.2f a round of %d, rel. error %.2e %s\n", KV_SWZ, D, G, n,
         MASK_AHEAD ? "ahead" : "in   ", us, us / nr, kRoundRows, worst, worst < 1e-3 ? "ok" : "WRONG");
  CK(cudaFree(dk));
  CK(cudaFree(dv));
  CK(cudaFree(dq));
  CK(cudaFree(dm));
  CK(cudaFree(dout));
  CK(cudaFree(dns));
  if (worst >= 1e-3) exit(1);
}

int main() {
  int sms;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  printf("attention rounds on the tensor cores (tasks/decode_mma.cuh), %d CTAs of %d warps, %d reps\n", sms, kWarps,
         kReps);
  static_assert(kMaxRows >= 288 && kMaxRows % 8 == 0, "the probe's blocks hold its longest unit");
  run<64, 4>(288, sms);   // llama-3.2-1b at batch 8: 2 chunks of 288
  run<64, 4>(128, sms);   // one round
  run<64, 4>(100, sms);   // a round's last warps past the end, a partial 8
  run<128, 4>(288, sms);  // qwen3-8b
  run<128, 2>(288, sms);  // qwen3-0.6b / 1.7b
  return 0;
}
