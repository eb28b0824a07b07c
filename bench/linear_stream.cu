// Linear micro-benchmark: every weight matrix of a model's layers (q, k, v,
// o, gate, up, down per layer, then the LM head), bf16, streamed back to back
// in ONE persistent launch of one CTA per SM, each matrix GEMV'd with x, in
// the task split and queue order the megakernel uses. Reports GB/s against a
// device copy measured in the same run, and checks every output against a
// plain reference GEMV (relative L2 error).
//
// Variants:
//   reg       no loader: each warp streams whole rows with register loads
//             (4 x 16 B in flight per lane): the megakernel's old Linear
//   copyP/F   the loader ring alone: consumers release pages unread
//   ringP/F   loader warp + ring of P 16 KiB pages, at most F in flight
//             (csrc/runtime/ring.cuh), feeding the consumer GEMV
//             (csrc/tasks/stream.cuh) with M rows of x; a signaller warp
//             publishes finished tasks
//   dep=1     every task of matrix i first waits until all tasks of matrix
//             i-1 (on every SM) have finished: a grid-wide dependent stage
//             per matrix, as in a decode step
// Arguments: MODEL [LAYERS] [fused][-l2]: fused streams q/k/v and gate/up as
// one matrix each (horizontal fusion); l2 makes every task stream the same
// L2-resident slice, so the consumers' own rate shows (results unchecked).
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Icsrc bench/linear_stream.cu -o /tmp/ls
//   /tmp/ls llama-3.2-1b [layers]
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <string>
#include <vector>

#include "cuda_check.h"
#include "runtime/ring.cuh"
#include "runtime/runtime.cuh"
#include "tasks/stream.cuh"


using bf16 = __nv_bfloat16;
constexpr int kConsumerWarps = MPK_THREADS / 32;
constexpr int kBlock = MPK_THREADS + 64;  // consumers, the loader warp, the signal warp
constexpr int64_t kTaskCap = 512 << 10;  // bytes of weights per task at most
constexpr int kMaxM = 4;

struct Task {
  const bf16* w;  // first row of the slice
  const float* x;  // [M][K]
  float* y;        // [M][N] at column n0
  int rows, K, N, matrix;
};

struct Shape {
  int N, K;
};

std::vector<Shape> model_shapes(const std::string& m, int layers, bool fused) {
  int H, Hq, Hkv, D, I, V, L;
  if (m == "llama-3.2-1b") H = 2048, Hq = 32, Hkv = 8, D = 64, I = 8192, V = 128256, L = 16;
  else if (m == "qwen3-8b") H = 4096, Hq = 32, Hkv = 8, D = 128, I = 12288, V = 151936, L = 36;
  else if (m == "qwen3-0.6b") H = 1024, Hq = 16, Hkv = 8, D = 128, I = 3072, V = 151936, L = 28;
  else if (m == "qwen3-1.7b") H = 2048, Hq = 16, Hkv = 8, D = 128, I = 6144, V = 151936, L = 28;
  else {
    fprintf(stderr, "unknown model %s\n", m.c_str());
    exit(2);
  }
  if (layers > 0) L = layers;
  std::vector<Shape> s;
  for (int l = 0; l < L; ++l) {
    if (fused) {  // q/k/v and gate/up as one matrix each (horizontal fusion)
      s.push_back({(Hq + 2 * Hkv) * D, H});
      s.push_back({H, Hq * D});
      s.push_back({2 * I, H});
      s.push_back({H, I});
      continue;
    }
    s.push_back({Hq * D, H});
    s.push_back({Hkv * D, H});
    s.push_back({Hkv * D, H});
    s.push_back({H, Hq * D});
    s.push_back({I, H});
    s.push_back({I, H});
    s.push_back({H, I});
  }
  s.push_back({V, H});
  return s;
}

__global__ void fill_random(bf16* w, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    uint32_t h = (uint32_t)i * 2654435761u ^ seed;
    h ^= h >> 15, h *= 2246822519u, h ^= h >> 13, h *= 3266489917u, h ^= h >> 16;
    w[i] = __float2bfloat16(((h & 0xffff) / 65536.f - 0.5f) * 0.1f);
  }
}

