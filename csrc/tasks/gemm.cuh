// linear_gemm: a streamed Linear for an x with too many rows to stage whole
// (a prompt chunk: 64 rows of 2,048 columns), reading every weight once, as
// a decode step does. linear_tiles stages all of x and applies each 8-row
// page of weights to it; here x and the weights meet a block of kGemmCols
// columns of K at a time and the products accumulate in registers across K
// (gocore/stream: Plan.Gemm).
//
// A task takes up to kGemmRows weight rows [lo, hi) and all M rows of x.
// Its pages hold kGemmPageRows rows × kGemmCols columns (one tensor-map
// box, in column blocks: gemm_page_at), column-block-major: the loader
// (runtime/module.cuh) sends block 0's pages (rows 0-31, then 32-63), then
// block 1's, ... The consumers stage
// x's block double-buffered (block kb + 1's copies in flight while block
// kb's mmas run): an fp32 x (every intermediate) as it is, split into hi +
// lo in the weights' 2-byte type as the mmas read it (x keeps ~16
// significant bits, each part its own mma: rounded, a 64-token chunk's
// argmax left both fp32's and eager's at a near tie); another x rounded to
// that type.
//
// The consumer warps split a block three ways: by page (the task's rows
// 0-31 or 32-63: wn; a pair's four pages, the first weight's two then the
// second's, as the loader sends them), by x's 16-row m-tiles
// (MPK_GEMM_WARP_MTILES a warp: wm) and by columns (wk, the rest). A warp's
// mma.sync m16n8k16 tiles take 16 contiguous bytes of a row of x and of W a
// lane and feed them to two mmas as their k-pairs (as linear_tiles does: a
// dot product does not care which k pairs with which, as long as x and W
// use the same order). After the last block the wk warps' partials are
// summed in a fixed order, so results do not depend on timing.
#pragma once
#include "tasks/tiles.cuh"

