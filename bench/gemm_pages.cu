// GEMM-page loader micro-benchmark (issue 13): how fast the megakernel's
// loader streams a prompt chunk's GEMM pages (tasks/gemm.cuh: pages of 32
// weight rows × 256 bf16 columns, a task's 64 rows block after block of K)
// into one CTA's ring, and what bounds a GEMM task's ~4 us a block in the
// thirtieth session's traces whatever its work: the pages in flight, the
// copies that fill a page, or neither.
//
// One persistent launch of one CTA per SM streams L matrices of a layer's
// shape (many times the L2), each cut into tasks of 64 rows over all of K,
// dealt round-robin to the CTAs. 16 consumer warps wait for each page and
// release it after holding a block (its two pages) for HOLD ns, the stand-in
// for a block's mmas; a loader warp fills the ring of P pages, keeping at
// most DEPTH pages in flight (the megakernel's MPK_INFLIGHT_PAGES: page seq
// is issued once page seq - DEPTH landed), by one of:
//   rows    32 bulk copies of 512 bytes from one lane (ring.fill_rows, today's)
//   lanes   the same copies, one a lane of the loader warp
//   flat    one bulk copy of 16 KB (the same bytes stored page by page:
//           what pre-tiled weights would cost; the decode stream's copy)
//   tensor  one 2-D tensor-map copy (cp.async.bulk.tensor, box 256 × 32)
// Each configuration's first launch checks every page's first and last rows
// against global memory. Rates are weight bytes over the launch's time,
// against the device copy rate measured in the same run (cuda_check.h).
//
//   nvcc -O3 -std=c++17 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -Icsrc \
//     bench/gemm_pages.cu -o /tmp/gp -lcuda && /tmp/gp
//   (gpu_run.sh: JOBS="cu:gemm_pages.cu:-lcuda")
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

#include "cuda_check.h"
#include "runtime/ring.cuh"

constexpr int kConsumerWarps = 16, kThreads = (kConsumerWarps + 1) * 32;
constexpr int kPageRows = 32, kPageCols = 256, kTaskRows = 64;  // tasks/gemm.cuh's pages and tasks
constexpr int kSeg = kPageCols * 2;                               // bytes of a row in a page
enum Mode { kRows, kLanes, kFlat, kTensor };
const char* kModeNames[] = {"rows", "lanes", "flat", "tensor"};

struct Shape {
  const char* name;
  int N, K, L;
};

__device__ __forceinline__ uint64_t evict_first() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
  return p;
}
__device__ __forceinline__ uint64_t now_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

// The task's page `p` (block p / 2 of K, rows (p % 2)·32 ..) of task g.
struct PageAt {
  int64_t row;  // the page's first row in the L·N rows
  int col;      // its first column
};
__device__ __forceinline__ PageAt page_at(int64_t g, int p, int tasks_per_matrix, int N) {
  const int64_t l = g / tasks_per_matrix, t = g % tasks_per_matrix;
  return {l * N + t * kTaskRows + (p % 2) * kPageRows, (p / 2) * kPageCols};
}

template <int P>
__global__ void __launch_bounds__(kThreads, 1)
    stream_pages(const __grid_constant__ CUtensorMap tmap, const char* w, const char* flat, int N, int K, int L,
                 int mode, int depth, int hold_ns, int check, unsigned long long* bad) {
  extern __shared__ __align__(1024) char smem[];
  const mpk::Ring<P> ring = mpk::ring_at<P>(smem);
  if (threadIdx.x == 0) ring.init(kConsumerWarps);
  __syncthreads();
  const int tpm = N / kTaskRows, pages = 2 * (K / kPageCols);  // tasks a matrix, pages a task
  const int64_t tasks = (int64_t)L * tpm;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row_bytes = (int64_t)K * 2;
  if (warp == kConsumerWarps) {  // the loader
    const uint64_t policy = evict_first();
    uint32_t seq = 0;
    for (int64_t g = blockIdx.x; g < tasks; g += gridDim.x)
      for (int p = 0; p < pages; ++p, ++seq) {
        if (lane == 0)
          while (!(ring.slot_free(seq) && (seq < (uint32_t)depth || ring.ready(seq - depth)))) {
          }
        __syncwarp();
        const PageAt at = page_at(g, p, tpm, N);
        const char* src = w + at.row * row_bytes + at.col * 2;
        uint64_t* bar = &ring.bars->full[seq % P];
        if (mode == kRows) {
          if (lane == 0) ring.fill_rows(seq, src, kPageRows, row_bytes, kSeg, policy);
        } else if (mode == kLanes) {
          if (lane == 0) mpk::mbar_expect_bytes(bar, kPageRows * kSeg);
          __syncwarp();
          mpk::bulk_load(ring.page(seq) + lane * kSeg, src + lane * row_bytes, kSeg, bar, policy);
        } else if (mode == kFlat) {
          const int64_t page_no = (g * pages + p) % ((int64_t)L * N * K * 2 / mpk::kPageBytes);
          if (lane == 0) ring.fill(seq, flat + page_no * mpk::kPageBytes, mpk::kPageBytes, policy);
        } else if (lane == 0) {
          mpk::mbar_expect_bytes(bar, kPageRows * kSeg);
          asm volatile(
              "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
              " [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(mpk::smem_u32(ring.page(seq))),
              "l"(reinterpret_cast<uint64_t>(&tmap)), "r"(at.col), "r"((int)at.row), "r"(mpk::smem_u32(bar)),
              "l"(policy)
              : "memory");
        }
      }
    return;
  }
  // The consumers: every warp waits for each page; a block's two pages are
  // held HOLD ns (from the second one's landing) before both are released.
  uint32_t seq = 0;
  for (int64_t g = blockIdx.x; g < tasks; g += gridDim.x)
    for (int p = 0; p < pages; p += 2, seq += 2) {
      while (!ring.ready(seq)) {
      }
      while (!ring.ready(seq + 1)) {
      }
      if (check && warp == 0 && mode != kFlat) {  // the pages' first and last rows against global memory
        for (int q = 0; q < 2; ++q) {
          const PageAt at = page_at(g, p + q, tpm, N);
          for (int k = 0; k < 2; ++k) {
            const int r = k * (kPageRows - 1);
            const uint4* got = reinterpret_cast<const uint4*>(ring.page(seq + q) + r * kSeg);
            const uint4* want = reinterpret_cast<const uint4*>(w + (at.row + r) * row_bytes + at.col * 2);
            const uint4 a = got[lane], b = want[lane];
            if (a.x != b.x || a.y != b.y || a.z != b.z || a.w != b.w) atomicAdd(bad, 1ull);
          }
        }
      }
      if (hold_ns > 0) {
        const uint64_t t0 = now_ns();
        while (now_ns() - t0 < (uint64_t)hold_ns) {
        }
      }
      ring.release(seq);
      ring.release(seq + 1);
    }
}

