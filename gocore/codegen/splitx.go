package codegen

import (
	"mpk/gocore/ir"
	"mpk/gocore/stream"
)

// A wgmma GEMM stream split each fp32 x into bf16 hi + lo in registers, a
// k16 step at a time, in every warpgroup that multiplied it: those loads and
// splits, not the weights' stream, bounded a qwen3-8b chunk's pair block
// (2.9 us with the weights in L2; 2.15 with x as planes that wgmma reads
// from shared memory: bench/gemm_task.cu -DWGMMA=6, forty-seventh session).
// So with Options.SplitGemmX the op that writes such an x stores each
// element v as hi = bf16(v) and lo = bf16(v - hi), the split the GEMM made,
// and the GEMM stages a block of both planes with tensor-map copies as
// wgmma's B operand (mpk::linear_wgmma's XS). The buffer keeps its fp32
// bytes: each group of 64 elements holds their 64 hi values, then their 64
// lo values (mpk::split_at), so every element's bytes stay inside its
// group's, a row of K elements inside the row's 4K bytes, and the validator's
// byte ranges, the arena's placement and the tasks' boxes all hold as for
// fp32.

// dtSplit is the device DType code of a split buffer's views (DT_SPLIT_BF16).
const dtSplit = int(ir.Bool) + 1

// splitGroup is a split buffer's group of elements: a row of the GEMM's
// 128-byte swizzled operand, each plane's half.
const splitGroup = 64

// splitX returns the temporaries stored split: fp32 buffers of 64-element
// groups read only as the x of wgmma GEMM streams (rows of whole groups, at
// most 64 of them) and written only by ops whose task bodies store through
// the element helpers that know the layout (mpk::st_float, store_elem):
// RMSNorm, the attention merge, and GEMM streams' epilogues.
func (gen *generator) splitX() map[*ir.Buffer]bool {
	split := map[*ir.Buffer]bool{}
	bad := map[*ir.Buffer]bool{}
	for _, op := range gen.g.Ops {
		p, streamed := gen.plans[op]
		for i, v := range op.In {
			if i == 0 && streamed && p.Wgmma && op.Attr.Pro == nil && splitXView(v, gen.l.offset[v.Buf]) && v.Buf.Kind == ir.Temp {
				split[v.Buf] = true
			} else {
				bad[v.Buf] = true
			}
		}
		o := op.Out.Buf
		switch {
		case op.Kind == ir.RMSNorm || op.Kind == ir.AttnMerge:
		case op.Kind == ir.Linear && streamed && p.Gemm:
		default:
			bad[o] = true
		}
	}
	for b := range split {
		if bad[b] || b.DType != ir.F32 || b.Numel%splitGroup != 0 || gen.l.offset[b]%splitGroup != 0 {
			delete(split, b)
		}
	}
	return split
}

// splitXView says whether a GEMM stream's x view is rows of whole groups
// (from element off of its slot): each row a box of the x's tensor map.
func splitXView(v ir.View, bufOffset int64) bool {
	return v.Rank() == 2 && v.Strides[1] == 1 && v.Strides[0]%splitGroup == 0 && v.Shape[1]%stream.GemmCols == 0 &&
		(bufOffset+v.Offset)%splitGroup == 0 && v.Shape[0] >= 1 && v.Shape[0] <= stream.GemmMaxRows
}

// splitXBoxRows is the rows of a split x's box, the fewest of 8, 16, 32 and
// 64 that hold x's rows (a decode batch's few, a chunk's 32 or 64): the
// wgmma's N is twice them (each row's hi and lo), mpk::split_box_rows.
func splitXBoxRows(rows int64) int64 {
	r := int64(8)
	for r < rows && r < stream.GemmMaxRows {
		r *= 2
	}
	return r
}

// splitXMap is the tensor map of a split GEMM x: its rows' groups, both
// planes of one a box of splitXBoxRows rows (mpk::encode_split_x_map).
func (gen *generator) splitXMap(v ir.View) tmapSpec {
	return tmapSpec{Slot: gen.l.slot[v.Buf], Offset: (gen.l.offset[v.Buf] + v.Offset) * 4, Cols: v.Shape[1] / splitGroup,
		Rows: v.Shape[0], RowBytes: v.Strides[0] * 4, BoxRows: splitXBoxRows(v.Shape[0]), Swizzle: stream.WgmmaRowBytes,
		SplitX: 1}
}
