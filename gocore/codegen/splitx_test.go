package codegen

import (
	"testing"

	"mpk/gocore/ir"
	"mpk/gocore/stream"
)

// TestSplitX: a temporary is stored split only where every reader is a
// wgmma GEMM stream's x of whole 64-element groups and every writer stores
// through the helpers that know the layout; its tensor map describes each
// reader's view (a K slice from its first column).
func TestSplitX(t *testing.T) {
	g := &ir.Graph{}
	w := g.NewBuffer("w", ir.Input, ir.BF16, 256*1024)
	wv := ir.View{Buf: w, Shape: []int64{256, 1024}, Strides: []int64{1024, 1}}
	temp := func(name string) *ir.Buffer { return g.NewBuffer(name, ir.Temp, ir.F32, 64*1024) }
	rows := func(b *ir.Buffer, off, n, k int64) ir.View {
		return ir.View{Buf: b, Offset: off, Shape: []int64{n, k}, Strides: []int64{1024, 1}}
	}
	out := g.NewBuffer("o", ir.Temp, ir.F32, 64*256)
	ov := ir.View{Buf: out, Shape: []int64{64, 256}, Strides: []int64{256, 1}}
	normed, alsoAdded, madeByAdd, misaligned, sliced := temp("normed"), temp("also_added"), temp("made_by_add"), temp("misaligned"), temp("sliced")
	plans := map[*ir.Op]stream.Plan{}
	linear := func(x ir.View) *ir.Op {
		op := &ir.Op{Kind: ir.Linear, Label: "linear", In: []ir.View{x, wv}, Out: ov}
		plans[op] = stream.Plan{M: x.Shape[0], K: x.Shape[1], Gemm: true, Wgmma: true}
		return op
	}
	writer := func(kind ir.Kind, b *ir.Buffer) *ir.Op {
		return &ir.Op{Kind: kind, Label: kind.String(), In: []ir.View{rows(temp("in"), 0, 64, 1024)}, Out: rows(b, 0, 64, 1024)}
	}
	g.Ops = []*ir.Op{
		writer(ir.RMSNorm, normed), linear(rows(normed, 0, 64, 1024)),
		writer(ir.RMSNorm, alsoAdded), linear(rows(alsoAdded, 0, 64, 1024)),
		{Kind: ir.Elementwise, Label: "add", In: []ir.View{rows(alsoAdded, 0, 64, 1024)}, Out: rows(temp("sum"), 0, 64, 1024)},
		writer(ir.Elementwise, madeByAdd), linear(rows(madeByAdd, 0, 64, 1024)),
		writer(ir.AttnMerge, misaligned), linear(rows(misaligned, 32, 32, 512)),
		writer(ir.RMSNorm, sliced), linear(rows(sliced, 512, 33, 512)), linear(rows(sliced, 0, 33, 512)),
	}
	g.Renumber()
	l := layout{slot: map[*ir.Buffer]int{}, offset: map[*ir.Buffer]int64{}}
	for i, b := range g.Buffers {
		l.slot[b], l.offset[b] = 7, int64(i)*64*1024
	}
	gen := &generator{g: g, l: l, plans: plans}
	split := gen.splitX()
	for b, want := range map[*ir.Buffer]bool{normed: true, alsoAdded: false, madeByAdd: false, misaligned: false, sliced: true} {
		if split[b] != want {
			t.Errorf("%s: split %v, want %v", b.Name, split[b], want)
		}
	}
	// The second slice's map: from its first column, 33 rows in boxes of 64
	// (the rows past them zero), 8 groups a row, rows 4,096 bytes apart.
	got := gen.splitXMap(rows(sliced, 512, 33, 512))
	want := tmapSpec{Slot: 7, Offset: (l.offset[sliced] + 512) * 4, Cols: 8, Rows: 33, RowBytes: 4096, BoxRows: 64,
		Swizzle: 128, SplitX: 1}
	if got != want {
		t.Errorf("map %+v, want %+v", got, want)
	}
	for rows, want := range map[int64]int64{1: 8, 4: 8, 8: 8, 9: 16, 16: 16, 17: 32, 32: 32, 33: 64, 64: 64} {
		if r := splitXBoxRows(rows); r != want {
			t.Errorf("an x of %d rows: boxes of %d rows, want %d (wgmma's N %d)", rows, r, want, 2*want)
		}
	}
}
