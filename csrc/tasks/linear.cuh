// Linear: out[m, n] = Σ_k x[m, k]·W[n, k] (+ residual[m, n], or an
// elementwise epilogue of it) for the rows
// [lo, hi) of W. Decode is bound by reading W, so two task bodies:
//  - linear_stream (the usual one): W's rows arrive through the worker's
//    weight ring, streamed ahead by the loader warp (tasks/stream.cuh);
//  - linear: each warp owns whole rows and reads them with 16-byte loads
//    (non-coherent unless the graph writes W), for what codegen does not
//    stream (odd K, W not contiguous rows or written, many rows of x).
// x is staged in shared memory as fp32, computed by the folded prologue.
#pragma once
#include <type_traits>

#include "runtime/runtime.cuh"
#include "tasks/dot.cuh"
#include "tasks/generic.cuh"
#include "tasks/stream.cuh"

namespace mpk {

// The end of a Linear prologue's inputs: the epilogue's, if any, follow them.
__device__ __forceinline__ int pro_end(const Op& op) { return op.epi_first > 0 ? op.epi_first : op.num_in; }

// How a Linear gets row m of x into shared memory (fp32): read it, or compute
// it with the op the compiler folded into the load (an RMSNorm, or an
// elementwise expression such as SiLU·mul), rounding as that op's output would.
struct NoPro {};
struct NormPro {};
template <typename E>
struct ExprPro {};

// Row m of x read as floats when it is a contiguous row of a float kind (the
// usual case): inline loads, all of a thread's issued before any is used, so
// staging costs one memory latency rather than one per element.
constexpr int per_thread(int k) { return (k + MPK_THREADS - 1) / MPK_THREADS; }

// HiLo is x staged for the tensor cores (tasks/tiles.cuh) as two arrays of
// the weights' 2-byte type, x = hi + lo, so it keeps ~16 significant bits
// (x's intermediates are fp32: lower/widen.go).
template <typename T>
struct HiLo {
  T* hi;
  T* lo;
  __device__ __forceinline__ HiLo operator+(int64_t d) const { return {hi + d, lo + d}; }
};

// put_x stores element k of a staged row: fp32 for the FMA streams; hi and
// lo, or (where x with its low part does not fit) x rounded, in the weights'
// 2-byte type for the tensor-core ones.
__device__ __forceinline__ void put_x(float* xs, int k, float v) { xs[k] = v; }
__device__ __forceinline__ void put_x(__nv_bfloat16* xs, int k, float v) { xs[k] = __float2bfloat16_rn(v); }
__device__ __forceinline__ void put_x(__half* xs, int k, float v) { xs[k] = __float2half_rn(v); }
__device__ __forceinline__ void put_x(HiLo<__nv_bfloat16> xs, int k, float v) {
  const __nv_bfloat16 h = __float2bfloat16_rn(v);
  xs.hi[k] = h, xs.lo[k] = __float2bfloat16_rn(v - __bfloat162float(h));
}
__device__ __forceinline__ void put_x(HiLo<__half> xs, int k, float v) {
  const __half h = __float2half_rn(v);
  xs.hi[k] = h, xs.lo[k] = __float2half_rn(v - __half2float(h));
}

// pack2 rounds two floats to T, a in the low half (the lower address).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float a, float b);
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float a, float b) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&h);
}
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float a, float b) {
  const __half2 h = __floats2half2_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&h);
}
template <typename T>
__device__ __forceinline__ float2 unpack2(uint32_t v);
template <>
__device__ __forceinline__ float2 unpack2<__nv_bfloat16>(uint32_t v) {
  return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
}
template <>
__device__ __forceinline__ float2 unpack2<__half>(uint32_t v) {
  return __half22float2(*reinterpret_cast<const __half2*>(&v));
}

// split_pair rounds two floats to T (hi, a in the low half) and rounds
// what is left of each (lo): hi + lo carries them to ~16 bits more, the
// split put_x(HiLo) makes one element at a time.
template <typename T>
__device__ __forceinline__ void split_pair(float a, float b, uint32_t& hi, uint32_t& lo) {
  hi = pack2<T>(a, b);
  const float2 h = unpack2<T>(hi);
  lo = pack2<T>(a - h.x, b - h.y);
}

// put_x4 stores elements k..k+3 (k a multiple of 4) as put_x does, with
// one store a part: the scalar 2-byte stores put_x makes, at an 8-byte lane
// stride, took two wavefronts each and were most of a batch's staging.
__device__ __forceinline__ void put_x4(float* xs, int k, float4 f) { *reinterpret_cast<float4*>(xs + k) = f; }
template <typename T>
__device__ __forceinline__ void put_x4(T* xs, int k, float4 f) {
  *reinterpret_cast<uint2*>(xs + k) = make_uint2(pack2<T>(f.x, f.y), pack2<T>(f.z, f.w));
}
template <typename T>
__device__ __forceinline__ void put_x4(HiLo<T> xs, int k, float4 f) {
  uint2 h, l;
  split_pair<T>(f.x, f.y, h.x, l.x);
  split_pair<T>(f.z, f.w, h.y, l.y);
  *reinterpret_cast<uint2*>(xs.hi + k) = h;
  *reinterpret_cast<uint2*>(xs.lo + k) = l;
}

