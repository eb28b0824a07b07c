package lower

import (
	"strings"
	"testing"

	"mpk/gocore/ir"
	"mpk/gocore/wire"
)

// bf16Graph: t = x + x (a bf16 intermediate), out = sum(t) (a bf16 output).
func bf16Graph() *wire.Graph {
	return &wire.Graph{
		Inputs: []wire.Input{{Name: "x", Kind: "input", Meta: *meta("bfloat16", 2, 3)}},
		Nodes: []wire.Node{
			{Name: "t", Target: "aten.add.Tensor", Args: []wire.Arg{nodeArg("x"), nodeArg("x")}, Outs: []*wire.Meta{meta("bfloat16", 2, 3)}},
			{Name: "out", Target: "aten.sum.default", Args: []wire.Arg{nodeArg("t")}, Outs: []*wire.Meta{meta("bfloat16")}},
		},
		Outputs: []wire.Arg{nodeArg("out")},
	}
}

func TestWidenTempsKeepsIntermediatesInFloat32(t *testing.T) {
	for _, round := range []bool{false, true} {
		g, err := LowerWith(bf16Graph(), Config{RoundIntermediates: round})
		if err != nil {
			t.Fatal(err)
		}
		var add *ir.Op
		for _, op := range g.Ops {
			if op.Kind == ir.Elementwise {
				add = op
			}
		}
		if add == nil || add.Out.Buf.Kind != ir.Temp {
			t.Fatalf("round=%v: no elementwise op writing a temp:\n%s", round, g.Dump())
		}
		wantTemp, wantCast := ir.F32, false
		if round {
			wantTemp, wantCast = ir.BF16, true
		}
		if add.Out.DType() != wantTemp {
			t.Errorf("round=%v: intermediate is %s, want %s", round, add.Out.DType(), wantTemp)
		}
		if got := strings.Contains(add.Attr.Expr.String(), "bfloat16("); got != wantCast {
			t.Errorf("round=%v: expr %s rounds to bf16: %v, want %v", round, add.Attr.Expr, got, wantCast)
		}
		if o := g.Outputs[0]; o.DType() != ir.BF16 || o.Buf.Kind != ir.Output {
			t.Errorf("round=%v: output is %s (kind %d), want a bf16 output buffer", round, o.DType(), o.Buf.Kind)
		}
	}
}

func TestDropHalfCastsKeepsOtherCasts(t *testing.T) {
	e := ir.Cast(ir.BF16, ir.Apply(ir.EAdd, ir.Cast(ir.F16, ir.Load(0)), ir.Cast(ir.I64, ir.Cast(ir.F32, ir.Load(1)))))
	if got, want := dropHalfCasts(e).String(), "add(in0,int64(float32(in1)))"; got != want {
		t.Errorf("dropHalfCasts = %s, want %s", got, want)
	}
	if dropHalfCasts(nil) != nil {
		t.Error("dropHalfCasts(nil) != nil")
	}
}
