// Generated from gocore/codegen/abi.go by TestABIHeaderUpToDate (UPDATE_GOLDEN=1). Do not edit.
#pragma once
#include <stdint.h>

#define MPK_MAX_RANK 6
#define MPK_MAX_INPUTS 12
#define MPK_MAX_EPI_INPUTS 2
#define MPK_THREADS 512
#define MPK_MAX_SHARED_BYTES 204800
#define MPK_MASK_HIDE_MARGIN 10000.0f

namespace mpk {

enum DType : int32_t { DT_FLOAT32 = 0, DT_BFLOAT16 = 1, DT_FLOAT16 = 2, DT_FLOAT64 = 3, DT_INT64 = 4, DT_INT32 = 5, DT_INT16 = 6, DT_INT8 = 7, DT_UINT8 = 8, DT_BOOL = 9, DT_SPLIT_BF16 = 10, };

enum OpKind : int32_t { OP_ELEMENTWISE = 0, OP_REDUCE = 1, OP_RMSNORM = 2, OP_ROPE = 3, OP_LINEAR = 4, OP_MATMUL = 5, OP_ATTENTION = 6, OP_EMBEDDING = 7, OP_CAT = 8, OP_KV_WRITE = 9, OP_COPY = 10, OP_GATHER = 11, OP_ATTN_MERGE = 12, OP_EMPTY = 13, OP_MASK_EXTENT = 14, };

enum ReduceKind : int32_t { RED_SUM = 0, RED_MEAN = 1, RED_AMAX = 2, RED_AMIN = 3, RED_ARGMAX = 4, };

enum OpFlags : int32_t { FLAG_RESIDUAL = 1, FLAG_WEIGHT = 2, FLAG_MASK = 4, FLAG_CAUSAL = 8, FLAG_CACHE = 16, FLAG_EXTENT = 32 };

struct View {
  int32_t slot;  // pointer slot: input, output or the arena
  int32_t dtype;  // DType code
  int32_t rank;
  int32_t tmap;  // a GEMM stream's split x (DT_SPLIT_BF16): 1 + its tensor map's index in kTmaps; 0: none
  int64_t offset;  // in elements from the slot's base
  int64_t shape[MPK_MAX_RANK];
  int64_t stride[MPK_MAX_RANK];  // in elements
};

struct Op {
  int32_t kind;  // OpKind
  int32_t variant;  // index into the generated dispatch
  int32_t num_in;
  int32_t split_dim;  // the output dim tasks split; tasks carry [lo, hi)
  int32_t dim;  // cat / gather / kv_write dim
  int32_t groups;  // attention: query heads per KV head
  int32_t flags;  // OpFlags
  int32_t reduce;  // ReduceKind
  int32_t pro_first;  // linear prologue: its inputs are in[0] and in[pro_first..epi_first or num_in)
  int32_t pro_dtype;  // linear prologue: the dtype x rounds to
  int32_t epi_first;  // linear epilogue: its inputs besides the product are in[epi_first..num_in)
  int32_t epi_dtype;  // linear epilogue: the dtype the product rounds to before it
  int32_t xkey;  // streamed linear: ops with one key stage the same x; -1 otherwise
  float eps;  // rmsnorm, or a linear's rmsnorm prologue
  float scale;
  mpk::View out;
  mpk::View in[MPK_MAX_INPUTS];
};

struct Task {
  int32_t op;  // -1 for an empty relay task
  int32_t lo;  // tile along the op's split dim
  int32_t hi;
  int32_t wait;  // event, or -1
  int32_t trigger;  // event, or -1
};

struct Stream {
  int32_t slot;  // the weight's pointer slot
  int32_t page_bytes;  // a page: whole rows, or a fraction of a row; tile pages: one row's segment
  int64_t offset;  // bytes from the slot's base to the task's first row
  int64_t bytes;  // the task's weights; 0: the task streams nothing
  int32_t tile_rows;  // 0: pages of contiguous bytes; else tile pages of this many rows' segments
  int32_t row_span;  // tile pages: bytes of each row the task reads (K of them), row_bytes apart
  int64_t row_bytes;  // tile pages: bytes from one weight row to the next; kv_j0 >= 0 or a kv chunk's tmap: a K (or V) row's bytes
  int32_t block_bytes;  // gemm pages: bytes of a row a column block holds (each block's row groups, block after block); 0: tile pages (each row group's blocks)
  int32_t pair_slot;  // a paired linear's second weight: its pointer slot; -1: none
  int64_t pair_offset;  // bytes from that slot's base to the task's first row (bytes of them, after the first weight's; gemm: a block's after its)
  int32_t kv_j0;  // a kv_pages chunk cut to the live length (runtime.cuh s_kv_extent): its first position; -1: whole
  int32_t kv_interleave;  // a kv_pages chunk whose task takes its pages round by round (mpk::KVPages STREAM): K and V pages alternate; 0: the K rows' pages, then the V rows'
  int32_t tmap;  // tile pages (or a kv chunk's K pages, 128-byte swizzled: codegen's kvStream.Swizzle): the tensor map (kTmaps, State.tmaps) one copy of whose box fills a page; -1: row copies
  int32_t pair_tmap;  // the same for the paired linear's second weight (a kv chunk's V)
  int32_t tmap_row;  // the task's first row in its tensor maps
  int32_t x_parts;  // tile pages: the parts of K the task stages x in (mpk::linear_tiles XP): its pages part by part, each part's row groups in order; 1: x whole
};

struct TmapSpec {
  int32_t slot;  // the weight's pointer slot
  int32_t box_rows;  // rows a box (a page) holds
  int64_t offset;  // bytes from the slot's base to the matrix's first row
  int64_t cols;  // 8-byte units of a row
  int64_t rows;
  int64_t row_bytes;  // bytes from one row to the next (a multiple of 16)
  int32_t box_cols;  // 8-byte units of a row a box holds (at most 256)
  int32_t block_cols;  // GEMM pages: 8-byte units of a column block (the box lands block after block); 0: row after row
  int32_t swizzle;  // bytes a block's rows are swizzled over as wgmma reads them (128: a wgmma stream's pages); 0: none
  int32_t split_x;  // 1: a split GEMM x (cols: its rows' 64-element groups; a box both planes of one group), not weights
};

}  // namespace mpk
