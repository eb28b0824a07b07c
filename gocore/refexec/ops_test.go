package refexec

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"unsafe"

	"mpk/gocore/ir"
	"mpk/gocore/tgraph"
)

// rig holds Go-allocated memory for the buffers of a small op graph so single
// ops can run without a task graph.
type rig struct {
	g    *ir.Graph
	mems []mem
	keep [][]byte
}

func newRig() *rig { return &rig{g: &ir.Graph{}} }

// tensor allocates a contiguous buffer of shape holding vals (zeros if none).
func (r *rig) tensor(name string, dt ir.DType, shape []int64, vals ...float64) ir.View {
	v := r.g.NewTemp(name, dt, shape)
	buf := make([]byte, v.Buf.Numel*dt.Size()+8)
	r.keep = append(r.keep, buf)
	r.mems = append(r.mems, mem{base: unsafe.Pointer(&buf[0]), dt: dt, n: v.Buf.Numel})
	for i, x := range vals {
		r.mems[v.Buf.ID].store(int64(i), x)
	}
	return v
}

// read returns the elements of v in row-major order.
func (r *rig) read(v ir.View) []float64 {
	var out []float64
	each(tgraph.Box{Lo: make([]int64, v.Rank()), Hi: v.Shape}, func(idx []int64) error {
		out = append(out, r.mems[v.Buf.ID].load(at(v, idx)))
		return nil
	})
	return out
}

// run executes op over box, or over its whole iteration space when box is nil.
func (r *rig) run(op *ir.Op, box *tgraph.Box) error {
	if box == nil {
		shape := op.Out.Shape
		if op.Kind == ir.KVWrite {
			shape = op.In[1].Shape
		}
		box = &tgraph.Box{Lo: make([]int64, len(shape)), Hi: shape}
	}
	x := &exec{g: r.g, mems: r.mems}
	return x.runTask(op, *box)
}

func sh(xs ...int64) []int64 { return xs }

func near(a, b, tol float64) bool {
	if math.IsNaN(a) || math.IsNaN(b) {
		return math.IsNaN(a) && math.IsNaN(b)
	}
	if math.IsInf(a, 0) || math.IsInf(b, 0) {
		return a == b
	}
	return math.Abs(a-b) <= tol*math.Max(1, math.Abs(b))
}

func expect(t *testing.T, what string, got, want []float64, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: got %v, want %v", what, got, want)
		return
	}
	for i := range got {
		if !near(got[i], want[i], tol) {
			t.Errorf("%s: got %v, want %v (element %d)", what, got, want, i)
			return
		}
	}
}

