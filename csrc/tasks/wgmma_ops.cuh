// wgmma's forms with both operands in shared memory (descriptors a and b),
// bf16 in, fp32 accumulate: m64nNk16 for N 16, 32, 64 and 128 (linear_wgmma's
// split x of 8, 16, 32 or 64 rows; bench/wgmma_ops.cuh has the bench's other forms).
#pragma once
#include <stdint.h>

namespace mpk {

// An accumulator's operands in a wgmma's inline asm, 8 and 32 at a time.
#define WG_ACC8(d, i)                                                                                   \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), \
      "+f"(d[i + 7])
#define WG_ACC32(d, i) WG_ACC8(d, i), WG_ACC8(d, i + 8), WG_ACC8(d, i + 16), WG_ACC8(d, i + 24)
// The asm's names of 64 accumulators.
#define WG_D64                                                                                                  \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
  "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, "      \
  "%45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"

// d[8] += A(desc a) · B(desc b): m64n16k16.
__device__ __forceinline__ void wgmma_ss_16(float (&d)[8], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, 0, 0;\n}\n"
      : WG_ACC8(d, 0)
      : "l"(a), "l"(b), "r"(1));
}

// d[16] += A(desc a) · B(desc b): m64n32k16.
__device__ __forceinline__ void wgmma_ss_32(float (&d)[16], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : WG_ACC8(d, 0), WG_ACC8(d, 8)
      : "l"(a), "l"(b), "r"(1));
}

// d[32] += A(desc a) · B(desc b): m64n64k16.
__device__ __forceinline__ void wgmma_ss_64(float (&d)[32], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, p, 1, 1, 0, 0;\n}\n"
      : WG_ACC32(d, 0)
      : "l"(a), "l"(b), "r"(1));
}

// d[64] += A(desc a) · B(desc b): m64n128k16.
__device__ __forceinline__ void wgmma_ss_128(float (&d)[64], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      WG_D64
      "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : WG_ACC32(d, 0), WG_ACC32(d, 32)
      : "l"(a), "l"(b), "r"(1));
}

}  // namespace mpk
