// Attention: softmax(q·kᵀ·scale + mask)·v with grouped-query heads (head h
// reads KV head h / G); the G query heads of a KV head share every K and V
// row load. Two task ops:
//  - attention: the heads [lo, hi) of a task over all positions; warps split
//    the positions and warp g merges head g.
//  - attention_partial (split-KV, flash-decoding): the KV chunks [lo, hi) of
//    a task for every head, a warp per KV head, writing partial softmaxes
//    [B, Splits, H, Sq, Dv+2] that attn_merge combines.
// Positions the mask excludes (false, or -inf) skip the K/V math.
#pragma once
#include "runtime/runtime.cuh"
#include "tasks/linear.cuh"

namespace mpk {

// One warp's online softmax over G query heads: running max, sum and output
// (PER head elements per lane).
template <int D, int G>
struct SoftmaxState {
  static constexpr int PER = (D + 31) / 32;  // lanes past D idle
  float qv[G][PER], acc[G][PER], mx[G], l[G];
};

// load_queries fills q (pre-scaled) for heads h0..h0+G-1 and clears the state.
template <int D, int G, int N>
__device__ __forceinline__ void load_queries(SoftmaxState<D, G>& st, const Op& op, const Slots<N>& s, int64_t b,
                                             int64_t h0, int64_t i, int lane) {
  const View& q = op.in[0];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    st.mx[g] = -INFINITY;
    st.l[g] = 0.f;
#pragma unroll
    for (int e = 0; e < st.PER; ++e) {
      const int c = lane * st.PER + e;
      int64_t qi[4] = {b, h0 + g, i, c};
      st.qv[g][e] = c < D ? (float)load_elem(base(s, q), q.dtype, offset_of(q, qi)) * op.scale : 0.f;
      st.acc[g][e] = 0.f;
    }
  }
}

// accumulate_rows folds the KV rows j0, j0+step, ... below end (U at a time,
// all loads of a batch issued before any math) into one warp's state.
template <typename T, int D, int G, int N>
__device__ __forceinline__ void accumulate_rows(SoftmaxState<D, G>& st, const Op& op, const Slots<N>& s, int64_t b,
                                                int64_t h0, int64_t i, int64_t j0, int64_t end, int64_t step,
                                                int lane) {
  constexpr int U = 4, PER = SoftmaxState<D, G>::PER;
  const View& k = op.in[1];
  const View& v = op.in[2];
  const bool has_mask = op.flags & FLAG_MASK;
  const T* kb = reinterpret_cast<const T*>(base(s, k));
  const T* vb = reinterpret_cast<const T*>(base(s, v));
  const char* mb = has_mask ? base(s, op.in[3]) : nullptr;
  const int64_t kvh = h0 / G;
  const int64_t kb0 = k.offset + b * k.stride[0] + kvh * k.stride[1];
  const int64_t vb0 = v.offset + b * v.stride[0] + kvh * v.stride[1];
  for (int64_t jb = j0; jb < end; jb += step * U) {
    float kr[U][PER], vr[U][PER], add[U][G];
    bool live[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t j = jb + u * step;
      live[u] = j < end;
#pragma unroll
      for (int g = 0; g < G; ++g) {
        add[u][g] = 0.f;
        if (live[u] && has_mask) {
          int64_t mi[4] = {b, h0 + g, i, j};
          const double m = load_elem(mb, op.in[3].dtype, offset_of(op.in[3], mi));
          add[u][g] = op.in[3].dtype == DT_BOOL ? (m != 0.0 ? 0.f : -INFINITY) : (float)m;
        }
      }
#pragma unroll
      for (int e = 0; e < PER; ++e) {
        const int c = lane * PER + e;
        const bool ok = live[u] && c < D;
        kr[u][e] = ok ? to_float(__ldcg(kb + kb0 + j * k.stride[2] + c * k.stride[3])) : 0.f;
        vr[u][e] = ok ? to_float(__ldcg(vb + vb0 + j * v.stride[2] + c * v.stride[3])) : 0.f;
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (!live[u]) continue;
#pragma unroll
      for (int g = 0; g < G; ++g) {
        if (isinf(add[u][g]) && add[u][g] < 0) continue;
        float dot = 0.f;
#pragma unroll
        for (int e = 0; e < PER; ++e) dot += st.qv[g][e] * kr[u][e];
        const float sc = warp_sum(dot) + add[u][g];
        const float mnew = fmaxf(st.mx[g], sc);
        const float corr = __expf(st.mx[g] - mnew), p = __expf(sc - mnew);
        st.l[g] = st.l[g] * corr + p;
#pragma unroll
        for (int e = 0; e < PER; ++e) st.acc[g][e] = st.acc[g][e] * corr + p * vr[u][e];
        st.mx[g] = mnew;
      }
    }
  }
}

template <typename T, int D, int G, int N>
__device__ void attention(const Op& op, int lo, int hi, const Slots<N>& s, char* smem) {
  static_assert(D <= 256, "head dim up to 256");
  constexpr int PER = SoftmaxState<D, G>::PER;
  const View& q = op.in[0];
  const int64_t B = q.shape[0], Sq = q.shape[2], S = op.in[1].shape[2];
  const bool causal = op.flags & FLAG_CAUSAL;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  float* part = reinterpret_cast<float*>(smem);  // [warps][G][D + 2]: m, l, acc
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h0 = lo; h0 < hi; h0 += G)
      for (int64_t i = 0; i < Sq; ++i) {
        SoftmaxState<D, G> st;
        load_queries(st, op, s, b, h0, i, lane);
        accumulate_rows<T>(st, op, s, b, h0, i, warp, causal ? min(S, i + 1) : S, warps, lane);
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
        __syncthreads();
        if (warp < G) {  // warp g merges head g's partial softmaxes
          const int g = warp;
          float M = -INFINITY;
          for (int w = 0; w < warps; ++w) M = fmaxf(M, part[(w * G + g) * (D + 2)]);
          float L = 0.f, o[PER];
#pragma unroll
          for (int e = 0; e < PER; ++e) o[e] = 0.f;
          for (int w = 0; w < warps; ++w) {
            const float* pw = part + (w * G + g) * (D + 2);
            if (pw[1] == 0.f) continue;
            const float f = __expf(pw[0] - M);
            L += pw[1] * f;
#pragma unroll
            for (int e = 0; e < PER; ++e)
              if (lane * PER + e < D) o[e] += pw[2 + lane * PER + e] * f;
          }
#pragma unroll
          for (int e = 0; e < PER; ++e) {
            if (lane * PER + e >= D) continue;
            int64_t oi[4] = {b, h0 + g, i, lane * PER + e};
            store_elem(base(s, op.out), op.out.dtype, offset_of(op.out, oi), L > 0.f ? o[e] / L : NAN);
          }
        }
        __syncthreads();
      }
}

