package lower

import (
	"testing"

	"mpk/gocore/ir"
	"mpk/gocore/wire"
)

// normOpts shapes the HF RMSNorm graph as fuse_elementwise leaves it:
// S = x² (pow or mul); M = mean(S, -1, keepdim); then either
// out = x·rsqrt(M+eps)·w inline, or R = rsqrt(M+eps) first and out = x·R·w.
type normOpts struct {
	mulSquare  bool
	separate   bool
	noWeight   bool
	bf16X      bool                            // x is bf16, upcast by its own cast op
	reduce     string                          // "" means "mean"
	inv        func(m *ir.Expr) *ir.Expr       // builds the inverse RMS from a load of M; nil: rsqrt(M + 1e-6)
	product    func(x, r, w *ir.Expr) *ir.Expr // nil: (x·r)·w
	scaleOther bool                            // the product scales some y instead of x
}

func normGraph(o normOpts) (b *builder, x, w ir.View, e *ir.Op) {
	b = newBuilder()
	var xin ir.View
	if o.bf16X {
		xin = b.input("x16", ir.BF16, 2, 8)
		x = b.temp("x", ir.F32, 2, 8)
		b.ew(x, castF32(ir.Load(0)), xin)
	} else {
		x = b.input("x", ir.F32, 2, 8)
	}
	w = strided(b.param("w", ir.F32, 8), 0, sh(2, 8), sh(0, 1))
	s := b.temp("S", ir.F32, 2, 8)
	sq := castF32(ir.Apply(ir.EPow, ir.Load(0), ir.Const(2)))
	if o.mulSquare {
		sq = castF32(mul(ir.Load(0), ir.Load(0)))
	}
	b.ew(s, sq, x)
	m := b.temp("M", ir.F32, 2, 1)
	red := b.op(ir.Reduce, strided(m, 0, sh(2), sh(1)), s)
	red.Attr.Reduce, red.Attr.Dims = "mean", 1
	if o.reduce != "" {
		red.Attr.Reduce = o.reduce
	}
	inv := o.inv
	if inv == nil {
		inv = func(m *ir.Expr) *ir.Expr { return ir.Apply(ir.ERsqrt, add(m, ir.Const(1e-6))) }
	}
	prod := o.product
	if prod == nil {
		prod = func(x, r, w *ir.Expr) *ir.Expr { return mul(castF32(mul(x, r)), w) }
	}
	rin := strided(m, 0, sh(2, 8), sh(1, 0))
	rexpr := inv(ir.Load(1))
	if o.separate {
		r := b.temp("R", ir.F32, 2, 1)
		b.ew(r, castF32(inv(ir.Load(0))), m)
		rin, rexpr = strided(r, 0, sh(2, 8), sh(1, 0)), ir.Load(1)
	}
	xs := x
	if o.scaleOther {
		xs = b.input("y", ir.F32, 2, 8)
	}
	out := b.temp("out", ir.F32, 2, 8)
	if o.noWeight {
		e = b.ew(out, castF32(prod(ir.Load(0), rexpr, nil)), xs, rin)
	} else {
		e = b.ew(out, castF32(prod(ir.Load(0), rexpr, ir.Load(2))), xs, rin, w)
	}
	b.output(out)
	if o.bf16X {
		x = xin
	}
	return b, x, w, e
}