func TestExprOps(t *testing.T) {
	L := ir.Load
	a := func(op ir.ExprOp, xs ...*ir.Expr) *ir.Expr { return ir.Apply(op, xs...) }
	nan := math.NaN()
	cases := []struct {
		e    *ir.Expr
		in   []float64 // in0, in1, in2 scalars
		want float64
	}{
		{L(0), []float64{2.5}, 2.5},
		{ir.Const(-3), nil, -3},
		{a(ir.EAdd, L(0), L(1)), []float64{2, 3}, 5},
		{a(ir.ESub, L(0), L(1)), []float64{2, 3}, -1},
		{a(ir.EMul, L(0), L(1)), []float64{2, 3}, 6},
		{a(ir.EDiv, L(0), L(1)), []float64{3, 2}, 1.5},
		{a(ir.EDiv, L(0), L(1)), []float64{1, 0}, math.Inf(1)},
		{a(ir.EPow, L(0), ir.Const(2)), []float64{-3}, 9},
		{a(ir.EPow, L(0), ir.Const(0.5)), []float64{9}, 3},
		{a(ir.EMax, L(0), L(1)), []float64{2, 3}, 3},
		{a(ir.EMin, L(0), L(1)), []float64{2, 3}, 2},
		{a(ir.ENeg, L(0)), []float64{2}, -2},
		{a(ir.EExp, L(0)), []float64{1}, math.E},
		{a(ir.ELog, L(0)), []float64{math.E}, 1},
		{a(ir.ESqrt, L(0)), []float64{4}, 2},
		{a(ir.ERsqrt, L(0)), []float64{4}, 0.5},
		{a(ir.ESin, L(0)), []float64{math.Pi / 2}, 1},
		{a(ir.ECos, L(0)), []float64{0}, 1},
		{a(ir.ETanh, L(0)), []float64{0.5}, 0.46211715726000974},
		{a(ir.ESigmoid, L(0)), []float64{0}, 0.5},
		{a(ir.ESilu, L(0)), []float64{1}, 0.7310585786300049},
		{a(ir.EGelu, L(0)), []float64{1}, 0.8413447460685429},
		{a(ir.EGeluTanh, L(0)), []float64{1}, 0.8411919906082768},
		{a(ir.EAbs, L(0)), []float64{-2}, 2},
		{a(ir.ERecip, L(0)), []float64{4}, 0.25},
		{a(ir.ERelu, L(0)), []float64{-1}, 0},
		{a(ir.ERelu, L(0)), []float64{1.5}, 1.5},
		{a(ir.EErf, L(0)), []float64{1}, 0.8427007929497149},
		{a(ir.EWhere, L(0), L(1), L(2)), []float64{1, 7, 8}, 7},
		{a(ir.EWhere, L(0), L(1), L(2)), []float64{0, 7, 8}, 8},
		{a(ir.ELt, L(0), L(1)), []float64{1, 2}, 1},
		{a(ir.ELe, L(0), L(1)), []float64{2, 2}, 1},
		{a(ir.EGt, L(0), L(1)), []float64{1, 2}, 0},
		{a(ir.EGe, L(0), L(1)), []float64{2, 2}, 1},
		{a(ir.EEq, L(0), L(1)), []float64{2, 2}, 1},
		{a(ir.ENe, L(0), L(1)), []float64{2, 2}, 0},
		{a(ir.EAnd, L(0), L(1)), []float64{6, 3}, 2},
		{a(ir.EOr, L(0), L(1)), []float64{6, 3}, 7},
		{a(ir.ENot, L(0)), []float64{0}, 1},
		{a(ir.ENot, L(0)), []float64{2}, 0},
		{a(ir.EIsNaN, L(0)), []float64{nan}, 1},
		{a(ir.EIsNaN, L(0)), []float64{1}, 0},
		{ir.Cast(ir.BF16, L(0)), []float64{1 + 1.0/256}, 1},
		{ir.Cast(ir.BF16, L(0)), []float64{1 + 3.0/256}, 1 + 1.0/64},
		{ir.Cast(ir.F16, L(0)), []float64{1.0 / 3}, 0.333251953125},
		{ir.Cast(ir.F32, L(0)), []float64{0.1}, float64(float32(0.1))},
		{ir.Cast(ir.I64, L(0)), []float64{-2.7}, -2},
		{ir.Cast(ir.Bool, L(0)), []float64{0.25}, 1},
	}
	for _, c := range cases {
		r := newRig()
		var ins []ir.View
		for i, v := range c.in {
			ins = append(ins, r.tensor("in"+string(rune('0'+i)), ir.F64, sh(1), v))
		}
		out := r.tensor("out", ir.F64, sh(1))
		op := &ir.Op{Kind: ir.Elementwise, In: ins, Out: out, Attr: ir.Attrs{Expr: c.e}}
		if err := r.run(op, nil); err != nil {
			t.Fatal(err)
		}
		if got := r.read(out)[0]; !near(got, c.want, 1e-12) {
			t.Errorf("%s on %v = %v, want %v", c.e, c.in, got, c.want)
		}
	}
}

func TestElementwiseViews(t *testing.T) {
	r := newRig()
	x := r.tensor("x", ir.F32, sh(2, 3), 1, 2, 3, 4, 5, 6)
	b := r.tensor("b", ir.F32, sh(3), 10, 20, 30)
	out := r.tensor("out", ir.BF16, sh(2, 3))
	bb := ir.View{Buf: b.Buf, Shape: sh(2, 3), Strides: sh(0, 1)}
	// out = bf16(x + b + 0.001·j): the index term is lost to bf16 rounding.
	e := ir.Cast(ir.BF16, ir.Apply(ir.EAdd, ir.Apply(ir.EAdd, ir.Load(0), ir.Load(1)), ir.Apply(ir.EMul, ir.Index(1), ir.Const(0.001))))
	op := &ir.Op{Kind: ir.Elementwise, In: []ir.View{x, bb}, Out: out, Attr: ir.Attrs{Expr: e}}
	if err := r.run(op, nil); err != nil {
		t.Fatal(err)
	}
	// 11, 22.001, 33.002, 14, 25.001, 36.002 rounded to bf16 (8 significant bits).
	expect(t, "broadcast add in bf16", r.read(out), []float64{11, 22, 33, 14, 25, 36}, 0)

	// A tile writes only its box.
	r2 := newRig()
	x2 := r2.tensor("x", ir.F32, sh(2, 2), 1, 2, 3, 4)
	o2 := r2.tensor("o", ir.F32, sh(2, 2))
	tr := ir.View{Buf: x2.Buf, Shape: sh(2, 2), Strides: sh(1, 2)}
	cp := &ir.Op{Kind: ir.Copy, In: []ir.View{tr}, Out: o2}
	if err := r2.run(cp, &tgraph.Box{Lo: sh(1, 0), Hi: sh(2, 2)}); err != nil {
		t.Fatal(err)
	}
	expect(t, "transposing copy of row 1", r2.read(o2), []float64{0, 0, 2, 4}, 0)
}

