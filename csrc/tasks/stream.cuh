// The consumer side of a weight stream. A streamed task's weights are the
// rows [0, R) of a row-major [R, K] slice (contiguous in memory), arriving in
// the worker's ring (runtime/ring.cuh) as pages in order. The consumer warps
// multiply each page, as it lands, with the M rows of x, so every weight
// byte is read once per step whatever M is. A page holds whole rows (or an
// exact fraction of one), so each thread meets the same columns on every
// page and holds its share of x in registers for the whole task (staged once
// in shared memory as fp32 [M][K]).
//
// Each warp load covers CHUNK consecutive elements of one row (K is a
// multiple of CHUNK); a warp's loads of a page cover one span of
// stream_span elements of one row where they fit (else each load is its own
// span), and the span's dot with row m of x is a partial sum written to
// part[c * M + m] for span c of the task. Rows are summed from their spans
// in a fixed order afterwards (row_dot), so results do not depend on which
// warp finished first.
#pragma once
#include "runtime/abi_gen.cuh"
#include "runtime/ring.cuh"
#include "runtime/roles.cuh"
#include "tasks/dot.cuh"

namespace mpk {

template <typename T>
struct StreamOf {
  static constexpr int VEC = 16 / (int)sizeof(T);  // elements per 16-byte load
  static constexpr int CHUNK = 32 * VEC;           // elements per warp load: one partial sum
};

// dot_regs is 16 bytes of weights times the matching x, held in registers.
template <typename T>
__device__ __forceinline__ float dot_regs(const uint4& raw, const float* x);

template <>
__device__ __forceinline__ float dot_regs<__nv_bfloat16>(const uint4& raw, const float* x) {
  // A bf16 is the top half of an fp32: a pair's high element is a mask, its low one a shift.
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
  float acc = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    acc = fmaf(__uint_as_float(w[i] << 16), x[2 * i], acc);
    acc = fmaf(__uint_as_float(w[i] & 0xffff0000u), x[2 * i + 1], acc);
  }
  return acc;
}

template <>
__device__ __forceinline__ float dot_regs<__half>(const uint4& raw, const float* x) {
  const __half2* h = reinterpret_cast<const __half2*>(&raw);
  float acc = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __half22float2(h[i]);
    acc = fmaf(f.x, x[2 * i], fmaf(f.y, x[2 * i + 1], acc));
  }
  return acc;
}

template <>
__device__ __forceinline__ float dot_regs<float>(const uint4& raw, const float* x) {
  return __uint_as_float(raw.x) * x[0] + __uint_as_float(raw.y) * x[1] + __uint_as_float(raw.z) * x[2] +
         __uint_as_float(raw.w) * x[3];
}

// page_split is how many pages a row of K weights spans: 1 when a page
// holds whole rows, else the fewest S dividing K into whole warp chunks that
// fit a page. 0 when K is not a multiple of a warp chunk: such a Linear does
// not stream.
__host__ __device__ constexpr int page_split(int K, int slot_elems, int chunk) {
  if (K <= 0 || K % chunk != 0) return 0;
  for (int s = 1; s <= K / chunk; ++s)
    if (K % s == 0 && (K / s) % chunk == 0 && K / s <= slot_elems) return s;
  return 0;
}

// page_elems is how many weights a page of a [R, K] stream holds: whole rows
// (as many as fit), or 1/S of a row. Either way page p starts at column
// (p mod S)·E, so a consumer thread reads the same columns of every S-th
// page and keeps its x in registers for the whole task.
__host__ __device__ constexpr int page_elems(int K, int slot_elems, int chunk) {
  const int s = page_split(K, slot_elems, chunk);
  return s == 0 ? 0 : s == 1 ? slot_elems / K * K : K / s;
}

// stream_x_regs is how many x values a consumer thread holds for a stream
// of K-wide rows and M rows of x (stream_dots takes at most 32).
template <typename T>
__host__ __device__ constexpr int stream_x_regs(int K, int M, int slot_bytes) {
  const int vec = 16 / (int)sizeof(T), e = page_elems(K, slot_bytes / (int)sizeof(T), 32 * vec);
  return e == 0 ? 0 : M * page_split(K, slot_bytes / (int)sizeof(T), 32 * vec) * ((e + MPK_THREADS * vec - 1) / (MPK_THREADS * vec)) * vec;
}

// stream_span is how many consecutive elements of a page a warp takes (its
// Q loads one after another, so one warp sum covers all of them): Q warp
// chunks where they stay inside one row, else one chunk (each load its own
// partial). Halving the warp sums and partials of a page matters where
// pages have landed before the task starts (q/k/v, o): there the consumer's
// own pace is the task's time.
template <typename T, int K>
__host__ __device__ constexpr int stream_span(int slot_bytes) {
  constexpr int VEC = 16 / (int)sizeof(T), CHUNK = 32 * VEC, PASS = MPK_THREADS * VEC;
  const int e = page_elems(K, slot_bytes / (int)sizeof(T), CHUNK), split = page_split(K, slot_bytes / (int)sizeof(T), CHUNK);
  const int q = (e + PASS - 1) / PASS;
  const int span = q * CHUNK;
  const bool rows_align = split == 1 ? K % span == 0 : e % span == 0;
  return e > 0 && rows_align ? span : CHUNK;
}

