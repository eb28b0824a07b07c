package lower

import (
	"testing"

	"mpk/gocore/ir"
)

// TestFoldSumIntoNorm: a chunk's K-split sum (two slices and the residual,
// 64 × 128) read by an RMSNorm over [1, 64, 128] that only GEMM streams read:
// the norm computes the sum itself over the sum's 2-D index space (the
// slices, the residual and its weight as inputs, the sum's expression as
// its prologue) and goes first; the sum stays (the residual stream is read
// later) on a quarter of the workers. Read by a Linear that is no GEMM
// stream, the norm stays as it is; read by nothing else, the sum goes.
func TestFoldSumIntoNorm(t *testing.T) {
	build := func(gemm, later bool) (*builder, *ir.Op, *ir.Op) {
		b := newBuilder()
		p0, p1 := b.temp("p0", ir.F32, 64, 128), b.temp("p1", ir.F32, 64, 128)
		res := b.input("res", ir.F32, 64, 128)
		h := b.temp("h", ir.F32, 64, 128)
		sum := b.ew(h, ir.Cast(ir.F32, ir.Apply(ir.EAdd, ir.Cast(ir.F32, ir.Apply(ir.EAdd, ir.Load(0), ir.Load(1))), ir.Load(2))), p0, p1, res)
		sum.Label = "linear_k_sum+residual"
		x := ir.View{Buf: h.Buf, Shape: []int64{1, 64, 128}, Strides: []int64{8192, 128, 1}}
		w := b.param("w", ir.BF16, 128)
		wv := ir.View{Buf: w.Buf, Shape: []int64{1, 64, 128}, Strides: []int64{0, 0, 1}}
		normed := b.temp("normed", ir.F32, 1, 64, 128)
		norm := b.op(ir.RMSNorm, normed, x, wv)
		norm.Attr.HasWeight, norm.Attr.Eps, norm.Label = true, 1e-6, "rmsnorm"
		q := b.op(ir.Linear, b.temp("q", ir.F32, 64, 256), ir.View{Buf: normed.Buf, Shape: []int64{64, 128}, Strides: []int64{128, 1}},
			b.param("wq", ir.BF16, 256, 128))
		q.Attr.Gemm = gemm
		b.output(q.Out)
		if later { // the residual stream's next reader
			b.output(b.ew(b.temp("h2", ir.F32, 64, 128), ir.Load(0), h).Out)
		}
		return b, sum, norm
	}
	b, sum, norm := build(true, true)
	foldSumIntoNorm(b.g, 132)
	if got := kinds(b.g); got != "rmsnorm:linear_k_sum+residual+rmsnorm elementwise:linear_k_sum+residual linear elementwise" {
		t.Fatalf("ops %s", got)
	}
	p := norm.Attr.Pro
	if p == nil || p.Kind != ir.Elementwise || p.First != 2 || p.Expr != sum.Attr.Expr || p.DType != ir.F32 || len(norm.In) != 4 ||
		norm.In[0].Buf != sum.In[0].Buf || norm.In[2].Buf != sum.In[1].Buf || norm.In[3].Buf != sum.In[2].Buf {
		t.Fatalf("norm %s: prologue %+v, inputs %v", norm.Label, p, norm.In)
	}
	if w := norm.In[1]; w.Rank() != 2 || w.Strides[0] != 0 || w.Strides[1] != 1 || norm.Out.Rank() != 2 || norm.Out.Strides[0] != 128 {
		t.Fatalf("want the weight and output over [64, 128]: %v, %v", w, norm.Out)
	}
	if sum.Attr.Workers != 33 {
		t.Fatalf("sum on %d workers, want a quarter of 132", sum.Attr.Workers)
	}

	b, _, norm = build(false, true)
	foldSumIntoNorm(b.g, 132)
	if norm.Attr.Pro != nil || kinds(b.g) != "elementwise:linear_k_sum+residual rmsnorm linear elementwise" {
		t.Fatalf("read by a Linear that is no GEMM stream: ops %s", kinds(b.g))
	}

	b, _, _ = build(true, false)
	foldSumIntoNorm(b.g, 132)
	if got := kinds(b.g); got != "rmsnorm:linear_k_sum+residual+rmsnorm linear" {
		t.Fatalf("a sum the norm alone read: ops %s", got)
	}
}
