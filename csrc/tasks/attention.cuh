// Attention: softmax(q·kᵀ·scale + mask)·v with grouped-query heads (head h
// reads KV head h / G); the G query heads of a KV head share every K and V
// row load. Two task ops:
//  - attention: the heads [lo, hi) of a task over all positions; warps split
//    the positions and warp g merges head g.
//  - attention_partial (split-KV, flash-decoding): the KV chunks [lo, hi) of
//    a task for every head, a warp per KV head, writing partial softmaxes
//    [B, Splits, H, Sq, Dv+2] that attn_merge combines.
// Positions the mask excludes (false, or -inf) skip the K/V math; a query
// row the mask hides entirely (a left-padded prefill) is 0, as torch's SDPA
// and the reference give.
#pragma once
#include <type_traits>

#include "runtime/runtime.cuh"
#include "tasks/decode_mma.cuh"
#include "tasks/gemm.cuh"  // pack2, and mma_16816 (tiles.cuh)
#include "tasks/linear.cuh"

namespace mpk {

// One warp's online softmax over G query heads: running max, sum and output
// (PER head elements per lane).
template <int D, int G>
struct SoftmaxState {
  static constexpr int PER = (D + 31) / 32;  // lanes past D idle
  float qv[G][PER], acc[G][PER], mx[G], l[G];
};

// Activation loads of attention: q and the mask have their dtypes as
// template parameters (QT, MT), so every load of a batch is one unconditional
// instruction and the batch goes out together (a dtype branch per element
// sent them out one L2 round trip at a time). MT is void without a mask, and
// AnyMask for a dtype other than bool or a float kind (read out of line).
struct AnyMask {};

// mask_add reads a mask element as the score's addend: 0 or -inf for a bool
// mask, the value for a float one. Plain L2 loads (the mask is an activation).
template <typename MT>
__device__ __forceinline__ float mask_add(const char* mb, int32_t dt, int64_t off) {
  if constexpr (std::is_same<MT, bool>::value) {
    return __ldcg(reinterpret_cast<const unsigned char*>(mb) + off) ? 0.f : -INFINITY;
  } else if constexpr (std::is_same<MT, AnyMask>::value) {
    return (float)load_elem(mb, dt, off);
  } else {
    return ld_typed(reinterpret_cast<const MT*>(mb) + off);
  }
}

// load_queries fills q (pre-scaled) for heads h0..h0+G-1 and clears the state.
template <typename QT, int D, int G, int N>
__device__ __forceinline__ void load_queries(SoftmaxState<D, G>& st, const Op& op, const Slots<N>& s, int64_t b,
                                             int64_t h0, int64_t i, int lane) {
  const View& q = op.in[0];
  const QT* qb = reinterpret_cast<const QT*>(base(s, q));
  int64_t row[G];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    int64_t qi[4] = {b, h0 + g, i, 0};
    row[g] = offset_of(q, qi);
  }
#pragma unroll
  for (int g = 0; g < G; ++g) {
    st.mx[g] = -INFINITY;
    st.l[g] = 0.f;
#pragma unroll
    for (int e = 0; e < st.PER; ++e) {
      const int c = min(lane * st.PER + e, D - 1);  // lanes past D load a valid element and drop it
      const float x = ld_typed(qb + row[g] + c * q.stride[3]);
      st.qv[g][e] = lane * st.PER + e < D ? x * op.scale : 0.f;
      st.acc[g][e] = 0.f;
    }
  }
}

// Vector type of BYTES bytes for one non-coherent load.
template <int BYTES> struct RawVec;
template <> struct RawVec<4> { using type = unsigned; };
template <> struct RawVec<8> { using type = uint2; };
template <> struct RawVec<16> { using type = uint4; };

// load_lane_strided reads a lane's PER elements of a K or V row (columns
// lane·PER ...) one by one, zeros past D or for a dead row: the general
// case, out of line (rare, and it would double the code of the row loop).
template <typename T, int D, int PER>
__device__ __noinline__ void load_lane_strided(float (&dst)[PER], const T* row, int64_t stride, int c0, bool live) {
#pragma unroll 1
  for (int k = 0; k < PER; ++k) {
    const int c = c0 + k;
    dst[k] = live && c < D ? to_float(__ldcg(row + c * stride)) : 0.f;
  }
}

// rows_aligned says whether every row of a [B, H, S, D] view of T elements
// is contiguous and starts on a BYTES boundary, so vector loads of BYTES may
// read it.
template <typename T>
__device__ __forceinline__ bool rows_aligned(const View& x, const void* base, int bytes) {
  const int64_t es = sizeof(T);
  return x.stride[3] == 1 && reinterpret_cast<uintptr_t>(static_cast<const char*>(base) + x.offset * es) % bytes == 0 &&
         (x.stride[0] * es) % bytes == 0 && (x.stride[1] * es) % bytes == 0 && (x.stride[2] * es) % bytes == 0;
}

// kv_vector says whether K and V rows can be read with one vector load per
// lane (contiguous, aligned rows): decided once per task, so the row loop
// has no per-row branch between its loads.
template <typename T, int D, int PER>
__device__ __forceinline__ bool kv_vector(const View& k, const View& v, const T* kb, const T* vb) {
  constexpr int BYTES = PER * (int)sizeof(T);
  if constexpr (BYTES != 4 && BYTES != 8 && BYTES != 16) {
    return false;
  } else {
    return D % PER == 0 && rows_aligned<T>(k, kb, BYTES) && rows_aligned<T>(v, vb, BYTES);
  }
}

// load_lane_vec reads lane's PER elements of a row with one predicated load
// (zeros for a dead row: its K and V are never read).
template <typename T, int D, int PER>
__device__ __forceinline__ void load_lane_vec(float (&dst)[PER], const T* row, int lane, bool live) {
  constexpr int BYTES = PER * (int)sizeof(T);
  using V = typename RawVec<(BYTES == 4 || BYTES == 8 || BYTES == 16) ? BYTES : 4>::type;
  V raw{};
  if (live && lane * PER < D) raw = __ldcg(reinterpret_cast<const V*>(row + lane * PER));
  const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int k = 0; k < PER; ++k) dst[k] = to_float(e[k]);
}

// accumulate_rows folds the KV rows j0, j0+step, ... below end into one
// warp's state, U rows at a time: a batch's mask is read first, then K and V
// of its live rows only (a long cache holding few tokens costs only the
// tokens), all in flight together; the U·G scores are independent warp sums,
// and the softmax state is rescaled once per batch rather than once per row.
template <typename T, typename MT, int D, int G, int N>
__device__ __forceinline__ void accumulate_rows(SoftmaxState<D, G>& st, const Op& op, const Slots<N>& s, int64_t b,
                                                int64_t h0, int64_t i, int64_t j0, int64_t end, int64_t step,
                                                int lane) {
  constexpr int U = 4, PER = SoftmaxState<D, G>::PER;
  constexpr bool has_mask = !std::is_void<MT>::value;
  const View& k = op.in[1];
  const View& v = op.in[2];
  const T* kb = reinterpret_cast<const T*>(base(s, k));
  const T* vb = reinterpret_cast<const T*>(base(s, v));
  const char* mb = has_mask ? base(s, op.in[3]) : nullptr;
  const bool vec = kv_vector<T, D, PER>(k, v, kb, vb);
  const int64_t kvh = h0 / G;
  const int64_t kb0 = k.offset + b * k.stride[0] + kvh * k.stride[1];
  const int64_t vb0 = v.offset + b * v.stride[0] + kvh * v.stride[1];
  int64_t mrow[G];  // each head's mask row, position 0
  if (has_mask) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
      int64_t mi[4] = {b, h0 + g, i, 0};
      mrow[g] = offset_of(op.in[3], mi);
    }
  }
  for (int64_t jb = j0; jb < end; jb += step * U) {
    float kr[U][PER], vr[U][PER], sc[U][G];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t j = jb + u * step;
#pragma unroll
      for (int g = 0; g < G; ++g) {
        float add = j < end ? 0.f : -INFINITY;
        if constexpr (has_mask)
          if (j < end) add = mask_add<MT>(mb, op.in[3].dtype, mrow[g] + j * op.in[3].stride[3]);
        sc[u][g] = add;
      }
    }
    bool live[U];  // some head sees row u: the same for every lane
#pragma unroll
    for (int u = 0; u < U; ++u) {
      live[u] = false;
#pragma unroll
      for (int g = 0; g < G; ++g) live[u] = live[u] || sc[u][g] != -INFINITY;
    }
    if (vec) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t j = jb + u * step;
        load_lane_vec<T, D, PER>(kr[u], kb + kb0 + j * k.stride[2], lane, live[u]);
        load_lane_vec<T, D, PER>(vr[u], vb + vb0 + j * v.stride[2], lane, live[u]);
      }
    } else {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t j = jb + u * step;
        float kt[PER], vt[PER];  // in local memory on this path only, so kr and vr stay in registers
        load_lane_strided<T, D, PER>(kt, kb + kb0 + j * k.stride[2], k.stride[3], lane * PER, live[u]);
        load_lane_strided<T, D, PER>(vt, vb + vb0 + j * v.stride[2], v.stride[3], lane * PER, live[u]);
#pragma unroll
        for (int e = 0; e < PER; ++e) kr[u][e] = kt[e], vr[u][e] = vt[e];
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int g = 0; g < G; ++g) {
        float dot = 0.f;
#pragma unroll
        for (int e = 0; e < PER; ++e) dot += st.qv[g][e] * kr[u][e];
        dot = warp_sum(dot);  // every lane, converged: a dead row's K is zeros
        if (sc[u][g] != -INFINITY) sc[u][g] += dot;
      }
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float mnew = st.mx[g];
#pragma unroll
      for (int u = 0; u < U; ++u) mnew = fmaxf(mnew, sc[u][g]);
      if (mnew == -INFINITY) continue;
      const float corr = __expf(st.mx[g] - mnew);
      float p[U], psum = 0.f;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        p[u] = __expf(sc[u][g] - mnew);
        psum += p[u];
      }
      st.l[g] = st.l[g] * corr + psum;
#pragma unroll
      for (int e = 0; e < PER; ++e) {
        float a = st.acc[g][e] * corr;
#pragma unroll
        for (int u = 0; u < U; ++u) a += p[u] * vr[u][e];
        st.acc[g][e] = a;
      }
      st.mx[g] = mnew;
    }
  }
}

// merge_states combines the softmax states that warps of one block left in
// part ([warp][G][D + 2]: max, sum, output) for head g: warps first, first+1,
// ..., first+n-1. Returns (in o, per lane) the normalised output and in L the sum.
template <int D, int G>
__device__ __forceinline__ void merge_states(const float* part, int first, int n, int g, int lane,
                                             float (&o)[SoftmaxState<D, G>::PER], float& M, float& L) {
  constexpr int PER = SoftmaxState<D, G>::PER;
  M = -INFINITY;
  for (int w = first; w < first + n; ++w) M = fmaxf(M, part[(w * G + g) * (D + 2)]);
  L = 0.f;
#pragma unroll
  for (int e = 0; e < PER; ++e) o[e] = 0.f;
  for (int w = first; w < first + n; ++w) {
    const float* pw = part + (w * G + g) * (D + 2);
    if (pw[1] == 0.f) continue;
    const float f = __expf(pw[0] - M);
    L += pw[1] * f;
#pragma unroll
    for (int e = 0; e < PER; ++e)
      if (lane * PER + e < D) o[e] += pw[2 + lane * PER + e] * f;
  }
}

// store_partial writes one partial softmax row (max, sum, then the lane's
// PER unnormalised outputs, elements es apart).
template <int D>
__device__ __forceinline__ void store_partial(float* row, int64_t es, float m, float l,
                                              const float (&o)[(D + 31) / 32], int lane) {
  constexpr int PER = (D + 31) / 32;
  if (lane == 0) {
    row[0] = m;
    row[es] = l;
  }
#pragma unroll
  for (int e = 0; e < PER; ++e)
    if (lane * PER + e < D) row[(2 + lane * PER + e) * es] = o[e];
}

// stash_state writes a warp's state for its G heads to part[warp].
template <int D, int G>
__device__ __forceinline__ void stash_state(const SoftmaxState<D, G>& st, float* part, int warp, int lane) {
  constexpr int PER = SoftmaxState<D, G>::PER;
#pragma unroll
  for (int g = 0; g < G; ++g) {
    float* mine = part + (warp * G + g) * (D + 2);
    if (lane == 0) {
      mine[0] = st.mx[g];
      mine[1] = st.l[g];
    }
#pragma unroll
    for (int e = 0; e < PER; ++e)
      if (lane * PER + e < D) mine[2 + lane * PER + e] = st.acc[g][e];
  }
}

template <typename T, typename QT, typename MT, int D, int G, int N>
__device__ void attention(const Op& op, int lo, int hi, const Slots<N>& s, char* smem) {
  static_assert(D <= 256, "head dim up to 256");
  constexpr int PER = SoftmaxState<D, G>::PER;
  const View& q = op.in[0];
  const int64_t B = q.shape[0], Sq = q.shape[2], S = op.in[1].shape[2];
  const bool causal = op.flags & FLAG_CAUSAL;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = MPK_THREADS / 32;
  float* part = reinterpret_cast<float*>(smem);  // [warps][G][D + 2]: m, l, acc
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h0 = lo; h0 < hi; h0 += G)
      for (int64_t i = 0; i < Sq; ++i) {
        SoftmaxState<D, G> st;
        load_queries<QT>(st, op, s, b, h0, i, lane);
        accumulate_rows<T, MT>(st, op, s, b, h0, i, warp, causal ? min(S, i + 1) : S, warps, lane);
        stash_state(st, part, warp, lane);
        consumer_sync();
        if (warp < G) {  // warp g merges head g's partial softmaxes
          float o[PER], M, L;
          merge_states<D, G>(part, 0, warps, warp, lane, o, M, L);
#pragma unroll
          for (int e = 0; e < PER; ++e) {
            if (lane * PER + e >= D) continue;
            int64_t oi[4] = {b, h0 + warp, i, lane * PER + e};
            store_elem(base(s, op.out), op.out.dtype, offset_of(op.out, oi), L > 0.f ? o[e] / L : 0.f);
          }
        }
        consumer_sync();
      }
}

// dot_q is q·k over the elements of one 16-byte K load.
template <typename T>
__device__ __forceinline__ float dot_q(const uint4& raw, const float* q) {
  const T* e = reinterpret_cast<const T*>(&raw);
  float a = 0.f;
#pragma unroll
  for (int i = 0; i < 16 / (int)sizeof(T); ++i) a = fmaf(q[i], to_float(e[i]), a);
  return a;
}

// Elems is PER elements of T: a lane's V columns on the element-wise path.
template <typename T, int PER>
struct Elems {
  T e[PER];
};

// MaskRow reads one (batch, head) row of a [B, H, 1, S] mask as the
// score's addend (mask_add); with no mask (MT void) every position adds 0.
template <typename MT>
struct MaskRow {
  const char* base;
  int64_t row, stride;
  int32_t dtype;
  // add(j, d): position j of the row d elements on (another head's row).
  __device__ __forceinline__ float add(int j, int64_t d = 0) const {
    if constexpr (std::is_void<MT>::value) {
      return 0.f;
    } else {
      return mask_add<MT>(base, dtype, row + d + j * stride);
    }
  }
};

template <typename MT, int N>
__device__ __forceinline__ MaskRow<MT> mask_row(const Op& op, const Slots<N>& s, int b, int h) {
  if constexpr (std::is_void<MT>::value) {
    return MaskRow<MT>{nullptr, 0, 0, 0};
  } else {
    const View& mv = op.in[3];
    return MaskRow<MT>{base(s, mv), mv.offset + b * mv.stride[0] + h * mv.stride[1], mv.stride[3], mv.dtype};
  }
}

