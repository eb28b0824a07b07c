// Task ops for everything that is not a weight stream: elementwise
// expressions, copies, concatenation, reductions, gathers and the KV-cache
// write. Each walks its tile through the op's view descriptors; in a decode
// step these tensors are small, so index arithmetic is not the bottleneck.
#pragma once
#include "runtime/runtime.cuh"

namespace mpk {

template <int N>
__device__ void copy(const Op& op, int lo, int hi, const Slots<N>& s, char*) {
  for_each_index(op.out.shape, op.out.rank, op.split_dim, lo, hi, [&](const int64_t* idx) {
    double v = load_elem(base(s, op.in[0]), op.in[0].dtype, offset_of(op.in[0], idx));
    store_elem(base(s, op.out), op.out.dtype, offset_of(op.out, idx), v);
  });
}

template <int N>
__device__ void empty(const Op&, int, int, const Slots<N>&, char*) {}

template <int N>
__device__ void cat(const Op& op, int lo, int hi, const Slots<N>& s, char*) {
  const int d = op.dim;
  for_each_index(op.out.shape, op.out.rank, op.split_dim, lo, hi, [&](const int64_t* idx) {
    int64_t in_idx[MPK_MAX_RANK];
    for (int k = 0; k < op.out.rank; ++k) in_idx[k] = idx[k];
    int64_t off = idx[d];
#pragma unroll 1
    for (int i = 0; i < op.num_in; ++i) {
      if (off < op.in[i].shape[d]) {
        in_idx[d] = off;
        double v = load_elem(base(s, op.in[i]), op.in[i].dtype, offset_of(op.in[i], in_idx));
        store_elem(base(s, op.out), op.out.dtype, offset_of(op.out, idx), v);
        return;
      }
      off -= op.in[i].shape[d];
    }
  });
}

// reduce folds the trailing in.rank - out.rank dims of the input.
template <int N>
__device__ void reduce(const Op& op, int lo, int hi, const Slots<N>& s, char*) {
  const View& in = op.in[0];
  const int k = op.out.rank;
  int64_t n = 1;
  for (int d = k; d < in.rank; ++d) n *= in.shape[d];
  for_each_index(op.out.shape, op.out.rank, op.split_dim, lo, hi, [&](const int64_t* idx) {
    int64_t full[MPK_MAX_RANK];
    for (int d = 0; d < k; ++d) full[d] = idx[d];
    double acc = 0, best = op.reduce == RED_AMIN ? INFINITY : -INFINITY, arg = 0;
    for (int64_t r = 0; r < n; ++r) {
      int64_t rem = r;
      for (int d = in.rank - 1; d >= k; --d) {
        full[d] = rem % in.shape[d];
        rem /= in.shape[d];
      }
      double v = load_elem(base(s, in), in.dtype, offset_of(in, full));
      if (op.reduce == RED_SUM || op.reduce == RED_MEAN) acc += v;
      else if (isnan(best)) continue;  // NaN wins, the first one
      else if (op.reduce == RED_AMIN) { if (v < best || isnan(v)) best = v; }
      else if (v > best || isnan(v)) { best = v; arg = (double)r; }
    }
    double out = op.reduce == RED_MEAN ? acc / (double)n
                 : op.reduce == RED_SUM ? acc
                 : op.reduce == RED_ARGMAX ? arg : best;
    store_elem(base(s, op.out), op.out.dtype, offset_of(op.out, idx), out);
  });
}

// Fast paths for rows of floats. The generic loops call load_elem (out of
// line, to keep code small) and find each element's offset by 64-bit division,
// so every element costs a memory latency of its own; decode's per-head ops
// (q/k RMSNorm, RoPE, the KV write) are a few thousand elements on one worker,
// and that latency chain made them 7-15 us each. When every view's last dim is
// contiguous and every dtype a float kind, rows are read with inline loads
// issued together and offsets are found once per row.
__device__ __forceinline__ bool float_kind(int32_t dt) {
  return dt == DT_FLOAT32 || dt == DT_BFLOAT16 || dt == DT_FLOAT16;
}

__device__ __forceinline__ bool float_row(const View& v) { return float_kind(v.dtype) && v.stride[v.rank - 1] == 1; }

// ld_float reads element i of a float-kind array with ONE unconditional load
// (the aligned 32-bit word holding it) and selects: no branch on the dtype,
// so the loads of a loop issue together. With a branch per element (the
// obvious code) nvcc kept each load in its own block and the loads of a row
// went out one at a time, a full L2 round trip each (~0.5 us on the H100
// while the weight stream runs): decode attention took 22 us a task so.
// A 2-byte element's word never crosses its allocation's 4-byte alignment.
__device__ __forceinline__ float ld_float(const char* p, int32_t dt, int64_t i) {
  const bool f32 = dt == DT_FLOAT32;
  const uintptr_t a = reinterpret_cast<uintptr_t>(p) + (i << (f32 ? 2 : 1));
  const unsigned w = __ldcg(reinterpret_cast<const unsigned*>(a & ~uintptr_t(3)));
  // All three readings, then selects: a conditional conversion became a
  // branch, and the next load waited behind it.
  const unsigned h = (a & 2) ? w >> 16 : w & 0xffffu;
  const float as_bf16 = __uint_as_float(h << 16), as_f16 = __half2float(__ushort_as_half((unsigned short)h));
  const float narrow = dt == DT_BFLOAT16 ? as_bf16 : as_f16;
  return f32 ? __uint_as_float(w) : narrow;
}

// ld_raw4 reads elements i..i+3 of a float-kind array (aligned to their 4
// elements) in one load through L2, raw: 16 bytes of fp32, or a 2-byte
// kind's 8 in the low half. cvt_row4 converts them, so a batch of raw loads
// can go out before any is converted.
__device__ __forceinline__ uint4 ld_raw4(const char* p, int32_t dt, int64_t i) {
  if (dt == DT_FLOAT32) return __ldcg(reinterpret_cast<const uint4*>(p + i * 4));
  const uint2 h = __ldcg(reinterpret_cast<const uint2*>(p + i * 2));
  return make_uint4(h.x, h.y, 0, 0);
}

__device__ __forceinline__ float4 cvt_row4(const uint4& r, int32_t dt) {
  if (dt == DT_FLOAT32) return make_float4(__uint_as_float(r.x), __uint_as_float(r.y), __uint_as_float(r.z), __uint_as_float(r.w));
  if (dt == DT_BFLOAT16)
    return make_float4(__uint_as_float(r.x << 16), __uint_as_float(r.x & 0xffff0000u), __uint_as_float(r.y << 16),
                       __uint_as_float(r.y & 0xffff0000u));
  const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&r.x)), b = __half22float2(*reinterpret_cast<const __half2*>(&r.y));
  return make_float4(a.x, a.y, b.x, b.y);
}