func TestReduce(t *testing.T) {
	nan := math.NaN()
	cases := []struct {
		kind string
		in   []float64 // [2, 3]
		want []float64
	}{
		{"sum", []float64{1, 2, 3, 4, 5, 6}, []float64{6, 15}},
		{"mean", []float64{1, 2, 3, 4, 5, 6}, []float64{2, 5}},
		{"amax", []float64{1, 7, 3, -4, -5, -6}, []float64{7, -4}},
		{"amin", []float64{1, 7, 3, -4, -5, -6}, []float64{1, -6}},
		{"argmax", []float64{1, 5, 5, 7, 0, 7}, []float64{1, 0}},
		{"amax", []float64{1, nan, 3, 1, 2, 3}, []float64{nan, 3}},
		{"argmax", []float64{1, nan, 3, 1, 2, 3}, []float64{1, 2}},
	}
	for _, c := range cases {
		r := newRig()
		x := r.tensor("x", ir.F32, sh(2, 3), c.in...)
		out := r.tensor("o", ir.F32, sh(2))
		op := &ir.Op{Kind: ir.Reduce, In: []ir.View{x}, Out: out, Attr: ir.Attrs{Reduce: c.kind, Dims: 1}}
		if err := r.run(op, nil); err != nil {
			t.Fatal(err)
		}
		expect(t, fmt.Sprint(c.kind, " of ", c.in), r.read(out), c.want, 0)
	}
	// Two trailing dims reduced into a scalar.
	r := newRig()
	x := r.tensor("x", ir.F32, sh(2, 3), 1, 2, 3, 4, 5, 6)
	out := r.tensor("o", ir.F32, sh())
	op := &ir.Op{Kind: ir.Reduce, In: []ir.View{x}, Out: out, Attr: ir.Attrs{Reduce: "mean", Dims: 2}}
	if err := r.run(op, nil); err != nil {
		t.Fatal(err)
	}
	expect(t, "mean of all", r.read(out), []float64{3.5}, 0)
}

func TestArgmaxFirstNaN(t *testing.T) {
	nan := math.NaN()
	// torch.argmax treats NaN as the maximum and returns the first one.
	r := newRig()
	x := r.tensor("x", ir.F32, sh(3), nan, 1, nan)
	o := r.tensor("o", ir.I64, sh())
	if err := r.run(&ir.Op{Kind: ir.Reduce, In: []ir.View{x}, Out: o, Attr: ir.Attrs{Reduce: "argmax", Dims: 1}}, nil); err != nil {
		t.Fatal(err)
	}
	if got := r.read(o)[0]; got != 0 {
		t.Fatalf("refexec argmax of [NaN 1 NaN] = %v, torch.argmax gives 0 (the first NaN): reduce's `v > best || math.IsNaN(v)` lets every later NaN replace the earlier one", got)
	}
}

