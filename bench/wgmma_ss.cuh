// Experimental GEMM-stream task bodies on the Hopper tensor cores with both
// operands in shared memory, measured only in bench/gemm_task.cu
// (bench/NOTES.md, thirty-third session):
//   -DWGMMA=2  linear_wgmma_ss: 32-row pages, m64n32k16, x staged as bf16
//              hi + lo each sub-block
//   -DWGMMA=3  linear_wgmma_ss64: the same with 64-row pages of 128 columns,
//              m64n64k16
// Both pass the fp64 check and were no faster than mpk::linear_gemm
// (mma.sync): the products, x's staging and a barrier a sub-block did not
// overlap the stream. mpk::linear_wgmma (x as A from registers, -DWGMMA=1)
// is what moved into the megakernel.
//
// linear_wgmma_ss: one instruction per 64 x 32 x 16 product instead of
// linear_gemm's ~10 a mma.sync m16n8k16 (index math, x's hi/lo split by
// every page's warps, B fragments loaded a lane at a time).
//
// D[token][weight row] += x[token][k] · W[row][k], as wgmma m64n32k16:
// - B, the weights: the ring page as the loader's tensor map landed it (32
//   rows, column blocks of 32 columns, 64 bytes a row, with the map's
//   64-byte swizzle: 16-byte chunk c of row r at chunk c ^ (r/2 % 4)),
//   which is wgmma's K-major 64-byte-swizzle layout (8-row groups 512 bytes
//   apart). A k16 step is 32 bytes into a column block.
// - A, x: staged by the consumers MPK_SS_COLS columns (a sub-block) at a
//   time as bf16 hi (+ lo for an fp32 x: hi + lo keeps ~16 significant
//   bits, a wgmma each) in the same layout, 64 token rows (rows past M zero).
// Warpgroup w takes one page: a pair's (gate rows 0-31, 32-63, up 0-31,
// 32-63) over every column; a single weight's page w % 2 over half the
// column blocks of each sub-block (two partials, summed at the end).
// Sub-blocks rotate through three x buffers, so one barrier a sub-block
// orders a buffer's reuse after every warpgroup's wgmmas that read it.
#pragma once
#include "tasks/wgmma.cuh"  // (csrc/, with -Icsrc)