__device__ __forceinline__ bool float_row2(const View& v) { return v.rank == 2 && float_row(v); }

// Threads past K load element K-1 and drop it: a load under a condition
// becomes a branch whose block also converts the value, and so waits for it,
// which sent the row's loads out one round trip at a time (11 us for the
// down projection's 8,192 elements).
template <int K>
__device__ __forceinline__ void load_x_row(const char* p, const View& x, int64_t m, float (&v)[per_thread(K)]) {
  const int64_t o = x.offset + m * x.stride[0];
#pragma unroll
  for (int i = 0; i < per_thread(K); ++i) v[i] = ld_float(p, x.dtype, o + min((int)threadIdx.x + i * MPK_THREADS, K - 1));
#pragma unroll
  for (int i = 0; i < per_thread(K); ++i)
    if (threadIdx.x + i * MPK_THREADS >= K) v[i] = 0.f;
}

// The staging of any layout, element by element (row m's K columns from
// column k0): out of line, so a Linear's task body holds its fast paths
// alone (10-25% less code a variant; the same speed: bench/NOTES.md,
// eighteenth session).
template <int N, typename X>
__device__ __noinline__ void stage_plain_any(const Op& op, int64_t m, X xs, int K, const Slots<N>& s, int64_t k0 = 0) {
  const View& x = op.in[0];
  for (int k = threadIdx.x; k < K; k += MPK_THREADS) {
    int64_t i[2] = {m, k0 + k};
    put_x(xs, k, (float)load_elem(base(s, x), x.dtype, offset_of(x, i)));
  }
}

template <int N, typename X>
__device__ __noinline__ void stage_norm_any(const Op& op, int64_t m, X xs, int K, float* scratch, const Slots<N>& s) {
  const View& x = op.in[0];
  const bool has_w = op.flags & FLAG_WEIGHT;
  const View& w = op.in[op.pro_first];
  float ss = 0.f;
  for (int k = threadIdx.x; k < K; k += MPK_THREADS) {
    int64_t i[2] = {m, k};
    const float v = (float)load_elem(base(s, x), x.dtype, offset_of(x, i));
    ss += v * v;
  }
  const float inv = rsqrtf(block_sum(ss, scratch) / (float)K + op.eps);
  for (int k = threadIdx.x; k < K; k += MPK_THREADS) {
    int64_t i[2] = {m, k};
    const float v = (float)load_elem(base(s, x), x.dtype, offset_of(x, i));  // x read again: xs may be narrower than x
    double y = round_to(x.dtype, (double)(v * inv));
    if (has_w) y *= load_elem(base(s, w), w.dtype, offset_of(w, i));
    put_x(xs, k, (float)round_to(op.pro_dtype, y));
  }
}

template <typename E, int N, typename X>
__device__ __noinline__ void stage_expr_any(const Op& op, int64_t m, X xs, int K, const Slots<N>& s) {
  for (int k = threadIdx.x; k < K; k += MPK_THREADS) {
    int64_t idx[2] = {m, k};
    double in[MPK_MAX_INPUTS];
    in[0] = load_elem(base(s, op.in[0]), op.in[0].dtype, offset_of(op.in[0], idx));
#pragma unroll 1
    for (int j = op.pro_first; j < pro_end(op); ++j)
      in[1 + j - op.pro_first] = load_elem(base(s, op.in[j]), op.in[j].dtype, offset_of(op.in[j], idx));
    put_x(xs, k, (float)round_to(op.pro_dtype, E::eval(in, idx)));
  }
}

template <int K, int N, typename X>
__device__ __forceinline__ void stage_x(NoPro, const Op& op, int64_t m, X xs, const Slots<N>& s) {
  const View& x = op.in[0];
  if (float_row2(x)) {
    float v[per_thread(K)];
    load_x_row<K>(base(s, x), x, m, v);
#pragma unroll
    for (int i = 0; i < per_thread(K); ++i)
      if (threadIdx.x + i * MPK_THREADS < K) put_x(xs, threadIdx.x + i * MPK_THREADS, v[i]);
    return;
  }
  stage_plain_any(op, m, xs, K, s);
}

// load_norm_rows reads row m of an RMSNorm's x and of its weight (fast
// layouts), the weight 1 where there is none (y·1 is y): g is defined on
// both paths, or ptxas keeps it in local memory across the branch.
template <int K, int N>
__device__ __forceinline__ void load_norm_rows(int64_t m, const View& x, const View& w, bool has_w,
                                               float (&v)[per_thread(K)], float (&g)[per_thread(K)], const Slots<N>& s) {
  load_x_row<K>(base(s, x), x, m, v);
#pragma unroll
  for (int i = 0; i < per_thread(K); ++i) g[i] = 1.f;
  if (has_w) load_x_row<K>(base(s, w), w, m, g);
}

