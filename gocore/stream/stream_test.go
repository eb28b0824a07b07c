package stream

import (
	"testing"

	"mpk/gocore/ir"
)

func linear(M, N, K int64, dt ir.DType, wStrides []int64, kind ir.BufKind) *ir.Op {
	return linearX(M, N, K, dt, dt, wStrides, kind)
}

// linearX is a Linear whose x has its own dtype (fp32: lower/widen.go).
func linearX(M, N, K int64, xdt, dt ir.DType, wStrides []int64, kind ir.BufKind) *ir.Op {
	w := &ir.Buffer{Name: "w", Kind: kind, DType: dt, Numel: N * K}
	x := &ir.Buffer{Name: "x", Kind: ir.Temp, DType: xdt, Numel: M * K}
	out := &ir.Buffer{Name: "out", Kind: ir.Temp, DType: dt, Numel: M * N}
	return &ir.Op{Kind: ir.Linear, In: []ir.View{
		{Buf: x, Shape: []int64{M, K}, Strides: []int64{K, 1}},
		{Buf: w, Shape: []int64{N, K}, Strides: wStrides},
	}, Out: ir.View{Buf: out, Shape: []int64{M, N}, Strides: []int64{N, 1}}}
}

func never(*ir.Buffer) bool { return false }

func TestPlans(t *testing.T) {
	cases := []struct {
		name              string
		op                *ir.Op
		ok                bool
		pageBytes, splits int64
	}{
		{"llama q", linear(1, 2048, 2048, ir.BF16, []int64{2048, 1}, ir.Input), true, 16384, 1},
		{"llama down", linear(1, 2048, 8192, ir.BF16, []int64{8192, 1}, ir.Input), true, 16384, 1},
		{"qwen3-0.6b down: 2 rows of 3072", linear(1, 1024, 3072, ir.BF16, []int64{3072, 1}, ir.Input), true, 12288, 1},
		{"qwen3-8b down: half a row a page", linear(1, 4096, 12288, ir.BF16, []int64{12288, 1}, ir.Input), true, 12288, 2},
		{"fp32 weights", linear(1, 64, 1024, ir.F32, []int64{1024, 1}, ir.Input), true, 16384, 1},
		{"two rows of x", linear(2, 64, 2048, ir.BF16, []int64{2048, 1}, ir.Input), true, 16384, 1},
		{"K not a multiple of a warp load", linear(1, 64, 896, ir.BF16, []int64{896, 1}, ir.Input), false, 0, 0},
		{"transposed weight", linear(1, 64, 2048, ir.BF16, []int64{1, 64}, ir.Input), false, 0, 0},
		{"weight computed in the graph", linear(1, 64, 2048, ir.BF16, []int64{2048, 1}, ir.Temp), false, 0, 0},
		{"int8 weight", linear(1, 64, 2048, ir.I8, []int64{2048, 1}, ir.Input), false, 0, 0},
	}
	for _, c := range cases {
		p, ok := For(c.op, never)
		if ok != c.ok || ok && (p.PageBytes != c.pageBytes || p.Split != c.splits) {
			t.Errorf("%s: plan %+v ok=%v, want ok=%v page %d split %d", c.name, p, ok, c.ok, c.pageBytes, c.splits)
		}
	}
	op := linear(1, 64, 2048, ir.BF16, []int64{2048, 1}, ir.Input)
	if _, ok := For(op, func(b *ir.Buffer) bool { return b == op.In[1].Buf }); ok {
		t.Error("a weight the graph writes must not stream: the loader reads it before any event")
	}
}

