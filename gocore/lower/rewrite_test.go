package lower

import (
	"reflect"
	"testing"

	"mpk/gocore/ir"
)

func castF32(e *ir.Expr) *ir.Expr { return ir.Cast(ir.F32, e) }
func add(a, b *ir.Expr) *ir.Expr  { return ir.Apply(ir.EAdd, a, b) }
func mul(a, b *ir.Expr) *ir.Expr  { return ir.Apply(ir.EMul, a, b) }

func TestDeadCode(t *testing.T) {
	cases := []struct {
		name  string
		build func(b *builder)
		want  []string // Node names of surviving ops
	}{
		{"unused temp dies", func(b *builder) {
			x := b.input("x", ir.F32, 4)
			y, z := b.temp("y", ir.F32, 4), b.temp("z", ir.F32, 4)
			b.ew(y, castF32(ir.Apply(ir.EExp, ir.Load(0))), x)
			b.ew(z, castF32(ir.Apply(ir.ENeg, ir.Load(0))), x)
			b.output(y)
		}, []string{"n0"}},
		{"writes into inputs stay, with what they read", func(b *builder) {
			x, cache := b.input("x", ir.F32, 4), b.input("cache", ir.F32, 4)
			y := b.temp("y", ir.F32, 4)
			b.ew(y, castF32(ir.Apply(ir.EExp, ir.Load(0))), x)
			b.op(ir.Copy, cache, y)
		}, []string{"n0", "n1"}},
		{"chain feeding an output stays", func(b *builder) {
			x := b.input("x", ir.F32, 4)
			y, z := b.temp("y", ir.F32, 4), b.temp("z", ir.F32, 4)
			b.ew(y, castF32(ir.Apply(ir.EExp, ir.Load(0))), x)
			b.ew(z, castF32(ir.Apply(ir.ENeg, ir.Load(0))), y)
			b.output(z)
		}, []string{"n0", "n1"}},
		{"every writer of a needed buffer stays", func(b *builder) {
			x := b.input("x", ir.F32, 4)
			y, z := b.temp("y", ir.F32, 4), b.temp("z", ir.F32, 4)
			b.ew(strided(y, 0, sh(2), sh(1)), ir.Const(1))
			b.ew(strided(y, 2, sh(2), sh(1)), castF32(ir.Load(0)), strided(x, 0, sh(2), sh(1)))
			b.ew(z, castF32(ir.Apply(ir.ENeg, ir.Load(0))), y)
			b.output(z)
		}, []string{"n0", "n1", "n2"}},
		{"a writer after the last reader stays (buffers are needed whole)", func(b *builder) {
			x := b.input("x", ir.F32, 4)
			y, z := b.temp("y", ir.F32, 4), b.temp("z", ir.F32, 4)
			b.ew(y, castF32(ir.Load(0)), x)
			b.ew(z, castF32(ir.Apply(ir.ENeg, ir.Load(0))), y)
			b.ew(strided(y, 0, sh(2), sh(1)), ir.Const(1))
			b.output(z)
		}, []string{"n0", "n1", "n2"}},
		{"nothing needed: all die", func(b *builder) {
			x := b.input("x", ir.F32, 4)
			y := b.temp("y", ir.F32, 4)
			b.ew(y, castF32(ir.Load(0)), x)
		}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := newBuilder()
			c.build(b)
			run(t, b.g, deadCode)
			var got []string
			for _, op := range b.g.Ops {
				got = append(got, op.Node)
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("surviving ops %v, want %v", got, c.want)
			}
		})
	}
}