__global__ void fill_x(float* x, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    uint32_t h = (uint32_t)i * 747796405u + seed;
    h ^= h >> 16, h *= 2246822519u, h ^= h >> 13;
    x[i] = (h & 0xffff) / 65536.f - 0.5f;
  }
}

// The reference: one warp per output, fp32, plain loads.
__global__ void gemv_ref(const bf16* w, const float* x, float* y, int N, int K, int M) {
  const int row = blockIdx.x * 8 + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= N) return;
  for (int m = 0; m < M; ++m) {
    float acc = 0.f;
    for (int k = lane; k < K; k += 32) acc += __bfloat162float(w[(int64_t)row * K + k]) * x[(int64_t)m * K + k];
    acc = mpk::warp_sum(acc);
    if (lane == 0) y[(int64_t)m * N + row] = acc;
  }
}

// spin_until polls cond; past a second it reports and traps (a hang is a bug here).
template <class C>
__device__ __forceinline__ void spin_until(C cond, const char* what, uint32_t seq) {
  uint64_t t0 = 0;
  for (uint32_t polls = 0; !cond(); ++polls) {
    if ((polls & 255) != 255) continue;
    if (t0 == 0) t0 = mpk::globaltimer();
    else if (mpk::globaltimer() - t0 > 1000000000ull) {
      printf("HANG block %d thread %d: %s %u\n", blockIdx.x, threadIdx.x, what, seq);
      __trap();
    }
  }
}

// Per task, with TRACE: when its wait began and ended, x was staged, its
// pages were consumed, its rows reduced, and it signalled (globaltimer ns);
// and when the loader began and finished issuing its pages.
struct Trace {
  uint64_t t[6];
  uint64_t load0, load1;
};

struct Args {
  Trace* trace;  // null: no trace
  const Task* tasks;
  const int* queue_start;  // [workers + 1]
  const int* queue;
  const int* tasks_of;  // tasks per matrix
  uint32_t* counters;   // per matrix, monotonic across launches
  uint32_t epoch;       // launch number, from 1
  int dep;
  int max_k;  // the largest K: x is staged as [M][max_k] at most
};

// wait_matrix: thread 0 spins until every task of matrix i-1 finished in this launch.
__device__ __forceinline__ void mark(const Args& a, int task, int i) {
  if (a.trace && threadIdx.x == 0) a.trace[task].t[i] = mpk::globaltimer();
}

__device__ __forceinline__ void wait_previous(const Args& a, const Task& t) {
  if (a.dep && t.matrix > 0 && threadIdx.x == 0) {
    const uint32_t need = (uint32_t)a.tasks_of[t.matrix - 1] * a.epoch;
    spin_until([&] { return (int32_t)(mpk::ld_acquire(a.counters + t.matrix - 1) - need) >= 0; }, "matrix", t.matrix);
  }
}

__device__ __forceinline__ void signal(const Args& a, const Task& t) {
  if (threadIdx.x == 0) {
    __threadfence();
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(a.counters + t.matrix) : "memory");
  }
}

// stage_x copies the M rows of x into shared memory, 16 loads
// of each thread in flight before their stores (registers are scarce: with
// the loader's 17th warp a thread gets 96).
template <int K, int M>
__device__ __forceinline__ void stage_x(const Task& t, float* xs) {
  constexpr int BATCH = 16, TOTAL = M * K;
#pragma unroll 1
  for (int b = 0; b < TOTAL; b += BATCH * MPK_THREADS) {
    float v[BATCH];
#pragma unroll
    for (int i = 0; i < BATCH; ++i) {
      const int k = b + threadIdx.x + i * MPK_THREADS;
      v[i] = k < TOTAL ? __ldcg(t.x + k) : 0.f;
    }
#pragma unroll
    for (int i = 0; i < BATCH; ++i) {
      const int k = b + threadIdx.x + i * MPK_THREADS;
      if (k < TOTAL) xs[k] = v[i];
    }
  }
}