namespace mpk {

// MPK_SS_COLS: x's columns staged at a time (a sub-block: 64 or 128).
#ifndef MPK_SS_COLS
#define MPK_SS_COLS 64
#endif
// MPK_SS_XDEPTH: sub-blocks of x whose loads are in flight at once.
#ifndef MPK_SS_XDEPTH
#define MPK_SS_XDEPTH 3
#endif
constexpr int kSsHalf = MPK_SS_COLS;  // x's columns staged at a time
static_assert(kSsHalf == 64 || kSsHalf == 128, "a sub-block is one or two pairs of column blocks");
constexpr int kSsBlockBytes = 64 * kGemmBlockCols * 2;  // a staged column block: 64 tokens × 64 bytes
constexpr int kSsPartBytes = kSsHalf / kGemmBlockCols * kSsBlockBytes;  // hi (or lo) of a half block: 16 KB

// The task's shared memory (1,024-byte aligned by the caller): three x
// buffers, or, after the last block, the partials [2][64][64] (a pair's
// [1][64][128]).
__host__ __device__ constexpr int wgmma_ss_scratch_bytes(bool lo) {
  const int x = 3 * (lo ? 2 : 1) * kSsPartBytes, partials = 2 * 64 * (kGemmRows + kGemmRedPad) * 4;
  return x > partials ? x : partials;
}

// sw64 is where a 64-byte-swizzled tile holds row r's 16-byte chunk c.
__device__ __forceinline__ uint32_t sw64(int r, int c) { return r * 64 + ((c ^ (r >> 1)) & 3) * 16; }
// wg_sw64_desc: a 64-byte-swizzled operand's wgmma descriptor (these
// bodies' x tiles, and their pages: built with -DMPK_WG_SW128=0).
__device__ __forceinline__ uint64_t wg_sw64_desc(uint32_t addr) { return wg_swizzled_desc<64>(addr); }


// (m64n32k16 from shared memory: tasks/wgmma_ops.cuh's wgmma_ss_32.)

__device__ __forceinline__ void st_shared_16(uint32_t addr, uint4 v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

// SsX holds this thread's part of a half block of x between its load and
// its store: two units of 8 tokens × 32 columns a warp (lane: token l/4,
// 8 columns at chunk l % 4), so a warp's stores fill 512 contiguous bytes.
template <int M>
struct SsX {
  static constexpr int R = kSsHalf / 64;  // units a warp
  float4 f[R][2];
  template <int N>
  __device__ __forceinline__ void load(const View& x, bool fast, int half, const Slots<N>& s) {
    const char* p = base(s, x);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int u = warp + 16 * r, m = u % 8 * 8 + lane / 4, col = half * kSsHalf + u / 8 * 32 + lane % 4 * 8;
      f[r][0] = f[r][1] = make_float4(0.f, 0.f, 0.f, 0.f);
#if defined(MPK_TRACE) && defined(MPK_PROBE_SS_NO_XLOAD)
      continue;  // probe (results wrong): what x's loads cost
#endif
      if (m >= M) continue;
      if (fast) {
        const float4* q = reinterpret_cast<const float4*>(p + (x.offset + m * x.stride[0] + col) * 4);
        f[r][0] = q[0], f[r][1] = q[1];
      } else {
        float v[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          int64_t idx[2] = {m, col + e};
          v[e] = (float)load_elem(p, x.dtype, offset_of(x, idx));
        }
        f[r][0] = make_float4(v[0], v[1], v[2], v[3]), f[r][1] = make_float4(v[4], v[5], v[6], v[7]);
      }
    }
  }
  // store writes hi at xb, lo (with LO) kSsPartBytes further.
  template <bool LO>
  __device__ __forceinline__ void store(uint32_t xb) const {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int u = warp + 16 * r, m = u % 8 * 8 + lane / 4;
      const uint32_t a = xb + u / 8 * kSsBlockBytes + sw64(m, lane % 4);
      const float v[8] = {f[r][0].x, f[r][0].y, f[r][0].z, f[r][0].w, f[r][1].x, f[r][1].y, f[r][1].z, f[r][1].w};
      uint32_t h[4], l[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        h[i] = pack2<__nv_bfloat16>(v[2 * i], v[2 * i + 1]);
        const float2 b = unpack2<__nv_bfloat16>(h[i]);
        l[i] = pack2<__nv_bfloat16>(v[2 * i] - b.x, v[2 * i + 1] - b.y);
      }
      st_shared_16(a, make_uint4(h[0], h[1], h[2], h[3]));
      if constexpr (LO) st_shared_16(a + kSsPartBytes, make_uint4(l[0], l[1], l[2], l[3]));
    }
  }
};

// ss_fast_x: x is fp32 rows whose 8-column pieces load as two float4s.
template <int N>
__device__ __forceinline__ bool ss_fast_x(const View& x, const Slots<N>& s) {
  return x.dtype == DT_FLOAT32 && float_row2(x) && x.stride[0] % 4 == 0 &&
         (reinterpret_cast<uintptr_t>(base(s, x)) + x.offset * 4) % 16 == 0;
}

// ss_stage_first stages x's sub-block 0 at xs and starts loading sub-blocks
// 1 .. XD into xr (x(j) in xr[j % XD]), then a barrier.
template <int M, bool LO, int XD, int HALVES, int N>
__device__ __forceinline__ void ss_stage_first(SsX<M> (&xr)[XD], const View& x, bool fast, uint32_t xs,
                                               const Slots<N>& s) {
  xr[0].load(x, fast, 0, s);
  xr[0].template store<LO>(xs);
#pragma unroll
  for (int j = 1; j <= XD; ++j)
    if (j < HALVES) xr[j % XD].load(x, fast, j, s);
  fence_async_smem();
  consumer_sync();
  mark_staged();
}

// ss_sub_blocks calls body(h, the registers of x(h + 1)) for every
// sub-block h, XD a trip so each one's registers are named statically.
template <int XD, int HALVES, typename X, typename Body>
__device__ __forceinline__ void ss_sub_blocks(X (&xr)[XD], Body& body) {
#pragma unroll 1
  for (int h0 = 0; h0 < HALVES; h0 += XD)
#pragma unroll
    for (int i = 0; i < XD; ++i)
      if (h0 + i < HALVES) body(h0 + i, xr[(i + 1) % XD]);
}

