// linear_tiles: a streamed Linear for M rows of x on the tensor cores, so a
// decode batch or a short prompt chunk reads every weight once per step, as
// one row does (linear_stream holds x in registers and serves one or two
// rows; more would not fit).
//
// Its weights arrive as tile pages: kTileRows rows × C columns of W, each
// row of a page one bulk copy (the loader in runtime/module.cuh), pages in
// row-group-major order (a group's C-column blocks left to right, then the
// next 8 rows). Consumer warp w takes the columns [w·C/16, (w+1)·C/16) of
// every page and accumulates, with mma.sync m16n8k16, the products of those
// columns of the group's 8 rows with x's M rows (A = x, B = W^T). A lane
// loads 16 contiguous bytes of its row of x and of W and feeds them to two
// mmas as their k-pairs: the dot product does not care which k pairs with
// which, as long as x and W use the same order. After each group the warps'
// partials are summed in a fixed order, so results do not depend on timing.
//
// x is staged once per task (or reused from the previous task) in shared
// memory in W's 2-byte type (the mma's operand type), each row PITCH = K +
// 32 elements apart so the lanes of one load phase (two rows) hit different
// banks. x's intermediates are fp32 (lower/widen.go), so with LO x is split
// into hi + lo (HiLo): an m-tile takes 8 rows of x, hi in the mma's rows
// 0-7 and lo in rows 8-15, and a dot is the sum of both, at no extra mma
// for up to 8 rows. Without LO (where hi and lo do not fit in shared
// memory) x is rounded to W's type, as eager rounds every activation, and an
// m-tile takes 16 rows.
#pragma once
#include "tasks/linear.cuh"

namespace mpk {

constexpr int kTileRows = 8;  // weight rows a tile page holds: the mma's n
// The row groups a task whose x comes in parts of K may read (stream.MaxTilePartGroups).
constexpr int kTilePartGroups = 2;

// tile_cols is the columns of a tile page for K-wide rows of esz-byte
// weights: the most that fit kTileRows rows in a page while splitting into
// whole 32-column slices for every consumer warp and dividing K; 0 if none.
// Mirrored by gocore/stream.tileCols.
__host__ __device__ constexpr int tile_cols(int K, int esz) {
  for (int c = kPageBytes / (kTileRows * esz); c >= 32 * kConsumerWarps; c -= 32 * kConsumerWarps)
    if (K % c == 0) return c;
  return 0;
}

// The bytes x takes in shared memory (rounded up to 16): M rows of PITCH,
// twice with LO (hi, then lo).
template <typename T>
__host__ __device__ constexpr int tile_x_bytes(int K, int M, bool lo) {
  return ((lo ? 2 : 1) * M * (K + 32) * (int)sizeof(T) + 15) / 16 * 16;
}

// d += a·b for one m16n8k16 tile (fp32 accumulators). Not volatile: the
// compiler may interleave independent mmas (volatile, each issued in source
// order, back to back behind the one it depends on).
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                          uint32_t b0, uint32_t b1);