// ld_float4 reads elements i..i+3 of a float-kind array as floats (fp32
// loaded as floats: no conversion after the load).
__device__ __forceinline__ float4 ld_float4(const char* p, int32_t dt, int64_t i) {
  if (dt == DT_FLOAT32) return __ldcg(reinterpret_cast<const float4*>(p + i * 4));
  return cvt_row4(ld_raw4(p, dt, i), dt);
}

// ld_typed reads one element of a float kind known at compile time.
__device__ __forceinline__ float ld_typed(const float* p) { return __ldcg(p); }
__device__ __forceinline__ float ld_typed(const __nv_bfloat16* p) {
  return __uint_as_float(static_cast<unsigned>(__ldcg(reinterpret_cast<const unsigned short*>(p))) << 16);
}
__device__ __forceinline__ float ld_typed(const __half* p) {
  return __half2float(__ushort_as_half(__ldcg(reinterpret_cast<const unsigned short*>(p))));
}

// st_float stores element i of a float-kind array, or of a split one (a
// GEMM's x: split_store).
__device__ __forceinline__ void st_float(char* p, int32_t dt, int64_t i, float v) {
  if (dt == DT_FLOAT32) reinterpret_cast<float*>(p)[i] = v;
  else if (dt == DT_BFLOAT16) reinterpret_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
  else if (dt == DT_SPLIT_BF16) split_store(p, i, v);
  else reinterpret_cast<__half*>(p)[i] = __float2half_rn(v);
}

// out_row: v is a float-kind row an op may store to with st_float, or a
// split one (no loads: ld_float does not read split arrays).
__device__ __forceinline__ bool out_row(const View& v) {
  return (float_kind(v.dtype) || v.dtype == DT_SPLIT_BF16) && v.stride[v.rank - 1] == 1;
}

// rows4_view: v is 2-D rows of floats in groups of 4 (last dim contiguous,
// offset and row stride multiples of 4, base 16-byte aligned), read 16
// bytes at a time by elementwise_rows4.
template <int N>
__device__ __forceinline__ bool rows4_view(const View& v, const Slots<N>& s) {
  return v.rank == 2 && float_kind(v.dtype) && v.stride[1] == 1 && v.offset % 4 == 0 && v.stride[0] % 4 == 0 &&
         reinterpret_cast<uintptr_t>(base(s, v)) % 16 == 0;
}

// elementwise_rows4 is elementwise for a 2-D op whose views are rows of
// floats in groups of 4 (last dim contiguous, offsets, row strides and the
// task's columns multiples of 4, bases 16-byte aligned; decompose cuts such
// an op's columns in 4s): each thread loads its group of every input at
// once, 16 bytes a load, so a task of two groups a thread takes one round
// trip, not two (a 64-token chunk's K-split sum and residual, 64 x 2,048,
// took 12 us a task element by element). false: not such an op.
template <typename E, int N>
__device__ __forceinline__ bool elementwise_rows4(const Op& op, int lo, int hi, const Slots<N>& s) {
  const View& o = op.out;
  if (o.rank != 2 || op.num_in == 0 || op.split_dim > 1) return false;
  const int64_t r0 = op.split_dim == 0 ? lo : 0, c0 = op.split_dim == 1 ? lo : 0;
  const int64_t rows = op.split_dim == 0 ? hi - lo : o.shape[0], cols = op.split_dim == 1 ? hi - lo : o.shape[1];
  bool ok = cols % 4 == 0 && c0 % 4 == 0 && rows4_view(o, s);
  for (int i = 0; i < op.num_in; ++i) ok = ok && rows4_view(op.in[i], s);
  if (!ok) return false;
  const int64_t groups = rows * (cols / 4);
  for (int64_t g = threadIdx.x; g < groups; g += MPK_THREADS) {
    const int64_t m = r0 + g / (cols / 4), c = c0 + g % (cols / 4) * 4;
    float4 f[MPK_MAX_INPUTS];
#pragma unroll
    for (int i = 0; i < MPK_MAX_INPUTS; ++i) {  // the last input repeated past num_in, as in elementwise
      const View& v = op.in[min(i, op.num_in - 1)];
      f[i] = ld_float4(base(s, v), v.dtype, v.offset + m * v.stride[0] + c);
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      double in[MPK_MAX_INPUTS];
#pragma unroll
      for (int i = 0; i < MPK_MAX_INPUTS; ++i) in[i] = e == 0 ? f[i].x : e == 1 ? f[i].y : e == 2 ? f[i].z : f[i].w;
      const int64_t idx[2] = {m, c + e};
      st_float(base(s, o), o.dtype, o.offset + m * o.stride[0] + c + e, (float)E::eval(in, idx));
    }
  }
  return true;
}

// elementwise evaluates E (a generated functor) at every index of the tile.
// When every input is of a float kind, an element's inputs are read with
// inline loads issued together (ld_float, the last input repeated past
// num_in): out of line one after another, a K-split's sum of 4 slices and a
// residual (a 64-token chunk, 64 x 2,048) took 11 us a task on the H100.
template <typename E, int N>
__device__ void elementwise(const Op& op, int lo, int hi, const Slots<N>& s) {
  if (elementwise_rows4<E>(op, lo, hi, s)) return;
  bool floats = op.num_in > 0 && float_kind(op.out.dtype);
  for (int i = 0; i < op.num_in; ++i) floats = floats && float_kind(op.in[i].dtype);
  for_each_index(op.out.shape, op.out.rank, op.split_dim, lo, hi, [&](const int64_t* idx) {
    double in[MPK_MAX_INPUTS];
    if (floats) {
      float f[MPK_MAX_INPUTS];
#pragma unroll
      for (int i = 0; i < MPK_MAX_INPUTS; ++i) {
        const View& v = op.in[min(i, op.num_in - 1)];
        f[i] = ld_float(base(s, v), v.dtype, offset_of(v, idx));
      }
#pragma unroll
      for (int i = 0; i < MPK_MAX_INPUTS; ++i) in[i] = f[i];
      st_float(base(s, op.out), op.out.dtype, offset_of(op.out, idx), (float)E::eval(in, idx));
      return;
    }
#pragma unroll 1
    for (int i = 0; i < op.num_in; ++i) in[i] = load_elem(base(s, op.in[i]), op.in[i].dtype, offset_of(op.in[i], idx));
    store_elem(base(s, op.out), op.out.dtype, offset_of(op.out, idx), E::eval(in, idx));
  });
}

