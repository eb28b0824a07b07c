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

// TestAttentionKVStaysHalf: a bf16 temporary an attention reads as K (a
// sliding window's cache joined with a chunk's new rows) stays bf16 when
// the only other op reading it copies it into the bf16 cache, and widens
// when anything else reads it too: an fp32 sum of it, or a copy into a bf16
// temporary (widened itself, it would hold rounded rows where it held exact
// ones).
func TestAttentionKVStaysHalf(t *testing.T) {
	build := func(other string) (*ir.Graph, ir.View) {
		b := newBuilder()
		q, cache := b.input("q", ir.BF16, 1, 2, 4, 16), b.input("cache", ir.BF16, 1, 2, 8, 16)
		fresh := b.input("k_new", ir.BF16, 1, 2, 4, 16)
		kv := b.temp("cat", ir.BF16, 1, 2, 12, 16)
		b.op(ir.Cat, kv, cache, fresh).Attr.Dim = 2
		b.ew(cache, ir.Cast(ir.BF16, ir.Load(0)), strided(kv, 4*16, sh(1, 2, 8, 16), kv.Strides))
		att := b.temp("att", ir.BF16, 1, 2, 4, 16)
		b.op(ir.Attention, att, q, kv, kv)
		b.output(att)
		switch other {
		case "sum":
			s := b.temp("s", ir.F32, 1, 2, 12, 16)
			b.ew(s, ir.Apply(ir.EMul, ir.Load(0), ir.Const(2)), kv)
			b.output(s)
		case "copy into a temp":
			c := b.temp("c", ir.BF16, 1, 2, 12, 16)
			b.ew(c, ir.Load(0), kv)
			s := b.temp("s", ir.F32, 1, 2, 12, 16)
			b.ew(s, ir.Apply(ir.EMul, ir.Load(0), ir.Const(2)), c)
			b.output(s)
		}
		return b.g, kv
	}
	for _, other := range []string{"", "sum", "copy into a temp"} {
		g, kv := build(other)
		keep := attentionKV(g)
		widenTemps(g, keep)
		want := ir.BF16
		if other != "" {
			want = ir.F32
		}
		if kv.Buf.DType != want {
			t.Errorf("other reader %q: the attention's K is %s, want %s", other, kv.Buf.DType, want)
		}
	}
}
