package lower

import (
	"strings"
	"testing"

	"mpk/gocore/ir"
)

// mlpGraph is HF's MLP core: act = silu(gate(x)) · up(x), then down(act).
// gateFirst puts the gate projection before the up projection in op order.
func mlpGraph(gateFirst bool) (b *builder, gate, up, e *ir.Op, act ir.View) {
	b = newBuilder()
	x := b.input("x", ir.BF16, 1, 4)
	wg, wu := b.param("Wg", ir.BF16, 6, 4), b.param("Wu", ir.BF16, 6, 4)
	g, u := b.temp("g", ir.BF16, 1, 6), b.temp("u", ir.BF16, 1, 6)
	if gateFirst {
		gate, up = b.op(ir.Linear, g, x, wg), b.op(ir.Linear, u, x, wu)
	} else {
		up, gate = b.op(ir.Linear, u, x, wu), b.op(ir.Linear, g, x, wg)
	}
	gate.Label, up.Label = "linear", "linear"
	act = b.temp("act", ir.BF16, 1, 1, 6) // read through a 3-d view, as HF's [B, S, I]
	silu := ir.Cast(ir.BF16, ir.Apply(ir.ESilu, ir.Load(0)))
	e = b.ew(act, ir.Cast(ir.BF16, mul(silu, ir.Load(1))),
		strided(g, 0, sh(1, 1, 6), sh(6, 6, 1)), strided(u, 0, sh(1, 1, 6), sh(6, 6, 1)))
	down := b.op(ir.Linear, b.temp("y", ir.BF16, 1, 4), ir.View{Buf: act.Buf, Shape: sh(1, 6), Strides: sh(6, 1)},
		b.param("Wd", ir.BF16, 4, 6))
	down.Label = "linear"
	b.output(down.Out)
	return b, gate, up, e, act
}

func TestFuseEpilogue(t *testing.T) {
	for _, gateFirst := range []bool{true, false} {
		b, gate, up, _, act := mlpGraph(gateFirst)
		run(t, b.g, fuseEpilogue)
		// The later of the two Linears takes the product; the other's output
		// must exist when its tasks store.
		last, other := up, gate
		if !gateFirst {
			last, other = gate, up
		}
		if got, want := kinds(b.g), "linear linear:linear+silu_mul linear"; got != want {
			t.Fatalf("gateFirst=%v: ops %q, want %q", gateFirst, got, want)
		}
		epi := last.Attr.Epi
		if epi == nil || epi.First != 2 || len(last.In) != 3 || last.In[2].Buf != other.Out.Buf || epi.DType != ir.BF16 {
			t.Fatalf("gateFirst=%v: epilogue %+v on inputs %v", gateFirst, epi, last.In)
		}
		if last.Out.Buf != act.Buf || !equalShape(last.Out.Shape, sh(1, 6)) {
			t.Errorf("gateFirst=%v: the Linear writes %v, want the product's buffer as [1, 6]", gateFirst, last.Out)
		}
		// Load(0) is the product: silu applies to the gate, whichever Linear took it.
		want := map[bool]string{true: "silu(in1)", false: "silu(in0)"}[gateFirst]
		if s := epi.Expr.String(); !strings.Contains(s, want) {
			t.Errorf("gateFirst=%v: epilogue %s, want it to take %s", gateFirst, s, want)
		}
	}
	misses := []struct {
		name  string
		setup func(b *builder, gate, up, e *ir.Op)
	}{
		{"product also read elsewhere", func(b *builder, gate, up, e *ir.Op) { b.output(up.Out, gate.Out) }},
		{"result is a graph output", func(b *builder, gate, up, e *ir.Op) { b.output(e.Out) }},
		{"more inputs than the store holds", func(b *builder, gate, up, e *ir.Op) {
			for len(e.In)-1 <= ir.MaxEpilogueInputs {
				e.In = append(e.In, b.input("z", ir.BF16, 1, 1, 6))
				e.Attr.Expr = ir.Apply(ir.EAdd, e.Attr.Expr, ir.Load(len(e.In)-1))
			}
		}},
		{"linear with a residual", func(b *builder, gate, up, e *ir.Op) {
			gate.Attr.Residual, up.Attr.Residual = true, true
		}},
	}
	for _, c := range misses {
		t.Run(c.name, func(t *testing.T) {
			b, gate, up, e, _ := mlpGraph(true)
			c.setup(b, gate, up, e)
			want := kinds(b.g)
			run(t, b.g, fuseEpilogue)
			if got := kinds(b.g); got != want || gate.Attr.Epi != nil || up.Attr.Epi != nil {
				t.Errorf("ops %q, want unchanged %q", got, want)
			}
		})
	}
}

// TestPrologueKeepsEpilogueInputsLast: a Linear with both keeps the
// prologue's inputs before the epilogue's, as ProIn and EpiIn read them.
func TestPrologueKeepsEpilogueInputsLast(t *testing.T) {
	b := newBuilder()
	h := b.input("h", ir.F32, 1, 4)
	nw := b.param("norm", ir.F32, 4)
	x := b.temp("x", ir.F32, 1, 4)
	norm := b.op(ir.RMSNorm, x, h, ir.View{Buf: nw.Buf, Shape: sh(1, 4), Strides: sh(0, 1)})
	norm.Attr.HasWeight, norm.Attr.Eps = true, 1e-6
	g, u := b.temp("g", ir.F32, 1, 6), b.temp("u", ir.F32, 1, 6)
	gate, up := b.op(ir.Linear, g, x, b.param("Wg", ir.F32, 6, 4)), b.op(ir.Linear, u, x, b.param("Wu", ir.F32, 6, 4))
	gate.Label, up.Label = "linear", "linear"
	act := b.temp("act", ir.F32, 1, 6)
	b.ew(act, mul(ir.Apply(ir.ESilu, ir.Load(0)), ir.Load(1)), g, u)
	down := b.op(ir.Linear, b.temp("y", ir.F32, 1, 4), act, b.param("Wd", ir.F32, 4, 6))
	down.Label = "linear"
	b.output(down.Out)
	run(t, b.g, fuseEpilogue)
	run(t, b.g, fusePrologue)
	if up.Attr.Pro == nil || up.Attr.Epi == nil {
		t.Fatalf("up: prologue %v epilogue %v, want both", up.Attr.Pro, up.Attr.Epi)
	}
	pro, epi := up.ProIn(), up.EpiIn()
	if len(pro) != 2 || pro[0].Buf != h.Buf || pro[1].Buf != nw.Buf {
		t.Errorf("prologue inputs %v, want h and the norm weight", pro)
	}
	if len(epi) != 1 || epi[0].Buf != g.Buf {
		t.Errorf("epilogue inputs %v, want the gate's output", epi)
	}
}