// mask_visible says whether a mask add leaves its position visible in a row
// whose largest add is top: not -inf, and within MPK_MASK_HIDE_MARGIN of top
// (HF hides with finfo.min; ir.MaskHideMargin says why that is exact). NaN
// is visible.
__device__ __forceinline__ bool mask_visible(float add, float top) {
  return add != -INFINITY && !(add < top - MPK_MASK_HIDE_MARGIN);
}

// mask_extent: out[b] = 1 + the last position that row b of the mask
// [B, H, Sq, S] leaves visible (mask_visible) to any head and query, 0 when
// none. The attention computes and the o projection's merge reads no split
// past it (splits_below_extent), so a long cache with few live positions
// costs what its live positions cost. Two passes a row: its largest add,
// then the last position visible against it.
template <typename MT, int N>
__device__ void mask_extent(const Op& op, int lo, int hi, const Slots<N>& s, char* smem) {
  const View& mv = op.in[0];
  const View& out = op.out;
  int* best = reinterpret_cast<int*>(smem);
  float* tops = reinterpret_cast<float*>(smem) + 1;  // a warp's largest add
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const char* mb = base(s, mv);
  // Broadcast heads or queries (stride 0) are one row.
  const int64_t nq = mv.stride[2] == 0 ? 1 : mv.shape[2], rows = (mv.stride[1] == 0 ? 1 : mv.shape[1]) * nq;
  const int64_t S = mv.shape[3];
  for (int b = lo; b < hi; ++b) {
    if (threadIdx.x == 0) *best = 0;
    int last = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t row = mv.offset + b * mv.stride[0] + (r / nq) * mv.stride[1] + (r % nq) * mv.stride[2];
      float top = -INFINITY;
#pragma unroll 4
      for (int64_t j = threadIdx.x; j < S; j += MPK_THREADS) top = fmaxf(top, mask_add<MT>(mb, mv.dtype, row + j * mv.stride[3]));
      top = warp_max(top);
      if (lane == 0) tops[warp] = top;
      consumer_sync();
#pragma unroll
      for (int i = 0; i < kConsumerWarps; ++i) top = fmaxf(top, tops[i]);
#pragma unroll 4
      for (int64_t j = threadIdx.x; j < S; j += MPK_THREADS)
        if (mask_visible(mask_add<MT>(mb, mv.dtype, row + j * mv.stride[3]), top)) last = max(last, (int)j + 1);
      consumer_sync();  // tops is read before the next row writes it
    }
    last = __reduce_max_sync(0xffffffffu, last);
    if (lane == 0) atomicMax(best, last);
    consumer_sync();
    if (threadIdx.x == 0) reinterpret_cast<int32_t*>(base(s, out))[out.offset + b * out.stride[0]] = *best;
    consumer_sync();
  }
}

// DecodeV holds a lane's V columns of one row: one vector load's raw bytes
// on the fast path, the elements on the element-wise one.
template <typename T, int PER, bool FAST>
struct DecodeV {
  using type = Elems<T, PER>;
};
template <typename T, int PER>
struct DecodeV<T, PER, true> {
  using type = typename RawVec<PER * (int)sizeof(T)>::type;
};

// decode_fast_dims says whether head dim D of T suits attention_decode's
// vector loads at all (a 16-byte K load, a lane's V columns in one load).
template <typename T, int D>
constexpr bool decode_fast_dims() {
  constexpr int VBYTES = (D + 31) / 32 * (int)sizeof(T);
  return D % 32 == 0 && D % (16 / (int)sizeof(T)) == 0 && (VBYTES == 4 || VBYTES == 8 || VBYTES == 16);
}

// decode_rows_ok says whether attention_decode can read the K and V rows of
// this op: contiguous and 16-byte aligned, so a lane reads its K row and
// its V columns with vector loads.
template <typename T, int D>
__device__ __forceinline__ bool decode_rows_ok(const View& k, const View& v, const char* kb, const char* vb) {
  return decode_fast_dims<T, D>() && rows_aligned<T>(k, kb, 16) && rows_aligned<T>(v, vb, 16);
}

// load_queries_regs reads the G queries of heads h0.. of batch row b into a
// lane's registers (elements lane + 32·e), their loads issued together
// (clamped, not branched); put_queries writes them to a warp's qs [G][D],
// pre-scaled, for the lanes to read as broadcasts. stage_queries does both.
template <typename QT, int D, int G, int N>
__device__ __forceinline__ void load_queries_regs(float (&qv)[G][(D + 31) / 32], const Op& op, const Slots<N>& s,
                                                  int64_t b, int h0, int lane) {
  constexpr int PER = (D + 31) / 32;
  const View& q = op.in[0];
#pragma unroll
  for (int u = 0; u < G; ++u) {
    const QT* qrow = reinterpret_cast<const QT*>(base(s, q)) + q.offset + b * q.stride[0] + (h0 + u) * q.stride[1];
#pragma unroll
    for (int e = 0; e < PER; ++e) qv[u][e] = ld_typed(qrow + min(lane + 32 * e, D - 1) * q.stride[3]);
  }
}

template <int D, int G>
__device__ __forceinline__ void put_queries(float* qs, const float (&qv)[G][(D + 31) / 32], float scale, int lane) {
  constexpr int PER = (D + 31) / 32;
  __syncwarp();  // the previous reads of qs are done
#pragma unroll
  for (int u = 0; u < G; ++u)
#pragma unroll
    for (int e = 0; e < PER; ++e)
      if (lane + 32 * e < D) qs[u * D + lane + 32 * e] = qv[u][e] * scale;
  __syncwarp();
}

template <typename QT, int D, int G, int N>
__device__ __forceinline__ void stage_queries(float* qs, const Op& op, const Slots<N>& s, int64_t b, int h0, int lane) {
  float qv[G][(D + 31) / 32];
  load_queries_regs<QT, D, G>(qv, op, s, b, h0, lane);
  put_queries<D, G>(qs, qv, op.scale, lane);
}

// clear_softmax starts G heads' online softmax: no position yet (max -inf,
// sum and output 0).
template <int G, int PER>
__device__ __forceinline__ void clear_softmax(float (&m)[G], float (&l)[G], float (&acc)[G][PER]) {
#pragma unroll
  for (int u = 0; u < G; ++u) {
    m[u] = -INFINITY, l[u] = 0.f;
#pragma unroll
    for (int e = 0; e < PER; ++e) acc[u][e] = 0.f;
  }
}

// softmax_step folds 32 positions, a lane's each, into G heads' online
// softmax (running max m, sum l, output acc): sc is the lane's mask add
// (-inf: no position there), dot its q·k; pr gets its probabilities.
template <int G, int PER>
__device__ __forceinline__ void softmax_step(float (&m)[G], float (&l)[G], float (&acc)[G][PER], const float (&sc)[G],
                                             const float (&dot)[G], float (&pr)[G]) {
#pragma unroll
  for (int u = 0; u < G; ++u) {
    const float x = sc[u] != -INFINITY ? sc[u] + dot[u] : -INFINITY;
    const float mnew = fmaxf(m[u], warp_max(x));
    const float corr = mnew == -INFINITY ? 1.f : __expf(m[u] - mnew);
    pr[u] = x != -INFINITY ? __expf(x - mnew) : 0.f;
    l[u] = l[u] * corr + warp_sum(pr[u]);
#pragma unroll
    for (int e = 0; e < PER; ++e) acc[u][e] *= corr;
    m[u] = mnew;
  }
}

// DecodeUnit is one unit of a decode attention task: batch row b, split sp,
// first query head h0 of its head group.
struct DecodeUnit {
  int b, sp, h0;
};

// DecodeUnits lists a decode attention task's live units (ir.Op.DecodeUnits):
// its units [lo, hi) are whole batch rows [b_lo, b_hi), or within row b_lo
// the units [lo, hi) of its head groups; of each head group the splits
// [sp0, sp0 + live) of its row, the first ones of its group (SplitGroups),
// where the chunks [0, nlive) may hold visible positions. The live units of
// all the task's rows are taken rows first: a batch's rows share rounds (row
// by row, most of a round's warps idled at batch 4). With ROWS, row_live
// (shared, a row each) holds each row's live splits; the constructor's
// barrier makes them visible.
template <int R, bool ROWS>
struct DecodeUnits {
  SplitGroups<R> g;
  int b_lo, b_hi, lo, hi, sp0, heads, live0 = 0, n = 0;
  const int* row_live;
  // H: the op's query heads. ext0 >= 0 (one row): row b_lo's extent, given
  // by the caller (the cache's length: every split live, the usual step's
  // units, known before the extent is).
  template <int N>
  __device__ __forceinline__ DecodeUnits(const Op& op, int lo_, int hi_, int splits, int chunk, int ug, int H,
                                         int* rows, const Slots<N>& s, int ext0 = -1)
      : g(splits), row_live(rows) {
    const int rowsz = H / ug * splits;
    b_lo = lo_ / rowsz;
    b_hi = hi_ - lo_ >= rowsz ? hi_ / rowsz : b_lo + 1;
    if (hi_ - lo_ < rowsz) lo = lo_ - b_lo * rowsz, hi = hi_ - b_lo * rowsz;
    else lo = 0, hi = rowsz;
    sp0 = lo % splits, heads = max(1, (hi - lo) / splits);
    const int grp = g.group(sp0);
    auto live_of = [&](int b) {
      const int nlive = !(op.flags & FLAG_EXTENT) ? splits
                        : ext0 >= 0                ? min(splits, (ext0 + chunk - 1) / chunk)
                                                   : splits_below_extent(op.in[4], b, chunk, splits, s);
      return max(0, min(min(hi - lo, splits), g.live_in(grp, nlive) - (sp0 - g.start(grp))));
    };
    if constexpr (ROWS) {
      for (int b = b_lo + (int)threadIdx.x; b < b_hi; b += MPK_THREADS) rows[b - b_lo] = live_of(b);
      consumer_sync();
      for (int b = b_lo; b < b_hi; ++b) n += heads * rows[b - b_lo];
    } else {
      live0 = live_of(b_lo);
      n = heads * live0;
    }
  }
  // unit returns the nth live unit (any n: past the last, a unit no warp
  // computes).
  __device__ __forceinline__ DecodeUnit unit(int nth, int splits, int ug) const {
    int b = b_lo;  // the unit's place among the live ones, then within its row's
    if constexpr (ROWS)
      while (b < b_hi - 1 && nth >= heads * row_live[b - b_lo]) nth -= heads * row_live[(b++) - b_lo];
    const int per_head = max(1, ROWS ? row_live[b - b_lo] : live0);
    return DecodeUnit{b, sp0 + nth % per_head, (lo / splits + nth / per_head) * ug};
  }
};

// FreshTypes are a fresh-row attention's element types, as constants
// (codegen): C of cos and sin, KX and VX of the new K and V rows, W of the
// norms' weights; QR the rotated query's dtype code; NORMED whether q and k
// are RMS-normalised first, NORM the norms' rounding. With them the staging's loads and roundings are single
// instructions, where dtype switches took registers enough to spill.
template <typename C_, typename KX_, typename VX_, typename W_, int QR_, bool NORMED_, int NORM_>
struct FreshTypes {
  using C = C_;
  using KX = KX_;
  using VX = VX_;
  using W = W_;
  static constexpr int32_t QR = QR_, NORM = NORM_;
  static constexpr bool NORMED = NORMED_;
};

// FreshQ is what a fresh-row attention (ir.FreshRows, op.pro_first the
// first of its inputs) reads of a unit's queries before its dots, a lane's
// elements lane + 32·e: its G query rows before the RoPE, the cos and sin
// rows (one tensor broadcast over the heads: the same rows serve the new K
// row), and when FT::NORMED the q norm's weights. The new K and V rows are
// read by put_fresh, in a second batch: all at once, their destinations
// outnumbered the registers and ptxas spilled them, each spill store
// waiting for its load (units of G heads a warp). Read with the queries
// instead (units of one head), qwen3 models ran 1-2.5% slower, also without
// the spills (bench/NOTES.md, twenty-fourth session).
template <int D, int G>
struct FreshQ {
  static constexpr int PER = D / 32;
  float q[G][PER], qw[G][PER], c[PER], sn[PER];
};

// fresh_at is the offset of view v's row at batch row b and head h.
__device__ __forceinline__ int64_t fresh_at(const View& v, int64_t b, int64_t h) {
  return v.offset + b * v.stride[0] + h * v.stride[1];
}

// load_fresh_kv reads the new K and V rows of KV head kvh (and the k norm's
// weights when FT::NORMED), a lane's K elements lane + 32·e and V columns
// lane·PER + e.
template <class FT, int D, int N>
__device__ __forceinline__ void load_fresh_kv(float (&k)[D / 32], float (&kw)[D / 32], float (&v)[D / 32], const Op& op,
                                              const Slots<N>& s, int64_t b, int kvh, int lane) {
  constexpr int PER = D / 32;
  const int F = op.pro_first;
  const View &kx = op.in[F + 2], &vx = op.in[F + 3], &kwv = op.in[F + 6];
#pragma unroll
  for (int e = 0; e < PER; ++e) {
    const int64_t j = lane + 32 * e;
    k[e] = ld_typed(reinterpret_cast<const typename FT::KX*>(base(s, kx)) + fresh_at(kx, b, kvh) + j * kx.stride[3]);
    v[e] = ld_typed(reinterpret_cast<const typename FT::VX*>(base(s, vx)) + fresh_at(vx, b, kvh) +
                    (lane * PER + e) * vx.stride[3]);
    kw[e] = FT::NORMED ? ld_typed(reinterpret_cast<const typename FT::W*>(base(s, kwv)) + fresh_at(kwv, b, kvh) +
                                  j * kwv.stride[3])
                       : 1.f;
  }
}

template <class FT, typename QT, int D, int G, int N>
__device__ __forceinline__ void load_fresh_q(FreshQ<D, G>& f, const Op& op, const Slots<N>& s, int64_t b, int h0,
                                             int lane) {
  constexpr int PER = D / 32;
  const int F = op.pro_first;
  const View &q = op.in[0], &c = op.in[F], &sn = op.in[F + 1], &qw = op.in[F + 5];
#pragma unroll
  for (int u = 0; u < G; ++u) {
    const QT* qrow = reinterpret_cast<const QT*>(base(s, q)) + fresh_at(q, b, h0 + u);
#pragma unroll
    for (int e = 0; e < PER; ++e) f.q[u][e] = ld_typed(qrow + (lane + 32 * e) * q.stride[3]);
  }
#pragma unroll
  for (int e = 0; e < PER; ++e) {
    const int64_t j = lane + 32 * e;
    f.c[e] = ld_typed(reinterpret_cast<const typename FT::C*>(base(s, c)) + fresh_at(c, b, h0) + j * c.stride[3]);
    f.sn[e] = ld_typed(reinterpret_cast<const typename FT::C*>(base(s, sn)) + fresh_at(sn, b, h0) + j * sn.stride[3]);
  }
  if constexpr (FT::NORMED)
#pragma unroll
    for (int u = 0; u < G; ++u)
#pragma unroll
      for (int e = 0; e < PER; ++e)
        f.qw[u][e] = ld_typed(reinterpret_cast<const typename FT::W*>(base(s, qw)) + fresh_at(qw, b, h0 + u) +
                              (lane + 32 * e) * qw.stride[3]);
}

