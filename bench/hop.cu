// Hop micro-benchmark: what one grid-wide dependent stage costs, the way the
// megakernel hands an activation from one stage to the next today (events)
// and with tagged activations (NCCL's LL protocol: each value written with
// its tag in one 8-byte store, the readers polling the values themselves).
//
// One CTA per SM with the megakernel's warps (16 consumer warps, a loader, a
// signaller and a fetcher warp). A chain of S stages: in stage s every CTA
// reads the whole vector x_s of K floats, sums it (a block reduction) and
// writes its K / G slice of x_{s+1} = sum / K + 1 (x_0 = 1, so x_s = s + 1
// everywhere: each reader checks its sum, so a stale read is caught).
//   events  the consumers' writes, a consumer barrier, a release store to
//           shared memory; the signaller warp's red.release on the stage's
//           counter; the next stage's fetcher warp polls it (ld.acquire.gpu)
//           and hands over through shared memory; the consumers load x_s
//           (ld.global.cg): csrc/runtime/module.cuh's path.
//   tagged  each value is stored as (tag << 32 | bits) with one 8-byte
//           relaxed store; the readers load theirs (ld.relaxed.gpu) and
//           reload those whose tag is not yet s: no counter, no fence, no
//           handoff. Two buffers alternate: a CTA writes x_{s+2} only after
//           it read all of x_{s+1}, which every CTA wrote after reading x_s.
// With a stream, the loader warp keeps 1, 2 (the megakernel's
// MPK_INFLIGHT_PAGES) or 8 pages of 16 KB in flight from a 1 GiB buffer all
// the time (bulk copies, evict-first), as the weight stream does for a large
// model; without, HBM is idle (a small model's hops: its ring is full).
// Reported: ns per stage, median of the launches. `hop wide`: events only,
// K up to 20,480 floats (80 KB, what each of qwen3-8b's o-projection tasks
// reads of the attention's partials), to tell a stage's bytes from its
// round trips (or HOP_WIDE set: `JOBS="env:HOP_WIDE:1 cu:hop.cu"`).
//
//   nvcc -O3 -std=c++17 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -Icsrc \
//     bench/hop.cu -o /tmp/hop && /tmp/hop [wide]
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "cuda_check.h"
#include "runtime/ring.cuh"
#include "runtime/roles.cuh"
#include "runtime/runtime.cuh"
#include "tasks/dot.cuh"

constexpr int kStreamPages = 8;  // the most pages in flight (the ring's slots)
constexpr size_t kStreamBytes = size_t(1) << 30;

struct Args {
  int tagged, stream, stages, K;  // stream: pages in flight (0: none)
  float* xf[2];          // events: the two plain buffers
  uint64_t* xt[2];       // tagged: the two tagged buffers
  uint32_t* counters;    // events: one per stage, zero at launch
  uint32_t tag0;         // tagged: x_0's tag this launch; x_s has tag0 + s
  const char* weights;   // the background stream's source
  uint64_t* times;       // [G][2]: start and end of each CTA (ns)
  int* errors;
};