func TestRMSNormRef(t *testing.T) {
	inv := 1 / math.Sqrt(8) // mean(1,4,9,16) = 7.5, + eps 0.5
	f32 := func(v float64) float64 { return float64(float32(v)) }
	cases := []struct {
		name   string
		weight bool
		want   []float64
	}{
		{"with weight", true, []float64{f32(inv), f32(2 * inv), 2 * f32(3*inv), 2 * f32(4*inv), 1 * 0, 0, 0, 0}},
		{"without weight", false, []float64{f32(inv), f32(2 * inv), f32(3 * inv), f32(4 * inv), 0, 0, 0, 0}},
	}
	for _, c := range cases {
		r := newRig()
		x := r.tensor("x", ir.F32, sh(2, 4), 1, 2, 3, 4, 0, 0, 0, 0)
		w := r.tensor("w", ir.F32, sh(4), 1, 1, 2, 2)
		out := r.tensor("o", ir.F32, sh(2, 4))
		in := []ir.View{x}
		if c.weight {
			in = append(in, ir.View{Buf: w.Buf, Shape: sh(2, 4), Strides: sh(0, 1)})
		}
		op := &ir.Op{Kind: ir.RMSNorm, In: in, Out: out, Attr: ir.Attrs{Eps: 0.5, HasWeight: c.weight}}
		if err := r.run(op, &tgraph.Box{Lo: sh(0, 0), Hi: sh(2, 4)}); err != nil {
			t.Fatal(err)
		}
		expect(t, "rmsnorm "+c.name, r.read(out), c.want, 1e-7)
	}
	// bf16 x: the normalized value rounds to bf16 before the weight (as HF does).
	r := newRig()
	x := r.tensor("x", ir.BF16, sh(1, 2), 1, 1)
	w := r.tensor("w", ir.F32, sh(2), 3, 3)
	out := r.tensor("o", ir.F32, sh(1, 2))
	op := &ir.Op{Kind: ir.RMSNorm, In: []ir.View{x, {Buf: w.Buf, Shape: sh(1, 2), Strides: sh(0, 1)}}, Out: out, Attr: ir.Attrs{Eps: 0.01, HasWeight: true}}
	if err := r.run(op, nil); err != nil {
		t.Fatal(err)
	}
	y := round(ir.BF16, 1/math.Sqrt(1.01)) * 3
	expect(t, "rmsnorm bf16", r.read(out), []float64{y, y}, 1e-7)
}

func TestRoPERef(t *testing.T) {
	r := newRig()
	x := r.tensor("x", ir.F32, sh(2, 4), 1, 2, 3, 4, 1, 0, 0, 0)
	cos := r.tensor("cos", ir.F32, sh(2, 4), 0.5, 0.5, 0.5, 0.5, 0, 1, 0, 1)
	sin := r.tensor("sin", ir.F32, sh(2, 4), 1, 1, 1, 1, 1, 0, 1, 0)
	out := r.tensor("o", ir.F32, sh(2, 4))
	op := &ir.Op{Kind: ir.RoPE, In: []ir.View{x, cos, sin}, Out: out}
	if err := r.run(op, nil); err != nil {
		t.Fatal(err)
	}
	// rotate_half([1 2 3 4]) = [-3 -4 1 2]; rotate_half([1 0 0 0]) = [0 0 1 0].
	expect(t, "rope", r.read(out), []float64{0.5 - 3, 1 - 4, 1.5 + 1, 2 + 2, 0, 0, 1, 0}, 0)
}

func TestLinearRef(t *testing.T) {
	r := newRig()
	x := r.tensor("x", ir.F32, sh(2, 3), 1, 2, 3, 4, 5, 6)
	w := r.tensor("w", ir.F32, sh(2, 3), 1, 0, 0, 0, 1, 1)
	res := r.tensor("r", ir.F32, sh(2, 2), 10, 20, 30, 40)
	out := r.tensor("o", ir.F32, sh(2, 2))
	op := &ir.Op{Kind: ir.Linear, In: []ir.View{x, w}, Out: out}
	if err := r.run(op, nil); err != nil {
		t.Fatal(err)
	}
	expect(t, "linear", r.read(out), []float64{1, 5, 4, 11}, 0)
	op.In, op.Attr.Residual = append(op.In, res), true
	out2 := r.tensor("o2", ir.F32, sh(2, 2))
	op.Out = out2
	if err := r.run(op, &tgraph.Box{Lo: sh(0, 1), Hi: sh(2, 2)}); err != nil {
		t.Fatal(err)
	}
	expect(t, "linear+residual, column 1 only", r.read(out2), []float64{0, 25, 0, 51}, 0)
}

func TestMatmulRef(t *testing.T) {
	r := newRig()
	a := r.tensor("a", ir.F32, sh(2, 1, 2), 1, 2, 3, 4)
	b := r.tensor("b", ir.F32, sh(2, 2, 1), 5, 6, 7, 8)
	out := r.tensor("o", ir.F32, sh(2, 1, 1))
	if err := r.run(&ir.Op{Kind: ir.Matmul, In: []ir.View{a, b}, Out: out}, nil); err != nil {
		t.Fatal(err)
	}
	expect(t, "bmm", r.read(out), []float64{1*5 + 2*6, 3*7 + 4*8}, 0)
}