// y = x·rsqrt(mean(x²)+eps) in fp32, rounded to x's dtype, times the weight.
template <int K, int N, typename X>
__device__ __forceinline__ void stage_x(NormPro, const Op& op, int64_t m, X xs, const Slots<N>& s) {
  const View& x = op.in[0];
  __shared__ float scratch[32];
  const bool has_w = op.flags & FLAG_WEIGHT;
  const View& w = op.in[op.pro_first];
  if (float_row2(x) && (!has_w || float_row2(w))) {
    float v[per_thread(K)], g[per_thread(K)];
    load_norm_rows<K>(m, x, w, has_w, v, g, s);
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < per_thread(K); ++i) ss += v[i] * v[i];  // zero past K
    const float inv = rsqrtf(block_sum(ss, scratch) / (float)K + op.eps);
#pragma unroll
    for (int i = 0; i < per_thread(K); ++i) {
      const int k = threadIdx.x + i * MPK_THREADS;
      if (k >= K) continue;
      const float y = round_float(x.dtype, v[i] * inv);
      put_x(xs, k, round_float(op.pro_dtype, y * g[i]));
    }
    return;
  }
  stage_norm_any(op, m, xs, K, scratch, s);
}

// The deferred RMSNorm of a streamed Linear: x·w is staged without waiting
// for the row's sum of squares, whose warp partials land in s_norm_part; the
// store scales each product by the row's rsqrt (norm_inv). One block-wide
// reduction and barrier fewer before the dots (q/k/v staged 0.3 us sooner,
// qwen3-0.6b 1.394 -> 1.372 ms: bench/NOTES.md, nineteenth session). Exact
// up to fp32 reassociation, so only where x and the prologue's result are
// fp32 (no rounding in between: lower/widen.go). Namespace-scope shared
// memory: a task that reuses the staged x (q, k, v) reuses the partials too.
constexpr int kMaxDeferRows = 2;  // x in registers: one or two rows (stream.regPlan)
__shared__ float s_norm_part[kMaxDeferRows][kConsumerWarps];

template <int K, int M, int N>
__device__ __forceinline__ bool norm_deferred(const Op& op, const Slots<N>& s) {
  if constexpr (M > kMaxDeferRows) return false;
  const View &x = op.in[0], &w = op.in[op.pro_first];
  return x.dtype == DT_FLOAT32 && op.pro_dtype == DT_FLOAT32 && float_row2(x) &&
         (!(op.flags & FLAG_WEIGHT) || float_row2(w));
}

template <int K, int N>
__device__ __forceinline__ void stage_norm_deferred(const Op& op, int m, float* xs, const Slots<N>& s) {
  const View &x = op.in[0], &w = op.in[op.pro_first];
  const bool has_w = op.flags & FLAG_WEIGHT;
  float v[per_thread(K)], g[per_thread(K)];
  load_norm_rows<K>(m, x, w, has_w, v, g, s);
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < per_thread(K); ++i) {
    const int k = threadIdx.x + i * MPK_THREADS;
    ss += v[i] * v[i];  // zero past K
    if (k < K) xs[k] = v[i] * g[i];
  }
  ss = warp_sum(ss);
  if (threadIdx.x % 32 == 0) s_norm_part[m][threadIdx.x / 32] = ss;
}

// norm_inv is row m's rsqrt(mean(x²) + eps) from the staged partials.
template <int K>
__device__ __forceinline__ float norm_inv(const Op& op, int m) {
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < kConsumerWarps; ++i) ss += s_norm_part[m][i];
  return rsqrtf(ss / (float)K + op.eps);
}

template <int K, typename E, int N, typename X>
__device__ __forceinline__ void stage_x(ExprPro<E>, const Op& op, int64_t m, X xs, const Slots<N>& s) {
  if (pro_end(op) - op.pro_first == 1 && float_row2(op.in[0]) && float_row2(op.in[op.pro_first]) &&
      float_kind(op.pro_dtype)) {
    // Two operands (SiLU·mul): both rows loaded up front.
    const View &a = op.in[0], &b = op.in[op.pro_first];
    float va[per_thread(K)], vb[per_thread(K)];
    load_x_row<K>(base(s, a), a, m, va);
    load_x_row<K>(base(s, b), b, m, vb);
#pragma unroll
    for (int i = 0; i < per_thread(K); ++i) {
      int64_t idx[2] = {m, threadIdx.x + i * MPK_THREADS};
      if (idx[1] >= K) continue;
      double in[MPK_MAX_INPUTS];
      in[0] = va[i];
      in[1] = vb[i];
      // round_float is round_to for a float kind, inline (round_to is a call per element).
      put_x(xs, (int)idx[1], round_float(op.pro_dtype, (float)E::eval(in, idx)));
    }
    return;
  }
  stage_expr_any<E>(op, m, xs, K, s);
}