template <typename T, int D, int G, int N>
__device__ void attention_partial(const Op& op, int lo, int hi, const Slots<N>& s, char*) {
  static_assert(D <= 256, "head dim up to 256");
  constexpr int PER = SoftmaxState<D, G>::PER;
  const View& q = op.in[0];
  const View& p = op.out;  // [B, Splits, H, Sq, Dv + 2], fp32
  const int64_t B = q.shape[0], H = q.shape[1], Sq = q.shape[2], S = op.in[1].shape[2];
  const int64_t splits = p.shape[1], chunk = (S + splits - 1) / splits;
  const bool causal = op.flags & FLAG_CAUSAL;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  float* pb = reinterpret_cast<float*>(base(s, p));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t sp = lo; sp < hi; ++sp)
      for (int64_t i = 0; i < Sq; ++i)
        for (int64_t h0 = (int64_t)warp * G; h0 < H; h0 += (int64_t)warps * G) {  // a warp per KV head
          const int64_t j_lo = min(sp * chunk, S), j_hi = min(j_lo + chunk, causal ? min(S, i + 1) : S);
          SoftmaxState<D, G> st;
          load_queries(st, op, s, b, h0, i, lane);
          accumulate_rows<T>(st, op, s, b, h0, i, j_lo, j_hi, 1, lane);
#pragma unroll
          for (int g = 0; g < G; ++g) {
            int64_t pi[5] = {b, sp, h0 + g, i, 0};
            float* row = pb + offset_of(p, pi);
            if (lane == 0) {
              row[0] = st.mx[g];
              row[p.stride[4]] = st.l[g];
            }
#pragma unroll
            for (int e = 0; e < PER; ++e)
              if (lane * PER + e < D) row[(2 + lane * PER + e) * p.stride[4]] = st.acc[g][e];
          }
        }
}

// attn_merge: out = Σ_s acc_s·e^(m_s−M) / Σ_s l_s·e^(m_s−M), M = max_s m_s.
template <int N>
__device__ void attn_merge(const Op& op, int lo, int hi, const Slots<N>& s, char*) {
  const View& p = op.in[0];
  const float* pb = reinterpret_cast<const float*>(base(s, p));
  const int64_t splits = p.shape[1];
  for_each_index(op.out.shape, op.out.rank, op.split_dim, lo, hi, [&](const int64_t* idx) {
    int64_t pi[5] = {idx[0], 0, idx[1], idx[2], 0};
    float M = -INFINITY;
    for (int64_t sp = 0; sp < splits; ++sp) {
      pi[1] = sp;
      M = fmaxf(M, __ldcg(pb + offset_of(p, pi)));
    }
    float L = 0.f, o = 0.f;
    for (int64_t sp = 0; sp < splits; ++sp) {
      pi[1] = sp;
      const int64_t off = offset_of(p, pi);
      const float l = __ldcg(pb + off + p.stride[4]);
      if (l == 0.f) continue;
      const float f = __expf(__ldcg(pb + off) - M);
      L += l * f;
      o += __ldcg(pb + off + (2 + idx[3]) * p.stride[4]) * f;
    }
    store_elem(base(s, op.out), op.out.dtype, offset_of(op.out, idx), L > 0.f ? o / L : NAN);
  });
}

}  // namespace mpk
