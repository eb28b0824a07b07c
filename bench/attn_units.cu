// Decode-attention micro-benchmark (batch 1): a candidate layout for the
// megakernel's attention, measured alone before it goes in (bench/NOTES.md,
// twentieth session). Today a unit is (query head, chunk of 512 positions) on
// 16 warps, a lane a position, so 32-64 of 132 workers each run ~2,500
// dependent instructions a warp, and each KV head is read once per query
// head. Here a unit is (KV head, chunk of T / 16 positions) and a CTA takes
// one: every SM works, the G query heads of a KV head share each K and V
// load, a lane holds D / 32 dims of a row (the q·k sums are warp shuffles),
// and all K and V loads of a unit are issued at once before any math. The
// chunk's softmax is one warp's (P = 32 positions a lane each), done by
// every warp for its own rows; the warps' p·V sums meet in shared memory.
//   units   each unit writes its partial (acc, max, sum) for its G heads
//   merged  the same, then the last unit of each KV head (a counter per
//           head, after a release fence) merges its head's partials into
//           the attention's output x, so the o projection would stage a
//           plain x instead of merging 64-256 partials in every task
//   head    the other layout (attn_head): a CTA per KV head over every
//           position, writing x with no partials
//   bulk    the same with K and V streamed by bulk copies through shared
//           memory, several blocks in flight (attn_head_bulk)
// Times are from the first CTA's start to the last CTA's end (globaltimer),
// median over launches, with L2 flushed before each (the KV cache of a layer
// was written steps ago). x is checked against a CPU softmax attention over
// the same bf16 K and V.
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Icsrc bench/attn_units.cu -o /tmp/au && /tmp/au
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "cuda_check.h"
#include "runtime/ring.cuh"
#include "runtime/runtime.cuh"
#include "tasks/dot.cuh"

using bf16 = __nv_bfloat16;

constexpr int kWarps = 16;
constexpr int kChunks = 16;      // units a KV head: 8 KV heads x 16 = 128 CTAs
constexpr int kP = 32;           // positions a unit (T = 512)
constexpr int kPW = kP / kWarps; // positions a warp

struct Args {
  const float* q;   // [Hq][D], rotated and scaled by log2(e) / sqrt(D)
  const bf16* k;    // [Hkv][S][D]
  const bf16* v;    // [Hkv][S][D]
  float* part;      // [Hkv * kChunks][G][D + 2]: acc, then max and sum
  float* x;         // [Hq][D]
  uint32_t* count;  // per KV head, monotonic across launches
  uint32_t epoch;   // launches before this one
  int S, T, merge;
  unsigned long long* times;  // [CTAs][2]
};

// load_row reads lane's D / 32 dims of a bf16 row as floats.
template <int D>
__device__ __forceinline__ void load_row(const bf16* row, int lane, float* out) {
  constexpr int E = D / 32;
  if constexpr (E == 2) {
    const uint32_t w = __ldcg(reinterpret_cast<const unsigned int*>(row) + lane);
    out[0] = __uint_as_float(w << 16), out[1] = __uint_as_float(w & 0xffff0000u);
  } else {
    static_assert(E == 4, "D is 64 or 128");
    const uint2 w = __ldcg(reinterpret_cast<const uint2*>(row) + lane);
    out[0] = __uint_as_float(w.x << 16), out[1] = __uint_as_float(w.x & 0xffff0000u);
    out[2] = __uint_as_float(w.y << 16), out[3] = __uint_as_float(w.y & 0xffff0000u);
  }
}

// warp_dot is q·k over a row whose lanes hold E elements each.
template <int E>
__device__ __forceinline__ float warp_dot(const float (&q)[E], const float (&k)[E]) {
  float s = 0.f;
#pragma unroll
  for (int e = 0; e < E; ++e) s = fmaf(q[e], k[e], s);
  return mpk::warp_sum(s);
}