// fresh_rotate is the RoPE of a warp's row v (RMS-normalised with weight g
// first when norm), rounding as rope_normed: the norm to xdt then ndt, each
// product and sum of the rotation to dt (rotate_pair). D / 2 is a multiple
// of 32, so element lane + 32·e pairs with lane + 32·(e + PER / 2) in the
// same lane.
template <int PER>
__device__ __forceinline__ void fresh_rotate(float (&v)[PER], const float (&g)[PER], const float (&c)[PER],
                                             const float (&sn)[PER], bool norm, float eps, int32_t xdt, int32_t ndt,
                                             int32_t dt) {
  constexpr int hp = PER / 2;
  if (norm) {
    float ss = 0.f;
#pragma unroll
    for (int e = 0; e < PER; ++e) ss += v[e] * v[e];
    ss = warp_sum(ss);
    const float inv = rsqrtf(ss / (float)(32 * PER) + eps);
#pragma unroll
    for (int e = 0; e < PER; ++e) v[e] = round_float(ndt, round_float(xdt, v[e] * inv) * g[e]);
  }
#pragma unroll
  for (int e = 0; e < hp; ++e) {
    const float2 r = rotate_pair(v[e], v[e + hp], c[e], sn[e], c[e + hp], sn[e + hp], dt);
    v[e] = r.x, v[e + hp] = r.y;
  }
}

// put_fresh writes the unit's rotated queries to the warp's qs [G][D],
// pre-scaled (as put_queries); reads the new K row of KV head kvh and sets
// dnew to each query's dot with it rotated (rounded to the cache's dtype
// kdt): the score of the position the step writes, which the unit never
// reads from the cache; and puts the new V row (rounded to vdt, as the
// cache write stores it) in the warp's vf [D], columns as the unit's
// output, for fresh_fold. The K and V rows' loads go out first and fly
// while the queries rotate.
template <class FT, typename QT, typename T, int D, int G, int N>
__device__ __forceinline__ void put_fresh(float* qs, float* vf, float (&dnew)[G], FreshQ<D, G>& f, const Op& op,
                                          const Slots<N>& s, int64_t b, int kvh, int lane) {
  constexpr int PER = D / 32;
  constexpr bool norm = FT::NORMED;
  float k[PER], kw[PER], v[PER];
  load_fresh_kv<FT, D>(k, kw, v, op, s, b, kvh, lane);
  __syncwarp();  // the previous reads of qs are done
#pragma unroll
  for (int u = 0; u < G; ++u) {
    fresh_rotate<PER>(f.q[u], f.qw[u], f.c, f.sn, norm, op.eps, dtype_of<QT>(), FT::NORM, FT::QR);
#pragma unroll
    for (int e = 0; e < PER; ++e) qs[u * D + lane + 32 * e] = f.q[u][e] * op.scale;
  }
  fresh_rotate<PER>(k, kw, f.c, f.sn, norm, op.eps, dtype_of<typename FT::KX>(), FT::NORM, dtype_of<T>());
#pragma unroll
  for (int u = 0; u < G; ++u) {
    float d = 0.f;
#pragma unroll
    for (int e = 0; e < PER; ++e) d = fmaf(qs[u * D + lane + 32 * e], k[e], d);
    dnew[u] = warp_sum(d);
  }
  // The new V row waits in shared memory for fresh_fold, not in registers
  // through the unit's loop.
#pragma unroll
  for (int e = 0; e < PER; ++e) vf[lane * PER + e] = round_float(dtype_of<T>(), v[e]);
  __syncwarp();
}

// fresh_position is the cache position a fresh-row attention's new row is
// written at (in[pro_first + 4], one element; negative counts from the
// end), or -1 out of range (the cache write reports it).
template <int N>
__device__ __forceinline__ int fresh_position(const Op& op, const Slots<N>& s, int S) {
  const View& p = op.in[op.pro_first + 4];
  const char* pb = base(s, p);
  const int64_t raw = p.dtype == DT_INT64 ? __ldcg(reinterpret_cast<const long long*>(pb) + p.offset)
                                          : __ldcg(reinterpret_cast<const int*>(pb) + p.offset);
  const int64_t i = raw < 0 ? raw + S : raw;
  return i >= 0 && i < S ? (int)i : -1;
}

// fold_row adds one position to a unit's online softmax (m, l, acc:
// columns lane·PER + e): x its queries' scores there (-inf: hidden, or not
// this warp's; warp-uniform), vc(e) the lane's columns of its V row.
template <int G, int PER, typename VC>
__device__ __forceinline__ void fold_row(float (&m)[G], float (&l)[G], float (&acc)[G][PER], const float (&x)[G],
                                         VC vc) {
#pragma unroll
  for (int u = 0; u < G; ++u) {
    if (x[u] == -INFINITY) continue;  // warp-uniform
    const float mnew = fmaxf(m[u], x[u]);
    const float corr = m[u] == -INFINITY ? 0.f : __expf(m[u] - mnew), p = __expf(x[u] - mnew);
    l[u] = l[u] * corr + p;
#pragma unroll
    for (int e = 0; e < PER; ++e) acc[u][e] = acc[u][e] * corr + p * vc(e);
    m[u] = mnew;
  }
}

// fresh_fold adds the row the step writes to a unit's online softmax (m,
// l, acc: columns lane·PER + e), once its cache rows are done: xf its
// queries' scores there (-inf: hidden, or not this warp's), the V row in vf
// (put_fresh).
template <int G, int PER>
__device__ __forceinline__ void fresh_fold(float (&m)[G], float (&l)[G], float (&acc)[G][PER], const float (&xf)[G],
                                           const float* vf, int lane) {
  fold_row<G, PER>(m, l, acc, xf, [&](int e) { return vf[lane * PER + e]; });
}

// MPK_DECODE_TAIL_ROWS (1; 0 an A/B knob): a chunk a few rows longer than
// whole rounds of its warps (a long cache's: ⌈4,136 / 16⌉ = 259 positions
// at 4 warps a head is 2 rounds of 128 and 3 rows) takes those rows one a
// warp, the row's dot split over the lanes (tail_score), instead of a third
// round of ~4.5 us for 3 rows. On the H100 at 4,096 cached (one run, two
// pairs, bench/NOTES.md thirty-seventh session): qwen3-8b 6.707 / 6.705 ms
// against 6.777 / 6.778, llama-3.2-1b 1.347 / 1.339 against 1.365 / 1.369.
#ifndef MPK_DECODE_TAIL_ROWS
#define MPK_DECODE_TAIL_ROWS 1
#endif

// tail_score is a warp's scores of its UG heads' queries qs [UG][D] (each
// head's mask add in a: -inf hidden) against the K row kr, whose columns
// lane·PER ... the lane holds: the dot summed over the lanes, every lane
// getting it.
template <typename T, int D, int UG, typename VR>
__device__ __forceinline__ void tail_score(float (&x)[UG], const float (&a)[UG], const VR& kr, const float* qs,
                                           int lane) {
  constexpr int PER = D / 32;
  const T* e = reinterpret_cast<const T*>(&kr);
#pragma unroll
  for (int u = 0; u < UG; ++u) {
    float d = 0.f;
#pragma unroll
    for (int c = 0; c < PER; ++c) d = fmaf(qs[u * D + lane * PER + c], to_float(e[c]), d);
    d = warp_sum(d);
    x[u] = a[u] == -INFINITY ? -INFINITY : a[u] + d;
  }
}

// VRows16 is attention_decode's p·V layout where it suits: a lane reads 16
// bytes (VEC columns) of a V row, LPR lanes a row and RPL rows a warp load,
// so a warp's 32 positions take LOADS loads a lane, BATCH in flight (128
// bytes a lane), rather than one narrow load per row: a chunk's V costs
// LOADS / BATCH round trips (1 at D = 64, 2 at D = 128) instead of 4 or 8.
// A lane sums its rows' products for its columns; the row groups are summed
// by shuffles at the unit's end (to_lane_columns).
template <typename T, int D, int UG>
struct VRows16 {
  static constexpr int VEC = 16 / (int)sizeof(T);
  static constexpr int LPR = D / VEC;
  static constexpr int RPL = LPR > 0 && LPR <= 32 ? 32 / LPR : 1;
  static constexpr int LOADS = 32 / RPL;
  static constexpr int BATCH = LOADS < 8 ? LOADS : 8;
  // D splits into whole 16-byte columns and a row into whole lanes; the
  // accumulators (UG·VEC a lane) stay within the register budget.
  static constexpr bool ok = D % VEC == 0 && LPR <= 32 && 32 % LPR == 0 && UG * VEC <= 16;
};

// to_lane_columns turns VRows16 accumulators (lane: columns VEC·(lane % LPR)
// of its row group) into attention_decode's layout (lane: columns
// lane·PER ...): the row groups summed by shuffles, then through the warp's
// query slice qs [UG][D] (free once the unit's dots are done).
template <typename T, int D, int UG>
__device__ __forceinline__ void to_lane_columns(const float (&av)[UG][VRows16<T, D, UG>::VEC],
                                                float (&acc)[UG][(D + 31) / 32], float* qs, int lane) {
  using V = VRows16<T, D, UG>;
  constexpr int PER = (D + 31) / 32;
  float sum[UG][V::VEC];
#pragma unroll
  for (int u = 0; u < UG; ++u)
#pragma unroll
    for (int c = 0; c < V::VEC; ++c) {
      float x = av[u][c];
#pragma unroll
      for (int off = V::LPR; off < 32; off *= 2) x += __shfl_xor_sync(0xffffffffu, x, off);
      sum[u][c] = x;
    }
  __syncwarp();  // the dots' reads of qs are done
  if (lane < V::LPR)
#pragma unroll
    for (int u = 0; u < UG; ++u)
#pragma unroll
      for (int c = 0; c < V::VEC; ++c) qs[u * D + lane * V::VEC + c] = sum[u][c];
  __syncwarp();
#pragma unroll
  for (int u = 0; u < UG; ++u)
#pragma unroll
    for (int e = 0; e < PER; ++e) acc[u][e] = lane * PER + e < D ? qs[u * D + lane * PER + e] : 0.f;
  __syncwarp();  // read before the next unit stages its queries
}

// attention_decode is attention_partial for one query per head (decode):
// the task's units u in [lo, hi) are (head group u / Splits, split
// u % Splits), a head group being UG query heads of one KV head (UG = 1, or
// the KV head's G: its heads share every K and V load), split s covering the
// KV chunk SplitGroups<R>::chunk(s) (with R > 1 groups, a task is one group
// of one head group, so a short live length spreads over all tasks), and a
// layer's attention is spread over every worker (a warp's chain of
// dependent instructions, not memory, is what a unit waits on). A unit takes
// cp warps, one per 32 positions of its chunk (the next 32 after cp·32
// positions), which merge their softmax states in shared memory. For q·k a lane owns a
// position: it reads that K row and dots it with the queries (in the warp's
// slice of shared memory, read as broadcasts), so a score costs no warp
// reduction; the softmax reduces once per 32 positions; for p·V the lanes
// own columns and the probabilities are broadcast by shuffles. A position
// every head's mask hides (or past the cache) reads no K or V. With FLAG_EXTENT,
// in[4] is the mask's extent per batch row and the chunks from it on are
// skipped (their partials unwritten: the merge reads none past the extent),
// so a long cache's empty chunks cost no rounds. Rows as decode_rows_ok
// says; FAST false reads them element by element (any layout). With FT
// (FreshTypes; void: none) the op is a fresh-row attention (ir.FreshRows):
// its queries are rotated as they are staged (put_fresh), and the position
// the step writes is hidden in the loop and its new row folded in after it
// (fresh_fold), so no task reads the cache row the step's writes store.
// A fresh-row unit's queries load with the extent's load, like any unit's
// (loading them once the unit is known spilled less but took one more round
// trip, and was no faster: bench/NOTES.md twenty-second session).

// NoKVPages: attention_decode reads every K and V row from the cache.
struct NoKVPages {
  static constexpr bool kOn = false;
};

// decode_unit_warps is the warps a unit of attention_decode takes: one per
// 32 positions of its chunk, at most the consumer warps over the units a
// task runs side by side (kv_units).
__host__ __device__ constexpr int decode_unit_warps(int chunk, int kv_units) {
  const int cp0 = kConsumerWarps < (chunk + 31) / 32 ? kConsumerWarps : (chunk + 31) / 32;
  const int cpk = kConsumerWarps / kv_units > 0 ? kConsumerWarps / kv_units : 1;
  return cp0 < cpk ? cp0 : cpk;
}

// kv_streams says whether a kv_pages task takes its pages round by round
// (KVPages' STREAM).
template <class KVP>
__host__ __device__ constexpr bool kv_streams() {
  if constexpr (KVP::kOn) return KVP::kStream;
  return false;
}

// kv_units is how many one-head units a kv_pages task runs (1 without).
template <class KVP>
__host__ __device__ constexpr int kv_units() {
  if constexpr (KVP::kOn) return KVP::kUnits;
  return 1;
}

// KVPages is a kv_pages task's K and V chunk in its worker's ring (codegen's
// kvStream): the rows [j0, j0 + rows) of KV head kvh at batch row b,
// streamed by the loader as weights are (the K rows in pages seq ..., then
// the V rows), RPP whole rows a page. The units of that chunk, UNITS of
// one head, read them from shared memory instead of the cache. live: the
// loader cuts the chunk to the rows below the mask's extent (codegen's
// kvLiveExtent), which cut() applies once the extent is read.
// STREAM (a batch's, kv_pages_batch): K and V pages alternate (the K rows'
// page i, then the V rows' page i) and each warp takes them round by round
// (rows_ready: the pages of the rows it is done with released, the next
// round's waited for), so a chunk longer than the ring streams through it
// (codegen's kvStream.roundPairs) and one task a unit's chunk fills the
// workers in one round.
// SWZ (codegen's kvStream.Swizzle; a STREAM task on the tensor cores): the
// pages landed as a 128-byte swizzle lands them, each row's 64-column
// blocks kBlock bytes apart and a block's rows 128 bytes apart
// (DecodeMma's BLOCK): at() is then a row's first block, whose swizzled
// chunks only DecodeMma reads.
template <typename T, int D, int P, int UNITS, bool STREAM = false, bool SWZ = false>
struct KVPages {
  static constexpr bool kOn = true;
  static constexpr bool kStream = STREAM;
  static constexpr int kUnits = UNITS;
  static constexpr int RPP = kPageBytes / (D * (int)sizeof(T));
  static constexpr int kBlock = SWZ ? RPP * 128 : 0;  // bytes from one column block to the next (0: plain rows)
  static_assert(!SWZ || (STREAM && sizeof(T) == 2 && D % 64 == 0), "swizzled kv pages: a batch's, whole 128-byte blocks");
  static_assert(RPP >= 1 && kPageBytes % (D * (int)sizeof(T)) == 0, "a page holds whole rows");
  Ring<P> ring;
  uint32_t seq;
  int b, kvh, j0, rows;
  const int32_t* abort;
  bool live;
  // STREAM, this warp's: pages of the task waited for and released (in
  // order), and the rows [r_lo, r_hi) (from j0) it may read.
  int waited = 0, released = 0, r_lo = 0, r_hi = 0;
  __device__ __forceinline__ void cut(int extent) {
    if (live) rows = min(rows, max(0, extent - j0));
  }
  __device__ __forceinline__ int pages() const { return rows > 0 ? (rows + RPP - 1) / RPP : 0; }  // of K, and of V
  // The ring page (from seq) of row r's K or V.
  __device__ __forceinline__ int page_of(int r, bool v) const {
    return STREAM ? 2 * (r / RPP) + (v ? 1 : 0) : (v ? pages() : 0) + r / RPP;
  }
  // The shared-memory address of row j's element d of K or V; rows outside
  // the chunk (STREAM: outside the rows the warp may read) read the nearest.
  __device__ __forceinline__ uint32_t at(int j, int d, bool v) const {
    const int r = STREAM ? min(max(j - j0, r_lo), r_hi - 1) : min(max(j - j0, 0), rows - 1);
    if constexpr (SWZ) return smem_u32(ring.page(seq + page_of(r, v))) + (r % RPP) * 128;
    return smem_u32(ring.page(seq + page_of(r, v))) + ((r % RPP) * D + d) * (int)sizeof(T);
  }
  // wait returns once every page has landed (each lane acquires it).
  __device__ __forceinline__ void wait() const {
    for (int i = 0; i < 2 * pages(); ++i) wait_page(ring, seq + i, abort);
  }
  // STREAM: release the next page, once landed (a slot released with a copy
  // in flight could be refilled under it).
  __device__ __forceinline__ void release_next() {
    if (released == waited) wait_page(ring, seq + waited++, abort);
    ring.release(seq + released++);
  }
  // STREAM: make rows [lo, hi) of the chunk (lo < hi) readable: the pages
  // wholly below lo released, then those through row hi - 1 waited for.
  // A warp holds at most the round's pages (kv_round_pairs) when it waits.
  __device__ __forceinline__ void rows_ready(int lo, int hi) {
    while (released < 2 * (lo / RPP)) release_next();
    while (waited < 2 * ((hi - 1) / RPP) + 2) wait_page(ring, seq + waited++, abort);
    r_lo = lo, r_hi = hi;
  }
  // STREAM: every page left released (each warp, whatever rows it read).
  __device__ __forceinline__ void drain() {
    while (released < 2 * pages()) release_next();
  }
};

