// linear_wgmma_p128 (bench only, gemm_task.cu -DWGMMA=5): a gate/up pair's
// GEMM task with both weights in one wgmma B operand of 128 rows: one
// m64n128k16 where mpk::linear_wgmma issues two m64n64k16 on two warpgroups
// that each load the same fragments of x.
//
// Why: a qwen3-8b pair block (64 KB of weights, 64 rows of x) takes ~2.9 us
// with L2-resident weights against ~1.04 for its MACs at the tensor cores'
// peak (bench/NOTES.md, forty-sixth session). This says whether wgmma's
// shape (N 128 against 64) and, at 32 rows of x (hi and lo stacked in the
// tile), half the loads of x's fragments move it.
//
// Pages: a block of 256 columns is 4 pages, page c holding column block c
// (64 columns, 128-byte rows, 128-byte swizzled) of the gate's 64 rows then
// of the up's (8 KB each, two tensor-map boxes: gemm_task.cu's loader), so a
// page is one K-major operand of 128 rows (8-row groups 1,024 bytes apart).
// Warpgroup w multiplies page w (its 4 k16 steps, x's columns 64w..64w+63);
// the four partials (one a warpgroup, 64 tokens x 128: gate's then up's)
// are summed and stored by gemm_store_sums as a pair's. 64 accumulators a
// thread leave the worker's 96 registers room for one operand's fragments:
// at 64 rows of x the hi part's steps run first, then the lo part's (the
// fragments loaded twice, as many loads as linear_wgmma's).
#pragma once
#include "tasks/wgmma.cuh"
#include "wgmma_ops.cuh"  // wgmma_rs_128
#include "wgmma_ss.cuh"   // ss_fast_x

namespace mpk {

constexpr int kP128HalfBytes = kWgBlockBytes;  // one weight's column block in a page: 64 rows x 128 bytes

// The task's shared memory: x's two staged blocks, or after the last block
// the four partials of 128 columns.
__host__ __device__ constexpr int wgmma_p128_scratch_bytes() {
  const int x = 2 * 64 * kWgPitch * 4, partials = 4 * 64 * (2 * kGemmRows + kGemmRedPad) * 4;
  return x > partials ? x : partials;
}

template <typename T, int K, int M, bool LO, int P, bool RESID, typename EPI, int N>
__device__ __forceinline__ uint32_t linear_wgmma_p128(const Op& op, int lo, int hi, const Slots<N>& s, const Ctx c) {
  static_assert(std::is_same<T, __nv_bfloat16>::value && LO && kIsPair<EPI>, "a pair's bf16 weights and an fp32 x");
  static_assert(K % kGemmCols == 0 && M >= 1 && M <= 64 && MPK_WG_SW128 && kWgWarpgroups == 4 &&
                    kGemmCols == 4 * (kWgRowBytes / 2),
                "a block is 4 column blocks of 64 columns, a warpgroup each");
  constexpr bool kLo = !MPK_GEMM_HI_ONLY;
  constexpr bool kStack = kLo && MPK_WG_STACK_LO && M <= 32;  // hi in the tile's rows 0-31, lo in 32-63
  constexpr int KB = K / kGemmCols, PAGES = 4, STEPS = kWgBlockSteps;  // a block's pages; k16 steps a page
  constexpr int PASSES = kLo && !kStack ? 2 : 1;                          // hi's steps, then lo's
  constexpr int RW = 2 * kGemmRows + kGemmRedPad;
  constexpr int NB = 2;  // x's staged blocks
  const View& x = op.in[0];
  const bool rows4 = rows4_ok<K>(x, s);
  const bool copy = ss_fast_x(x, s);  // as linear_wgmma's
  float* xs = reinterpret_cast<float*>(c.smem);
  auto buffer = [&](int kb) { return xs + kb % NB * 64 * kWgPitch; };
  const Ring<P> ring = ring_at<P>(c.ring);
  uint32_t seq = c.seq;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wg = warp / 4, t = lane % 4;
  const int m = warp % 4 * 16 + lane / 4;  // the thread's tokens m and m + 8
  const int xm = kStack ? m % 32 : m;
  const bool lo_rows = kStack && m >= 32;
  stage_gemm_x<T, float, kWgPitch, M>(x, 0, buffer(0), copy, rows4, s);
  cp_async_commit();
  cp_async_wait_pending<0>();
  consumer_sync();
  mark_staged();
  float acc[64];
  wg_zero_acc(acc);
#pragma unroll 1
  for (int kb = 0; kb < KB; ++kb) {
    if (kb + 1 < KB) stage_gemm_x<T, float, kWgPitch, M>(x, kb + 1, buffer(kb + 1), copy, rows4, s);
    cp_async_commit();
    for (int p = 0; p < PAGES; ++p)
      if (p != wg) ring.release(seq + p);
    wait_page(ring, seq + wg, c.abort);
    const uint32_t wp = smem_u32(ring.page(seq + wg)), xb = smem_u32(buffer(kb)) + wg * (kWgRowBytes / 2) * 4;
    // A wgmma a group, one set of A registers (the next step's loads wait
    // for this one's wgmma), and at 64 rows of x the hi part's k16 steps,
    // then the lo part's (their fragments loaded again): beside 64
    // accumulators at the worker's 96 registers, ptxas serialised the
    // wgmmas (C7512) with two steps a group, and with hi and lo a step.
#pragma unroll
    for (int pass = 0; pass < PASSES; ++pass)
#pragma unroll
      for (int st = 0; st < STEPS; ++st) {
        uint32_t ahi[4], alo[4], a[4];
        if (pass + st > 0) wgmma_wait<0>();
        wg_load_a(ahi, alo, xb, xm, st * 16 + 2 * t);
#pragma unroll
        for (int i = 0; i < 4; ++i) a[i] = pass == 1 || (kStack && lo_rows) ? alo[i] : ahi[i];
        wgmma_fence();
        wgmma_rs_128(acc, a, wg_page_desc(wp + 32 * st));
        wgmma_commit();
      }
    wgmma_wait<0>();
    ring.release(seq + wg);
    seq += PAGES;
    if (copy) cp_async_wait_pending<0>();  // block kb + 1 landed
    consumer_sync();
  }
  wg_fence_acc(acc);
  mark_dots();
  // acc[4i + ..] for i < 8: the gate's rows 8i + 2t, + 1; i >= 8 the up's.
  float* red = reinterpret_cast<float*>(c.smem);
  float gate[32], up[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) gate[i] = acc[i], up[i] = acc[32 + i];
  wg_put_partials<RW>(red, gate, wg * 64, 0, m, t);
  wg_put_partials<RW>(red, up, wg * 64, kGemmRows, m, t);
  consumer_sync();
  gemm_store_sums<4, true, RW, 64, M, RESID, EPI, kStack>(op, lo, hi, red, s);
  return seq;
}

}  // namespace mpk
