package lower

import (
	"testing"

	"mpk/gocore/ir"
)

// pairedGemm builds a paired GEMM stream: SiLU(x·Wgᵀ)·(x·Wuᵀ) over x of M
// rows and K = 256, N weight rows each, and its second weight's view.
func pairedGemm(M, N int64) (*builder, *ir.Op) {
	b := newBuilder()
	x := b.input("x", ir.F32, M, 256)
	up := b.op(ir.Linear, b.temp("h", ir.F32, M, N), x, b.param("Wu", ir.BF16, N, 256), b.param("Wg", ir.BF16, N, 256))
	up.Attr.Gemm, up.Attr.Wgmma = true, true
	up.Attr.Epi = &ir.Epilogue{First: 2, DType: ir.F32, Pair: 1, PairDType: ir.F32,
		Expr: ir.Apply(ir.EMul, ir.Apply(ir.ESilu, ir.Load(1)), ir.Load(0))}
	b.output(up.Out)
	return b, up
}

// TestBalanceGemmTail: a pair of 10 tasks on 8 workers keeps its first 8
// tasks' rows (512) as one stream over x's 64 rows and runs the last 128
// rows as two streams over 32 rows each, Spread, their second weight cut to
// the same rows; 8 tasks on 8, a tail of 5 on 8, 32 rows of x, or a weight
// another Linear reads too are left as they are.
func TestBalanceGemmTail(t *testing.T) {
	b, up := pairedGemm(64, 640)
	run(t, b.g, func(g *ir.Graph) { balanceGemmTail(g, 8, false) })
	if len(b.g.Ops) != 3 {
		t.Fatalf("ops: %s", kinds(b.g))
	}
	head, lo, hi := b.g.Ops[0], b.g.Ops[1], b.g.Ops[2]
	wu, wg := up.In[1], up.In[2]
	if head.Out.Shape[0] != 64 || head.Out.Shape[1] != 512 || head.In[1].Shape[0] != 512 || head.In[2].Shape[0] != 512 ||
		head.In[1].Offset != wu.Offset || head.In[2].Offset != wg.Offset || head.Attr.Spread {
		t.Fatalf("head: out %v, weights %v %v", head.Out, head.In[1], head.In[2])
	}
	for i, op := range []*ir.Op{lo, hi} {
		r0 := int64(i) * 32
		if op.Out.Shape[0] != 32 || op.Out.Shape[1] != 128 || op.Out.Offset != up.Out.Offset+r0*640+512 ||
			op.In[0].Shape[0] != 32 || op.In[0].Offset != r0*256 ||
			op.In[1].Shape[0] != 128 || op.In[1].Offset != wu.Offset+512*256 ||
			op.In[2].Shape[0] != 128 || op.In[2].Offset != wg.Offset+512*256 || !op.Attr.Spread {
			t.Fatalf("tail block %d: out %v, x %v, weights %v %v, spread %v", i, op.Out, op.In[0], op.In[1], op.In[2],
				op.Attr.Spread)
		}
		if w2, ok := op.PairWeight(); !ok || w2.Buf != wg.Buf {
			t.Fatalf("tail block %d lost its pair", i)
		}
	}
	for name, c := range map[string]struct {
		M, N    int64
		workers int
		edit    func(b *builder, op *ir.Op)
	}{
		"whole rounds":     {64, 512, 8, nil},
		"a tail over half": {64, 832, 8, nil},
		"32 rows of x":     {32, 640, 8, nil},
		"fewer tasks":      {64, 384, 8, nil},
		"its weight read again": {64, 640, 8, func(b *builder, op *ir.Op) {
			b.op(ir.Linear, b.temp("o", ir.F32, 64, 640), op.In[0], op.In[1])
		}},
	} {
		b, op := pairedGemm(c.M, c.N)
		if c.edit != nil {
			c.edit(b, op)
		}
		n := len(b.g.Ops)
		run(t, b.g, func(g *ir.Graph) { balanceGemmTail(g, c.workers, false) })
		if len(b.g.Ops) != n {
			t.Errorf("%s: cut anyway: %s", name, kinds(b.g))
		}
	}
}

// TestBalanceGemmTailOverlap: with overlap (a timed schedule) a pair whose
// product a K-sliced GEMM stream reads keeps its tail (the slices fill the
// idle workers: tailOverlapParts); without overlap it is cut.
func TestBalanceGemmTailOverlap(t *testing.T) {
	for overlap, want := range map[bool]int{false: 4, true: 2} {
		b, up := pairedGemm(64, 640)
		slice := b.op(ir.Linear, b.temp("y", ir.F32, 64, 64), up.Out, b.param("Wd", ir.BF16, 64, 640))
		slice.Attr.Gemm, slice.Attr.KParts = true, 2
		run(t, b.g, func(g *ir.Graph) { balanceGemmTail(g, 8, overlap) })
		if len(b.g.Ops) != want {
			t.Errorf("overlap %v: ops %s, want %d", overlap, kinds(b.g), want)
		}
	}
}
