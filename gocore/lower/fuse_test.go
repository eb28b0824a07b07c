package lower

import (
	"fmt"
	"math"
	"testing"

	"mpk/gocore/ir"
	"mpk/gocore/wire"
)

// decodeMask builds Hugging Face's decode mask chain over S cache slots as the
// lowering leaves it: the position (an input) plus 0, an arange, their
// comparison viewed [1, 1, 1, S], the position's in-place increment, and
// where(le, 0, -inf) over two scalar constants. The position sum is also an
// output (the KV write reads it in a real step).
func decodeMask(b *builder, s int64) (pos, sum ir.View, where *ir.Op) {
	pos = b.input("pos", ir.I64, 1)
	sum, ar := b.temp("sum", ir.I64, 1), b.temp("arange", ir.I64, s)
	le, where4 := b.temp("le", ir.Bool, 1, 1, 1, s), b.temp("where", ir.F32, 1, 1, 1, s)
	ninf, zero := b.temp("ninf", ir.F32), b.temp("zero", ir.F32)
	b.ew(sum, ir.Cast(ir.I64, add(ir.Cast(ir.I64, ir.Index(0)), ir.Load(0))), strided(pos, 0, sh(1), sh(0)))
	b.ew(ar, ir.Cast(ir.I64, add(ir.Cast(ir.I64, ir.Index(0)), ir.Const(0))))
	b.ew(le, ir.Cast(ir.Bool, ir.Apply(ir.ELe, ir.Load(0), ir.Load(1))),
		strided(ar, 0, sh(1, 1, 1, s), sh(s, s, s, 1)), strided(sum, 0, sh(1, 1, 1, s), sh(1, 1, 1, 0)))
	b.ew(pos, ir.Cast(ir.I64, add(ir.Load(0), ir.Const(1))), pos) // the position's increment, in place
	b.ew(ninf, ir.Const(math.Inf(-1)))
	b.ew(zero, ir.Const(0))
	where = b.ew(where4, ir.Apply(ir.EWhere, ir.Load(0), ir.Load(1), ir.Load(2)), le,
		strided(zero, 0, sh(1, 1, 1, s), sh(0, 0, 0, 0)), strided(ninf, 0, sh(1, 1, 1, s), sh(0, 0, 0, 0)))
	b.output(where4, sum)
	return pos, sum, where
}