// kvUpdate builds functionalized index_copy: copy(cache → T); index_copy
// into T; copy_(cache ← T); between, if non-nil, adds ops after the first copy.
func kvUpdate(b *builder, between func(b *builder, cache ir.View)) (cache ir.View, kv *ir.Op) {
	cache = b.input("cache", ir.F32, 1, 4, 2)
	pos := b.input("pos", ir.I64, 1)
	src := b.input("src", ir.F32, 1, 1, 2)
	t := b.temp("T", ir.F32, 1, 4, 2)
	b.op(ir.Copy, t, cache)
	if between != nil {
		between(b, cache)
	}
	kv = b.op(ir.KVWrite, t, pos, src)
	kv.Attr.Dim = 1
	b.op(ir.Copy, cache, t)
	return cache, kv
}

func TestInPlace(t *testing.T) {
	t.Run("cache update aliases into the input", func(t *testing.T) {
		b := newBuilder()
		cache, kv := kvUpdate(b, nil)
		run(t, b.g, inPlace)
		if got := kinds(b.g); got != "kv_write" {
			t.Fatalf("ops %q, want one kv_write", got)
		}
		if kv.Out.Buf != cache.Buf {
			t.Errorf("kv_write writes %s, want the cache", kv.Out.Buf.Name)
		}
	})
	t.Run("another reader of the input in between blocks it", func(t *testing.T) {
		b := newBuilder()
		var reader *ir.Op
		_, kv := kvUpdate(b, func(b *builder, cache ir.View) {
			y := b.temp("y", ir.F32, 1, 4, 2)
			reader = b.ew(y, castF32(ir.Apply(ir.EExp, ir.Load(0))), cache)
			b.output(y)
		})
		run(t, b.g, inPlace)
		if got := kinds(b.g); got != "copy elementwise kv_write copy" {
			t.Fatalf("ops %q, want the graph unchanged", got)
		}
		if kv.Out.Buf.Name != "T" || reader.In[0].Buf.Name != "cache" {
			t.Errorf("buffers rewritten: kv_write writes %s, reader reads %s", kv.Out.Buf.Name, reader.In[0].Buf.Name)
		}
	})
	t.Run("temporary that is a graph output is kept", func(t *testing.T) {
		b := newBuilder()
		kvUpdate(b, nil)
		b.output(b.g.Ops[1].Out)
		run(t, b.g, inPlace)
		if got := kinds(b.g); got != "copy kv_write copy" {
			t.Fatalf("ops %q, want the graph unchanged", got)
		}
	})
	t.Run("elementwise reading its own element aliases", func(t *testing.T) {
		b := newBuilder()
		ctr := b.input("ctr", ir.I64, 1)
		t1 := b.temp("t", ir.I64, 1)
		inc := b.ew(t1, ir.Cast(ir.I64, add(ir.Load(0), ir.Const(1))), ctr)
		b.op(ir.Copy, ctr, t1)
		run(t, b.g, inPlace)
		if got := kinds(b.g); got != "elementwise" || inc.Out.Buf != ctr.Buf || inc.In[0].Buf != ctr.Buf {
			t.Errorf("ops %q, out %v; want one elementwise writing ctr in place", got, inc.Out)
		}
	})
	t.Run("elementwise reading other elements of the input does not alias", func(t *testing.T) {
		b := newBuilder()
		x := b.input("x", ir.F32, 2, 2)
		t1 := b.temp("t", ir.F32, 2, 2)
		tr := b.ew(t1, castF32(ir.Load(0)), strided(x, 0, sh(2, 2), sh(1, 2)))
		b.op(ir.Copy, x, t1)
		run(t, b.g, inPlace)
		if got := kinds(b.g); got != "elementwise copy" || tr.Out.Buf.Name != "t" {
			t.Errorf("ops %q, transpose writes %s; an in-place transpose would race", got, tr.Out.Buf.Name)
		}
	})
	t.Run("write into the input after the copy blocks it", func(t *testing.T) {
		b := newBuilder()
		cache, _ := kvUpdate(b, nil)
		b.op(ir.Copy, cache, b.input("other", ir.F32, 1, 4, 2))
		run(t, b.g, inPlace)
		if got := kinds(b.g); got != "copy kv_write copy copy" {
			t.Errorf("ops %q, want the graph unchanged", got)
		}
	})
}

