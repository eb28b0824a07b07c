package decompose

import (
	"testing"

	"mpk/gocore/ir"
	"mpk/gocore/stream"
	"mpk/gocore/tgraph"
)

// TestEstimateTimes: a GEMM stream's tasks take their weight rows' bytes at
// the stream rate (a pair's both weights) and are the ones a timed schedule
// places (Timed); a decode stream's and every other task keep round-robin
// workers, timed by their kind; a relay is cheap.
func TestEstimateTimes(t *testing.T) {
	view := func(name string, dt ir.DType, rows, cols int64) ir.View {
		return ir.View{Buf: &ir.Buffer{Name: name, DType: dt, Numel: rows * cols}, Shape: sh(rows, cols), Strides: sh(cols, 1)}
	}
	x, w, y := view("x", ir.F32, 64, 4096), view("w", ir.BF16, 128, 4096), view("y", ir.F32, 64, 128)
	gemm := &ir.Op{Kind: ir.Linear, In: []ir.View{x, w}, Out: y}
	gemm.Attr.Gemm = true
	pair := &ir.Op{Kind: ir.Linear, In: []ir.View{x, w, view("u", ir.BF16, 128, 4096)}, Out: y}
	pair.Attr.Gemm = true
	pair.Attr.Epi = &ir.Epilogue{First: 2, DType: ir.F32, Pair: 1, PairDType: ir.F32, Expr: ir.Load(0)}
	decode := &ir.Op{Kind: ir.Linear, In: []ir.View{view("x1", ir.F32, 1, 4096), w}, Out: view("y1", ir.F32, 1, 128)}
	norm := &ir.Op{Kind: ir.RMSNorm, In: []ir.View{x}, Out: view("n", ir.F32, 64, 4096)}
	g := &ir.Graph{Ops: []*ir.Op{gemm, pair, decode, norm}}
	tg := &tgraph.Graph{Tasks: []*tgraph.Task{
		{Op: 0, Box: box(sh(0, 0), sh(64, 64))}, {Op: 1, Box: box(sh(0, 64), sh(64, 128))},
		{Op: 2, Box: box(sh(0, 0), sh(1, 64))}, {Op: 3, Box: box(sh(0, 0), sh(1, 4096))}, {Op: -1},
	}}
	EstimateTimes(g, tg)
	rows := int64(64 * 4096 * 2) // 64 weight rows of K 4,096 in bf16
	want := []struct {
		ns    int64
		timed bool
	}{
		{stream.TaskNs(rows, true, false, 64), true},
		{stream.TaskNs(2*rows, true, true, 64), true},
		{stream.TaskNs(rows, false, false, 1), false},
		{otherNs, false},
		{relayNs, false},
	}
	for i, tk := range tg.Tasks {
		if tk.Time != want[i].ns || tk.Timed != want[i].timed {
			t.Errorf("task %d: time %d ns, timed %v; want %d, %v", i, tk.Time, tk.Timed, want[i].ns, want[i].timed)
		}
	}
	if a, b := tg.Tasks[0].Time, tg.Tasks[1].Time; !(b > a && b < 2*a) {
		t.Errorf("a pair's task %d ns against one weight's %d: want more, but less than twice (its rate is higher)", b, a)
	}
}
