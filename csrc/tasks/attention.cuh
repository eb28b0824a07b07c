// Attention for the query heads [lo, hi) of one task: softmax(q·kᵀ·scale +
// mask)·v with grouped-query heads (head h reads KV head h / G). The G query
// heads of a KV head share every K and V row load. Warps split the KV
// positions, each keeping one online softmax per head and several rows in
// flight; warp 0 merges them. Positions the mask excludes (false or -inf)
// skip the K/V math.
#pragma once
#include "runtime/runtime.cuh"
#include "tasks/linear.cuh"

namespace mpk {

template <typename T, int D, int G, int N>
__device__ void attention(const Op& op, int lo, int hi, const Slots<N>& s, char* smem) {
  static_assert(D <= 256, "head dim up to 256");
  constexpr int PER = (D + 31) / 32;  // head elements per lane; lanes past D idle
  constexpr int U = 4;                // KV rows each warp keeps in flight
  const View& q = op.in[0];
  const View& k = op.in[1];
  const View& v = op.in[2];
  const bool has_mask = op.flags & FLAG_MASK, causal = op.flags & FLAG_CAUSAL;
  const int64_t B = q.shape[0], Sq = q.shape[2], S = k.shape[2];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  float* part = reinterpret_cast<float*>(smem);  // [warps][G][D + 2]: m, l, acc
  const T* kb = reinterpret_cast<const T*>(base(s, k));
  const T* vb = reinterpret_cast<const T*>(base(s, v));
  const char* mb = has_mask ? base(s, op.in[3]) : nullptr;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h0 = lo; h0 < hi; h0 += G)
      for (int64_t i = 0; i < Sq; ++i) {
        const int64_t kvh = h0 / G;
        float qv[G][PER], acc[G][PER], mx[G], l[G];
#pragma unroll
        for (int g = 0; g < G; ++g) {
          mx[g] = -INFINITY;
          l[g] = 0.f;
#pragma unroll
          for (int e = 0; e < PER; ++e) {
            const int c = lane * PER + e;
            int64_t qi[4] = {b, h0 + g, i, c};
            qv[g][e] = c < D ? (float)load_elem(base(s, q), q.dtype, offset_of(q, qi)) * op.scale : 0.f;
            acc[g][e] = 0.f;
          }
        }
        const int64_t kb0 = k.offset + b * k.stride[0] + kvh * k.stride[1];
        const int64_t vb0 = v.offset + b * v.stride[0] + kvh * v.stride[1];
        const int64_t end = causal ? min(S, i + 1) : S;
        for (int64_t j0 = warp * U; j0 < end; j0 += warps * U) {
          float kr[U][PER], vr[U][PER], add[U][G];
          bool live[U];
          // Issue every load of the U rows first: they are independent.
#pragma unroll
          for (int u = 0; u < U; ++u) {
            const int64_t j = j0 + u;
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
              for (int e = 0; e < PER; ++e) dot += qv[g][e] * kr[u][e];
              const float sc = warp_sum(dot) + add[u][g];
              const float mnew = fmaxf(mx[g], sc);
              const float corr = __expf(mx[g] - mnew), p = __expf(sc - mnew);
              l[g] = l[g] * corr + p;
#pragma unroll
              for (int e = 0; e < PER; ++e) acc[g][e] = acc[g][e] * corr + p * vr[u][e];
              mx[g] = mnew;
            }
          }
        }
#pragma unroll
        for (int g = 0; g < G; ++g) {
          float* mine = part + (warp * G + g) * (D + 2);
          if (lane == 0) {
            mine[0] = mx[g];
            mine[1] = l[g];
          }
#pragma unroll
          for (int e = 0; e < PER; ++e)
            if (lane * PER + e < D) mine[2 + lane * PER + e] = acc[g][e];
        }
        __syncthreads();
        // Warp g merges head g's partial softmaxes.
        if (warp < G) {
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

}  // namespace mpk
