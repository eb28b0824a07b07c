package codegen

import (
	"testing"

	"mpk/gocore/ir"
	"mpk/gocore/stream"
)

// TestTmapOf: a GEMM or tile stream's pages are boxes of a tensor map of the
// whole weight (8-byte units, rows row stride apart; a GEMM page's box lands
// in column blocks of 8 units), one map per weight view; a weight whose
// bytes a map cannot describe (a start off 16 bytes, rows not 16 bytes
// apart, a page wider than a box) keeps row copies.
func TestTmapOf(t *testing.T) {
	g := &ir.Graph{}
	w := g.NewBuffer("w", ir.Input, ir.BF16, 8192*2048)
	gen := &generator{l: layout{slot: map[*ir.Buffer]int{w: 5}, offset: map[*ir.Buffer]int64{w: 0}}}
	view := func(off, n, k, stride int64) ir.View {
		return ir.View{Buf: w, Offset: off, Shape: []int64{n, k}, Strides: []int64{stride, 1}}
	}
	gemm := stream.Plan{K: 2048, ElemBytes: 2, Cols: 256, RowStride: 2048, Gemm: true}
	s, ok := gen.tmapOf(gemm, view(0, 8192, 2048, 2048), stream.GemmPageRows)
	want := tmapSpec{Slot: 5, Offset: 0, Cols: 512, Rows: 8192, RowBytes: 4096, BoxCols: 64, BoxRows: 32, BlockCols: 8}
	if !ok || s != want {
		t.Fatalf("GEMM weight: %+v %v, want %+v", s, ok, want)
	}
	// A wgmma stream's pages: 64 rows × 128 columns, column blocks of 128
	// bytes swizzled over their rows (mpk::wg_page_desc).
	wg := stream.Plan{K: 2048, ElemBytes: 2, Cols: stream.WgmmaCols, RowStride: 2048, Gemm: true, Wgmma: true}
	s, ok = gen.tmapOf(wg, view(0, 8192, 2048, 2048), stream.WgmmaPageRows)
	if want := (tmapSpec{Slot: 5, Offset: 0, Cols: 512, Rows: 8192, RowBytes: 4096, BoxCols: 32, BoxRows: 64, BlockCols: 16,
		Swizzle: 128}); !ok || s != want {
		t.Fatalf("wgmma weight: %+v %v, want %+v", s, ok, want)
	}
	// A K-split part: columns [512, 1024) of the rows, its own map from its first column.
	part := stream.Plan{K: 512, ElemBytes: 2, Cols: 256, RowStride: 2048, Gemm: true}
	s, ok = gen.tmapOf(part, view(512, 8192, 512, 2048), stream.GemmPageRows)
	if want := (tmapSpec{Slot: 5, Offset: 1024, Cols: 128, Rows: 8192, RowBytes: 4096, BoxCols: 64, BoxRows: 32, BlockCols: 8}); !ok || s != want {
		t.Fatalf("K part: %+v %v, want %+v", s, ok, want)
	}
	// Tile pages: 8 rows of 1,024 columns, 256 units a box.
	tiles := stream.Plan{K: 2048, ElemBytes: 2, Cols: 1024, RowStride: 2048, Tiles: true}
	if s, ok = gen.tmapOf(tiles, view(0, 8192, 2048, 2048), stream.TileRows); !ok || s.BoxCols != 256 || s.BoxRows != 8 || s.BlockCols != 0 {
		t.Fatalf("tile pages: %+v %v", s, ok)
	}
	for name, c := range map[string]struct {
		p stream.Plan
		v ir.View
	}{
		"start off 16 bytes":      {part, view(4, 8192, 512, 2048)},
		"rows not 16 bytes apart": {stream.Plan{K: 2048, ElemBytes: 2, Cols: 256, RowStride: 2052, Gemm: true}, view(0, 4000, 2048, 2052)},
		"a page wider than a box": {stream.Plan{K: 4096, ElemBytes: 2, Cols: 2048, RowStride: 4096, Tiles: true}, view(0, 4096, 4096, 4096)},
		"columns not contiguous":  {gemm, ir.View{Buf: w, Shape: []int64{2048, 8192}, Strides: []int64{1, 2048}}},
	} {
		if s, ok := gen.tmapOf(c.p, c.v, stream.GemmPageRows); ok {
			t.Errorf("%s: got tensor map %+v", name, s)
		}
	}
	// One map a weight view, shared by its tasks.
	a, b := gen.tmap(want), gen.tmap(want)
	if a != b || len(gen.tmaps) != 1 {
		t.Fatalf("tmap: ids %d and %d, %d maps", a, b, len(gen.tmaps))
	}
}
