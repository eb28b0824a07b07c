// A decode unit's attention on the tensor cores (a batch's kv_pages task's
// rounds at head dim 64: tasks/attention.cuh kv_batch_mma): the G query heads of
// one KV head are the rows of an m16n8k16 tile (rows past G are zeros), a
// warp takes 8 positions of a round, so one round of 128 rows is one tile
// column of 16 warps. For its 8 positions a warp computes S = q·Kᵀ (q split
// into bf16 hi + lo, K exact), folds them into each head's online softmax
// (a row's 8 scores sit in the 4 lanes of a quad), and adds P·V (P split
// into hi + lo; positions 8-15 of the k16 step are zeros). K and V rows are
// read from shared memory by ldmatrix (V transposed). The scalar round
// (a lane a position, a warp a head: tasks/attention.cuh attention_decode)
// takes ~3.2 us a round of 32 positions with its pages landed (bench/NOTES.md,
// forty-ninth session); bench/attn_round_mma.cu times this one alone.
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

#include "tasks/gemm.cuh"  // mma_16816 (tiles.cuh), split_pair (linear.cuh)

namespace mpk {

// MPK_DECODE_MMA_QSMEM (1; 0 an A/B knob): the queries' hi and lo parts
// stay in shared memory as bf16 rows that every fold reads by ldmatrix, not
// in 16 registers a lane (D 64) live across the rounds: kv_batch_mma
// spilled 104 bytes at D 64 under the megakernel's 96 registers, and its
// spill loads miss the small L1 the ring leaves. llama-3.2-1b batch 8 took
// 2% less time; the probe's rounds at D 128 10% less (H200, bench/NOTES.md,
// fifty-first session).
#ifndef MPK_DECODE_MMA_QSMEM
#define MPK_DECODE_MMA_QSMEM 1
#endif
constexpr bool kDecodeMmaQSmem = MPK_DECODE_MMA_QSMEM;

// decode_mma_q_bytes is the shared memory of the staged queries
// (MPK_DECODE_MMA_QSMEM): hi and lo, 8 rows each of D + 8 elements (the 8
// rows an ldmatrix reads then fall in distinct banks).
__host__ __device__ constexpr int decode_mma_q_bytes(int D) { return kDecodeMmaQSmem ? 2 * 8 * (D + 8) * 2 : 0; }

// ldsm_x4 loads four 8×8 matrices of 2-byte elements (lane i gives the
// address of row i % 8 of matrix i / 8): lane (g, t) gets row g, columns
// 2t and 2t + 1 of each.
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// ldsm_x4_t is ldsm_x4 transposed: lane (g, t) gets rows 2t and 2t + 1 of
// column g of each matrix.
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// ldsm_row is the address a lane gives ldmatrix for 8 rows of D 2-byte
// elements from `rows`: row lane % 8 of matrix lane / 8 (columns 8 apart).
template <int D>
__device__ __forceinline__ uint32_t ldsm_row(uint32_t rows) {
  const int lane = threadIdx.x % 32;
  return rows + (lane % 8) * D * 2 + (lane / 8) * 16;
}

// swizzle128 is the address of 16-byte chunk c (of its 8) of the 128-byte
// row at shared-memory address row as a 128-byte swizzle lands it: at c ^
// bits 7-9 of the address (the tensor map's copy takes the pattern from the
// address; DecodeMma's BLOCK, bench/attn_round_mma.cu -DKV_SWZ=1).
__device__ __forceinline__ uint32_t swizzle128(uint32_t row, int c) { return row + ((c ^ (row >> 7)) & 7) * 16; }

// DecodeMma is one warp's state for the G (at most 8) heads of its unit:
// the queries as A fragments (hi and lo, a k16 step each of D / 16), and
// each head's running max, sum and output row g = lane / 4 (the lane's
// columns 8·n + 2t, + 1 of each n-tile; lanes of rows >= G hold zeros).
// BLOCK > 0: the K and V rows are stored as a 128-byte swizzle lands them
// (kv_swizzle's pages, codegen's kvStream.Swizzle): each row's 64-element
// column blocks BLOCK bytes apart, a block's rows 128 bytes apart, a row's
// 16-byte chunk c at c ^ bits 7-9 of the row's address, so the 8 rows an
// ldmatrix reads fall in distinct banks (plain rows: 8-way conflicts;
// bench/attn_round_mma.cu -DKV_SWZ=1 times both).
template <typename T, int D, int G, int BLOCK = 0>
struct DecodeMma {
  static_assert(D % 32 == 0 && G >= 1 && G <= 8, "DecodeMma: D a multiple of 32, at most 8 heads");
  static constexpr int KS = D / 16, NT = D / 8, QP = D + 8;  // QP: a staged query row (MPK_DECODE_MMA_QSMEM)
  uint32_t qa[kDecodeMmaQSmem ? 1 : KS][2][2];  // [k step][hi, lo][a0 (columns 2t..), a2 (columns 2t + 8..)]
  uint32_t qrow;                                // kDecodeMmaQSmem: this lane's ldmatrix row of the staged hi part
  float o[NT][2];  // the accumulators of row g (rows g + 8, zeros, are not kept)
  float m, l;      // row g's

