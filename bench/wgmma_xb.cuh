// linear_wgmma_xb (bench only, gemm_task.cu -DWGMMA=6): a gate/up pair's
// GEMM task at 64 rows of x where the consumers issue nothing but wgmmas:
// x arrives as two bf16 planes, hi and lo (x to ~16 significant bits, as
// mpk::linear_wgmma's split in registers keeps it), staged by TMA a block of
// 256 columns at a time, and D = W·xᵀ takes the weights' page as wgmma's A
// and x as its B, hi's 64 rows and lo's stacked along N: one m64n128k16 a
// k16 step a page, no loads of x's fragments, no split, no generic stores.
// In the megakernel the ops that write a GEMM stream's x would store the two
// planes (bench/NOTES.md, forty-sixth session); here the host makes them.
//
// Shared-memory bytes a block: pages 64 KB and x 64 KB written by TMA, A 64
// KB and B 128 KB read by the wgmmas (320 KB against linear_wgmma's 384).
//
// x's block: 4 column blocks (64 columns, 128-byte rows, 128-byte swizzled),
// each hi's 64 rows then lo's (8 KB each, a tensor-map box each), so a
// column block is one K-major B operand of 128 rows. Warpgroup w multiplies
// its page as linear_wgmma's pair does (weight w % 2, column half w / 2, 8
// k16 steps); its accumulators are D[weight row][hi token, lo token], the
// two summed into the pair's partials (two a weight: the column halves).
#pragma once
#include "tasks/wgmma.cuh"
#include "wgmma_ops.cuh"  // wgmma_ss_128

namespace mpk {

constexpr int kXbBlockBytes = 4 * 2 * kWgBlockBytes;  // a staged block of x: 4 column blocks of hi's and lo's rows

// The task's shared memory: two staged blocks of x and their two barriers
// (the partials, after the last block, take the blocks' bytes).
__host__ __device__ constexpr int wgmma_xb_scratch_bytes() { return 2 * kXbBlockBytes + 2 * 8; }

template <typename T, int K, int M, bool LO, int P, bool RESID, typename EPI, int N>
__device__ __forceinline__ uint32_t linear_wgmma_xb(const Op& op, int lo, int hi, const Slots<N>& s, const Ctx c,
                                                    const CUtensorMap* xmaps) {
  static_assert(std::is_same<T, __nv_bfloat16>::value && LO && kIsPair<EPI> && M == 64 && !MPK_GEMM_HI_ONLY,
                "a pair's bf16 weights, 64 rows of x in hi and lo");
  static_assert(K % kGemmCols == 0 && MPK_WG_SW128 && kWgWarpgroups == 4 && kGemmCols == 4 * (kWgRowBytes / 2),
                "a block is 4 column blocks of 64 columns");
  static_assert(2 * 64 * (2 * kGemmRows + kGemmRedPad) * 4 <= 2 * kXbBlockBytes, "the partials fit x's blocks");
  constexpr int KB = K / kGemmCols, PAGES = 4, STEPS = 2 * kWgBlockSteps;  // a page: two column blocks
  constexpr int RW = 2 * kGemmRows + kGemmRedPad;
  char* xs = c.smem;
  uint64_t* full = reinterpret_cast<uint64_t*>(c.smem + 2 * kXbBlockBytes);
  const Ring<P> ring = ring_at<P>(c.ring);
  uint32_t seq = c.seq;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wg = warp / 4, t = lane % 4;
  const int ch = wg / 2, wt = wg % 2, mine = ch * 2 + wt;  // column half, weight; its page of a block
  const int m = warp % 4 * 16 + lane / 4;                   // the thread's weight rows m and m + 8
  // Block kb's 8 boxes on its barrier, issued by thread 0.
  uint64_t policy = 0;  // x is every task's: kept in L2
  if (threadIdx.x == 0) asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  auto stage = [&](int kb) {
    if (threadIdx.x != 0) return;
    uint64_t* bar = full + kb % 2;
    mbar_expect_bytes(bar, kXbBlockBytes);
    for (int cb = 0; cb < 4; ++cb)
      for (int part = 0; part < 2; ++part)
        box_load_3d(xs + kb % 2 * kXbBlockBytes + (2 * cb + part) * kWgBlockBytes, xmaps + part, 0, 0, 4 * kb + cb,
                    bar, policy);
  };
  // The last task's partials (generic stores) are ordered before x's TMA
  // writes over them; the barriers start afresh.
  fence_async_smem();
  if (threadIdx.x == 0) {
    mbar_init(full, 1);
    mbar_init(full + 1, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  consumer_sync();
  stage(0);
  mark_staged();
  float acc[64];
  wg_zero_acc(acc);
#pragma unroll 1
  for (int kb = 0; kb < KB; ++kb) {
    if (kb + 1 < KB) stage(kb + 1);  // its buffer's last wgmmas ended before the barrier that ended block kb - 1
    for (int p = 0; p < PAGES; ++p)
      if (p != mine) ring.release(seq + p);
    wait_page(ring, seq + mine, c.abort);
    if (lane == 0)
      while (!mbar_test(full + kb % 2, (kb / 2) & 1)) {
      }
    __syncwarp();
    mbar_test(full + kb % 2, (kb / 2) & 1);  // every lane's acquire
    const uint32_t wp = smem_u32(ring.page(seq + mine)), xb = smem_u32(xs + kb % 2 * kXbBlockBytes);
    wgmma_fence();
#pragma unroll
    for (int st = 0; st < STEPS; ++st) {
      const int cb = st / kWgBlockSteps, k = st % kWgBlockSteps;  // the page's column block; its k16 step
      wgmma_ss_128(acc, wg_page_desc(wp + cb * kWgBlockBytes + 32 * k),
                   wg_swizzled_desc<128>(xb + (2 * (2 * ch + cb)) * kWgBlockBytes + 32 * k));
    }
    wgmma_commit();
    wgmma_wait<0>();
    ring.release(seq + mine);
    seq += PAGES;
    consumer_sync();
  }
  wg_fence_acc(acc);
  mark_dots();
  // acc[4i + e] for i < 8: weight row m (e 0, 1) or m + 8 (e 2, 3), hi's
  // token 8i + 2t + e % 2; i + 8: lo's same token. The partials go to
  // red[ch][token][n], n = wt·64 + weight row.
  float* red = reinterpret_cast<float*>(c.smem);
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int token = 8 * i + 2 * t + e % 2, row = m + (e >= 2 ? 8 : 0);
      red[(ch * 64 + token) * RW + wt * kGemmRows + row] = acc[4 * i + e] + acc[4 * (i + 8) + e];
    }
  consumer_sync();
  gemm_store_sums<2, true, RW, 64, M, RESID, EPI>(op, lo, hi, red, s);
  return seq;
}

}  // namespace mpk
