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