// repeatKV builds repeat_kv of a [B, Hkv, S, D] cache by g: an expanded view
// copied into a [B, Hkv, g, S, D] temporary read as [B, Hkv·g, S, D].
func repeatKV(b *builder, name string, cache ir.View, g int64) ir.View {
	B, H, S, D := cache.Shape[0], cache.Shape[1], cache.Shape[2], cache.Shape[3]
	exp := strided(cache, 0, sh(B, H, g, S, D), sh(cache.Strides[0], cache.Strides[1], 0, cache.Strides[2], cache.Strides[3]))
	t := b.temp(name, cache.DType(), B, H, g, S, D)
	b.op(ir.Copy, t, exp)
	return strided(t, 0, sh(B, H*g, S, D), ir.ContiguousStrides(sh(B, H*g, S, D)))
}

func TestGroupedQueryAttention(t *testing.T) {
	t.Run("repeat_kv copies die", func(t *testing.T) {
		b := newBuilder()
		q := b.input("q", ir.F32, 1, 4, 1, 8)
		k, v := b.input("k", ir.F32, 1, 2, 3, 8), b.input("v", ir.F32, 1, 2, 3, 8)
		kr, vr := repeatKV(b, "kr", k, 2), repeatKV(b, "vr", v, 2)
		o := b.temp("o", ir.F32, 1, 4, 1, 8)
		at := b.op(ir.Attention, o, q, kr, vr)
		at.Attr.Groups = 1
		b.output(o)
		run(t, b.g, groupedQueryAttention)
		if got := kinds(b.g); got != "attention" {
			t.Fatalf("ops %q, want only attention", got)
		}
		if at.Attr.Groups != 2 {
			t.Errorf("groups %d, want 2", at.Attr.Groups)
		}
		for i, c := range []ir.View{k, v} {
			if got := at.In[1+i]; !sameLayout(got, c) {
				t.Errorf("attention input %d is %v, want the cache %v", 1+i, got, c)
			}
		}
	})
	t.Run("plain copy is left alone", func(t *testing.T) {
		b := newBuilder()
		q := b.input("q", ir.F32, 1, 2, 1, 8)
		k, v := b.input("k", ir.F32, 1, 2, 3, 8), b.input("v", ir.F32, 1, 2, 3, 8)
		kc, vc := b.temp("kc", ir.F32, 1, 2, 3, 8), b.temp("vc", ir.F32, 1, 2, 3, 8)
		b.op(ir.Copy, kc, k)
		b.op(ir.Copy, vc, v)
		o := b.temp("o", ir.F32, 1, 2, 1, 8)
		at := b.op(ir.Attention, o, q, kc, vc)
		at.Attr.Groups = 1
		b.output(o)
		run(t, b.g, groupedQueryAttention)
		if got := kinds(b.g); got != "copy copy attention" || at.Attr.Groups != 1 || at.In[1].Buf != kc.Buf {
			t.Errorf("ops %q groups %d k=%v; want the graph unchanged", got, at.Attr.Groups, at.In[1])
		}
	})
	t.Run("different K and V groups are left alone", func(t *testing.T) {
		b := newBuilder()
		q := b.input("q", ir.F32, 1, 4, 1, 8)
		k, v := b.input("k", ir.F32, 1, 2, 3, 8), b.input("v", ir.F32, 1, 1, 3, 8)
		kr, vr := repeatKV(b, "kr", k, 2), repeatKV(b, "vr", v, 4)
		o := b.temp("o", ir.F32, 1, 4, 1, 8)
		at := b.op(ir.Attention, o, q, kr, vr)
		at.Attr.Groups = 1
		b.output(o)
		run(t, b.g, groupedQueryAttention)
		if got := kinds(b.g); got != "copy copy attention" || at.Attr.Groups != 1 {
			t.Errorf("ops %q groups %d; want the graph unchanged", got, at.Attr.Groups)
		}
	})
}