// The attention merge folded into x (the o projection reads it): x[m, h·D+d]
// = Σ_s acc_s·e^(m_s−M) / Σ_s l_s·e^(m_s−M) over the split-KV partials
// in[0], contiguous [M, Splits, H, 1, D+2], M the max over splits with
// weight, as attn_merge computes it. A warp merges HP heads at once: lane t
// holds split t's max and sum, the lanes own the heads' columns, and a batch
// of splits' outputs is loaded with the maxima (H and D as constants: one
// base register and immediate offsets), so a batch costs one round trip.
// CHUNK > 0: in[pro_first] is the mask's extent per row, and the splits
// from ⌈extent / CHUNK⌉ on (no live position) are not read; the extent is
// loaded with the first batch, so the bound costs no round trip.
template <int D, int H, int CHUNK, int R, int SPLITS>
struct MergePro {};

// SplitGroups (ir.SplitGroups) maps a split-KV attention's splits to the KV
// chunks they cover: with RG > 1 groups, the splits form contiguous groups
// (sizes differing by at most one) and group r covers the chunks r, r+RG,
// r+2·RG, …, so a task of one group of a head gets an even share of a short
// live length's chunks; RG = 1: split s covers chunk s.
template <int RG>
struct SplitGroups {
  int r_, q, rem;  // groups (at most the splits), splits a group, groups with one more
  __device__ __forceinline__ explicit SplitGroups(int splits)
      : r_(max(1, min(RG, splits))), q(splits / r_), rem(splits % r_) {}
  __device__ __forceinline__ int start(int r) const { return RG == 1 ? 0 : r * q + min(r, rem); }
  __device__ __forceinline__ int group(int s) const {
    if constexpr (RG == 1) return 0;
    return s < rem * (q + 1) ? s / (q + 1) : rem + (s - rem * (q + 1)) / q;
  }
  __device__ __forceinline__ int chunk(int s) const {
    if constexpr (RG == 1) return s;
    const int r = group(s);
    return (s - start(r)) * r_ + r;
  }
  __device__ __forceinline__ int split(int c) const {
    if constexpr (RG == 1) return c;
    return start(c % r_) + c / r_;
  }
  // How many of group r's splits cover the live chunks [0, nlive): its first ones.
  __device__ __forceinline__ int live_in(int r, int nlive) const {
    if constexpr (RG == 1) return nlive;
    return nlive > r ? (nlive - r + r_ - 1) / r_ : 0;
  }
};

// splits_below_extent: how many of a split-KV attention's splits (chunks of
// `chunk` positions) start below row `row`'s mask extent (the int32 view e,
// from mask_extent); the splits from there on hold no visible position. The
// attention computes and the merge reads only these.
template <int N>
__device__ __forceinline__ int splits_below_extent(const View& e, int64_t row, int chunk, int splits, const Slots<N>& s) {
  const int extent = __ldcg(reinterpret_cast<const int32_t*>(base(s, e)) + e.offset + row * e.stride[0]);
  return min(splits, (extent + chunk - 1) / chunk);
}