func TestRMSNorm(t *testing.T) {
	cases := []struct {
		name string
		o    normOpts
		eps  float64 // want a match with this eps
		miss string  // want no match: the ops left
	}{
		{"pow, inline, (x·r)·w", normOpts{}, 1e-6, ""},
		{"mul square", normOpts{mulSquare: true}, 1e-6, ""},
		{"separate rsqrt op", normOpts{separate: true}, 1e-6, ""},
		{"separate rsqrt, mul square", normOpts{separate: true, mulSquare: true}, 1e-6, ""},
		{"w·(r·x)", normOpts{product: func(x, r, w *ir.Expr) *ir.Expr { return mul(w, castF32(mul(r, x))) }}, 1e-6, ""},
		{"r·(w·x)", normOpts{product: func(x, r, w *ir.Expr) *ir.Expr { return mul(r, mul(w, x)) }}, 1e-6, ""},
		{"eps + mean", normOpts{inv: func(m *ir.Expr) *ir.Expr { return ir.Apply(ir.ERsqrt, add(ir.Const(1e-5), m)) }}, 1e-5, ""},
		{"no eps", normOpts{inv: func(m *ir.Expr) *ir.Expr { return ir.Apply(ir.ERsqrt, m) }}, 0, ""},
		{"no weight", normOpts{noWeight: true, product: func(x, r, _ *ir.Expr) *ir.Expr { return mul(r, x) }}, 1e-6, ""},
		{"bf16 x upcast for the norm", normOpts{bf16X: true}, 1e-6, ""},

		{"mean - eps", normOpts{inv: func(m *ir.Expr) *ir.Expr { return ir.Apply(ir.ERsqrt, ir.Apply(ir.ESub, m, ir.Const(1e-6))) }}, 0,
			"elementwise reduce elementwise"},
		{"mean · 2", normOpts{inv: func(m *ir.Expr) *ir.Expr { return ir.Apply(ir.ERsqrt, mul(m, ir.Const(2))) }}, 0,
			"elementwise reduce elementwise"},
		{"sqrt instead of rsqrt", normOpts{inv: func(m *ir.Expr) *ir.Expr { return ir.Apply(ir.ESqrt, add(m, ir.Const(1e-6))) }}, 0,
			"elementwise reduce elementwise"},
		{"sum instead of mean", normOpts{reduce: "sum"}, 0, "elementwise reduce elementwise"},
		{"scales a different tensor", normOpts{scaleOther: true}, 0, "elementwise reduce elementwise"},
		{"scales a different tensor, separate", normOpts{scaleOther: true, separate: true}, 0, "elementwise reduce elementwise elementwise"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b, x, w, e := normGraph(c.o)
			run(t, b.g, rmsNorm)
			got := kinds(b.g)
			if c.miss != "" {
				if got != c.miss {
					t.Errorf("ops %q, want no match (%q)", got, c.miss)
				}
				return
			}
			if got != "rmsnorm" {
				t.Fatalf("ops %q, want one rmsnorm", got)
			}
			if e.Attr.Eps != c.eps || e.Attr.HasWeight == c.o.noWeight {
				t.Errorf("eps %g weight %v, want %g %v", e.Attr.Eps, e.Attr.HasWeight, c.eps, !c.o.noWeight)
			}
			if !sameLayout(e.In[0], x) {
				t.Errorf("norm reads x=%v, want %v", e.In[0], x)
			}
			if !c.o.noWeight && (len(e.In) != 2 || !sameLayout(e.In[1], w)) {
				t.Errorf("norm inputs %v, want weight %v", e.In, w)
			}
		})
	}
}

// ropeGraph builds x·cos + cat(-x[..., 2:], x[..., :2])·sin as fusion leaves it.
// halves picks the views negated and kept; expr combines loads of x, cos, cat, sin.
func ropeGraph(halves func(b *builder, x ir.View) (neg, keep ir.View), expr func(x, c, r, s *ir.Expr) *ir.Expr, xCos func(b *builder, x ir.View) ir.View) (*builder, ir.View, ir.View, ir.View, *ir.Op) {
	b := newBuilder()
	x := b.input("x", ir.F32, 1, 2, 1, 4)
	cos := strided(b.input("cos", ir.F32, 1, 1, 1, 4), 0, sh(1, 2, 1, 4), sh(4, 0, 4, 1))
	sin := strided(b.input("sin", ir.F32, 1, 1, 1, 4), 0, sh(1, 2, 1, 4), sh(4, 0, 4, 1))
	neg, keep := strided(x, 2, sh(1, 2, 1, 2), x.Strides), strided(x, 0, sh(1, 2, 1, 2), x.Strides)
	if halves != nil {
		neg, keep = halves(b, x)
	}
	n := b.temp("neg", ir.F32, 1, 2, 1, 2)
	b.ew(n, castF32(ir.Apply(ir.ENeg, ir.Load(0))), neg)
	c := b.temp("cat", ir.F32, 1, 2, 1, 4)
	b.op(ir.Cat, c, n, keep).Attr.Dim = 3
	out := b.temp("out", ir.F32, 1, 2, 1, 4)
	if expr == nil {
		expr = func(x, c, r, s *ir.Expr) *ir.Expr { return add(mul(x, c), mul(r, s)) }
	}
	xc := x
	if xCos != nil {
		xc = xCos(b, x)
	}
	e := b.ew(out, castF32(expr(ir.Load(0), ir.Load(1), ir.Load(2), ir.Load(3))), xc, cos, c, sin)
	b.output(out)
	return b, x, cos, sin, e
}

