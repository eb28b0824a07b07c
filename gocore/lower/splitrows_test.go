package lower

import (
	"testing"

	"mpk/gocore/ir"
)

// TestSplitLinearRows: a Linear whose x is too tall to stream (16 rows of
// 8,192 fp32 values, a batch-16 down projection) becomes blocks of rows that
// stream with x's low part (4 rows each: 2 × 4 × 8,224 × 2 bytes fit),
// each on its own rows of x, the residual and the output and on the whole
// weight; one short enough to stream stays whole.
func TestSplitLinearRows(t *testing.T) {
	b := newBuilder()
	x := b.temp("x", ir.F32, 16, 8192)
	w := b.param("w", ir.BF16, 2048, 8192)
	r := b.input("r", ir.F32, 16, 2048)
	out := b.temp("out", ir.F32, 16, 2048)
	down := b.op(ir.Linear, out, x, w, r)
	down.Attr.Residual = true
	x2 := b.temp("x2", ir.F32, 4, 2048)
	w2 := b.param("w2", ir.BF16, 1024, 2048)
	out2 := b.temp("out2", ir.F32, 4, 1024)
	b.op(ir.Linear, out2, x2, w2)
	b.output(out, out2)
	splitLinearRows(b.g)
	if len(b.g.Ops) != 5 {
		t.Fatalf("%d ops, want 4 blocks of the tall Linear and the short one whole:\n%s", len(b.g.Ops), b.g.Dump())
	}
	for i, op := range b.g.Ops[:4] {
		r0 := int64(4 * i)
		for _, c := range []struct {
			name string
			v    ir.View
			base ir.View
		}{{"x", op.In[0], x}, {"residual", op.In[2], r}, {"out", op.Out, out}} {
			if c.v.Buf != c.base.Buf || c.v.Shape[0] != 4 || c.v.Offset != r0*c.base.Strides[0] || c.v.Shape[1] != c.base.Shape[1] {
				t.Errorf("block %d: %s view %v, want rows [%d, %d) of %v", i, c.name, c.v, r0, r0+4, c.base)
			}
		}
		if op.In[1].Buf != w.Buf || op.In[1].Shape[0] != 2048 || op.In[1].Offset != 0 || !op.Attr.Residual {
			t.Errorf("block %d: weight %v, residual %v: want the whole weight and the residual kept", i, op.In[1], op.Attr.Residual)
		}
	}
	if last := b.g.Ops[4]; last.Out.Buf != out2.Buf || last.Out.Shape[0] != 4 {
		t.Errorf("the short Linear changed: %v", last.Out)
	}
}

// TestSplitLinearRowsKeepsIndexedExpressions: a folded epilogue that reads
// the row index would see block-relative rows: that Linear stays whole.
func TestSplitLinearRowsKeepsIndexedExpressions(t *testing.T) {
	b := newBuilder()
	x := b.temp("x", ir.F32, 16, 8192)
	w := b.param("w", ir.BF16, 2048, 8192)
	out := b.temp("out", ir.F32, 16, 2048)
	lin := b.op(ir.Linear, out, x, w)
	lin.Attr.Epi = &ir.Epilogue{First: 2, Expr: ir.Apply(ir.EAdd, ir.Load(0), ir.Cast(ir.F32, ir.Index(0))), DType: ir.F32}
	b.output(out)
	splitLinearRows(b.g)
	if len(b.g.Ops) != 1 {
		t.Fatalf("%d ops, want the Linear whole", len(b.g.Ops))
	}
}
