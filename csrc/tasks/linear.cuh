// Linear: out[m, n] = Σ_k x[m, k]·W[n, k] (+ residual[m, n]) for the rows
// [lo, hi) of W. Decode is bound by streaming W, so each warp owns whole rows
// and reads them with 16-byte non-coherent loads (weights never change during
// a launch); x is staged in shared memory as fp32.
#pragma once
#include "runtime/runtime.cuh"
#include "tasks/dot.cuh"
#include "tasks/generic.cuh"

namespace mpk {

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

__device__ __forceinline__ bool float_row2(const View& v) { return v.rank == 2 && float_row(v); }

template <int K>
__device__ __forceinline__ void load_x_row(const char* p, const View& x, int64_t m, float (&v)[per_thread(K)]) {
  const int64_t o = x.offset + m * x.stride[0];
#pragma unroll
  for (int i = 0; i < per_thread(K); ++i) {
    const int k = threadIdx.x + i * MPK_THREADS;
    v[i] = k < K ? ld_float(p, x.dtype, o + k) : 0.f;
  }
}

template <int K, int N>
__device__ __forceinline__ void stage_x(NoPro, const Op& op, int64_t m, float* xs, const Slots<N>& s) {
  const View& x = op.in[0];
  if (float_row2(x)) {
    float v[per_thread(K)];
    load_x_row<K>(base(s, x), x, m, v);
#pragma unroll
    for (int i = 0; i < per_thread(K); ++i)
      if (threadIdx.x + i * MPK_THREADS < K) xs[threadIdx.x + i * MPK_THREADS] = v[i];
    return;
  }
  for (int k = threadIdx.x; k < K; k += blockDim.x) {
    int64_t i[2] = {m, k};
    xs[k] = (float)load_elem(base(s, x), x.dtype, offset_of(x, i));
  }
}

// y = x·rsqrt(mean(x²)+eps) in fp32, rounded to x's dtype, times the weight.
template <int K, int N>
__device__ __forceinline__ void stage_x(NormPro, const Op& op, int64_t m, float* xs, const Slots<N>& s) {
  const View& x = op.in[0];
  __shared__ float scratch[32];
  const bool has_w = op.flags & FLAG_WEIGHT;
  const View& w = op.in[op.pro_first];
  if (float_row2(x) && (!has_w || float_row2(w))) {
    float v[per_thread(K)], g[per_thread(K)];
    load_x_row<K>(base(s, x), x, m, v);
    if (has_w) load_x_row<K>(base(s, w), w, m, g);
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < per_thread(K); ++i) ss += v[i] * v[i];  // zero past K
    const float inv = rsqrtf(block_sum(ss, scratch) / (float)K + op.eps);
#pragma unroll
    for (int i = 0; i < per_thread(K); ++i) {
      const int k = threadIdx.x + i * MPK_THREADS;
      if (k >= K) continue;
      const float y = round_float(x.dtype, v[i] * inv);
      xs[k] = round_float(op.pro_dtype, has_w ? y * g[i] : y);
    }
    return;
  }
  float ss = 0.f;
  for (int k = threadIdx.x; k < K; k += blockDim.x) {
    int64_t i[2] = {m, k};
    const float v = (float)load_elem(base(s, x), x.dtype, offset_of(x, i));
    xs[k] = v;
    ss += v * v;
  }
  const float inv = rsqrtf(block_sum(ss, scratch) / (float)K + op.eps);
  for (int k = threadIdx.x; k < K; k += blockDim.x) {
    double y = round_to(x.dtype, (double)(xs[k] * inv));
    if (has_w) {
      int64_t i[2] = {m, k};
      y *= load_elem(base(s, w), w.dtype, offset_of(w, i));
    }
    xs[k] = (float)round_to(op.pro_dtype, y);
  }
}

template <int K, typename E, int N>
__device__ __forceinline__ void stage_x(ExprPro<E>, const Op& op, int64_t m, float* xs, const Slots<N>& s) {
  if (op.num_in - op.pro_first == 1 && float_row2(op.in[0]) && float_row2(op.in[op.pro_first])) {
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
      xs[idx[1]] = (float)round_to(op.pro_dtype, E::eval(in, idx));
    }
    return;
  }
  for (int k = threadIdx.x; k < K; k += blockDim.x) {
    int64_t idx[2] = {m, k};
    double in[MPK_MAX_INPUTS];
    in[0] = load_elem(base(s, op.in[0]), op.in[0].dtype, offset_of(op.in[0], idx));
#pragma unroll 1
    for (int j = op.pro_first; j < op.num_in; ++j)
      in[1 + j - op.pro_first] = load_elem(base(s, op.in[j]), op.in[j].dtype, offset_of(op.in[j], idx));
    xs[k] = (float)round_to(op.pro_dtype, E::eval(in, idx));
  }
}

template <typename T, int K, bool RESID, typename PRO, int N>
__device__ void linear(const Op& op, int lo, int hi, const Slots<N>& s, char* smem) {
  static_assert(K * 4 <= MPK_MAX_SHARED_BYTES, "x does not fit in shared memory");
  constexpr int VEC = 16 / sizeof(T);
  const View& x = op.in[0];
  const View& w = op.in[1];
  float* xs = reinterpret_cast<float*>(smem);
  const T* W = reinterpret_cast<const T*>(base(s, w)) + w.offset;
  const int64_t row_stride = w.stride[0];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  const bool vec = (reinterpret_cast<uintptr_t>(W) % 16 == 0) && (row_stride % VEC == 0) && (K % VEC == 0);
  const uint64_t policy = weight_policy();
  for (int64_t m = 0; m < x.shape[0]; ++m) {
    __syncthreads();
    stage_x<K>(PRO{}, op, m, xs, s);
    __syncthreads();
    const View& r = op.in[2];
    const bool fast_resid = RESID && float_row2(op.out) && float_row2(r);
    for (int n = lo + warp; n < hi; n += warps) {
      const T* row = W + (int64_t)n * row_stride;
      // The residual is read before the weights, so its latency hides behind theirs.
      const float resid = fast_resid && lane == 0 ? ld_float(base(s, r), r.dtype, r.offset + m * r.stride[0] + n) : 0.f;
      float acc = 0.f;
      if (vec) {
#pragma unroll 4
        for (int k = lane * VEC; k < K; k += 32 * VEC) {
          uint4 raw = ld_weight(row + k, policy);
          acc += dot16(raw, xs + k, static_cast<T*>(nullptr));
        }
      } else {
        for (int k = lane; k < K; k += 32) acc += to_float(row[k]) * xs[k];
      }
      acc = warp_sum(acc);
      if (lane == 0 && fast_resid) {
        st_float(base(s, op.out), op.out.dtype, op.out.offset + m * op.out.stride[0] + n,
                 round_float(op.out.dtype, acc) + resid);
      } else if (lane == 0) {
        int64_t oi[2] = {m, n};
        double v = acc;
        if (RESID) {
          v = round_to(op.out.dtype, v) + load_elem(base(s, op.in[2]), op.in[2].dtype, offset_of(op.in[2], oi));
        }
        store_elem(base(s, op.out), op.out.dtype, offset_of(op.out, oi), v);
      }
    }
  }
}

}  // namespace mpk