func TestRoPE(t *testing.T) {
	other := func(b *builder, x ir.View) (ir.View, ir.View) {
		y := b.input("y", ir.F32, 1, 2, 1, 4)
		return strided(y, 2, sh(1, 2, 1, 2), y.Strides), strided(x, 0, sh(1, 2, 1, 2), x.Strides)
	}
	cases := []struct {
		name   string
		halves func(b *builder, x ir.View) (ir.View, ir.View)
		expr   func(x, c, r, s *ir.Expr) *ir.Expr
		xCos   func(b *builder, x ir.View) ir.View
		match  bool
	}{
		{"HF rotate_half", nil, nil, nil, true},
		{"terms swapped", nil, func(x, c, r, s *ir.Expr) *ir.Expr { return add(mul(r, s), mul(x, c)) }, nil, true},
		{"factors swapped", nil, func(x, c, r, s *ir.Expr) *ir.Expr { return add(mul(c, x), mul(s, r)) }, nil, true},
		{"bf16 casts inside", nil, func(x, c, r, s *ir.Expr) *ir.Expr {
			return add(ir.Cast(ir.BF16, mul(x, c)), ir.Cast(ir.BF16, mul(r, ir.Cast(ir.BF16, s))))
		}, nil, true}, // factors look through float casts
		{"halves in the wrong order", func(b *builder, x ir.View) (ir.View, ir.View) {
			return strided(x, 0, sh(1, 2, 1, 2), x.Strides), strided(x, 2, sh(1, 2, 1, 2), x.Strides)
		}, nil, nil, false},
		{"halves of different tensors", other, nil, nil, false},
		{"cos term scales another tensor", nil, nil, func(b *builder, x ir.View) ir.View { return b.input("z", ir.F32, 1, 2, 1, 4) }, false},
		{"difference instead of sum", nil, func(x, c, r, s *ir.Expr) *ir.Expr { return ir.Apply(ir.ESub, mul(x, c), mul(r, s)) }, nil, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b, x, cos, sin, e := ropeGraph(c.halves, c.expr, c.xCos)
			run(t, b.g, rope)
			got := kinds(b.g)
			if !c.match {
				if got != "elementwise cat elementwise" {
					t.Errorf("ops %q, want no match", got)
				}
				return
			}
			if got != "rope" {
				t.Fatalf("ops %q, want one rope", got)
			}
			if len(e.In) != 3 || !sameLayout(e.In[0], x) || !sameLayout(e.In[1], cos) || !sameLayout(e.In[2], sin) {
				t.Errorf("rope reads %v, want [x cos sin]", e.In)
			}
		})
	}
}

func TestLinear(t *testing.T) {
	cases := []struct {
		name  string
		w     func(b *builder) ir.View // the [1, K, N] right operand
		batch int64
		match bool
	}{
		{"mm(x, t(W))", func(b *builder) ir.View { return strided(b.param("W", ir.F32, 3, 4), 0, sh(1, 4, 3), sh(0, 1, 4)) }, 1, true},
		{"one output column", func(b *builder) ir.View { return strided(b.param("W", ir.F32, 1, 4), 0, sh(1, 4, 1), sh(0, 1, 4)) }, 1, true},
		{"mm(x, W) untransposed", func(b *builder) ir.View { return strided(b.param("W", ir.F32, 4, 3), 0, sh(1, 4, 3), sh(0, 3, 1)) }, 1, false},
		{"right operand is a temporary", func(b *builder) ir.View {
			w := b.temp("W", ir.F32, 3, 4)
			b.ew(w, ir.Const(1))
			return strided(w, 0, sh(1, 4, 3), sh(0, 1, 4))
		}, 1, false},
		{"batched", func(b *builder) ir.View { return strided(b.param("W", ir.F32, 2, 3, 4), 0, sh(2, 4, 3), sh(12, 1, 4)) }, 2, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := newBuilder()
			x := b.input("x", ir.F32, c.batch, 2, 4)
			wv := c.w(b)
			N := wv.Shape[2]
			out := b.temp("out", ir.F32, c.batch, 2, N)
			mm := b.op(ir.Matmul, out, strided(x, 0, sh(c.batch, 2, 4), sh(0, 4, 1)), wv)
			b.output(out)
			if c.batch > 1 {
				mm.In[0].Strides[0] = 8
			}
			run(t, b.g, linear)
			if !c.match {
				if mm.Kind != ir.Matmul {
					t.Errorf("became %s, want matmul", mm.Kind)
				}
				return
			}
			if mm.Kind != ir.Linear || mm.Label != "linear" {
				t.Fatalf("kind %s label %q, want linear", mm.Kind, mm.Label)
			}
			wantX := ir.View{Buf: x.Buf, Shape: sh(2, 4), Strides: sh(4, 1)}
			wantW := ir.View{Buf: wv.Buf, Shape: sh(N, 4), Strides: sh(4, 1)}
			wantO := ir.View{Buf: out.Buf, Shape: sh(2, N), Strides: sh(N, 1)}
			if !sameLayout(mm.In[0], wantX) || !sameLayout(mm.In[1], wantW) || !sameLayout(mm.Out, wantO) {
				t.Errorf("linear %v × %v → %v, want %v × %v → %v", mm.In[0], mm.In[1], mm.Out, wantX, wantW, wantO)
			}
		})
	}
}