  // stage_q (kDecodeMmaQSmem; every consumer thread, the warps synced
  // after it) writes the pre-scaled queries qs [G][D] as hi and lo rows to
  // qst [2][8][QP], rows past G zeros.
  static __device__ __forceinline__ void stage_q(const float* qs, T* qst) {
    if constexpr (kDecodeMmaQSmem) {
      for (int i = threadIdx.x; i < 8 * D / 2; i += MPK_THREADS) {
        const int r = i / (D / 2), c = 2 * (i % (D / 2));
        uint32_t hi, lo;
        split_pair<T>(r < G ? qs[r * D + c] : 0.f, r < G ? qs[r * D + c + 1] : 0.f, hi, lo);
        *reinterpret_cast<uint32_t*>(qst + r * QP + c) = hi;
        *reinterpret_cast<uint32_t*>(qst + (8 + r) * QP + c) = lo;
      }
    }
  }

  // init reads row g of the pre-scaled queries qs [G][D] (fp32, shared),
  // or (kDecodeMmaQSmem) notes where stage_q left them in qst.
  __device__ __forceinline__ void init(const float* qs, const T* qst) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    if constexpr (kDecodeMmaQSmem) {
      qrow = smem_u32(qst) + (lane % 8) * QP * 2 + (lane / 8) * 16;
    } else {
#pragma unroll
      for (int ks = 0; ks < KS; ++ks)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int c = 16 * ks + 2 * t + 8 * half;
          split_pair<T>(g < G ? qs[g * D + c] : 0.f, g < G ? qs[g * D + c + 1] : 0.f, qa[ks][0][half], qa[ks][1][half]);
        }
    }
#pragma unroll
    for (int n = 0; n < NT; ++n) o[n][0] = o[n][1] = 0.f;
    m = -INFINITY, l = 0.f;
  }

  // chunk_at is the address a lane gives ldmatrix for 16-byte chunk c of
  // row lane % 8 of the 8 swizzled rows (BLOCK) whose first is at `rows`
  // (in the first column block).
  static __device__ __forceinline__ uint32_t chunk_at(uint32_t rows, int c) {
    return swizzle128(rows + (threadIdx.x % 8) * 128 + c / 8 * BLOCK, c % 8);
  }

  // fold adds 8 positions: their K and V rows at kr and vr (shared-memory
  // addresses of the first of 8 rows, D elements each, row r at + r·D·2
  // bytes; BLOCK: + r·128 in each column block) and the lane's two scores' additions add0, add1 (positions 2t
  // and 2t + 1: the mask's, -inf hiding one).
  __device__ __forceinline__ void fold(uint32_t kr, uint32_t vr, float add0, float add1) {
    // S = q·Kᵀ: B fragments from K rows (n = position, k = column):
    // matrix j of an x4 is columns 8j.. of the 8 rows.
    float s[4] = {0.f, 0.f, 0.f, 0.f};
    const uint32_t krow = ldsm_row<D>(kr);
#pragma unroll
    for (int ks = 0; ks < KS; ks += 2) {
      uint32_t b[4];
      ldsm_x4(b, BLOCK > 0 ? chunk_at(kr, (threadIdx.x % 32) / 8 + 2 * ks) : krow + ks * 32);
      if constexpr (kDecodeMmaQSmem) {
        // Matrix j of an x4 at k step ks: columns 8j.. of rows 0-7, so
        // a0 and a2 of step ks + j are matrices 2j and 2j + 1.
        uint32_t a[2][4];
        ldsm_x4(a[0], qrow + ks * 32);
        ldsm_x4(a[1], qrow + 8 * QP * 2 + ks * 32);
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
          for (int part = 0; part < 2; ++part)
            mma_16816<T>(s, a[part][2 * j], 0u, a[part][2 * j + 1], 0u, b[2 * j], b[2 * j + 1]);
      } else {
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
          for (int part = 0; part < 2; ++part)
            mma_16816<T>(s, qa[ks + j][part][0], 0u, qa[ks + j][part][1], 0u, b[2 * j], b[2 * j + 1]);
      }
    }
    // The online softmax of row g over the 8 positions, across the quad.
    const float x0 = add0 == -INFINITY ? -INFINITY : s[0] + add0;
    const float x1 = add1 == -INFINITY ? -INFINITY : s[1] + add1;
    float mx = fmaxf(x0, x1);
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float mnew = fmaxf(m, mx);
    const float corr = mnew == -INFINITY || m == -INFINITY ? (mnew == -INFINITY ? 1.f : 0.f) : __expf(m - mnew);
    const float p0 = x0 == -INFINITY ? 0.f : __expf(x0 - mnew), p1 = x1 == -INFINITY ? 0.f : __expf(x1 - mnew);
    float rs = p0 + p1;
    rs += __shfl_xor_sync(0xffffffffu, rs, 1);
    rs += __shfl_xor_sync(0xffffffffu, rs, 2);
    l = l * corr + rs;
    m = mnew;
#pragma unroll
    for (int n = 0; n < NT; ++n) o[n][0] *= corr, o[n][1] *= corr;
    // O += P·V: P's k columns 8..15 are zeros, so each n-tile's b1 may be
    // anything finite (its b0 again). V's B fragments: matrix j of a
    // transposed x4 is columns 8j.. of the 8 rows.
    uint32_t ph, pl;
    split_pair<T>(p0, p1, ph, pl);
    const uint32_t vrow = ldsm_row<D>(vr);
#pragma unroll
    for (int n0 = 0; n0 < NT; n0 += 4) {
      uint32_t b[4];
      ldsm_x4_t(b, BLOCK > 0 ? chunk_at(vr, (threadIdx.x % 32) / 8 + n0) : vrow + n0 * 16);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        float d[4] = {o[n0 + j][0], o[n0 + j][1], 0.f, 0.f};  // rows g + 8: zeros, dropped
        mma_16816<T>(d, ph, 0u, 0u, 0u, b[j], b[j]);
        mma_16816<T>(d, pl, 0u, 0u, 0u, b[j], b[j]);
        o[n0 + j][0] = d[0], o[n0 + j][1] = d[1];
      }
    }
  }

  // stash writes row g's state (g < G) to part [warp][G][D + 2] (max, sum,
  // the output's D columns), as attention_decode's warps leave theirs for
  // merge_states.
  __device__ __forceinline__ void stash(float* part, int warp) const {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    if (g >= G) return;
    float* row = part + (warp * G + g) * (D + 2);
    if (t == 0) row[0] = m, row[1] = l;
#pragma unroll
    for (int n = 0; n < NT; ++n) row[2 + 8 * n + 2 * t] = o[n][0], row[2 + 8 * n + 2 * t + 1] = o[n][1];
  }
};

}  // namespace mpk