func TestPermutedStrides(t *testing.T) {
	buf := &ir.Buffer{Name: "T", Numel: 24}
	dst := &ir.Buffer{Name: "D", Numel: 24}
	cases := []struct {
		name          string
		out, src, dst ir.View
		want          []int64 // nil: cannot fold
	}{
		{"identity", ir.View{Buf: buf, Shape: sh(2, 3, 4), Strides: sh(12, 4, 1)},
			ir.View{Buf: buf, Shape: sh(2, 3, 4), Strides: sh(12, 4, 1)},
			ir.View{Buf: dst, Shape: sh(2, 3, 4), Strides: sh(12, 4, 1)}, sh(12, 4, 1)},
		{"transpose(1,2)", ir.View{Buf: buf, Shape: sh(1, 2, 3, 4), Strides: sh(24, 12, 4, 1)},
			ir.View{Buf: buf, Shape: sh(1, 3, 2, 4), Strides: sh(24, 4, 12, 1)},
			ir.View{Buf: dst, Shape: sh(1, 3, 2, 4), Strides: sh(24, 8, 4, 1)}, sh(0, 4, 8, 1)},
		{"square transpose", ir.View{Buf: buf, Shape: sh(2, 2), Strides: sh(2, 1)},
			ir.View{Buf: buf, Shape: sh(2, 2), Strides: sh(1, 2)},
			ir.View{Buf: dst, Shape: sh(2, 2), Strides: sh(2, 1)}, sh(1, 2)},
		{"source with offset", ir.View{Buf: buf, Shape: sh(2, 3), Strides: sh(3, 1)},
			ir.View{Buf: buf, Offset: 1, Shape: sh(3, 2), Strides: sh(1, 3)},
			ir.View{Buf: dst, Shape: sh(3, 2), Strides: sh(2, 1)}, nil},
		{"source is a slice", ir.View{Buf: buf, Shape: sh(2, 4), Strides: sh(4, 1)},
			ir.View{Buf: buf, Shape: sh(2, 2), Strides: sh(4, 1)},
			ir.View{Buf: dst, Shape: sh(2, 2), Strides: sh(2, 1)}, nil},
		{"source is not a permutation", ir.View{Buf: buf, Shape: sh(4, 6), Strides: sh(6, 1)},
			ir.View{Buf: buf, Shape: sh(6, 4), Strides: sh(4, 1)},
			ir.View{Buf: dst, Shape: sh(6, 4), Strides: sh(4, 1)}, nil},
	}
	for _, c := range cases {
		got, ok := permutedStrides(c.out, c.src, c.dst)
		if c.want == nil {
			if ok {
				t.Errorf("%s: folded with strides %v, want no fold", c.name, got)
			}
			continue
		}
		if !ok || !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: %v, %v; want %v", c.name, got, ok, c.want)
		}
	}
}