template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void mma_16816<__half>(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                  uint32_t b0, uint32_t b1) {
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// stage_rows stages x's M rows, row m at xs + m·PITCH, through the op's
// prologue, B rows at a time with all their loads issued before any is used
// (a row at a time, each row cost a round trip, and an RMSNorm's two
// barriers; M rows of a merge cost M times one). Rows in other layouts
// (not contiguous float rows, or not aligned for 4-wide loads: rare) go
// through stage_x one by one.
template <int K>
constexpr int stage_batch(int M, int operands) {
  const int b = 32 / (per_thread(K) * operands);  // 32 registers of loaded values, at most 8 rows
  const int c = M < 8 ? M : 8;
  return b < 1 ? 1 : b < c ? b : c;
}

// Rows read four elements a load (a 16-byte load of fp32, 8 bytes of a
// 2-byte kind): thread t takes elements 4·(t + i·MPK_THREADS) onwards. The
// raw words are converted only once every load of a batch is out.
constexpr int per_thread4(int k) { return (k / 4 + MPK_THREADS - 1) / MPK_THREADS; }

// batch4 is the rows a batch of 4-wide row loads takes: 32 registers of raw
// words (8 loads a thread), at most M.
constexpr int batch4(int k, int m) {
  const int b = 8 / per_thread4(k);
  return b < 1 ? 1 : b < m ? b : m;
}

template <int K, int N>
__device__ __forceinline__ bool rows4_ok(const View& v, const Slots<N>& s) {
  const int64_t esz = v.dtype == DT_FLOAT32 ? 4 : 2;
  return K % 4 == 0 && float_row2(v) && (reinterpret_cast<uintptr_t>(base(s, v)) + v.offset * esz) % (4 * esz) == 0 &&
         v.stride[0] % 4 == 0;
}

template <int K>
__device__ __forceinline__ void load_row4(const char* p, const View& v, int64_t m, uint4 (&raw)[per_thread4(K)],
                                          int64_t k0 = 0) {
  const int64_t o = v.offset + m * v.stride[0] + k0;
#pragma unroll
  for (int i = 0; i < per_thread4(K); ++i)
    raw[i] = ld_raw4(p, v.dtype, o + 4 * min((int)threadIdx.x + i * MPK_THREADS, K / 4 - 1));
}

// load_rows4 issues the loads of rows m0 .. m0 + B - 1 of x (past M: row
// M - 1 again), all before any is used; K columns from column k0.
template <int K, int B, int N>
__device__ __forceinline__ void load_rows4(const View& x, int m0, int M, uint4 (&raw)[B][per_thread4(K)],
                                           const Slots<N>& s, int64_t k0 = 0) {
#pragma unroll
  for (int b = 0; b < B; ++b) load_row4<K>(base(s, x), x, min(m0 + b, M - 1), raw[b], k0);
}

// Plain rows, x's dtype XD a constant (-1: read at run time), as norm_rows;
// K columns from column k0.
template <int XD, int K, int M, int PITCH, int N, typename X>
__device__ __forceinline__ void plain_rows(const View& x, X xs, const Slots<N>& s, int64_t k0 = 0) {
  const int32_t xd = XD < 0 ? x.dtype : XD;
  constexpr int Q = per_thread4(K), B = batch4(K, M);
#pragma unroll 1
  for (int m0 = 0; m0 < M; m0 += B) {
    uint4 raw[B][Q];
    load_rows4<K>(x, m0, M, raw, s, k0);
#pragma unroll
    for (int b = 0; b < B; ++b)
#pragma unroll
      for (int i = 0; i < Q; ++i) {
        const int k = 4 * ((int)threadIdx.x + i * MPK_THREADS);
        if (m0 + b >= M || k >= K) continue;
        put_x4(xs + (m0 + b) * PITCH, k, cvt_row4(raw[b][i], xd));
      }
  }
}

// plain_rows_of is plain_rows with fp32 x (every intermediate) a constant
// dtype, any other read at run time.
template <int K, int M, int PITCH, int N, typename X>
__device__ __forceinline__ void plain_rows_of(const View& x, X xs, const Slots<N>& s, int64_t k0 = 0) {
  if (x.dtype == DT_FLOAT32) plain_rows<DT_FLOAT32, K, M, PITCH>(x, xs, s, k0);
  else plain_rows<-1, K, M, PITCH>(x, xs, s, k0);
}

template <int K, int M, int PITCH, int N, typename X>
__device__ __forceinline__ void stage_rows(NoPro, const Op& op, X xs, const Slots<N>& s) {
  const View& x = op.in[0];
  if (!rows4_ok<K>(x, s)) {
#pragma unroll 1
    for (int m = 0; m < M; ++m) stage_x<K>(NoPro{}, op, m, xs + m * PITCH, s);
  } else {
    plain_rows_of<K, M, PITCH>(x, xs, s);
  }
}

// stage_part stages columns [k0, k0 + KX) of a plain x's M rows (x staged
// in parts of K: linear_tiles' XP) as stage_rows(NoPro) stages all of them.
template <int KX, int M, int PITCH, int N, typename X>
__device__ __forceinline__ void stage_part(const Op& op, int k0, X xs, const Slots<N>& s) {
  const View& x = op.in[0];
  if (rows4_ok<KX>(x, s) && k0 % 4 == 0) {
    plain_rows_of<KX, M, PITCH>(x, xs, s, k0);
    return;
  }
#pragma unroll 1
  for (int m = 0; m < M; ++m) stage_plain_any(op, m, xs + m * PITCH, KX, s, k0);
}

// The two-operand elementwise prologue (SiLU(gate)·up); others row by row.
template <int K, int M, int PITCH, typename E, int N, typename X>
__device__ __forceinline__ void stage_rows(ExprPro<E>, const Op& op, X xs, const Slots<N>& s) {
  const View &a = op.in[0], &c = op.in[op.pro_first];
  if (pro_end(op) - op.pro_first != 1 || !float_row2(a) || !float_row2(c) || !float_kind(op.pro_dtype)) {
#pragma unroll 1
    for (int m = 0; m < M; ++m) stage_x<K>(ExprPro<E>{}, op, m, xs + m * PITCH, s);
    return;
  }
  constexpr int PT = per_thread(K), B = stage_batch<K>(M, 2);
#pragma unroll 1
  for (int m0 = 0; m0 < M; m0 += B) {
    float va[B][PT], vc[B][PT];
#pragma unroll
    for (int b = 0; b < B; ++b) {
      load_x_row<K>(base(s, a), a, min(m0 + b, M - 1), va[b]);
      load_x_row<K>(base(s, c), c, min(m0 + b, M - 1), vc[b]);
    }
#pragma unroll
    for (int b = 0; b < B; ++b)
#pragma unroll
      for (int i = 0; i < PT; ++i) {
        int64_t idx[2] = {m0 + b, threadIdx.x + i * MPK_THREADS};
        if (m0 + b >= M || idx[1] >= K) continue;
        double in[MPK_MAX_INPUTS];
        in[0] = va[b][i];
        in[1] = vc[b][i];
        put_x(xs + (m0 + b) * PITCH, (int)idx[1], round_float(op.pro_dtype, (float)E::eval(in, idx)));
      }
  }
}

// norm_batches loads a norm's weight row once, then x's rows in batches of
// batch4(K, M), all of a batch's loads issued before any is used, and hands
// f each batch (its first row and raw words) with the weight's words; K
// columns from column k0.
template <int K, int M, int N, typename F>
__device__ __forceinline__ void norm_batches(const View& x, const View& w, const Slots<N>& s, F f, int64_t k0 = 0) {
  constexpr int Q = per_thread4(K), B = batch4(K, M);
  uint4 rw[Q];
  load_row4<K>(base(s, w), w, 0, rw, k0);
#pragma unroll 1
  for (int m0 = 0; m0 < M; m0 += B) {
    uint4 rx[B][Q];
    load_rows4<K>(x, m0, M, rx, s, k0);
    f(m0, rx, rw);
  }
}

// pow2_at_least is the smallest power of two not below n.
constexpr int pow2_at_least(int n) { return n <= 1 ? 1 : 2 * pow2_at_least((n + 1) / 2); }

// RMSNorm: the batch's sums reduced with one pair of barriers: each warp's
// B partial sums at once (warp_sums), then each row's warp partials by a
// group of 32 / P lanes, its rsqrt broadcast from that group's first lane
// (a warp_sum a row on each side cost 80 shuffles a warp for 8 rows: the
// norm staged 8 rows in 3.7 us against plain rows' 1.7, bench/stage_probe).
// The weight (one row, broadcast over x's rows) is loaded once, with the
// first batch; without a weight that load reads x's first row rather than
// branch: a branch between the loads kept them from issuing together. XD,
// WD and PD are x's, the weight's and the result's dtypes as constants (-1:
// read at run time): with the dtypes read at run time, the branches of each
// element's conversions and roundings made the staging instruction-bound
// (~1 us a row of 2,048 at 16 rows, against ~0.35 for plain rows).
template <int XD, int WD, int PD, int K, int M, int PITCH, int N, typename X>
__device__ __forceinline__ void norm_rows(const Op& op, const View& x, const View& w, bool has_w, X xs,
                                          const Slots<N>& s) {
  const int32_t xd = XD < 0 ? x.dtype : XD, wd = WD < 0 ? w.dtype : WD, pd = PD < 0 ? op.pro_dtype : PD;
  constexpr int Q = per_thread4(K), B = batch4(K, M), P = pow2_at_least(B), L = 32 / P;
  __shared__ float sums[P][kConsumerWarps];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  norm_batches<K, M>(x, w, s, [&](int m0, const uint4(&rx)[B][Q], const uint4(&rw)[Q]) {
    float ss[P];
#pragma unroll
    for (int b = 0; b < P; ++b) {
      ss[b] = 0.f;
      if (b < B)
#pragma unroll
        for (int i = 0; i < Q; ++i) {
          const float4 f = cvt_row4(rx[b][i], xd);
          if (4 * ((int)threadIdx.x + i * MPK_THREADS) < K) ss[b] += f.x * f.x + f.y * f.y + f.z * f.z + f.w * f.w;
        }
    }
    const float mine = warp_sums(ss);  // row lane / L's sum over the warp
    consumer_sync();                   // the previous batch has read sums
    if (lane % L == 0) sums[lane / L][warp] = mine;
    consumer_sync();
    float tot = 0.f;  // row lane / L: lanes lane % L, + L, ... of the warps' partials
#pragma unroll
    for (int j = 0; j < (kConsumerWarps + L - 1) / L; ++j)
      if (lane % L + j * L < kConsumerWarps) tot += sums[lane / L][lane % L + j * L];
#pragma unroll
    for (int o = L / 2; o > 0; o /= 2) tot += __shfl_xor_sync(0xffffffffu, tot, o);
    const float inv_mine = rsqrtf(tot / (float)K + op.eps);
#pragma unroll
    for (int b = 0; b < B; ++b) {
      const float inv = __shfl_sync(0xffffffffu, inv_mine, b * L);
#pragma unroll
      for (int i = 0; i < Q; ++i) {
        const int k = 4 * ((int)threadIdx.x + i * MPK_THREADS);
        if (m0 + b >= M || k >= K) continue;
        const float4 f = cvt_row4(rx[b][i], xd), gw = cvt_row4(rw[i], wd);
        const float v[4] = {f.x, f.y, f.z, f.w}, gv[4] = {gw.x, gw.y, gw.z, gw.w};
        float r[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float y = round_float(xd, v[e] * inv);
          r[e] = round_float(pd, has_w ? y * gv[e] : y);
        }
        put_x4(xs + (m0 + b) * PITCH, k, make_float4(r[0], r[1], r[2], r[3]));
      }
    }
  });
}

template <int K, int M, int PITCH, int N, typename X>
__device__ __forceinline__ void stage_rows(NormPro, const Op& op, X xs, const Slots<N>& s) {
  const View& x = op.in[0];
  const bool has_w = op.flags & FLAG_WEIGHT;
  const View& w = has_w ? op.in[op.pro_first] : x;
  if (!rows4_ok<K>(x, s) || !rows4_ok<K>(w, s) || has_w && w.stride[0] != 0) {
#pragma unroll 1
    for (int m = 0; m < M; ++m) stage_x<K>(NormPro{}, op, m, xs + m * PITCH, s);
    return;
  }
  // (The widened residual stream with a bf16 weight and an fp32 result,
  // every decoder's norm where intermediates are fp32, takes
  // norm_rows_deferred: linear_tiles' tile_norm_deferred. bench/stage_probe
  // times norm_rows with those dtypes as constants against it.)
  norm_rows<-1, -1, -1, K, M, PITCH>(op, x, w, has_w, xs, s);
}

// The deferred norm of a tile stream (as norm_deferred is a register
// stream's): x·w is staged without the rows' sums of squares, each warp's
// partial sum of row m lands in the row's pad (the 32 elements past K of its
// hi part, which no mma reads: kConsumerWarps floats), and the dots are
// scaled by the row's rsqrt once summed (tile_row_scales). No barriers and
// no reductions before the stream starts: the staging of plain rows
// (bench/stage_probe: 8 rows of 2,048 staged in 2.1 us through the norm,
// 1.0 plain). Exact up to fp32 reassociation, so only where x and the
// prologue's result are fp32 with a bf16 weight (every decoder's norm over
// the widened residual stream); q, k and v reuse the staged x and its pads.
// x in parts of K (linear_tiles' XP, codegen's WideXParts): each part's
// partial sums are added into the pads (past the part's K columns, which
// the next part's staging leaves alone), and the dots scaled once all are in.
template <int K, int N>
__device__ __forceinline__ bool tile_norm_deferred(const Op& op, const Slots<N>& s) {
  const View &x = op.in[0], &w = op.in[op.pro_first];
  return (op.flags & FLAG_WEIGHT) && x.dtype == DT_FLOAT32 && w.dtype == DT_BFLOAT16 && op.pro_dtype == DT_FLOAT32 &&
         w.stride[0] == 0 && rows4_ok<K>(x, s) && rows4_ok<K>(w, s);
}

template <int K, int PITCH, typename T>
__device__ __forceinline__ float* tile_row_pad(T* xs_hi, int m) {  // K: the staged columns
  static_assert(32 * sizeof(T) >= kConsumerWarps * sizeof(float), "a row's pad holds every warp's partial sum");
  return reinterpret_cast<float*>(xs_hi + m * PITCH + K);
}

// add_row_pad puts warp's partial sum t of row m's squares in the row's pad,
// or (add: x in parts, a later part's) adds it to the sum there.
template <int K, int PITCH, typename T>
__device__ __forceinline__ void add_row_pad(T* xs_hi, int m, int warp, float t, bool add) {
  float* pad = tile_row_pad<K, PITCH>(xs_hi, m);
  pad[warp] = (add ? pad[warp] : 0.f) + t;
}

// K columns of x from column k0; add: into the pads' sums (a later part).
template <int K, int M, int PITCH, int N, typename X, typename T>
__device__ __forceinline__ void norm_rows_deferred(const Op& op, X xs, T* xs_hi, const Slots<N>& s, int64_t k0 = 0,
                                                   bool add = false) {
  const View &x = op.in[0], &w = op.in[op.pro_first];
  constexpr int Q = per_thread4(K), B = batch4(K, M);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  norm_batches<K, M>(x, w, s, [&](int m0, const uint4(&rx)[B][Q], const uint4(&rw)[Q]) {
    float ss[B];
#pragma unroll
    for (int b = 0; b < B; ++b) {
      ss[b] = 0.f;
#pragma unroll
      for (int i = 0; i < Q; ++i) {
        const int k = 4 * ((int)threadIdx.x + i * MPK_THREADS);
        const float4 f = cvt_row4(rx[b][i], DT_FLOAT32), g = cvt_row4(rw[i], DT_BFLOAT16);
        if (k >= K) continue;
        ss[b] += f.x * f.x + f.y * f.y + f.z * f.z + f.w * f.w;
        if (m0 + b < M) put_x4(xs + (m0 + b) * PITCH, k, make_float4(f.x * g.x, f.y * g.y, f.z * g.z, f.w * g.w));
      }
    }
#pragma unroll
    for (int b = 0; b < B; ++b) {
      const float t = warp_sum(ss[b]);
      if (lane == 0 && m0 + b < M) add_row_pad<K, PITCH>(xs_hi, m0 + b, warp, t, add);
    }
  }, k0);
}

// norm_part_any is norm_rows_deferred for rows the 4-wide loads do not take
// (not rows4_ok: a misaligned weight, rare), row by row, element by element.
template <int K, int M, int PITCH, int N, typename X, typename T>
__device__ __noinline__ void norm_part_any(const Op& op, X xs, T* xs_hi, const Slots<N>& s, int64_t k0, bool add) {
  const View &x = op.in[0], &w = op.in[op.pro_first];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll 1
  for (int m = 0; m < M; ++m) {
    float ss = 0.f;
    for (int k = threadIdx.x; k < K; k += MPK_THREADS) {
      int64_t i[2] = {m, k0 + k};
      const float v = (float)load_elem(base(s, x), x.dtype, offset_of(x, i));
      ss += v * v;
      put_x(xs + m * PITCH, k, v * (float)load_elem(base(s, w), w.dtype, offset_of(w, i)));
    }
    const float t = warp_sum(ss);
    if (lane == 0) add_row_pad<K, PITCH>(xs_hi, m, warp, t, add);
  }
}

// tile_row_scale is row m's rsqrt(mean(x²) + eps) over its K columns from
// the partials in its pad (after the barrier that ends the staging), the
// pad past KP staged columns (x in parts: a part's).
template <int K, int PITCH, int KP = K, typename T>
__device__ __forceinline__ float tile_row_scale(const Op& op, T* xs_hi, int m) {
  const float4* p = reinterpret_cast<const float4*>(tile_row_pad<KP, PITCH>(xs_hi, m));
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < kConsumerWarps / 4; ++i) {
    const float4 v = p[i];
    ss += (v.x + v.y) + (v.z + v.w);
  }
  return rsqrtf(ss / (float)K + op.eps);
}