// round_float is round_to for the float kinds, in fp32 (the same values:
// products and sums of such operands round once either way).
__device__ __forceinline__ float round_float(int32_t dt, float v) {
  if (dt == DT_BFLOAT16) return __bfloat162float(__float2bfloat16_rn(v));
  if (dt == DT_FLOAT16) return __half2float(__float2half_rn(v));
  return v;
}

// rotate_pair is RoPE of the pair (x1, x2) = (x[j], x[j + D/2]) with cos
// and sin (c1, s1) at j and (c2, s2) at j + D/2: x·cos + rotate_half(x)·sin,
// each product and sum rounded to dt as eager rounds them.
__device__ __forceinline__ float2 rotate_pair(float x1, float x2, float c1, float s1, float c2, float s2, int32_t dt) {
  const float r1 = round_float(dt, round_float(dt, x1 * c1) + round_float(dt, round_float(dt, -x2) * s1));
  const float r2 = round_float(dt, round_float(dt, x2 * c2) + round_float(dt, round_float(dt, x1) * s2));
  return make_float2(r1, r2);
}

// Rows of a tile: the index of row `row` (flat over all dims but the last,
// with [lo, hi) along split_dim), last index 0. rows_of gives their count.
__device__ __forceinline__ int64_t rows_of(const int64_t* shape, int rank, int split, int lo, int hi) {
  int64_t rows = 1;
  for (int d = 0; d < rank - 1; ++d) rows *= d == split ? (int64_t)(hi - lo) : shape[d];
  return rows;
}

// RowAt is a row's element offset in each of K views, and the row's index
// along one dim (row_offsets).
template <int K>
struct RowAt {
  int64_t off[K];
  int64_t along;
};

// row_offsets gives the offsets of row `row` (flat over all dims but the
// last, with [lo, hi) along split, last index 0) in the views v, view k's dim
// e taken at the row's dim e + shift[k] (an index tensor read at the row's
// position along a dim), and the row's index along dim. Straight from the
// row number, with no index array: an array indexed at run time lives in
// local memory, of which L1 holds little beside the megakernel's shared
// memory, and every row task read its index back in round trips (SASS: LDLs
// in offset_of's loop; a KV head's norm + RoPE + cache write took ~7 us a
// row). 32-bit arithmetic below 2^31 rows, as unflatten (runtime/runtime.cuh).
template <int K>
__device__ __forceinline__ RowAt<K> row_offsets(const View* const (&v)[K], const int (&shift)[K], int64_t row,
                                                const int64_t* shape, int rank, int split, int lo, int hi,
                                                int dim = -1) {
  RowAt<K> a;
#pragma unroll
  for (int k = 0; k < K; ++k) a.off[k] = v[k]->offset;
  a.along = 0;
  const bool narrow = row <= 0x7fffffffll;
  uint32_t r32 = (uint32_t)row;  // below 2^31: an extent past 2^32 - 1 holds it whole
  int64_t r64 = row;
#pragma unroll 1
  for (int d = rank - 2; d >= 0; --d) {
    const int64_t ext = d == split ? (int64_t)(hi - lo) : shape[d];
    int64_t i;
    if (narrow) {
      const uint32_t e = ext > 0xffffffffll ? 0xffffffffu : (uint32_t)ext;
      i = e == 1 ? 0 : r32 % e;
      r32 = e == 1 ? r32 : r32 / e;
    } else {
      i = r64 % ext;
      r64 /= ext;
    }
    i += d == split ? lo : 0;
    if (d == dim) a.along = i;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int e = d - shift[k];
      if (e >= 0 && e < v[k]->rank) a.off[k] += i * v[k]->stride[e];
    }
  }
  return a;
}

// divmod splits flat element t of rows of n into (row, column), 32-bit
// where both fit (the usual case; see row_offsets).
__device__ __forceinline__ void divmod(int64_t t, int64_t n, int64_t& row, int64_t& col) {
  if (t <= 0x7fffffffll && n <= 0x7fffffffll) {
    row = (uint32_t)t / (uint32_t)n, col = (uint32_t)t % (uint32_t)n;
  } else {
    row = t / n, col = t % n;
  }
}

// checked_index wraps a loaded index element negative as torch does; out of
// range it reports the error (the launch aborts) and returns -1, which every
// caller takes as "write nothing". read_index loads it first.
__device__ __forceinline__ int64_t checked_index(int64_t raw, int64_t size) {
  const int64_t i = raw < 0 ? raw + size : raw;
  if (i < 0 || i >= size) {
    index_error(raw, size);
    return -1;
  }
  return i;
}

__device__ __forceinline__ int64_t read_index(const char* p, const View& v, const int64_t* idx, int64_t size) {
  return checked_index((int64_t)load_elem(p, v.dtype, offset_of(v, idx)), size);
}

// kBatch is how many elements a thread of kv_write and rope loads before it
// stores any: the check of an index may call index_error, which no later
// load moves above, so element by element each took its own round trip (a
// 64-token chunk's KV-head task: 8 of them, 16 us; a 512-token one's 64).
constexpr int kBatch = 4;

// Readers of an index tensor's elements for kv_write's and rope's batches:
// an int64 index (HF's cache_position) inline, so a batch's index loads go
// out together; load_elem is a call, and each call waited for its own load
// (a 64-token chunk's V write: 8 round trips a thread, 17.5 us a task).
struct Int64Index {
  const long long* p;
  __device__ __forceinline__ int64_t operator()(int64_t i) const { return __ldcg(p + i); }
};
struct AnyIndex {
  const char* p;
  int32_t dt;
  __device__ __forceinline__ int64_t operator()(int64_t i) const { return (int64_t)load_elem(p, dt, i); }
};
struct NoIndex {  // no index tensor (rope without a cache)
  __device__ __forceinline__ int64_t operator()(int64_t) const { return 0; }
};
// with_index calls f with the reader for index view v.
template <typename F>
__device__ __forceinline__ void with_index(const char* p, const View& v, F f) {
  if (v.dtype == DT_INT64) f(Int64Index{reinterpret_cast<const long long*>(p)});
  else f(AnyIndex{p, v.dtype});
}

