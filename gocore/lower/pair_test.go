package lower

import (
	"testing"

	"mpk/gocore/ir"
	"mpk/gocore/stream"
)

// mlp builds a gate and an up projection of x (M rows, K = 256, N = 64)
// whose store computes SiLU(gate)·up (fuseEpilogue's result), and lets edit
// change the graph before pairLinears (GEMM streams paired or not) runs; it
// returns the up projection.
func mlp(t *testing.T, M int64, gemm bool, edit func(b *builder, x ir.View, gate, up *ir.Op)) (*ir.Graph, *ir.Op, *ir.Op) {
	t.Helper()
	return mlpOf(t, M, 256, gemm, false, edit)
}

// mlpOf is mlp with K columns of x, tile streams paired or not.
func mlpOf(t *testing.T, M, K int64, gemm, tiles bool, edit func(b *builder, x ir.View, gate, up *ir.Op)) (*ir.Graph, *ir.Op, *ir.Op) {
	t.Helper()
	b := newBuilder()
	x := b.input("x", ir.BF16, M, K)
	gate := b.op(ir.Linear, b.temp("g", ir.F32, M, 64), x, b.param("Wg", ir.BF16, 64, K))
	up := b.op(ir.Linear, b.temp("u", ir.F32, M, 64), x, b.param("Wu", ir.BF16, 64, K), gate.Out)
	up.Attr.Epi = &ir.Epilogue{First: 2, DType: ir.F32, Expr: ir.Apply(ir.EMul, ir.Apply(ir.ESilu, ir.Load(1)), ir.Load(0))}
	b.output(up.Out)
	if edit != nil {
		edit(b, x, gate, up)
	}
	run(t, b.g, func(g *ir.Graph) { pairLinears(g, gemm, tiles) })
	return b.g, gate, up
}

func TestPairLinears(t *testing.T) {
	g, gate, up := mlp(t, 1, false, nil)
	w2, ok := up.PairWeight()
	if !ok || w2.Buf != gate.In[1].Buf || up.Attr.Epi.Pair != 1 || up.Attr.Epi.PairDType != ir.F32 || len(g.Ops) != 1 {
		t.Fatalf("gate and up did not pair: %s, pair %+v", kinds(g), up.Attr.Epi)
	}
	// Each of these keeps the gate an op of its own.
	for name, c := range map[string]struct {
		M    int64
		edit func(b *builder, x ir.View, gate, up *ir.Op)
	}{
		"gate's product also an output": {1, func(b *builder, _ ir.View, gate, _ *ir.Op) { b.output(gate.Out) }},
		"gate reads another x": {1, func(b *builder, _ ir.View, gate, _ *ir.Op) {
			gate.In[0] = b.input("x2", ir.BF16, 1, 256)
		}},
		"a weight of another dtype": {1, func(b *builder, _ ir.View, gate, _ *ir.Op) {
			gate.In[1] = b.param("Wg2", ir.F16, 64, 256)
		}},
		"x written between them": {1, func(b *builder, x ir.View, gate, up *ir.Op) {
			w := b.op(ir.Copy, x, b.input("y", ir.BF16, 1, 256))
			b.g.Ops = []*ir.Op{gate, w, up}
		}},
		"gate with a residual": {1, func(b *builder, _ ir.View, gate, _ *ir.Op) {
			gate.Attr.Residual = true
			gate.In = append(gate.In, b.input("r", ir.F32, 1, 64))
		}},
		"x not in registers (4 rows: tiles)": {4, nil},
	} {
		g, gate, up := mlp(t, c.M, false, c.edit)
		if _, ok := up.PairWeight(); ok || len(g.Ops) < 2 || g.Ops[0] != gate {
			t.Errorf("%s: paired anyway: %s", name, kinds(g))
		}
	}
}

// TestPairGemmLinears: a prompt chunk's gate and up GEMM streams pair only
// when asked (option pair_gemm), on mma.sync and on wgmma.
func TestPairGemmLinears(t *testing.T) {
	asGemm := func(wgmma bool) func(b *builder, x ir.View, gate, up *ir.Op) {
		return func(_ *builder, _ ir.View, gate, up *ir.Op) {
			for _, op := range []*ir.Op{gate, up} {
				op.Attr.Gemm, op.Attr.Wgmma = true, wgmma
			}
		}
	}
	for _, wgmma := range []bool{false, true} {
		g, gate, up := mlp(t, 64, true, asGemm(wgmma))
		if w2, ok := up.PairWeight(); !ok || w2.Buf != gate.In[1].Buf || len(g.Ops) != 1 || !up.Attr.Gemm {
			t.Fatalf("GEMM gate and up (wgmma %v) did not pair: %s", wgmma, kinds(g))
		}
	}
	g, gate, up := mlp(t, 64, false, asGemm(false))
	if _, ok := up.PairWeight(); ok || len(g.Ops) < 2 || g.Ops[0] != gate {
		t.Errorf("pair_gemm off: paired anyway: %s", kinds(g))
	}
}

// TestPairTileLinears: a decode batch's gate and up tile streams (8 rows,
// K = 2,048) pair only when asked (option pair_tiles), and the pair streams
// as tiles, each row group's pages of both weights.
func TestPairTileLinears(t *testing.T) {
	g, gate, up := mlpOf(t, 8, 2048, false, true, nil)
	if w2, ok := up.PairWeight(); !ok || w2.Buf != gate.In[1].Buf || len(g.Ops) != 1 {
		t.Fatalf("tile gate and up did not pair: %s", kinds(g))
	}
	if p, ok := stream.For(up, stream.Writers(g)); !ok || !p.Tiles || !p.Pair {
		t.Fatalf("the pair's plan %+v (%v), want tiles of a pair", p, ok)
	}
	g, gate, up = mlpOf(t, 8, 2048, false, false, nil)
	if _, ok := up.PairWeight(); ok || len(g.Ops) < 2 || g.Ops[0] != gate {
		t.Errorf("pair_tiles off: paired anyway: %s", kinds(g))
	}
}