// TestTilePlans: x of more rows than registers hold meets 2-byte weights on
// the tensor cores, in pages of 8 rows' segments; an fp32 x keeps its low
// part where both parts fit in shared memory.
func TestTilePlans(t *testing.T) {
	bf := []int64{2048, 1}
	cases := []struct {
		name     string
		op       *ir.Op
		ok       bool
		cols     int64
		low      bool
		xBytes   int64
		pageRows int64
	}{
		{"batch 4 q, fp32 x", linearX(4, 2048, 2048, ir.F32, ir.BF16, bf, ir.Input), true, 1024, true, 2 * 4 * 2080 * 2, 8},
		{"batch 16 q, bf16 x", linearX(16, 2048, 2048, ir.BF16, ir.BF16, bf, ir.Input), true, 1024, false, 16 * 2080 * 2, 8},
		{"batch 4 down: x and its low part fit", linearX(4, 2048, 8192, ir.F32, ir.BF16, []int64{8192, 1}, ir.Input), true, 1024, true, 2 * 4 * 8224 * 2, 8},
		{"batch 8 down: x rounded", linearX(8, 2048, 8192, ir.F32, ir.BF16, []int64{8192, 1}, ir.Input), true, 1024, false, 8 * 8224 * 2, 8},
		{"K 1536: pages of 512 columns", linearX(4, 1024, 1536, ir.F32, ir.BF16, []int64{1536, 1}, ir.Input), true, 512, true, 2 * 4 * 1568 * 2, 8},
		{"batch 16 down: x too large", linearX(16, 2048, 8192, ir.F32, ir.BF16, []int64{8192, 1}, ir.Input), false, 0, false, 0, 0},
		{"K 768: no tile pages", linearX(4, 1024, 768, ir.F32, ir.BF16, []int64{768, 1}, ir.Input), false, 0, false, 0, 0},
		{"fp32 weights, more rows than registers hold", linearX(8, 1024, 2048, ir.F32, ir.F32, bf, ir.Input), false, 0, false, 0, 0},
	}
	for _, c := range cases {
		p, ok := For(c.op, never)
		if ok != c.ok || ok && (!p.Tiles || p.Cols != c.cols || p.XLow != c.low || p.XBytes() != c.xBytes ||
			p.PageBytes != c.pageRows*c.cols*2 || p.Unit() != 8) {
			t.Errorf("%s: plan %+v ok=%v, want ok=%v cols %d low %v x %d bytes", c.name, p, ok, c.ok, c.cols, c.low, c.xBytes)
		}
	}
	p, _ := For(linearX(4, 2048, 2048, ir.F32, ir.BF16, bf, ir.Input), never)
	if f := p.PartialFloats(20); f != (2*16*8+20)*4 {
		t.Errorf("tile partials of 20 rows: %d floats, want two groups' of every warp and the dots", f)
	}
	if p, _ := For(linear(2, 64, 2048, ir.BF16, bf, ir.Input), never); p.Tiles || p.Unit() != 1 {
		t.Errorf("two rows of x keep the register plan: %+v", p)
	}
}

// TestTileXParts: a tile stream's x whose whole exceeds TileXPartBytes is
// staged in the fewest parts of K (whole pages each) that fit it, where a
// task reads at most two row groups; else whole.
func TestTileXParts(t *testing.T) {
	plan := func(M, K int64) Plan {
		p, ok := For(linearX(M, 2048, K, ir.F32, ir.BF16, []int64{K, 1}, ir.Input), never)
		if !ok || !p.Tiles {
			t.Fatalf("M %d, K %d: plan %+v, %v; want tiles", M, K, p, ok)
		}
		return p
	}
	pair := plan(16, 2048)
	pair.Pair = true
	cases := []struct {
		name     string
		p        Plan
		taskRows int64
		wide     bool
		want     int64
	}{
		{"batch 8 down, 16 rows a task (132 KB of x rounded)", plan(8, 8192), 16, false, 2},
		{"batch 8 down, 8 rows a task", plan(8, 8192), 8, false, 2},
		{"batch 8 down, 24 rows a task (three groups)", plan(8, 8192), 24, false, 1},
		{"batch 4 down (132 KB with its low part)", plan(4, 8192), 16, false, 2},
		{"batch 8 q (66.5 KB: fits)", plan(8, 2048), 16, false, 1},
		{"batch 8 q, wide", plan(8, 2048), 16, true, 1},
		{"batch 16 gate, 62 rows a task (133 KB with its low part)", plan(16, 2048), 62, false, 1},
		{"batch 16 gate, 62 rows a task, wide", plan(16, 2048), 62, true, 2},
		{"batch 16 gate and up paired", pair, 16, false, 1},
		{"batch 16 gate and up paired, wide", pair, 16, true, 2},
		{"batch 8 down, 24 rows a task, wide", plan(8, 8192), 24, true, 2},
	}
	for _, c := range cases {
		if got := TileXParts(c.p, c.taskRows, c.wide); got != c.want {
			t.Errorf("%s: %d parts, want %d", c.name, got, c.want)
		}
	}
	half := plan(16, 2048)
	half.XParts = 2
	if got := half.XBytes(); got > TileXPartBytes {
		t.Errorf("batch 16's x of K 2,048 in 2 parts: %d bytes, more than %d", got, TileXPartBytes)
	}
	p := plan(8, 8192)
	p.XParts = 2
	if got, want := p.XBytes(), TileXBytes(4096, 8, 2, false); got != want || got > TileXPartBytes {
		t.Errorf("x in 2 parts: %d bytes, want %d (at most %d)", got, want, TileXPartBytes)
	}
	if got := TileXParts(Plan{M: 8, K: 8192, Tiles: false}, 8, true); got != 1 {
		t.Errorf("a register stream: %d parts, want 1", got)
	}
}