// kv_round_pairs is how many (K, V) page pairs a STREAM task's warp holds at
// once: those of one round of R rows (rounds from the chunk's first row) at
// RPP rows a page. Mirrored by codegen's kvStream.roundPairs.
__host__ __device__ constexpr int kv_round_pairs(int R, int RPP) {
  return R % RPP == 0 ? R / RPP : RPP % R == 0 ? 1 : (R + RPP - 1) / RPP + 1;
}

// ld_shared_raw reads a V row's piece of a lane (4, 8 or 16 bytes) from shared memory.
template <typename V>
__device__ __forceinline__ V ld_shared_raw(uint32_t addr) {
  if constexpr (sizeof(V) == 16) {
    const uint4 r = ld_shared_16(addr);
    return *reinterpret_cast<const V*>(&r);
  } else if constexpr (sizeof(V) == 8) {
    uint2 r;
    asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(r.x), "=r"(r.y) : "r"(addr));
    return *reinterpret_cast<const V*>(&r);
  } else {
    uint32_t r;
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(r) : "r"(addr));
    return *reinterpret_cast<const V*>(&r);
  }
}

// st_shared_f2 writes a float2 to shared memory (a generic store of
// task scratch, which reaches task code as a generic pointer, is slower).
__device__ __forceinline__ void st_shared_f2(uint32_t addr, float2 v) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(addr), "f"(v.x), "f"(v.y) : "memory");
}

// kv_load reads a lane's piece of row j of K (or V: isv) at element d: from
// the ring when the unit is paged, else from the cache at g.
template <typename V, class KVP>
__device__ __forceinline__ V kv_load(const KVP& kv, bool paged, int j, int d, bool isv, const void* g) {
  if constexpr (KVP::kOn)
    if (paged) return ld_shared_raw<V>(kv.at(j, d, isv));
  return __ldcg(reinterpret_cast<const V*>(g));
}
// A lane's bytes of V loads in flight (a batch of rows); fewer make the
// unrolled body smaller (it runs cold, once per layer) but take more round
// trips (bench/NOTES.md).
#ifndef MPK_DECODE_V_BYTES
#define MPK_DECODE_V_BYTES 32
#endif
// SH is the op's shape as constants (DecodeShape): the unit and chunk
// arithmetic ahead of a task's first load is then multiplies and shifts,
// not a chain of integer divisions.
// With KVP a KVPages, the unit it names reads K and V from the ring; a live
// one is cut to the mask's extent, which goes to the loader (s_kv_extent).
// Returns the extent it read (its first batch row's; -1: none read).
template <typename T, typename QT, typename MT, int D, int R, bool ROWS, bool FAST, int UG, class SH, class FT,
          class KVP = NoKVPages, int N>
__device__ __noinline__ int attention_decode(const Op& op, int lo, int hi, const Slots<N>& s, char* smem,
                                             KVP kv = KVP{}) {
  static_assert(!KVP::kOn || (FAST && !ROWS), "kv_pages: one batch row's vector loads");
  constexpr bool FR = !std::is_void<FT>::value;
  constexpr int PER = (D + 31) / 32;       // output columns per lane (lanes past D idle)
  constexpr int KV = 16 / (int)sizeof(T);  // K elements per 16-byte load
  // Loads in flight per lane are bounded to 128 bytes (32 registers): more
  // and ptxas spills the destinations of loads still in flight, and a spill
  // store waits for its load. K is read KB loads a round; V after the dot,
  // in K's registers, VB rows a batch.
  constexpr int KB = D / KV < 8 ? D / KV : 8;
  static_assert(!KVP::kOn || (KB & (KB - 1)) == 0, "kv_pages: a lane's K loads rotate through a power of two");
  constexpr int VB = MPK_DECODE_V_BYTES / (PER * (int)sizeof(T)) < 32 ? MPK_DECODE_V_BYTES / (PER * (int)sizeof(T)) : 32;
  using VRaw = typename DecodeV<T, PER, FAST>::type;
  // On the fast path V is read 16 bytes a lane (VRows16) where D allows.
  using V16 = VRows16<T, D, UG>;
  constexpr bool kV16 = FAST && V16::ok;
  const View &k = op.in[1], &v = op.in[2], &p = op.out;
  constexpr int S = SH::S, G = SH::G, splits = SH::SPLITS, chunk = (S + splits - 1) / splits;
  // A causal mask aligns its one query with position 0 (as SDPA's is_causal).
  const int S_live = op.flags & FLAG_CAUSAL ? min(S, 1) : S;
  constexpr int warps = MPK_THREADS / 32;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // Row strides in elements: a cache row is far below 2^31 elements from the next.
  const int ks = (int)k.stride[2], vs = (int)v.stride[2];
  float* qs = reinterpret_cast<float*>(smem) + warp * UG * D;        // this warp's queries [UG][D], pre-scaled
  float* part = reinterpret_cast<float*>(smem) + warps * UG * D;     // [warps][UG][D + 2]: states to merge
  int* row_live = reinterpret_cast<int*>(part + warps * UG * (D + 2));  // ROWS: [rows], each row's live splits a group
  // FR: this warp's new V row [D], after row_live's B rows (codegen's freshBytes)
  float* vfresh = reinterpret_cast<float*>(row_live) + (op.in[0].shape[0] + 3) / 4 * 4 + warp * D;
  // Warps a unit and units a round; a paged task's units all in one round
  // (a long cache's chunk: each warp takes several 32-row blocks).
  constexpr int cp = decode_unit_warps(chunk, kv_units<KVP>()), units = warps / cp;
  const int sub = warp % cp;
  // Rows past whole rounds one a warp (MPK_DECODE_TAIL_ROWS), for chunks of
  // more than a round (FAST: D a multiple of 32, a lane's V columns one load).
  // (not for a STREAM task: its rounds' pages come one round at a time)
  constexpr bool kTail = MPK_DECODE_TAIL_ROWS && FAST && chunk > 32 * cp && !kv_streams<KVP>();
  // One batch row: the first round's unit as it is when every split is live
  // (the usual step), its queries read together with the mask's extent
  // rather than one round trip after it. The extent's load goes out first:
  // under the register cap the queries' destinations are spilled, and a
  // spill store waits for its load.
  float qv[UG][PER];
  // FR: the queries' fresh-row inputs (FreshQ), the position the step writes,
  // and each query's score there.
  FreshQ<FR ? D : 32, UG> fr;
  float dnew[UG];
  const int pos = FR ? fresh_position(op, s, S) : -1;
  DecodeUnit guess{-1, -1, -1};
  int ext0 = -1;
  if constexpr (!ROWS) {
    const DecodeUnits<R, false> all(op, lo, hi, splits, chunk, UG, SH::H, nullptr, s, S);
    if (op.flags & FLAG_EXTENT) {
      const View& e = op.in[4];
      ext0 = __ldcg(reinterpret_cast<const int32_t*>(base(s, e)) + e.offset + all.b_lo * e.stride[0]);
    }
    if (warp / cp < units && warp / cp < all.n) {
      guess = all.unit(warp / cp, splits, UG);
      if constexpr (FR) load_fresh_q<FT, QT, D, UG>(fr, op, s, guess.b, guess.h0, lane);
      else load_queries_regs<QT, D, UG>(qv, op, s, guess.b, guess.h0, lane);
    }
  }
  // A live kv chunk's extent, read above with the queries (not a round
  // trip before them): the loader waits for it to stream the chunk.
  if constexpr (KVP::kOn) {
    kv.cut(ext0);
    if (kv.live && threadIdx.x == 0) *(volatile int32_t*)&s_kv_extent = ext0;
  }
  const DecodeUnits<R, ROWS> du(op, lo, hi, splits, chunk, UG, SH::H, row_live, s, ext0);
  // Every warp takes part in every round (the merge's barriers).
  for (int i0 = 0; i0 < du.n; i0 += units) {
    const bool active = warp / cp < units && i0 + warp / cp < du.n;
    const DecodeUnit un = du.unit(i0 + warp / cp, splits, UG);
    const int b = un.b, sp = un.sp, h0 = un.h0, kvh = h0 / G;
    const int j_lo = min(du.g.chunk(sp) * chunk, S_live), j_hi = min(j_lo + chunk, S_live);
    float m[UG], l[UG], acc[UG][PER];
    clear_softmax(m, l, acc);
    float av[UG][V16::VEC] = {};  // kV16: the lane's columns of its row group
    float xf[UG];                 // FR: the queries' scores at pos, for fresh_fold (-inf: none here)
    float xt[UG];                 // kTail: the scores of the warp's row past the rounds (-inf: none)
    VRaw tail_v{};                // and its V columns lane·PER ...
#pragma unroll
    for (int u = 0; u < UG; ++u) xf[u] = xt[u] = -INFINITY;
    if (active) {
      const T* krows = reinterpret_cast<const T*>(base(s, k)) + k.offset + b * k.stride[0] + kvh * k.stride[1];
      const T* vrows = reinterpret_cast<const T*>(base(s, v)) + v.offset + b * v.stride[0] + kvh * v.stride[1];
      // [B, H, 1, S]: the first head's row of the mask; the others' are
      // mask_hs elements on (0: one row broadcast over the heads, read once)
      const MaskRow<MT> mask = mask_row<MT>(op, s, b, h0);
      int64_t mask_hs = 0;
      if constexpr (UG > 1 && !std::is_void<MT>::value) mask_hs = op.in[3].stride[1];
      const bool guessed = !ROWS && i0 == 0 && b == guess.b && h0 == guess.h0;
      if constexpr (FR) {
        if (!guessed) load_fresh_q<FT, QT, D, UG>(fr, op, s, b, h0, lane);
        put_fresh<FT, QT, T, D, UG>(qs, vfresh, dnew, fr, op, s, b, kvh, lane);
      } else if (guessed) {
        put_queries<D, UG>(qs, qv, op.scale, lane);
      } else {
        stage_queries<QT, D, UG>(qs, op, s, b, h0, lane);
      }
      if (i0 == 0) mark_staged_trace();  // trace builds: the extent and q read
      // kv_pages: the ring's unit reads its K and V there, once landed
      // (STREAM: a round's at a time).
      bool paged = false;
      if constexpr (KVP::kOn) {
        paged = b == kv.b && kvh == kv.kvh && j_lo == kv.j0 && kv.rows > 0;
        if (paged && !kv_streams<KVP>()) kv.wait();
      }
      // A paged lane starts its K row at its own 16 bytes of 8: the lanes'
      // rows are D elements apart, and the same column of 8 of them would
      // fall in one bank group.
      const int rot = KVP::kOn && paged ? lane : 0;
      // MPK_DECODE_TAIL_ROWS: the rows past the chunk's whole rounds, when
      // they are no more than its warps, one a warp (tail_score), scored
      // here while qs holds the queries and folded once the rounds' states
      // are in lane columns.
      int j_rounds = j_hi;
      if constexpr (kTail) {
        const int tail = j_hi - j_lo > 32 * cp ? (j_hi - j_lo) % (32 * cp) : 0;
        if (tail > 0 && tail <= cp) {
          j_rounds = j_hi - tail;
          if (sub < tail) {
            const int j = j_rounds + sub;
            float a[UG];
#pragma unroll
            for (int u = 0; u < UG; ++u)
              a[u] = FR && j == pos ? -INFINITY : u == 0 || mask_hs != 0 ? mask.add(j, u * mask_hs) : a[0];
            const VRaw kr = kv_load<VRaw>(kv, paged, j, lane * PER, false, krows + j * ks + lane * PER);
            tail_v = kv_load<VRaw>(kv, paged, j, lane * PER, true, vrows + j * vs + lane * PER);
            tail_score<T, D, UG>(xt, a, kr, qs, lane);
          }
        }
      }
      for (int jg = j_lo + 32 * sub; jg < j_rounds; jg += 32 * cp) {
        const int j = jg + lane;
        if constexpr (kv_streams<KVP>())
          if (paged) {
            const int r0 = (jg - j_lo) / (32 * cp) * 32 * cp;  // the round's first row in the chunk
            kv.rows_ready(r0, min(r0 + 32 * cp, kv.rows));
          }
        float sc[UG];
        bool live = false;
#pragma unroll
        for (int u = 0; u < UG; ++u) {
          sc[u] = j >= j_hi || (FR && j == pos) ? -INFINITY
                  : u == 0 || mask_hs != 0      ? mask.add(j, u * mask_hs)
                                                : sc[0];
          live = live || sc[u] != -INFINITY;
        }
        // q·k of each head for this lane's position: its K row read whatever
        // the mask says (the row is in the cache), so the loads go out with
        // the mask's, not a round trip after them. (V's loads sent out with
        // K's, before the dots, made batch 1 slower: more spills.)
        float dot[UG];
#pragma unroll
        for (int u = 0; u < UG; ++u) dot[u] = 0.f;
        // FR: row pos is being written; a neighbour is read in its place (its
        // score hidden above; fresh_fold adds the new row after the loop).
        const int jk = FR && j == pos ? (j > 0 ? j - 1 : min(j + 1, S - 1)) : min(j, S - 1);
        const T* krow = krows + jk * ks;
        if constexpr (FAST) {
#pragma unroll
          for (int d0 = 0; d0 < D; d0 += KB * KV) {
            uint4 raw[KB];
#pragma unroll
            for (int i = 0; i < KB; ++i) {
              const int d = d0 + (KVP::kOn ? (i + rot) & (KB - 1) : i) * KV;
              raw[i] = kv_load<uint4>(kv, paged, jk, d, false, krow + d);
            }
#pragma unroll
            for (int i = 0; i < KB; ++i) {
              const int d = d0 + (KVP::kOn ? (i + rot) & (KB - 1) : i) * KV;
#pragma unroll
              for (int u = 0; u < UG; ++u) dot[u] += dot_q<T>(raw[i], qs + u * D + d);
            }
          }
        } else if (live) {
          for (int d = 0; d < D; ++d) {
            const float kd = to_float(__ldcg(krow + d * k.stride[3]));
#pragma unroll
            for (int u = 0; u < UG; ++u) dot[u] += qs[u * D + d] * kd;
          }
        }
        const unsigned live_rows = __ballot_sync(0xffffffffu, live);
        // The live rows' V for the lane's columns, VB rows a batch.
        auto load_v = [&](VRaw (&vr)[VB], int r0) {
#pragma unroll
          for (int r = 0; r < VB; ++r) {
            vr[r] = VRaw{};
            const T* vrow = vrows + min(jg + r0 + r, S - 1) * vs;
            if constexpr (FAST) {
              if ((live_rows >> (r0 + r)) & 1u) vr[r] = kv_load<VRaw>(kv, paged, jg + r0 + r, lane * PER, true, vrow + lane * PER);
            } else if ((live_rows >> (r0 + r)) & 1u) {
              T* e = reinterpret_cast<T*>(&vr[r]);
              for (int c = 0; c < PER; ++c) e[c] = __ldcg(vrow + min(lane * PER + c, D - 1) * v.stride[3]);
            }
          }
        };
        float pr[UG];
        if constexpr (kV16) {
          // The lane's 16 bytes of rows rsub + RPL·i, i in [i0, i0 + BATCH).
          const int c0 = lane % V16::LPR * V16::VEC, rsub = lane / V16::LPR;
          auto load_v16 = [&](uint4 (&vr)[V16::BATCH], int i0) {
#pragma unroll
            for (int i = 0; i < V16::BATCH; ++i) {
              const int r = rsub + V16::RPL * (i0 + i);
              vr[i] = make_uint4(0, 0, 0, 0);
              if ((live_rows >> r) & 1u)
                vr[i] = kv_load<uint4>(kv, paged, jg + r, c0, true, vrows + min(jg + r, S - 1) * vs + c0);
            }
          };
          softmax_step(m, l, av, sc, dot, pr);
#pragma unroll 1
          for (int i0 = 0; i0 < V16::LOADS; i0 += V16::BATCH) {
            uint4 vr[V16::BATCH];
            load_v16(vr, i0);
#pragma unroll
            for (int i = 0; i < V16::BATCH; ++i) {
              const T* e = reinterpret_cast<const T*>(&vr[i]);
#pragma unroll
              for (int u = 0; u < UG; ++u) {
                const float pj = __shfl_sync(0xffffffffu, pr[u], rsub + V16::RPL * (i0 + i));
#pragma unroll
                for (int c = 0; c < V16::VEC; ++c) av[u][c] = fmaf(pj, to_float(e[c]), av[u][c]);
              }
            }
          }
          continue;
        }
        VRaw vr[VB];
        load_v(vr, 0);  // in flight during the softmax
        softmax_step(m, l, acc, sc, dot, pr);
        // p·V, batch by batch.
#pragma unroll 1
        for (int r0 = 0; r0 < 32; r0 += VB) {
          if (r0 > 0) load_v(vr, r0);
#pragma unroll
          for (int r = 0; r < VB; ++r) {
            const T* e = reinterpret_cast<const T*>(&vr[r]);
#pragma unroll
            for (int u = 0; u < UG; ++u) {
              const float pj = __shfl_sync(0xffffffffu, pr[u], r0 + r);
#pragma unroll
              for (int c = 0; c < PER; ++c) acc[u][c] = fmaf(pj, to_float(e[c]), acc[u][c]);
            }
          }
        }
      }
      // FR: the warp whose positions hold pos scores the new row there.
      if constexpr (FR)
        if (pos >= j_lo && pos < j_hi && (pos - j_lo) / 32 % cp == sub)
#pragma unroll
          for (int u = 0; u < UG; ++u) {
            const float a = u == 0 || mask_hs != 0 ? mask.add(pos, u * mask_hs) : mask.add(pos);
            xf[u] = a == -INFINITY ? -INFINITY : a + dnew[u];
          }
    }
    if constexpr (kv_streams<KVP>()) kv.drain();  // every warp, every page of the task, before the merge's barrier
    if (i0 == 0) mark_dots_trace();  // trace builds: the first round's K and V done
    if constexpr (kV16)
      if (active) to_lane_columns<T, D, UG>(av, acc, qs, lane);
    if constexpr (kTail)
      if (active) {
        const T* e = reinterpret_cast<const T*>(&tail_v);
        fold_row<UG, PER>(m, l, acc, xt, [&](int c) { return to_float(e[c]); });
      }
    if constexpr (FR)
      if (active) fresh_fold<UG, PER>(m, l, acc, xf, vfresh, lane);
    if (cp > 1) {  // the unit's warps merge into its first
#pragma unroll
      for (int u = 0; u < UG; ++u) store_partial<D>(part + (warp * UG + u) * (D + 2), 1, m[u], l[u], acc[u], lane);
      consumer_sync();
      if (active && sub == 0)
#pragma unroll
        for (int u = 0; u < UG; ++u) merge_states<D, UG>(part, warp, cp, u, lane, acc[u], m[u], l[u]);
    }
    if (active && sub == 0)
#pragma unroll
      for (int u = 0; u < UG; ++u)
        store_partial<D>(reinterpret_cast<float*>(base(s, p)) + p.offset + b * p.stride[0] + sp * p.stride[1] +
                             (h0 + u) * p.stride[2],
                         p.stride[4], m[u], l[u], acc[u], lane);
    if (cp > 1) consumer_sync();  // part is reused by the next round
  }
  // A task with no live unit (a row's extent before the chunk) runs no
  // round above: its pages are released here.
  if constexpr (kv_streams<KVP>()) kv.drain();
  if constexpr (ROWS) consumer_sync();  // row_live is read until the last round
  return ext0;
}