// The attention merge: MR rows a call, at most 2 (row, head) pairs a warp
// (the registers a single row's merge of 32 heads takes; with more the
// merge spilled).
template <int K, int M, int PITCH, int D, int H, int CHUNK, int R, int SPLITS, int N, typename X>
__device__ __forceinline__ void stage_rows(MergePro<D, H, CHUNK, R, SPLITS>, const Op& op, X xs, const Slots<N>& s) {
  constexpr int MR = 2 * kConsumerWarps / H < 1 ? 1 : 2 * kConsumerWarps / H < M ? 2 * kConsumerWarps / H : M;
#pragma unroll 1
  for (int m0 = 0; m0 < M; m0 += MR) stage_merge<K, D, H, CHUNK, R, SPLITS, MR, PITCH>(op, m0, min(MR, M - m0), xs + m0 * PITCH, s);
}

// linear_tiles is a Linear whose M rows of x meet the weights' tile pages on
// the tensor cores. XP > 1 (codegen's stream.TileXParts: an x whose whole
// would shrink the ring): x is staged in XP parts of K, one after another,
// the loader sending each part's pages of every row group before the next
// part's. A task of at most kTilePartGroups groups (not a pair) keeps each
// group's sums in registers across the parts; any other adds each part's
// sums of a group into its dots in shared memory. A normed x in parts is the
// deferred norm's (stream.DeferredNorm): the rows' sums of squares add up
// part by part, and the store scales the dots. A pair (PairEpi: lower's
// pair_tiles) takes each row group's pages of its first weight, then of its
// second, their dots side by side, and meets both in its store.
template <typename T, int K, int M, bool LO, int P, bool RESID, typename PRO, typename EPI, int XP, int N>
__device__ uint32_t linear_tiles(const Op& op, int lo, int hi, const Slots<N>& s, const Ctx c) {
  constexpr int C = tile_cols(K, (int)sizeof(T));
  constexpr int NW = kIsPair<EPI> ? 2 : 1;  // weights a task streams (a pair: gate's rows, then up's)
  constexpr bool NORM = std::is_same<PRO, NormPro>::value;
  static_assert(C > 0, "K does not split into tile pages");
  static_assert(sizeof(T) == 2, "tile streams take 2-byte weights");
  static_assert(XP == 1 || (std::is_same<PRO, NoPro>::value || NORM) && (K / C) % XP == 0,
                "x in parts of K: a plain or normed x, each part whole pages");
  constexpr int RT = LO ? 8 : 16;  // rows of x an m-tile takes
  constexpr int KX = K / XP, PITCH = KX + 32, MT = (M + RT - 1) / RT, CB = K / C, CBX = CB / XP, WC = C / kConsumerWarps;
  T* xs = reinterpret_cast<T*>(c.smem);  // [M][PITCH], then (LO) lo: [M][PITCH]
  float* part = reinterpret_cast<float*>(c.smem + tile_x_bytes<T>(KX, M, LO));  // [2][warp][row of a group][M]
  float* dots = part + 2 * kConsumerWarps * kTileRows * M;                    // [row][M], then (a pair) the second weight's
  bool defer = false;  // a deferred norm: the dots scaled by their rows' tile_row_scale
  if constexpr (NORM) defer = tile_norm_deferred<K>(op, s);
  // x's part at column k0 (XP > 1). A normed x is always the deferred
  // norm's (codegen checked its dtypes); rows the 4-wide loads do not take
  // go element by element.
  auto stage_x_part = [&](int k0) {
    if constexpr (NORM) {
      const bool add = k0 > 0;
      if (defer) {
        if constexpr (LO) norm_rows_deferred<KX, M, PITCH>(op, HiLo<T>{xs, xs + M * PITCH}, xs, s, k0, add);
        else norm_rows_deferred<KX, M, PITCH>(op, xs, xs, s, k0, add);
      } else {
        if constexpr (LO) norm_part_any<KX, M, PITCH>(op, HiLo<T>{xs, xs + M * PITCH}, xs, s, k0, add);
        else norm_part_any<KX, M, PITCH>(op, xs, xs, s, k0, add);
      }
    } else {
      if constexpr (LO) stage_part<KX, M, PITCH>(op, k0, HiLo<T>{xs, xs + M * PITCH}, s);
      else stage_part<KX, M, PITCH>(op, k0, xs, s);
    }
  };
  if (!c.x_ready) {
    if constexpr (XP > 1) {
      stage_x_part(0);
    } else {
      if constexpr (std::is_same<PRO, NormPro>::value)
        if (defer) {
          if constexpr (LO) norm_rows_deferred<K, M, PITCH>(op, HiLo<T>{xs, xs + M * PITCH}, xs, s);
          else norm_rows_deferred<K, M, PITCH>(op, xs, xs, s);
        }
      if (!defer) {
        if constexpr (LO) stage_rows<K, M, PITCH>(PRO{}, op, HiLo<T>{xs, xs + M * PITCH}, s);
        else stage_rows<K, M, PITCH>(PRO{}, op, xs, s);
      }
    }
    consumer_sync();
  }
  mark_staged();
  // The rows' scales of the dots this thread sums (i = threadIdx.x + j·MPK_THREADS below: row i % M);
  // x in parts: 1, the store scales (the pads hold every part's sums after the last).
  constexpr int SJ = (kTileRows * M + MPK_THREADS - 1) / MPK_THREADS;
  const bool scale_at_store = NORM && XP > 1;
  float row_scale[SJ];
#pragma unroll
  for (int j = 0; j < SJ; ++j)
    row_scale[j] = defer && !scale_at_store ? tile_row_scale<K, PITCH>(op, xs, ((int)threadIdx.x + j * MPK_THREADS) % M) : 1.f;
  const Ring<P> ring = ring_at<P>(c.ring);
  uint32_t seq = c.seq;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  const int rows = hi - lo, groups = (rows + kTileRows - 1) / kTileRows, outs = rows * M;
  const bool fast_epi = !std::is_same<EPI, NoEpi>::value && epi_fast(op);
  const EpiIn pre = first_epi<EPI>(op, lo, outs, M, fast_epi, s);
  // This lane's 16 bytes of x (row g of each m-tile) and of W (row g of the page).
  const uint32_t xl = smem_u32(xs) + (g * PITCH + warp * WC + 8 * t) * 2;
  const uint32_t wl = (g * C + warp * WC + 8 * t) * 2;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  // page_dots adds page sq's products with the staged x's columns from
  // col into acc, then frees the page.
  auto page_dots = [&](float(&acc)[MT][4], uint32_t sq, int col) {
    wait_page(ring, sq, c.abort);
    const uint32_t wp = smem_u32(ring.page(sq)) + wl;
#pragma unroll
    for (int j = 0; j < WC / 32; ++j) {
      const uint4 b = ld_shared_16(wp + j * 64);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const int m = mt * RT + g;
        const uint32_t xa = xl + (mt * RT * PITCH + col + j * 32) * 2;
        // The mma's rows 8-15: x's low part (LO), or x's rows m + 8.
        const int m8 = LO ? m : m + 8;
        const uint4 a = m < M ? ld_shared_16(xa) : zero;
        const uint4 a8 = m8 < M ? ld_shared_16(xa + (LO ? M : 8) * PITCH * 2) : zero;
        mma_16816<T>(acc[mt], a.x, a8.x, a.y, a8.y, b.x, b.y);
        mma_16816<T>(acc[mt], a.z, a8.z, a.w, a8.w, b.z, b.w);
      }
    }
    ring.release(sq);
  };
  // group_dots sums the warps' partials of row group grp into its dots
  // (wi 1: of a pair's second weight, whose group follows the first's);
  // add: onto them (x in parts, a later part's).
  auto group_dots = [&](int grp, const float(&acc)[MT][4], int wi, bool add, int buf) {
    // Lane (g, t) holds rows 2t and 2t+1 of the group times the mma's rows
    // g and g+8 of each m-tile (LO: x's row g, its hi and lo parts). The
    // warps' partials go to buffer buf of two (the other may still be read:
    // the calls alternate); each of the group's dots is their sum.
    float* pg = part + (buf * kConsumerWarps + warp) * kTileRows * M;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const int m = mt * RT + g;
      if constexpr (LO) {
        if (m < M) pg[2 * t * M + m] = acc[mt][0] + acc[mt][2], pg[(2 * t + 1) * M + m] = acc[mt][1] + acc[mt][3];
      } else {
        if (m < M) pg[2 * t * M + m] = acc[mt][0], pg[(2 * t + 1) * M + m] = acc[mt][1];
        if (m + 8 < M) pg[2 * t * M + m + 8] = acc[mt][2], pg[(2 * t + 1) * M + m + 8] = acc[mt][3];
      }
    }
    consumer_sync();