func TestFuseResidual(t *testing.T) {
	type setup struct {
		b        *builder
		lin, add *ir.Op
		r        ir.View
		sum      ir.View
	}
	build := func(linDT ir.DType, swap bool, expr *ir.Expr, residual func(b *builder) ir.View) setup {
		b := newBuilder()
		x := b.input("x", linDT, 2, 4)
		w := b.param("W", linDT, 3, 4)
		l := b.temp("L", linDT, 2, 3)
		lin := b.op(ir.Linear, l, x, w)
		lin.Label = "linear"
		r := strided(b.input("r", ir.F32, 1, 2, 3), 0, sh(1, 2, 3), sh(6, 3, 1))
		if residual != nil {
			r = residual(b)
		}
		s := b.temp("sum", ir.F32, 1, 2, 3)
		lv := strided(l, 0, sh(1, 2, 3), sh(6, 3, 1))
		if expr == nil {
			expr = castF32(add(ir.Load(0), ir.Load(1)))
		}
		var e *ir.Op
		if swap {
			e = b.ew(s, expr, r, lv)
		} else {
			e = b.ew(s, expr, lv, r)
		}
		b.output(s)
		return setup{b, lin, e, r, s}
	}
	t.Run("linear + r", func(t *testing.T) {
		for _, swap := range []bool{false, true} {
			s := build(ir.F32, swap, nil, nil)
			run(t, s.b.g, fuseResidual)
			if got := kinds(s.b.g); got != "linear:linear+residual" {
				t.Fatalf("swap=%v: ops %q, want one linear+residual", swap, got)
			}
			if !s.lin.Attr.Residual || len(s.lin.In) != 3 {
				t.Fatalf("swap=%v: residual %v inputs %d", swap, s.lin.Attr.Residual, len(s.lin.In))
			}
			wantR := ir.View{Buf: s.r.Buf, Shape: sh(2, 3), Strides: sh(3, 1)}
			wantO := ir.View{Buf: s.sum.Buf, Shape: sh(2, 3), Strides: sh(3, 1)}
			if !sameLayout(s.lin.In[2], wantR) || !sameLayout(s.lin.Out, wantO) {
				t.Errorf("swap=%v: residual %v out %v, want %v %v", swap, s.lin.In[2], s.lin.Out, wantR, wantO)
			}
		}
	})
	misses := []struct {
		name     string
		dt       ir.DType
		expr     *ir.Expr
		residual func(b *builder) ir.View
		extra    func(s setup)
	}{
		{"product, not sum", ir.F32, castF32(mul(ir.Load(0), ir.Load(1))), nil, nil},
		{"sum without the final cast", ir.F32, add(ir.Load(0), ir.Load(1)), nil, nil},
		{"linear in another dtype", ir.BF16, nil, nil, nil},
		{"residual broadcast along the last dim", ir.F32, nil, func(b *builder) ir.View {
			return strided(b.input("r", ir.F32, 1, 2, 1), 0, sh(1, 2, 3), sh(2, 1, 0))
		}, nil},
		{"linear output read twice", ir.F32, nil, nil, func(s setup) { s.b.output(s.lin.Out) }},
		{"residual written in between", ir.F32, nil, nil, func(s setup) {
			c := &ir.Op{Kind: ir.Copy, In: []ir.View{s.b.input("z", ir.F32, 1, 2, 3)}, Out: s.r}
			g := s.b.g
			g.Ops = append(g.Ops[:1], append([]*ir.Op{c}, g.Ops[1:]...)...)
			g.Renumber()
		}},
	}
	for _, c := range misses {
		t.Run(c.name, func(t *testing.T) {
			s := build(c.dt, false, c.expr, c.residual)
			if c.extra != nil {
				c.extra(s)
			}
			want := kinds(s.b.g)
			run(t, s.b.g, fuseResidual)
			if got := kinds(s.b.g); got != want || s.lin.Attr.Residual {
				t.Errorf("ops %q (residual %v), want unchanged %q", got, s.lin.Attr.Residual, want)
			}
		})
	}
}