template <int D, int G>
__global__ void __launch_bounds__(kWarps * 32, 1) attn_units(const Args a) {
  constexpr int E = D / 32;
  __shared__ float sc[kP][G];                // scores
  __shared__ float red[kWarps][G][D];        // the warps' p·V sums
  __shared__ int s_last;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = blockIdx.x / kChunks, c = blockIdx.x % kChunks;
  if (threadIdx.x == 0) a.times[2 * blockIdx.x] = mpk::globaltimer();
  // Every load of the unit at once: its rows of K and V, and the G queries.
  float kr[kPW][E], vr[kPW][E], qr[G][E];
#pragma unroll
  for (int i = 0; i < kPW; ++i) {
    const int pos = c * kP + warp * kPW + i;
    const size_t row = ((size_t)g * a.S + min(pos, a.S - 1)) * D;
    load_row<D>(a.k + row, lane, kr[i]);
    load_row<D>(a.v + row, lane, vr[i]);
  }
#pragma unroll
  for (int h = 0; h < G; ++h)
#pragma unroll
    for (int e = 0; e < E; ++e) qr[h][e] = __ldcg(a.q + (g * G + h) * D + lane * E + e);
  // Scores: a warp sum a (row, head).
#pragma unroll
  for (int i = 0; i < kPW; ++i) {
    const int pos = c * kP + warp * kPW + i;
#pragma unroll
    for (int h = 0; h < G; ++h) {
      const float s = warp_dot<E>(qr[h], kr[i]);
      if (lane == 0) sc[warp * kPW + i][h] = pos < a.T ? s : -INFINITY;
    }
  }
  __syncthreads();
  // The chunk's max and sum per head (a lane a position), then p·V of the warp's rows.
  float m[G], l[G], acc[G][E];
#pragma unroll
  for (int h = 0; h < G; ++h) {
    const float s = sc[lane][h];
    m[h] = mpk::warp_max(s);
    const float p = m[h] == -INFINITY ? 0.f : exp2f(s - m[h]);
    l[h] = mpk::warp_sum(p);
#pragma unroll
    for (int e = 0; e < E; ++e) acc[h][e] = 0.f;
#pragma unroll
    for (int i = 0; i < kPW; ++i) {
      const float pi = __shfl_sync(0xffffffffu, p, warp * kPW + i);
#pragma unroll
      for (int e = 0; e < E; ++e) acc[h][e] = fmaf(pi, vr[i][e], acc[h][e]);
    }
#pragma unroll
    for (int e = 0; e < E; ++e) red[warp][h][lane * E + e] = acc[h][e];
  }
  __syncthreads();
  float* pu = a.part + (size_t)blockIdx.x * G * (D + 2);
  for (int t = threadIdx.x; t < G * D; t += blockDim.x) {
    const int h = t / D, d = t % D;
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) s += red[w][h][d];
    pu[h * (D + 2) + d] = s;
  }
  if (warp == 0 && lane < G) {
    // Lane h holds head h's max and sum (every warp has them: warp 0 writes).
    float mh = 0.f, lh = 0.f;
#pragma unroll
    for (int h = 0; h < G; ++h)
      if (lane == h) mh = m[h], lh = l[h];
    pu[lane * (D + 2) + D] = mh, pu[lane * (D + 2) + D + 1] = lh;
  }
  if (a.merge) {
    // The last unit of KV head g merges its chunks (every writer's fence,
    // the count; then the last unit's fence before it reads).
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
      s_last = atomicAdd(a.count + g, 1u) + 1 == (a.epoch + 1) * kChunks;
      __threadfence();
    }
    __syncthreads();
    if (s_last) {
      for (int t = threadIdx.x; t < G * D; t += blockDim.x) {
        const int h = t / D, d = t % D;
        float M = -INFINITY;
        for (int cc = 0; cc < kChunks; ++cc)
          M = fmaxf(M, __ldcg(a.part + ((size_t)(g * kChunks + cc) * G + h) * (D + 2) + D));
        float L = 0.f, o = 0.f;
        for (int cc = 0; cc < kChunks; ++cc) {
          const float* pc = a.part + ((size_t)(g * kChunks + cc) * G + h) * (D + 2);
          const float mc = __ldcg(pc + D), f = mc == -INFINITY ? 0.f : exp2f(mc - M);
          L += __ldcg(pc + D + 1) * f, o += __ldcg(pc + d) * f;
        }
        a.x[(g * G + h) * D + d] = L > 0.f ? o / L : 0.f;
      }
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) a.times[2 * blockIdx.x + 1] = mpk::globaltimer();
}

