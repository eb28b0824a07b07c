// linear_wgmma: a GEMM stream (gocore/stream: Plan.Wgmma) on the Hopper
// tensor cores, for a prompt chunk's Linear: the weights read once, as in
// linear_gemm, but multiplied by wgmma instead of mma.sync (whose hi + lo
// chains and per-use splitting of x held the 64-token chunk at 0.42x of
// inductor: bench/NOTES.md, fourteenth session).
//
// The layout (measured alone first: bench/wgmma_gemm.cu):
// - W's rows are wgmma's A operand from REGISTERS, read with ld.shared from
//   the ring page as it landed (32 rows × 256 columns in column blocks:
//   gemm_page_at): lane (g, t) reads 16 contiguous bytes of its rows g and g + 8,
//   two k16 steps' k pairs (a dot product does not care which k pairs with
//   which, as long as x uses the same order).
// - x is the B operand from shared memory, staged by the consumers 64
//   columns (4 k16 steps) at a time as bf16 hi (+ lo for an fp32 x: hi + lo
//   keeps ~16 significant bits, two wgmmas a step) in the canonical
//   no-swizzle K-major layout (core matrices of 8 tokens × 16 bytes), its
//   columns permuted to the A registers' k order (wg_x_offset).
// - D = W·xᵀ: the accumulators are weight rows × tokens.
// A task takes up to kGemmRows (64) weight rows, the four warpgroups' A,
// and all M tokens, a quarter a warpgroup (m64nNk16, N = MT / 4).
// ptxas serialises every wgmma of a kernel when one sits in a function it
// calls (C7510), so codegen inlines this task into the megakernel.
#pragma once
#include "tasks/gemm.cuh"

namespace mpk {

constexpr int kWgSub = 64;                // x's columns staged at a time: 4 k16 steps
constexpr int kWgCoreK = 128;             // bytes between x's core matrices along K (the descriptor's LBO)
constexpr int kWgCoreN = 256;             // ... along the tokens (SBO)
constexpr int kWgWarpgroups = MPK_THREADS / 128;
// Groups of wgmmas (a slice's two k16 steps, hi and lo) a warpgroup keeps in
// flight. 2 overlaps a group's A loads with the one before, but inside the
// megakernel (96 registers) ptxas then serialises every wgmma (C7512:
// insufficient register resources); 1 keeps a group's four back to back.
#ifndef MPK_WG_DEPTH
#define MPK_WG_DEPTH 1
#endif
constexpr int kWgDepth = MPK_WG_DEPTH;
static_assert(kWgDepth == 1 || kWgDepth == 2, "one or two groups in flight");

// x's staged sub-block of MT tokens: 4 k16 steps of wg_step_bytes each (hi),
// then 4 more (lo). The step's 32 extra bytes put the four steps' stores of
// one token row in different banks.
__host__ __device__ constexpr int wg_step_bytes(int MT) { return MT / 8 * kWgCoreN + 32; }
__host__ __device__ constexpr int wg_xbuf_bytes(int MT, bool lo) { return (lo ? 8 : 4) * wg_step_bytes(MT); }
// The tokens a task stages: M rounded up so each warpgroup's N is a multiple of 8.
__host__ __device__ constexpr int wg_tokens(int M) { return (M + 31) / 32 * 32; }
// The task's shared memory (stream.WgmmaScratch): three rotating x buffers.
__host__ __device__ constexpr int wgmma_scratch_bytes(int M, bool lo) { return 3 * wg_xbuf_bytes(wg_tokens(M), lo); }

// wg_x_offset is where x's token n, columns p and p + 1 (p even, within a
// 64-column sub-block; p + 2 and p + 3 sit kWgCoreK further) go in a
// staged buffer: column p is the A registers' slice p/32, k16 step p%8/4, k
// pair t = p%32/8 (columns p, p + 1: the step's k 2t, 2t + 1; p + 2, p + 3:
// its 2t + 8, 2t + 9, the second core matrix along K).
template <int MT>
__host__ __device__ constexpr int wg_x_offset(int n, int p) {
  return (p / 32 * 2 + p % 8 / 4) * wg_step_bytes(MT) + n / 8 * kWgCoreN + n % 8 * 16 + 4 * (p % 32 / 8);
}

// The matrix descriptor of a no-swizzle operand at shared address addr.
__device__ __forceinline__ uint64_t wg_desc(uint32_t addr) {
  return (uint64_t)((addr & 0x3FFFF) >> 4) | (uint64_t)(kWgCoreK >> 4) << 16 | (uint64_t)(kWgCoreN >> 4) << 32;
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// wg_fence_acc pins the accumulators' values at this point of the program:
// the compiler neither moves their zeroing past a wgmma_fence nor their
// reads before a wgmma_wait.
template <int R>
__device__ __forceinline__ void wg_fence_acc(float (&acc)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(acc[i])::"memory");
}
// Generic-proxy stores to shared memory become visible to wgmma's reads.
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
__device__ __forceinline__ void st_shared_u32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.u32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
}