func TestLabel(t *testing.T) {
	silu := func(e *ir.Expr) *ir.Expr { return ir.Apply(ir.ESilu, e) }
	cases := []struct {
		kind  ir.Kind
		label string
		expr  *ir.Expr
		nIn   int
		want  string
	}{
		{ir.Elementwise, "", ir.Cast(ir.BF16, mul(silu(ir.Load(0)), ir.Load(1))), 2, "silu_mul"},
		{ir.Elementwise, "", ir.Cast(ir.BF16, mul(ir.Load(1), castF32(silu(castF32(ir.Load(0)))))), 2, "silu_mul"},
		{ir.Elementwise, "", ir.Cast(ir.BF16, mul(silu(ir.Load(0)), ir.Const(2))), 1, "elementwise"},
		{ir.Elementwise, "", ir.Cast(ir.BF16, add(ir.Load(0), ir.Load(1))), 2, "residual_add"},
		{ir.Elementwise, "", ir.Cast(ir.BF16, add(ir.Load(0), ir.Load(0))), 1, "elementwise"},
		{ir.Elementwise, "", castF32(ir.Apply(ir.EExp, ir.Load(0))), 1, "elementwise"},
		{ir.KVWrite, "", nil, 2, "kv_write"},
		{ir.Copy, "", nil, 1, "copy"},
		{ir.Reduce, "", nil, 1, "reduce"},
		{ir.Linear, "linear+residual", nil, 3, "linear+residual"},
		{ir.Copy, "output_copy", nil, 1, "output_copy"},
	}
	for _, c := range cases {
		op := &ir.Op{Kind: c.kind, Label: c.label, In: make([]ir.View, c.nIn), Attr: ir.Attrs{Expr: c.expr}}
		label(&ir.Graph{Ops: []*ir.Op{op}})
		if op.Label != c.want {
			t.Errorf("%s %v: label %q, want %q", c.kind, c.expr, op.Label, c.want)
		}
	}
}

func TestBindOutputs(t *testing.T) {
	b := newBuilder()
	x := b.input("x", ir.F32, 2, 4)
	y, z := b.temp("y", ir.F32, 2, 4), b.temp("z", ir.F32, 2, 4)
	b.ew(y, castF32(ir.Apply(ir.EExp, ir.Load(0))), x)
	b.ew(z, castF32(ir.Apply(ir.ENeg, ir.Load(0))), x)
	row := strided(z, 4, sh(4), sh(1))
	b.output(y, strided(x, 4, sh(4), sh(1)), row, y)
	run(t, b.g, bindOutputs)
	if got := kinds(b.g); got != "elementwise elementwise copy:output_copy copy:output_copy" {
		t.Fatalf("ops %q, want two output copies (a partial view and a repeated output)", got)
	}
	outs := b.g.Outputs
	if outs[0].Buf != y.Buf || y.Buf.Kind != ir.Output || y.Buf.Index != 0 {
		t.Errorf("output 0 is %v (kind %d index %d), want y bound as output 0", outs[0], outs[0].Buf.Kind, outs[0].Buf.Index)
	}
	if outs[1].Buf != x.Buf || outs[1].Offset != 4 {
		t.Errorf("output 1 is %v, want the view of input x", outs[1])
	}
	for _, i := range []int{2, 3} {
		o := outs[i]
		if o.Buf.Kind != ir.Output || o.Buf.Index != i || !o.IsWhole() {
			t.Errorf("output %d is %v (kind %d index %d), want a fresh whole output buffer", i, o, o.Buf.Kind, o.Buf.Index)
		}
		c := b.g.Ops[i]
		if c.Out.Buf != o.Buf {
			t.Errorf("output copy %d writes %v, want %v", i, c.Out, o)
		}
	}
	if c := b.g.Ops[2]; !sameLayout(c.In[0], row) {
		t.Errorf("output copy reads %v, want %v", c.In[0], row)
	}
	if z.Buf.Kind != ir.Temp {
		t.Errorf("z became kind %d, want it to stay a temporary", z.Buf.Kind)
	}
}