// attn_head: the other layout, a CTA per KV head over all T positions,
// writing x itself (no partials, no merge: what HazyResearch's llama-1B
// megakernel does at short contexts). Warp w takes rows w, w + 16, ..., RB
// at a time, the next RB rows' loads in flight while the current ones are
// scored (two register buffers, used in turn), each warp an online softmax
// per query head; the warps' states meet in shared memory. 8 CTAs for 8 KV
// heads: each streams its head's K and V (T·D·4 bytes) on one SM.
template <int D, int G, int RB>
__device__ __forceinline__ void head_rows(const Args& a, int g, int warp, int lane, int i0, float (&kr)[RB][D / 32],
                                          float (&vr)[RB][D / 32]) {
#pragma unroll
  for (int i = 0; i < RB; ++i) {
    const int pos = warp + kWarps * (i0 + i);
    const size_t row = ((size_t)g * a.S + min(pos, a.T - 1)) * D;
    load_row<D>(a.k + row, lane, kr[i]);
    load_row<D>(a.v + row, lane, vr[i]);
  }
}

template <int D, int G, int RB>
__device__ __forceinline__ void head_fold(const Args& a, int warp, int i0, const float (&qr)[G][D / 32],
                                          const float (&kr)[RB][D / 32], const float (&vr)[RB][D / 32], float (&m)[G],
                                          float (&l)[G], float (&acc)[G][D / 32]) {
  constexpr int E = D / 32;
#pragma unroll
  for (int h = 0; h < G; ++h) {
    float sc[RB], mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < RB; ++i) {
      const float d = warp_dot<E>(qr[h], kr[i]);
      sc[i] = warp + kWarps * (i0 + i) < a.T ? d : -INFINITY;
      mx = fmaxf(mx, sc[i]);
    }
    const float mn = fmaxf(m[h], mx);
    if (mn == -INFINITY) continue;  // warp-uniform: no position yet
    const float corr = m[h] == -INFINITY ? 0.f : exp2f(m[h] - mn);
    l[h] *= corr;
#pragma unroll
    for (int e = 0; e < E; ++e) acc[h][e] *= corr;
#pragma unroll
    for (int i = 0; i < RB; ++i) {
      const float p = sc[i] == -INFINITY ? 0.f : exp2f(sc[i] - mn);
      l[h] += p;
#pragma unroll
      for (int e = 0; e < E; ++e) acc[h][e] = fmaf(p, vr[i][e], acc[h][e]);
    }
    m[h] = mn;
  }
}

// head_start reads KV head g's G queries (lane: elements lane·E ...) and
// clears their online softmax states.
template <int D, int G>
__device__ __forceinline__ void head_start(const Args& a, int g, int lane, float (&qr)[G][D / 32], float (&m)[G],
                                           float (&l)[G], float (&acc)[G][D / 32]) {
  constexpr int E = D / 32;
#pragma unroll
  for (int h = 0; h < G; ++h) {
    m[h] = -INFINITY, l[h] = 0.f;
#pragma unroll
    for (int e = 0; e < E; ++e) qr[h][e] = __ldcg(a.q + (g * G + h) * D + lane * E + e), acc[h][e] = 0.f;
  }
}

// head_write_x merges the warps' online softmax states (m, l, acc: lane
// holds columns lane·E ...) of KV head g's G query heads in shared memory
// and writes their rows of x.
template <int D, int G>
__device__ __forceinline__ void head_write_x(const Args& a, int g, int warp, int lane, const float (&m)[G],
                                             const float (&l)[G], const float (&acc)[G][D / 32]) {
  constexpr int E = D / 32;
  __shared__ float red_o[kWarps][G][D];
  __shared__ float red_m[kWarps][G], red_l[kWarps][G];
#pragma unroll
  for (int h = 0; h < G; ++h) {
#pragma unroll
    for (int e = 0; e < E; ++e) red_o[warp][h][lane * E + e] = acc[h][e];
    if (lane == 0) red_m[warp][h] = m[h], red_l[warp][h] = l[h];
  }
  __syncthreads();
  for (int t = threadIdx.x; t < G * D; t += blockDim.x) {
    const int h = t / D, d = t % D;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, red_m[w][h]);
    float L = 0.f, o = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float f = red_m[w][h] == -INFINITY ? 0.f : exp2f(red_m[w][h] - M);
      L += red_l[w][h] * f, o += red_o[w][h][d] * f;
    }
    a.x[(g * G + h) * D + d] = L > 0.f ? o / L : 0.f;
  }
  __syncthreads();
}

