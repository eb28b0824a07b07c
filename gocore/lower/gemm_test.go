package lower

import (
	"strings"
	"testing"

	"mpk/gocore/ir"
	"mpk/gocore/stream"
)

// TestGemm: a 64-token chunk's q projection (x 64 × 2,048 after an
// RMSNorm) is a GEMM stream: the norm stays its own op (writing x in fp32,
// as every intermediate), and with N = 2,048 (32 tasks of 64 rows) K is cut into 4
// slices of 512 so the tasks cover 132 workers. A gate projection (N =
// 8,192: 128 tasks) keeps K whole; 512 rows become 8 GEMM streams over
// blocks of 64 rows where split_rows cuts them; a batch of 16 rows, or K
// not a multiple of 256, is no GEMM, nor is anything with the option off or
// no workers.
func TestGemm(t *testing.T) {
	build := func(M, K, N int64) (*builder, *ir.Op, *ir.Op) {
		b := newBuilder()
		h := b.input("h", ir.F32, M, K)
		nw := b.param("norm_w", ir.BF16, K)
		x := b.temp("x", ir.BF16, M, K)
		norm := b.op(ir.RMSNorm, x, h, strided(nw, 0, sh(M, K), sh(0, 1)))
		norm.Attr.HasWeight, norm.Attr.Eps = true, 1e-5
		w := b.param("w", ir.BF16, N, K)
		out := b.temp("out", ir.BF16, M, N)
		l := b.op(ir.Linear, out, x, w)
		b.output(out)
		return b, norm, l
	}
	cfg := Config{Workers: 132, Gemm: true}
	b, norm, l := build(64, 2048, 2048)
	Rewrite(b.g, cfg)
	if got := kinds(b.g); got != "rmsnorm linear linear linear linear elementwise:linear_k_sum" {
		t.Fatalf("q projection: ops %s", got)
	}
	if b.g.Ops[0] != norm || norm.Out.DType() != ir.F32 {
		t.Fatalf("the norm should stay, writing fp32: %v %s", b.g.Ops[0].Kind, norm.Out.DType())
	}
	for _, s := range b.g.Ops[1:5] {
		if !s.Attr.Gemm || s.Attr.Pro != nil || s.Attr.KParts != 4 || s.In[0].Buf != norm.Out.Buf || s.In[0].Shape[1] != 512 {
			t.Fatalf("slice: gemm %v, pro %v, parts %d, x %v", s.Attr.Gemm, s.Attr.Pro, s.Attr.KParts, s.In[0])
		}
	}
	_ = l
	b, _, l = build(64, 2048, 8192)
	Rewrite(b.g, cfg)
	if got := kinds(b.g); got != "rmsnorm linear" || !l.Attr.Gemm || l.Attr.KParts != 0 {
		t.Fatalf("gate projection: ops %s, gemm %v, parts %d", got, l.Attr.Gemm, l.Attr.KParts)
	}
	// 512 rows (a long prompt chunk) with split_rows: 8 GEMM streams over
	// blocks of 64 rows, K whole (8 blocks of 32 tasks cover the workers).
	b, norm, _ = build(512, 2048, 2048)
	Rewrite(b.g, Config{Workers: 132, Gemm: true, SplitRows: true})
	if got := kinds(b.g); got != "rmsnorm linear linear linear linear linear linear linear linear" {
		t.Fatalf("512 rows: ops %s", got)
	}
	for i, s := range b.g.Ops[1:] {
		if !s.Attr.Gemm || s.Attr.KParts != 0 || s.Out.Shape[0] != 64 || s.In[0].Offset != int64(i)*64*2048 ||
			s.In[0].Buf != norm.Out.Buf {
			t.Fatalf("block %d: gemm %v, parts %d, out %v, x %v", i, s.Attr.Gemm, s.Attr.KParts, s.Out.Shape, s.In[0])
		}
	}
	// Without split_rows nothing cuts 512 rows into blocks: no GEMM, the norm folded.
	b, _, l = build(512, 2048, 2048)
	Rewrite(b.g, cfg)
	if l.Attr.Gemm || l.Attr.Pro == nil {
		t.Errorf("512 rows without split_rows: gemm %v, prologue %v", l.Attr.Gemm, l.Attr.Pro)
	}
	// gemm_row_blocks: the q projection's 64 rows become two GEMM streams of
	// 32 rows, K whole and no sum (2 x 32 tasks of 16 units against 4 x 32
	// of 8 and the sums' stage); a k projection (N = 512) likewise; the down
	// projection (K = 8,192) keeps its 4 slices.
	rb := Config{Workers: 132, Gemm: true, GemmRowBlocks: true}
	for _, N := range []int64{2048, 512} {
		b, norm, _ = build(64, 2048, N)
		Rewrite(b.g, rb)
		if got := kinds(b.g); got != "rmsnorm linear linear" {
			t.Fatalf("N %d with row blocks: ops %s", N, got)
		}
		for i, s := range b.g.Ops[1:] {
			if !s.Attr.Gemm || s.Attr.KParts != 0 || s.Out.Shape[0] != 32 || s.In[0].Offset != int64(i)*32*2048 ||
				s.In[0].Buf != norm.Out.Buf || s.In[0].Shape[1] != 2048 || s.Out.Offset != int64(i)*32*N {
				t.Fatalf("N %d block %d: gemm %v, parts %d, out %v, x %v", N, i, s.Attr.Gemm, s.Attr.KParts, s.Out, s.In[0])
			}
		}
	}
	// 512 rows: a k projection's 8 blocks of 64 rows would take 2 slices of
	// K each; with row blocks, 16 streams of 32 rows.
	b, _, _ = build(512, 2048, 512)
	Rewrite(b.g, Config{Workers: 132, Gemm: true, SplitRows: true, GemmRowBlocks: true})
	if got := kinds(b.g); got != "rmsnorm"+strings.Repeat(" linear", 16) {
		t.Fatalf("512 rows, N 512, with row blocks: ops %s", got)
	}
	for i, s := range b.g.Ops[1:] {
		if !s.Attr.Gemm || s.Attr.KParts != 0 || s.Out.Shape[0] != 32 || s.In[0].Offset != int64(i)*32*2048 {
			t.Fatalf("512 rows, block %d: gemm %v, parts %d, out %v, x %v", i, s.Attr.Gemm, s.Attr.KParts, s.Out.Shape, s.In[0])
		}
	}
	// round_gemm_inputs: the norm's output, read only as a GEMM stream's x,
	// stays bf16, and the stream stages it as it is (no low part).
	b, norm, l = build(64, 2048, 8192)
	Rewrite(b.g, Config{Workers: 132, Gemm: true, RoundGemmInputs: true})
	if p, ok := stream.For(l, stream.Writers(b.g)); norm.Out.DType() != ir.BF16 || !ok || !p.Gemm || p.XLow {
		t.Fatalf("round_gemm_inputs: x %s, plan %+v (ok %v)", norm.Out.DType(), p, ok)
	}
	b, _, _ = build(64, 8192, 2048)
	Rewrite(b.g, rb)
	if got := kinds(b.g); got != "rmsnorm linear linear linear linear elementwise:linear_k_sum" {
		t.Fatalf("down projection with row blocks: ops %s", got)
	}
	// On wgmma, a block of 32 rows costs 0.65 of one of 64 (hi and lo
	// stacked in one m64 tile), not half: qwen3-8b's down projection (K =
	// 12,288, N = 4,096) takes 2 slices of K and their sum rather than two
	// streams of 32 rows, which mma.sync's costs pick; its q projection (K =
	// 4,096) and llama-3.2-1b's (K = 2,048) keep row blocks, llama-3.2-1b's
	// down projection its 4 slices.
	wg := Config{Workers: 132, Gemm: true, Wgmma: true, GemmRowBlocks: true}
	wgb := Config{Workers: 132, Gemm: true, Wgmma: true, GemmBatch: true}
	for _, c := range []struct {
		K, N int64
		cfg  Config
		want string
	}{
		{12288, 4096, wg, "rmsnorm linear linear elementwise:linear_k_sum"},
		{12288, 4096, rb, "rmsnorm linear linear"},
		{4096, 4096, wg, "rmsnorm linear linear"},
		{2048, 2048, wg, "rmsnorm linear linear"},
		{8192, 2048, wg, "rmsnorm linear linear linear linear elementwise:linear_k_sum"},
	} {
		b, _, _ = build(64, c.K, c.N)
		Rewrite(b.g, c.cfg)
		if got := kinds(b.g); got != c.want {
			t.Fatalf("K %d, N %d, wgmma %v: ops %s, want %s", c.K, c.N, c.cfg.Wgmma, got, c.want)
		}
		if c.cfg.Wgmma && !b.g.Ops[1].Attr.Wgmma {
			t.Fatalf("K %d, N %d: not a wgmma stream", c.K, c.N)
		}
	}
	for _, c := range []struct {
		M, K int64
		cfg  Config
	}{{16, 2048, cfg}, {64, 1000, cfg}, {64, 2048, Config{Gemm: true}}, {64, 2048, Config{Workers: 132}},
		{16, 2048, Config{Workers: 132, Gemm: true, GemmBatch: true}}, {3, 2048, wgb}, {16, 2048, wgb}} {
		b, _, l := build(c.M, c.K, 2048)
		Rewrite(b.g, c.cfg)
		if l.Attr.Gemm || l.Attr.Pro == nil {
			t.Errorf("%d x %d, %+v: gemm %v, prologue %v: want the norm folded, no GEMM", c.M, c.K, c.cfg, l.Attr.Gemm, l.Attr.Pro)
		}
	}
	// gemm_batch: a decode batch of 4 or 16 rows with bf16 weights is a
	// wgmma GEMM stream (its norm its own op) where N = 8,192 (128 tasks of
	// 64 rows) covers the workers; 3 rows, no wgmma, or N = 2,048 (above),
	// stay a tile stream with the norm folded.
	for _, M := range []int64{4, 16} {
		b, norm, _ = build(M, 2048, 8192)
		Rewrite(b.g, wgb)
		if got := kinds(b.g); got != "rmsnorm linear" || b.g.Ops[0] != norm || !b.g.Ops[1].Attr.Gemm || !b.g.Ops[1].Attr.Wgmma {
			t.Fatalf("batch %d with gemm_batch: ops %s, gemm %v", M, got, b.g.Ops[1].Attr)
		}
	}
}