enum { kCopy = 0, kStream = 1 };

// consume runs one task after its wait: stage x, then the task's pages.
template <int K, int M, int V, class R>
__device__ __forceinline__ void consume(const Args& a, int id, const Task& t, const R ring, uint32_t& seq, float* xs, float* part) {
  const uint64_t elems = (uint64_t)t.rows * K;
  auto wait = [&](uint32_t s) {  // lane 0 polls; then every lane takes the barrier's acquire
    if (threadIdx.x % 32 == 0) spin_until([&] { return ring.ready(s); }, "page", s);
    __syncwarp();
    ring.ready(s);
  };
  mpk::consumer_sync();  // the previous task is done with xs
  mark(a, id, 1);
  stage_x<K, M>(t, xs);
  mpk::consumer_sync();
  mark(a, id, 2);
  constexpr int E = mpk::page_elems(K, R::kBytes / 2, mpk::StreamOf<bf16>::CHUNK);
  constexpr int XR = mpk::stream_x_regs<bf16>(K, M, R::kBytes);
  if constexpr (E == 0 || XR == 0 || XR > 32) {
    __trap();  // the host skips such shapes
  } else if constexpr (V == kCopy) {  // wait for each page, release it unread
    for (uint32_t p = 0; p < (elems + E - 1) / E; ++p, ++seq) {
      wait(seq);
      ring.release(seq);
    }
  } else {
    mpk::stream_dots<bf16, K, M>(ring, seq, elems, xs, part, wait);
    mpk::consumer_sync();
    mark(a, id, 3);
    // A thread per output: its row's partials summed in order.
    for (int r = threadIdx.x; r < t.rows * M; r += MPK_THREADS)
      t.y[(int64_t)(r % M) * t.N + r / M] = mpk::row_dot<bf16, K, M>(part, r / M, r % M);
  }
}

// The kernel's warps: MPK_THREADS/32 consumers, then the loader (fills the
// ring, at most F pages in flight), then the signaller (publishes each task
// the consumers finished, so they never wait for the release to land).
template <int P, int F, int M, int V>
__global__ void __launch_bounds__(kBlock, 1) ring_kernel(Args a) {
  using R = mpk::Ring<P>;
  extern __shared__ __align__(128) char smem[];
  auto* bars = reinterpret_cast<mpk::RingBars<P>*>(smem);
  uint32_t* done = reinterpret_cast<uint32_t*>(smem + 1024 - 16);  // tasks finished by the consumers
  char* pages = smem + 1024;
  float* xs = reinterpret_cast<float*>(pages + P * mpk::kPageBytes);
  float* part = xs + M * a.max_k;
  const R ring{bars, pages};
  if (threadIdx.x == 0) {
    ring.init(kConsumerWarps);
    *done = 0;
  }
  __syncthreads();
  const int w = blockIdx.x, q0 = a.queue_start[w], q1 = a.queue_start[w + 1];
  if (threadIdx.x >= MPK_THREADS + 32) {  // the signaller
    if (threadIdx.x == MPK_THREADS + 32) {
      for (int q = q0; q < q1; ++q) {
        spin_until([&] { return mpk::ld_acquire_cta(done) > (uint32_t)(q - q0); }, "done", q);
        const int id = a.queue[q];
        if (a.trace) a.trace[id].t[4] = mpk::globaltimer();
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(a.counters + a.tasks[id].matrix) : "memory");
        if (a.trace) a.trace[id].t[5] = mpk::globaltimer();
      }
    }
    return;
  }
  if (threadIdx.x >= MPK_THREADS) {  // the loader: one lane issues
    if (threadIdx.x == MPK_THREADS) {
      const uint64_t policy = mpk::weight_policy();
      uint32_t seq = 0;
      for (int q = q0; q < q1; ++q) {
        const Task& t = a.tasks[a.queue[q]];
        if (a.trace) a.trace[a.queue[q]].load0 = mpk::globaltimer();
        const uint64_t bytes = (uint64_t)t.rows * t.K * sizeof(bf16);
        const uint64_t page = (uint64_t)mpk::page_elems(t.K, mpk::kPageBytes / 2, mpk::StreamOf<bf16>::CHUNK) * 2;
        const char* src = reinterpret_cast<const char*>(t.w);
        for (uint64_t off = 0; off < bytes; off += page, ++seq) {
          spin_until([&] { return ring.slot_free(seq) && (seq < F || ring.ready(seq - F)); }, "free slot", seq);
          ring.fill(seq, src + off, (uint32_t)(bytes - off < page ? bytes - off : page), policy);
        }
        if (a.trace) a.trace[a.queue[q]].load1 = mpk::globaltimer();
      }
    }
    return;
  }
  uint32_t seq = 0;
  for (int q = q0; q < q1; ++q) {
    const int id = a.queue[q];
    const Task t = a.tasks[id];
    mark(a, id, 0);
    wait_previous(a, t);
    switch (t.K) {
      case 1024: consume<1024, M, V>(a, id, t, ring, seq, xs, part); break;
      case 2048: consume<2048, M, V>(a, id, t, ring, seq, xs, part); break;
      case 3072: consume<3072, M, V>(a, id, t, ring, seq, xs, part); break;
      case 4096: consume<4096, M, V>(a, id, t, ring, seq, xs, part); break;
      case 6144: consume<6144, M, V>(a, id, t, ring, seq, xs, part); break;
      case 8192: consume<8192, M, V>(a, id, t, ring, seq, xs, part); break;
      case 12288: consume<12288, M, V>(a, id, t, ring, seq, xs, part); break;
    }
    mpk::consumer_sync();
    if (threadIdx.x == 0) mpk::st_release_cta(done, (uint32_t)(q - q0 + 1));
  }
}

