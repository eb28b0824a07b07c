// An experimental GEMM task body for bench/gemm_task.cu (-DWGMMA=4; not
// used by the megakernel): mpk::linear_wgmma with its warpgroups decoupled.
// linear_wgmma ends every block with a barrier of all 16 consumer warps:
// x's next block was staged by every thread's cp.async (visible to the
// others only after a barrier), and the pages a warpgroup does not read are
// released at the block's start, before they land (sound only while no warp
// is a block ahead). Alone on the H200 (bench/NOTES.md, forty-first
// session) a block costs about the sum of its parts (qwen3-8b's pair: 3.1 us,
// 2.6 without restaging x, 2.5 without wgmmas, 2.0 for the pages alone),
// and without the barrier the ring breaks. Here:
// - x's blocks land by bulk copies (a row of 1 KB each, lanes of warp 0
//   issuing them) on a full barrier a buffer, and each warp arrives on the
//   buffer's empty barrier with its page's release, after its wgmmas (a
//   lane's arrival among the wgmmas put a divergent path there: ptxas
//   serialised them, C7519; every thread's arrival instead made a block
//   half as slow again); warp 0 waits for that before restaging the buffer;
// - a warp releases the pages it does not read only once its own page of a
//   later position has landed (pages land in order, so they have landed,
//   and their slots' previous fills were released);
// - no barrier of all warps between blocks: a warpgroup runs ahead as far
//   as x's buffers and the ring let it.
// Measured (H200, same call): correct (the fp64 check), but slower than
// linear_wgmma everywhere: qwen3-8b's pair 4.79 us a block against 3.10,
// llama-3.2-1b's pair 4.44 against 3.14, its down slice 3.40 against 2.16.
// Not yet known why (results/gemm-task-s41-nvidia-h200.txt); suspects:
// warp 0, which computes too, issuing 32-64 bulk copies of 1 KB a block
// and waiting on the empty barrier for the slowest warp; 512 threads
// polling each full barrier; the deferred releases holding pages a block
// longer in a ring of 5.
#pragma once
#include "tasks/wgmma.cuh"

namespace mpk {

// The x buffers' barriers sit past the two 64-row blocks of x.
constexpr int kDxBarOffset = 2 * 64 * kWgPitch * 4;
__host__ __device__ constexpr int wgmma_dx_scratch_bytes() { return kDxBarOffset + 4 * 8; }

__device__ __forceinline__ uint64_t x_policy() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));
  return p;
}

__device__ __forceinline__ void spin_parity(uint64_t* bar, uint32_t parity) {
  while (!mbar_test(bar, parity)) {
  }
}

// DX_XMAP=1: x's block lands as one box of a 3-D tensor map (bench/
// gemm_task.cu's encode_x: 32 floats, M rows, 8 groups of 32 columns; 128-
// byte swizzle), not as M bulk copies of a row: the TMA unit takes each
// request in turn, so 64 copies of 1 KB a block may be what made this body
// slow. The block lies [group][row][128 bytes], each row's 16-byte chunk c
// at c ^ (row % 8) (no padded rows: a half-warp's float2 loads of rows
// m..m + 3 fall two to a bank).
#ifndef DX_XMAP
#define DX_XMAP 0
#endif

// dx_load_a is wg_load_a over a swizzled block of M rows: the fragments of
// tokens m and m + 8 at column k (of the block's 256) and k + 8.
template <int M>
__device__ __forceinline__ void dx_load_a(uint32_t (&hi)[4], uint32_t (&lo)[4], uint32_t xb, int m, int k) {
  auto at = [&](int r, int c) {
    const int cc = c & 31;
    return xb + (c >> 5) * (M * 128) + r * 128 + ((((cc >> 2) ^ (r & 7))) << 4) + (cc & 3) * 4;
  };
  float2 v[4];
  const uint32_t ad[4] = {at(m, k), at(m + 8, k), at(m, k + 8), at(m + 8, k + 8)};
#pragma unroll
  for (int i = 0; i < 4; ++i) asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(v[i].x), "=f"(v[i].y) : "r"(ad[i]));
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    hi[i] = pack2<__nv_bfloat16>(v[i].x, v[i].y);
    const float2 b = unpack2<__nv_bfloat16>(hi[i]);
    lo[i] = pack2<__nv_bfloat16>(v[i].x - b.x, v[i].y - b.y);
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(hi[i]), "+r"(lo[i])::"memory");
}