// A batch's kv_pages task (KVPages' STREAM) that codegen marks MMA
// (kvStream.mma) runs its rounds on the tensor cores (kv_batch_mma) instead
// of attention_decode's lanes, whose round of 128 positions took ~3.2 us with
// its pages landed (bench/NOTES.md, forty-ninth session;
// bench/attn_round_mma.cu times the new rounds alone). MPK_KV_BATCH_MMA=0
// (an A/B knob) keeps every task on the lanes.
#ifndef MPK_KV_BATCH_MMA
#define MPK_KV_BATCH_MMA 1
#endif
#ifndef MPK_KV_BATCH_QUIET
#define MPK_KV_BATCH_QUIET 0
#endif

// kv_mma_bytes is kv_batch_mma's shared memory: the G heads' queries and
// new V rows, then every warp's state for each head (merge_states' part),
// then (MPK_DECODE_MMA_QSMEM) the queries' staged rows.
__host__ __device__ constexpr int kv_mma_bytes(int D, int G) {
  return (2 * G * D + kConsumerWarps * G * (D + 2)) * 4 + decode_mma_q_bytes(D);
}

// kv_batch_mma is a batch's kv_pages task (one row's KV head over one
// chunk, its UG one-head units [lo1, hi1)) with its rounds on the tensor
// cores: warp u < G stages head u's rotated query and new row (put_fresh);
// every warp folds 8 positions of all G heads at a time (DecodeMma), the
// mask's adds read a group ahead, taking the pages round by round as
// attention_decode does (rows_ready, drain); the warps' states merge into
// each head's partial, the row the step writes folded in by its head's
// warp (fresh_fold). Liveness, positions and the partials' layout are
// attention_decode's. A unit the ring does not hold (not expected) runs
// attention_decode on the cache. The rows every head hides are zeroed
// before P·V reads them (a NaN in a hidden row must not leak in).
template <typename T, typename QT, typename MT, int D, int G, int R, class SH, class FT, class KV, int N>
__device__ __noinline__ void kv_batch_mma(const Op& op, int lo1, int hi1, const Slots<N>& s, char* smem, KV kv) {
  static_assert(KV::kStream && !std::is_void<FT>::value, "kv_batch_mma: a batch's streamed fresh-row task");
  constexpr int S = SH::S, splits = SH::SPLITS, chunk = (S + splits - 1) / splits, PER = (D + 31) / 32;
  constexpr int RR = 32 * decode_unit_warps(chunk, G), STEP = 8 * kConsumerWarps;  // a round's rows; a pass of the warps
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, t = lane % 4, g = lane / 4;
  float* qs = reinterpret_cast<float*>(smem);  // [G][D], pre-scaled
  float* vf = qs + G * D;                       // [G][D]: the new V row, its staging warp's copy
  float* part = vf + G * D;                     // [warps][G][D + 2]
  T* qst = reinterpret_cast<T*>(part + kConsumerWarps * G * (D + 2));  // MPK_DECODE_MMA_QSMEM: [2][8][D + 8]
  int ext0 = -1;
  if (op.flags & FLAG_EXTENT) {
    const View& e = op.in[4];
    ext0 = __ldcg(reinterpret_cast<const int32_t*>(base(s, e)) + e.offset + kv.b * e.stride[0]);
  }
  const DecodeUnits<R, false> du(op, lo1, hi1, splits, chunk, 1, SH::H, nullptr, s, ext0);
  const DecodeUnit un = du.unit(0, splits, 1);
  const int S_live = op.flags & FLAG_CAUSAL ? min(S, 1) : S;
  const int j_lo = min(du.g.chunk(un.sp) * chunk, S_live), j_hi = min(j_lo + chunk, S_live);
  if (du.n == 0) {  // every position past the row's extent: no partial, the pages released
    kv.drain();
    return;
  }
  if (un.b != kv.b || un.h0 / SH::G != kv.kvh || j_lo != kv.j0 || kv.rows <= 0) {
    kv.drain();
    attention_decode<T, QT, MT, D, R, false, true, 1, SH, FT>(op, lo1, hi1, s, smem);
    return;
  }
  const int pos = fresh_position(op, s, S);
  const MaskRow<MT> mask = mask_row<MT>(op, s, kv.b, un.h0);
  int64_t mask_hs = 0;
  if constexpr (G > 1 && !std::is_void<MT>::value) mask_hs = op.in[3].stride[1];
  // The lane's adds at positions j and j + 1 (row g's head; -inf hides).
  auto adds = [&](int j, float (&a)[2]) {
#pragma unroll
    for (int e = 0; e < 2; ++e)
      a[e] = j + e >= j_hi || j + e == pos ? -INFINITY
             : g < G                      ? mask.add(j + e, g * mask_hs)
                                          : 0.f;
  };
  float a_next[2];
  adds(j_lo + 8 * warp + 2 * t, a_next);  // in flight while the queries stage
  float dnew[1] = {-INFINITY};
  if (warp < G) {
    FreshQ<D, 1> fr;
    load_fresh_q<FT, QT, D, 1>(fr, op, s, kv.b, un.h0 + warp, lane);
    put_fresh<FT, QT, T, D, 1>(qs + warp * D, vf + warp * D, dnew, fr, op, s, kv.b, kv.kvh, lane);
  }
  consumer_sync();
  mark_staged_trace();  // trace builds: the extent and queries read
  using DM = DecodeMma<T, D, G, KV::kBlock>;  // (kBlock: the pages swizzled)
  DM::stage_q(qs, qst);
  if constexpr (kDecodeMmaQSmem) consumer_sync();
  DM st;
  st.init(qs, qst);
  const int rows = kv.rows;
  for (int p = 8 * warp, round = -1; p < rows; p += STEP) {
    if (p / RR != round) {
      round = p / RR;
      kv.rows_ready(round * RR, min(round * RR + RR, rows));
    }
    const float a0 = a_next[0], a1 = a_next[1];
    if (p + STEP < rows) adds(j_lo + p + STEP + 2 * t, a_next);
    const uint32_t kr = kv.at(kv.j0 + p, 0, false), vr = kv.at(kv.j0 + p, 0, true);
    // The V rows of positions every head hides (past the chunk, the row
    // the step writes, the mask's): zeroed in the page (only this warp
    // reads them), since P is 0 there but 0 times a NaN is NaN (a cache's
    // unwritten rows, a page's bytes past the chunk), where the lanes'
    // loop never reads such a row. Position 2t + e is lane 4g + t's.
    const unsigned h0 = __ballot_sync(0xffffffffu, g >= G || a0 == -INFINITY);
    const unsigned h1 = __ballot_sync(0xffffffffu, g >= G || a1 == -INFINITY);
    unsigned hidden = 0;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const unsigned all = 0x11111111u << q;
      hidden |= ((h0 & all) == all ? 1u : 0u) << (2 * q) | ((h1 & all) == all ? 1u : 0u) << (2 * q + 1);
    }
    if (hidden) {
      for (int i = lane; i < 8 * D / 2; i += 32)
        if (hidden >> (i / (D / 2)) & 1u) {
          // (swizzled: row i / (D / 2)'s 32 words a column block, whichever order its chunks are in)
          const uint32_t at = KV::kBlock ? vr + i / (D / 2) * 128 + i % (D / 2) / 32 * KV::kBlock + i % 32 * 4 : vr + 4 * i;
          asm volatile("st.shared.u32 [%0], %1;" ::"r"(at), "r"(0u) : "memory");
        }
      __syncwarp();
    }
    st.fold(kr, vr, a0, a1);
  }
  kv.drain();  // every warp, every page of the task, before the merge's barrier
  st.stash(part, warp);
  consumer_sync();
  if (warp < G) {
    float m[1], l[1], acc[1][PER];  // head warp's state, as fresh_fold takes it
    merge_states<D, G>(part, 0, kConsumerWarps, warp, lane, acc[0], m[0], l[0]);
    if (pos >= j_lo && pos < j_hi) {  // the row the step writes: dnew and vf (put_fresh)
      const float a = mask.add(pos, warp * mask_hs);
      const float xf[1] = {a == -INFINITY ? -INFINITY : a + dnew[0]};
      fresh_fold<1, PER>(m, l, acc, xf, vf + warp * D, lane);
    }
    const View& p = op.out;
    store_partial<D>(reinterpret_cast<float*>(base(s, p)) + p.offset + kv.b * p.stride[0] + un.sp * p.stride[1] +
                         (un.h0 + warp) * p.stride[2],
                     p.stride[4], m[0], l[0], acc[0], lane);
  }
  mark_dots_trace();  // trace builds: every round done
}

// attention_kv_pages is a kv_pages attention task (codegen's kvStream): one
// unit, UG query heads of one KV head over one chunk, whose K and V rows the
// loader streamed into the ring while the task waited for its queries. Its
// heads run as UG units of one head side by side, a warp's chain a head's
// (one warp doing all UG heads' dots and softmaxes took 1.3x the time of
// a head's chain on llama-3.2-1b): with one split a group (R = SPLITS,
// codegen's kvStreamOf) the one-head units of split sp for heads h .. h +
// UG - 1 are [lo1, lo1 + UG·SPLITS) of that numbering (DecodeUnits). Then
// every consumer warp releases the pages, each once landed (a slot
// released with a copy in flight could be refilled under it). BATCH: the
// op's batch rows are more than one (kv_pages_batch), a task one row's,
// whose pages stream round by round (KVPages' STREAM: the warps release
// them as they go, so the chunk may outgrow the ring); MMA (codegen's
// kvStream.mma): its rounds on the tensor cores (kv_batch_mma); SWZ
// (codegen's kvStream.Swizzle): its pages landed 128-byte swizzled
// (KVPages). Returns the consumers' new place in the ring. LIVE (codegen's kvLiveExtent): the
// loader streams the chunk's rows below the mask's extent only, which the
// task reads (in[4]) and hands to it (s_kv_extent): on the fast path
// attention_decode reads it with the queries (reading it first, one round
// trip before them, was 0.4% slower on llama-3.2-1b and 0.6% on qwen3-8b at
// 4,096 cached on the H100: bench/NOTES.md, thirty-sixth session), else
// first.
template <typename T, typename QT, typename MT, int D, int G, int R, bool ROWS, int UG, class SH, class FT, int P,
          bool LIVE, bool BATCH, bool MMA, bool SWZ, int N>
