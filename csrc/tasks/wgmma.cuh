// linear_wgmma: a GEMM stream (gocore/stream: Plan.Wgmma) on the Hopper
// tensor cores, for a prompt chunk's Linear of up to 64 rows of an fp32 x:
// every weight read once, as in linear_gemm, multiplied by wgmma instead of
// mma.sync, whose ~10 instructions a m16n8k16 (the split of x by every
// page's warps, B fragments a lane at a time) bound the block
// (bench/gemm_task.cu: this body 25% faster on the chunk's shapes;
// bench/NOTES.md thirty-third session).
//
// D[token][weight row] += x[token][k] · W[row][k], m64n64k16:
// - x is A, from registers: the consumers stage each block of 256 columns of
//   the fp32 x by cp.async, as linear_gemm does (no conversion pass), and
//   each thread loads its fragments of a k16 step (tokens m, m + 8; k 2t..,
//   2t + 8..) and splits them into bf16 hi + lo there (x keeps ~16
//   significant bits; a wgmma each).
// - the weights are B, from the ring: a page holds 64 weight rows × 128
//   columns as two column blocks of 64 rows × 128 bytes, 128-byte swizzled
//   by the loader's tensor map (16-byte chunk c of row r at c ^ (r % 8)),
//   which is wgmma's K-major 128-byte-swizzle layout (8-row groups 1,024
//   bytes apart; a k16 step 32 bytes into a block). Pages land 1,024-byte
//   aligned (the pattern's period).
// A block is two pages a weight (its column halves; a pair's: the halves'
// pages of gate, then of up, the loader's column-major order). Warpgroup w
// reads one page of a block and no other warpgroup waits for it: a pair's
// weight w % 2 over column half w / 2 (two partials a weight), a single
// weight's half w / 2, k16 steps 4(w % 2) .. + 3 (four partials). One
// barrier a block (x's next block staged, this one's no longer read).
// ptxas serialises every wgmma of a kernel when one sits in a function it
// calls (C7510), so codegen inlines this task into the megakernel.
#pragma once
#include "tasks/gemm.cuh"
#include "tasks/wgmma_ops.cuh"