// reg: today's Linear: no loader, a warp per row, 4 x 16 B loads in flight per lane.
template <int M>
__global__ void __launch_bounds__(MPK_THREADS, 1) reg_kernel(Args a) {
  extern __shared__ __align__(128) char smem[];
  float* xs = reinterpret_cast<float*>(smem);
  const int w = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const uint64_t policy = mpk::weight_policy();
  for (int q = a.queue_start[w]; q < a.queue_start[w + 1]; ++q) {
    const Task t = a.tasks[a.queue[q]];
    wait_previous(a, t);
    __syncthreads();
    for (int k = threadIdx.x; k < M * t.K; k += MPK_THREADS) xs[k] = __ldcg(t.x + k);
    __syncthreads();
    for (int n = warp; n < t.rows; n += MPK_THREADS / 32) {
      const bf16* row = t.w + (int64_t)n * t.K;
      float acc[M] = {};
#pragma unroll 4
      for (int k = lane * 8; k < t.K; k += 256) {
        uint4 raw;
        asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                     : "=r"(raw.x), "=r"(raw.y), "=r"(raw.z), "=r"(raw.w)
                     : "l"(row + k), "l"(policy));
#pragma unroll
        for (int m = 0; m < M; ++m) acc[m] += mpk::dot16(raw, xs + m * t.K + k, static_cast<bf16*>(nullptr));
      }
#pragma unroll
      for (int m = 0; m < M; ++m) {
        const float v = mpk::warp_sum(acc[m]);
        if (lane == 0) t.y[(int64_t)m * t.N + n] = v;
      }
    }
    __syncthreads();
    signal(a, t);
  }
}

struct Setup {
  std::vector<Shape> shapes;
  std::vector<bf16*> w;
  std::vector<float*> x, y, ref;
  std::vector<Task> tasks;
  std::vector<int> queue_start, queue, tasks_of;
  uint64_t bytes = 0;
  bool fused = false;
};