// rsqrtMisBroadcast is BUG 1's pattern: the mean of row i scales column i
// (M broadcast with strides [0, 1]), which is not an RMSNorm.
const rmsNormBroadcastBug = "BUG: rmsNorm's inline path (invRMS with f not a load) never checks how e reads the mean: " +
	"x·rsqrt(M+eps) with M = mean(x², -1) broadcast along dim 0 (strides [0, 1], reachable with " +
	"x * torch.rsqrt(x.pow(2).mean(-1).expand_as(x) + eps) on a square x) is rewritten into an RMSNorm, " +
	"which scales row i by row i's mean instead of column i's; the separate-rsqrt path checks the last stride is 0, the inline path does not"

func TestRMSNormRejectsMisBroadcastMean(t *testing.T) {
	b := newBuilder()
	x := b.input("x", ir.F32, 2, 2)
	s := b.temp("S", ir.F32, 2, 2)
	b.ew(s, castF32(ir.Apply(ir.EPow, ir.Load(0), ir.Const(2))), x)
	m := b.temp("M", ir.F32, 2)
	red := b.op(ir.Reduce, m, s)
	red.Attr.Reduce, red.Attr.Dims = "mean", 1
	out := b.temp("out", ir.F32, 2, 2)
	b.ew(out, castF32(mul(ir.Load(0), ir.Apply(ir.ERsqrt, add(ir.Load(1), ir.Const(1e-6))))), x, strided(m, 0, sh(2, 2), sh(0, 1)))
	b.output(out)
	run(t, b.g, rmsNorm)
	if got := kinds(b.g); got != "elementwise reduce elementwise" {
		t.Fatal(rmsNormBroadcastBug + " (ops: " + got + ")")
	}
}

func TestLowerRMSNormMisBroadcastMean(t *testing.T) {
	list := func(xs ...int64) wire.Arg {
		a := wire.Arg{K: "list"}
		for _, x := range xs {
			a.List = append(a.List, intArg(x))
		}
		return a
	}
	g := &wire.Graph{Inputs: []wire.Input{{Name: "x", Kind: "input", Meta: *meta("float32", 2, 2)}},
		Nodes: []wire.Node{
			{Name: "pow", Target: "aten.pow.Tensor_Scalar", Args: []wire.Arg{nodeArg("x"), intArg(2)}, Outs: []*wire.Meta{meta("float32", 2, 2)}},
			{Name: "mean", Target: "aten.mean.dim", Args: []wire.Arg{nodeArg("pow"), list(-1)}, Outs: []*wire.Meta{meta("float32", 2)}},
			{Name: "expand", Target: "aten.expand.default", Args: []wire.Arg{nodeArg("mean"), list(2, 2)},
				Outs: []*wire.Meta{{DType: "float32", Shape: []int64{2, 2}, Strides: []int64{0, 1}}}},
			{Name: "add", Target: "aten.add.Scalar", Args: []wire.Arg{nodeArg("expand"), {K: "float", F: 1e-6}}, Outs: []*wire.Meta{meta("float32", 2, 2)}},
			{Name: "rsqrt", Target: "aten.rsqrt.default", Args: []wire.Arg{nodeArg("add")}, Outs: []*wire.Meta{meta("float32", 2, 2)}},
			{Name: "mul", Target: "aten.mul.Tensor", Args: []wire.Arg{nodeArg("x"), nodeArg("rsqrt")}, Outs: []*wire.Meta{meta("float32", 2, 2)}},
		}, Outputs: []wire.Arg{nodeArg("mul")}}
	ig, err := Lower(g)
	if err != nil {
		t.Fatal(err)
	}
	for _, op := range ig.Ops {
		if op.Kind == ir.RMSNorm {
			t.Fatal(rmsNormBroadcastBug + "\n" + ig.Dump())
		}
	}
}
