package codegen

import (
	"math"
	"strings"
	"testing"

	"mpk/gocore/arena"
	"mpk/gocore/ir"
	"mpk/gocore/tgraph"
)

func TestExprC(t *testing.T) {
	L := ir.Load
	a := func(op ir.ExprOp, xs ...*ir.Expr) *ir.Expr { return ir.Apply(op, xs...) }
	cases := []struct {
		e    *ir.Expr
		want string
	}{
		{L(2), "in[2]"},
		{ir.Index(1), "(double)idx[1]"},
		{ir.Const(0.5), "0.5"},
		{ir.Const(3), "3"},
		{ir.Const(1e-6), "9.9999999999999995e-07"},
		{ir.Const(math.NaN()), "(double)NAN"},
		{ir.Const(math.Inf(1)), "(double)INFINITY"},
		{ir.Const(math.Inf(-1)), "(-(double)INFINITY)"},
		{ir.Cast(ir.BF16, L(0)), "mpk::round_to(1, in[0])"},
		{ir.Cast(ir.I64, L(0)), "mpk::round_to(4, in[0])"},
		{a(ir.EAdd, L(0), L(1)), "(in[0] + in[1])"},
		{a(ir.ESub, L(0), L(1)), "(in[0] - in[1])"},
		{a(ir.EMul, L(0), ir.Const(2)), "(in[0] * 2)"},
		{a(ir.EDiv, L(0), L(1)), "(in[0] / in[1])"},
		{a(ir.EPow, L(0), ir.Const(2)), "mpk::powd(in[0], 2)"},
		{a(ir.EMax, L(0), L(1)), "fmax(in[0], in[1])"},
		{a(ir.EMin, L(0), L(1)), "fmin(in[0], in[1])"},
		{a(ir.ENeg, L(0)), "(-in[0])"},
		{a(ir.EExp, L(0)), "exp(in[0])"},
		{a(ir.ELog, L(0)), "log(in[0])"},
		{a(ir.ESqrt, L(0)), "sqrt(in[0])"},
		{a(ir.ERsqrt, L(0)), "rsqrt(in[0])"},
		{a(ir.ESin, L(0)), "sin(in[0])"},
		{a(ir.ECos, L(0)), "cos(in[0])"},
		{a(ir.ETanh, L(0)), "tanh(in[0])"},
		{a(ir.ESigmoid, L(0)), "(1.0 / (1.0 + exp(-(in[0]))))"},
		{a(ir.ESilu, L(0)), "mpk::silud(in[0])"},
		{a(ir.EGelu, L(0)), "mpk::gelud(in[0])"},
		{a(ir.EGeluTanh, L(0)), "mpk::gelu_tanhd(in[0])"},
		{a(ir.EAbs, L(0)), "fabs(in[0])"},
		{a(ir.ERecip, L(0)), "(1.0 / (in[0]))"},
		{a(ir.ERelu, L(0)), "fmax(in[0], 0.0)"},
		{a(ir.EErf, L(0)), "erf(in[0])"},
		{a(ir.EWhere, L(0), L(1), ir.Const(0)), "(in[0] != 0.0 ? in[1] : 0)"},
		{a(ir.ELt, L(0), L(1)), "(double)(in[0] < in[1])"},
		{a(ir.ELe, L(0), L(1)), "(double)(in[0] <= in[1])"},
		{a(ir.EGt, L(0), L(1)), "(double)(in[0] > in[1])"},
		{a(ir.EGe, L(0), L(1)), "(double)(in[0] >= in[1])"},
		{a(ir.EEq, L(0), L(1)), "(double)(in[0] == in[1])"},
		{a(ir.ENe, L(0), L(1)), "(double)(in[0] != in[1])"},
		{a(ir.EAnd, L(0), L(1)), "(double)((long long)(in[0]) & (long long)(in[1]))"},
		{a(ir.EOr, L(0), L(1)), "(double)((long long)(in[0]) | (long long)(in[1]))"},
		{a(ir.ENot, L(0)), "(double)(in[0] == 0.0)"},
		{a(ir.EIsNaN, L(0)), "(double)isnan(in[0])"},
		{ir.Cast(ir.BF16, a(ir.EMul, a(ir.ESilu, ir.Cast(ir.F32, L(0))), L(1))), "mpk::round_to(1, (mpk::silud(mpk::round_to(0, in[0])) * in[1]))"},
	}
	covered := map[ir.ExprOp]bool{}
	for _, c := range cases {
		covered[c.e.Op] = true
		if got := exprC(c.e, true); got != c.want {
			t.Errorf("exprC(%s) = %q, want %q", c.e, got, c.want)
		}
	}
	for op := ir.ELoad; op <= ir.EIsNaN; op++ {
		if !covered[op] {
			t.Errorf("no exprC case for expression op %s", op)
		}
	}
}