func TestAttentionRef(t *testing.T) {
	e := math.E
	cases := []struct {
		name    string
		q, k, v []float64
		qs, ks  []int64
		groups  int64
		causal  bool
		mask    []float64
		maskDT  ir.DType
		want    []float64
	}{
		{"GQA: heads 0,1 read KV head 0, heads 2,3 KV head 1",
			[]float64{1, 0, 1, 0, 1, 0, 1, 0}, []float64{1, 0, 1, 0}, []float64{1, 2, 3, 4},
			sh(1, 4, 1, 2), sh(1, 2, 1, 2), 2, false, nil, 0,
			[]float64{1, 2, 1, 2, 3, 4, 3, 4}},
		{"softmax over two keys, boolean mask hides key 1 from head 1",
			[]float64{1, 0, 0, 1}, []float64{1, 0, 0, 1}, []float64{1, 2, 3, 4},
			sh(1, 2, 1, 2), sh(1, 1, 2, 2), 2, false, []float64{1, 1, 1, 0}, ir.Bool,
			[]float64{(e + 3) / (e + 1), (2*e + 4) / (e + 1), 1, 2}},
		{"additive mask",
			[]float64{0, 0}, []float64{0, 0, 0, 0}, []float64{1, 2, 3, 4},
			sh(1, 1, 1, 2), sh(1, 1, 2, 2), 1, false, []float64{math.Log(3), 0}, ir.F32,
			[]float64{(3*1 + 3) / 4.0, (3*2 + 4) / 4.0}},
		{"causal: query 0 sees key 0 only",
			[]float64{0, 0, 0, 0}, []float64{0, 0, 0, 0}, []float64{1, 2, 3, 4},
			sh(1, 1, 2, 2), sh(1, 1, 2, 2), 1, true, nil, 0,
			[]float64{1, 2, 2, 3}},
	}
	for _, c := range cases {
		r := newRig()
		q := r.tensor("q", ir.F32, c.qs, c.q...)
		k := r.tensor("k", ir.F32, c.ks, c.k...)
		v := r.tensor("v", ir.F32, c.ks, c.v...)
		out := r.tensor("o", ir.F32, c.qs)
		op := &ir.Op{Kind: ir.Attention, In: []ir.View{q, k, v}, Out: out, Attr: ir.Attrs{Scale: 1, Groups: c.groups, Causal: c.causal}}
		if c.mask != nil {
			op.In = append(op.In, r.tensor("m", c.maskDT, sh(1, c.qs[1], c.qs[2], c.ks[2]), c.mask...))
			op.Attr.HasMask = true
		}
		if err := r.run(op, nil); err != nil {
			t.Fatal(err)
		}
		expect(t, c.name, r.read(out), c.want, 1e-6)
	}
}

func TestIndexingOps(t *testing.T) {
	t.Run("embedding", func(t *testing.T) {
		r := newRig()
		tab := r.tensor("table", ir.F32, sh(3, 2), 0, 1, 10, 11, 20, 21)
		ids := r.tensor("ids", ir.I64, sh(3), 2, 0, -1)
		out := r.tensor("o", ir.F32, sh(3, 2))
		op := &ir.Op{Kind: ir.Embedding, In: []ir.View{tab, ids}, Out: out}
		if err := r.run(op, nil); err != nil {
			t.Fatal(err)
		}
		expect(t, "embedding", r.read(out), []float64{20, 21, 0, 1, 20, 21}, 0)
		r.mems[ids.Buf.ID].store(1, 3)
		err := r.run(op, nil)
		if err == nil || !strings.Contains(err.Error(), "embedding: index 3 out of range for size 3") {
			t.Errorf("out-of-range id: err %v", err)
		}
	})
	t.Run("gather", func(t *testing.T) {
		r := newRig()
		src := r.tensor("src", ir.F32, sh(3, 2), 0, 1, 10, 11, 20, 21)
		rows := r.tensor("rows", ir.I64, sh(2), 2, 1)
		out := r.tensor("o", ir.F32, sh(2, 2))
		if err := r.run(&ir.Op{Kind: ir.Gather, In: []ir.View{src, rows}, Out: out}, nil); err != nil {
			t.Fatal(err)
		}
		expect(t, "gather rows", r.read(out), []float64{20, 21, 10, 11}, 0)
		cols := r.tensor("cols", ir.I64, sh(1), 1)
		out2 := r.tensor("o2", ir.F32, sh(3, 1))
		if err := r.run(&ir.Op{Kind: ir.Gather, In: []ir.View{src, cols}, Out: out2, Attr: ir.Attrs{Dim: 1}}, nil); err != nil {
			t.Fatal(err)
		}
		expect(t, "gather column", r.read(out2), []float64{1, 11, 21}, 0)
	})
	t.Run("cat", func(t *testing.T) {
		r := newRig()
		a := r.tensor("a", ir.F32, sh(2, 1), 1, 2)
		b := r.tensor("b", ir.F32, sh(2, 2), 3, 4, 5, 6)
		out := r.tensor("o", ir.F32, sh(2, 3))
		if err := r.run(&ir.Op{Kind: ir.Cat, In: []ir.View{a, b}, Out: out, Attr: ir.Attrs{Dim: 1}}, nil); err != nil {
			t.Fatal(err)
		}
		expect(t, "cat", r.read(out), []float64{1, 3, 4, 2, 5, 6}, 0)
	})
	t.Run("kv_write", func(t *testing.T) {
		r := newRig()
		cache := r.tensor("cache", ir.BF16, sh(1, 4, 2))
		pos := r.tensor("pos", ir.I64, sh(2), 2, 0)
		src := r.tensor("src", ir.F32, sh(1, 2, 2), 7, 8, 9, 1+1.0/256)
		op := &ir.Op{Kind: ir.KVWrite, In: []ir.View{pos, src}, Out: cache, Attr: ir.Attrs{Dim: 1}}
		if err := r.run(op, nil); err != nil {
			t.Fatal(err)
		}
		expect(t, "kv_write", r.read(cache), []float64{9, 1, 0, 0, 7, 8, 0, 0}, 0)
		r.mems[pos.Buf.ID].store(0, 4)
		if err := r.run(op, nil); err == nil || !strings.Contains(err.Error(), "KV-cache write: position index 4 out of range for size 4") {
			t.Errorf("out-of-range position: err %v", err)
		}
	})
}

