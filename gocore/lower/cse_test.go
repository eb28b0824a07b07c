package lower

import (
	"testing"

	"mpk/gocore/ir"
)

// maskPerLayer is HF's decode mask recomputed in each of two layers: where(m,
// 0, -inf) of one bool mask, then a reader of each copy.
func maskPerLayer(b *builder, m ir.View) (w1, w2, r1, r2 *ir.Op) {
	where := ir.Apply(ir.EWhere, ir.Load(0), ir.Const(0), ir.Const(-1e30))
	w1 = b.ew(b.temp("mask1", ir.F32, 1, 8), where, m)
	r1 = b.ew(b.temp("y1", ir.F32, 1, 8), ir.Apply(ir.EAdd, ir.Load(0), ir.Load(0)), w1.Out)
	w2 = b.ew(b.temp("mask2", ir.F32, 1, 8), where, m)
	r2 = b.ew(b.temp("y2", ir.F32, 1, 8), ir.Apply(ir.EAdd, ir.Load(0), ir.Load(0)), w2.Out)
	b.output(r1.Out, r2.Out)
	return
}

func TestShareRepeatedOps(t *testing.T) {
	b := newBuilder()
	m := b.input("m", ir.Bool, 1, 8)
	w1, w2, r1, r2 := maskPerLayer(b, m)
	run(t, b.g, shareRepeatedOps)
	if len(b.g.Ops) != 3 || b.g.Ops[0] != w1 || b.g.Ops[1] != r1 || b.g.Ops[2] != r2 {
		t.Fatalf("ops %q, want the first where and both readers", kinds(b.g))
	}
	if r2.In[0].Buf != w1.Out.Buf {
		t.Errorf("the second reader reads %s, want the first where's %s", r2.In[0].Buf.Name, w1.Out.Buf.Name)
	}
	_ = w2

	misses := []struct {
		name   string
		change func(b *builder, m ir.View, w1, w2 *ir.Op)
	}{
		{"input written in between", func(b *builder, m ir.View, w1, w2 *ir.Op) {
			// the mask is updated between the two layers (an in-place write)
			upd := &ir.Op{Kind: ir.Elementwise, Node: "upd", In: []ir.View{m}, Out: m,
				Attr: ir.Attrs{Expr: ir.Apply(ir.ENot, ir.Load(0))}}
			at := opIndex(b.g)[w2]
			b.g.Ops = append(b.g.Ops[:at], append([]*ir.Op{upd}, b.g.Ops[at:]...)...)
		}},
		{"another expression", func(_ *builder, _ ir.View, _, w2 *ir.Op) {
			w2.Attr.Expr = ir.Apply(ir.EWhere, ir.Load(0), ir.Const(0), ir.Const(-2e30))
		}},
		{"another view of the input", func(_ *builder, m ir.View, _, w2 *ir.Op) {
			w2.In[0] = strided(m, 0, sh(1, 8), sh(0, 1))
		}},
		{"another output dtype", func(b *builder, _ ir.View, _, w2 *ir.Op) {
			w2.Out.Buf.DType = ir.BF16
		}},
		{"a graph output", func(b *builder, _ ir.View, _, w2 *ir.Op) {
			b.output(w2.Out)
		}},
	}
	for _, c := range misses {
		b := newBuilder()
		m := b.input("m", ir.Bool, 1, 8)
		w1, w2, _, r2 := maskPerLayer(b, m)
		c.change(b, m, w1, w2)
		n := len(b.g.Ops)
		run(t, b.g, shareRepeatedOps)
		if len(b.g.Ops) != n || r2.In[0].Buf != w2.Out.Buf {
			t.Errorf("%s: ops %q, the second reader reads %s; want nothing shared", c.name, kinds(b.g), r2.In[0].Buf.Name)
		}
	}
}
