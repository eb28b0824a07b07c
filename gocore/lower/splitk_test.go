package lower

import (
	"testing"

	"mpk/gocore/ir"
)

// TestSplitLinearK: the down projection of a batch of 16 (x 16 × 8,192 fp32:
// with its low part too wide for a tile stream) becomes 4 Linears over
// 2,048-column slices of x and of the weight rows, and a sum that adds the
// residual; one with an epilogue, a sum that applies it; a Linear that
// streams as it is, or has a prologue, stays.
func TestSplitLinearK(t *testing.T) {
	build := func(M, K int64, norm bool) (*builder, *ir.Op) {
		b := newBuilder()
		x := b.input("x", ir.F32, M, K)
		w := b.param("w", ir.BF16, 2048, K)
		res := b.input("res", ir.F32, M, 2048)
		out := b.temp("out", ir.F32, M, 2048)
		l := b.op(ir.Linear, out, x, w, res)
		l.Attr.Residual, l.Label = true, "linear+residual"
		if norm {
			l.Attr.Pro = &ir.Prologue{Kind: ir.RMSNorm, First: 3, DType: ir.F32}
		}
		b.output(out)
		return b, l
	}
	b, l := build(16, 8192, false)
	splitLinearK(b.g, 132, true, false, false, false)
	if got := kinds(b.g); got != "linear linear linear linear elementwise:linear_k_sum+residual" {
		t.Fatalf("ops %s", got)
	}
	sum := b.g.Ops[4]
	if sum.Out.Buf != l.Out.Buf || len(sum.In) != 5 || sum.In[4].Buf != l.In[2].Buf {
		t.Fatalf("sum %v <- %v", sum.Out, sum.In)
	}
	for p, s := range b.g.Ops[:4] {
		x, w := s.In[0], s.In[1]
		if s.Attr.Residual || s.Attr.KParts != 4 || len(s.In) != 2 || s.Out.Buf != sum.In[p].Buf || s.Out.DType() != ir.F32 ||
			x.Offset != int64(p)*2048 || x.Shape[1] != 2048 || w.Offset != int64(p)*2048 || w.Shape[1] != 2048 ||
			w.Strides[0] != 8192 {
			t.Fatalf("slice %d: x %v, w %v, out %v, residual %v", p, x, w, s.Out, s.Attr.Residual)
		}
	}
	// The residual add as an epilogue (the last layer's down projection): out = res + product.
	b, l = build(16, 8192, false)
	l.Attr.Residual, l.Label = false, "linear+residual_add"
	l.Attr.Epi = &ir.Epilogue{First: 2, DType: ir.F32, Expr: ir.Cast(ir.F32, ir.Apply(ir.EAdd, ir.Load(1), ir.Load(0)))}
	splitLinearK(b.g, 132, true, false, false, false)
	sum = b.g.Ops[4]
	// the slices summed in order, rounded to fp32, then the epilogue (in4 the residual)
	want := "float32(float32(add(in4,float32(float32(add(float32(add(float32(add(in0,in1)),in2)),in3))))))"
	if got := kinds(b.g); got != "linear linear linear linear elementwise:linear_k_sum+epilogue" || len(sum.In) != 5 ||
		sum.In[4].Buf != l.In[2].Buf || sum.Attr.Expr.String() != want {
		t.Fatalf("epilogue: ops %s, sum %s reading %v", got, sum.Attr.Expr, sum.In)
	}
	// qwen3-8b's down projection at batch 16 (K = 12,288): 8 slices of
	// 1,536 stream, but their sum would read 9 inputs with the residual;
	// 6 slices of 2,048 stream too and keep it within maxSliceInputs.
	b, _ = build(16, 12288, false)
	splitLinearK(b.g, 132, true, false, false, false)
	if got := kinds(b.g); got != "linear linear linear linear linear linear elementwise:linear_k_sum+residual" ||
		len(b.g.Ops[6].In) != 7 || b.g.Ops[0].In[0].Shape[1] != 2048 || b.g.Ops[0].Attr.KParts != 6 {
		t.Fatalf("K = 12,288: ops %s", got)
	}
	for _, c := range []struct {
		M, K int64
		norm bool
	}{{4, 8192, false}, {8, 8192, false}, {16, 8192, true}} {
		b, _ := build(c.M, c.K, c.norm)
		splitLinearK(b.g, 132, true, false, false, false)
		if got := kinds(b.g); got != "linear:linear+residual" {
			t.Errorf("%+v: ops %s", c, got)
		}
	}
}