func TestExprCFloat32Functions(t *testing.T) {
	L := ir.Load
	a := func(op ir.ExprOp, xs ...*ir.Expr) *ir.Expr { return ir.Apply(op, xs...) }
	cases := []struct {
		e    *ir.Expr
		want string
	}{
		{a(ir.EExp, L(0)), "(double)expf((float)(in[0]))"},
		{a(ir.ECos, a(ir.EMul, L(0), L(1))), "(double)cosf((float)((in[0] * in[1])))"},
		{a(ir.EPow, L(0), ir.Const(2)), "(double)mpk::powf_((float)(in[0]), (float)(2))"},
		{a(ir.ESilu, L(0)), "(double)mpk::siluf((float)(in[0]))"},
		{a(ir.ESigmoid, L(0)), "(double)mpk::sigmoidf((float)(in[0]))"},
		{a(ir.EGelu, L(0)), "(double)mpk::geluf((float)(in[0]))"},
		{a(ir.EGeluTanh, L(0)), "(double)mpk::gelu_tanhf((float)(in[0]))"},
		{a(ir.EAdd, L(0), L(1)), "(in[0] + in[1])"}, // arithmetic stays double
		{a(ir.EMax, L(0), L(1)), "fmax(in[0], in[1])"},
		{ir.Cast(ir.I64, a(ir.EAdd, L(0), ir.Const(1))), "mpk::round_to(4, (in[0] + 1))"},
	}
	for _, c := range cases {
		if got := exprC(c.e, false); got != c.want {
			t.Errorf("exprC(%s, fp32) = %q, want %q", c.e, got, c.want)
		}
	}
}

func TestLayout(t *testing.T) {
	g := &ir.Graph{}
	in := g.NewBuffer("x", ir.Input, ir.F32, 10)
	in1 := g.NewBuffer("y", ir.Input, ir.I64, 1)
	in1.Index = 1
	g.Inputs = []*ir.Buffer{in, in1}
	a := g.NewBuffer("a", ir.Temp, ir.F32, 10)
	dead := g.NewBuffer("dead", ir.Temp, ir.F32, 1<<20) // no op touches it (fused away)
	b := g.NewBuffer("b", ir.Temp, ir.BF16, 200)
	c := g.NewBuffer("c", ir.Temp, ir.I64, 1)
	out := g.NewBuffer("o", ir.Output, ir.F32, 4)
	g.Outputs = []ir.View{{Buf: out, Shape: []int64{4}, Strides: []int64{1}}}
	flat := func(buf *ir.Buffer) ir.View {
		return ir.View{Buf: buf, Shape: []int64{buf.Numel}, Strides: []int64{1}}
	}
	// First touched in the order c, a, b.
	g.Ops = []*ir.Op{
		{Kind: ir.Elementwise, In: []ir.View{flat(in1)}, Out: flat(c)},
		{Kind: ir.Elementwise, In: []ir.View{flat(in), flat(c)}, Out: flat(a)},
		{Kind: ir.Elementwise, In: []ir.View{flat(a)}, Out: flat(b)},
		{Kind: ir.Elementwise, In: []ir.View{flat(b)}, Out: g.Outputs[0]},
	}
	tg := &tgraph.Graph{}
	arena.Place(g, tg, false)
	l, err := newLayout(g, tg)
	if err != nil {
		t.Fatal(err)
	}
	if l.arenaSlot != 3 || l.slot[in] != 0 || l.slot[in1] != 1 || l.slot[out] != 2 || l.slot[a] != 3 || l.slot[c] != 3 {
		t.Errorf("slots %v, arena slot %d; want inputs 0,1, output 2, arena 3", l.slot, l.arenaSlot)
	}
	if _, ok := l.slot[dead]; ok {
		t.Errorf("a temporary no op touches got a slot")
	}
	// c: 8 bytes → [0, 256); a: 40 bytes → [256, 512); b: 400 bytes → [512, 1024).
	if l.offset[c] != 0 || l.offset[a] != 256/4 || l.offset[b] != 512/2 || l.arenaBytes != 1024 {
		t.Errorf("offsets c=%d a=%d b=%d (elements), arena %d bytes; want 0, 64, 256, 1024", l.offset[c], l.offset[a], l.offset[b], l.arenaBytes)
	}
}