#pragma unroll
    for (int j = 0; j < SJ; ++j) {
      const int i = threadIdx.x + j * MPK_THREADS;
      if (i >= kTileRows * M || grp * kTileRows * M + i >= outs) break;
      const float* pi = part + buf * kConsumerWarps * kTileRows * M + i;
      float v = 0.f;
#pragma unroll
      for (int w = 0; w < kConsumerWarps; ++w) v += pi[w * kTileRows * M];
      float* d = dots + wi * outs + grp * kTileRows * M + i;
      *d = (add ? *d : 0.f) + v * row_scale[j];  // the thread that added the earlier parts
    }
  };
  // restage stages x's part xp once every warp is done with the last.
  auto restage = [&](int xp) {
    consumer_sync();
    stage_x_part(xp * KX);
    consumer_sync();
  };
  if (XP > 1 && NW == 1 && groups <= kTilePartGroups) {  // each group's sums in registers across the parts
    float acc[kTilePartGroups][MT][4];
#pragma unroll
    for (int gi = 0; gi < kTilePartGroups; ++gi)
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) acc[gi][mt][0] = acc[gi][mt][1] = acc[gi][mt][2] = acc[gi][mt][3] = 0.f;
#pragma unroll 1
    for (int xp = 0; xp < XP; ++xp) {
      if (xp > 0) restage(xp);
#pragma unroll
      for (int gi = 0; gi < kTilePartGroups; ++gi)
        if (gi < groups)
#pragma unroll 1
          for (int cb = 0; cb < CBX; ++cb, ++seq) page_dots(acc[gi], seq, cb * C);
    }