namespace mpk {

constexpr int kWgWarpgroups = MPK_THREADS / 128;
constexpr int kWgPageRows = 64, kWgPageCols = 128;  // a wgmma stream's page (stream.WgmmaPageRows, WgmmaCols)
// MPK_WG_SW128 (1; 0 only in bench/gemm_task.cu, whose maps it changes): a
// page's column blocks of 64 columns (128-byte rows, 128-byte swizzle)
// rather than 32 (64-byte rows and swizzle): the qwen3-8b chunk's GEMM
// blocks 4-8% faster alone on the H200 (bench/NOTES.md, forty-second
// session). Codegen's page maps (stream.WgmmaRowBytes) are 128-byte ones.
#ifndef MPK_WG_SW128
#define MPK_WG_SW128 1
#endif
constexpr int kWgRowBytes = MPK_WG_SW128 ? 128 : 64;         // a column block's row (the swizzle's span)
constexpr int kWgBlockBytes = kWgPageRows * kWgRowBytes;    // a page's column block: 8 KB (4 KB with 64-byte rows)
constexpr int kWgBlockSteps = kWgRowBytes / 32;             // k16 steps a column block
constexpr int kWgPitch = kGemmCols + 8;  // x's staged row (fp32): the fragments' float2 loads free of bank conflicts

// The task's shared memory (stream.WgmmaScratch): two blocks of x, 64 rows
// each (the A operand's; rows past M are never stored), or after the last
// block the four partials of the outputs.
__host__ __device__ constexpr int wgmma_scratch_bytes() {
  const int x = 2 * 64 * kWgPitch * 4, partials = 4 * 64 * (kGemmRows + kGemmRedPad) * 4;
  return x > partials ? x : partials;
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
// wg_zero_acc zeroes the accumulators before a task's first wgmma_fence
// (pinned there: else ptxas C7515 serialises the wgmmas).
template <int R>
__device__ __forceinline__ void wg_zero_acc(float (&acc)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) acc[i] = 0.f;
  wg_fence_acc(acc);
}
// Generic-proxy stores to shared memory become visible to wgmma's reads.
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// wg_swizzled_desc is the descriptor of a K-major operand of ROW_BYTES-byte
// swizzled rows (64 or 128) at addr (an aligned group of 8 rows, plus a k16
// step's 32 bytes): 8-row groups 8·ROW_BYTES apart (SBO), LBO unused.
template <int ROW_BYTES>
__device__ __forceinline__ uint64_t wg_swizzled_desc(uint32_t addr) {
  static_assert(ROW_BYTES == 64 || ROW_BYTES == 128, "wgmma's 64- and 128-byte swizzles");
  return (uint64_t)((addr & 0x3FFFF) >> 4) | (uint64_t)1 << 16 | (uint64_t)(8 * ROW_BYTES >> 4) << 32 |
         (uint64_t)(ROW_BYTES == 128 ? 1 : 2) << 62;
}
// wg_page_desc: the same for a weight page's column block (kWgRowBytes).
__device__ __forceinline__ uint64_t wg_page_desc(uint32_t addr) { return wg_swizzled_desc<kWgRowBytes>(addr); }

// wgmma_rs_64: D[64][64] += A[64][16] (registers: this warp's 16 rows) ·
// B[16][64] (shared memory, descriptor b), bf16 in, fp32 accumulate. (The
// operand lists are written out: inline asm takes no ranges.)
__device__ __forceinline__ void wgmma_rs_64(float (&d)[32], const uint32_t (&a)[4], uint64_t b) {
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

// wg_load_a reads this thread's A fragments of one k16 step (column k0 of a
// staged block of fp32 x, tokens m and m + 8) and splits them into hi and
// lo. They are settled before the caller's wgmma_fence (an instruction
// defining them after it would serialise the wgmmas: ptxas C7513).
__device__ __forceinline__ void wg_load_a(uint32_t (&hi)[4], uint32_t (&lo)[4], uint32_t xb, int m, int k0) {
  float2 v[4];
  const uint32_t r0 = xb + (m * kWgPitch + k0) * 4, r8 = r0 + 8 * kWgPitch * 4;
#if !(defined(MPK_TRACE) && defined(MPK_PROBE_WG_NO_ALOAD))
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(v[0].x), "=f"(v[0].y) : "r"(r0));
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(v[1].x), "=f"(v[1].y) : "r"(r8));
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(v[2].x), "=f"(v[2].y) : "r"(r0 + 32));
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(v[3].x), "=f"(v[3].y) : "r"(r8 + 32));
#endif
#if defined(MPK_TRACE) && defined(MPK_PROBE_WG_NO_SPLIT)
  // Probe (not for use; results wrong): x's bits as the fragments, no
  // split, so a trace shows what the split costs the dots.
#pragma unroll
  for (int i = 0; i < 4; ++i) hi[i] = __float_as_uint(v[i].x), lo[i] = __float_as_uint(v[i].y);
#elif defined(MPK_TRACE) && defined(MPK_PROBE_WG_NO_ALOAD)
  // Probe (not for use; results wrong): no loads of x's fragments (their
  // addresses' bits as the values), so a timing shows what the A side's
  // shared-memory reads cost.
#pragma unroll
  for (int i = 0; i < 4; ++i) hi[i] = r0 + 8 * i, lo[i] = r8 + 8 * i;
#else
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    hi[i] = pack2<__nv_bfloat16>(v[i].x, v[i].y);
    const float2 b = unpack2<__nv_bfloat16>(hi[i]);
    lo[i] = pack2<__nv_bfloat16>(v[i].x - b.x, v[i].y - b.y);
  }
#endif
#pragma unroll
  for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(hi[i]), "+r"(lo[i])::"memory");
}