template <typename T, int K, int M, bool LO, int P, bool RESID, typename EPI, int N>
__device__ __forceinline__ uint32_t linear_wgmma_dx(const Op& op, int lo, int hi, const Slots<N>& s, const Ctx c,
                                                    const void* xmap = nullptr) {
  static_assert(std::is_same<T, __nv_bfloat16>::value && LO && !MPK_GEMM_HI_ONLY, "bf16 weights, an fp32 x");
  constexpr int NW = kIsPair<EPI> ? 2 : 1;
  constexpr bool kStack = MPK_WG_STACK_LO && M <= 32;
  constexpr int KB = K / kGemmCols, PAGES = 2 * NW, STEPS = NW == 2 ? 8 : 4;
  constexpr int WK = 4 / NW, RW = NW * kGemmRows + kGemmRedPad, NB = 2;
  const View& x = op.in[0];
  float* xs = reinterpret_cast<float*>(c.smem);
  uint64_t* full = reinterpret_cast<uint64_t*>(c.smem + kDxBarOffset);
  uint64_t* empty = full + NB;
  auto buffer = [&](int kb) { return xs + kb % NB * 64 * kWgPitch; };
  const float* xg = reinterpret_cast<const float*>(base(s, x)) + x.offset;
  const Ring<P> ring = ring_at<P>(c.ring);
  uint32_t seq = c.seq;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wg = warp / 4, t = lane % 4;
  const int ch = wg / 2, wt = NW == 2 ? wg % 2 : 0, kp = NW == 2 ? ch : wg;
  const int mine = ch * NW + wt, step0 = NW == 2 ? 0 : 4 * (wg % 2);
  const int m = warp % 4 * 16 + lane / 4;
  const int xm = kStack ? m % 32 : m;
  const bool lo_rows = kStack && m >= 32;
  if (threadIdx.x == 0) {
    for (int b = 0; b < NB; ++b) mbar_init(&full[b], 1), mbar_init(&empty[b], kConsumerWarps);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  consumer_sync();
  // Warp 0 stages block kb: lane 0 arms the buffer's full barrier with the
  // block's bytes, then each lane copies rows lane, lane + 32.
  const uint64_t policy = x_policy();
  auto stage = [&](int kb) {
    uint64_t* bar = &full[kb % NB];
    if (lane == 0) mbar_expect_bytes(bar, M * kGemmCols * 4);
    if constexpr (DX_XMAP) {
      if (lane == 0) box_load_3d(buffer(kb), xmap, 0, 0, kb * kGemmCols / 32, bar, policy);
    } else {
      __syncwarp();
      for (int r = lane; r < M; r += 32)
        bulk_load(buffer(kb) + r * kWgPitch, xg + r * x.stride[0] + kb * kGemmCols, kGemmCols * 4, bar, policy);
    }
  };
  if (warp == 0) stage(0);
  mark_staged();
  float acc[32];
  wg_zero_acc(acc);
#pragma unroll 1
  for (int kb = 0; kb < KB; ++kb) {
    if (warp == 0 && kb + 1 < KB) {
      if (kb + 1 >= NB) spin_parity(&empty[(kb + 1) % NB], ((kb + 1) / NB - 1) & 1);  // block kb - 1 read
      stage(kb + 1);
    }
    wait_page(ring, seq + mine, c.abort);
    // Landed in order: the last block's pages past this warp's, and this
    // block's before it.
    if (kb > 0)
      for (int p = mine + 1; p < PAGES; ++p) ring.release(seq - PAGES + p);
    for (int p = 0; p < mine; ++p) ring.release(seq + p);
    spin_parity(&full[kb % NB], (kb / NB) & 1);
    const uint32_t wp = smem_u32(ring.page(seq + mine)), xb = smem_u32(buffer(kb)) + ch * kWgPageCols * 4;
    wg_block_dots<STEPS, true, kStack>(acc, wp, step0, lo_rows, [&](uint32_t(&hi)[4], uint32_t(&lo)[4], int step) {
      if constexpr (DX_XMAP)
        dx_load_a<M>(hi, lo, smem_u32(buffer(kb)), xm, ch * kWgPageCols + step * 16 + 2 * t);
      else
        wg_load_a(hi, lo, xb, xm, step * 16 + 2 * t);
    });
    wgmma_wait<0>();
    ring.release(seq + mine);
    if (lane == 0) mbar_arrive(&empty[kb % NB]);  // this warp's reads of the block of x are done (release's __syncwarp)
    seq += PAGES;
  }
  // The last block's pages past this warp's: once the block's last has
  // landed (not a warp's own last page: released, its slot may refill).
  if (mine + 1 < PAGES) {
    wait_page(ring, seq - 1, c.abort);
    for (int p = mine + 1; p < PAGES; ++p) ring.release(seq - PAGES + p);
  }
  wg_fence_acc(acc);
  mark_dots();
  consumer_sync();  // every warp's last x read: the partials go over the buffers
  float* red = reinterpret_cast<float*>(c.smem);
  wg_put_partials<RW>(red, acc, kp * 64, wt * kGemmRows, m, t);
  consumer_sync();
  gemm_store_sums<WK, kIsPair<EPI>, RW, 64, M, RESID, EPI, kStack>(op, lo, hi, red, s);
  return seq;
}

}  // namespace mpk