// mlpChunk builds a 64-token chunk's MLP in qwen3-8b's shapes: the up
// projection (N weight rows, K 4,096) whose SiLU·mul epilogue reads the gate
// projection's product (pairLinears folds them later), then the down
// projection over its N columns (4,096 rows, a residual): all GEMM streams.
func mlpChunk(N int64) (b *builder, up, down *ir.Op) {
	b = newBuilder()
	x := b.input("x", ir.F32, 64, 4096)
	gate := b.op(ir.Linear, b.temp("g", ir.F32, 64, N), x, b.param("Wg", ir.BF16, N, 4096))
	up = b.op(ir.Linear, b.temp("h", ir.F32, 64, N), x, b.param("Wu", ir.BF16, N, 4096), gate.Out)
	up.Attr.Epi = &ir.Epilogue{First: 2, DType: ir.F32, Expr: ir.Apply(ir.EMul, ir.Apply(ir.ESilu, ir.Load(1)), ir.Load(0))}
	down = b.op(ir.Linear, b.temp("y", ir.F32, 64, 4096), up.Out, b.param("Wd", ir.BF16, 4096, N), b.input("res", ir.F32, 64, 4096))
	down.Attr.Residual, down.Label = true, "linear+residual"
	for _, op := range []*ir.Op{gate, up, down} {
		op.Attr.Gemm, op.Attr.Wgmma = true, true
	}
	b.output(down.Out)
	return b, up, down
}

// TestTailOverlapParts: after qwen3-8b's gate/up pair (192 tasks on 132
// workers: 60 in a second round) the down projection takes 4 slices of K
// (2 cover the first round's columns and run beside the second round on
// its 72 idle workers; the other 2 take one round after it) where
// gemmKParts gives 2, and splitLinearK cuts it so only with overlap. A pair
// of whole rounds (128 tasks), or one whose last round fills more than
// half the workers (202 tasks: 70), leaves the down projection to
// gemmKParts.
func TestTailOverlapParts(t *testing.T) {
	b, _, down := mlpChunk(12288)
	u := analyze(b.g)
	extra := int64(len(sumInputs(down)))
	if got := gemmKParts(down, 132, extra); got != 2 {
		t.Fatalf("gemmKParts %d, want 2", got)
	}
	if got := tailOverlapParts(u, down, 132, 2, extra); got != 4 {
		t.Fatalf("tailOverlapParts %d, want 4", got)
	}
	for overlap, want := range map[bool]int64{false: 2, true: 4} {
		b, _, down := mlpChunk(12288)
		splitLinearK(b.g, 132, false, true, true, overlap)
		slices := int64(0)
		for _, op := range b.g.Ops {
			if op.Kind == ir.Linear && op.In[0].Buf == down.In[0].Buf {
				slices++
				if op.Attr.KParts != want {
					t.Errorf("overlap %v: a slice of %d parts, want %d", overlap, op.Attr.KParts, want)
				}
			}
		}
		if slices != want {
			t.Errorf("overlap %v: %d slices of the down projection, want %d: %s", overlap, slices, want, kinds(b.g))
		}
	}
	for _, N := range []int64{128 * 64, 202 * 64} {
		b, _, down := mlpChunk(N)
		if got := tailOverlapParts(analyze(b.g), down, 132, 2, int64(len(sumInputs(down)))); got != 0 {
			t.Errorf("a pair of %d tasks: tailOverlapParts %d, want 0", N/64, got)
		}
	}
}