// The megakernel's split: tasks of at most kTaskCap bytes, a multiple of the
// worker count (every SM streams every matrix), near-equal rows; tasks are
// dealt to workers round-robin in matrix order.
void build_tasks(Setup& s, int workers, bool l2) {
  std::vector<std::vector<int>> queues(workers);
  int next = 0;
  for (size_t i = 0; i < s.shapes.size(); ++i) {
    const Shape sh = s.shapes[i];
    const int64_t bytes = (int64_t)sh.N * sh.K * 2;
    int64_t parts = (bytes + kTaskCap - 1) / kTaskCap;
    parts = std::min<int64_t>(sh.N, (parts + workers - 1) / workers * workers);
    s.tasks_of.push_back((int)parts);
    for (int64_t p = 0; p < parts; ++p) {
      const int n0 = (int)(p * sh.N / parts), n1 = (int)((p + 1) * sh.N / parts);
      // l2: every task streams the first rows of matrix 0 (L2-resident): the consumers' own rate.
      Task t{l2 ? s.w[0] : s.w[i] + (int64_t)n0 * sh.K, s.x[i], s.y[i] + n0, n1 - n0, sh.K, sh.N, (int)i};
      queues[next++ % workers].push_back((int)s.tasks.size());
      s.tasks.push_back(t);
    }
  }
  for (auto& q : queues) {
    s.queue_start.push_back((int)s.queue.size());
    s.queue.insert(s.queue.end(), q.begin(), q.end());
  }
  s.queue_start.push_back((int)s.queue.size());
}