// RoPE rows normally land at their own index of op.out; with FLAG_CACHE
// (a RoPE fused with the KV-cache write after it) op.out is the cache and
// row idx lands at position in[num_in - 1][idx[dim]] along dim. rope_shape
// is the index space the task walks; rope_out is the offset of element idx,
// or -1 for a position out of range (nothing is written).
__device__ __forceinline__ const int64_t* rope_shape(const Op& op) {
  return (op.flags & FLAG_CACHE) ? op.in[0].shape : op.out.shape;
}

template <int N>
__device__ __forceinline__ int64_t rope_out(const Op& op, const int64_t* idx, const Slots<N>& s) {
  if (!(op.flags & FLAG_CACHE)) return offset_of(op.out, idx);
  const View& pos = op.in[op.num_in - 1];
  int64_t at[MPK_MAX_RANK];
  for (int d = 0; d < op.out.rank; ++d) at[d] = idx[d];
  at[op.dim] = read_index(base(s, pos), pos, idx + op.dim, op.out.shape[op.dim]);
  return at[op.dim] < 0 ? -1 : offset_of(op.out, at);
}

template <int N>
__device__ void embedding(const Op& op, int lo, int hi, const Slots<N>& s, char*) {
  const View& w = op.in[0];
  const View& ids = op.in[1];
  const int r = op.out.rank - 1;
  for_each_index(op.out.shape, op.out.rank, op.split_dim, lo, hi, [&](const int64_t* idx) {
    int64_t row = read_index(base(s, ids), ids, idx, w.shape[0]);
    double v = NAN;
    if (row >= 0) {
      int64_t widx[2] = {row, idx[r]};
      v = load_elem(base(s, w), w.dtype, offset_of(w, widx));
    }
    store_elem(base(s, op.out), op.out.dtype, offset_of(op.out, idx), v);
  });
}

template <int N>
__device__ void gather(const Op& op, int lo, int hi, const Slots<N>& s, char*) {
  const View& src = op.in[0];
  const View& ids = op.in[1];
  const int d = op.dim, n = ids.rank;
  for_each_index(op.out.shape, op.out.rank, op.split_dim, lo, hi, [&](const int64_t* idx) {
    int64_t i = read_index(base(s, ids), ids, idx + d, src.shape[d]);
    double v = NAN;
    if (i >= 0) {
      int64_t sidx[MPK_MAX_RANK];
      for (int k = 0; k < d; ++k) sidx[k] = idx[k];
      sidx[d] = i;
      for (int k = d + 1; k < src.rank; ++k) sidx[k] = idx[k - 1 + n];
      v = load_elem(base(s, src), src.dtype, offset_of(src, sidx));
    }
    store_elem(base(s, op.out), op.out.dtype, offset_of(op.out, idx), v);
  });
}

// kv_write_rows is kv_write over rows of floats (the source's and the
// cache's last dim contiguous), row by row; a tile cut along the last dim
// takes columns [lo, hi) of every row. ix reads the positions.
template <typename IX, int N>
__device__ __forceinline__ void kv_write_rows(const Op& op, int lo, int hi, const Slots<N>& s, IX ix) {
  const View& ids = op.in[0];
  const View& src = op.in[1];
  const int d = op.dim;
  const int r = src.rank - 1;
  const bool cut_last = op.split_dim == r;
  const int split = cut_last ? -1 : op.split_dim;
  const int64_t j0 = cut_last ? lo : 0, D = cut_last ? (int64_t)(hi - lo) : src.shape[r];
  const int64_t rows = rows_of(src.shape, src.rank, split, lo, hi), total = rows * D, size = op.out.shape[d];
  for (int64_t t0 = threadIdx.x; t0 < total; t0 += (int64_t)kBatch * MPK_THREADS) {
    // kBatch values and their positions loaded (clamped, not branched), then stored.
    float v[kBatch];
    int64_t raw[kBatch], at[kBatch];  // at: the element's offset in the cache at position 0
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      int64_t row, col;
      divmod(min(t0 + (int64_t)b * MPK_THREADS, total - 1), D, row, col);
      const RowAt<3> a = row_offsets({&src, &ids, &op.out}, {0, d, 0}, row, src.shape, src.rank, split, lo, hi, d);
      const int64_t j = j0 + col;
      v[b] = ld_float(base(s, src), src.dtype, a.off[0] + j);
      raw[b] = ix(a.off[1]);
      at[b] = a.off[2] - a.along * op.out.stride[d] + j;
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      if (t0 + (int64_t)b * MPK_THREADS >= total) break;
      const int64_t pos = checked_index(raw[b], size);
      if (pos < 0) continue;  // an out-of-range position writes nothing
      st_float(base(s, op.out), op.out.dtype, at[b] + pos * op.out.stride[d], v[b]);
    }
  }
}

// kv_write_warp_rows is kv_write_rows for int64 positions and rows of at
// most 128 floats (a multiple of 32) in a tile not cut along them: a warp
// per row, its offsets and position computed once a row rather than once an
// element (64-bit index arithmetic on every element: a 64-token chunk's V
// write, a KV head's 64 rows of 128 a task, took 27 us, now 10 on the H200;
// bench/NOTES.md, forty-fourth session). One row a warp at a time: batching
// a warp's rows spilled across the megakernel, whose noinline tasks share
// its registers (forty-third session).
template <int N>
__device__ __forceinline__ void kv_write_warp_rows(const Op& op, int lo, int hi, const Slots<N>& s) {
  const View& ids = op.in[0];
  const View& src = op.in[1];
  const long long* positions = reinterpret_cast<const long long*>(base(s, ids));
  const int d = op.dim, per = (int)(src.shape[src.rank - 1] / 32);
  const int64_t rows = rows_of(src.shape, src.rank, op.split_dim, lo, hi), size = op.out.shape[d];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = MPK_THREADS / 32;
  constexpr int kMaxPer = 4;
  for (int64_t row = warp; row < rows; row += warps) {
    const RowAt<3> a = row_offsets({&src, &ids, &op.out}, {0, d, 0}, row, src.shape, src.rank, op.split_dim, lo, hi, d);
    float v[kMaxPer];
    // Every load unconditional (k past per reloads the last), the position's with them.
#pragma unroll
    for (int k = 0; k < kMaxPer; ++k) v[k] = ld_float(base(s, src), src.dtype, a.off[0] + min(k, per - 1) * 32 + lane);
    const int64_t raw = __ldcg(positions + a.off[1]);
    const int64_t at = a.off[2] - a.along * op.out.stride[d] + lane;  // the row's offset in the cache at position 0
    const int64_t pos = checked_index(raw, size);
    if (pos < 0) continue;  // an out-of-range position writes nothing
#pragma unroll
    for (int k = 0; k < kMaxPer; ++k)
      if (k < per) st_float(base(s, op.out), op.out.dtype, at + pos * op.out.stride[d] + k * 32, v[k]);
  }
}

