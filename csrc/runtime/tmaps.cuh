// The tensor maps whose boxes are tile and GEMM pages (codegen's tmapOf):
// how a map is encoded from its TmapSpec, and where in it the loader finds a
// page. One definition for mpk_launch (runtime/module.cuh) and the GEMM task
// micro-benchmark (bench/gemm_task.cu), so the benchmark streams the pages
// the megakernel streams.
#pragma once
#include <cuda.h>  // CUtensorMap and the encoder's enums

#include "runtime/abi_gen.cuh"
#include "tasks/gemm.cuh"

namespace mpk {

constexpr int kTmapUnit = 8;                          // the maps' element: bytes (codegen's tmapUnit)
constexpr int kGemmBlockBytes = kGemmBlockCols * 2;  // a GEMM page's column block of a row

// encode_page_map writes into map the tensor map s describes over the matrix
// at base, with encode (the driver's cuTensorMapEncodeTiled): 2-D (a row's
// units, the rows), or, for a GEMM page (s.block_cols > 0) with blocks, 3-D
// (a column block's units, the rows, the blocks block_cols·8 bytes apart),
// so its box lands block after block (tasks/gemm.cuh's gemm_page_at); a
// block's rows swizzled over s.swizzle bytes (64 or 128: as wgmma reads a
// K-major operand, tasks/wgmma.cuh's wg_swizzled_desc; 0: not).
template <typename Encode>
inline CUresult encode_page_map(Encode encode, CUtensorMap* map, const TmapSpec& s, const void* base, bool blocks) {
  const int64_t unit = blocks ? s.block_cols : s.cols;
  const cuuint64_t dims[3] = {(cuuint64_t)unit, (cuuint64_t)s.rows, (cuuint64_t)(s.cols / unit)},
                   strides[2] = {(cuuint64_t)s.row_bytes, (cuuint64_t)(unit * kTmapUnit)};
  const cuuint32_t box[3] = {(cuuint32_t)(blocks ? s.block_cols : s.box_cols), (cuuint32_t)s.box_rows,
                             (cuuint32_t)(blocks ? s.box_cols / s.block_cols : 1)},
                   step[3] = {1, 1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT64, blocks ? 3 : 2, const_cast<void*>(base), dims, strides, box, step,
                CU_TENSOR_MAP_INTERLEAVE_NONE,
                blocks && s.swizzle == 128 ? CU_TENSOR_MAP_SWIZZLE_128B
                : blocks && s.swizzle == 64 ? CU_TENSOR_MAP_SWIZZLE_64B
                                            : CU_TENSOR_MAP_SWIZZLE_NONE,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

// encode_split_x_map writes the tensor map of a split GEMM x (codegen's
// splitXMap): 4-D, (a plane's 64 bf16 of a group, the two planes, the row's
// groups, the rows), whose box is one group of box_rows rows, both planes,
// 128-byte swizzled: it lands as 2·box_rows rows of 128 bytes, row m's hi
// then its lo, K-major as wgmma reads B (tasks/wgmma.cuh, linear_wgmma's
// XS). Rows past the x's are filled with zeros.
template <typename Encode>
inline CUresult encode_split_x_map(Encode encode, CUtensorMap* map, const TmapSpec& s, const void* base) {
  const cuuint64_t dims[4] = {(cuuint64_t)kSplitGroup, 2, (cuuint64_t)s.cols, (cuuint64_t)s.rows},
                   strides[3] = {kSplitGroup * 2, 2 * kSplitGroup * 2, (cuuint64_t)s.row_bytes};
  const cuuint32_t box[4] = {(cuuint32_t)kSplitGroup, 2, 1, (cuuint32_t)s.box_rows}, step[4] = {1, 1, 1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<void*>(base), dims, strides, box, step,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

// page_map_x is the box coordinate of a page that starts col bytes into its
// rows: in units, or, for a GEMM page's 3-D map, in column blocks of
// block_bytes (StreamDesc.block_bytes; 0: a 2-D map).
__host__ __device__ constexpr int page_map_x(int64_t col, int block_bytes) {
  return (int)(col / (block_bytes > 0 ? block_bytes : kTmapUnit));
}

}  // namespace mpk
