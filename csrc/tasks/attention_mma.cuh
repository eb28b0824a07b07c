// Decode attention on the tensor cores (attention_partial with MMA): the
// units of attention_decode (a head group of UG query heads of one KV head,
// one split of the KV positions), each warp taking blocks of 32 positions.
//
// attention_decode gives a lane a position and the unit's outputs are spread
// over the lanes, so a block of 32 positions is a chain of ~2,500 dependent
// instructions a warp at UG = 4 (FMA, shuffles, 64-bit index math) and its V
// arrives in batches, a round trip each. Here a block's K and V rows go to
// shared memory with cp.async in one round trip, then
//   S = Q·Kᵀ    rows: the UG heads (of mma's 16), columns: the 32 positions
//   Oᵀ += Vᵀ·Pᵀ rows: the head dim, columns: the heads (of mma's 8)
// so P leaves the first mma's accumulators in the layout the second one's B
// operand takes (no shuffle), and no accumulator row is wasted on Oᵀ. q
// (fp32) and p are split hi + lo in T, as the GEMM stream splits x: two mmas
// each, for the precision of the FMA path. The warps of a unit merge their
// states through shared memory as attention_decode's do (merge_states).
#pragma once

#include "tasks/attention.cuh"
#include "tasks/gemm.cuh"

namespace mpk {

// The shared memory of the warps a task runs units on: per warp K and V
// tiles of 32 rows (pitch D + 8 elements: ldmatrix rows on distinct banks),
// the queries [UG][D] and the mask adds [UG][32] in fp32, and its state
// [UG][D + 2] to merge; then ROWS' live splits per batch row. Codegen
// reserves decode_mma_bytes (4 warps, or 2 past head dim 64); a task runs
// on as many warps as the module's scratch holds (decode_mma_warps_for):
// a batch's scratch is large for its Linears' x anyway.
__host__ __device__ constexpr int decode_mma_warp_bytes(int D, int UG) {
  return 2 * 32 * (D + 8) * 2 + UG * D * 4 + UG * 32 * 4;
}
__host__ __device__ constexpr int decode_mma_bytes(int D, int UG, int rows) {
  return (D <= 64 ? 4 : 2) * (decode_mma_warp_bytes(D, UG) + UG * (D + 2) * 4) + 4 * rows;
}
__host__ __device__ constexpr int decode_mma_warps_for(int shared, int D, int UG, int rows) {
  const int n = (shared - 4 * rows) / (decode_mma_warp_bytes(D, UG) + UG * (D + 2) * 4);
  return n < 1 ? 1 : n > kConsumerWarps ? kConsumerWarps : n;
}

// cp_async_16_zfill copies 16 bytes, or writes 16 zero bytes when !live
// (reading nothing).
__device__ __forceinline__ void cp_async_16_zfill(uint32_t dst, const void* src, bool live) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(live ? 16 : 0) : "memory");
}

// ldmatrix_x4 loads four 8x8 matrices of 2-byte elements, lane l giving the
// address of row l % 8 of matrix l / 8; TRANS hands each lane the transposed.
template <bool TRANS>
__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  if constexpr (TRANS)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

// split2 rounds (a, b) to T as hi and their remainders as lo.
template <typename T>
__device__ __forceinline__ void split2(float a, float b, uint32_t& hi, uint32_t& lo) {
  hi = pack2<T>(a, b);
  const float2 r = unpack2<T>(hi);
  lo = pack2<T>(a - r.x, b - r.y);
}

