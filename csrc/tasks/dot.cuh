// Small warp-level math shared by the task families: warp reductions and
// the 16-byte dot products of weight streams. No op table here, so the
// micro-benchmarks in bench/ use it as it is.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace mpk {

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// warp_sums reduces P values (P a power of two, at most 32) over the warp
// at once, P - 1 + 5 - log2(P) shuffles where P warp_sums take 5·P: each
// level sends half of the values still held and keeps the other half. The
// lane returns the sum of value lane / (32 / P).
template <int P>
__device__ __forceinline__ float warp_sums(float (&v)[P]) {
  static_assert(P >= 1 && P <= 32 && (P & (P - 1)) == 0, "warp_sums: P a power of two up to 32");
  const int lane = threadIdx.x % 32;
  int o = 16;
#pragma unroll
  for (int n = P / 2; n >= 1; n /= 2, o /= 2) {
    const bool upper = lane & o;
#pragma unroll
    for (int i = 0; i < n; ++i) {
      const float send = upper ? v[i] : v[i + n];
      v[i] = (upper ? v[i + n] : v[i]) + __shfl_xor_sync(0xffffffffu, send, o);
    }
  }
  float r = v[0];
#pragma unroll
  for (; o > 0; o /= 2) r += __shfl_xor_sync(0xffffffffu, r, o);
  return r;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float2 to_float2(__nv_bfloat162 v) { return __bfloat1622float2(v); }
__device__ __forceinline__ float2 to_float2(__half2 v) { return __half22float2(v); }

// dot16 multiplies 16 bytes of 2-byte weights (T2: their pair type) with the
// matching fp32 activations.
template <typename T2>
__device__ __forceinline__ float dot16_pairs(const uint4& raw, const float* x) {
  const T2* h = reinterpret_cast<const T2*>(&raw);
  float acc = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = to_float2(h[i]);
    acc += f.x * x[2 * i] + f.y * x[2 * i + 1];
  }
  return acc;
}

__device__ __forceinline__ float dot16(const uint4& raw, const float* x, __nv_bfloat16*) {
  return dot16_pairs<__nv_bfloat162>(raw, x);
}

__device__ __forceinline__ float dot16(const uint4& raw, const float* x, __half*) {
  return dot16_pairs<__half2>(raw, x);
}

__device__ __forceinline__ float dot16(const uint4& raw, const float* x, float*) {
  const float* f = reinterpret_cast<const float*>(&raw);
  return f[0] * x[0] + f[1] * x[1] + f[2] * x[2] + f[3] * x[3];
}

__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(float v) { return v; }

}  // namespace mpk