// wg_block_dots multiplies a warpgroup's k16 steps step0 .. step0 + STEPS - 1
// of the page at wp into acc, two steps a group, with two groups' A
// registers so one group's loads and splits run while the one before
// multiplies; load(hi, lo, step) loads and splits a step's fragments. LO:
// a second wgmma a step for the lo part; STACK: lo in the tile's rows 32-63
// (lo_rows: this thread's), one wgmma a step.
template <int STEPS, bool LO, bool STACK, typename Load>
__device__ __forceinline__ void wg_block_dots(float (&acc)[32], uint32_t wp, int step0, bool lo_rows, Load load) {
  uint32_t a[2][2][2][4];  // [set][step][hi, lo][4]
#pragma unroll
  for (int gi = 0; gi < STEPS / 2; ++gi) {
    const int set = gi % 2;
    if (gi >= 2) wgmma_wait<1>();  // group gi - 2 (this set's last reader) done
#pragma unroll
    for (int st = 0; st < 2; ++st) {
      load(a[set][st][0], a[set][st][1], step0 + 2 * gi + st);
      if constexpr (STACK)
#pragma unroll
        for (int i = 0; i < 4; ++i) a[set][st][0][i] = lo_rows ? a[set][st][1][i] : a[set][st][0][i];
    }
    wgmma_fence();
#pragma unroll
    for (int st = 0; st < 2; ++st) {
      const int step = step0 + 2 * gi + st;
      const uint64_t b = wg_page_desc(wp + step / kWgBlockSteps * kWgBlockBytes + 32 * (step % kWgBlockSteps));
#if defined(MPK_TRACE) && defined(MPK_PROBE_WG_NO_MMA)
      // Probe (not for use; results wrong): the A loads and splits without
      // the wgmmas.
      if (false)
#endif
      {
        wgmma_rs_64(acc, a[set][st][0], b);
        if constexpr (LO && !STACK) wgmma_rs_64(acc, a[set][st][1], b);
      }
    }
    wgmma_commit();
  }
}

// wg_put_partials writes a warpgroup's accumulators (tokens m and m + 8 ×
// the page's rows 8i + 2t and + 1) to red's rows r0 + m, r0 + m + 8 (RW
// floats each) from column n0.
template <int RW>
__device__ __forceinline__ void wg_put_partials(float* red, const float (&acc)[32], int r0, int n0, int m, int t) {
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    float2* r = reinterpret_cast<float2*>(red + (r0 + m) * RW + n0 + 8 * i + 2 * t);
    r[0] = make_float2(acc[4 * i], acc[4 * i + 1]), r[4 * RW] = make_float2(acc[4 * i + 2], acc[4 * i + 3]);
  }
}

// MPK_WG_STACK_LO (1 by default; 0 an A/B knob): an x of at most 32 rows
// (a 64-token chunk's q, k, v and o as blocks of 32 rows, a batch of 32)
// multiplies its hi part as the m64 tile's rows 0-31 and its lo part as
// rows 32-63, one wgmma a k16 step where the tile's rows 32-63 were unused
// and a second wgmma took the lo part; the store adds the two halves.
#ifndef MPK_WG_STACK_LO
#define MPK_WG_STACK_LO 1
#endif

// wgmma_ss_n is m64nNNk16 with both operands in shared memory, NN 16, 32,
// 64 or 128.
template <int NN>
__device__ __forceinline__ void wgmma_ss_n(float (&d)[NN / 2], uint64_t a, uint64_t b) {
  static_assert(NN == 16 || NN == 32 || NN == 64 || NN == 128, "m64n{16,32,64,128}k16");
  if constexpr (NN == 16) wgmma_ss_16(d, a, b);
  else if constexpr (NN == 32) wgmma_ss_32(d, a, b);
  else if constexpr (NN == 64) wgmma_ss_64(d, a, b);
  else wgmma_ss_128(d, a, b);
}

// split_box_rows is the rows of a split x's box (codegen's splitXBoxRows):
// the fewest of 8, 16, 32 and 64 that hold x's M rows.
constexpr int split_box_rows(int M) { return M <= 8 ? 8 : M <= 16 ? 16 : M <= 32 ? 32 : 64; }

// wait_bar waits (a warp's lane 0 polling) until bar's phase of this parity
// completed, giving up once the kernel aborts.
__device__ __forceinline__ void wait_bar(uint64_t* bar, uint32_t parity, const int32_t* abort) {
  if (threadIdx.x % 32 == 0)
    for (uint32_t polls = 0; !mbar_test(bar, parity); ++polls)
      if ((polls & 1023) == 1023 && aborting(abort)) break;
  __syncwarp();
  mbar_test(bar, parity);  // every lane's acquire of the phase
}