// decode_mma_warp is one warp's share of a unit (batch row u.b, the UG
// heads from u.h0, the KV head they read): the blocks of 32 positions from
// jb, step apart, below j_hi. Its softmax state goes to pw ([UG][D + 2]:
// max, sum, unnormalised output) for the unit's merge. Out of line, so its
// loop has the registers to itself (a spill here is an L2 round trip: the
// L1 beside a full shared-memory carve-out is a few KB a warp).
template <typename T, typename QT, typename MT, int D, int UG, int N>
__device__ __noinline__ void decode_mma_warp(const Op& op, const Slots<N>& s, DecodeUnit u, int jb, int j_hi, int step,
                                             char* mine, float* pw) {
  constexpr int PITCH = D + 8, CH = D / 8, MT_ = D / 16;
  const View &k = op.in[1], &v = op.in[2];
  const int S = (int)k.shape[2], lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int ks = (int)k.stride[2], vs = (int)v.stride[2], kvh = u.h0 / op.groups;
  T* kt = reinterpret_cast<T*>(mine);  // [32][PITCH]
  T* vt = kt + 32 * PITCH;             // [32][PITCH]
  float* qs = reinterpret_cast<float*>(vt + 32 * PITCH);  // [UG][D], pre-scaled
  float* madd = qs + UG * D;                              // [UG][32]
  float m_run = -INFINITY, l_run = 0.f;  // row g's (head u.h0 + g)
  float o[MT_][4];                       // Oᵀ: dims 16·mt + g (+8), heads 2t, 2t+1
#pragma unroll
  for (int mt = 0; mt < MT_; ++mt) o[mt][0] = o[mt][1] = o[mt][2] = o[mt][3] = 0.f;
  const T* krows = reinterpret_cast<const T*>(base(s, k)) + k.offset + u.b * k.stride[0] + kvh * k.stride[1];
  const T* vrows = reinterpret_cast<const T*>(base(s, v)) + v.offset + u.b * v.stride[0] + kvh * v.stride[1];
  const MaskRow<MT> mask = mask_row<MT>(op, s, u.b, u.h0);
  int64_t mask_hs = 0;
  if constexpr (UG > 1 && !std::is_void<MT>::value) mask_hs = op.in[3].stride[1];
  // Lane addresses: its 16-byte column e of the copies, its rows of the
  // ldmatrix reads (K: position lane % 8, dims +8 per lane / 8; V: positions
  // +8 per (lane / 8) / 2, dims +8 per (lane / 8) % 2); the loops add constants.
  const int e = (lane % CH) * 8;
  const uint32_t kdst = smem_u32(kt) + ((lane / CH) * PITCH + e) * 2, vdst = kdst + 32 * PITCH * 2;
  const uint32_t kld = smem_u32(kt) + ((lane % 8) * PITCH + 8 * (lane / 8)) * 2;
  const uint32_t vld = smem_u32(vt) + ((8 * (lane / 16) + lane % 8) * PITCH + 8 * ((lane / 8) % 2)) * 2;
  for (int jg = jb, first = 1; jg < j_hi; jg += step, first = 0) {
    // This block's K and V rows, 16 bytes a copy (32 / CH rows a pass), the
    // rows past the chunk zeroed. Not unrolled: unrolled, its addresses were
    // hoisted out of the block loop and spilled.
#pragma unroll 1
    for (int it = 0; it < CH; ++it) {
      const int r = it * (32 / CH) + lane / CH, j = jg + r, at = min(j, S - 1);
      cp_async_16_zfill(kdst + it * (32 / CH) * PITCH * 2, krows + at * ks + e, j < j_hi);
      cp_async_16_zfill(vdst + it * (32 / CH) * PITCH * 2, vrows + at * vs + e, j < j_hi);
    }
    const int j = jg + lane;
    float add[UG];
    bool live = false;
#pragma unroll
    for (int h = 0; h < UG; ++h) {
      add[h] = j >= j_hi ? -INFINITY : h == 0 || mask_hs != 0 ? mask.add(j, h * mask_hs) : add[0];
      live = live || add[h] != -INFINITY;
    }
    if (first) stage_queries<QT, D, UG>(qs, op, s, u.b, u.h0, lane);
    cp_async_wait_all();
    __syncwarp();  // every lane's copies landed (a row is copied by 8 lanes)
    if (first) mark_staged();
    // A position every head's mask hides is never read: its V row is zeroed
    // (p = 0 times a NaN there would still be NaN).
    if (!live && j < j_hi)
#pragma unroll
      for (int e = 0; e < D; e += 8) *reinterpret_cast<uint4*>(vt + lane * PITCH + e) = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int h = 0; h < UG; ++h) madd[h * 32 + lane] = add[h];
    __syncwarp();
    // S = Q·Kᵀ (rows past UG are zero queries).
    float sc[4][4];
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < MT_; kk += 2) {  // two k-steps of 16 dims
      uint32_t ah[2][2], al[2][2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int d0 = 16 * (kk + h) + 2 * t;
        const float2 x0 = g < UG ? *reinterpret_cast<const float2*>(qs + g * D + d0) : make_float2(0.f, 0.f);
        const float2 x8 = g < UG ? *reinterpret_cast<const float2*>(qs + g * D + d0 + 8) : make_float2(0.f, 0.f);
        split2<T>(x0.x, x0.y, ah[h][0], al[h][0]);
        split2<T>(x8.x, x8.y, ah[h][1], al[h][1]);
      }
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        uint32_t b0, b1, b2, b3;  // positions 8nt.., dims 16kk.. (b0 b1) and 16(kk+1).. (b2 b3)
        ldmatrix_x4<false>(kld + (8 * nt * PITCH + 16 * kk) * 2, b0, b1, b2, b3);
        mma_16816<T>(sc[nt], ah[0][0], 0u, ah[0][1], 0u, b0, b1);
        mma_16816<T>(sc[nt], al[0][0], 0u, al[0][1], 0u, b0, b1);
        if (kk + 1 < MT_) {
          mma_16816<T>(sc[nt], ah[1][0], 0u, ah[1][1], 0u, b2, b3);
          mma_16816<T>(sc[nt], al[1][0], 0u, al[1][1], 0u, b2, b3);
        }
      }
    }
    // Online softmax of row g over its 8 positions here and the 3 lanes beside.
    float x[4][2], mx = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float a = g < UG ? madd[g * 32 + 8 * nt + 2 * t + e] : 0.f;
        x[nt][e] = a != -INFINITY ? a + sc[nt][e] : -INFINITY;
        mx = fmaxf(mx, x[nt][e]);
      }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float mnew = fmaxf(m_run, mx);
    const float corr = mnew == -INFINITY ? 1.f : __expf(m_run - mnew);
    float pr[4][2], sum = 0.f;
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        pr[nt][e] = x[nt][e] != -INFINITY ? __expf(x[nt][e] - mnew) : 0.f;
        sum += pr[nt][e];
      }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    l_run = l_run * corr + sum;
    m_run = mnew;
    // Oᵀ's columns are heads 2t and 2t+1, whose rows lanes 8t and 8t+4 own.
    const float c0 = __shfl_sync(0xffffffffu, corr, 8 * t), c1 = __shfl_sync(0xffffffffu, corr, 8 * t + 4);
