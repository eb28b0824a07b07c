// wgmma issue-rate micro-benchmark: how many bf16 MACs a clock an SM's
// tensor cores reach on wgmma m64nNk16 alone (no weight stream, no x staging,
// no epilogue), by N (64, 128, 256), by where A comes from (registers, as
// mpk::linear_wgmma's x; or shared memory) and by how many warpgroups issue
// at once (1, 2, 4; 1 and 2 at N 256, whose 128 accumulators a thread
// leave too few registers for 4). The chunk's GEMM block runs m64n64k16 with A from
// registers on 4 warpgroups and takes ~2.9 us a qwen3-8b pair block (64 KB
// of weights, 4.2 M MACs with x's hi and lo) with L2-resident weights, ~35%
// of the ~2,048 MACs a clock peak (bench/NOTES.md, forty-sixth session):
// this says how much of that gap is the tile's shape.
//
// One CTA an SM; each warpgroup issues 65,536 wgmmas in rounds of R (16,
// and 4 as the task's groups of two k16 steps of hi and lo), k16 steps over
// a 64 KB region of zeros (128-byte swizzled K-major, as the ring's pages),
// a commit a round and at most two rounds in flight, as the task does. Reported: MACs a clock an SM from clock64 (the slowest
// warpgroup of CTA 0) and TFLOP/s from the launch's events.
//
//   nvcc -O3 -std=c++17 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -Icsrc \
//     bench/wgmma_rate.cu -o /tmp/wr && /tmp/wr
//   (gpu_run.sh: JOBS="cu:wgmma_rate.cu")
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

#include "cuda_check.h"
#include "runtime/runtime.cuh"
#include "tasks/tasks.cuh"
#include "wgmma_ops.cuh"  // the m64n128 and m64n256 forms
#include "wgmma_ss.cuh"   // wgmma_ss_64

constexpr int kRegion = 64 * 1024;  // B's k16 steps walk this (N rows x 128 bytes a column block)
constexpr int kWgmmas = 65536;      // a warpgroup's wgmmas, in rounds of R

template <int N, bool SS>
__device__ __forceinline__ void mma(float (&acc)[N / 2], const uint32_t (&a)[4], uint64_t ad, uint64_t bd) {
  if constexpr (N == 64) {
    if constexpr (SS) mpk::wgmma_ss_64(acc, ad, bd);
    else mpk::wgmma_rs_64(acc, a, bd);
  } else if constexpr (N == 128) {
    if constexpr (SS) mpk::wgmma_ss_128(acc, ad, bd);
    else mpk::wgmma_rs_128(acc, a, bd);
  } else {
    if constexpr (SS) mpk::wgmma_ss_256(acc, ad, bd);
    else mpk::wgmma_rs_256(acc, a, bd);
  }
}