// stream_dots consumes the pages of one task's stream of `elems` weights
// (page seq onwards; seq is advanced past them) and writes one partial per
// span (stream_span): a warp's Q loads of a page one after another in one
// row, or else (a span of one CHUNK) thread t's i-th load at elements
// i·PASS + VEC·t, each its own partial. xs is x staged as fp32 [M][K].
// wait(seq) returns once page seq has landed (or the kernel aborts). The loop
// has no data-dependent exit before a shuffle, so shuffles stay plain SHFL (a
// warp the compiler cannot prove converged gets a slow emulation).
template <typename T, int K, int M, class R, class Wait>
__device__ __forceinline__ void stream_dots(const R ring, uint32_t& seq, uint64_t elems, const float* xs, float* part,
                                            Wait wait) {
  constexpr int VEC = StreamOf<T>::VEC, CHUNK = StreamOf<T>::CHUNK;
  constexpr int SLOT = R::kBytes / (int)sizeof(T);
  constexpr int S = page_split(K, SLOT, CHUNK);     // pages per row (1: whole rows per page)
  constexpr int E = page_elems(K, SLOT, CHUNK);     // elements per page
  constexpr int PASS = MPK_THREADS * VEC;           // elements per load of every thread
  constexpr int Q = (E + PASS - 1) / PASS;          // loads per thread per page
  constexpr int SPAN = stream_span<T, K>(R::kBytes);  // a warp's elements of a page for one partial
  constexpr bool WARP_SPAN = SPAN != CHUNK;
  constexpr int G = SPAN / CHUNK;                     // loads a partial covers
  static_assert(S > 0, "K does not suit a weight stream");
  static_assert(M * S * Q * VEC <= 32, "x of this many rows does not fit in registers");
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // Where load i of this thread reads in a page: the warp's span (WARP_SPAN),
  // or the i-th pass of all threads.
  auto offset = [&](int i) { return WARP_SPAN ? warp * SPAN + i * CHUNK + lane * VEC : i * PASS + (int)threadIdx.x * VEC; };
  // This thread's x: the same columns on every S-th page.
  float x[M][S * Q * VEC];
#pragma unroll
  for (int ph = 0; ph < S; ++ph)
#pragma unroll
    for (int i = 0; i < Q; ++i) {
      const int off = offset(i);
      const int col = (ph * E + (off < E ? off : 0)) % K;
#pragma unroll
      for (int m = 0; m < M; ++m)
#pragma unroll
        for (int v = 0; v < VEC; v += 4) {
          const float4 f = *reinterpret_cast<const float4*>(xs + m * K + col + v);
          float* d = &x[m][(ph * Q + i) * VEC + v];
          d[0] = f.x, d[1] = f.y, d[2] = f.z, d[3] = f.w;
        }
    }
  const uint32_t pages = (uint32_t)((elems + E - 1) / E);  // a multiple of S
  for (uint32_t p0 = 0; p0 < pages; p0 += S) {
#pragma unroll
    for (int ph = 0; ph < S; ++ph, ++seq) {
      const uint32_t p = p0 + ph;
      wait(seq);
      const uint32_t pg = smem_u32(ring.page(seq));
      const int64_t left = (int64_t)elems - (int64_t)p * E;  // elements of this page in the task
      // A partial covers G loads of a warp: its span (WARP_SPAN), or one load.
#pragma unroll
      for (int g0 = 0; g0 < Q; g0 += G) {
        const int first = offset(g0) - lane * VEC;    // the warp's first element in the page
        const bool live = first < E && first < left;  // the same for the whole warp and span
        float acc[M];
#pragma unroll
        for (int i = g0; i < g0 + G; ++i) {
          const uint4 raw = live ? ld_shared_16(pg + offset(i) * (int)sizeof(T)) : make_uint4(0, 0, 0, 0);
#pragma unroll
          for (int m = 0; m < M; ++m) {
            const float dot = dot_regs<T>(raw, x[m] + (ph * Q + i) * VEC);
            acc[m] = i == g0 ? dot : acc[m] + dot;
          }
        }
        float d[M];
#pragma unroll
        for (int m = 0; m < M; ++m) d[m] = warp_sum(acc[m]);
        if (live && lane == 0) {
          const int64_t c = ((int64_t)p * E + first) / SPAN;
#pragma unroll
          for (int m = 0; m < M; ++m) part[c * M + m] = d[m];
        }
      }
      ring.release(seq);
    }
  }
}

// row_dot is row r's dot with row m of x: its partials summed in order.
template <typename T, int K, int M>
__device__ __forceinline__ float row_dot(const float* part, int r, int m) {
  constexpr int PPR = K / stream_span<T, K>(kPageBytes);  // partials per row
  float v = 0.f;
#pragma unroll 8
  for (int j = 0; j < PPR; ++j) v += part[(r * PPR + j) * M + m];
  return v;
}

// The partials a task of `elems` weights writes, in floats (at most).
template <typename T, int M>
__host__ __device__ constexpr int64_t partial_floats(int64_t elems) {
  return elems / StreamOf<T>::CHUNK * M;
}

}  // namespace mpk