func TestMemRoundTrip(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	cases := []struct {
		dt   ir.DType
		in   float64
		want float64
	}{
		{ir.F32, 1.5, 1.5},
		{ir.F32, 0.1, float64(float32(0.1))},
		{ir.F32, inf, inf},
		{ir.F64, 0.1, 0.1},
		{ir.BF16, 1, 1},
		{ir.BF16, 1 + 1.0/256, 1},                      // tie → even (down)
		{ir.BF16, 1 + 3.0/256, 1 + 1.0/64},             // tie → even (up)
		{ir.BF16, 1 + 1.0/256 + 1.0/4096, 1 + 1.0/128}, // above the tie
		{ir.BF16, -2.5, -2.5},
		{ir.BF16, 3.4e38, inf}, // rounds past the largest bf16
		{ir.BF16, nan, nan},
		{ir.BF16, -inf, -inf},
		{ir.F16, 1.0 / 3, 0.333251953125},
		{ir.F16, 65504, 65504},
		{ir.F16, 65519, 65504},
		{ir.F16, 65520, inf},
		{ir.F16, -1e6, -inf},
		{ir.F16, math.Ldexp(1, -14), math.Ldexp(1, -14)},      // smallest normal
		{ir.F16, math.Ldexp(1, -24), math.Ldexp(1, -24)},      // smallest subnormal
		{ir.F16, math.Ldexp(3, -25), math.Ldexp(2, -24)},      // subnormal tie → even
		{ir.F16, math.Ldexp(5, -25), math.Ldexp(2, -24)},      // 2.5 units → 2
		{ir.F16, math.Ldexp(1, -25), 0},                       // half a unit → even (0)
		{ir.F16, math.Ldexp(1.0001, -25), math.Ldexp(1, -24)}, // just above half a unit
		{ir.F16, math.Ldexp(1, -14) - math.Ldexp(1, -26), math.Ldexp(1, -14)}, // rounds up into the normals
		{ir.F16, math.Ldexp(1023, -24), math.Ldexp(1023, -24)},                // largest subnormal
		{ir.F16, 1 + 1.0/2048, 1},                                             // tie → even
		{ir.F16, nan, nan},
		{ir.I64, -2.7, -2},
		{ir.I64, 1 << 40, 1 << 40},
		{ir.I32, 123456.9, 123456},
		{ir.I16, -300, -300},
		{ir.I8, -100, -100},
		{ir.U8, 255, 255},
		{ir.Bool, 0.5, 1},
		{ir.Bool, 0, 0},
	}
	for _, c := range cases {
		r := newRig()
		v := r.tensor("v", c.dt, sh(2))
		m := r.mems[v.Buf.ID]
		m.store(1, c.in)
		got := m.load(1)
		if !near(got, c.want, 0) || math.Signbit(got) != math.Signbit(c.want) && !math.IsNaN(c.want) {
			t.Errorf("%s: store %v, load %v, want %v", c.dt, c.in, got, c.want)
		}
		if m.load(0) != 0 {
			t.Errorf("%s: storing element 1 changed element 0 to %v", c.dt, m.load(0))
		}
		if r := round(c.dt, c.in); !near(r, c.want, 0) && c.dt.IsFloat() {
			t.Errorf("%s: round(%v) = %v, want the stored value %v", c.dt, c.in, r, c.want)
		}
	}
}