func TestInlineProducers(t *testing.T) {
	t.Run("the decode mask folds into its where", func(t *testing.T) {
		b := newBuilder()
		_, sum, where := decodeMask(b, 8)
		run(t, b.g, inlineProducers)
		// The arange (reshaped), the comparison and the constants fold in; the
		// position sum does not: the increment writes its input in between.
		if got := len(b.g.Ops); got != 3 {
			t.Fatalf("%d ops left, want 3 (sum, increment, where):\n%s", got, b.g.Dump())
		}
		if got, want := where.Attr.Expr.String(), "where(bool(le(int64(add(int64(idx3),0)),in0)),0,-Inf)"; got != want {
			t.Errorf("where computes %s, want %s", got, want)
		}
		if len(where.In) != 1 || where.In[0].Buf != sum.Buf || where.In[0].Strides[3] != 0 {
			t.Errorf("where reads %v, want the position sum broadcast", where.In)
		}
	})
	t.Run("a scalar read by several ops is computed again where it is read", func(t *testing.T) {
		b := newBuilder()
		pos, inv := b.input("pos", ir.I64, 1), b.input("inv", ir.F32, 4)
		f, ang, ext := b.temp("f", ir.F32, 1, 1, 1), b.temp("ang", ir.F32, 1, 1, 4), b.temp("ext", ir.I32, 1)
		b.ew(f, castF32(ir.Load(0)), strided(pos, 0, sh(1, 1, 1), sh(0, 0, 1)))
		c := b.ew(ang, castF32(mul(ir.Load(0), ir.Load(1))), strided(f, 0, sh(1, 1, 4), sh(1, 1, 0)), strided(inv, 0, sh(1, 1, 4), sh(0, 0, 1)))
		b.op(ir.MaskExtent, ext, strided(f, 0, sh(1), sh(1))) // another kind of reader keeps f
		b.output(ang, ext)
		run(t, b.g, inlineProducers)
		if got, want := c.Attr.Expr.String(), "float32(mul(float32(in1),in0))"; got != want {
			t.Errorf("angles compute %s, want %s", got, want)
		}
		if len(b.g.Ops) != 3 || len(c.In) != 2 || c.In[1].Buf != pos.Buf || c.In[1].Strides[2] != 0 {
			t.Errorf("ops %q, the angles reading %v: want f kept and the angles reading pos broadcast", kinds(b.g), c.In)
		}
	})
	t.Run("a large producer read twice stays", func(t *testing.T) {
		b := newBuilder()
		x := b.input("x", ir.F32, 4)
		big, y, z := b.temp("big", ir.F32, 4), b.temp("y", ir.F32, 4), b.temp("z", ir.F32, 4)
		e := ir.Load(0)
		for i := 0; i < maxInlineNodes; i++ {
			e = ir.Apply(ir.EExp, e)
		}
		b.ew(big, castF32(e), x)
		b.ew(y, castF32(ir.Apply(ir.ENeg, ir.Load(0))), big)
		b.ew(z, castF32(ir.Apply(ir.EAbs, ir.Load(0))), big)
		b.output(y, z)
		run(t, b.g, inlineProducers)
		if len(b.g.Ops) != 3 {
			t.Errorf("ops %q, want the %d-node producer kept for its two readers", kinds(b.g), exprNodes(b.g.Ops[0].Attr.Expr))
		}
	})
	t.Run("no inlining past the task ABI's inputs", func(t *testing.T) {
		b := newBuilder()
		var xs []ir.View
		for i := 0; i < ir.MaxInputs+1; i++ {
			xs = append(xs, b.input(fmt.Sprintf("x%d", i), ir.F32, 4))
		}
		sum := func(n int) *ir.Expr { // in0 + ... + in(n-1)
			e := ir.Load(0)
			for i := 1; i < n; i++ {
				e = add(e, ir.Load(i))
			}
			return castF32(e)
		}
		p, y, z := b.temp("p", ir.F32, 4), b.temp("y", ir.F32, 4), b.temp("z", ir.F32, 4)
		b.ew(p, sum(3), xs[:3]...)
		y10 := append([]ir.View{p}, xs[3:12]...) // p and 9 others: 12 inputs inlined
		b.ew(y, sum(len(y10)), y10...)
		z11 := append([]ir.View{p}, xs[3:13]...) // p and 10 others: 13 inlined
		b.ew(z, sum(len(z11)), z11...)
		b.output(y, z)
		run(t, b.g, inlineProducers)
		if len(b.g.Ops) != 3 || len(b.g.Ops[1].In) != 12 || len(b.g.Ops[2].In) != 11 {
			t.Errorf("ops %q: want p inlined into y (12 inputs) and not into z (11 inputs, 13 inlined)", kinds(b.g))
			for _, op := range b.g.Ops {
				t.Logf("%s: %d inputs", op.Out.Buf.Name, len(op.In))
			}
		}
	})
	t.Run("a slice of the producer is not inlined", func(t *testing.T) {
		b := newBuilder()
		x := b.input("x", ir.F32, 8)
		a, y := b.temp("a", ir.F32, 8), b.temp("y", ir.F32, 4)
		b.ew(a, castF32(ir.Apply(ir.ENeg, ir.Load(0))), x)
		b.ew(y, castF32(ir.Apply(ir.EAbs, ir.Load(0))), strided(a, 4, sh(4), sh(1)))
		b.output(y)
		run(t, b.g, inlineProducers)
		if len(b.g.Ops) != 2 {
			t.Errorf("ops %q, want both: y reads half of a", kinds(b.g))
		}
	})
}

