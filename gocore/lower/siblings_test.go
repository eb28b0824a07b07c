package lower

import (
	"testing"

	"mpk/gocore/ir"
)

func TestShareSiblingWorkers(t *testing.T) {
	b := newBuilder()
	x := b.input("x", ir.BF16, 1, 8)
	lin := func(name string, in ir.View, n int64) *ir.Op {
		op := b.op(ir.Linear, b.temp(name, ir.BF16, 1, n), in, b.param("W"+name, ir.BF16, n, 8))
		op.Label = "linear"
		return op
	}
	q, k, v := lin("q", x, 64), lin("k", x, 16), lin("v", x, 16)
	after := lin("o", q.Out, 8) // reads q's product: a new run, alone
	gate := lin("gate", x, 32)
	up := lin("up", x, 32)
	up.In = append(up.In, gate.Out) // an epilogue input: up reads gate's product
	b.output(after.Out, up.Out, k.Out, v.Out)
	run(t, b.g, func(g *ir.Graph) { shareSiblingWorkers(g, 132) })
	for _, c := range []struct {
		op   *ir.Op
		want int64
	}{{q, 88}, {k, 22}, {v, 22}, {after, 0}, {gate, 0}, {up, 0}} {
		if c.op.Attr.Workers != c.want {
			t.Errorf("%s: workers %d, want %d", c.op.Out.Buf.Name, c.op.Attr.Workers, c.want)
		}
	}
}

// TestShareSiblingWorkersWithAPair: a paired Linear (gate and up in one op)
// streams two weights' rows, so its share counts its rows twice.
func TestShareSiblingWorkersWithAPair(t *testing.T) {
	b := newBuilder()
	x := b.input("x", ir.BF16, 1, 8)
	q := b.op(ir.Linear, b.temp("q", ir.BF16, 1, 32), x, b.param("Wq", ir.BF16, 32, 8))
	up := b.op(ir.Linear, b.temp("u", ir.BF16, 1, 32), x, b.param("Wu", ir.BF16, 32, 8), b.param("Wg", ir.BF16, 32, 8))
	up.Attr.Epi = &ir.Epilogue{First: 2, Pair: 1, DType: ir.F32, PairDType: ir.F32,
		Expr: ir.Apply(ir.EMul, ir.Apply(ir.ESilu, ir.Load(1)), ir.Load(0))}
	b.output(q.Out, up.Out)
	run(t, b.g, func(g *ir.Graph) { shareSiblingWorkers(g, 132) })
	if q.Attr.Workers != 44 || up.Attr.Workers != 88 {
		t.Errorf("workers q %d, pair %d; want 44 and 88", q.Attr.Workers, up.Attr.Workers)
	}
}