func TestHalfBits(t *testing.T) {
	cases := []struct {
		bits uint16
		val  float64
	}{
		{0x3c00, 1}, {0xc000, -2}, {0x7bff, 65504}, {0x0001, math.Ldexp(1, -24)},
		{0x03ff, math.Ldexp(1023, -24)}, {0x0400, math.Ldexp(1, -14)}, {0x3555, 0.333251953125},
		{0x7c00, math.Inf(1)}, {0xfc00, math.Inf(-1)}, {0x0000, 0},
	}
	for _, c := range cases {
		if got := halfToFloat(c.bits); got != c.val {
			t.Errorf("halfToFloat(%#04x) = %v, want %v", c.bits, got, c.val)
		}
		if got := floatToHalf(c.val); got != c.bits {
			t.Errorf("floatToHalf(%v) = %#04x, want %#04x", c.val, got, c.bits)
		}
	}
	if got := floatToHalf(math.Copysign(0, -1)); got != 0x8000 {
		t.Errorf("floatToHalf(-0) = %#04x, want 0x8000", got)
	}
	if !math.IsNaN(halfToFloat(0x7e00)) || floatToHalf(math.NaN())&0x7c00 != 0x7c00 {
		t.Error("half NaN does not round-trip")
	}
	// bf16: NaN with payload only in the low bits stays a NaN.
	if b := floatToBF16(math.Float32frombits(0x7f800001)); b&0x7f80 != 0x7f80 || b&0x7f == 0 {
		t.Errorf("floatToBF16(signalling NaN) = %#04x, not a NaN", b)
	}
}