// TestMaxRows: the rows a block of a too-tall Linear takes keep an fp32
// x's low part when at least 4 do; a bf16 x has none to keep.
func TestMaxRows(t *testing.T) {
	cases := []struct {
		name string
		op   *ir.Op
		want int64
	}{
		{"batch-16 down, fp32 x: hi + lo fits 4 rows", linearX(16, 2048, 8192, ir.F32, ir.BF16, []int64{8192, 1}, ir.Input), 4},
		{"64-row q, fp32 x: 16 rows", linearX(64, 2048, 2048, ir.F32, ir.BF16, []int64{2048, 1}, ir.Input), 16},
		{"64-row q, bf16 x: 32 rows", linearX(64, 2048, 2048, ir.BF16, ir.BF16, []int64{2048, 1}, ir.Input), 32},
		{"qwen3-8b down, batch 16: hi + lo only 2 rows, rounded 5", linearX(16, 4096, 12288, ir.F32, ir.BF16, []int64{12288, 1}, ir.Input), 5},
		{"K 768: two rows in registers", linearX(64, 1024, 768, ir.F32, ir.BF16, []int64{768, 1}, ir.Input), 2},
		{"K 896: nothing streams", linearX(64, 1024, 896, ir.F32, ir.BF16, []int64{896, 1}, ir.Input), 0},
	}
	for _, c := range cases {
		if got := MaxRows(c.op, never); got != c.want {
			t.Errorf("%s: %d rows, want %d", c.name, got, c.want)
		}
	}
}

func TestTasks(t *testing.T) {
	p, _ := For(linear(1, 128256, 2048, ir.BF16, []int64{2048, 1}, ir.Input), never)
	// 525 MB of LM head: ⌈525 MB / 512 KiB⌉ = 1002 tasks, rounded up to 8 per worker.
	if n := p.Tasks(128256, 132); n != 1056 {
		t.Errorf("LM head: %d tasks, want 1056", n)
	}
	p, _ = For(linear(1, 512, 2048, ir.BF16, []int64{2048, 1}, ir.Input), never)
	if n := p.Tasks(512, 132); n != 132 {
		t.Errorf("k projection: %d tasks, want one per worker (132)", n)
	}
	if n := p.Tasks(64, 132); n != 64 {
		t.Errorf("64 rows: %d tasks, want 64 (a row each)", n)
	}
	if f := p.PartialFloats(4); f != 4*2048/256 {
		t.Errorf("partials of 4 rows: %d floats, want %d", f, 4*2048/256)
	}
}

// TestDeferredNorm: only a weighted RMSNorm over an fp32 x with an fp32
// result and one bf16 weight row broadcast over x's rows is deferred (and
// so may be staged in parts of K).
func TestDeferredNorm(t *testing.T) {
	normed := func(xdt, wdt, pdt ir.DType, rowStride int64, weight bool) *ir.Op {
		op := linearX(8, 2048, 2048, xdt, ir.BF16, []int64{2048, 1}, ir.Input)
		g := &ir.Buffer{Name: "g", Kind: ir.Input, DType: wdt, Numel: 2048}
		op.Attr.Pro = &ir.Prologue{Kind: ir.RMSNorm, First: 2, HasWeight: weight, DType: pdt, Eps: 1e-5}
		op.In = append(op.In, ir.View{Buf: g, Shape: []int64{8, 2048}, Strides: []int64{rowStride, 1}})
		return op
	}
	cases := []struct {
		name string
		op   *ir.Op
		want bool
	}{
		{"the widened residual stream's norm", normed(ir.F32, ir.BF16, ir.F32, 0, true), true},
		{"a bf16 x", normed(ir.BF16, ir.BF16, ir.F32, 0, true), false},
		{"an fp32 weight", normed(ir.F32, ir.F32, ir.F32, 0, true), false},
		{"a bf16 result", normed(ir.F32, ir.BF16, ir.BF16, 0, true), false},
		{"a weight row per x row", normed(ir.F32, ir.BF16, ir.F32, 2048, true), false},
		{"no weight", normed(ir.F32, ir.BF16, ir.F32, 0, false), false},
		{"no prologue", linearX(8, 2048, 2048, ir.F32, ir.BF16, []int64{2048, 1}, ir.Input), false},
	}
	for _, c := range cases {
		if got := DeferredNorm(c.op); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