__device__ __noinline__ uint32_t attention_kv_pages(const Op& op, int lo, int hi, const Slots<N>& s, const Ctx c) {
  static_assert(!ROWS && !std::is_void<FT>::value && decode_fast_dims<T, D>() && R == SH::SPLITS,
                "kv_pages: a fresh-row decode attention task of one batch row, one split a group, with vector loads");
  constexpr int splits = SH::SPLITS, S = SH::S, chunk = (S + splits - 1) / splits, units = SH::H / UG;
  // The task's unit: batch row b's head unit (codegen's kvStream.first);
  // BATCH: the op has more than one row (kv_pages_batch).
  const int sp = lo % splits, b = BATCH ? lo / splits / units : 0, j0 = min(sp * chunk, S);
  const int h0 = (BATCH ? lo / splits % units : lo / splits) * UG;
  // BATCH: the pages stream round by round (KVPages' STREAM).
  using KV = KVPages<T, D, P, UG, BATCH, SWZ>;
  static_assert(!SWZ || (BATCH && MMA && MPK_KV_BATCH_MMA), "swizzled kv pages: only kv_batch_mma reads them");
  KV kv{ring_at<P>(c.ring), c.seq, b, h0 / G, j0, min(chunk, S - j0), c.abort, LIVE};
  const int lo1 = (b * SH::H + h0) * splits + sp, hi1 = lo1 + UG * splits;
  const bool fast = decode_rows_ok<T, D>(op.in[1], op.in[2], base(s, op.in[1]), base(s, op.in[2]));
  constexpr int rpp = KV::RPP;
  // (STREAM: a round's pages; codegen's kvStream.fits)
  constexpr bool small_ring = BATCH ? 2 * kv_round_pairs(32 * decode_unit_warps(chunk, UG), rpp) > P
                                    : 2 * ((chunk + rpp - 1) / rpp) > P;
  if (LIVE && (small_ring || !fast)) {
    const View& e = op.in[4];
    const int extent = __ldcg(reinterpret_cast<const int32_t*>(base(s, e)) + e.offset);
    if (threadIdx.x == 0) *(volatile int32_t*)&s_kv_extent = extent;
    kv.cut(extent);
  }
  if constexpr (small_ring) {
    // A ring too small for the chunk's K and V at once (codegen's
    // kvStream.fits): the loader streamed nothing, the units read the cache.
    if (fast)
      attention_decode<T, QT, MT, D, R, false, true, 1, SH, FT>(op, lo1, hi1, s, c.smem);
    else
      attention_decode<T, QT, MT, D, R, false, false, 1, SH, FT>(op, lo1, hi1, s, c.smem);
    return c.seq;
  } else {
    static_assert(!(BATCH && LIVE), "a batch's kv streams are whole chunks (codegen's kvLiveExtent)");
    if (fast && BATCH) {
      // The loader at its full depth while the task streams its pages; the
      // task releases every page itself (KVPages::drain).
      // MPK_KV_BATCH_QUIET=1 (an A/B knob, not yet run): its quiet depth
      // instead. At batch 8 a task's pages have all landed when it starts
      // (8 of the ring's pages), so the pages in flight are the next stage's
      // weights, and they lengthen the task's own L2 round trips (its
      // queries, the new rows, the mask: bench/hop.cu, 2.2x at two pages).
      if (!MPK_KV_BATCH_QUIET) set_dots_phase(1);
      if constexpr (MMA && MPK_KV_BATCH_MMA)
        kv_batch_mma<T, QT, MT, D, UG, R, SH, FT>(op, lo1, hi1, s, c.smem, kv);
      else
        attention_decode<T, QT, MT, D, R, false, true, 1, SH, FT>(op, lo1, hi1, s, c.smem, kv);
      set_dots_phase(0);
      return c.seq + 2 * kv.pages();
    }
    if (fast)
      kv.cut(attention_decode<T, QT, MT, D, R, false, true, 1, SH, FT>(op, lo1, hi1, s, c.smem, kv));
    else
      attention_decode<T, QT, MT, D, R, false, false, 1, SH, FT>(op, lo1, hi1, s, c.smem);
    const int n = 2 * kv.pages();
    for (int i = 0; i < n; ++i) {
      wait_page(kv.ring, c.seq + i, c.abort);
      kv.ring.release(c.seq + i);
    }
    return c.seq + n;
  }
}

// MPK_ROWS_MMA=1 (the default since the thirtieth session, bench/NOTES.md:
// with long_attention_chunks, a 64-token chunk 6.02 -> 5.28 ms):
// attention_rows multiplies on the tensor cores (attention_rows_mma) where
// rows_mma_shape holds; 0 keeps the scalar body.
#ifndef MPK_ROWS_MMA
#define MPK_ROWS_MMA 1
#endif

// rows_mma_parts: the parts a head's output columns are cut into, a warp
// each, so a warp's outputs (16 rows × at most 64 columns) stay in
// registers under the megakernel's cap (D = 128: two warps compute the same
// scores, each keeps half the columns).
__host__ __device__ constexpr int rows_mma_parts(int D) { return D <= 64 ? 1 : 2; }

// rows_mma_shape: head dims of whole k16 steps up to 128 whose parts are
// whole k16 steps too, and G query heads (at most 4: the staged mask's
// bytes) that split the consumer warps evenly, a head's warps into whole
// parts.
__host__ __device__ constexpr bool rows_mma_shape(int D, int G) {
  return D % 16 == 0 && D <= 128 && D % (16 * rows_mma_parts(D)) == 0 && G >= 1 && G <= 4 &&
         kConsumerWarps % G == 0 && kConsumerWarps / G % rows_mma_parts(D) == 0;
}

// Row pitches (floats) of attention_rows_mma's mask adds and summed outputs:
// 8 past the row, so a warp's float2 accesses of rows g = 0..7 (8 floats
// apart in banks) take the two wavefronts 256 bytes need, where rows of 64
// or 128 floats put all eight rows in one bank (8-way conflicts: the sums'
// read-modify-writes were most of a 64-token chunk's ~8 us task epilogue).
__host__ __device__ constexpr int rows_mma_mask_pitch(int C) { return (C + 15) / 16 * 16 + 8; }
__host__ __device__ constexpr int rows_mma_out_pitch(int D) { return D + 8; }

// attention_rows_mma_bytes: two tiles of C rows of K and of V (padded by 8
// elements; C rounded up to whole groups of 16 positions), whose bytes the
// G heads' summed outputs reuse once every tile is read; the G heads' 16
// query rows as hi and lo halves (padded by 8), a tile of mask adds for
// each head, the rows' seen counts, each warp's row maxima, and the G
// heads' sums.
__host__ __device__ constexpr int rows_mma_tiles_bytes(int C, int D, int G) {
  const int tiles = 4 * ((C + 15) / 16 * 16) * (D + 8) * 2, sums = G * 16 * rows_mma_out_pitch(D) * 4;
  return tiles > sums ? tiles : sums;
}
__host__ __device__ constexpr int attention_rows_mma_bytes(int C, int D, int G) {
  return rows_mma_tiles_bytes(C, D, G) + 2 * G * 16 * (D + 8) * 2 + G * 16 * rows_mma_mask_pitch(C) * 4 + 16 * 4 +
         kConsumerWarps * 16 * 4 + G * 16 * 4;
}

// attention_rows_bytes is attention_rows' shared memory (codegen's
// sharedKVBytes): a tile of C rows of K and of V, each padded by 8
// elements, and every warp's G pre-scaled queries; or, with a shape the
// tensor cores take, attention_rows_mma's if larger (codegen reserves it
// whatever MPK_ROWS_MMA says).
__host__ __device__ constexpr int attention_rows_bytes(int C, int D, int G) {
  return rows_mma_shape(D, G) && attention_rows_mma_bytes(C, D, G) > 2 * C * (D + 8) * 2 + kConsumerWarps * G * D * 4
             ? attention_rows_mma_bytes(C, D, G)
             : 2 * C * (D + 8) * 2 + kConsumerWarps * G * D * 4;
}

// stage_kv_tile copies nc rows of K and of V from kb and vb (position
// strides ks_, vs_) into a tile of rows of KP elements.
template <typename T, int D, int KP>
__device__ __forceinline__ void stage_kv_tile(T* ks, T* vs, const T* kb, const T* vb, const View& k, const View& v,
                                              int c0, int nc, bool aligned) {
  constexpr int V16 = 8;
  if (aligned) {
    for (int i = threadIdx.x; i < nc * (D / V16); i += MPK_THREADS) {
      const int j = i / (D / V16), c = i % (D / V16) * V16;
      *reinterpret_cast<uint4*>(ks + j * KP + c) = __ldcg(reinterpret_cast<const uint4*>(kb + (c0 + j) * k.stride[2] + c));
      *reinterpret_cast<uint4*>(vs + j * KP + c) = __ldcg(reinterpret_cast<const uint4*>(vb + (c0 + j) * v.stride[2] + c));
    }
  } else {
    for (int i = threadIdx.x; i < nc * D; i += MPK_THREADS) {
      const int j = i / D, c = i % D;
      ks[j * KP + c] = __ldcg(kb + (c0 + j) * k.stride[2] + c * k.stride[3]);
      vs[j * KP + c] = __ldcg(vb + (c0 + j) * v.stride[2] + c * v.stride[3]);
    }
  }
}

// kv_tile_async is stage_kv_tile with 16-byte cp.async copies where the
// rows are aligned: in flight, holding no registers, until the caller's
// cp_async_wait_all and barrier.
template <typename T, int D, int KP>
__device__ __forceinline__ void kv_tile_async(T* ks, T* vs, const T* kb, const T* vb, const View& k, const View& v,
                                              int c0, int nc, bool aligned) {
  if (!aligned) {
    stage_kv_tile<T, D, KP>(ks, vs, kb, vb, k, v, c0, nc, false);
    return;
  }
  constexpr int V16 = 8;
  for (int i = threadIdx.x; i < nc * (D / V16); i += MPK_THREADS) {
    const int j = i / (D / V16), c = i % (D / V16) * V16;
    cp_async_16(smem_u32(ks + j * KP + c), kb + (c0 + j) * k.stride[2] + c);
    cp_async_16(smem_u32(vs + j * KP + c), vb + (c0 + j) * v.stride[2] + c);
  }
}

// from_float rounds a float to a 2-byte element (to nearest even).
template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }

// ldsm_x4_trans loads four 8×8 matrices of 2-byte elements transposed: the
// B fragments of two m16n8k16 n-tiles from a row-major [k][n] tile (lane i
// gives the address of row i % 16 of the tile at column 8·(i / 16)).
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const void* p) { ldsm_x4_t(r, smem_u32(p)); }

// live_chunk_of mirrors ir.LiveChunk: the positions a split covers when
// the longest row's extent is `extent`, cut evenly over the splits in whole
// groups of 16. A prompt chunk's attention with a mask extent (FLAG_EXTENT)
// cuts its chunks so, not from the capacity: a 64-token chunk after 512
// tokens in a cache of 776 took chunks of 194 (4 tiles of the task, a
// fourth of the tasks empty), now 144. The merge reads every split.
__host__ __device__ constexpr int live_chunk_of(int extent, int splits) {
  return ((extent > 1 ? extent : 1) + splits - 1) / splits + 15 & ~15;
}

// row_end is where row's visible positions end: its mask extent (in[4])
// with FLAG_EXTENT, else S.
template <int N>
__device__ __forceinline__ int row_end(const Op& op, const Slots<N>& s, int row, int S) {
  if (!(op.flags & FLAG_EXTENT)) return S;
  return __ldcg(reinterpret_cast<const int32_t*>(base(s, op.in[4])) + op.in[4].offset + row * op.in[4].stride[0]);
}

// seen_in_chunk is how many positions of the chunk [j_lo, j_lo + n) a row
// whose visible positions end at `end` sees.
__device__ __forceinline__ int seen_in_chunk(int end, int j_lo, int n) { return max(0, min(end - j_lo, n)); }

// rows_seen is how many positions of the chunk [j_lo, j_lo + n) row sees:
// with FLAG_EXTENT those below its mask's extent (in[4]), else all.
template <int N>
__device__ __forceinline__ int rows_seen(const Op& op, const Slots<N>& s, int row, int j_lo, int n) {
  return seen_in_chunk(row_end(op, s, row, j_lo + n), j_lo, n);
}

// longest_extent_lane is, with FLAG_EXTENT, the largest extent of the rows
// threadIdx.x, threadIdx.x + MPK_THREADS, ... of B; 0 without.
// longest_extent_warp is its largest over the warp (every warp's share; the
// block's is the largest of its warps').
template <int N>
__device__ __forceinline__ int longest_extent_lane(const Op& op, const Slots<N>& s, int B) {
  if (!(op.flags & FLAG_EXTENT)) return 0;
  int e = 0;
  for (int r = threadIdx.x; r < B; r += MPK_THREADS) e = max(e, row_end(op, s, r, 0));
  return e;
}
template <int N>
__device__ __forceinline__ int longest_extent_warp(const Op& op, const Slots<N>& s, int B) {
  return __reduce_max_sync(0xffffffffu, longest_extent_lane(op, s, B));
}