#pragma unroll
    for (int gi = 0; gi < kTilePartGroups; ++gi)
      if (gi < groups) group_dots(gi, acc[gi], 0, false, gi & 1);
  } else {  // each row group's sums (of each weight); x in parts: each part's added into its dots
    int calls = 0;  // the partials' buffers alternate call by call
#pragma unroll 1
    for (int xp = 0; xp < XP; ++xp) {
      if (xp > 0) restage(xp);
#pragma unroll 1
      for (int grp = 0; grp < groups; ++grp)
#pragma unroll
        for (int wi = 0; wi < NW; ++wi, ++calls) {
          float acc[MT][4];
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) acc[mt][0] = acc[mt][1] = acc[mt][2] = acc[mt][3] = 0.f;
#pragma unroll 1
          for (int cb = 0; cb < CBX; ++cb, ++seq) page_dots(acc, seq, cb * C);
          group_dots(grp, acc, wi, xp > 0, calls & 1);
        }
    }
  }
  consumer_sync();
  mark_dots();
  for (int r = threadIdx.x; r < outs; r += MPK_THREADS) {
    // x in parts through the deferred norm: the row's scale once every part's sums are in its pad.
    const float sc = scale_at_store ? tile_row_scale<K, PITCH, KX>(op, xs, r % M) : 1.f;
    store_out<RESID, EPI>(op, r % M, lo + r / M, dots[r] * sc, s, fast_epi && r < MPK_THREADS ? &pre : nullptr,
                          kIsPair<EPI> ? dots[outs + r] * sc : 0.f);
  }
  return seq;
}

}  // namespace mpk
