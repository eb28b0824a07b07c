package lower

import (
	"fmt"
	"strings"
	"testing"

	"mpk/gocore/ir"
)

// TestGemmSiblings: a 64-token chunk's q, k and v projections (one normed
// x) on wgmma and 132 workers. qwen3-8b's (K 4,096; 64 + 16 + 16 tasks of
// 64 weight rows) run uncut, one round of 96 tasks, where each cut alone
// took q as two blocks of 32 rows of x and k and v as 8 slices of K with
// their sums; llama-3.2-1b's (K 2,048; 32 + 8 + 8 tasks) keep two blocks of
// 32 rows each, 96 tasks in one round, as alone.
func TestGemmSiblings(t *testing.T) {
	build := func(K, Nq, Nkv int64) *builder {
		b := newBuilder()
		h := b.input("h", ir.F32, 64, K)
		nw := b.param("norm_w", ir.BF16, K)
		x := b.temp("x", ir.BF16, 64, K)
		norm := b.op(ir.RMSNorm, x, h, strided(nw, 0, sh(64, K), sh(0, 1)))
		norm.Attr.HasWeight, norm.Attr.Eps = true, 1e-5
		var outs []ir.View
		for i, N := range []int64{Nq, Nkv, Nkv} {
			w := b.param(fmt.Sprintf("w%d", i), ir.BF16, N, K)
			out := b.temp(fmt.Sprintf("out%d", i), ir.BF16, 64, N)
			b.op(ir.Linear, out, x, w)
			outs = append(outs, out)
		}
		b.output(outs...)
		return b
	}
	cfg := Config{Workers: 132, Gemm: true, Wgmma: true, GemmRowBlocks: true, GemmSiblings: true}
	alone := cfg
	alone.GemmSiblings = false
	eight := "rmsnorm" + strings.Repeat(" linear", 8) + " elementwise:linear_k_sum"
	for _, c := range []struct {
		name          string
		K, Nq, Nkv    int64
		cfg           Config
		want, rowsOut string
	}{
		{"qwen3-8b", 4096, 4096, 1024, cfg, "rmsnorm linear linear linear", "64 64 64"},
		{"qwen3-8b alone", 4096, 4096, 1024, alone, "rmsnorm linear linear" + eight[7:] + eight[7:], ""},
		{"llama-3.2-1b", 2048, 2048, 512, cfg, "rmsnorm linear linear linear linear linear linear", "32 32 32 32 32 32"},
	} {
		b := build(c.K, c.Nq, c.Nkv)
		Rewrite(b.g, c.cfg)
		if got := kinds(b.g); got != c.want {
			t.Fatalf("%s: ops %s, want %s", c.name, got, c.want)
		}
		var rows []string
		for _, op := range b.g.Ops[1:] {
			rows = append(rows, fmt.Sprint(op.Out.Shape[0]))
			if op.Kind == ir.Linear && (!op.Attr.Gemm || !op.Attr.Wgmma) {
				t.Fatalf("%s: %s not a wgmma stream", c.name, op.Label)
			}
		}
		if c.rowsOut != "" && strings.Join(rows, " ") != c.rowsOut {
			t.Fatalf("%s: x rows %v, want %s", c.name, rows, c.rowsOut)
		}
	}
}

// TestGemmRunCost: the stage's cost deals the tasks round-robin: 160 tasks
// on 132 workers put a second task on 28 of them, and a stage of sums follows
// any sliced stream.
func TestGemmRunCost(t *testing.T) {
	b := newBuilder()
	x := b.input("x", ir.F32, 64, 4096)
	q := b.op(ir.Linear, b.temp("q", ir.BF16, 64, 4096), x, b.param("wq", ir.BF16, 4096, 4096))
	k := b.op(ir.Linear, b.temp("k", ir.BF16, 64, 1024), x, b.param("wk", ir.BF16, 1024, 4096))
	for _, op := range []*ir.Op{q, k} {
		op.Attr.Gemm, op.Attr.Wgmma = true, true
	}
	whole := int64(wgmmaTaskCost + 16*wgmmaBlockCost)
	rows := int64(wgmmaTaskCost + 16*wgmmaStackedCost)
	slice := int64(wgmmaTaskCost + 2*wgmmaBlockCost)
	for _, c := range []struct {
		cuts        []gemmCut
		cost, tasks int64
	}{
		{[]gemmCut{{}, {}}, whole, 80},
		{[]gemmCut{{Blocks: 2}, {}}, rows + whole, 144},
		{[]gemmCut{{}, {Parts: 8}}, whole + slice + wgmmaSumCost, 192},
	} {
		cost, tasks := gemmRunCost([]*ir.Op{q, k}, c.cuts, 132)
		if cost != c.cost || tasks != c.tasks {
			t.Errorf("cuts %v: cost %d, %d tasks; want %d, %d", c.cuts, cost, tasks, c.cost, c.tasks)
		}
	}
}

// TestGemmRunEnd: a run holds the GEMM streams that follow one another over
// one x; a stream over another x (here the run's own product), one of
// another count of rows, one that reads a run member's product (as its
// residual), or an op that is no GEMM stream ends it.
func TestGemmRunEnd(t *testing.T) {
	b := newBuilder()
	x := b.input("x", ir.F32, 64, 1024)
	lin := func(name string, in ir.View, N int64) *ir.Op {
		op := b.op(ir.Linear, b.temp(name, ir.F32, in.Shape[0], N), in, b.param("w"+name, ir.BF16, N, in.Shape[1]))
		op.Attr.Gemm = true
		return op
	}
	q := lin("q", x, 1024)
	lin("k", x, 256)
	lin("v", x, 256)
	lin("after_q", q.Out, 1024)                                 // reads q's product
	lin("short", strided(x, 0, sh(32, 1024), sh(1024, 1)), 256) // 32 rows of x
	lin("k2", x, 256)
	b.ew(b.temp("e", ir.F32, 64, 256), ir.Load(0), b.g.Ops[5].Out)
	lin("v2", x, 256)
	res := lin("res", x, 256) // x · W + v2's product: same x, but not v2's sibling
	res.In = append(res.In, b.g.Ops[7].Out)
	res.Attr.Residual = true
	for _, c := range []struct{ i, want int }{{0, 3}, {3, 4}, {4, 5}, {5, 6}, {6, 7}, {7, 8}, {8, 9}} {
		if got := gemmRunEnd(b.g.Ops, c.i); got != c.want {
			t.Errorf("run from op %d (%s) ends at %d, want %d", c.i, b.g.Ops[c.i].Out.Buf.Name, got, c.want)
		}
	}
}
