// Attention for the heads [lo, hi) of one task: softmax(q·kᵀ·scale + mask)·v
// with grouped-query heads (head h reads KV head h / groups). Warps split the
// KV positions and keep an online softmax; warp 0 merges them. Positions the
// mask excludes (false, or -inf) are skipped without touching K or V.
#pragma once
#include "runtime/runtime.cuh"
#include "tasks/linear.cuh"

namespace mpk {

template <typename T, int D, int N>
__device__ void attention(const Op& op, int lo, int hi, const Slots<N>& s, char* smem) {
  static_assert(D <= 256, "head dim up to 256");
  constexpr int PER = (D + 31) / 32;  // head elements per lane; lanes past D idle
  const View& q = op.in[0];
  const View& k = op.in[1];
  const View& v = op.in[2];
  const bool has_mask = op.flags & FLAG_MASK, causal = op.flags & FLAG_CAUSAL;
  const int64_t B = q.shape[0], Sq = q.shape[2], S = k.shape[2];
  const int G = op.groups;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  float* part = reinterpret_cast<float*>(smem);  // per warp: m, l, acc[D]
  const char* qb = base(s, q);
  const T* kb = reinterpret_cast<const T*>(base(s, k));
  const T* vb = reinterpret_cast<const T*>(base(s, v));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = lo; h < hi; ++h)
      for (int64_t i = 0; i < Sq; ++i) {
        float qv[PER], acc[PER];
#pragma unroll
        for (int e = 0; e < PER; ++e) {
          int64_t qi[4] = {b, h, i, lane * PER + e};
          qv[e] = lane * PER + e < D ? (float)load_elem(qb, q.dtype, offset_of(q, qi)) : 0.f;
          acc[e] = 0.f;
        }
        float mx = -INFINITY, l = 0.f;
        const int64_t kvh = h / G;
        for (int64_t j = warp; j < S; j += warps) {
          if (causal && j > i) break;
          float add = 0.f;
          if (has_mask) {
            int64_t mi[4] = {b, h, i, j};
            double mv = load_elem(base(s, op.in[3]), op.in[3].dtype, offset_of(op.in[3], mi));
            if (op.in[3].dtype == DT_BOOL) {
              if (mv == 0.0) continue;
            } else {
              if (isinf(mv) && mv < 0) continue;
              add = (float)mv;
            }
          }
          const int64_t kbase = k.offset + b * k.stride[0] + kvh * k.stride[1] + j * k.stride[2];
          const int64_t vbase = v.offset + b * v.stride[0] + kvh * v.stride[1] + j * v.stride[2];
          float dot = 0.f;
#pragma unroll
          for (int e = 0; e < PER; ++e)
            if (lane * PER + e < D) dot += qv[e] * to_float(__ldcg(kb + kbase + (lane * PER + e) * k.stride[3]));
          const float sc = warp_sum(dot) * op.scale + add;
          const float mnew = fmaxf(mx, sc);
          const float corr = __expf(mx - mnew), p = __expf(sc - mnew);
          l = l * corr + p;
#pragma unroll
          for (int e = 0; e < PER; ++e)
            if (lane * PER + e < D) acc[e] = acc[e] * corr + p * to_float(__ldcg(vb + vbase + (lane * PER + e) * v.stride[3]));
          mx = mnew;
        }
        float* mine = part + warp * (D + 2);
        if (lane == 0) {
          mine[0] = mx;
          mine[1] = l;
        }
#pragma unroll
        for (int e = 0; e < PER; ++e)
          if (lane * PER + e < D) mine[2 + lane * PER + e] = acc[e];
        __syncthreads();
        if (warp == 0) {
          float M = -INFINITY;
          for (int w = 0; w < warps; ++w) M = fmaxf(M, part[w * (D + 2)]);
          float L = 0.f, o[PER];
#pragma unroll
          for (int e = 0; e < PER; ++e) o[e] = 0.f;
          for (int w = 0; w < warps; ++w) {
            const float* pw = part + w * (D + 2);
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
            int64_t oi[4] = {b, h, i, lane * PER + e};
            store_elem(base(s, op.out), op.out.dtype, offset_of(op.out, oi), L > 0.f ? o[e] / L : NAN);
          }
        }
        __syncthreads();
      }
}

}  // namespace mpk