func TestGenerateRejects(t *testing.T) {
	newGraph := func(kind ir.Kind, dt ir.DType, shape []int64, nIn int) *ir.Graph {
		g := &ir.Graph{}
		o := g.NewTemp("o", dt, shape)
		op := &ir.Op{Kind: kind, Label: kind.String(), Out: o}
		for i := 0; i < nIn; i++ {
			op.In = append(op.In, g.NewTemp("i", dt, shape))
		}
		if kind == ir.Elementwise {
			op.Attr.Expr = ir.Load(0)
		}
		g.Ops = []*ir.Op{op}
		return g
	}
	task := func(lo, hi []int64) *tgraph.Task {
		return &tgraph.Task{Op: 0, Box: tgraph.Box{Lo: lo, Hi: hi}, Wait: tgraph.None, Trigger: tgraph.None}
	}
	cases := []struct {
		name  string
		g     *ir.Graph
		tasks []*tgraph.Task
		err   string
	}{
		{"tiles cut along two dims", newGraph(ir.Elementwise, ir.F32, []int64{4, 4}, 1),
			[]*tgraph.Task{task([]int64{0, 0}, []int64{2, 4}), task([]int64{0, 0}, []int64{4, 2})}, "tiled along two dims"},
		{"too many inputs", newGraph(ir.Elementwise, ir.F32, []int64{4}, MaxInputs+1),
			[]*tgraph.Task{task([]int64{0}, []int64{4})}, "more than MPK_MAX_INPUTS"},
		{"f64 linear", func() *ir.Graph {
			g := newGraph(ir.Linear, ir.F64, []int64{2, 4}, 2)
			return g
		}(), []*tgraph.Task{task([]int64{0, 0}, []int64{2, 4})}, "linear op 0 on float64 × float64"},
	}
	for _, c := range cases {
		tg := &tgraph.Graph{Workers: 1, Tasks: c.tasks, Queues: [][]int{{0}}}
		arena.Place(c.g, tg, false)
		_, err := Generate(c.g, tg, Options{})
		if err == nil || !strings.Contains(err.Error(), c.err) {
			t.Errorf("%s: err %v, want %q", c.name, err, c.err)
		}
	}
}

// TestLinearWeightPaths: a Linear whose weight is a parameter nothing writes
// streams through the ring; one whose weight an op of the graph writes (a
// cache read as a matrix, say) is read coherently by the register Linear,
// never through the read-only path nor ahead of its event by the loader.
func TestLinearWeightPaths(t *testing.T) {
	build := func(writeW bool) string {
		g := &ir.Graph{}
		w := g.NewBuffer("w", ir.Input, ir.BF16, 64*256)
		x := g.NewBuffer("x", ir.Input, ir.BF16, 256)
		x.Index = 1
		g.Inputs = []*ir.Buffer{w, x}
		wv := ir.View{Buf: w, Shape: []int64{64, 256}, Strides: []int64{256, 1}}
		xv := ir.View{Buf: x, Shape: []int64{1, 256}, Strides: []int64{256, 1}}
		out := g.NewBuffer("o", ir.Output, ir.BF16, 64)
		g.Outputs = []ir.View{{Buf: out, Shape: []int64{1, 64}, Strides: []int64{64, 1}}}
		g.Ops = []*ir.Op{{Kind: ir.Linear, Label: "linear", In: []ir.View{xv, wv}, Out: g.Outputs[0]}}
		if writeW { // an op before the Linear writes its weight
			g.Ops = append([]*ir.Op{{Kind: ir.Copy, Label: "copy", In: []ir.View{wv}, Out: wv}}, g.Ops...)
		}
		g.Renumber()
		var tasks []*tgraph.Task
		for i, op := range g.Ops {
			sh := op.Out.Shape
			tasks = append(tasks, &tgraph.Task{ID: i, Op: i, Box: tgraph.Box{Lo: make([]int64, len(sh)), Hi: sh},
				Wait: tgraph.None, Trigger: tgraph.None})
		}
		tg := &tgraph.Graph{Workers: 1, Tasks: tasks, Queues: [][]int{{0}}}
		if writeW {
			tg.Queues = [][]int{{0, 1}}
		}
		arena.Place(g, tg, false)
		m, err := Generate(g, tg, Options{})
		if err != nil {
			t.Fatal(err)
		}
		return m.Files["module.cu"]
	}
	if src := build(false); !strings.Contains(src, "mpk::linear_stream<__nv_bfloat16, 256, 1, 16384, kRingSlots, false, mpk::NoPro, mpk::NoEpi>") ||
		!strings.Contains(src, "kSizedRingPages = 10") {
		t.Errorf("a constant weight does not stream:\n%s", src)
	}
	src := build(true)
	if !strings.Contains(src, "mpk::linear<__nv_bfloat16, 256, false, mpk::NoPro, mpk::NoEpi, false>") || strings.Contains(src, "linear_stream") ||
		!strings.Contains(src, "kSizedRingPages = 0") {
		t.Errorf("a weight the graph writes must take the coherent register Linear and no ring:\n%s", src)
	}
}