func TestFoldCopies(t *testing.T) {
	build := func(extraReader bool) (*builder, *ir.Op, ir.View) {
		b := newBuilder()
		q := b.input("q", ir.F32, 1, 2, 3, 4)
		o := b.temp("o", ir.F32, 1, 2, 3, 4)
		at := b.op(ir.Attention, o, q, q, q)
		at.Attr.Groups = 1
		c := b.temp("c", ir.F32, 1, 3, 2, 4)
		b.op(ir.Copy, c, strided(o, 0, sh(1, 3, 2, 4), sh(24, 4, 12, 1)))
		b.output(c)
		if extraReader {
			b.output(o)
		}
		return b, at, c
	}
	t.Run("transpose copy folds into the producer", func(t *testing.T) {
		b, at, c := build(false)
		run(t, b.g, foldCopies)
		if got := kinds(b.g); got != "attention" {
			t.Fatalf("ops %q, want only attention", got)
		}
		want := ir.View{Buf: c.Buf, Shape: sh(1, 2, 3, 4), Strides: sh(0, 4, 8, 1)}
		if !sameLayout(at.Out, want) || at.Out.Offset != 0 {
			t.Errorf("attention writes %v, want %v", at.Out, want)
		}
	})
	t.Run("destination read before the copy overwrites it", func(t *testing.T) {
		b := newBuilder()
		x := b.input("x", ir.F32, 2, 2)
		c := b.temp("c", ir.F32, 2, 2)
		b.ew(c, ir.Const(1))
		tt := b.temp("t", ir.F32, 2, 2)
		b.ew(tt, castF32(ir.Apply(ir.EExp, ir.Load(0))), x)
		y := b.temp("y", ir.F32, 2, 2)
		reader := b.ew(y, castF32(ir.Apply(ir.ENeg, ir.Load(0))), c)
		b.op(ir.Copy, c, strided(tt, 0, sh(2, 2), sh(1, 2)))
		b.output(c, y)
		run(t, b.g, foldCopies)
		if got := kinds(b.g); got != "elementwise elementwise elementwise copy" {
			t.Fatalf("foldCopies moves the copy's whole write of temp c up to the producer of t without checking "+
				"that no op between them reads or writes c; here y = -c now reads exp(x)ᵀ instead of 1 (ops %q, reader %v). "+
				"Not reachable from Lower today (every Copy into a temporary writes a fresh one), but nothing enforces that", got, reader.In[0])
		}
	})
	t.Run("producer output read elsewhere", func(t *testing.T) {
		b, at, _ := build(true)
		run(t, b.g, foldCopies)
		if got := kinds(b.g); got != "attention copy" || at.Out.Buf.Name != "o" {
			t.Errorf("ops %q, attention writes %s; want the graph unchanged", got, at.Out.Buf.Name)
		}
	})
}