__global__ void fill_bytes(uint32_t* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    p[i] = (uint32_t)(i * 2654435761u) ^ seed;
}

// tensor_map describes the L·N × K bf16 weights for 2-D copies of 256 × 32.
CUtensorMap tensor_map(const void* w, int64_t rows, int K) {
  CUtensorMap m;
  const cuuint64_t dims[2] = {(cuuint64_t)K, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)K * 2};
  const cuuint32_t box[2] = {kPageCols, kPageRows}, elem[2] = {1, 1};
  CK_DRIVER(cuTensorMapEncodeTiled(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(w), dims, strides, box,
                                   elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                                   CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
  return m;
}

template <int P>
void run(const Shape& sh, const char* w, const char* flat, int sms, double copy_bw, unsigned long long* bad, int mode,
         int depth, int hold_ns) {
  const int64_t bytes = (int64_t)sh.L * sh.N * sh.K * 2;
  const CUtensorMap tmap = tensor_map(w, (int64_t)sh.L * sh.N, sh.K);
  const int smem = mpk::ring_bars_bytes<P>() + P * mpk::kPageBytes;
  CK(cudaFuncSetAttribute(stream_pages<P>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  CK(cudaMemset(bad, 0, sizeof(*bad)));
  stream_pages<P><<<sms, kThreads, smem>>>(tmap, w, flat, sh.N, sh.K, sh.L, mode, depth, hold_ns, 1, bad);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  unsigned long long nbad = 0;
  CK(cudaMemcpy(&nbad, bad, sizeof(nbad), cudaMemcpyDeviceToHost));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  const int reps = 5;
  CK(cudaEventRecord(e0));
  for (int i = 0; i < reps; ++i)
    stream_pages<P><<<sms, kThreads, smem>>>(tmap, w, flat, sh.N, sh.K, sh.L, mode, depth, hold_ns, 0, bad);
  CK(cudaEventRecord(e1));
  CK(cudaEventSynchronize(e1));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  const double us = ms * 1e3 / reps, bw = bytes / (us * 1e-6);
  // A CTA's blocks: its tasks' pages / 2, one after another.
  const double blocks = (double)sh.L * (sh.N / kTaskRows) / sms * (sh.K / kPageCols);
  printf("%-8s N %5d K %5d L %2d | %-6s P %2d depth %2d hold %4d ns | %8.1f us  %5.0f GB/s (%.2f of copy)  %.2f us a block"
         " | %s\n",
         sh.name, sh.N, sh.K, sh.L, kModeNames[mode], P, depth, hold_ns, us, bw / 1e9, bw / copy_bw, us / blocks,
         nbad == 0 || mode == kFlat ? "ok" : "WRONG PAGES");
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
}

int main() {
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  const double copy_bw = copy_bandwidth();
  printf("device %s, %d SMs, L2 %d MB, copy bandwidth %.0f GB/s\n", prop.name, sms, prop.l2CacheSize >> 20,
         copy_bw / 1e9);
  const Shape shapes[] = {{"gate-1b", 8192, 2048, 8}, {"gate-8b", 12288, 4096, 3}};
  int64_t most = 0;
  for (const Shape& s : shapes) most = s.L * (int64_t)s.N * s.K * 2 > most ? s.L * (int64_t)s.N * s.K * 2 : most;
  char *w, *flat;
  unsigned long long* bad;
  CK(cudaMalloc(&w, most));
  CK(cudaMalloc(&flat, most));
  CK(cudaMalloc(&bad, sizeof(*bad)));
  fill_bytes<<<1024, 256>>>(reinterpret_cast<uint32_t*>(w), most / 4, 7);
  fill_bytes<<<1024, 256>>>(reinterpret_cast<uint32_t*>(flat), most / 4, 11);
  CK(cudaDeviceSynchronize());
  for (const Shape& s : shapes) {
    // The megakernel's 64-token chunk: a ring of 5 pages, 2 in flight; a
    // block's mmas ~1-2 us (HOLD 0 shows the copies alone).
    for (int mode : {kRows, kLanes, kFlat, kTensor})
      for (int depth : {2, 5}) run<5>(s, w, flat, sms, copy_bw, bad, mode, depth, 0);
    for (int hold : {1000, 2000})
      for (int depth : {2, 4, 5}) run<5>(s, w, flat, sms, copy_bw, bad, kRows, depth, hold);
    for (int depth : {4, 8}) run<10>(s, w, flat, sms, copy_bw, bad, kRows, depth, 1000);
  }
  CK(cudaFree(w));
  CK(cudaFree(flat));
  CK(cudaFree(bad));
  return 0;
}
