package lower

import (
	"fmt"
	"strings"
	"testing"

	"mpk/gocore/ir"
)

// builder assembles small op graphs for rewrite-pass tests:
//
//	b := newBuilder()
//	x := b.input("x", ir.F32, 2, 8)
//	y := b.temp("y", ir.F32, 2, 8)
//	b.ew(y, ir.Cast(ir.F32, ir.Apply(ir.ESilu, ir.Load(0))), x)
//	b.output(y)
//	fuseElementwise(b.g)
type builder struct{ g *ir.Graph }

func newBuilder() *builder { return &builder{g: &ir.Graph{}} }

// input adds a contiguous graph input (non-parameter) and returns its whole view.
func (b *builder) input(name string, dt ir.DType, shape ...int64) ir.View {
	v := b.g.NewTemp(name, dt, shape)
	v.Buf.Kind, v.Buf.Index = ir.Input, len(b.g.Inputs)
	b.g.Inputs = append(b.g.Inputs, v.Buf)
	return v
}

// param adds a graph input marked as a model parameter.
func (b *builder) param(name string, dt ir.DType, shape ...int64) ir.View {
	v := b.input(name, dt, shape...)
	v.Buf.Param = true
	return v
}

// temp adds a contiguous temporary and returns its whole view.
func (b *builder) temp(name string, dt ir.DType, shape ...int64) ir.View {
	return b.g.NewTemp(name, dt, shape)
}

// op appends an op; its id is its position.
func (b *builder) op(kind ir.Kind, out ir.View, in ...ir.View) *ir.Op {
	op := &ir.Op{ID: len(b.g.Ops), Kind: kind, Node: fmt.Sprintf("n%d", len(b.g.Ops)), In: in, Out: out}
	b.g.Ops = append(b.g.Ops, op)
	return op
}

// ew appends an elementwise op computing e over in.
func (b *builder) ew(out ir.View, e *ir.Expr, in ...ir.View) *ir.Op {
	op := b.op(ir.Elementwise, out, in...)
	op.Attr.Expr = e
	return op
}

func (b *builder) output(vs ...ir.View) { b.g.Outputs = append(b.g.Outputs, vs...) }

// strided makes a view of v's buffer with the given offset, shape and strides.
func strided(v ir.View, off int64, shape, strides []int64) ir.View {
	return ir.View{Buf: v.Buf, Offset: off, Shape: shape, Strides: strides}
}

func sh(xs ...int64) []int64 { return xs }

// run applies a pass the way Rewrite does (pass, then renumber) and checks the result.
func run(t *testing.T, g *ir.Graph, pass func(*ir.Graph)) {
	t.Helper()
	pass(g)
	g.Renumber()
	checkGraph(t, g)
}

// checkGraph verifies invariants every rewrite pass must keep: dense ids,
// views inside their buffers, buffers that belong to the graph, elementwise
// loads in range, and every temporary read after some op wrote it.
func checkGraph(t *testing.T, g *ir.Graph) {
	t.Helper()
	inGraph := map[*ir.Buffer]bool{}
	for i, b := range g.Buffers {
		inGraph[b] = true
		if b.ID != i {
			t.Errorf("buffer %s has id %d at index %d", b.Name, b.ID, i)
		}
	}
	written := map[*ir.Buffer]bool{}
	checkView := func(op *ir.Op, what string, v ir.View) {
		if !inGraph[v.Buf] {
			t.Errorf("op %d %s: %s view of buffer %s that is not in the graph", op.ID, op.Kind, what, v.Buf.Name)
			return
		}
		if len(v.Shape) != len(v.Strides) {
			t.Errorf("op %d %s: %s view %v has %d strides for %d dims", op.ID, op.Kind, what, v, len(v.Strides), len(v.Shape))
			return
		}
		if lo, hi := v.Span(); lo < 0 || hi > v.Buf.Numel {
			t.Errorf("op %d %s: %s view %v spans [%d, %d), outside %d elements", op.ID, op.Kind, what, v, lo, hi, v.Buf.Numel)
		}
	}
	for i, op := range g.Ops {
		if op.ID != i {
			t.Errorf("op at index %d has id %d", i, op.ID)
		}
		for _, v := range op.In {
			checkView(op, "input", v)
			if v.Buf.Kind == ir.Temp && !written[v.Buf] {
				t.Errorf("op %d %s reads temporary %s before any op writes it", op.ID, op.Kind, v.Buf.Name)
			}
		}
		checkView(op, "output", op.Out)
		written[op.Out.Buf] = true
		if op.Kind == ir.Elementwise {
			if op.Attr.Expr == nil {
				t.Errorf("elementwise op %d has no expression", op.ID)
				continue
			}
			for in := range op.Attr.Expr.Loads() {
				if in < 0 || in >= len(op.In) {
					t.Errorf("op %d loads input %d of %d", op.ID, in, len(op.In))
				}
			}
		}
	}
}

// kinds lists the ops of g as "kind" or "kind:label", for compact assertions.
func kinds(g *ir.Graph) string {
	var s []string
	for _, op := range g.Ops {
		k := op.Kind.String()
		if op.Label != "" && op.Label != k {
			k += ":" + op.Label
		}
		s = append(s, k)
	}
	return strings.Join(s, " ")
}