template <typename T, int K, int M, bool LO, int P, bool RESID, typename EPI, int N>
__device__ __forceinline__ uint32_t linear_wgmma_ss(const Op& op, int lo, int hi, const Slots<N>& s, const Ctx c) {
  static_assert(std::is_same<T, __nv_bfloat16>::value, "wgmma streams take bf16 weights");
  static_assert(K % kGemmCols == 0 && M >= 1 && M <= 64 && kGemmRows == 64 && kWgWarpgroups == 4 &&
                    kGemmPageRows == 32 && MPK_GEMM_BLOCKED_PAGES,
                "codegen and the task library disagree on a wgmma stream");
  constexpr int NW = kIsPair<EPI> ? 2 : 1;  // weights a task streams (a pair: gate's rows, then up's)
  constexpr bool kLo = LO && !MPK_GEMM_HI_ONLY;  // x's lo part staged and applied
  constexpr int SUBS = kGemmCols / kSsHalf, HALVES = K / kSsHalf, XB = (kLo ? 2 : 1) * kSsPartBytes;
  // With room for two blocks' pages in the ring, a block's pages are
  // released once its wgmmas are known done (the next block's wait<1>),
  // and the next block's pages land meanwhile; else every warpgroup drains
  // its wgmmas at a block's start so the loader can refill the slots.
  constexpr bool kLate = P >= 2 * NW * (kGemmRows / kGemmPageRows);
  constexpr int WK = 2 / NW, RW = NW * kGemmRows + kGemmRedPad;  // partials; a partial's row (padded)
  const View& x = op.in[0];
  const bool fast = ss_fast_x(x, s);
  const uint32_t xs = smem_u32(c.smem);
  const Ring<P> ring = ring_at<P>(c.ring);
  uint32_t seq = c.seq;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wg = warp / 4;
  const int rows = hi - lo, per = (rows + kGemmPageRows - 1) / kGemmPageRows;  // pages a block a weight
  const int pages = NW * per;
  const int pw = wg % 2, mine = pw < per ? (NW == 2 ? wg / 2 * per + pw : pw) : -1;  // the block's page it reads
  const int kh = NW == 2 ? 0 : wg / 2;  // a single weight's column blocks: 2kh, 2kh + 1 of a half
  // x of sub-blocks h + 1 .. h + XD in registers (x(j) in xr[j % XD]): an
  // L2 round trip under the weight stream outlasts a sub-block's wgmmas.
  constexpr int XD = MPK_SS_XDEPTH;
  SsX<M> xr[XD];
  ss_stage_first<M, kLo, XD, HALVES>(xr, x, fast, xs, s);
  float acc[16];
  wg_zero_acc(acc);
  auto sub_block = [&](const int h, SsX<M>& next) {
    const int kb = h / SUBS;
    if (h % SUBS == 0) {
      if (!kLate && kb > 0) {
        wgmma_wait<0>();
        for (int p = 0; p < pages; ++p) ring.release(seq - pages + p);
      }
      if (mine >= 0) wait_page(ring, seq + mine, c.abort);
      seq += pages;
    }
    wgmma_fence();
#if defined(MPK_TRACE) && defined(MPK_PROBE_SS_NO_MMA)
    if (false)  // probe (results wrong): what the wgmmas cost
#endif
    if (mine >= 0) {
      const uint32_t wp = smem_u32(ring.page(seq - pages + mine)) + h % SUBS * (kSsHalf / kGemmBlockCols) * 2048;
      const uint32_t xb = xs + h % 3 * XB;
      // A single weight's warpgroup takes half the column blocks, by
      // address (a branch around a wgmma serialises them all: ptxas C7519).
#pragma unroll
      for (int j = 0; j < kSsHalf / kGemmBlockCols / WK; ++j) {
        const int cb = kh * (kSsHalf / kGemmBlockCols / WK) + j;
#pragma unroll
        for (int st = 0; st < 2; ++st) {
          const uint32_t a = xb + cb * kSsBlockBytes + 32 * st, b = wp + cb * 2048 + 32 * st;
          wgmma_ss_32(acc, wg_sw64_desc(a), wg_sw64_desc(b));
          if constexpr (kLo) wgmma_ss_32(acc, wg_sw64_desc(a + kSsPartBytes), wg_sw64_desc(b));
        }
      }
    }
    wgmma_commit();
    if (h + 1 < HALVES) {
      // Into the buffer half h - 2 read: every warpgroup waited for those
      // wgmmas before the barrier that ended half h - 1.
      next.template store<kLo>(xs + (h + 1) % 3 * XB);
      fence_async_smem();
      if (h + 1 + XD < HALVES) next.load(x, fast, h + 1 + XD, s);
    }
    wgmma_wait<1>();
    // Sub-block h - 1's wgmmas are done: if it ended the last block, its
    // pages go back to the loader.
    if (kLate && h % SUBS == 0 && h > 0)
      for (int p = 0; p < pages; ++p) ring.release(seq - 2 * pages + p);
    consumer_sync();
  };
  ss_sub_blocks<XD, HALVES>(xr, sub_block);
  wgmma_wait<0>();
  wg_fence_acc(acc);
  for (int p = 0; p < pages; ++p) ring.release(seq - pages + p);
  mark_dots();
  consumer_sync();  // x's buffers become the partials
  // acc[4i + {0, 1, 2, 3}]: tokens (m, m, m + 8, m + 8) × the page's rows
  // (8i + 2t, + 1, 8i + 2t, + 1), m = 16·(warp % 4) + lane / 4.
  float* red = reinterpret_cast<float*>(c.smem);
  if (mine >= 0) {
    const int m = warp % 4 * 16 + lane / 4, n0 = (NW == 2 ? wg / 2 * kGemmRows : 0) + pw * kGemmPageRows + 2 * (lane % 4);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float2* r = reinterpret_cast<float2*>(red + (kh * 64 + m) * RW + n0 + 8 * i);
      r[0] = make_float2(acc[4 * i], acc[4 * i + 1]), r[4 * RW] = make_float2(acc[4 * i + 2], acc[4 * i + 3]);
    }
  }
  consumer_sync();
  gemm_store_sums<WK, NW == 2, RW, 64, M, RESID, EPI>(op, lo, hi, red, s);
  return seq;
}