#pragma unroll
    for (int mt = 0; mt < MT_; ++mt) o[mt][0] *= c0, o[mt][1] *= c1, o[mt][2] *= c0, o[mt][3] *= c1;
    // Oᵀ += Vᵀ·Pᵀ, 16 positions a k-step: Pᵀ's fragment is S's accumulators.
#pragma unroll
    for (int js = 0; js < 2; ++js) {
      uint32_t bh0, bl0, bh1, bl1;
      split2<T>(pr[2 * js][0], pr[2 * js][1], bh0, bl0);
      split2<T>(pr[2 * js + 1][0], pr[2 * js + 1][1], bh1, bl1);
#pragma unroll
      for (int mt = 0; mt < MT_; ++mt) {
        uint32_t a0, a1, a2, a3;
        ldmatrix_x4<true>(vld + (16 * js * PITCH + 16 * mt) * 2, a0, a1, a2, a3);
        mma_16816<T>(o[mt], a0, a1, a2, a3, bh0, bh1);
        mma_16816<T>(o[mt], a0, a1, a2, a3, bl0, bl1);
      }
    }
    __syncwarp();  // the tiles and adds are refilled by the next block
  }
  mark_dots();
  // The warp's state for the unit's merge.
  if (t == 0 && g < UG) pw[g * (D + 2)] = m_run, pw[g * (D + 2) + 1] = l_run;
#pragma unroll
  for (int mt = 0; mt < MT_; ++mt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int h = 2 * t + (e & 1), d = 16 * mt + g + 8 * (e >> 1);
      if (h < UG) pw[h * (D + 2) + 2 + d] = o[mt][e];
    }
}

template <typename T, typename QT, typename MT, int D, int R, bool ROWS, int UG, int NW, int N>
__device__ __noinline__ void attention_decode_mma(const Op& op, int lo, int hi, const Slots<N>& s, char* smem) {
  static_assert(decode_mma_fits<T, D, UG>(), "decode mma: 2-byte K and V, head dim a multiple of 16 up to 128, 8 heads a unit");
  const View& p = op.out;
  const int S = (int)op.in[1].shape[2];
  const int splits = (int)p.shape[1], chunk = (S + splits - 1) / splits;
  const int S_live = op.flags & FLAG_CAUSAL ? min(S, 1) : S;  // a causal mask aligns the query with position 0
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  char* mine = smem + min(warp, NW - 1) * decode_mma_warp_bytes(D, UG);  // the warp's tiles, queries and adds
  float* part = reinterpret_cast<float*>(smem + NW * decode_mma_warp_bytes(D, UG));  // [NW][UG][D + 2]
  int* row_live = reinterpret_cast<int*>(part + NW * UG * (D + 2));
  const int cp = min(NW, (chunk + 31) / 32), units = NW / cp, sub = warp % cp;
  const DecodeUnits<R, ROWS> du(op, lo, hi, splits, chunk, UG, row_live, s);
  for (int i0 = 0; i0 < du.n; i0 += units) {
    const bool active = warp < NW && warp / cp < units && i0 + warp / cp < du.n;
    const DecodeUnit u = du.unit(i0 + warp / cp, splits, UG);
    if (active) {
      const int j_lo = min(du.g.chunk(u.sp) * chunk, S_live), j_hi = min(j_lo + chunk, S_live);
      decode_mma_warp<T, QT, MT, D, UG>(op, s, u, j_lo + 32 * sub, j_hi, 32 * cp, mine, part + warp * UG * (D + 2));
    } else if (warp < NW && lane < UG) {  // an idle unit warp: an empty state, which the merge skips
      part[(warp * UG + lane) * (D + 2)] = -INFINITY;
      part[(warp * UG + lane) * (D + 2) + 1] = 0.f;
    }
    consumer_sync();
    if (active && sub == 0)
#pragma unroll
      for (int h = 0; h < UG; ++h) {
        float acc[(D + 31) / 32], M, L;
        merge_states<D, UG>(part, warp, cp, h, lane, acc, M, L);
        store_partial<D>(reinterpret_cast<float*>(base(s, p)) + p.offset + u.b * p.stride[0] + u.sp * p.stride[1] +
                             (u.h0 + h) * p.stride[2],
                         p.stride[4], M, L, acc, lane);
      }
    consumer_sync();  // part is reused by the next round
  }
  if constexpr (ROWS) consumer_sync();  // row_live is read until the last round
}

}  // namespace mpk