// attention_rows_mma is attention_rows on the tensor cores (m16n8k16, fp32
// accumulators): the task's (at most 16) rows are an m-tile, a warp takes
// one of the G heads, one part of its output columns (rows_mma_parts) and
// every (16 / G / parts)-th group of 16 positions of each tile. S = q·Kᵀ with q split into hi + lo (K is exact), the online softmax
// per row across the quad's lanes, then O += P·V with P split into hi + lo
// (its accumulators are the A fragment as they stand; V's B fragments come
// transposed by ldmatrix). A head's warps meet at the end: their maxima,
// then their rescaled sums and outputs added in warp order (deterministic).
// Rows, extents, masks and the partials written are attention_rows'.
template <typename T, typename QT, typename MT, int D, int G, int C, int N>
__device__ void attention_rows_mma(const Op& op, int lo, int hi, const Slots<N>& s, char* smem) {
  constexpr int KP = D + 8, QP = D + 8, W = kConsumerWarps / G, CT = (C + 15) / 16 * 16;
  constexpr int MP = rows_mma_mask_pitch(C), OP = rows_mma_out_pitch(D);  // mask adds' and sums' row pitches
  constexpr int H = rows_mma_parts(D), DP = D / H, NT = DP / 8, WP = W / H;  // parts, their columns, position lanes
  const View &q = op.in[0], &k = op.in[1], &v = op.in[2], &p = op.out;
  const int B = (int)q.shape[0], S = (int)k.shape[2], splits = (int)p.shape[1];
  const int gs = lo / B, r0 = lo % B, rows = hi - lo;
  const int sp = gs % splits, h0 = gs / splits * G, kvh = h0 / op.groups;
  const bool live = op.flags & FLAG_EXTENT;  // chunks cut from the live length (live_chunk_of)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int u = warp / W, sub = warp % W / H, part = warp % H;
  T* ks = reinterpret_cast<T*>(smem);      // [2][CT][KP]: a tile read while the next lands
  T* vs = ks + 2 * CT * KP;                // [2][CT][KP]
  float* os = reinterpret_cast<float*>(smem);  // [G][16][OP] once every tile is read (over ks and vs)
  T* qh = reinterpret_cast<T*>(smem + rows_mma_tiles_bytes(C, D, G));  // [G][16][QP]
  T* ql = qh + G * 16 * QP;                // [G][16][QP]
  float* mt = reinterpret_cast<float*>(ql + G * 16 * QP);  // [G][16][MP] mask adds
  int* seen = reinterpret_cast<int*>(mt + G * 16 * MP);    // [16] the rows' ends (row_end), then what they see
  float* mw = reinterpret_cast<float*>(seen + 16);         // [warps][16] row maxima
  float* ls = mw + kConsumerWarps * 16;                    // [G][16]
  const int64_t mask_hs = !std::is_void<MT>::value && G > 1 ? op.in[3].stride[1] : 0;
  // The rows' ends (their extents), every row's for the longest (live), and
  // the queries, loaded together (one round trip, where a loop storing each element
  // before the next load took one a load: ~5 us a task), then the queries
  // pre-scaled and split; rows past the task's are zeros that see nothing.
  constexpr int QE = (G * 16 * D + MPK_THREADS - 1) / MPK_THREADS;  // query elements a thread
  const int hm = mask_hs != 0 ? G : 1;  // heads of staged mask adds
  const int my_end = threadIdx.x < rows && threadIdx.x < 16 ? row_end(op, s, r0 + threadIdx.x, S) : 0;
  // Reduced over the warp once the queries' loads are issued (a reduction
  // before them waited for the extents: two round trips, not one).
  const int lane_longest = live ? longest_extent_lane(op, s, B) : 0;
  float qx[QE];
#pragma unroll
  for (int e = 0; e < QE; ++e) {
    const int i = threadIdx.x + e * MPK_THREADS, uu = i / (16 * D), row = i / D % 16, d = i % D;
    qx[e] = i < G * 16 * D && row < rows
                ? ld_typed(reinterpret_cast<const QT*>(base(s, q)) + q.offset + (r0 + row) * q.stride[0] +
                           (h0 + uu) * q.stride[1] + d * q.stride[3])
                : 0.f;
  }
  const int longest = live ? __reduce_max_sync(0xffffffffu, lane_longest) : 0;
  if (threadIdx.x < 16) seen[threadIdx.x] = my_end;
  if (live && lane == 0) reinterpret_cast<int*>(mw)[warp] = longest;  // mw holds row maxima only after the tiles
#pragma unroll
  for (int e = 0; e < QE; ++e) {
    const int i = threadIdx.x + e * MPK_THREADS, uu = i / (16 * D), row = i / D % 16, d = i % D;
    if (i >= G * 16 * D) break;
    const float x = qx[e] * op.scale;
    const T xh = from_float<T>(x);
    qh[(uu * 16 + row) * QP + d] = xh;
    ql[(uu * 16 + row) * QP + d] = from_float<T>(x - to_float(xh));
  }
  consumer_sync();
  mark_staged_trace();  // trace builds: the extents and queries read
  int chunk = (S + splits - 1) / splits;
  if (live) {
    int e = 0;
#pragma unroll
    for (int w = 0; w < kConsumerWarps; ++w) e = max(e, reinterpret_cast<const int*>(mw)[w]);
    chunk = live_chunk_of(e, splits);
  }
  const int j_lo = min(sp * chunk, S), n = min(j_lo + chunk, S) - j_lo;
  // The positions of the chunk row i sees (up to its end).
  auto row_seen = [&](int i) { return seen_in_chunk(seen[i], j_lo, n); };
  int n_task = 0;
#pragma unroll
  for (int i = 0; i < 16; ++i) n_task = max(n_task, row_seen(i));
  // No row sees the chunk (it lies past every row's extent): an empty
  // softmax (max -inf, sum 0) for each row, which the merge skips. Every
  // thread read the same seen[] after the barrier.
  if (n_task == 0) {
    float* pbase = reinterpret_cast<float*>(base(s, p));
    for (int i = threadIdx.x; i < G * rows * 2; i += MPK_THREADS) {
      const int uu = i / (rows * 2), row = i / 2 % rows, e = i % 2;
      pbase[p.offset + (r0 + row) * p.stride[0] + sp * p.stride[1] + (h0 + uu) * p.stride[2] + e * p.stride[4]] =
          e == 0 ? -INFINITY : 0.f;
    }
    return;
  }
  const int nr[2] = {row_seen(g), row_seen(g + 8)};
  // A tile's mask adds as flat units i over [hm][16 rows][nn positions]
  // from position c of the chunk: the add, and its place in mt.
  auto tile_add = [&](int i, int c, int nn) {
    const int row = i / nn % 16;
    return row < rows ? mask_row<MT>(op, s, r0 + row, h0).add(j_lo + c + i % nn, i / (16 * nn) * mask_hs) : -INFINITY;
  };
  auto tile_slot = [&](int i, int nn) -> float& { return mt[(i / (16 * nn) * 16 + i / nn % 16) * MP + i % nn]; };
  // The chunk's K and V rows, derived where each tile's copies issue (after
  // a barrier, so from the task's descriptor and slots in shared memory)
  // rather than held across the tiles, where ptxas spilled them and every
  // tile reloaded them from local memory.
  auto chunk_at = [&](const View& kv) {
    return reinterpret_cast<const T*>(base(s, kv)) + kv.offset + kvh * kv.stride[1] + j_lo * kv.stride[2];
  };
  const bool aligned = rows_aligned<T>(k, base(s, k), 16) && rows_aligned<T>(v, base(s, v), 16);
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, acc[NT][4];
#pragma unroll
  for (int i = 0; i < NT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
  const T* qhu = qh + u * 16 * QP;
  const T* qlu = ql + u * 16 * QP;
  // The first tile's K and V copies are in flight while its mask's adds
  // load; each later tile's while the one before is multiplied.
  kv_tile_async<T, D, KP>(ks, vs, chunk_at(k), chunk_at(v), k, v, 0, min(C, n_task), aligned);
  for (int c0 = 0, buf = 0; c0 < n_task; c0 += C, buf ^= 1) {
    const int nc = min(C, n_task - c0), ncg = (nc + 15) / 16 * 16;
    const int tile = buf * CT * KP;  // this tile's buffer
#ifdef MPK_TRACE
    // Trace builds: a task's stall is its tiles' zero fills, mask adds
    // (their loads' round trips) and waits for K, V and the other warps.
    const uint64_t t_wait = threadIdx.x == 0 ? globaltimer() : 0;
#endif
    // The last group's rows past the chunk: zeros (a finite V for P = 0).
    for (int i = threadIdx.x; i < (ncg - nc) * D; i += MPK_THREADS) {
      const int j = nc + i / D, c = i % D;
      ks[tile + j * KP + c] = from_float<T>(0.f);
      vs[tile + j * KP + c] = from_float<T>(0.f);
    }
    // The tile's mask adds. At D 64 two loads of a thread are in flight at
    // once (a mask shared by the heads: one round trip; a loop storing each
    // before the next load took one a load); at D 128 that spilled. (Loading
    // them a tile ahead, or tile 0's with the queries, was no faster on the
    // H100: bench/NOTES.md, thirty-sixth session.)
    if constexpr (!std::is_void<MT>::value) {
      if constexpr (D <= 64) {
        const int total = hm * 16 * nc;
        for (int i = threadIdx.x; i < total; i += 2 * MPK_THREADS) {
          const int i2 = i + MPK_THREADS;
          const float a = tile_add(i, c0, nc), b = i2 < total ? tile_add(i2, c0, nc) : 0.f;
          tile_slot(i, nc) = a;
          if (i2 < total) tile_slot(i2, nc) = b;
        }
      } else {
        for (int i = threadIdx.x; i < hm * 16 * nc; i += MPK_THREADS) {
          const int uu = i / (16 * nc), row = i / nc % 16, jj = i % nc;
          mt[(uu * 16 + row) * MP + jj] =
              row < rows ? mask_row<MT>(op, s, r0 + row, h0).add(j_lo + c0 + jj, uu * mask_hs) : -INFINITY;
        }
      }
    }
    cp_async_wait_all();
    consumer_sync();
#ifdef MPK_TRACE
    if (threadIdx.x == 0) s_trace_stall += (uint32_t)(globaltimer() - t_wait);
#endif
    // The other buffer was last read before the barrier that ended the tile before.
    if (c0 + C < n_task)
      kv_tile_async<T, D, KP>(ks + (CT * KP - tile), vs + (CT * KP - tile), chunk_at(k), chunk_at(v), k, v, c0 + C,
                              min(C, n_task - c0 - C), aligned);
    // The groups of 16 positions this warp takes: every WP-th across tiles.
    for (int pb = ((sub - (c0 / 16) % WP) % WP + WP) % WP * 16; pb < nc; pb += WP * 16) {
      float sc[2][4] = {};
#pragma unroll
      for (int k0 = 0; k0 < D; k0 += 16) {
        // The queries' fragments, reloaded every group (volatile loads):
        // hoisted out of the group loop by the compiler they took 32 (D 64)
        // or 64 (D 128) registers for the whole loop, and ptxas spilled.
        auto lq = [&](const T* at) { return ld_shared_raw<uint32_t>(smem_u32(at)); };
        const uint32_t a0 = lq(qhu + g * QP + k0 + 2 * t), a1 = lq(qhu + (g + 8) * QP + k0 + 2 * t);
        const uint32_t a2 = lq(qhu + g * QP + k0 + 8 + 2 * t), a3 = lq(qhu + (g + 8) * QP + k0 + 8 + 2 * t);
        const uint32_t b0 = lq(qlu + g * QP + k0 + 2 * t), b1 = lq(qlu + (g + 8) * QP + k0 + 2 * t);
        const uint32_t b2 = lq(qlu + g * QP + k0 + 8 + 2 * t), b3 = lq(qlu + (g + 8) * QP + k0 + 8 + 2 * t);
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          const T* kr = ks + tile + (pb + nt * 8 + g) * KP + k0 + 2 * t;
          const uint32_t k0r = ld_shared_raw<uint32_t>(smem_u32(kr)), k1r = ld_shared_raw<uint32_t>(smem_u32(kr + 8));
          mma_16816<T>(sc[nt], a0, a1, a2, a3, k0r, k1r);
          mma_16816<T>(sc[nt], b0, b1, b2, b3, k0r, k1r);
        }
      }
      // Scores (-inf: hidden, past the chunk or the row's extent), then the
      // online softmax of rows g and g + 8 over the quad's 16 positions.
      float pr[2][4];
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        float x[4], mx = -INFINITY;
        // The row's adds at the lane's positions, a float2 an n-tile (the
        // tile's positions past nc, up to CT < MP, are never used).
        float2 adds[2] = {};
        if constexpr (!std::is_void<MT>::value)
#pragma unroll
          for (int nt = 0; nt < 2; ++nt)
            adds[nt] = ld_shared_raw<float2>(smem_u32(mt + ((mask_hs != 0 ? u : 0) * 16 + g + 8 * hr) * MP + pb + nt * 8 + 2 * t));
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int nt = e / 2, c = hr * 2 + e % 2, pos = pb + nt * 8 + 2 * t + e % 2;
          const float add = e % 2 ? adds[nt].y : adds[nt].x;
          x[e] = pos < nc && c0 + pos < nr[hr] && add != -INFINITY ? sc[nt][c] + add : -INFINITY;
          mx = fmaxf(mx, x[e]);
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float mnew = fmaxf(m[hr], mx);
        const float corr = mnew == -INFINITY ? 1.f : __expf(m[hr] - mnew);
        float sum = 0.f;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          pr[hr][e] = x[e] != -INFINITY ? __expf(x[e] - mnew) : 0.f;
          sum += pr[hr][e];
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        l[hr] = l[hr] * corr + sum;
        m[hr] = mnew;
#pragma unroll
        for (int i = 0; i < NT; ++i) acc[i][2 * hr] *= corr, acc[i][2 * hr + 1] *= corr;
      }
      // P as A fragments (rows g, g + 8; positions 2t.. of each n-tile), hi and lo.
      uint32_t ph[4], pl[4];
#pragma unroll
      for (int f = 0; f < 4; ++f) {
        const int hr = f % 2, nt = f / 2;  // a0: (g, nt 0), a1: (g + 8, nt 0), a2: (g, nt 1), a3: (g + 8, nt 1)
        const float x0 = pr[hr][nt * 2], x1 = pr[hr][nt * 2 + 1];
        const T h0e = from_float<T>(x0), h1e = from_float<T>(x1);
        ph[f] = pack2<T>(to_float(h0e), to_float(h1e));
        pl[f] = pack2<T>(x0 - to_float(h0e), x1 - to_float(h1e));
      }
#pragma unroll
      for (int d0 = 0; d0 < DP; d0 += 16) {
        uint32_t b[4];
        ldsm_x4_trans(b, vs + tile + (pb + lane % 16) * KP + part * DP + d0 + lane / 16 * 8);
        mma_16816<T>(acc[d0 / 8], ph[0], ph[1], ph[2], ph[3], b[0], b[1]);
        mma_16816<T>(acc[d0 / 8], pl[0], pl[1], pl[2], pl[3], b[0], b[1]);
        mma_16816<T>(acc[d0 / 8 + 1], ph[0], ph[1], ph[2], ph[3], b[2], b[3]);
        mma_16816<T>(acc[d0 / 8 + 1], pl[0], pl[1], pl[2], pl[3], b[2], b[3]);
      }
    }
    consumer_sync();  // the tile is read until the last group
  }
  mark_dots_trace();  // trace builds: every tile multiplied
  // A head's W warps: the rows' maxima (a part's warps have the same), then
  // their rescaled outputs (each part its columns) and sums (part 0's) added
  // in warp order.
  if (t == 0) mw[warp * 16 + g] = m[0], mw[warp * 16 + g + 8] = m[1];
  consumer_sync();
  float f[2];
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    float M = -INFINITY;
    for (int w = 0; w < W; ++w) M = fmaxf(M, mw[(u * W + w) * 16 + g + 8 * hr]);
    f[hr] = m[hr] == -INFINITY ? 0.f : __expf(m[hr] - M);
  }
  for (int w = 0; w < WP; ++w) {
    if (sub == w) {
#pragma unroll
      for (int i = 0; i < NT; ++i)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {  // columns 2t, 2t + 1 of row g + 8hr: one float2
          const uint32_t o = smem_u32(os + (u * 16 + g + 8 * hr) * OP + part * DP + i * 8 + 2 * t);
          const float2 x = make_float2(acc[i][2 * hr] * f[hr], acc[i][2 * hr + 1] * f[hr]);
          if (w == 0) {
            st_shared_f2(o, x);
          } else {
            const float2 y = ld_shared_raw<float2>(o);
            st_shared_f2(o, make_float2(y.x + x.x, y.y + x.y));
          }
        }
      if (t == 0 && part == 0)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          float* L = ls + u * 16 + g + 8 * hr;
          *L = w == 0 ? l[hr] * f[hr] : *L + l[hr] * f[hr];
        }
    }
    consumer_sync();
  }
  // The task's rows' partials (a row that sees none of the chunk: max
  // -inf, sum 0, outputs 0, as its state was left).
  float* pbase = reinterpret_cast<float*>(base(s, p));
  for (int i = threadIdx.x; i < G * 16 * (D + 2); i += MPK_THREADS) {
    const int uu = i / (16 * (D + 2)), row = i / (D + 2) % 16, e = i % (D + 2);
    if (row >= rows) continue;
    float x;
    if (e == 0) {
      x = -INFINITY;
      for (int w = 0; w < W; ++w) x = fmaxf(x, mw[(uu * W + w) * 16 + row]);
    } else {
      x = e == 1 ? ls[uu * 16 + row] : os[(uu * 16 + row) * OP + e - 2];
    }
    pbase[p.offset + (r0 + row) * p.stride[0] + sp * p.stride[1] + (h0 + uu) * p.stride[2] + e * p.stride[4]] = x;
  }
}