template <int D, int G, int RB>
__global__ void __launch_bounds__(kWarps * 32, 1) attn_head(const Args a) {
  constexpr int E = D / 32;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = blockIdx.x;
  if (threadIdx.x == 0) a.times[2 * blockIdx.x] = mpk::globaltimer();
  float qr[G][E], m[G], l[G], acc[G][E];
  head_start<D, G>(a, g, lane, qr, m, l, acc);
  const int rows = (a.T + kWarps - 1) / kWarps;  // a warp's rows
  float k0[RB][E], v0[RB][E], k1[RB][E], v1[RB][E];
  head_rows<D, G, RB>(a, g, warp, lane, 0, k0, v0);
  for (int i0 = 0; i0 < rows; i0 += 2 * RB) {
    if (i0 + RB < rows) head_rows<D, G, RB>(a, g, warp, lane, i0 + RB, k1, v1);
    head_fold<D, G, RB>(a, warp, i0, qr, k0, v0, m, l, acc);
    if (i0 + RB >= rows) break;
    if (i0 + 2 * RB < rows) head_rows<D, G, RB>(a, g, warp, lane, i0 + 2 * RB, k0, v0);
    head_fold<D, G, RB>(a, warp, i0 + RB, qr, k1, v1, m, l, acc);
  }
  head_write_x<D, G>(a, g, warp, lane, m, l, acc);
  if (threadIdx.x == 0) a.times[2 * blockIdx.x + 1] = mpk::globaltimer();
}

// attn_head_bulk is attn_head with K and V streamed as the megakernel's
// loader streams weights: blocks of kBlockRows rows of K and of V (a head's
// rows are contiguous: one bulk copy each) land in a ring of NS stages by
// cp.async.bulk, every stage in flight from the start, so a CTA keeps up to
// NS blocks' bytes in flight (64-128 KB) where registers held ~16 KB. The
// warps then read rows from shared memory (warp w: rows w, w + 16 of a
// block), the online softmax as attn_head's.
constexpr int kBlockRows = 32;

template <int D>
constexpr int head_stages() {
  return (160 << 10) / (2 * kBlockRows * D * 2) < 8 ? (160 << 10) / (2 * kBlockRows * D * 2) : 8;
}

template <int D, int G>
__global__ void __launch_bounds__(kWarps * 32, 1) attn_head_bulk(const Args a) {
  constexpr int E = D / 32, NS = head_stages<D>(), RB = kBlockRows / kWarps;  // rows a warp a block
  constexpr int KB = kBlockRows * D * 2;                                       // bytes of K (or V) a block
  extern __shared__ __align__(128) char smem[];
  // The megakernel's ring (runtime/ring.cuh), a stage a page: [K block, V block].
  const mpk::Ring<NS, 2 * KB> ring{reinterpret_cast<mpk::RingBars<NS>*>(smem), smem + mpk::ring_bars_bytes<NS>()};
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = blockIdx.x;
  const int blocks = (a.T + kBlockRows - 1) / kBlockRows;
  const bf16* kh = a.k + (size_t)g * a.S * D;
  const bf16* vh = a.v + (size_t)g * a.S * D;
  const uint64_t policy = mpk::weight_policy();
  auto issue = [&](int b) {  // one thread: block b's K and V rows into page b (Ring::fill of two sources)
    uint64_t* bar = &ring.bars->full[b % NS];
    mpk::mbar_expect_bytes(bar, 2 * KB);
    mpk::bulk_load(ring.page(b), kh + (size_t)b * kBlockRows * D, KB, bar, policy);
    mpk::bulk_load(ring.page(b) + KB, vh + (size_t)b * kBlockRows * D, KB, bar, policy);
  };
  if (threadIdx.x == 0) {
    a.times[2 * blockIdx.x] = mpk::globaltimer();
    ring.init(1);  // (its empty barriers go unused: a block barrier frees a stage)
    for (int b = 0; b < min(NS, blocks); ++b) issue(b);
  }
  float qr[G][E], m[G], l[G], acc[G][E];
  head_start<D, G>(a, g, lane, qr, m, l, acc);
  __syncthreads();  // the barriers are initialised
  for (int b = 0; b < blocks; ++b) {
    while (!ring.ready(b)) {
    }
    const char* st = ring.page(b);
    float kr[RB][E], vr[RB][E];
#pragma unroll
    for (int i = 0; i < RB; ++i) {
      const bf16* kk = reinterpret_cast<const bf16*>(st) + (warp + kWarps * i) * D + lane * E;
      const bf16* vv = reinterpret_cast<const bf16*>(st + KB) + (warp + kWarps * i) * D + lane * E;
#pragma unroll
      for (int e = 0; e < E; ++e) kr[i][e] = __bfloat162float(kk[e]), vr[i][e] = __bfloat162float(vv[e]);
    }
    head_fold<D, G, RB>(a, warp, b * kBlockRows / kWarps, qr, kr, vr, m, l, acc);
    __syncthreads();  // stage b % NS is read: refill it
    if (threadIdx.x == 0 && b + NS < blocks) issue(b + NS);
  }
  head_write_x<D, G>(a, g, warp, lane, m, l, acc);
  if (threadIdx.x == 0) a.times[2 * blockIdx.x + 1] = mpk::globaltimer();
}