// linear_wgmma_ss64 (bench/gemm_task.cu -DWGMMA=3, an experiment): as
// linear_wgmma_ss, but each page holds 64 weight rows × 128 columns (four
// column blocks of 64 rows, 4 KB each), so a wgmma takes all 64 rows of a
// weight (m64n64k16: wgmma's fixed cost a instruction over twice the
// products of n32). A block of 256 columns is two pages a weight (column
// halves), the loader's order: weight 0's, then weight 1's. Each sub-block
// of 64 columns (four k16 steps) is split over the warpgroups by weight and
// k16 step: a pair's warpgroup w takes weight w/2, steps 2(w%2), +1 (two
// partials a weight); a single weight's takes step w (four partials).
constexpr int kSs64PageCols = kWgPageCols, kSs64Block = kWgBlockBytes;  // tasks/wgmma.cuh's pages
__host__ __device__ constexpr int wgmma_ss64_scratch_bytes(bool lo) {
  const int x = 3 * (lo ? 2 : 1) * kSsPartBytes, partials = 4 * 64 * (kGemmRows + kGemmRedPad) * 4;
  return x > partials ? x : partials;
}

template <typename T, int K, int M, bool LO, int P, bool RESID, typename EPI, int N>
__device__ __forceinline__ uint32_t linear_wgmma_ss64(const Op& op, int lo, int hi, const Slots<N>& s, const Ctx c) {
  static_assert(kSsHalf == 64 && kGemmRows == 64 && kSs64PageCols == 2 * kSsHalf, "a sub-block is half a page's columns");
  constexpr int NW = kIsPair<EPI> ? 2 : 1;
  constexpr bool kLo = LO && !MPK_GEMM_HI_ONLY;
  constexpr int HALVES = K / kSsHalf, XB = (kLo ? 2 : 1) * kSsPartBytes;
  // Pages come in groups of NW (a column half's page of each weight, the
  // loader's order); group g is read by sub-blocks 2g and 2g + 1 and released
  // once sub-block 2g + 1's wgmmas are known done (sub-block 2g + 2's
  // wait<1>), so the loader refills a page every sub-block or two rather
  // than a block's four at once.
  constexpr int PAGES = NW;  // a group's
  static_assert(P >= 2 * PAGES + 1, "the ring holds two groups and one in flight");
  constexpr int WK = 4 / NW, RW = NW * kGemmRows + kGemmRedPad;  // partials; a partial's row (padded)
  const View& x = op.in[0];
  const bool fast = ss_fast_x(x, s);
  const uint32_t xs = smem_u32(c.smem);
  const Ring<P> ring = ring_at<P>(c.ring);
  uint32_t seq = c.seq;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wg = warp / 4;
  const int wt = NW == 2 ? wg / 2 : 0, kp = NW == 2 ? wg % 2 : wg;  // weight; partial (its k16 steps)
  constexpr int XD = MPK_SS_XDEPTH;
  SsX<M> xr[XD];
  ss_stage_first<M, kLo, XD, HALVES>(xr, x, fast, xs, s);
  float acc[32];
  wg_zero_acc(acc);
  auto sub_block = [&](const int h, SsX<M>& next) {
    const int q = h % 2;  // the sub-block's column quarter of its group's pages
    if (q == 0) {
#if defined(MPK_TRACE) && defined(MPK_PROBE_SS_WAIT_ALL)
      for (int p = 0; p < PAGES; ++p) wait_page(ring, seq + p, c.abort);  // probe: every warp every page
#endif
      wait_page(ring, seq + wt, c.abort);
      seq += PAGES;
    }
    wgmma_fence();
#if defined(MPK_TRACE) && defined(MPK_PROBE_SS_NO_MMA)
    if (false)
#endif
    {
      // Its column blocks 2q, 2q + 1 of the weight's page of the group.
      const uint32_t wp = smem_u32(ring.page(seq - PAGES + wt)) + q * 2 * kSs64Block;
      const uint32_t xb = xs + h % 3 * XB;
#pragma unroll
      for (int j = 0; j < 4 / WK; ++j) {
        const int step = kp * (4 / WK) + j, cb = step / 2, st = step % 2;  // k16 step of the quarter
        const uint32_t a = xb + cb * kSsBlockBytes + 32 * st, b = wp + cb * kSs64Block + 32 * st;
        wgmma_ss_64(acc, wg_sw64_desc(a), wg_sw64_desc(b));
        if constexpr (kLo) wgmma_ss_64(acc, wg_sw64_desc(a + kSsPartBytes), wg_sw64_desc(b));
      }
    }
    wgmma_commit();
    if (h + 1 < HALVES) {
#if !(defined(MPK_TRACE) && defined(MPK_PROBE_SS_NO_XSTORE))  // probe (results wrong): what x's stores cost
      next.template store<kLo>(xs + (h + 1) % 3 * XB);
#endif
#if !(defined(MPK_TRACE) && defined(MPK_PROBE_SS_NO_FENCE))  // probe (results wrong): what the proxy fence costs
      fence_async_smem();
#endif
      if (h + 1 + XD < HALVES) next.load(x, fast, h + 1 + XD, s);
    }
    wgmma_wait<1>();
    if (q == 0 && h > 0)
      for (int p = 0; p < PAGES; ++p) ring.release(seq - 2 * PAGES + p);
#if !(defined(MPK_TRACE) && defined(MPK_PROBE_SS_NO_SYNC))  // probe (results wrong): what the barrier costs
    consumer_sync();
#endif
  };
  ss_sub_blocks<XD, HALVES>(xr, sub_block);
  wgmma_wait<0>();
  wg_fence_acc(acc);
  for (int p = 0; p < PAGES; ++p) ring.release(seq - PAGES + p);
  mark_dots();
#if defined(MPK_TRACE) && defined(MPK_PROBE_SS_NO_EPI)
  return seq;  // probe (results wrong): what the partials and the stores cost
#endif
  consumer_sync();
  float* red = reinterpret_cast<float*>(c.smem);
  wg_put_partials<RW>(red, acc, kp * 64, wt * kGemmRows, warp % 4 * 16 + lane / 4, lane % 4);
  consumer_sync();
  gemm_store_sums<WK, NW == 2, RW, 64, M, RESID, EPI>(op, lo, hi, red, s);
  return seq;
}

}  // namespace mpk