// kv_write is index_copy in place: out.select(dim, index[i]) = src.select(dim, i).
// The tile iterates over the source rows.
template <int N>
__device__ void kv_write(const Op& op, int lo, int hi, const Slots<N>& s, char*) {
  const View& ids = op.in[0];
  const View& src = op.in[1];
  const int d = op.dim;
  const int r = src.rank - 1;
  if (d < r && float_row(src) && float_row(op.out)) {
    const int64_t D = src.shape[r];
    if (op.split_dim != r && D % 32 == 0 && D <= 128 && ids.dtype == DT_INT64)
      kv_write_warp_rows(op, lo, hi, s);
    else
      with_index(base(s, ids), ids, [&](auto ix) { kv_write_rows(op, lo, hi, s, ix); });
    return;
  }
  for_each_index(src.shape, src.rank, op.split_dim, lo, hi, [&](const int64_t* idx) {
    int64_t pos = read_index(base(s, ids), ids, idx + d, op.out.shape[d]);
    if (pos < 0) return;  // an out-of-range position writes nothing
    int64_t didx[MPK_MAX_RANK];
    for (int k = 0; k < src.rank; ++k) didx[k] = idx[k];
    didx[d] = pos;
    double v = load_elem(base(s, src), src.dtype, offset_of(src, idx));
    store_elem(base(s, op.out), op.out.dtype, offset_of(op.out, didx), v);
  });
}

// rope_dest moves oo, where a RoPE element's (or row's) stores start, to
// its cache position with FLAG_CACHE (cache: raw, the loaded position,
// checked); false for a position out of range (index_error reported,
// nothing is written).
__device__ __forceinline__ bool rope_dest(const Op& op, bool cache, int64_t raw, int64_t& oo) {
  if (cache) {
    const int64_t pos = checked_index(raw, op.out.shape[op.dim]);
    if (pos < 0) return false;
    oo += pos * op.out.stride[op.dim];
  }
  return true;
}

// rope_store_row rotates a row G lanes hold (lane l of them: elements l,
// l + G, ...; element k·G + l's partner (k + HP)·G + l) and stores it from oo
// (the row's start plus the lane), each product and sum rounded as eager
// rounds them (rotate_pair's sums, written out).
template <int HP, int G>
__device__ __forceinline__ void rope_store_row(char* out, int32_t dt, int64_t oo, const float* v, const float* cv,
                                               const float* sv) {
#pragma unroll
  for (int k = 0; k < HP; ++k) {
    const float x1 = v[k], x2 = v[k + HP];
    const float r1 = round_float(dt, round_float(dt, x1 * cv[k]) + round_float(dt, round_float(dt, -x2) * sv[k]));
    const float r2 = round_float(dt, round_float(dt, x2 * cv[k + HP]) + round_float(dt, round_float(dt, x1) * sv[k + HP]));
    st_float(out, dt, oo + k * G, r1);
    st_float(out, dt, oo + (k + HP) * G, r2);
  }
}

// rope_normed is rope with an RMSNorm prologue (op.pro_first > 0): each row of
// x is normalised first (in[0] is the norm's input, in[pro_first] its weight),
// rounded to pro_dtype as the norm's output was. G lanes take a row (half a
// warp for rows of 128, else a warp): lane l holds elements l, l+G, ...,
// so with h a multiple of G both halves of every rotated pair sit in one lane
// and the row never leaves registers.
template <int N>
__device__ __noinline__ void rope_normed_any(const Op& op, int lo, int hi, const Slots<N>& s);