// attention_rows: split-KV attention over a prompt chunk's queries as rows
// (ir.Attrs.SharedKV: K and V broadcast over the rows, lower's
// queriesAsRows). A task is the rows [r0, r1) (at most a row a consumer
// warp: decompose's sharedKVRows) of one KV head's G query heads and one
// chunk of positions: [lo, hi) are flat units (group·Splits + split)·B +
// row (codegen's taskRange). The chunk's K and V rows are read once into
// shared memory for all the task's rows, C at a time (a long cache's chunk
// is longer than the tile: lower bounds the tasks, not the chunk), each
// row padded by 8 elements so a lane's 16-byte loads of consecutive rows
// hit different banks. Each warp takes a row, as attention_decode takes a
// unit: its G queries pre-scaled in shared memory (read as broadcasts), a
// lane owning a position for q·k and PER output columns for p·V, the
// softmax reduced once per 32 positions, its state kept across the tiles.
// With FLAG_EXTENT the chunks are cut from the longest row's extent
// (live_chunk_of), no tile past the task's rows' largest extent is read,
// and a row whose extent ends before the chunk writes an empty softmax
// (the merge reads every split and skips those).
template <typename T, typename QT, typename MT, int D, int G, int C, int N>
__device__ void attention_rows(const Op& op, int lo, int hi, const Slots<N>& s, char* smem) {
  static_assert(sizeof(T) == 2 && D % 8 == 0, "2-byte K and V rows of whole 16-byte pieces");
  if constexpr (MPK_ROWS_MMA && rows_mma_shape(D, G)) {
    attention_rows_mma<T, QT, MT, D, G, C>(op, lo, hi, s, smem);
    return;
  }
  constexpr int PER = (D + 31) / 32, KP = D + 8, V16 = 8;
  const View &q = op.in[0], &k = op.in[1], &v = op.in[2], &p = op.out;
  const int B = (int)q.shape[0], S = (int)k.shape[2], splits = (int)p.shape[1];
  const int gs = lo / B, r0 = lo % B, r1 = r0 + (hi - lo);
  const int sp = gs % splits, h0 = gs / splits * G, kvh = h0 / op.groups;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int chunk = (S + splits - 1) / splits;
  if (op.flags & FLAG_EXTENT) {  // chunks cut from the longest row's extent (live_chunk_of), met in shared memory
    int* longest = reinterpret_cast<int*>(smem);
    const int e = longest_extent_warp(op, s, B);
    if (lane == 0) longest[warp] = e;
    consumer_sync();
    int m = 0;
    for (int w = 0; w < kConsumerWarps; ++w) m = max(m, longest[w]);
    consumer_sync();  // the bytes are the K tile's
    chunk = live_chunk_of(m, splits);
  }
  const int j_lo = min(sp * chunk, S), n = min(j_lo + chunk, S) - j_lo;
  // The positions of the chunk each row sees (its extent's), and the
  // task's: the largest of its rows'. Every warp reads them all (r1 - r0
  // is at most a warp's lanes).
  const int r = r0 + warp;
  const int seen_by_lane = r0 + lane < r1 ? rows_seen(op, s, r0 + lane, j_lo, n) : 0;
  const int n_task = __reduce_max_sync(0xffffffffu, seen_by_lane);
  const int n_row = r < r1 ? __shfl_sync(0xffffffffu, seen_by_lane, warp) : 0;
  T* ks = reinterpret_cast<T*>(smem);  // [C][KP]
  T* vs = ks + C * KP;                 // [C][KP]
  float* qs = reinterpret_cast<float*>(vs + C * KP) + warp * G * D;
  // The chunk of KV head kvh (K and V broadcast over the rows: row 0's).
  const T* kb = reinterpret_cast<const T*>(base(s, k)) + k.offset + kvh * k.stride[1] + j_lo * k.stride[2];
  const T* vb = reinterpret_cast<const T*>(base(s, v)) + v.offset + kvh * v.stride[1] + j_lo * v.stride[2];
  const bool aligned = rows_aligned<T>(k, base(s, k), 16) && rows_aligned<T>(v, base(s, v), 16);
  float m[G], l[G], acc[G][PER];
  MaskRow<MT> mask{};
  int64_t mask_hs = 0;
  if (n_row > 0) {
    stage_queries<QT, D, G>(qs, op, s, r, h0, lane);
    mask = mask_row<MT>(op, s, r, h0);
    if constexpr (G > 1 && !std::is_void<MT>::value) mask_hs = op.in[3].stride[1];
    clear_softmax(m, l, acc);
  }
  for (int c0 = 0; c0 < n_task; c0 += C) {
    const int nc = min(C, n_task - c0);
    stage_kv_tile<T, D, KP>(ks, vs, kb, vb, k, v, c0, nc, aligned);
    consumer_sync();
    // A row's positions past its extent are masked: the tiles past it are skipped.
    const int nr = min(nc, n_row - c0);
    for (int j0 = 0; j0 < nr; j0 += 32) {
      const int jl = j0 + lane;
      float sc[G], dot[G];
#pragma unroll
      for (int u = 0; u < G; ++u) {
        sc[u] = jl >= nr ? -INFINITY : u == 0 || mask_hs != 0 ? mask.add(j_lo + c0 + jl, u * mask_hs) : sc[0];
        dot[u] = 0.f;
      }
      const T* krow = ks + min(jl, nr - 1) * KP;
#pragma unroll
      for (int d0 = 0; d0 < D; d0 += V16) {
        const uint4 raw = *reinterpret_cast<const uint4*>(krow + d0);
#pragma unroll
        for (int u = 0; u < G; ++u) dot[u] += dot_q<T>(raw, qs + u * D + d0);
      }
      float pr[G];
      softmax_step(m, l, acc, sc, dot, pr);
      const int rows_here = min(32, nr - j0);
      for (int rr = 0; rr < rows_here; ++rr) {
        const T* vrow = vs + (j0 + rr) * KP;
        float vv[PER];
#pragma unroll
        for (int e = 0; e < PER; ++e) vv[e] = to_float(vrow[min(lane * PER + e, D - 1)]);
#pragma unroll
        for (int u = 0; u < G; ++u) {
          const float pj = __shfl_sync(0xffffffffu, pr[u], rr);
#pragma unroll
          for (int e = 0; e < PER; ++e) acc[u][e] = fmaf(pj, vv[e], acc[u][e]);
        }
      }
    }
    consumer_sync();  // the tile is read until the last row
  }
  float* pb = reinterpret_cast<float*>(base(s, p));
  if (n_row <= 0) {  // a row that sees none of the chunk: an empty softmax (max -inf, sum 0), which the merge skips
    if (r < r1 && lane < 2 * G)
      pb[p.offset + r * p.stride[0] + sp * p.stride[1] + (h0 + lane / 2) * p.stride[2] + lane % 2 * p.stride[4]] =
          lane % 2 == 0 ? -INFINITY : 0.f;
    return;
  }
#pragma unroll
  for (int u = 0; u < G; ++u)
    store_partial<D>(pb + p.offset + r * p.stride[0] + sp * p.stride[1] + (h0 + u) * p.stride[2], p.stride[4], m[u],
                     l[u], acc[u], lane);
}

// DecodeShape is a split-KV attention's shape as constants, emitted by
// codegen from the op: H query heads, SPLITS KV chunks, S cache positions,
// G query heads a KV head.
template <int H_, int SPLITS_, int S_, int G_>
struct DecodeShape {
  static constexpr int H = H_, SPLITS = SPLITS_, S = S_, G = G_;
};

// attention_partial: per KV chunk, the block's warps share the KV heads; with
// more warps than heads, wph warps split a head's positions (interleaved) and
// the first of them merges their states through shared memory.
template <typename T, typename QT, typename MT, int D, int G, int R, bool ROWS, int UG, class SH, class FT = void, int N>
__device__ void attention_partial(const Op& op, int lo, int hi, const Slots<N>& s, char* smem) {
  static_assert(D <= 256, "head dim up to 256");
  constexpr int PER = SoftmaxState<D, G>::PER;
  const View& q = op.in[0];
  const View& p = op.out;  // [B, Splits, H, Sq, Dv + 2], fp32
  const int64_t B = q.shape[0], H = q.shape[1], Sq = q.shape[2], S = op.in[1].shape[2];
  const int64_t splits = p.shape[1], chunk = (S + splits - 1) / splits;
  const bool causal = op.flags & FLAG_CAUSAL;
  if (Sq == 1) {  // [lo, hi) are flat (head group, chunk) units (ir.Op.DecodeUnits)
    if constexpr (decode_fast_dims<T, D>()) {
      if (decode_rows_ok<T, D>(op.in[1], op.in[2], base(s, op.in[1]), base(s, op.in[2]))) {
        attention_decode<T, QT, MT, D, R, ROWS, true, UG, SH, FT>(op, lo, hi, s, smem);
        return;
      }
    }
    attention_decode<T, QT, MT, D, R, ROWS, false, UG, SH, FT>(op, lo, hi, s, smem);
    return;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = MPK_THREADS / 32;
  const int nkv = (int)(H / G);
  const int wph = max(1, warps / max(nkv, 1));     // warps per KV head
  const int heads_per_round = warps / wph;
  const int rounds = (nkv + heads_per_round - 1) / heads_per_round;
  float* part = reinterpret_cast<float*>(smem);  // [warps][G][D + 2]
  float* pb = reinterpret_cast<float*>(base(s, p));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t sp = lo; sp < hi; ++sp)
      for (int64_t i = 0; i < Sq; ++i)
        for (int r = 0; r < rounds; ++r) {
          const int kvh = r * heads_per_round + warp / wph, sub = warp % wph;
          const bool active = warp / wph < heads_per_round && kvh < nkv;
          const int64_t h0 = (int64_t)kvh * G;
          const int64_t j_lo = min(sp * chunk, S), j_hi = min(j_lo + chunk, causal ? min(S, i + 1) : S);
          SoftmaxState<D, G> st;
          if (active) {
            load_queries<QT>(st, op, s, b, h0, i, lane);
            accumulate_rows<T, MT>(st, op, s, b, h0, i, j_lo + sub, j_hi, wph, lane);
            if (wph > 1) stash_state(st, part, warp, lane);
          }
          if (wph > 1) consumer_sync();
          if (active && sub == 0) {
#pragma unroll
            for (int g = 0; g < G; ++g) {
              float o[PER], M, L;
              if (wph > 1) {
                merge_states<D, G>(part, warp, wph, g, lane, o, M, L);
              } else {
                M = st.mx[g], L = st.l[g];
#pragma unroll
                for (int e = 0; e < PER; ++e) o[e] = st.acc[g][e];
              }
              int64_t pi[5] = {b, sp, h0 + g, i, 0};
              store_partial<D>(pb + offset_of(p, pi), p.stride[4], M, L, o, lane);
            }
          }
          if (wph > 1) consumer_sync();
        }
}

// attn_merge: out = Σ_s acc_s·e^(m_s−M) / Σ_s l_s·e^(m_s−M), M = max_s m_s.
// For each output row (b, h, i) of the task every warp takes part: warp w
// owns splits w, w+W, w+2W, ... (lane t holds split w+W·t's max and sum),
// and the outputs of its first few splits are loaded together with those,
// so a row costs one round trip up to W·BATCH splits. The warps' maxima and
// sums meet in shared memory.
template <int D, int N>
__device__ void attn_merge(const Op& op, int lo, int hi, const Slots<N>& s, char* smem) {
  constexpr int PER = (D + 31) / 32, W = kConsumerWarps, BATCH = PER <= 2 ? 8 : 16 / PER;
  const View& p = op.in[0];
  const View& out = op.out;
  const float* pb = reinterpret_cast<const float*>(base(s, p));
  const int64_t splits = p.shape[1], Sq = out.shape[2], nh = hi - lo;
  const int64_t st4 = p.stride[4], sst = p.stride[1];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* red = reinterpret_cast<float*>(smem);  // [W][D + 2]: per warp, its sum, its max, its outputs
  for (int64_t r = 0; r < out.shape[0] * nh * Sq; ++r) {
    const int64_t b = r / (nh * Sq), h = lo + (r / Sq) % nh, i = r % Sq;
    int64_t pi[5] = {b, 0, h, i, 0};
    const int64_t row0 = offset_of(p, pi);
    float m_own = -INFINITY, l_own = 0.f;  // this lane's split (up to 32·W splits)
    const int64_t own = warp + (int64_t)W * lane;
    if (own < splits) m_own = __ldcg(pb + row0 + own * sst), l_own = __ldcg(pb + row0 + own * sst + st4);
    float a[BATCH][PER];
#pragma unroll
    for (int t = 0; t < BATCH; ++t)
#pragma unroll
      for (int e = 0; e < PER; ++e) {
        const int64_t sp = warp + (int64_t)W * t, d = lane + 32 * e;
        a[t][e] = sp < splits && d < D ? __ldcg(pb + row0 + sp * sst + (2 + d) * st4) : 0.f;
      }
    float M = warp_max(l_own > 0.f ? m_own : -INFINITY);
    if (lane == 0) red[warp * (D + 2) + 1] = M;
    consumer_sync();
    M = -INFINITY;
    for (int w = 0; w < W; ++w) M = fmaxf(M, red[w * (D + 2) + 1]);
    // A split with no weight (no positions, or all masked) adds nothing, whatever its row holds.
    const float f = l_own > 0.f && M != -INFINITY ? __expf(m_own - M) : 0.f;
    const float L = warp_sum(l_own * f);
    float o[PER];
#pragma unroll
    for (int e = 0; e < PER; ++e) o[e] = 0.f;
    for (int t0 = 0; warp + (int64_t)W * t0 < splits; t0 += BATCH) {
      if (t0 > 0) {  // more splits than one batch: the next batch's outputs
#pragma unroll
        for (int t = 0; t < BATCH; ++t)
#pragma unroll
          for (int e = 0; e < PER; ++e) {
            const int64_t sp = warp + (int64_t)W * (t0 + t), d = lane + 32 * e;
            a[t][e] = sp < splits && d < D ? __ldcg(pb + row0 + sp * sst + (2 + d) * st4) : 0.f;
          }
      }
#pragma unroll
      for (int t = 0; t < BATCH; ++t) {
        const float ft = __shfl_sync(0xffffffffu, f, (t0 + t) & 31);
#pragma unroll
        for (int e = 0; e < PER; ++e) o[e] += ft == 0.f ? 0.f : a[t][e] * ft;
      }
    }
    consumer_sync();  // every warp has read the maxima from red
    if (lane == 0) red[warp * (D + 2)] = L;
#pragma unroll
    for (int e = 0; e < PER; ++e)
      if (lane + 32 * e < D) red[warp * (D + 2) + 2 + lane + 32 * e] = o[e];
    consumer_sync();
    if (warp == 0) {
      float Lt = 0.f;
      for (int w = 0; w < W; ++w) Lt += red[w * (D + 2)];
#pragma unroll
      for (int e = 0; e < PER; ++e) {
        const int64_t d = lane + 32 * e;
        if (d >= D) continue;
        float acc = 0.f;
        for (int w = 0; w < W; ++w) acc += red[w * (D + 2) + 2 + d];
        int64_t oi[4] = {b, h, i, d};
        store_elem(base(s, out), out.dtype, offset_of(out, oi), Lt > 0.f ? acc / Lt : 0.f);
      }
    }
    consumer_sync();  // red is reused by the next row
  }
}

// attn_merge_decode is attn_merge for one query per head (decode), on the
// contiguous partials [B, Splits, H, 1, D+2] split-KV attention writes: the
// task's heads [lo, hi) of every batch row (or, split along the rows, a
// long prompt chunk's: every head of rows [lo, hi)), a warp per (row, head)
// pair, so 16 pairs cost one round trip (merge_pairs). CHUNK > 0: in[1] is
// the mask's extent per row, and the splits from it on (unwritten) are not
// read.
template <int D, int H, int CHUNK, int R, int SPLITS, int N>
__device__ __noinline__ void attn_merge_decode(const Op& op, int lo, int hi, const Slots<N>& s) {
  const View& out = op.out;
  const bool by_rows = op.split_dim == 0;
  const int nh = by_rows ? (int)out.shape[1] : hi - lo, pairs = (by_rows ? hi - lo : (int)out.shape[0]) * nh;
  const int r0 = by_rows ? lo : 0, h0 = by_rows ? 0 : lo;
  char* ob = base(s, out);
  auto at = [&](int i) { return make_int2(r0 + i / nh, h0 + i % nh); };
#pragma unroll 1
  for (int p0 = 0; p0 < pairs; p0 += kConsumerWarps)
    merge_pairs<D, H, CHUNK, R, 1, SPLITS>(
        op.in[0], op.in[1], min(kConsumerWarps, pairs - p0), [&](int i) { return at(p0 + i); },
        [&](int i, int d, float v) {
          const int2 rh = at(p0 + i);
          st_float(ob, out.dtype, out.offset + rh.x * out.stride[0] + rh.y * out.stride[1] + d * out.stride[3], v);
        },
        s);
}

}  // namespace mpk