// Wgmma<N>::run: D[64][N] += A[64][16] (registers: this warp's 16 rows) ·
// B[16][N] (shared memory, descriptor b), bf16 in, fp32 accumulate. (The
// operand lists are written out: inline asm takes no ranges.)
template <int N>
struct Wgmma;
template <>
struct Wgmma<8> {
  static __device__ __forceinline__ void run(float (&d)[4], const uint32_t (&a)[4], uint64_t b) {
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %9, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, %8, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
  }
};
template <>
struct Wgmma<16> {
  static __device__ __forceinline__ void run(float (&d)[8], const uint32_t (&a)[4], uint64_t b) {
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %13, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7}, "
        "{%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
  }
};
template <>
struct Wgmma<32> {
  static __device__ __forceinline__ void run(float (&d)[16], const uint32_t (&a)[4], uint64_t b) {
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %21, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
        "{%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
  }
};
template <>
struct Wgmma<64> {
  static __device__ __forceinline__ void run(float (&d)[32], const uint32_t (&a)[4], uint64_t b) {
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
  }
};

// wg_load_a reads the A fragments of a slice's two k16 steps: 16 bytes of
// this lane's row g at addr and of row g + 8 at addr + row8. Step s's
// registers hold (row g, k 2t..), (row g + 8, k 2t..), (row g, k 2t + 8..),
// (row g + 8, k 2t + 8..); they are settled before the caller's
// wgmma_fence (an instruction defining them after it would serialise the
// wgmmas: ptxas C7513).
__device__ __forceinline__ void wg_load_a(uint32_t (&a)[2][4], uint32_t addr, uint32_t row8) {
  const uint4 r0 = ld_shared_16(addr), r8 = ld_shared_16(addr + row8);
  a[0][0] = r0.x, a[0][1] = r8.x, a[0][2] = r0.y, a[0][3] = r8.y;
  a[1][0] = r0.z, a[1][1] = r8.z, a[1][2] = r0.w, a[1][3] = r8.w;
#pragma unroll
  for (int s = 0; s < 2; ++s) asm volatile("" : "+r"(a[s][0]), "+r"(a[s][1]), "+r"(a[s][2]), "+r"(a[s][3])::"memory");
}

// wg_store_x writes 4 elements of x (token n, columns p .. p + 3 of a
// sub-block, p a multiple of 4) into the buffer at xb as bf16 hi (+ lo).
template <int MT, bool LO>
__device__ __forceinline__ void wg_store_x(uint32_t xb, int n, int p, float4 f) {
  const uint32_t a = xb + wg_x_offset<MT>(n, p);
  const uint32_t h0 = pack2<__nv_bfloat16>(f.x, f.y), h1 = pack2<__nv_bfloat16>(f.z, f.w);
  st_shared_u32(a, h0);
  st_shared_u32(a + kWgCoreK, h1);
  if constexpr (LO) {
    const float2 r0 = unpack2<__nv_bfloat16>(h0), r1 = unpack2<__nv_bfloat16>(h1);
    st_shared_u32(a + 4 * wg_step_bytes(MT), pack2<__nv_bfloat16>(f.x - r0.x, f.y - r0.y));
    st_shared_u32(a + 4 * wg_step_bytes(MT) + kWgCoreK, pack2<__nv_bfloat16>(f.z - r1.x, f.w - r1.y));
  }
}

// WgX stages x's sub-blocks for a task: load reads this thread's elements
// of sub-block sb into registers (issued before the wgmmas of the one
// before), store writes them into a buffer. Thread i takes token i/16 +
// 32·r, columns 4·(i%16) .. + 3; tokens past M are zeros.
template <int K, int M, bool LO>
struct WgX {
  static constexpr int MT = wg_tokens(M), R = MT * kWgSub / 4 / MPK_THREADS;
  static_assert(MPK_THREADS == 512 && R >= 1, "the staging assumes 16 threads a token row");
  float4 f[R];
  template <int N>
  __device__ __forceinline__ void load(const View& x, bool rows4, int sb, const Slots<N>& s) {
    const char* p = base(s, x);
    const int n0 = threadIdx.x / 16, col = sb * kWgSub + 4 * (threadIdx.x % 16);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int m = n0 + 32 * r;
      f[r] = make_float4(0.f, 0.f, 0.f, 0.f);
      if (m >= M) continue;
      if (rows4) {
        f[r] = ld_float4(p, x.dtype, x.offset + m * x.stride[0] + col);
      } else {
        float v[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          int64_t idx[2] = {m, col + e};
          v[e] = (float)load_elem(p, x.dtype, offset_of(x, idx));
        }
        f[r] = make_float4(v[0], v[1], v[2], v[3]);
      }
    }
  }
  __device__ __forceinline__ void store(uint32_t xb) const {
#pragma unroll
    for (int r = 0; r < R; ++r) wg_store_x<MT, LO>(xb, threadIdx.x / 16 + 32 * r, 4 * (threadIdx.x % 16), f[r]);
  }
};