// rope_lane_rows is the fast path of rope and rope_normed (kNorm), G lanes
// a row (the two rows of a warp's halves side by side when G is 16: the loop
// runs alike on both halves, a half past the last row repeating it and
// storing nothing, so the shuffles see every lane). A row's offsets are
// computed once for its lanes: rope_rows computes them for every pair, and a
// decode batch's K rotation + cache write (8 rows of 64 a task) took 10-11 us
// of 64-bit index arithmetic (bench/NOTES.md, fiftieth session).
template <int G, bool kNorm, int N>
__device__ __forceinline__ void rope_lane_rows(const Op& op, int lo, int hi, const Slots<N>& s) {
  constexpr int kMaxPer = 128 / G;  // head dims up to 128 in registers
  const View &x = op.in[0], &c = op.in[1], &sn = op.in[2], &w = op.in[kNorm ? op.pro_first : 0];
  const int r = op.out.rank - 1;
  const int64_t D = x.shape[r];
  const int32_t dt = op.out.dtype;
  const bool has_w = kNorm && (op.flags & FLAG_WEIGHT);
  const int split = op.split_dim == r ? -1 : op.split_dim;
  const int64_t* shape = rope_shape(op);
  const int64_t rows = rows_of(shape, op.out.rank, split, lo, hi);
  const int lane = threadIdx.x % G, sub = threadIdx.x % 32 / G, groups = MPK_THREADS / G;
  const int per = (int)(D / G), hp = per / 2;  // element k*G+lane's partner is (k+hp)*G+lane
  const bool cache = op.flags & FLAG_CACHE;
  const View& pv = cache ? op.in[op.num_in - 1] : op.out;  // the cache positions (with FLAG_CACHE)
  const View& g_view = has_w ? w : x;
  for (int64_t r0 = threadIdx.x / 32 * (32 / G); r0 < rows; r0 += groups) {
    const int64_t row = min(r0 + sub, rows - 1);  // a half past the last row repeats it
    // views: x, cos, sin, the norm's weight, out, the positions
    const RowAt<6> a = row_offsets({&x, &c, &sn, &g_view, &op.out, &pv}, {0, 0, 0, 0, 0, cache ? op.dim : 0}, row,
                                   shape, op.out.rank, split, lo, hi, cache ? op.dim : -1);
    const int64_t xo = a.off[0], co = a.off[1], so = a.off[2], wo = a.off[3];
    float v[kMaxPer], g[kMaxPer], cv[kMaxPer], sv[kMaxPer];
    float ss = 0.f;
    // Every load unconditional (k past per reloads the last), then the
    // sum: a condition around load and use would serialise the loads.
#pragma unroll
    for (int k = 0; k < kMaxPer; ++k) {
      const int64_t j = min(k, per - 1) * G + lane;
      v[k] = ld_float(base(s, x), x.dtype, xo + j);
      g[k] = kNorm ? ld_float(base(s, g_view), g_view.dtype, wo + j) : 1.f;
      cv[k] = ld_float(base(s, c), c.dtype, co + j);
      sv[k] = ld_float(base(s, sn), sn.dtype, so + j);
    }
    // The cache position after the row's loads (HF's int64 cache_position
    // inline; load_elem is a call, and issued first it made the row's loads
    // wait for it; after them it waited for them and its own load in turn).
    const int64_t raw = !cache                  ? 0
                        : pv.dtype == DT_INT64 ? (int64_t)__ldcg(reinterpret_cast<const long long*>(base(s, pv)) + a.off[5])
                                               : (int64_t)load_elem(base(s, pv), pv.dtype, a.off[5]);
    if (kNorm) {
#pragma unroll
      for (int k = 0; k < kMaxPer; ++k) {
        if (!has_w) g[k] = 1.f;
        if (k < per) ss += v[k] * v[k];
      }
      for (int o = G / 2; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
      const float inv = rsqrtf(ss / (float)D + op.eps);
#pragma unroll
      for (int k = 0; k < kMaxPer; ++k) {
        if (k >= per) continue;
        const float y = round_float(x.dtype, v[k] * inv);
        v[k] = round_float(op.pro_dtype, y * g[k]);  // g is 1 without a weight: y exactly
      }
    }
    int64_t oo = a.off[4] - (cache ? a.along * op.out.stride[op.dim] : 0);  // with a cache: at position 0
    if (r0 + sub >= rows || !rope_dest(op, cache, raw, oo)) continue;  // past the rows, or a position out of range
    // The partner's distance as a constant, so v stays in registers: at a
    // run-time index ptxas kept the row's values in local memory, stored
    // there once loaded and read back a pair at a time (SASS, forty-fourth
    // session).
    if (hp == kMaxPer / 2)
      rope_store_row<kMaxPer / 2, G>(base(s, op.out), dt, oo + lane, v, cv, sv);
    else
      rope_store_row<kMaxPer / 4, G>(base(s, op.out), dt, oo + lane, v, cv, sv);
  }
}

// Out of line, like the other RoPE paths: the plain rotation stays a small
// body with few registers (a task runs its code cold, once per layer).
template <int N>
__device__ __noinline__ void rope_normed(const Op& op, int lo, int hi, const Slots<N>& s) {
  const View &x = op.in[0], &c = op.in[1], &sn = op.in[2], &w = op.in[op.pro_first];
  const int r = op.out.rank - 1;
  const int64_t D = x.shape[r], h = D / 2;
  const bool has_w = op.flags & FLAG_WEIGHT;
  const bool fast = float_row(x) && float_row(c) && float_row(sn) && float_row(op.out) && (!has_w || float_row(w)) &&
                    D <= 128 && op.split_dim != r;
  if (fast && D == 128) {  // half a warp a row: a chunk's KV-head task of 64 rows on
                           // 16 warps runs 2 rounds of rows, not 4 (qwen3-8b's chunk
                           // 1-2% faster; bench/NOTES.md, forty-sixth session)
    rope_lane_rows<16, true>(op, lo, hi, s);
    return;
  }
  if (fast && h % 32 == 0) {
    rope_lane_rows<32, true>(op, lo, hi, s);
    return;
  }
  rope_normed_any(op, lo, hi, s);
}

// rope_normed_any: any layout or dtype, a thread per output element, the
// row's norm recomputed for each (slow, and only for what rope_normed's fast
// path rejects).
template <int N>
__device__ __noinline__ void rope_normed_any(const Op& op, int lo, int hi, const Slots<N>& s) {
  const View &x = op.in[0], &c = op.in[1], &sn = op.in[2], &w = op.in[op.pro_first];
  const int r = op.out.rank - 1;
  const int64_t D = x.shape[r], h = D / 2;
  const int32_t dt = op.out.dtype;
  const bool has_w = op.flags & FLAG_WEIGHT;
  const int64_t* shape = rope_shape(op);
  for_each_index(shape, op.out.rank, op.split_dim, lo, hi, [&](const int64_t* idx) {
    int64_t ridx[MPK_MAX_RANK];
    for (int k = 0; k <= r; ++k) ridx[k] = idx[k];
    float ss = 0.f;
    for (int64_t j = 0; j < D; ++j) {
      ridx[r] = j;
      const float a = (float)load_elem(base(s, x), x.dtype, offset_of(x, ridx));
      ss += a * a;
    }
    const float inv = rsqrtf(ss / (float)D + op.eps);
    auto normed = [&](int64_t j) {
      ridx[r] = j;
      double y = round_to(x.dtype, (double)((float)load_elem(base(s, x), x.dtype, offset_of(x, ridx)) * inv));
      if (has_w) y *= load_elem(base(s, w), w.dtype, offset_of(w, ridx));
      return round_to(op.pro_dtype, y);
    };
    const int64_t j = idx[r];
    const double xv = normed(j);
    double rot = normed(j < h ? j + h : j - h);
    if (j < h) rot = -rot;
    ridx[r] = j;
    const double cj = load_elem(base(s, c), c.dtype, offset_of(c, ridx));
    const double sj = load_elem(base(s, sn), sn.dtype, offset_of(sn, ridx));
    const int64_t o = rope_out(op, idx, s);
    if (o >= 0) store_elem(base(s, op.out), dt, o, round_to(dt, round_to(dt, xv * cj) + round_to(dt, round_to(dt, rot) * sj)));
  });
}

// rope_any: any layout or dtype, a thread per output element.
template <int N>
__device__ __noinline__ void rope_any(const Op& op, int lo, int hi, const Slots<N>& s) {
  const View& x = op.in[0];
  const int r = op.out.rank - 1;
  const int64_t h = x.shape[r] / 2;
  const int32_t dt = op.out.dtype;
  const int64_t* shape = rope_shape(op);
  for_each_index(shape, op.out.rank, op.split_dim, lo, hi, [&](const int64_t* idx) {
    int64_t pidx[MPK_MAX_RANK];
    for (int k = 0; k <= r; ++k) pidx[k] = idx[k];
    const int64_t j = idx[r];
    pidx[r] = j < h ? j + h : j - h;
    double xv = load_elem(base(s, x), x.dtype, offset_of(x, idx));
    double rot = load_elem(base(s, x), x.dtype, offset_of(x, pidx));
    if (j < h) rot = -rot;
    double c = load_elem(base(s, op.in[1]), op.in[1].dtype, offset_of(op.in[1], idx));
    double sn = load_elem(base(s, op.in[2]), op.in[2].dtype, offset_of(op.in[2], idx));
    double v = round_to(dt, round_to(dt, xv * c) + round_to(dt, round_to(dt, rot) * sn));
    const int64_t o = rope_out(op, idx, s);
    if (o >= 0) store_elem(base(s, op.out), dt, o, v);
  });
}

// rope_rows is rope over rows of floats (no tile cut along the last dim);
// ix reads the cache positions (NoIndex: no cache).
template <typename IX, int N>
__device__ __forceinline__ void rope_rows(const Op& op, int lo, int hi, const Slots<N>& s, IX ix) {
  const View& x = op.in[0];
  const int r = op.out.rank - 1;
  const int64_t h = x.shape[r] / 2;
  const int32_t dt = op.out.dtype;
  const int64_t* shape = rope_shape(op);
  // A thread takes the pair (j, j+h) of a row: six loads issued together.
  const View &c = op.in[1], &sn = op.in[2];
  const int64_t rows = rows_of(shape, op.out.rank, op.split_dim, lo, hi), total = rows * h;
  const bool cache = op.flags & FLAG_CACHE;
  const View& pv = op.in[op.num_in - 1];  // the cache positions (with FLAG_CACHE)
  for (int64_t t0 = threadIdx.x; t0 < total; t0 += (int64_t)kBatch * MPK_THREADS) {
    // kBatch pairs' six loads and cache positions issued (clamped, not
    // branched), then rotated and stored. (Rotating only after every load of
    // the batch was no faster on the H100: bench/NOTES.md, thirty-sixth
    // session.)
    float2 r[kBatch];
    float v[kBatch][6];               // x1, x2, c1, c2, s1, s2
    int64_t raw[kBatch], at[kBatch];  // at: the pair's offset (in the cache: at position 0)
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      int64_t row, j;
      divmod(min(t0 + (int64_t)b * MPK_THREADS, total - 1), h, row, j);
      // views: x, cos, sin, out, the positions
      const RowAt<5> a = row_offsets({&x, &c, &sn, &op.out, cache ? &pv : &op.out}, {0, 0, 0, 0, cache ? op.dim : 0},
                                     row, shape, op.out.rank, op.split_dim, lo, hi, cache ? op.dim : -1);
      const int64_t xo = a.off[0] + j, co = a.off[1] + j, so = a.off[2] + j;
      v[b][0] = ld_float(base(s, x), x.dtype, xo), v[b][1] = ld_float(base(s, x), x.dtype, xo + h);
      v[b][2] = ld_float(base(s, c), c.dtype, co), v[b][3] = ld_float(base(s, c), c.dtype, co + h);
      v[b][4] = ld_float(base(s, sn), sn.dtype, so), v[b][5] = ld_float(base(s, sn), sn.dtype, so + h);
      r[b] = rotate_pair(v[b][0], v[b][1], v[b][2], v[b][4], v[b][3], v[b][5], dt);
      raw[b] = cache ? ix(a.off[4]) : 0;
      at[b] = a.off[3] - (cache ? a.along * op.out.stride[op.dim] : 0) + j;
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      if (t0 + (int64_t)b * MPK_THREADS >= total) break;
      int64_t oo = at[b];
      if (!rope_dest(op, cache, raw[b], oo)) continue;
      st_float(base(s, op.out), dt, oo, r[b].x);
      st_float(base(s, op.out), dt, oo + h, r[b].y);
    }
  }
}