namespace mpk {

constexpr int kGemmCols = 256;              // columns of a block of K: a page's width and an x block's
constexpr int kGemmPageRows = 32;           // weight rows a page holds
constexpr int kGemmRows = 64;               // weight rows a task takes (two pages a block)
constexpr int kGemmPitch = kGemmCols + 32;  // a staged row of x (2-byte elements): the two rows of a load phase hit different banks
constexpr int kGemmPitchF = kGemmCols + 4;  // the same in fp32 (x with its low part)
constexpr int kGemmBlockCols = 32;          // a page's column block (stream.GemmBlockCols)
// Floats past each row of the partials (stream.gemmRedPad): a warp's
// float2 stores of 8 rows × 4 column pairs then hit 32 distinct banks, where
// rows 64 or 128 floats apart put all 8 rows in one bank (8-way conflicts:
// ~1 us a task by count; no change measured in the chunk: bench/NOTES.md
// thirty-third session).
constexpr int kGemmRedPad = 8;

// MPK_GEMM_BLOCKED_PAGES (1 by default; 0 an A/B knob): a GEMM page holds
// its rows' columns 0-31 (64 bytes a row), then 32-63, ... (the loader's
// 3-D box: codegen's tmapOf), so the two rows of an mma's 16-byte load
// phase (lanes g = 2p, 2p + 1) are 64 bytes apart, in different banks;
// with whole rows 512 bytes apart they shared banks, and every weight load
// of the dots took two wavefronts (bench/NOTES.md thirty-second session).
#ifndef MPK_GEMM_BLOCKED_PAGES
#define MPK_GEMM_BLOCKED_PAGES 1
#endif

// gemm_page_at is where a GEMM page holds its row r's column c (bytes from the page's start).
__host__ __device__ constexpr int gemm_page_at(int r, int c) {
  return MPK_GEMM_BLOCKED_PAGES
             ? c / kGemmBlockCols * (kGemmPageRows * kGemmBlockCols * 2) + (r * kGemmBlockCols + c % kGemmBlockCols) * 2
             : (r * kGemmCols + c) * 2;
}

// MPK_GEMM_HI_ONLY=1 (an A/B knob, bench/NOTES.md twenty-ninth session): an
// fp32 x is rounded to the weights' type (its hi part only, as bf16 eager
// computes), half the mmas; whether the bf16 rule still holds is measured.
#ifndef MPK_GEMM_HI_ONLY
#define MPK_GEMM_HI_ONLY 0
#endif

// MPK_GEMM_WARP_MTILES: x's m-tiles a warp takes, 1 (the default) or 2
// (an A/B knob, bench/NOTES.md thirtieth and thirty-first sessions). With
// two, a warp's 32 accumulators leave ptxas (96 registers) one B fragment at
// a time, so each accumulator's four mmas (k halves, hi and lo) issue as a
// dependent chain; with one, half the accumulators, and as many B loads and
// splits a warp (a warp takes twice the columns): llama-3.2-1b's 64-token
// chunk 8% faster on the H100.
#ifndef MPK_GEMM_WARP_MTILES
#define MPK_GEMM_WARP_MTILES 1
#endif
static_assert(MPK_GEMM_WARP_MTILES == 1 || MPK_GEMM_WARP_MTILES == 2, "a warp takes one or two m-tiles");

// The warp split for M rows of x (mirrored by gocore/stream.GemmWarpsK):
// m-tiles of 16 rows, MPK_GEMM_WARP_MTILES a warp, two pages of each of NW
// weights (2: a pair); the rest of the warps split a block's columns (the
// warps past those, if any, idle).
__host__ __device__ constexpr int gemm_m_tiles(int M) { return (M + 15) / 16; }
__host__ __device__ constexpr int gemm_warps_m(int M) {
  return (gemm_m_tiles(M) + MPK_GEMM_WARP_MTILES - 1) / MPK_GEMM_WARP_MTILES;
}
__host__ __device__ constexpr int gemm_warps_k(int M, int NW = 1) { return kConsumerWarps / (2 * NW * gemm_warps_m(M)); }

// MPK_GEMM_X_DEPTH (an A/B knob, bench/NOTES.md thirtieth session): up to
// this many blocks of x staged at once where the module's shared memory
// (SHARED, what codegen reserved for its largest task) holds them, so
// blocks kb + 1 .. kb + depth - 1 are in flight while block kb's mmas run:
// a 32-row block of an fp32 x takes 33 KB, and a 64-token chunk's module
// reserves four of them (a 64-row x's two). Each block's x is an L2 round
// trip (~2-3 us under the weight stream, the traces' "staged"), longer
// than a block's mmas.
#ifndef MPK_GEMM_X_DEPTH
#define MPK_GEMM_X_DEPTH 2
#endif

// gemm_x_buffers is how many blocks of x a GEMM stream of M rows stages at
// once in `shared` bytes: at least two (gemm_scratch_bytes reserves them),
// at most MPK_GEMM_X_DEPTH.
__host__ __device__ constexpr int gemm_x_buffers(int M, bool lo, int shared) {
  const int n = shared / (lo ? M * kGemmPitchF * 4 : M * kGemmPitch * 2);
  return n < 2 || MPK_GEMM_X_DEPTH < 2 ? 2 : n < MPK_GEMM_X_DEPTH ? n : MPK_GEMM_X_DEPTH;
}

// The task's shared memory (stream.GemmScratch): x's two blocks, or, once
// the last block is done, every column warp's partials of the outputs (a
// pair's: half the column warps, twice the outputs).
__host__ __device__ constexpr int gemm_scratch_bytes(int M, bool lo) {
  const int x = lo ? 2 * M * kGemmPitchF * 4 : 2 * M * kGemmPitch * 2,
            partials = gemm_warps_k(M) * M * (kGemmRows + kGemmRedPad) * 4;
  return x > partials ? x : partials;
}

// split_x8 reads 8 staged fp32 elements of x (32 bytes at addr) as the
// k-pairs of two mmas, split x = hi + lo in T (as put_x(HiLo) does).
template <typename T>
__device__ __forceinline__ void split_x8(uint32_t addr, uint4& hi, uint4& lo) {
  const uint4 p = ld_shared_16(addr), q = ld_shared_16(addr + 16);
  const uint32_t w[8] = {p.x, p.y, p.z, p.w, q.x, q.y, q.z, q.w};
  uint32_t h[4], l[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    split_pair<T>(__uint_as_float(w[2 * i]), __uint_as_float(w[2 * i + 1]), h[i], l[i]);
  }
  hi = make_uint4(h[0], h[1], h[2], h[3]);
  lo = make_uint4(l[0], l[1], l[2], l[3]);
}

__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// cp_async_wait_pending waits until at most `pending` of this thread's latest groups are in flight.
template <int pending>
__device__ __forceinline__ void cp_async_wait_pending() {
  asm volatile("cp.async.wait_group %0;" ::"n"(pending) : "memory");
}

// stage_gemm_x stages block kb of x's M rows ([M][kGemmCols] of S, row m at
// xb + m·PITCH): fp32 with its low part (S = float), else rounded to the
// weights' 2-byte type (S = T). An x already of type S, rows 16-byte aligned
// (the usual: every intermediate is fp32), is copied with cp.async, a group
// the caller commits and waits for (cp_async_wait_pending) before its
// barrier, so later blocks are in flight while block kb's mmas run and no
// register holds them (with 32 accumulators held across the mmas, a
// register copy spilled).
// Another x is converted here, 4 elements a load (rows4) or one (rare
// layouts).
template <typename T, typename S, int PITCH, int M, int N>
__device__ __forceinline__ void stage_gemm_x(const View& x, int kb, S* xb, bool copy, bool rows4, const Slots<N>& s) {
  const char* p = base(s, x);
  constexpr int E = (int)sizeof(S);
  if (copy) {
    // Thread i copies 16-byte chunk i % C of rows i / C, i / C + R, ...
    constexpr int C = kGemmCols * E / 16, R = MPK_THREADS / C;
    static_assert(MPK_THREADS % C == 0, "a thread copies one column of chunks");
    const int m0 = threadIdx.x / C, j = threadIdx.x % C;
    const char* src = p + (x.offset + m0 * x.stride[0] + kb * kGemmCols) * E + 16 * j;
    const int64_t step = R * x.stride[0] * E;
    const uint32_t dst = smem_u32(xb + m0 * PITCH) + 16 * j;
#pragma unroll
    for (int r = 0; r < (M + R - 1) / R; ++r)
      if (m0 + r * R < M) cp_async_16(dst + r * R * PITCH * E, src + r * step);
    return;
  }
  auto put = [&](int m, int k, float v) {
    if constexpr (sizeof(S) == 4) xb[m * PITCH + k] = v;
    else put_x(xb + m * PITCH, k, v);
  };
  if (rows4) {
    for (int i = threadIdx.x; i < M * kGemmCols / 4; i += MPK_THREADS) {
      const int m = i / (kGemmCols / 4), k = i % (kGemmCols / 4) * 4;
      const float4 f = ld_float4(p, x.dtype, x.offset + m * x.stride[0] + kb * kGemmCols + k);
      put(m, k, f.x), put(m, k + 1, f.y), put(m, k + 2, f.z), put(m, k + 3, f.w);
    }
    return;
  }
  for (int i = threadIdx.x; i < M * kGemmCols; i += MPK_THREADS) {
    int64_t idx[2] = {i / kGemmCols, kb * kGemmCols + i % kGemmCols};
    put((int)idx[0], i % kGemmCols, (float)load_elem(p, x.dtype, offset_of(x, idx)));
  }
}

// RowOf is a task's columns [lo, ...) of a row-major 2-D float-kind array,
// read or written at (m, n): its base (offset and lo folded in), row stride
// and dtype held in registers, so the stores do not reload them from the
// descriptor and the slot table (a local-memory load) at every element.
struct RowOf {
  char* p;
  int32_t stride, dt;
  __device__ __forceinline__ float ld(int m, int n) const { return ld_float(p, dt, m * stride + n); }
  __device__ __forceinline__ void st(int m, int n, float v) const { st_float(p, dt, m * stride + n, v); }
};
template <int N>
__device__ __forceinline__ RowOf row_of(const View& v, int lo, const Slots<N>& s) {
  return RowOf{base(s, v) + (v.offset + lo) * dtype_size(v.dtype), (int32_t)v.stride[0], v.dtype};
}
// rows_fit: (m, n) of M rows indexes a view in 32 bits.
__device__ __forceinline__ bool rows_fit(const View& v, int M) { return v.stride[0] * M < (int64_t)1 << 31; }

// gemm_store_sums stores a GEMM task's outputs [lo, hi) × M rows of x: each
// the sum of its WK partials in a fixed order (red[w][m][n], PR rows of RW
// floats a partial; a pair's second weight's sum at n + kGemmRows, its
// epilogue's pair input), so results do not depend on timing. Where store_out
// takes its fast path (row-major float outputs and inputs), the outputs,
// residual and epilogue inputs are read from registers (RowOf): element by
// element through the descriptor the stores of a 64-row task took 2-5 us
// (bench/gemm_task.cu's phases; bench/NOTES.md thirty-fourth session).
// STACK (linear_wgmma's MPK_WG_STACK_LO): row m's lo products sit in
// partial row m + 32, added after the hi ones.
template <int WK, bool PAIR, int RW, int PR, int M, bool RESID, typename EPI, bool STACK = false, int N>
__device__ __forceinline__ void gemm_store_sums(const Op& op, int lo, int hi, const float* red, const Slots<N>& s) {
  const int rows = hi - lo;
  constexpr bool kEpi = !std::is_same<EPI, NoEpi>::value;
  constexpr int NI = kEpi ? kMaxEpiInputs : 1;  // the epilogue's inputs, or the residual
  const int n_in = kEpi ? op.num_in - op.epi_first : RESID;
  // (A split output's fast stores index from out.offset + lo: its groups
  // start there, so the layout's element numbering holds from it.)
  bool fast = (kEpi ? epi_fast(op) : op.out.rank == 2 && out_row(op.out) && (!RESID || float_row2(op.in[2]))) &&
              rows_fit(op.out, M) && (op.out.dtype != DT_SPLIT_BF16 || (op.out.offset + lo) % kSplitGroup == 0);
  RowOf in[NI];
#pragma unroll
  for (int j = 0; j < NI; ++j) {
    if (kEpi && j + 1 == PairOf<EPI>::J) continue;  // a pair's second product: no memory
    const View& v = op.in[kEpi ? min(op.epi_first + j, op.num_in - 1) : 2];
    in[j] = row_of(v, lo, s);
    fast = fast && (j >= n_in || rows_fit(v, M));
  }
  const RowOf out = row_of(op.out, lo, s);
  const int32_t epi_dt = op.epi_dtype;
  for (int i = threadIdx.x; i < rows * M; i += MPK_THREADS) {
    const int m = i / rows, n = i % rows;
    float v = 0.f, v2 = 0.f;
#pragma unroll
    for (int w = 0; w < WK; ++w) {
      v += red[(w * PR + m) * RW + n];
      if constexpr (PAIR) v2 += red[(w * PR + m) * RW + kGemmRows + n];
    }
    if constexpr (STACK) {
#pragma unroll
      for (int w = 0; w < WK; ++w) {
        v += red[(w * PR + m + 32) * RW + n];
        if constexpr (PAIR) v2 += red[(w * PR + m + 32) * RW + kGemmRows + n];
      }
    }
    if (!fast) {
      store_out<RESID, EPI>(op, m, lo + n, v, s, nullptr, v2);
      continue;
    }
    // store_out's fast path, with the views in registers.
    if constexpr (kEpi) {
      int64_t oi[2] = {m, lo + n};
      double extra[kMaxEpiInputs];
#pragma unroll
      for (int j = 0; j < kMaxEpiInputs; ++j) extra[j] = j < n_in && j + 1 != PairOf<EPI>::J ? in[j].ld(m, n) : 0.0;
      set_pair<EPI>(extra, v2);
      out.st(m, n, (float)eval_epi(EPI{}, round_float(epi_dt, v), extra, oi));
    } else {
      if (RESID) v = round_float(out.dt, v) + in[0].ld(m, n);
      out.st(m, n, v);
    }
  }
}

template <typename T, int K, int M, bool LO, int P, bool RESID, typename EPI, int SHARED, int N>
__device__ uint32_t linear_gemm(const Op& op, int lo, int hi, const Slots<N>& s, const Ctx c) {
  static_assert(sizeof(T) == 2, "GEMM streams take 2-byte weights");
  static_assert(K % kGemmCols == 0 && M >= 1 && M <= 64, "codegen and the task library disagree on a GEMM stream");
  using S = typename std::conditional<LO, float, T>::type;  // x's staged type
  constexpr int NW = kIsPair<EPI> ? 2 : 1;                 // weights a task streams (a pair: gate's rows, then up's)
  constexpr int MT = gemm_m_tiles(M), WK = gemm_warps_k(M, NW), KW = kGemmCols / WK;
  constexpr int MTW = MT < MPK_GEMM_WARP_MTILES ? MT : MPK_GEMM_WARP_MTILES;  // m-tiles a warp
  // Every m-tile an active warp takes lies inside x's M rows (none past the
  // last): the dots need no row guards, which cost ~18 of the ~95
  // instructions of a 32-column slice (branches around each split, zeroed
  // fragments).
  constexpr bool kWholeTiles = M % (16 * MTW) == 0;
  constexpr int RW = NW * kGemmRows + kGemmRedPad;  // a row of the partials: the task's outputs of each weight
  static_assert(WK * NW == gemm_warps_k(M) && kGemmRedPad % 2 == 0,
                "a pair's partials take the bytes gemm_scratch_bytes reserves, rows of float2");
  constexpr int KB = K / kGemmCols, PITCH = LO ? kGemmPitchF : kGemmPitch, E = (int)sizeof(S);
  static_assert(KW % 32 == 0, "a warp takes whole 32-column slices of a block");
  constexpr int NB = gemm_x_buffers(M, LO, SHARED);  // blocks of x staged at once
  S* xs = reinterpret_cast<S*>(c.smem);               // [NB][M][PITCH]: block kb in buffer kb % NB
  auto buffer = [&](int kb) { return xs + kb % NB * M * PITCH; };
  const View& x = op.in[0];
  const bool copy = x.dtype == (LO ? (int32_t)DT_FLOAT32 : dtype_of<T>()) && float_row2(x) && x.stride[0] % (16 / E) == 0 &&
                    (reinterpret_cast<uintptr_t>(base(s, x)) + x.offset * E) % 16 == 0;
  const bool rows4 = rows4_ok<K>(x, s);
  if (copy) {  // blocks 0 .. NB - 2 in flight, a cp.async group each; block 0 waited for
#pragma unroll 1
    for (int b = 0; b < NB - 1; ++b) {
      if (b < KB) stage_gemm_x<T, S, PITCH, M>(x, b, buffer(b), true, rows4, s);
      cp_async_commit();
    }
    cp_async_wait_pending<NB - 2>();
  } else {
    stage_gemm_x<T, S, PITCH, M>(x, 0, xs, false, rows4, s);
  }
  consumer_sync();
  mark_staged();
  const Ring<P> ring = ring_at<P>(c.ring);
  uint32_t seq = c.seq;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  const int wk = warp % WK, wn = warp / WK % (2 * NW), wm = warp / (2 * NW * WK);
  const int rows = hi - lo, per = (rows + kGemmPageRows - 1) / kGemmPageRows;  // pages a block a weight: 1 or 2
  const bool active = wm < gemm_warps_m(M);                                        // else an idle warp
  const int pages = NW * per, mine = active && wn % 2 < per ? wn / 2 * per + wn % 2 : -1;  // the block's page it takes
  const uint4 zero = make_uint4(0, 0, 0, 0);
  float acc[MTW][4][4];
#pragma unroll
  for (int mi = 0; mi < MTW; ++mi)
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) acc[mi][nt][0] = acc[mi][nt][1] = acc[mi][nt][2] = acc[mi][nt][3] = 0.f;
#pragma unroll 1
  for (int kb = 0; kb < KB; ++kb) {
    // Block kb + NB - 1 goes to the buffer block kb - 1 took, last read
    // before the barrier that ended it; one group a block, empty past the
    // last, so the wait below counts alike.
    if (copy) {
#if defined(MPK_TRACE) && defined(MPK_PROBE_GEMM_NO_X)
      // Probe (not for use; results wrong): every block reuses block 0's x,
      // so the trace shows what staging x costs.
      if (false)
#endif
      if (kb + NB - 1 < KB) stage_gemm_x<T, S, PITCH, M>(x, kb + NB - 1, buffer(kb + NB - 1), true, rows4, s);
      cp_async_commit();
    }
#if defined(MPK_TRACE) && defined(MPK_PROBE_GEMM_NO_X)
    const uint32_t xb = smem_u32(xs);
#else
    const uint32_t xb = smem_u32(buffer(kb));
#endif
#pragma unroll 1
    for (int p = 0; p < pages; ++p, ++seq) {
      if (p == mine) {
        wait_page(ring, seq, c.abort);
        const uint32_t wp = smem_u32(ring.page(seq));
        // A slice of 32 columns at a time: few registers live beside the
        // accumulators (two slices a loop body measured no faster,
        // bench/NOTES.md thirty-third session).
#pragma unroll 1
        for (int j = 0; j < KW / 32; ++j) {
          const int col = wk * KW + j * 32 + 8 * t;
          if constexpr (LO) {
            // An m-tile at a time: x's rows g and g + 8 split into hi and
            // lo, each applied to every 8-row group of the page, the four
            // groups' mmas side by side (each group's four in a chain).
#pragma unroll
            for (int mi = 0; mi < MTW; ++mi) {
              const int m = (wm * MTW + mi) * 16 + g;
              // The A operands of the hi and lo mmas over the lane's two
              // halves of 4 columns: rows g and g + 8's k-pairs interleaved.
              uint4 ah = zero, al = zero, a8h = zero, a8l = zero, b[4];
              if (kWholeTiles || m < M) split_x8<T>(xb + (m * PITCH + col) * 4, ah, al);
              if (kWholeTiles || m + 8 < M) split_x8<T>(xb + ((m + 8) * PITCH + col) * 4, a8h, a8l);
              const uint4 h0 = make_uint4(ah.x, a8h.x, ah.y, a8h.y), h1 = make_uint4(ah.z, a8h.z, ah.w, a8h.w);
              const uint4 l0 = make_uint4(al.x, a8l.x, al.y, a8l.y), l1 = make_uint4(al.z, a8l.z, al.w, a8l.w);
#pragma unroll
              for (int nt = 0; nt < 4; ++nt) b[nt] = ld_shared_16(wp + gemm_page_at(nt * 8 + g, col));
#pragma unroll
              for (int nt = 0; nt < 4; ++nt) mma_16816<T>(acc[mi][nt], h0.x, h0.y, h0.z, h0.w, b[nt].x, b[nt].y);
#pragma unroll
              for (int nt = 0; nt < 4; ++nt) mma_16816<T>(acc[mi][nt], h1.x, h1.y, h1.z, h1.w, b[nt].z, b[nt].w);
              if constexpr (MPK_GEMM_HI_ONLY) continue;  // (the fourteenth session's trace probe NO_LO)
#pragma unroll
              for (int nt = 0; nt < 4; ++nt) mma_16816<T>(acc[mi][nt], l0.x, l0.y, l0.z, l0.w, b[nt].x, b[nt].y);
#pragma unroll
              for (int nt = 0; nt < 4; ++nt) mma_16816<T>(acc[mi][nt], l1.x, l1.y, l1.z, l1.w, b[nt].z, b[nt].w);
            }
          } else {
            // x's fragments of both m-tiles, then each 8-row group of the page's.
            uint4 a[MTW], a8[MTW];
#pragma unroll
            for (int mi = 0; mi < MTW; ++mi) {
              const int m = (wm * MTW + mi) * 16 + g;  // the mma's rows g and g + 8
              a[mi] = kWholeTiles || m < M ? ld_shared_16(xb + (m * PITCH + col) * 2) : zero;
              a8[mi] = kWholeTiles || m + 8 < M ? ld_shared_16(xb + ((m + 8) * PITCH + col) * 2) : zero;
            }
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
              const uint4 b = ld_shared_16(wp + gemm_page_at(nt * 8 + g, col));
#pragma unroll
              for (int mi = 0; mi < MTW; ++mi) {
                mma_16816<T>(acc[mi][nt], a[mi].x, a8[mi].x, a[mi].y, a8[mi].y, b.x, b.y);
                mma_16816<T>(acc[mi][nt], a[mi].z, a8[mi].z, a[mi].w, a8[mi].w, b.z, b.w);
              }
            }
          }
        }
      }
      ring.release(seq);
    }
    if (copy) {
      cp_async_wait_pending<NB - 2>();  // block kb + 1 landed
    } else if (kb + 1 < KB) {
      stage_gemm_x<T, S, PITCH, M>(x, kb + 1, buffer(kb + 1), false, rows4, s);
    }
#if defined(MPK_TRACE) && defined(MPK_PROBE_GEMM_NO_SYNC)
    // Probe (not for use; results wrong): no barrier between blocks, so a
    // timing shows what the warps' wait for the slowest costs.
    if (false)
#endif
    consumer_sync();
  }
  mark_dots();
  // Lane (g, t) holds x's rows g and g + 8 of each m-tile times the page's
  // rows nt·8 + 2t and 2t + 1; the partials go to red[wk][m][n], n past
  // kGemmRows for a pair's second weight (x's blocks are no longer read: the
  // last block ended with a barrier).
  float* red = reinterpret_cast<float*>(c.smem);
#pragma unroll
  for (int mi = 0; mi < MTW; ++mi) {
    const int m = (wm * MTW + mi) * 16 + g;
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
      const int n = wn / 2 * kGemmRows + wn % 2 * kGemmPageRows + nt * 8 + 2 * t;
      float2* r = reinterpret_cast<float2*>(red + (wk * M) * RW + n);
      if (m < M) r[m * RW / 2] = make_float2(acc[mi][nt][0], acc[mi][nt][1]);
      if (m + 8 < M) r[(m + 8) * RW / 2] = make_float2(acc[mi][nt][2], acc[mi][nt][3]);
    }
  }
  consumer_sync();
  gemm_store_sums<WK, kIsPair<EPI>, RW, M, M, RESID, EPI>(op, lo, hi, red, s);
  return seq;
}

}  // namespace mpk