template <typename T, int K, int M, bool LO, int P, bool RESID, typename EPI, int N>
__device__ uint32_t linear_wgmma(const Op& op, int lo, int hi, const Slots<N>& s, const Ctx c) {
  static_assert(std::is_same<T, __nv_bfloat16>::value, "wgmma streams take bf16 weights");
  static_assert(!kIsPair<EPI>, "a paired Linear streams with x in registers only (stream.For)");
  static_assert(K % kGemmCols == 0 && M >= 1 && M <= 64 && kGemmRows == 64 && kWgWarpgroups == 4,
                "codegen and the task library disagree on a wgmma stream");
  using X = WgX<K, M, LO>;
  constexpr int MT = X::MT, NW = MT / kWgWarpgroups, XB = wg_xbuf_bytes(MT, LO), QS = wg_step_bytes(MT);
  constexpr int KB = K / kGemmCols, SUBS = kGemmCols / kWgSub;
  const View& x = op.in[0];
  const bool rows4 = rows4_ok<K>(x, s);
  const uint32_t xs = smem_u32(c.smem);
  const Ring<P> ring = ring_at<P>(c.ring);
  uint32_t seq = c.seq;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  const int wq = warp % 4, wt = warp / 4;  // the warp's 16 rows of A; its warpgroup's NW tokens
  const int rows = hi - lo, pages = (rows + kGemmPageRows - 1) / kGemmPageRows;
  // A warp's 16 rows lie in one page. A warp past the task's rows reads
  // page 0's instead (finite values, never stored): a select of the A
  // registers would sit between the wgmmas and serialise them (ptxas C7513).
  const int my_page = wq * 16 / kGemmPageRows < pages ? wq * 16 / kGemmPageRows : 0;
  const int a_row = wq * 16 % kGemmPageRows + g;
  X xst;
  xst.load(x, rows4, 0, s);
  xst.store(xs);
  fence_async_smem();
  consumer_sync();
  mark_staged();
  float acc[NW / 2];
#pragma unroll
  for (int i = 0; i < NW / 2; ++i) acc[i] = 0.f;
  wg_fence_acc(acc);  // zeroed before the first wgmma_fence (else ptxas C7515 serialises them)
  int sbg = 0;
#pragma unroll 1
  for (int kb = 0; kb < KB; ++kb, seq += pages) {
    wait_page(ring, seq + my_page, c.abort);
    const uint32_t page = smem_u32(ring.page(seq + my_page));
#pragma unroll 1
    for (int sb = 0; sb < SUBS; ++sb, ++sbg) {
      const bool next = sbg + 1 < KB * SUBS;
      if (next) xst.load(x, rows4, sbg + 1, s);  // in flight during this sub-block's wgmmas
      const uint32_t cur = xs + sbg % 3 * XB + wt * (NW / 8) * kWgCoreN;
#pragma unroll
      for (int jj = 0; jj < 2; ++jj) {
        // The wgmmas that last read the A registers are done.
        wgmma_wait<kWgDepth - 1>();
        const int slice = sb * 2 + jj;
        uint32_t a[2][4];
        wg_load_a(a, page + gemm_page_at(a_row, slice * 32 + 8 * t), gemm_page_at(8, 0));
        wgmma_fence();
#pragma unroll
        for (int st = 0; st < 2; ++st) {
          const uint32_t b = cur + (jj * 2 + st) * QS;
          Wgmma<NW>::run(acc, a[st], wg_desc(b));
          if constexpr (LO) Wgmma<NW>::run(acc, a[st], wg_desc(b + 4 * QS));
        }
        wgmma_commit();
      }
      if (sb == SUBS - 1)
        for (int p = 0; p < pages; ++p) ring.release(seq + p);  // the block's A is in registers
      if (next) {
        // Into the buffer sub-block sbg - 2 used: every warpgroup waited
        // for those wgmmas before the barrier that ended sbg - 1.
        xst.store(xs + (sbg + 1) % 3 * XB);
        fence_async_smem();
      }
      consumer_sync();
    }
  }
  wgmma_wait<0>();
  wg_fence_acc(acc);  // read only after the wait
  mark_dots();
  // acc[4i + {0, 1, 2, 3}]: rows (r, r, r + 8, r + 8) × tokens (8i + 2t, + 1, 8i + 2t, + 1).
  const int r = wq * 16 + g;
#pragma unroll
  for (int i = 0; i < NW / 8; ++i) {
    const int m = wt * NW + 8 * i + 2 * t;
    if (m < M && r < rows) store_out<RESID, EPI>(op, m, lo + r, acc[4 * i], s);
    if (m + 1 < M && r < rows) store_out<RESID, EPI>(op, m + 1, lo + r, acc[4 * i + 1], s);
    if (m < M && r + 8 < rows) store_out<RESID, EPI>(op, m, lo + r + 8, acc[4 * i + 2], s);
    if (m + 1 < M && r + 8 < rows) store_out<RESID, EPI>(op, m + 1, lo + r + 8, acc[4 * i + 3], s);
  }
  return seq;
}

}  // namespace mpk