// rope: out = x·cos + rotate_half(x)·sin along the last dim, rounding each
// product to the output dtype as eager does.
template <int N>
__device__ void rope(const Op& op, int lo, int hi, const Slots<N>& s, char*) {
  if (op.pro_first > 0) {
    rope_normed(op, lo, hi, s);
    return;
  }
  const View& x = op.in[0];
  const int r = op.out.rank - 1;
  if (float_row(x) && float_row(op.in[1]) && float_row(op.in[2]) && float_row(op.out) && op.split_dim != r) {
    // Rows that one pass of the warps covers (a decode step's) take a row's
    // lanes at once; more rows (a prompt chunk's) go through rope_rows, whose
    // threads keep kBatch pairs' loads in flight across rows.
    const int64_t D = x.shape[r], rows = rows_of(rope_shape(op), op.out.rank, op.split_dim, lo, hi);
    if (D == 128 && rows <= MPK_THREADS / 16) {
      rope_lane_rows<16, false>(op, lo, hi, s);
    } else if (D == 64 && rows <= MPK_THREADS / 32) {
      rope_lane_rows<32, false>(op, lo, hi, s);
    } else if (!(op.flags & FLAG_CACHE)) {
      rope_rows(op, lo, hi, s, NoIndex{});
    } else {
      const View& pv = op.in[op.num_in - 1];  // the cache positions
      with_index(base(s, pv), pv, [&](auto ix) { rope_rows(op, lo, hi, s, ix); });
    }
    return;
  }
  rope_any(op, lo, hi, s);
}

// block_sum reduces a float across the block (all threads get the result).
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  consumer_sync();
  if (lane == 0) scratch[warp] = v;
  consumer_sync();
  v = lane < (int)(MPK_THREADS / 32) ? scratch[lane] : 0.f;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// rmsnorm follows HF: y = x·rsqrt(mean(x²)+eps) in fp32, rounded to x's