template <int N, bool SS, int R>
__global__ void __launch_bounds__(N == 256 ? 256 : 512, 1) rate(int warpgroups, long long* cycles, float* sink) {
  extern __shared__ __align__(1024) uint8_t smem[];
  uint8_t* region = smem + (1024 - mpk::smem_u32(smem) % 1024) % 1024;  // the swizzle's period
  for (int i = threadIdx.x; i < (kRegion + 16 * 1024) / 16; i += blockDim.x)
    reinterpret_cast<uint4*>(region)[i] = make_uint4(0, 0, 0, 0);
  mpk::fence_async_smem();
  __syncthreads();
  const int wg = threadIdx.x / 128;
  if (wg >= warpgroups) return;
  const uint32_t b0 = mpk::smem_u32(region), a0 = b0 + kRegion;  // A (ss): 64 rows x 128 bytes, 8 KB a column block
  constexpr int kBlockBytes = N * 128;                           // B's column block: N rows of 128 bytes
  constexpr int kBlocks = kRegion / kBlockBytes;
  float acc[N / 2];
  mpk::wg_zero_acc(acc);
  uint32_t a[4] = {0x3f803f80u, 0x3f803f80u, 0x3f803f80u, 0x3f803f80u};  // bf16 ones
  const long long t0 = clock64();
  mpk::wgmma_fence();
#pragma unroll 1
  for (int it = 0; it < kWgmmas / R; ++it) {
#pragma unroll
    for (int s = 0; s < R; ++s) {
      const uint32_t b = b0 + (s / 4 % kBlocks) * kBlockBytes + 32 * (s % 4);
      const uint32_t ad = a0 + (s / 4 % 2) * 8192 + 32 * (s % 4);
      mma<N, SS>(acc, a, mpk::wg_swizzled_desc<128>(ad), mpk::wg_swizzled_desc<128>(b));
    }
    mpk::wgmma_commit();
    mpk::wgmma_wait<1>();
  }
  mpk::wgmma_wait<0>();
  mpk::wg_fence_acc(acc);
  const long long t1 = clock64();
  float v = 0.f;
#pragma unroll
  for (int i = 0; i < N / 2; ++i) v += acc[i];
  if (v == 12345.f) sink[threadIdx.x] = v;  // keeps the wgmmas live
  if (blockIdx.x == 0 && threadIdx.x % 128 == 0) cycles[wg] = t1 - t0;
}

template <int N, bool SS, int R = 16>
static void run(int sms, int warpgroups, long long* d_cycles, float* d_sink) {
  const int smem = kRegion + 16 * 1024 + 1024;
  CK(cudaFuncSetAttribute(rate<N, SS, R>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  rate<N, SS, R><<<sms, 128 * warpgroups, smem>>>(warpgroups, d_cycles, d_sink);  // warm-up
  CK(cudaGetLastError());
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaEventRecord(e0));
  rate<N, SS, R><<<sms, 128 * warpgroups, smem>>>(warpgroups, d_cycles, d_sink);
  CK(cudaEventRecord(e1));
  CK(cudaEventSynchronize(e1));
  float ms = 0.f;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  long long cyc[4] = {0, 0, 0, 0}, worst = 0;
  CK(cudaMemcpy(cyc, d_cycles, sizeof(cyc), cudaMemcpyDeviceToHost));
  for (int i = 0; i < warpgroups; ++i) worst = cyc[i] > worst ? cyc[i] : worst;
  const double macs_sm = (double)warpgroups * kWgmmas * 64.0 * N * 16.0;
  printf("m64n%-3d %s  rounds of %2d  %d warpgroup(s)  %7.0f MACs a clock an SM (%.2f of 2048)  %6.1f TFLOP/s\n", N,
         SS ? "ss" : "rs", R, warpgroups, macs_sm / worst, macs_sm / worst / 2048.0, 2.0 * macs_sm * sms / (ms * 1e-3) / 1e12);
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
}

int main() {
  int dev = 0, sms = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, dev));
  printf("%s, %d SMs; wgmma m64nNk16 bf16 -> fp32, %d a warpgroup\n", prop.name, sms, kWgmmas);
  long long* d_cycles;
  float* d_sink;
  CK(cudaMalloc(&d_cycles, 4 * sizeof(long long)));
  CK(cudaMalloc(&d_sink, 512 * sizeof(float)));
  for (int wgs : {1, 2, 4}) {
    run<64, false, 4>(sms, wgs, d_cycles, d_sink);  // the task's groups: 2 k16 steps of hi and lo
    run<64, false>(sms, wgs, d_cycles, d_sink);
    run<64, true>(sms, wgs, d_cycles, d_sink);
    run<128, false>(sms, wgs, d_cycles, d_sink);
    run<128, true>(sms, wgs, d_cycles, d_sink);
    if (wgs > 2) continue;  // N 256: 128 accumulators a thread
    run<256, false>(sms, wgs, d_cycles, d_sink);
    run<256, true>(sms, wgs, d_cycles, d_sink);
  }
  return 0;
}
