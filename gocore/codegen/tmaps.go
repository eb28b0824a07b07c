package codegen

import (
	"fmt"
	"strings"

	"mpk/gocore/ir"
	"mpk/gocore/stream"
)

// A tile or GEMM stream's page is a box of a 2-D weight matrix (rows of
// page_bytes, tile_rows of them). Filled by one bulk copy a row, a page took
// 32 copies of 512 bytes, and one CTA's loader could not issue them fast
// enough: the GEMM pages streamed at 0.41 of the copy rate, one 2-D
// tensor-map copy a page at 0.88-0.96 (bench/gemm_pages.cu, thirty-first
// session). So each such matrix gets a tensor map (mpk_launch encodes it from
// the slot pointer) and the loader fills a page with one copy of its box.

// tmapUnit is the element the maps describe: 8 bytes, so a tile page's
// 2,048-byte row segments fit a box's 256-element limit; every streamed
// row's bytes are a multiple of it (K is a multiple of the page's columns).
const tmapUnit = 8

// tmapMaxBox is the most elements a tensor-map box takes along a dim.
const tmapMaxBox = 256

// A GEMM page lands column block after column block (BlockCols units each:
// its rows' first 64 bytes, then their next, ...), where a page of whole
// rows (512 bytes apart) put the two rows of an mma's load phase in the same
// banks: every 16-byte load of a page's weights was 2-way bank-conflicted
// (mpk::gemm_page_at). mpk_launch then encodes a 3-D map (units of a block,
// rows, blocks), whose box is the whole page.

// tmapSpec describes one tensor map: a weight matrix (rows of RowBytes,
// Cols units each, from Offset bytes into Slot) cut into boxes of BoxRows
// rows × BoxCols units, landing row after row, or column block after column
// block of BlockCols units (BlockCols > 0: a GEMM page).
type tmapSpec struct {
	Slot             int
	Offset           int64
	Cols, Rows       int64
	RowBytes         int64
	BoxCols, BoxRows int64
	BlockCols        int64
	Swizzle          int64 // bytes a block's rows are swizzled over (a wgmma stream's page: mpk::wg_page_desc), 0 none
	SplitX           int64 // 1: a split GEMM x (splitXMap; Cols its rows' 64-element groups), not weights
}

// tmapOf returns the tensor map whose boxes are the pages of stream plan p
// over weight w, or false where the bytes do not allow one (the loader then
// copies a page row by row).
func (gen *generator) tmapOf(p stream.Plan, w ir.View, pageRows int64) (tmapSpec, bool) {
	if w.Rank() != 2 || w.Strides[1] != 1 {
		return tmapSpec{}, false
	}
	s := tmapSpec{Slot: gen.l.slot[w.Buf], Offset: (gen.l.offset[w.Buf] + w.Offset) * p.ElemBytes,
		Cols: p.K * p.ElemBytes / tmapUnit, Rows: w.Shape[0], RowBytes: p.RowStride * p.ElemBytes,
		BoxCols: p.Cols * p.ElemBytes / tmapUnit, BoxRows: pageRows}
	if p.Gemm {
		s.BlockCols = p.BlockBytes() / tmapUnit
	}
	if p.Wgmma {
		s.Swizzle = stream.WgmmaRowBytes
	}
	ok := s.Offset%16 == 0 && s.RowBytes%16 == 0 && (p.K*p.ElemBytes)%tmapUnit == 0 && (p.Cols*p.ElemBytes)%16 == 0 &&
		s.BoxCols >= 1 && s.BoxCols <= tmapMaxBox && s.BoxRows <= tmapMaxBox && s.Rows >= 1 &&
		s.BoxCols*tmapUnit*s.BoxRows <= stream.PageBytes &&
		(s.BlockCols == 0 || s.Cols%s.BlockCols == 0 && s.BoxCols%s.BlockCols == 0)
	return s, ok
}

// tmap returns the index of spec in the module's table, adding it.
func (gen *generator) tmap(s tmapSpec) int {
	if id, ok := gen.tmapIDs[s]; ok {
		return id
	}
	if gen.tmapIDs == nil {
		gen.tmapIDs = map[tmapSpec]int{}
	}
	gen.tmapIDs[s] = len(gen.tmaps)
	gen.tmaps = append(gen.tmaps, s)
	return len(gen.tmaps) - 1
}

// writeTmaps emits the tensor-map table mpk_launch encodes (host side).
func (gen *generator) writeTmaps(src *strings.Builder) {
	fmt.Fprintf(src, "constexpr int kNumTmaps = %d;\n", len(gen.tmaps))
	fmt.Fprintf(src, "static const mpk::TmapSpec kTmaps[%d] = {\n", max(1, len(gen.tmaps)))
	for _, s := range gen.tmaps {
		fmt.Fprintf(src, "  {%d, %d, %d, %d, %d, %d, %d, %d, %d, %d},\n", s.Slot, s.BoxRows, s.Offset, s.Cols, s.Rows, s.RowBytes,
			s.BoxCols, s.BlockCols, s.Swizzle, s.SplitX)
	}
	if len(gen.tmaps) == 0 {
		src.WriteString("  {0, 0, 0, 0, 0, 0, 0, 0, 0, 0},\n")
	}
	src.WriteString("};\n\n")
}