// dtype, then times the weight. One warp per row: a decode step's per-head
// norms (Qwen3's q/k norm) are many short rows.
template <int N>
__device__ void rmsnorm(const Op& op, int lo, int hi, const Slots<N>& s, char*) {
  const View& x = op.in[0];
  const int r = x.rank - 1;
  const int64_t D = x.shape[r];
  const bool has_w = op.flags & FLAG_WEIGHT;
  int64_t rows = 1;
  int64_t ext[MPK_MAX_RANK];
  for (int d = 0; d < r; ++d) {
    ext[d] = d == op.split_dim ? (int64_t)(hi - lo) : x.shape[d];
    rows *= ext[d];
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = MPK_THREADS / 32;
  constexpr int kMaxPer = 8;  // fast path: rows of up to 256 elements held in registers
  if (float_row(x) && out_row(op.out) && (!has_w || float_row(op.in[1])) && D % 32 == 0 && D <= 32 * kMaxPer &&
      (r == 0 || op.split_dim != r)) {
    const int per = (int)(D / 32);
    const View& wv = has_w ? op.in[1] : x;
    for (int64_t row = warp; row < rows; row += warps) {
      const RowAt<3> a = row_offsets({&x, &op.out, &wv}, {0, 0, 0}, row, x.shape, x.rank, r > 0 ? op.split_dim : -1, lo, hi);
      const int64_t xo = a.off[0], oo = a.off[1], wo = a.off[2];
      float v[kMaxPer], w[kMaxPer];
      float ss = 0.f;
      // Loads unconditional (k past per reloads the last), then the sum: a
      // condition around load and use would serialise the loads.
#pragma unroll
      for (int k = 0; k < kMaxPer; ++k) {
        const int64_t j = min(k, per - 1) * 32 + lane;
        v[k] = ld_float(base(s, x), x.dtype, xo + j);
        w[k] = ld_float(base(s, wv), wv.dtype, wo + j);
      }
#pragma unroll
      for (int k = 0; k < kMaxPer; ++k) {
        if (!has_w) w[k] = 1.f;
        if (k < per) ss += v[k] * v[k];
      }
      for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
      const float inv = rsqrtf(ss / (float)D + op.eps);
#pragma unroll
      for (int k = 0; k < kMaxPer; ++k) {
        if (k < per) {
          const float y = round_float(x.dtype, v[k] * inv);
          st_float(base(s, op.out), op.out.dtype, oo + k * 32 + lane, y * w[k]);  // w is 1 without a weight
        }
      }
    }
    return;
  }
  // Longer rows (a prompt chunk's norm ahead of a GEMM stream, a row a
  // task): the block takes a row at a time, 4 elements a thread a load, all
  // held in registers across one block reduction, rounding as the path
  // above. Element by element a warp a row, 64 rows of 2,048 took 135 us a
  // task; a warp a row with 4-element loads in two passes, 20 us.
  constexpr int kQ = 4;  // 4-element loads a thread: rows of up to 4·kQ·MPK_THREADS
  auto aligned4 = [&](const View& v) {
    const int64_t esz = v.dtype == DT_FLOAT32 ? 4 : 2;
    bool ok = v.stride[r] == 1 && (reinterpret_cast<uintptr_t>(base(s, v)) + v.offset * esz) % (4 * esz) == 0;
    for (int d = 0; d < r; ++d) ok = ok && v.stride[d] % 4 == 0;
    return ok;
  };
  if (float_row(x) && out_row(op.out) && (!has_w || float_row(op.in[1])) && D % 4 == 0 && D <= 4 * kQ * MPK_THREADS &&
      aligned4(x) && (!has_w || aligned4(op.in[1])) && (r == 0 || op.split_dim != r)) {
    const View& w = has_w ? op.in[1] : x;
    __shared__ float scratch[32];
    for (int64_t row = 0; row < rows; ++row) {
      const RowAt<3> a = row_offsets({&x, &op.out, &w}, {0, 0, 0}, row, x.shape, x.rank, r > 0 ? op.split_dim : -1, lo, hi);
      const int64_t xo = a.off[0], oo = a.off[1], wo = a.off[2];
      float4 f[kQ], g[kQ];
      float ss = 0.f;
      // Loads clamped to the row's last 4 elements (no branch between them), then the sum.
#pragma unroll
      for (int i = 0; i < kQ; ++i) {
        const int64_t j = min(4 * ((int64_t)threadIdx.x + i * MPK_THREADS), D - 4);
        f[i] = ld_float4(base(s, x), x.dtype, xo + j);
        g[i] = ld_float4(base(s, w), w.dtype, wo + j);
      }
#pragma unroll
      for (int i = 0; i < kQ; ++i)
        if (4 * ((int64_t)threadIdx.x + i * MPK_THREADS) < D)
          ss += f[i].x * f[i].x + f[i].y * f[i].y + f[i].z * f[i].z + f[i].w * f[i].w;
      const float inv = rsqrtf(block_sum(ss, scratch) / (float)D + op.eps);
#pragma unroll
      for (int i = 0; i < kQ; ++i) {
        const int64_t j = 4 * ((int64_t)threadIdx.x + i * MPK_THREADS);
        if (j >= D) continue;
        const float v[4] = {f[i].x, f[i].y, f[i].z, f[i].w}, gv[4] = {g[i].x, g[i].y, g[i].z, g[i].w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float y = round_float(x.dtype, v[e] * inv);
          st_float(base(s, op.out), op.out.dtype, oo + j + e, has_w ? y * gv[e] : y);
        }
      }
    }
    return;
  }
  for (int64_t row = warp; row < rows; row += warps) {
    int64_t idx[MPK_MAX_RANK];
    int64_t rem = row;
    for (int d = r - 1; d >= 0; --d) {
      idx[d] = rem % ext[d];
      rem /= ext[d];
    }
    if (r > 0) idx[op.split_dim] += lo;
    float ss = 0.f;
    for (int64_t j = lane; j < D; j += 32) {
      idx[r] = j;
      const float v = (float)load_elem(base(s, x), x.dtype, offset_of(x, idx));
      ss += v * v;
    }
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float inv = rsqrtf(ss / (float)D + op.eps);
    for (int64_t j = lane; j < D; j += 32) {
      idx[r] = j;
      double y = round_to(x.dtype, (double)((float)load_elem(base(s, x), x.dtype, offset_of(x, idx)) * inv));
      if (has_w) y *= load_elem(base(s, op.in[1]), op.in[1].dtype, offset_of(op.in[1], idx));
      store_elem(base(s, op.out), op.out.dtype, offset_of(op.out, idx), y);
    }
  }
}

// matmul: out[b, m, n] = Σ_k a[b, m, k]·w[b, k, n], one element per thread.
template <int N>
__device__ void matmul(const Op& op, int lo, int hi, const Slots<N>& s, char*) {
  const View& a = op.in[0];
  const View& m = op.in[1];
  const int64_t K = a.shape[2];
  for_each_index(op.out.shape, op.out.rank, op.split_dim, lo, hi, [&](const int64_t* idx) {
    float acc = 0.f;
    for (int64_t k = 0; k < K; ++k) {
      int64_t ai[3] = {idx[0], idx[1], k}, mi[3] = {idx[0], k, idx[2]};
      acc += (float)load_elem(base(s, a), a.dtype, offset_of(a, ai)) * (float)load_elem(base(s, m), m.dtype, offset_of(m, mi));
    }
    store_elem(base(s, op.out), op.out.dtype, offset_of(op.out, idx), acc);
  });
}

}  // namespace mpk
