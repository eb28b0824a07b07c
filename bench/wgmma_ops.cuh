// wgmma's m64n128k16 and m64n256k16 forms for the bench's bodies
// (tasks/wgmma.cuh has rs_64, tasks/wgmma_ops.cuh ss_64 and ss_128 and the
// operand macros): A from registers (rs) or a descriptor (ss), bf16 in,
// fp32 accumulate.
#pragma once
#include <stdint.h>

#include "tasks/wgmma_ops.cuh"

namespace mpk {

// wgmma_rs_128: D[64][128] += A[64][16] (registers) · B[16][128] (shared
// memory, descriptor b), bf16 in, fp32 accumulate.
__device__ __forceinline__ void wgmma_rs_128(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      WG_D64
      "}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
      : WG_ACC32(d, 0), WG_ACC32(d, 32)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}

// The asm's names of 128 accumulators.
#define WG_D128                                                                                               \
  WG_D64 ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, " \
         "%84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, "     \
         "%103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, " \
         "%120, %121, %122, %123, %124, %125, %126, %127"

__device__ __forceinline__ void wgmma_rs_256(float (&d)[128], const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      WG_D128
      "}, {%128, %129, %130, %131}, %132, p, 1, 1, 0;\n}\n"
      : WG_ACC32(d, 0), WG_ACC32(d, 32), WG_ACC32(d, 64), WG_ACC32(d, 96)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}

__device__ __forceinline__ void wgmma_ss_256(float (&d)[128], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      WG_D128
      "}, %128, %129, p, 1, 1, 0, 0;\n}\n"
      : WG_ACC32(d, 0), WG_ACC32(d, 32), WG_ACC32(d, 64), WG_ACC32(d, 96)
      : "l"(a), "l"(b), "r"(1));
}

}  // namespace mpk