// linear_wgmma_split is linear_wgmma for a split x (DT_SPLIT_BF16: codegen's
// splitX) of at most 64 rows (a decode batch's few on: N as small as 16).
// Each group of 64 of x's columns is a box of
// its tensor map (View.tmap), landing as R rows' hi and lo, 128 bytes each,
// 128-byte swizzled: K-major, wgmma's B operand of N = 2R (row 2m: x's row
// m's hi, 2m + 1: its lo; rows past x's zero). The weights' page is A (64
// rows of 128-byte swizzled column blocks, as B took them), so D = W·xᵀ:
// a thread's accumulators are its weight rows m and m + 8 times x's rows,
// each row's hi and lo side by side, summed into the partials. So the
// consumers issue only wgmmas: no loads of x's fragments and no split (the
// op that wrote x split it: split_store). Thread 0 stages each block (four
// groups) a block ahead on the block's own barrier; pages, partials and
// sums are linear_wgmma's.
template <int K, int M, int P, bool RESID, typename EPI, int N>
__device__ __forceinline__ uint32_t linear_wgmma_split(const Op& op, int lo, int hi, const Slots<N>& s, const Ctx c) {
  constexpr int NW = kIsPair<EPI> ? 2 : 1;
  constexpr int R = split_box_rows(M);  // x's rows a box holds
  constexpr int NN = 2 * R, ACC = NN / 2;
  constexpr int KB = K / kGemmCols, PAGES = 2 * NW, GROUPS = kGemmCols / kSplitGroup;
  constexpr int STEPS = NW == 2 ? 8 : 4;  // a warpgroup's k16 steps a block, as linear_wgmma's
  constexpr int WK = 4 / NW, RW = NW * kGemmRows + kGemmRedPad;
  constexpr int kGroupBytes = NN * kWgRowBytes, kBlockBytes = GROUPS * kGroupBytes;
  static_assert(kWgRowBytes == 2 * kSplitGroup && kWgBlockSteps == 4 && 2 * kBlockBytes + 16 <= wgmma_scratch_bytes(),
                "a group's plane is a swizzled row of 128 bytes; two blocks of x and their barriers fit the scratch");
  char* xs = c.smem;  // [2][GROUPS][NN][128 bytes], 1,024-byte aligned (module.cuh's kRingAlign)
  uint64_t* full = reinterpret_cast<uint64_t*>(c.smem + 2 * kBlockBytes);
  const void* xmap = c.tmaps + 128 * (op.in[0].tmap - 1);
  const Ring<P> ring = ring_at<P>(c.ring);
  uint32_t seq = c.seq;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wg = warp / 4, t = lane % 4;
  const int ch = wg / 2, wt = NW == 2 ? wg % 2 : 0, kp = NW == 2 ? ch : wg;  // column half; weight; partial
  const int mine = ch * NW + wt, step0 = NW == 2 ? 0 : 4 * (wg % 2);       // its page of a block; first k16 step
  const int m = warp % 4 * 16 + lane / 4;                                   // the thread's weight rows m and m + 8
  uint64_t policy = 0;  // x is read by every task of the stage: kept in L2
  if (threadIdx.x == 0) asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  auto stage = [&](int kb) {
    if (threadIdx.x != 0) return;
    uint64_t* bar = full + kb % 2;
    mbar_expect_bytes(bar, kBlockBytes);
    for (int g = 0; g < GROUPS; ++g)
      box_load_4d(xs + kb % 2 * kBlockBytes + g * kGroupBytes, xmap, 0, 0, kb * GROUPS + g, 0, bar, policy);
  };
  // The last task's generic stores to the scratch come before these copies'
  // writes to it; x's stores (other workers', acquired through this task's
  // event) before the copies' reads of it.
  fence_async_smem();
  if (threadIdx.x == 0) {
    mbar_init(full, 1);
    mbar_init(full + 1, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.global;" ::: "memory");
  }
  consumer_sync();
  stage(0);
  mark_staged();
  float acc[ACC];
  wg_zero_acc(acc);
#pragma unroll 1
  for (int kb = 0; kb < KB; ++kb) {
    if (kb + 1 < KB) stage(kb + 1);  // its buffer's last wgmmas (block kb - 1's) ended before the barrier that ended that block
    for (int p = 0; p < PAGES; ++p)
      if (p != mine) ring.release(seq + p);
    wait_page(ring, seq + mine, c.abort);
    wait_bar(full + kb % 2, (kb / 2) & 1, c.abort);
    const uint32_t wp = smem_u32(ring.page(seq + mine)), xb = smem_u32(xs + kb % 2 * kBlockBytes);
    wgmma_fence();
#pragma unroll
    for (int st = 0; st < STEPS; ++st) {
      const int step = step0 + st, cb = step / kWgBlockSteps, k = step % kWgBlockSteps;  // the page's column block; k16 step
      wgmma_ss_n<NN>(acc, wg_page_desc(wp + cb * kWgBlockBytes + 32 * k),
                     wg_swizzled_desc<128>(xb + (2 * ch + cb) * kGroupBytes + 32 * k));
    }
    wgmma_commit();
    wgmma_wait<0>();
    ring.release(seq + mine);
    seq += PAGES;
    consumer_sync();
  }
  if (threadIdx.x == 0) mbar_inval(full), mbar_inval(full + 1);
  wg_fence_acc(acc);
  mark_dots();
  // acc[4i + e]: weight row m (e 0, 1) or m + 8 (e 2, 3) times B's row 8i +
  // 2t + e % 2, x's row 4i + t (hi, lo); the partials go to red[kp][row][n]
  // as linear_wgmma's.
  float* red = reinterpret_cast<float*>(c.smem);
#pragma unroll
  for (int i = 0; i < ACC / 4; ++i) {
    float* r = red + (kp * 64 + 4 * i + t) * RW + wt * kGemmRows + m;
    r[0] = acc[4 * i] + acc[4 * i + 1];
    r[8] = acc[4 * i + 2] + acc[4 * i + 3];
  }
  consumer_sync();
  gemm_store_sums<WK, NW == 2, RW, 64, M, RESID, EPI>(op, lo, hi, red, s);
  return seq;
}

// linear_wgmma: XS, x is split (linear_wgmma_split).
template <typename T, int K, int M, bool LO, int P, bool RESID, typename EPI, bool XS, int N>
__device__ __forceinline__ uint32_t linear_wgmma(const Op& op, int lo, int hi, const Slots<N>& s, const Ctx c) {
  static_assert(std::is_same<T, __nv_bfloat16>::value && LO, "wgmma streams take bf16 weights and an fp32 x");
  if constexpr (XS) return linear_wgmma_split<K, M, P, RESID, EPI>(op, lo, hi, s, c);
  static_assert(K % kGemmCols == 0 && M >= 1 && M <= 64 && kGemmRows == kWgPageRows && 2 * kWgPageCols == kGemmCols &&
                    kWgWarpgroups == 4,
                "codegen and the task library disagree on a wgmma stream");
  constexpr int NW = kIsPair<EPI> ? 2 : 1;
  constexpr bool kLo = !MPK_GEMM_HI_ONLY;
  constexpr bool kStack = kLo && MPK_WG_STACK_LO && M <= 32;  // hi in the tile's rows 0-31, lo in 32-63
  constexpr int KB = K / kGemmCols, PAGES = 2 * NW;  // a block's pages: column half after half, each weight's
  constexpr int STEPS = NW == 2 ? 8 : 4;             // a warpgroup's k16 steps a block
  constexpr int WK = 4 / NW, RW = NW * kGemmRows + kGemmRedPad;  // partials; a partial's row (padded)
  constexpr int NB = 2;                                            // x's staged blocks
  const View& x = op.in[0];
  const bool rows4 = rows4_ok<K>(x, s);
  const bool copy = x.dtype == DT_FLOAT32 && float_row2(x) && x.stride[0] % 4 == 0 &&
                    (reinterpret_cast<uintptr_t>(base(s, x)) + x.offset * 4) % 16 == 0;
  float* xs = reinterpret_cast<float*>(c.smem);
  auto buffer = [&](int kb) { return xs + kb % NB * 64 * kWgPitch; };
  const Ring<P> ring = ring_at<P>(c.ring);
  uint32_t seq = c.seq;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wg = warp / 4, t = lane % 4;
  const int ch = wg / 2, wt = NW == 2 ? wg % 2 : 0, kp = NW == 2 ? ch : wg;  // column half; weight; partial
  const int mine = ch * NW + wt, step0 = NW == 2 ? 0 : 4 * (wg % 2);       // its page of a block; first k16 step
  const int m = warp % 4 * 16 + lane / 4;                                   // the thread's tokens m and m + 8
  const int xm = kStack ? m % 32 : m;       // x's rows they load (stacked: warps 2-3 load rows 0-31's lo)
  const bool lo_rows = kStack && m >= 32;   // this thread's fragments are the lo part
  stage_gemm_x<T, float, kWgPitch, M>(x, 0, buffer(0), copy, rows4, s);
  cp_async_commit();
  cp_async_wait_pending<0>();
  consumer_sync();
  mark_staged();
  float acc[32];
  wg_zero_acc(acc);
#pragma unroll 1
  for (int kb = 0; kb < KB; ++kb) {
#if defined(MPK_TRACE) && defined(MPK_PROBE_GEMM_NO_X)
    // Probe (not for use; results wrong): every block reuses block 0's x,
    // so a timing shows what staging x costs.
    if (false)
#endif
    if (kb + 1 < KB) stage_gemm_x<T, float, kWgPitch, M>(x, kb + 1, buffer(kb + 1), copy, rows4, s);
    cp_async_commit();
    // The pages this warpgroup does not read are released now (every warp
    // released the last block's before the barrier that ended it, so these
    // arrivals count toward this fill of their slots).
    for (int p = 0; p < PAGES; ++p)
      if (p != mine) ring.release(seq + p);
    wait_page(ring, seq + mine, c.abort);
#if defined(MPK_TRACE) && defined(MPK_PROBE_GEMM_NO_X)
    const uint32_t wp = smem_u32(ring.page(seq + mine)), xb = smem_u32(buffer(0)) + ch * kWgPageCols * 4;
#else
    const uint32_t wp = smem_u32(ring.page(seq + mine)), xb = smem_u32(buffer(kb)) + ch * kWgPageCols * 4;
#endif
    wg_block_dots<STEPS, kLo, kStack>(acc, wp, step0, lo_rows, [&](uint32_t(&hi)[4], uint32_t(&lo)[4], int step) {
      wg_load_a(hi, lo, xb, xm, step * 16 + 2 * t);
    });
    // This warpgroup's page goes back to the loader once its own wgmmas are done.
    wgmma_wait<0>();
    ring.release(seq + mine);
    seq += PAGES;
    if (copy) cp_async_wait_pending<0>();  // block kb + 1 landed
#if defined(MPK_TRACE) && defined(MPK_PROBE_GEMM_NO_SYNC)
    if (false)  // probe (results wrong): no barrier between blocks
#endif
    consumer_sync();
  }
  wg_fence_acc(acc);
  mark_dots();
#if defined(MPK_TRACE) && defined(MPK_PROBE_WG_NO_EPI)
  // Probe (not for use; results wrong): no partials, sums or stores. One
  // accumulator stays live, else ptxas drops the wgmmas as dead code.
  if (acc[0] == -1.2345e30f) *reinterpret_cast<volatile float*>(c.smem) = acc[1];
  return seq;
#endif
  // acc[4i + {0, 1, 2, 3}]: tokens (m, m, m + 8, m + 8) × the page's rows
  // (8i + 2t, + 1, 8i + 2t, + 1); the partials go to red[kp][token][n], n
  // past kGemmRows for a pair's second weight (x's blocks are no longer
  // read: the last block ended with a barrier).
  float* red = reinterpret_cast<float*>(c.smem);
  wg_put_partials<RW>(red, acc, kp * 64, wt * kGemmRows, m, t);
  consumer_sync();
  gemm_store_sums<WK, NW == 2, RW, 64, M, RESID, EPI, kStack>(op, lo, hi, red, s);
  return seq;
}

}  // namespace mpk