// summarize_trace prints, per matrix kind (its position in a layer), the
// mean per-task time of each phase, from the last launch's trace.
void summarize_trace(const Setup& s, const Trace* d_trace, int workers) {
  std::vector<Trace> tr(s.tasks.size());
  CK(cudaMemcpy(tr.data(), d_trace, tr.size() * sizeof(Trace), cudaMemcpyDeviceToHost));
  const int per_layer = s.fused ? 4 : 7;
  const int kinds = per_layer + 1;
  std::vector<double> sum(kinds * 8, 0.0), kb(kinds, 0.0);
  std::vector<int> n(kinds, 0);
  uint64_t t_min = ~0ull, t_max = 0;
  for (size_t i = 0; i < tr.size(); ++i) {
    const Task& t = s.tasks[i];
    const int kind = t.matrix == (int)s.shapes.size() - 1 ? per_layer : t.matrix % per_layer;
    const Trace& r = tr[i];
    for (int j = 0; j < 5; ++j) sum[kind * 8 + j] += (double)(r.t[j + 1] - r.t[j]);
    sum[kind * 8 + 5] += (double)(r.load1 - r.load0);
    sum[kind * 8 + 6] += (double)((int64_t)r.t[2] - (int64_t)r.load1);  // > 0: all pages issued before x was staged
    kb[kind] += t.rows * (double)t.K * 2 / 1024;
    n[kind]++;
    t_min = std::min(t_min, r.t[0]);
    t_max = std::max(t_max, r.t[5]);
  }
  printf("  trace: span %.1f us; per task mean us: kind  n  KB | wait stage pages reduce signal | loader-issue (issued-before-staged)\n",
         (t_max - t_min) / 1e3);
  for (int k = 0; k < kinds; ++k) {
    if (!n[k]) continue;
    printf("   %2d %6d %7.1f |", k, n[k], kb[k] / n[k]);
    for (int j = 0; j < 5; ++j) printf(" %6.2f", sum[k * 8 + j] / n[k] / 1e3);
    printf(" | %6.2f (%6.2f)\n", sum[k * 8 + 5] / n[k] / 1e3, sum[k * 8 + 6] / n[k] / 1e3);
  }
  (void)workers;
}

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IONBF, 0);
  const std::string model = argc > 1 ? argv[1] : "llama-3.2-1b";
  const int layers = argc > 2 ? atoi(argv[2]) : 0;
  const bool fused = argc > 3 && std::string(argv[3]).find("fused") != std::string::npos;
  const bool l2 = argc > 3 && std::string(argv[3]).find("l2") != std::string::npos;  // consumer rate only
  const int reps = 10;
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  const double copy_bw = copy_bandwidth();
  printf("device %s, %d SMs, L2 %d MB, copy bandwidth %.0f GB/s\n", prop.name, sms, prop.l2CacheSize >> 20, copy_bw / 1e9);

  Setup s;
  s.shapes = model_shapes(model, layers, fused);
  s.fused = fused;
  for (size_t i = 0; i < s.shapes.size(); ++i) {
    const Shape sh = s.shapes[i];
    bf16* w;
    float *x, *y, *r;
    CK(cudaMalloc(&w, (size_t)sh.N * sh.K * 2));
    CK(cudaMalloc(&x, (size_t)kMaxM * sh.K * 4));
    CK(cudaMalloc(&y, (size_t)kMaxM * sh.N * 4));
    CK(cudaMalloc(&r, (size_t)kMaxM * sh.N * 4));
    fill_random<<<1024, 256>>>(w, (int64_t)sh.N * sh.K, 17 + (uint32_t)i);
    fill_x<<<64, 256>>>(x, (int64_t)kMaxM * sh.K, 5 + (uint32_t)i);
    s.w.push_back(w), s.x.push_back(x), s.y.push_back(y), s.ref.push_back(r);
    s.bytes += (uint64_t)sh.N * sh.K * 2;
  }
  CK(cudaDeviceSynchronize());
  printf("model %s%s%s: %zu matrices, %.1f MB of weights (%.1fx L2); floor %.1f us\n", model.c_str(), fused ? " (fused)" : "", l2 ? " (l2: weights from L2, unchecked)" : "", s.shapes.size(),
         s.bytes / 1e6, (double)s.bytes / prop.l2CacheSize, s.bytes / copy_bw * 1e6);
  build_tasks(s, sms, l2);
  Task* d_tasks;
  int *d_qs, *d_q, *d_to;
  uint32_t* d_counters;
  CK(cudaMalloc(&d_tasks, s.tasks.size() * sizeof(Task)));
  CK(cudaMalloc(&d_qs, s.queue_start.size() * 4));
  CK(cudaMalloc(&d_q, s.queue.size() * 4));
  CK(cudaMalloc(&d_to, s.tasks_of.size() * 4));
  CK(cudaMalloc(&d_counters, s.shapes.size() * 4));
  CK(cudaMemcpy(d_tasks, s.tasks.data(), s.tasks.size() * sizeof(Task), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_qs, s.queue_start.data(), s.queue_start.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_q, s.queue.data(), s.queue.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_to, s.tasks_of.data(), s.tasks_of.size() * 4, cudaMemcpyHostToDevice));
  printf("%zu tasks (%.1f per SM)\n", s.tasks.size(), (double)s.tasks.size() / sms);
  Trace* d_trace;
  CK(cudaMalloc(&d_trace, s.tasks.size() * sizeof(Trace)));

  int max_k = 0;
  for (size_t i = 0; i < s.shapes.size(); ++i) {
    gemv_ref<<<(s.shapes[i].N + 7) / 8, 256>>>(s.w[i], s.x[i], s.ref[i], s.shapes[i].N, s.shapes[i].K, kMaxM);
    max_k = std::max(max_k, s.shapes[i].K);
  }
  CK(cudaDeviceSynchronize());

  uint32_t epoch = 0;
  auto run = [&](const char* name, int M, int dep, auto launch, size_t smem_bytes, bool check, bool trace = false) {
    CK(cudaMemset(d_counters, 0, s.shapes.size() * 4));
    epoch = 0;
    for (size_t i = 0; i < s.shapes.size(); ++i) CK(cudaMemset(s.y[i], 0xff, (size_t)kMaxM * s.shapes[i].N * 4));
    Args a{trace ? d_trace : nullptr, d_tasks, d_qs, d_q, d_to, d_counters, 0, dep, max_k};
    std::vector<float> ms;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int r = 0; r < reps + 2; ++r) {
      a.epoch = ++epoch;
      CK(cudaEventRecord(e0));
      launch(a, smem_bytes);
      CK(cudaGetLastError());
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      float t;
      CK(cudaEventElapsedTime(&t, e0, e1));
      if (r >= 2) ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    const double med = ms[ms.size() / 2];
    double err = 0, num = 0, den = 0;
    if (check) {
      for (size_t i = 0; i < s.shapes.size(); ++i) {
        const size_t n = (size_t)M * s.shapes[i].N;
        std::vector<float> y(n), r(n);
        CK(cudaMemcpy(y.data(), s.y[i], n * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(r.data(), s.ref[i], n * 4, cudaMemcpyDeviceToHost));
        for (size_t j = 0; j < n; ++j) {
          const double d = (double)y[j] - r[j];
          num += d * d, den += (double)r[j] * r[j];
        }
      }
      err = den > 0 ? sqrt(num / den) : 0;
    }
    const double floor_us = s.bytes / copy_bw * 1e6;
    printf("%-12s M=%d dep=%d  %9.1f us  %7.0f GB/s  %.3f of floor  rel_err %s%.2e\n", name, M, dep, med * 1e3,
           s.bytes / (med / 1e3) / 1e9, floor_us / (med * 1e3), check ? "" : "(unchecked) ", err);
    printf("JSON {\"model\": \"%s\", \"fused\": %d, \"variant\": \"%s\", \"M\": %d, \"dep\": %d, \"us\": %.2f, \"fraction\": %.4f, \"rel_err\": %.3e}\n",
           model.c_str(), (int)fused, name, M, dep, med * 1e3, floor_us / (med * 1e3), err);
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    if (trace) summarize_trace(s, d_trace, sms);
  };

  auto coop = [&](const void* fn, int threads, Args& a, size_t smem) {
    void* args[] = {&a};
    CK(cudaLaunchCooperativeKernel(fn, dim3(sms), dim3(threads), args, smem, 0));
  };
  auto coop_reg = [&](const void* fn, Args& a, size_t smem) {
    void* args[] = {&a};
    CK(cudaLaunchCooperativeKernel(fn, dim3(sms), dim3(MPK_THREADS), args, smem, 0));
  };

#define RING(P, F, M, DEP, V, NAME, TRACE)                                                                    \
  do {                                                                                                        \
    const size_t smem = 1024 + (size_t)P * mpk::kPageBytes + (size_t)M * max_k * 4 +                          \
                        (size_t)mpk::partial_floats<bf16, M>(kTaskCap / 2) * 4;                               \
    bool fits = true;                                                                                         \
    for (auto& sh : s.shapes) {                                                                               \
      const int xr = mpk::stream_x_regs<bf16>(sh.K, M, mpk::kPageBytes);                                      \
      fits = fits && (V == kCopy ? xr > 0 : xr > 0 && xr <= 32);                                              \
    }                                                                                                         \
    if (!fits) {                                                                                              \
      printf("%-12s M=%d dep=%d  skipped: a K of this model does not stream with M=%d\n", NAME, M, DEP, M);   \
      break;                                                                                                  \
    }                                                                                                         \
    if (smem > (size_t)prop.sharedMemPerBlockOptin) {                                                         \
      printf("%-12s M=%d dep=%d  skipped: %zu bytes of shared memory\n", NAME, M, DEP, smem);                  \
      break;                                                                                                  \
    }                                                                                                         \
    CK(cudaFuncSetAttribute(ring_kernel<P, F, M, V>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem)); \
    run(NAME, M, DEP, [&](Args& a, size_t sm) { coop((const void*)ring_kernel<P, F, M, V>, kBlock, a, sm); },  \
        smem, V != kCopy && !l2, TRACE);                                                                      \
  } while (0)

  {
    const size_t smem = (size_t)max_k * 4;
    CK(cudaFuncSetAttribute(reg_kernel<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    run("reg", 1, 1, [&](Args& a, size_t sm) { coop_reg((const void*)reg_kernel<1>, a, sm); }, smem, !l2);
  }
  RING(10, 3, 1, 0, kCopy, "copy10/3", false);
  RING(10, 3, 1, 0, kStream, "ring10/3", false);
  RING(10, 3, 1, 1, kStream, "ring10/3", true);
  RING(10, 2, 1, 1, kStream, "ring10/2", false);
  RING(10, 4, 1, 1, kStream, "ring10/4", false);
  RING(6, 3, 1, 1, kStream, "ring6/3", false);
  RING(10, 3, 2, 1, kStream, "ring10/3", false);
  return 0;
}