func TestFoldRepeatedCat(t *testing.T) {
	// RoPE's angles: emb = cat(freqs, freqs) along the last dim, cos and sin of it.
	build := func(extraReader bool) (*builder, ir.View, *ir.Op, *ir.Op) {
		b := newBuilder()
		freqs := b.input("freqs", ir.F32, 1, 1, 4)
		emb, cs, sn := b.temp("emb", ir.F32, 1, 1, 8), b.temp("cos", ir.F32, 1, 1, 8), b.temp("sin", ir.F32, 1, 1, 8)
		cat := b.op(ir.Cat, emb, freqs, freqs)
		cat.Attr.Dim = 2
		c := b.ew(cs, castF32(ir.Apply(ir.ECos, ir.Load(0))), emb)
		s := b.ew(sn, castF32(ir.Apply(ir.ESin, ir.Load(0))), emb)
		b.output(cs, sn)
		if extraReader {
			ext := b.temp("ext", ir.I32, 1)
			b.op(ir.MaskExtent, ext, strided(emb, 0, sh(1), sh(1)))
			b.output(ext)
		}
		return b, freqs, c, s
	}
	t.Run("read only by elementwise ops, it folds", func(t *testing.T) {
		b, freqs, c, s := build(false)
		run(t, b.g, foldRepeatedCat)
		if got := kinds(b.g); got != "elementwise elementwise" {
			t.Fatalf("ops %q, want the cat gone", got)
		}
		for _, op := range []*ir.Op{c, s} {
			in, out := op.In[0], op.Out
			if in.Buf != freqs.Buf || !equalShape(in.Shape, sh(1, 1, 2, 4)) || in.Strides[2] != 0 || in.Strides[3] != 1 ||
				!equalShape(out.Shape, sh(1, 1, 2, 4)) || out.Strides[2] != 4 || !out.IsWhole() {
				t.Errorf("%s reads %v into %v, want freqs [1 1 2 4] repeated (stride 0) into its whole [1 1 2 4]", out.Buf.Name, in, out)
			}
		}
	})
	t.Run("another kind of reader keeps it", func(t *testing.T) {
		b, _, _, _ := build(true)
		run(t, b.g, foldRepeatedCat)
		if got := kinds(b.g); got != "cat elementwise elementwise mask_extent" {
			t.Errorf("ops %q, want the cat kept", got)
		}
	})
}

func TestOuterProductIsElementwise(t *testing.T) {
	l := &lowerer{g: &ir.Graph{}, node: &wire.Node{Name: "freqs"}}
	inv := l.g.NewTemp("inv", ir.F32, []int64{1, 4, 1})
	pos := l.g.NewTemp("pos", ir.F32, []int64{1, 1, 3})
	out := l.matmul(inv, pos)
	if len(l.g.Ops) != 1 || l.g.Ops[0].Kind != ir.Elementwise {
		t.Fatalf("ops %q, want one elementwise op", kinds(l.g))
	}
	op := l.g.Ops[0]
	if got, want := op.Attr.Expr.String(), "float32(mul(in0,in1))"; got != want {
		t.Errorf("expr %s, want %s", got, want)
	}
	if !equalShape(out.Shape, sh(1, 4, 3)) || op.In[0].Strides[2] != 0 || op.In[0].Strides[1] != 1 || op.In[1].Strides[1] != 0 || op.In[1].Strides[2] != 1 {
		t.Errorf("out %v from %v and %v: want inv broadcast along the columns and pos along the rows", out, op.In[0], op.In[1])
	}
	mm := &lowerer{g: &ir.Graph{}, node: &wire.Node{Name: "mm"}}
	mm.matmul(mm.g.NewTemp("a", ir.F32, []int64{1, 4, 2}), mm.g.NewTemp("b", ir.F32, []int64{1, 2, 3}))
	if got := kinds(mm.g); got != "matmul" {
		t.Errorf("K = 2: ops %q, want a matmul", got)
	}
}