// reference: x for every query head over T positions, in double.
static void reference(const std::vector<float>& q, const std::vector<bf16>& k, const std::vector<bf16>& v, int Hq,
                      int Hkv, int S, int T, int D, std::vector<float>& x) {
  const int G = Hq / Hkv;
  x.assign((size_t)Hq * D, 0.f);
  for (int hq = 0; hq < Hq; ++hq) {
    const int g = hq / G;
    std::vector<double> s(T);
    double M = -INFINITY;
    for (int t = 0; t < T; ++t) {
      double acc = 0;
      for (int d = 0; d < D; ++d) acc += (double)q[hq * D + d] * (double)__bfloat162float(k[((size_t)g * S + t) * D + d]);
      s[t] = acc, M = std::max(M, acc);
    }
    double L = 0;
    std::vector<double> o(D, 0.0);
    for (int t = 0; t < T; ++t) {
      const double p = exp2(s[t] - M);
      L += p;
      for (int d = 0; d < D; ++d) o[d] += p * (double)__bfloat162float(v[((size_t)g * S + t) * D + d]);
    }
    for (int d = 0; d < D; ++d) x[hq * D + d] = (float)(o[d] / L);
  }
}

template <int D, int G>
static void run(const char* name, int Hkv) {
  const int Hq = Hkv * G, S = 1024, T = kChunks * kP, ctas = Hkv * kChunks;
  std::vector<float> q((size_t)Hq * D);
  std::vector<bf16> k((size_t)Hkv * S * D), v(k.size());
  uint32_t seed = 12345;
  auto rnd = [&]() { seed = seed * 1664525u + 1013904223u; return (float)((seed >> 8) & 0xffff) / 65536.f - 0.5f; };
  for (auto& f : q) f = rnd() * 4.f / sqrtf((float)D);
  for (auto& b : k) b = __float2bfloat16(rnd() * 2.f);
  for (auto& b : v) b = __float2bfloat16(rnd() * 2.f);
  Args a{};
  float *dq, *dpart, *dx;
  bf16 *dk, *dv;
  CK(cudaMalloc(&dq, q.size() * 4));
  CK(cudaMalloc(&dk, k.size() * 2));
  CK(cudaMalloc(&dv, v.size() * 2));
  CK(cudaMalloc(&dpart, (size_t)ctas * G * (D + 2) * 4));
  CK(cudaMalloc(&dx, q.size() * 4));
  CK(cudaMalloc(&a.count, Hkv * 4));
  CK(cudaMalloc(&a.times, ctas * 16));
  CK(cudaMemset(a.count, 0, Hkv * 4));
  CK(cudaMemcpy(dq, q.data(), q.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dk, k.data(), k.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dv, v.data(), v.size() * 2, cudaMemcpyHostToDevice));
  char* flush;
  const size_t flush_bytes = size_t(256) << 20;
  CK(cudaMalloc(&flush, flush_bytes));
  a.q = dq, a.k = dk, a.v = dv, a.part = dpart, a.x = dx, a.S = S, a.T = T;
  std::vector<unsigned long long> t(2 * ctas);
  // The median span of 20 launches (after one untimed) of n CTAs, L2 flushed
  // before each (it holds none of K and V).
  auto time_us = [&](int n, auto launch) {
    std::vector<double> us;
    for (int rep = 0; rep < 21; ++rep) {
      CK(cudaMemset(flush, rep, flush_bytes));
      launch();
      CK(cudaGetLastError());
      CK(cudaDeviceSynchronize());
      CK(cudaMemcpy(t.data(), a.times, 16 * n, cudaMemcpyDeviceToHost));
      unsigned long long t0 = ~0ull, t1 = 0;
      for (int i = 0; i < n; ++i) t0 = std::min(t0, t[2 * i]), t1 = std::max(t1, t[2 * i + 1]);
      if (rep > 0) us.push_back((t1 - t0) / 1e3);
    }
    std::sort(us.begin(), us.end());
    return us;
  };
  std::vector<float> ref;
  reference(q, k, v, Hq, Hkv, S, T, D, ref);
  // report prints a layout's time and, where it wrote x, x's error against the CPU.
  auto report = [&](const char* layout, const std::vector<double>& us, bool wrote_x) {
    printf("%-14s Hq %2d Hkv %d D %3d T %d  %-6s %6.2f us (median; min %.2f)", name, Hq, Hkv, D, T, layout,
           us[us.size() / 2], us[0]);
    if (wrote_x) {
      std::vector<float> x(q.size());
      CK(cudaMemcpy(x.data(), dx, x.size() * 4, cudaMemcpyDeviceToHost));
      double num = 0, den = 0;
      for (size_t i = 0; i < x.size(); ++i) num += (x[i] - ref[i]) * (x[i] - ref[i]), den += ref[i] * ref[i];
      const double err = sqrt(num / den);
      printf("  %s (rel err against the CPU %.2e)", err < 1e-4 ? "x ok" : "x WRONG", err);
    }
    printf("\n");
  };
  a.merge = 0;
  report("units", time_us(ctas, [&] { attn_units<D, G><<<ctas, kWarps * 32>>>(a); }), false);
  CK(cudaMemset(dx, 0, q.size() * 4));
  a.merge = 1;
  report("merged", time_us(ctas, [&] {
           attn_units<D, G><<<ctas, kWarps * 32>>>(a);
           a.epoch += 1;  // the counters advance only in merging launches
         }),
         true);
  // The other layout: a CTA per KV head, x written directly.
  CK(cudaMemset(dx, 0, q.size() * 4));
  report("head", time_us(Hkv, [&] { attn_head<D, G, D == 64 ? 4 : 2><<<Hkv, kWarps * 32>>>(a); }), true);
  // The same with K and V streamed by bulk copies through shared memory.
  const int bulk_bytes = mpk::ring_bars_bytes<head_stages<D>()>() + head_stages<D>() * 2 * kBlockRows * D * 2;
  CK(cudaFuncSetAttribute(attn_head_bulk<D, G>, cudaFuncAttributeMaxDynamicSharedMemorySize, bulk_bytes));
  CK(cudaMemset(dx, 0, q.size() * 4));
  report("bulk", time_us(Hkv, [&] { attn_head_bulk<D, G><<<Hkv, kWarps * 32, bulk_bytes>>>(a); }), true);
  CK(cudaFree(flush));
  CK(cudaFree(dq));
  CK(cudaFree(dk));
  CK(cudaFree(dv));
  CK(cudaFree(dpart));
  CK(cudaFree(dx));
  CK(cudaFree(a.count));
  CK(cudaFree(a.times));
}

int main() {
  printf("attn_units: batch-1 decode attention, a CTA a (KV head, %d positions), %d warps\n", kP, kWarps);
  run<64, 4>("llama-3.2-1b", 8);
  run<128, 4>("qwen3-8b", 8);
  run<128, 2>("qwen3-0.6b", 8);
  return 0;
}