// merge_pairs merges the split-KV partials p (contiguous [B, Splits, H, 1,
// D+2]) of (batch row, head) pairs: the warps take pairs warp, warp + W, ...,
// HP a warp, pair i being at(i) (an int2: row, head) for i < npairs. ext,
// with CHUNK > 0, is the mask's extent per row: the splits from
// ⌈extent / CHUNK⌉ on hold nothing and are not read. store(i, d, v) gets
// element d of pair i's merged row.
template <int D, int H, int CHUNK, int R, int HP, int SPLITS, int N, typename At, typename Store>
__device__ __forceinline__ void merge_pairs(const View& p, const View& ext, int npairs, At at, Store store,
                                            const Slots<N>& s) {
  constexpr int PER = (D + 31) / 32;
  // Splits a batch: 32 registers of outputs, and no more than there are (at
  // batch 1 a head has 2 splits; a batch of 8 issued 4x the loads and math).
  constexpr int SB_REGS = 32 / (PER * HP) > 0 ? 32 / (PER * HP) : 1;
  constexpr int SB = SPLITS < SB_REGS ? SPLITS : SB_REGS;
  constexpr int SS = H * (D + 2);                                // floats from one split's partials to the next
  const float* pb = reinterpret_cast<const float*>(base(s, p)) + p.offset;
  constexpr int splits = SPLITS;  // a constant: the split arithmetic of every load's address folds
  const SplitGroups<R> g(splits);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float M[HP], L[HP], o[HP][PER];
  int live[HP];
#pragma unroll
  for (int i = 0; i < HP; ++i) {
    M[i] = -INFINITY, L[i] = 0.f, live[i] = splits;
#pragma unroll
    for (int e = 0; e < PER; ++e) o[i][e] = 0.f;
  }
  // Pair i of this warp (past the last pair: the last, not stored).
  auto pair = [&](int i) { return at(min(warp + i * kConsumerWarps, npairs - 1)); };
  // KV chunks in order, from the split covering each (g); bound: the chunks
  // that may hold positions in any of the warp's rows (known once the first
  // batch's loads are out).
  for (int s0 = 0, bound = splits; s0 < bound; s0 += SB) {
    const int n = min(SB, splits - s0);
    // The batch's maxima, sums and outputs of the warp's pairs, in flight together.
    float ml[HP], ll[HP], a[HP][SB][PER];
#pragma unroll
    for (int i = 0; i < HP; ++i) {
      const int2 rh = pair(i);
      const float* ph = pb + rh.x * p.stride[0] + rh.y * (D + 2);  // the pair's head of split 0
      const float* pl = ph + g.split(s0 + min(lane, n - 1)) * SS;
      ml[i] = __ldcg(pl), ll[i] = __ldcg(pl + 1);
#pragma unroll
      for (int t = 0; t < SB; ++t) {
        const float* pt = ph + g.split(min(s0 + t, splits - 1)) * SS + 2;
#pragma unroll
        for (int e = 0; e < PER; ++e) a[i][t][e] = t < n && lane + 32 * e < D ? __ldcg(pt + lane + 32 * e) : 0.f;
      }
    }
    if constexpr (CHUNK > 0) {
      if (s0 == 0) {  // after the first batch's loads are out
        bound = 0;
#pragma unroll
        for (int i = 0; i < HP; ++i) {
          live[i] = splits_below_extent(ext, pair(i).x, CHUNK, splits, s);
          bound = max(bound, live[i]);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < HP; ++i) {
      // A split with no weight (no positions, or all masked) adds nothing, whatever its row holds.
      const bool has = lane < n && s0 + lane < live[i] && ll[i] > 0.f;
      const float Mn = fmaxf(M[i], warp_max(has ? ml[i] : -INFINITY));
      const float corr = Mn == -INFINITY ? 1.f : __expf(M[i] - Mn), f = has ? __expf(ml[i] - Mn) : 0.f;
      L[i] = L[i] * corr + warp_sum(has ? ll[i] * f : 0.f);
#pragma unroll
      for (int e = 0; e < PER; ++e) o[i][e] *= corr;
#pragma unroll
      for (int t = 0; t < SB; ++t) {
        const float ft = __shfl_sync(0xffffffffu, f, t);
#pragma unroll
        for (int e = 0; e < PER; ++e) o[i][e] += ft == 0.f ? 0.f : a[i][t][e] * ft;
      }
      M[i] = Mn;
    }
  }
#pragma unroll
  for (int i = 0; i < HP; ++i) {
    const int pi = warp + i * kConsumerWarps;
#pragma unroll
    for (int e = 0; e < PER; ++e)
      if (pi < npairs && lane + 32 * e < D) store(pi, lane + 32 * e, L[i] > 0.f ? o[i][e] / L[i] : 0.f);
  }
}

// stage_merge merges rows [m0, m0 + rows) of x (rows <= MR), row m0 + r at
// xs + r·PITCH: its (row, head) pairs spread over the warps.
template <int K, int D, int H, int CHUNK, int R, int SPLITS, int MR, int PITCH, int N, typename X>
__device__ __noinline__ void stage_merge(const Op& op, int64_t m0, int rows, X xs, const Slots<N>& s) {
  static_assert(K == H * D, "x is the heads' merged outputs");
  constexpr int HP = (MR * H + kConsumerWarps - 1) / kConsumerWarps;  // (row, head) pairs a warp
  merge_pairs<D, H, CHUNK, R, HP, SPLITS>(
      op.in[0], op.in[op.pro_first], rows * H, [&](int i) { return make_int2((int)m0 + i / H, i % H); },
      [&](int i, int d, float v) { put_x(xs + i / H * PITCH, i % H * D + d, round_float(op.pro_dtype, v)); }, s);
}

template <int K, int D, int H, int CHUNK, int R, int SPLITS, int N, typename X>
__device__ __forceinline__ void stage_x(MergePro<D, H, CHUNK, R, SPLITS>, const Op& op, int64_t m, X xs,
                                        const Slots<N>& s) {
  stage_merge<K, D, H, CHUNK, R, SPLITS, 1, 0>(op, m, 1, xs, s);
}

// What a Linear stores: the product (NoEpi), or an elementwise expression of
// it and other inputs at the same index (ExprEpi, e.g. SiLU(gate)·up in the
// up projection), which the compiler folded into the store.
struct NoEpi {};
template <typename E>
struct ExprEpi {};
// PairEpi is ExprEpi whose input J (Load(J), 1-based) is not read from
// memory: it is the product of x with the op's second weight (a gate
// projection paired with the up projection, ir.Epilogue.Pair), rounded to
// dtype DT as that Linear's store rounded it.
template <typename E, int J, int DT>
struct PairEpi {};
constexpr int kMaxEpiInputs = MPK_MAX_EPI_INPUTS;  // inputs besides the product (ir.MaxEpilogueInputs)

// pair_input is the epilogue input (1-based) a pair's second product takes; 0 for others.
template <typename EPI>
struct PairOf {
  static constexpr int J = 0;
  static constexpr int DT = 0;
};
template <typename E, int J_, int DT_>
struct PairOf<PairEpi<E, J_, DT_>> {
  static constexpr int J = J_;
  static constexpr int DT = DT_;
};
template <typename EPI>
constexpr bool kIsPair = PairOf<EPI>::J > 0;

// EpiIn holds an epilogue's inputs at one output index, loaded before the
// task streams its weights so the store does not wait for them.
struct EpiIn {
  float v[kMaxEpiInputs];
};

__device__ __forceinline__ bool epi_fast(const Op& op) {
  bool ok = op.out.rank == 2 && out_row(op.out);  // stored with st_float at its element's index
  for (int j = op.epi_first; j < op.num_in; ++j) ok = ok && float_row2(op.in[j]);
  return ok;
}

// load_epi reads the epilogue inputs at (m, n) (fast layouts only): those
// the op has (an epilogue reads no input past them; a load of one would be
// a dependent round trip a stored element, for nothing).
template <typename EPI, int N>
__device__ __forceinline__ EpiIn load_epi(const Op& op, int64_t m, int64_t n, const Slots<N>& s) {
  EpiIn e{};
  if constexpr (!std::is_same<EPI, NoEpi>::value) {
#pragma unroll
    for (int j = 0; j < kMaxEpiInputs; ++j) {
      if (j + 1 == PairOf<EPI>::J) continue;  // a weight: its product comes from the task's dots
      if (op.epi_first + j >= op.num_in) break;
      const View& v = op.in[op.epi_first + j];
      e.v[j] = ld_float(base(s, v), v.dtype, v.offset + m * v.stride[0] + n);
    }
  }
  return e;
}

template <typename E>
__device__ __forceinline__ double eval_epi(ExprEpi<E>, double product, const double* extra, const int64_t* idx) {
  double in[1 + kMaxEpiInputs];
  in[0] = product;
#pragma unroll
  for (int j = 0; j < kMaxEpiInputs; ++j) in[1 + j] = extra[j];
  return E::eval(in, idx);
}

template <typename E, int J, int DT>
__device__ __forceinline__ double eval_epi(PairEpi<E, J, DT>, double product, const double* extra, const int64_t* idx) {
  return eval_epi(ExprEpi<E>{}, product, extra, idx);
}

// set_pair puts a pair's second product, rounded as its own store rounded
// it, in the epilogue's input PairOf<EPI>::J.
template <typename EPI>
__device__ __forceinline__ void set_pair(double* extra, float pair) {
  if constexpr (kIsPair<EPI>) extra[PairOf<EPI>::J - 1] = round_float(PairOf<EPI>::DT, pair);
}

// store_out_any is store_out for any layout, element by element (out of
// line, as the staging's: stage_plain_any).
template <bool RESID, typename EPI, int N>
__device__ __noinline__ void store_out_any(const Op& op, int64_t m, int64_t n, float acc, const Slots<N>& s,
                                           float pair) {
  int64_t oi[2] = {m, n};
  if constexpr (!std::is_same<EPI, NoEpi>::value) {
    double extra[kMaxEpiInputs];
    for (int j = 0; j < kMaxEpiInputs; ++j) {
      const View& v = op.in[min(op.epi_first + j, op.num_in - 1)];
      extra[j] = j + 1 == PairOf<EPI>::J || op.epi_first + j >= op.num_in
                     ? 0.0
                     : load_elem(base(s, v), v.dtype, offset_of(v, oi));
    }
    set_pair<EPI>(extra, pair);
    store_elem(base(s, op.out), op.out.dtype, offset_of(op.out, oi),
               eval_epi(EPI{}, round_to(op.epi_dtype, (double)acc), extra, oi));
  } else {
    const View& r = op.in[2];
    double v = acc;
    if (RESID) v = round_to(op.out.dtype, v) + load_elem(base(s, r), r.dtype, offset_of(r, oi));
    store_elem(base(s, op.out), op.out.dtype, offset_of(op.out, oi), v);
  }
}

// store_out writes out[m, n] = acc (+ residual[m, n]), or the epilogue of
// acc, rounding as eager does: the product to its dtype, then the result.
// pre holds the epilogue inputs at (m, n) when the caller loaded them; pair
// is a paired Linear's second product at (m, n).
template <bool RESID, typename EPI, int N>
__device__ __forceinline__ void store_out(const Op& op, int64_t m, int64_t n, float acc, const Slots<N>& s,
                                          const EpiIn* pre = nullptr, float pair = 0.f) {
  const View& r = op.in[2];
  if constexpr (!std::is_same<EPI, NoEpi>::value) {
    if (epi_fast(op)) {
      int64_t oi[2] = {m, n};
      double extra[kMaxEpiInputs];
      const EpiIn e = pre ? *pre : load_epi<EPI>(op, m, n, s);
#pragma unroll
      for (int j = 0; j < kMaxEpiInputs; ++j) extra[j] = e.v[j];
      set_pair<EPI>(extra, pair);
      const float v = (float)eval_epi(EPI{}, round_float(op.epi_dtype, acc), extra, oi);
      st_float(base(s, op.out), op.out.dtype, op.out.offset + m * op.out.stride[0] + n, v);
      return;
    }
  } else if (op.out.rank == 2 && out_row(op.out) && (!RESID || float_row2(r))) {
    float v = acc;
    if (RESID) v = round_float(op.out.dtype, acc) + ld_float(base(s, r), r.dtype, r.offset + m * r.stride[0] + n);
    st_float(base(s, op.out), op.out.dtype, op.out.offset + m * op.out.stride[0] + n, v);
    return;
  }
  store_out_any<RESID, EPI>(op, m, n, acc, s, pair);
}

// mark_staged_trace records, in a trace build, when a task had x staged;
// mark_dots_trace when its products were done. A streamed task calls
// mark_staged and mark_dots, which also tell the loader when the consumers
// multiply pages (set_dots_phase).
__device__ __forceinline__ void mark_staged_trace() {
#ifdef MPK_TRACE
  if (threadIdx.x == 0) s_trace_staged = (uint32_t)(globaltimer() - s_trace_start);
#endif
}
__device__ __forceinline__ void mark_dots_trace() {
#ifdef MPK_TRACE
  if (threadIdx.x == 0) s_trace_dots = (uint32_t)(globaltimer() - s_trace_start);
#endif
}
__device__ __forceinline__ void mark_staged() {
  set_dots_phase(1);
  mark_staged_trace();
}
__device__ __forceinline__ void mark_dots() {
  set_dots_phase(0);
  mark_dots_trace();
}

// wait_page returns once page q of a weight ring has landed: lane 0 polls,
// then every lane takes the barrier's acquire (no per-thread spin loop or
// early exit before the warp's shuffles). Pages always land once issued;
// when the kernel aborts the loader stops issuing, and the consumers run
// through the rest of the task on stale pages (its results are discarded
// with the launch).
template <class R>
__device__ __forceinline__ void wait_page(const R& ring, uint32_t q, const int32_t* abort) {
#ifdef MPK_TRACE
  const uint64_t t0 = threadIdx.x == 0 ? globaltimer() : 0;
#endif
  if (threadIdx.x % 32 == 0)
    for (uint32_t polls = 0; !ring.ready(q); ++polls)
      if ((polls & 1023) == 1023 && aborting(abort)) break;
#ifdef MPK_TRACE
  if (threadIdx.x == 0) s_trace_stall += (uint32_t)(globaltimer() - t0);
#endif
  __syncwarp();
  ring.ready(q);
}

// PageWait is wait_page as a type, so that every variant's stream_dots of
// one (T, K, M) is the same function (a lambda is a type per call site).
template <int P>
struct PageWait {
  Ring<P> ring;
  const int32_t* abort;
  __device__ __forceinline__ void operator()(uint32_t q) const { wait_page(ring, q, abort); }
};

// stream_pages is stream_dots out of line, one copy for every Linear variant
// of its (T, K, M): a layer's q/k/v, o and gate/up tasks (and a pair's two
// weights) run the same page loop, so less distinct code runs a layer (the
// streamed stages' staging is 0.4-0.9 us faster with warm code,
// MPK_PROBE_WARM; out of line vs inline, H100: the same to 1.9% faster).
// Returns the consumers' new place in the ring.
template <typename T, int K, int M, int P>
__device__ __noinline__ uint32_t stream_pages(const Ring<P> ring, uint32_t seq, uint64_t elems, const float* xs,
                                              float* part, const int32_t* abort) {
  stream_dots<T, K, M>(ring, seq, elems, xs, part, PageWait<P>{ring, abort});
  return seq;
}

// first_epi loads the epilogue's inputs of this thread's first output (r =
// threadIdx.x of the task's outs, output row r % M, column lo + r / M), in
// flight while the weights stream.
template <typename EPI, int N>
__device__ __forceinline__ EpiIn first_epi(const Op& op, int lo, int outs, int M, bool fast_epi, const Slots<N>& s) {
  if (!fast_epi) return EpiIn{};
  const int r = min((int)threadIdx.x, outs - 1);
  return load_epi<EPI>(op, r % M, lo + r / M, s);
}

// CONST: nothing in the graph writes W, so it may be read non-coherently
// (through the read-only path, evict-first); else every load goes through L2.
template <typename T, int K, bool RESID, typename PRO, typename EPI, bool CONST, int N>
__device__ void linear(const Op& op, int lo, int hi, const Slots<N>& s, char* smem) {
  static_assert(K * 4 <= MPK_MAX_SHARED_BYTES, "x does not fit in shared memory");
  constexpr int VEC = 16 / sizeof(T);
  const View& x = op.in[0];
  const View& w = op.in[1];
  float* xs = reinterpret_cast<float*>(smem);
  const T* W = reinterpret_cast<const T*>(base(s, w)) + w.offset;
  const int64_t row_stride = w.stride[0];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = MPK_THREADS / 32;
  const bool vec = (reinterpret_cast<uintptr_t>(W) % 16 == 0) && (row_stride % VEC == 0) && (K % VEC == 0);
  const uint64_t policy = weight_policy();
  // A pair's second weight (PairEpi), read the same way.
  const View& w2 = op.in[kIsPair<EPI> ? op.epi_first + PairOf<EPI>::J - 1 : 1];
  const T* W2 = reinterpret_cast<const T*>(base(s, w2)) + w2.offset;
  const bool vec2 = (reinterpret_cast<uintptr_t>(W2) % 16 == 0) && (w2.stride[0] % VEC == 0) && (K % VEC == 0);
  auto dot = [&](const T* row, bool v) {
    float acc = 0.f;
    if (v) {
#pragma unroll 4
      for (int k = lane * VEC; k < K; k += 32 * VEC) {
        const uint4 raw = CONST ? ld_weight(row + k, policy) : __ldcg(reinterpret_cast<const uint4*>(row + k));
        acc += dot16(raw, xs + k, static_cast<T*>(nullptr));
      }
    } else {
      for (int k = lane; k < K; k += 32) acc += to_float(CONST ? row[k] : __ldcg(row + k)) * xs[k];
    }
    return warp_sum(acc);
  };
  for (int64_t m = 0; m < x.shape[0]; ++m) {
    consumer_sync();
    stage_x<K>(PRO{}, op, m, xs, s);
    consumer_sync();
    for (int n = lo + warp; n < hi; n += warps) {
      const float acc = dot(W + (int64_t)n * row_stride, vec);
      const float pair = kIsPair<EPI> ? dot(W2 + (int64_t)n * w2.stride[0], vec2) : 0.f;
      if (lane == 0) store_out<RESID, EPI>(op, m, n, acc, s, nullptr, pair);
    }
  }
}

// stage_stream_x stages a streamed Linear's M rows of x as fp32 [M][K] in
// xs (the norm's scale deferred to the store where defer says: norm_deferred).
// Out of line, as stream_pages: the q/k/v and gate/up variants (an RMSNorm
// of the same K) share one copy.
template <int K, int M, typename PRO, int N>
__device__ __noinline__ void stage_stream_x(const Op& op, float* xs, bool defer, const Slots<N>& s) {
#pragma unroll 1
  for (int m = 0; m < M; ++m) {
    if (defer) stage_norm_deferred<K>(op, m, xs + m * K, s);
    else stage_x<K>(PRO{}, op, m, xs + m * K, s);
  }
  consumer_sync();
}

// linear_stream: the rows [lo, hi) of W (contiguous, hi - lo rows of K)
// arrive as pages of PAGE bytes in the worker's ring of P slots, in the order
// the loader (runtime/module.cuh) issued them; x's M rows are staged once
// unless the previous task staged the same x (c.x_ready). Returns the
// consumers' new place in the ring.
template <typename T, int K, int M, int PAGE, int P, bool RESID, typename PRO, typename EPI, int N>
__device__ uint32_t linear_stream(const Op& op, int lo, int hi, const Slots<N>& s, const Ctx c) {
  static_assert(page_elems(K, kPageBytes / (int)sizeof(T), StreamOf<T>::CHUNK) * (int)sizeof(T) == PAGE,
                "codegen and the task library disagree on this stream's page size");
  float* xs = reinterpret_cast<float*>(c.smem);  // [M][K]
  float* part = xs + M * K;                      // the chunk partials
  // Same for every op of one xkey, so a reused x was staged the same way.
  const bool defer = std::is_same<PRO, NormPro>::value && norm_deferred<K, M>(op, s);
#if defined(MPK_TRACE) && defined(MPK_PROBE_WARM)
  // Probe (not for use): x is staged once untimed, so the staging the trace
  // times (from here to mark_staged) runs warm code; x comes from L2 both
  // times (__ldcg), so the difference from a plain trace is the cold code's.
  if (!c.x_ready) {
    stage_stream_x<K, M, PRO>(op, xs, defer, s);
    if (threadIdx.x == 0) s_trace_start = globaltimer();
  }
#endif
  if (!c.x_ready) stage_stream_x<K, M, PRO>(op, xs, defer, s);
  mark_staged();
  const Ring<P> ring = ring_at<P>(c.ring);
  uint32_t seq = c.seq;
  const int outs = (hi - lo) * M;
  const bool fast_epi = !std::is_same<EPI, NoEpi>::value && epi_fast(op);
  const EpiIn pre = first_epi<EPI>(op, lo, outs, M, fast_epi, s);
  seq = stream_pages<T, K, M>(ring, seq, (uint64_t)(hi - lo) * K, xs, part, c.abort);
  // A pair's second weight: its rows follow in the ring (the loader's
  // pair_offset), their partials after the first's.
  float* part2 = part + (int64_t)(hi - lo) * (K / stream_span<T, K>(kPageBytes)) * M;
  if constexpr (kIsPair<EPI>) seq = stream_pages<T, K, M>(ring, seq, (uint64_t)(hi - lo) * K, xs, part2, c.abort);
  consumer_sync();
  mark_dots();
  for (int r = threadIdx.x; r < outs; r += MPK_THREADS) {
    const float inv = defer ? norm_inv<K>(op, r % M) : 1.f;
    store_out<RESID, EPI>(op, r % M, lo + r / M, row_dot<T, K, M>(part, r / M, r % M) * inv, s,
                          fast_epi && r < MPK_THREADS ? &pre : nullptr,
                          kIsPair<EPI> ? row_dot<T, K, M>(part2, r / M, r % M) * inv : 0.f);
  }
  return seq;
}

}  // namespace mpk