// TestMaskExtent: 1 + the last position a mask row leaves visible to any
// head, 0 when it hides all; a float mask hides with -inf, or with a value
// far below its row's largest (HF's finfo.min); NaN stays visible.
func TestMaskExtent(t *testing.T) {
	inf, lo := math.Inf(-1), -math.MaxFloat32
	for _, c := range []struct {
		name string
		dt   ir.DType
		mask []float64 // [2 rows, 2 heads, 1, 5]
		want []float64
	}{
		{"bool", ir.Bool, []float64{1, 1, 0, 0, 0, 1, 0, 0, 1, 0 /* row 1 */, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, []float64{4, 0}},
		{"float", ir.F32, []float64{0, 0, inf, inf, inf, 0, 0, inf, inf, inf /* row 1 */, inf, inf, inf, inf, -1e30, inf, inf, inf, inf, math.NaN()}, []float64{2, 5}},
		{"finfo.min", ir.F32, []float64{0, 0, lo, lo, lo, 0, lo, 0, lo, lo /* row 1: all lo, nothing hidden */, lo, lo, lo, lo, lo, lo, lo, lo, lo, lo}, []float64{3, 5}},
		{"margin", ir.F32, []float64{-5, -2e4, -9000, -3e4, -1e5, -5, -5, inf, inf, inf /* row 1 */, 0, -9999, -10001, inf, inf, 0, 0, 0, 0, inf}, []float64{3, 4}},
		// NaN is visible but sets no row maximum: -2e4 stays hidden below 0.
		{"nan", ir.F32, []float64{0, math.NaN(), -2e4, -2e4, inf, inf, inf, inf, inf, inf /* row 1 */, inf, inf, inf, inf, inf, inf, inf, inf, inf, inf}, []float64{2, 0}},
	} {
		r := newRig()
		m := r.tensor("m", c.dt, sh(2, 2, 1, 5), c.mask...)
		out := r.tensor("e", ir.I32, sh(2))
		if err := r.run(&ir.Op{Kind: ir.MaskExtent, In: []ir.View{m}, Out: out}, nil); err != nil {
			t.Fatal(err)
		}
		expect(t, c.name, r.read(out), c.want, 0)
	}
}

// TestMergeBoundByExtent: a Linear's merge prologue with Chunk, and a
// standalone AttnMerge with an extent, read only the splits below
// ⌈extent/Chunk⌉; a split past it may hold anything (a stale step's partials).
func TestMergeBoundByExtent(t *testing.T) {
	// partials [1 row, 3 splits, 1 head, 1, Dv 1 + 2]: (max, sum, output)
	parts := []float64{0, 1, 2 /* split 1 */, 0, 1, 4 /* split 2: stale */, 5, 1, 100}
	// Interleaved in 2 groups, splits (0, 1 | 2) cover chunks (0, 2 | 1): the
	// first two chunks are splits 0 and 2.
	for _, c := range []struct {
		extent float64
		R      int64
		want   float64
	}{{3, 1, 3}, {4, 1, 3}, {5, 1, (2 + 4 + 100*math.Exp(5)) / (2 + math.Exp(5))},
		{2, 2, 2}, {3, 2, (2 + 100*math.Exp(5)) / (1 + math.Exp(5))}} {
		r := newRig()
		p := r.tensor("p", ir.F32, sh(1, 3, 1, 1, 3), parts...)
		w := r.tensor("w", ir.F32, sh(1, 1), 1)
		ext := r.tensor("e", ir.I32, sh(1), c.extent)
		out := r.tensor("o", ir.F32, sh(1, 1))
		op := &ir.Op{Kind: ir.Linear, In: []ir.View{p, w, ext}, Out: out,
			Attr: ir.Attrs{Pro: &ir.Prologue{Kind: ir.AttnMerge, First: 2, DType: ir.F32, Chunk: 2, Interleave: c.R}}}
		if err := r.run(op, nil); err != nil {
			t.Fatal(err)
		}
		expect(t, fmt.Sprintf("extent %g, %d groups", c.extent, c.R), r.read(out), []float64{c.want}, 1e-6)

		merged := r.tensor("m", ir.F32, sh(1, 1, 1, 1))
		op = &ir.Op{Kind: ir.AttnMerge, In: []ir.View{p, ext}, Out: merged,
			Attr: ir.Attrs{HasExtent: true, Chunk: 2, Interleave: c.R}}
		if err := r.run(op, nil); err != nil {
			t.Fatal(err)
		}
		expect(t, fmt.Sprintf("standalone merge: extent %g, %d groups", c.extent, c.R), r.read(merged), []float64{c.want}, 1e-6)
	}
}

// TestAttentionSkipsChunksPastExtent: a decode attention bounded by its
// mask's extent computes the chunks that start below it and leaves the
// partials of the rest as they were (the merge reads none of them).
func TestAttentionSkipsChunksPastExtent(t *testing.T) {
	const S, splits = 8, 4 // chunks of 2 positions
	for _, c := range []struct {
		extent float64
		R      int64
	}{{0, 1}, {1, 1}, {3, 1}, {8, 1}, {3, 2}, {5, 3}, {8, 2}} {
		extent := c.extent
		g := ir.SplitGroups{Splits: splits, R: c.R} // split s covers chunk g.Chunk(s)
		r := newRig()
		q := r.tensor("q", ir.F32, sh(1, 1, 1, 1), 1)
		k := r.tensor("k", ir.F32, sh(1, 1, S, 1), 1, 1, 1, 1, 1, 1, 1, 1)
		v := r.tensor("v", ir.F32, sh(1, 1, S, 1), 1, 2, 3, 4, 5, 6, 7, 8)
		maskVals := make([]float64, S)
		for j := range maskVals {
			if float64(j) >= extent {
				maskVals[j] = math.Inf(-1)
			}
		}
		m := r.tensor("m", ir.F32, sh(1, 1, 1, S), maskVals...)
		e := r.tensor("e", ir.I32, sh(1), extent)
		stale := make([]float64, splits*3)
		for i := range stale {
			stale[i] = 7
		}
		out := r.tensor("p", ir.F32, sh(1, splits, 1, 1, 3), stale...)
		op := &ir.Op{Kind: ir.Attention, In: []ir.View{q, k, v, m, e}, Out: out,
			Attr: ir.Attrs{Scale: 1, Groups: 1, Splits: splits, HasMask: true, HasExtent: true, Interleave: c.R}}
		if err := r.run(op, nil); err != nil {
			t.Fatal(err)
		}
		got := r.read(out)
		for s := 0; s < splits; s++ {
			row, ch := got[3*s:3*s+3], int(g.Chunk(int64(s)))
			if float64(2*ch) >= extent {
				expect(t, fmt.Sprintf("%+v, split %d: chunk %d (past it)", c, s, ch), row, []float64{7, 7, 7}, 0)
				continue
			}
			// Positions 2ch and 2ch+1, the visible ones below the extent.
			var l, acc float64
			for j := 2 * ch; j < 2*ch+2 && float64(j) < extent; j++ {
				l++
				acc += float64(j + 1)
			}
			expect(t, fmt.Sprintf("%+v, split %d: chunk %d", c, s, ch), row, []float64{1, l, acc}, 1e-9)
		}
	}
}
