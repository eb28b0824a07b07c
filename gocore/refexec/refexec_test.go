package refexec

import (
	"strings"
	"testing"
	"unsafe"

	"mpk/gocore/ir"
	"mpk/gocore/tgraph"
)

// doubling is out = 2·x over 4 elements, split into two tasks, and a third
// task (op 1: out[0] = out[0]+out[3]) that waits for both through event 0.
func doubling() (*ir.Graph, *tgraph.Graph) {
	g := &ir.Graph{}
	x := g.NewTemp("x", ir.F32, []int64{4})
	x.Buf.Kind = ir.Input
	g.Inputs = []*ir.Buffer{x.Buf}
	o := g.NewTemp("o", ir.F32, []int64{4})
	o.Buf.Kind = ir.Output
	g.Outputs = []ir.View{o}
	g.Ops = []*ir.Op{
		{ID: 0, Kind: ir.Elementwise, In: []ir.View{x}, Out: o, Attr: ir.Attrs{Expr: ir.Apply(ir.EMul, ir.Load(0), ir.Const(2))}},
		{ID: 1, Kind: ir.Elementwise, In: []ir.View{{Buf: o.Buf, Shape: []int64{1}, Strides: []int64{1}}, {Buf: o.Buf, Offset: 3, Shape: []int64{1}, Strides: []int64{1}}},
			Out: ir.View{Buf: o.Buf, Shape: []int64{1}, Strides: []int64{1}}, Attr: ir.Attrs{Expr: ir.Apply(ir.EAdd, ir.Load(0), ir.Load(1))}},
	}
	tg := &tgraph.Graph{Workers: 2,
		Tasks: []*tgraph.Task{
			{ID: 0, Op: 0, Box: tgraph.Box{Lo: []int64{0}, Hi: []int64{2}}, Wait: tgraph.None, Trigger: 0},
			{ID: 1, Op: 0, Box: tgraph.Box{Lo: []int64{2}, Hi: []int64{4}}, Wait: tgraph.None, Trigger: 0},
			{ID: 2, Op: 1, Box: tgraph.Box{Lo: []int64{0}, Hi: []int64{1}}, Wait: 0, Trigger: tgraph.None},
		},
		Events: []*tgraph.Event{{ID: 0, Needed: 2, First: 2, Last: 3}},
	}
	return g, tg
}

// pinned keeps test memory on the heap: a uintptr to a stack slice would go
// stale when the goroutine's stack grows and moves.
var pinned [][]float32

func heap(vals ...float32) []float32 {
	s := append([]float32(nil), vals...)
	pinned = append(pinned, s)
	return s
}

func TestRun(t *testing.T) {
	for seed := int64(0); seed < 20; seed++ {
		g, tg := doubling()
		x, o := heap(1, 2, 3, 4), heap(0, 0, 0, 0)
		n, err := Run(g, tg, []uintptr{uintptr(unsafe.Pointer(&x[0])), uintptr(unsafe.Pointer(&o[0]))}, seed)
		if err != nil || n != 3 {
			t.Fatalf("seed %d: ran %d tasks, err %v", seed, n, err)
		}
		if o[0] != 10 || o[1] != 4 || o[2] != 6 || o[3] != 8 {
			t.Fatalf("seed %d: out %v, want [10 4 6 8]", seed, o)
		}
	}
}

func TestRunErrors(t *testing.T) {
	x, o := heap(1, 2, 3, 4), heap(0, 0, 0, 0)
	ptrs := []uintptr{uintptr(unsafe.Pointer(&x[0])), uintptr(unsafe.Pointer(&o[0]))}

	g, tg := doubling()
	if _, err := Run(g, tg, ptrs[:1], 0); err == nil || !strings.Contains(err.Error(), "got 1 pointers, want 2 (1 inputs, 1 outputs)") {
		t.Errorf("short pointer list: err %v", err)
	}
	if _, err := Run(g, tg, []uintptr{ptrs[0], 0}, 0); err == nil || !strings.Contains(err.Error(), "buffer o has a null pointer") {
		t.Errorf("null output: err %v", err)
	}
	tg.Events[0].Needed = 3
	n, err := Run(g, tg, ptrs, 0)
	if err == nil || n != 2 || !strings.Contains(err.Error(), "deadlock: 1 of 3 tasks never became ready") {
		t.Errorf("unsatisfiable event: ran %d, err %v", n, err)
	}
	g, tg = doubling()
	g.Ops[0].Kind = ir.Kind(99)
	if _, err := Run(g, tg, ptrs, 0); err == nil || !strings.Contains(err.Error(), "no reference for op kind") {
		t.Errorf("unknown kind: err %v", err)
	}
}