func TestFuseElementwise(t *testing.T) {
	t.Run("cast then square fuse", func(t *testing.T) {
		b := newBuilder()
		x := b.input("x", ir.BF16, 2, 4)
		a, s := b.temp("a", ir.F32, 2, 4), b.temp("s", ir.F32, 2, 4)
		b.ew(a, castF32(ir.Load(0)), x)
		c := b.ew(s, castF32(ir.Apply(ir.EPow, ir.Load(0), ir.Const(2))), a)
		b.output(s)
		run(t, b.g, fuseElementwise)
		if got := kinds(b.g); got != "elementwise" {
			t.Fatalf("ops %q, want one elementwise", got)
		}
		if got, want := c.Attr.Expr.String(), "float32(pow(float32(in0),2))"; got != want || len(c.In) != 1 || c.In[0].Buf != x.Buf {
			t.Errorf("fused %s over %v, want %s over x", got, c.In, want)
		}
	})
	t.Run("chain of three fuses over several sweeps", func(t *testing.T) {
		b := newBuilder()
		x, y := b.input("x", ir.F32, 4), b.input("y", ir.F32, 4)
		a, s, m := b.temp("a", ir.F32, 4), b.temp("s", ir.F32, 4), b.temp("m", ir.F32, 4)
		b.ew(a, castF32(ir.Apply(ir.ENeg, ir.Load(0))), x)
		b.ew(s, castF32(ir.Apply(ir.ESilu, ir.Load(0))), a)
		c := b.ew(m, castF32(mul(ir.Load(0), ir.Load(1))), s, y)
		b.output(m)
		run(t, b.g, fuseElementwise)
		if got := kinds(b.g); got != "elementwise" {
			t.Fatalf("ops %q, want one elementwise", got)
		}
		if got, want := c.Attr.Expr.String(), "float32(mul(float32(silu(float32(neg(in1)))),in0))"; got != want {
			t.Errorf("fused %s, want %s", got, want)
		}
		if len(c.In) != 2 || c.In[0].Buf != y.Buf || c.In[1].Buf != x.Buf {
			t.Errorf("fused inputs %v, want [y x]", c.In)
		}
	})
	t.Run("consumer reading the producer twice", func(t *testing.T) {
		b := newBuilder()
		x := b.input("x", ir.F32, 4)
		a, s := b.temp("a", ir.F32, 4), b.temp("s", ir.F32, 4)
		b.ew(a, castF32(ir.Apply(ir.EExp, ir.Load(0))), x)
		c := b.ew(s, castF32(mul(ir.Load(0), ir.Load(1))), a, a)
		b.output(s)
		run(t, b.g, fuseElementwise)
		if got, want := c.Attr.Expr.String(), "float32(mul(float32(exp(in0)),float32(exp(in0))))"; kinds(b.g) != "elementwise" || got != want || len(c.In) != 1 {
			t.Errorf("ops %q, fused %s over %d inputs; want %s over x", kinds(b.g), got, len(c.In), want)
		}
	})
	t.Run("producer input written in between", func(t *testing.T) {
		b := newBuilder()
		x := b.input("x", ir.F32, 4)
		a, s := b.temp("a", ir.F32, 4), b.temp("s", ir.F32, 4)
		b.ew(a, castF32(ir.Apply(ir.EExp, ir.Load(0))), x)
		b.op(ir.Copy, x, b.input("z", ir.F32, 4))
		b.ew(s, castF32(ir.Apply(ir.ENeg, ir.Load(0))), a)
		b.output(s)
		run(t, b.g, fuseElementwise)
		if got := kinds(b.g); got != "elementwise copy elementwise" {
			t.Errorf("ops %q: fusing would read x after it is overwritten", got)
		}
	})
	t.Run("consumer broadcasts the producer", func(t *testing.T) {
		b := newBuilder()
		x := b.input("x", ir.F32, 4)
		a, s := b.temp("a", ir.F32, 4), b.temp("s", ir.F32, 3, 4)
		b.ew(a, castF32(ir.Apply(ir.EExp, ir.Load(0))), x)
		b.ew(s, castF32(ir.Apply(ir.ENeg, ir.Load(0))), strided(a, 0, sh(3, 4), sh(0, 1)))
		b.output(s)
		run(t, b.g, fuseElementwise)
		if got := kinds(b.g); got != "elementwise elementwise" {
			t.Errorf("ops %q: fusing a broadcast read recomputes the producer per row", got)
		}
	})
	t.Run("producer with two readers", func(t *testing.T) {
		b := newBuilder()
		x := b.input("x", ir.F32, 4)
		a, s, u := b.temp("a", ir.F32, 4), b.temp("s", ir.F32, 4), b.temp("u", ir.F32, 4)
		b.ew(a, castF32(ir.Apply(ir.EExp, ir.Load(0))), x)
		b.ew(s, castF32(ir.Apply(ir.ENeg, ir.Load(0))), a)
		b.ew(u, castF32(ir.Apply(ir.ESin, ir.Load(0))), a)
		b.output(s, u)
		run(t, b.g, fuseElementwise)
		if got := kinds(b.g); got != "elementwise elementwise elementwise" {
			t.Errorf("ops %q, want no fusion", got)
		}
	})
	t.Run("producer output is a graph output", func(t *testing.T) {
		b := newBuilder()
		x := b.input("x", ir.F32, 4)
		a, s := b.temp("a", ir.F32, 4), b.temp("s", ir.F32, 4)
		b.ew(a, castF32(ir.Apply(ir.EExp, ir.Load(0))), x)
		b.ew(s, castF32(ir.Apply(ir.ENeg, ir.Load(0))), a)
		b.output(s, a)
		run(t, b.g, fuseElementwise)
		if got := kinds(b.g); got != "elementwise elementwise" {
			t.Errorf("ops %q, want no fusion", got)
		}
	})
}