__device__ __forceinline__ uint64_t ld_relaxed_64(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void st_relaxed_64(uint64_t* p, uint64_t v) {
  asm volatile("st.relaxed.gpu.global.b64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// stream_loop keeps kStreamPages bulk copies in flight until *stop.
__device__ void stream_loop(const Args& a, char* pages, uint64_t* bars, const volatile int* stop) {
  const uint64_t policy = mpk::weight_policy();
  const size_t per_cta = kStreamBytes / gridDim.x / mpk::kPageBytes * mpk::kPageBytes;
  const char* src = a.weights + per_cta * blockIdx.x;
  uint32_t seq = 0;
  const uint32_t depth = (uint32_t)a.stream;
  for (; !*stop; ++seq) {
    const int slot = seq % kStreamPages;
    if (seq >= depth)  // page seq - depth has landed (its slot's previous fill too: depth <= slots)
      while (!mpk::mbar_test(&bars[(seq - depth) % kStreamPages], ((seq - depth) / kStreamPages) & 1)) {
      }
    mpk::mbar_expect_bytes(&bars[slot], mpk::kPageBytes);
    mpk::bulk_load(pages + slot * mpk::kPageBytes, src + (size_t)seq * mpk::kPageBytes % per_cta, mpk::kPageBytes,
                   &bars[slot], policy);
  }
  for (uint32_t q = seq > depth ? seq - depth : 0; q < seq; ++q)
    while (!mpk::mbar_test(&bars[q % kStreamPages], (q / kStreamPages) & 1)) {
    }
}

__shared__ float s_sum[mpk::kConsumerWarps];
__shared__ uint32_t s_done, s_ready;
__shared__ int s_stop;

// block_sum adds one value a consumer thread; every consumer gets the total.
__device__ __forceinline__ float block_sum(float v) {
  v = mpk::warp_sum(v);
  if (threadIdx.x % 32 == 0) s_sum[threadIdx.x / 32] = v;
  mpk::consumer_sync();
  float t = 0.f;
#pragma unroll
  for (int i = 0; i < mpk::kConsumerWarps; ++i) t += s_sum[i];
  mpk::consumer_sync();
  return t;
}

template <int K>
__device__ void consume(const Args& a) {
  constexpr int PER = (K + MPK_THREADS - 1) / MPK_THREADS;
  const int G = gridDim.x, w = blockIdx.x;
  const int slice = (K + G - 1) / G, lo = w * slice, hi = min(K, lo + slice);
  for (int s = 0; s < a.stages; ++s) {
    float v = 0.f;
    if (a.tagged) {
      const uint64_t* x = a.xt[s & 1];
      const uint32_t tag = a.tag0 + s;
      uint64_t got[PER];
#pragma unroll
      for (int i = 0; i < PER; ++i) {
        const int k = threadIdx.x + i * MPK_THREADS;
        got[i] = k < K ? ld_relaxed_64(x + k) : (uint64_t)tag << 32;
      }
#pragma unroll
      for (int i = 0; i < PER; ++i) {
        const int k = threadIdx.x + i * MPK_THREADS;
        while ((uint32_t)(got[i] >> 32) != tag) got[i] = ld_relaxed_64(x + k);
        v += k < K ? __uint_as_float((uint32_t)got[i]) : 0.f;
      }
    } else {
      if (s > 0) {
        if (threadIdx.x == 0)
          while (mpk::ld_acquire_cta(&s_ready) < (uint32_t)s) {
          }
        mpk::consumer_sync();
      }
      const float* x = a.xf[s & 1];
#pragma unroll
      for (int i = 0; i < PER; ++i) {
        const int k = threadIdx.x + i * MPK_THREADS;
        v += k < K ? __ldcg(x + k) : 0.f;
      }
    }
    const float total = block_sum(v);
    if (threadIdx.x == 0 && total != (float)K * (float)(s + 1)) atomicAdd(a.errors, 1);
    const float y = total / (float)K + 1.f;
    const int k = lo + (int)threadIdx.x;
    if (k < hi) {
      if (a.tagged)
        st_relaxed_64(a.xt[(s + 1) & 1] + k, (uint64_t)(a.tag0 + s + 1) << 32 | __float_as_uint(y));
      else
        a.xf[(s + 1) & 1][k] = y;
    }
    if (!a.tagged) {
      mpk::consumer_sync();
      if (threadIdx.x == 0) mpk::st_release_cta(&s_done, (uint32_t)(s + 1));
    }
  }
}

template <int K>
__global__ void __launch_bounds__(mpk::kWorkerThreads, 1) hop_kernel(const Args a) {
  extern __shared__ __align__(128) char smem[];
  __shared__ uint64_t bars[kStreamPages];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    s_done = s_ready = 0;
    s_stop = 0;
    for (int i = 0; i < kStreamPages; ++i) mpk::mbar_init(&bars[i], 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (warp == mpk::kLoaderWarp) {
    if (lane == 0 && a.stream) stream_loop(a, smem, bars, &s_stop);
    return;
  }
  if (warp == mpk::kSignalWarp) {
    if (lane == 0 && !a.tagged)
      for (int s = 0; s < a.stages; ++s) {
        while (mpk::ld_acquire_cta(&s_done) <= (uint32_t)s) {
        }
        mpk::red_release(a.counters + s, 1);
      }
    return;
  }
  if (warp == mpk::kFetchWarp) {
    if (lane == 0 && !a.tagged)
      for (int s = 1; s < a.stages; ++s) {
        while (mpk::ld_acquire(a.counters + s - 1) < gridDim.x) {
        }
        mpk::st_release_cta(&s_ready, (uint32_t)s);
      }
    return;
  }
  if (threadIdx.x == 0) a.times[2 * blockIdx.x] = mpk::globaltimer();
  consume<K>(a);
  mpk::consumer_sync();
  if (threadIdx.x == 0) {
    a.times[2 * blockIdx.x + 1] = mpk::globaltimer();
    *(volatile int*)&s_stop = 1;
  }
}

__global__ void fill_tagged(uint64_t* x, int K, uint32_t tag) {
  for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < K; k += gridDim.x * blockDim.x)
    x[k] = (uint64_t)tag << 32 | __float_as_uint(1.f);
}

__global__ void fill_plain(float* x, int K) {
  for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < K; k += gridDim.x * blockDim.x) x[k] = 1.f;
}

template <int K>
double run(Args a, int G, int launches, int* errors_out) {
  const int smem = kStreamPages * mpk::kPageBytes;
  CK(cudaFuncSetAttribute(hop_kernel<K>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  std::vector<double> per_stage;
  std::vector<uint64_t> t(2 * G);
  for (int l = 0; l < launches; ++l) {
    a.K = K;
    a.tag0 = 1 + (uint32_t)l * (uint32_t)(a.stages + 1);
    fill_tagged<<<8, 256>>>(a.xt[0], K, a.tag0);
    fill_plain<<<8, 256>>>(a.xf[0], K);
    CK(cudaMemset(a.counters, 0, sizeof(uint32_t) * a.stages));
    hop_kernel<K><<<G, mpk::kWorkerThreads, smem>>>(a);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(t.data(), a.times, sizeof(uint64_t) * 2 * G, cudaMemcpyDeviceToHost));
    uint64_t t0 = UINT64_MAX, t1 = 0;
    for (int i = 0; i < G; ++i) t0 = std::min(t0, t[2 * i]), t1 = std::max(t1, t[2 * i + 1]);
    if (l > 0) per_stage.push_back((double)(t1 - t0) / a.stages);
  }
  CK(cudaMemcpy(errors_out, a.errors, sizeof(int), cudaMemcpyDeviceToHost));
  std::sort(per_stage.begin(), per_stage.end());
  return per_stage[per_stage.size() / 2];
}

constexpr int kMaxK = 20480;  // the largest K a stage reads (wide)

int main(int argc, char** argv) {
  const bool wide = argc > 1 && strcmp(argv[1], "wide") == 0 || getenv("HOP_WIDE") != nullptr;  // gpu_run.sh: env:HOP_WIDE:1
  int G = 0;
  CK(cudaDeviceGetAttribute(&G, cudaDevAttrMultiProcessorCount, 0));
  const int stages = 256, launches = 9;
  Args a{};
  a.stages = stages;
  for (int b = 0; b < 2; ++b) {
    CK(cudaMalloc(&a.xf[b], sizeof(float) * kMaxK));
    CK(cudaMalloc(&a.xt[b], sizeof(uint64_t) * kMaxK));
    CK(cudaMemset(a.xt[b], 0, sizeof(uint64_t) * kMaxK));
  }
  CK(cudaMalloc(&a.counters, sizeof(uint32_t) * stages));
  CK(cudaMalloc(&a.times, sizeof(uint64_t) * 2 * G));
  CK(cudaMalloc(&a.errors, sizeof(int)));
  CK(cudaMemset(a.errors, 0, sizeof(int)));
  char* w = nullptr;
  CK(cudaMalloc(&w, kStreamBytes));
  CK(cudaMemset(w, 1, kStreamBytes));
  a.weights = w;
  printf("hop: %d CTAs, %d stages a launch, median of %d launches, ns per stage\n", G, stages, launches - 1);
  printf("%-8s %-9s %6s %10s\n", "protocol", "in flight", "K", "ns/stage");
  int errors = 0;
  if (wide) {
    for (int stream : {0, 2})
      for (int K : {4096, 10240, 20480}) {
        a.tagged = 0, a.stream = stream;
        const double ns = K == 4096    ? run<4096>(a, G, launches, &errors)
                          : K == 10240 ? run<10240>(a, G, launches, &errors)
                                       : run<20480>(a, G, launches, &errors);
        printf("%-8s %-9d %6d %10.0f\n", "events", stream, K, ns);
      }
    printf("stale reads: %d\n", errors);
    return errors != 0;
  }
  for (int stream : {0, 1, 2, 8})
    for (int tagged = 0; tagged < 2; ++tagged)
      for (int K : {2048, 4096}) {
        a.tagged = tagged, a.stream = stream;
        const double ns = K == 2048 ? run<2048>(a, G, launches, &errors) : run<4096>(a, G, launches, &errors);
        printf("%-8s %-9d %6d %10.0f\n", tagged ? "tagged" : "events", stream, K, ns);
      }
  printf("stale reads: %d\n", errors);
  return errors != 0;
}
