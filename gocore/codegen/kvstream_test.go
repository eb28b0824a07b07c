package codegen

import (
	"testing"

	"mpk/gocore/ir"
)

// kvOp is llama-3.2-1b's decode attention at a cache of 552 as kv_pages
// lowers it: 8 units of 4 query heads x 5 splits, one a group.
func kvOp(dt ir.DType, D int64) *ir.Op { return kvBatchOp(dt, D, 1) }

// kvBatchOp is kvOp for B batch rows (kv_pages_batch).
func kvBatchOp(dt ir.DType, D, B int64) *ir.Op {
	g := &ir.Graph{}
	view := func(name string, kind ir.BufKind, dt ir.DType, shape ...int64) ir.View {
		return ir.View{Buf: g.NewBuffer(name, kind, dt, ir.Numel(shape)), Shape: shape, Strides: ir.ContiguousStrides(shape)}
	}
	return &ir.Op{Kind: ir.Attention,
		In: []ir.View{view("q", ir.Temp, ir.BF16, B, 32, 1, D), view("k", ir.Input, dt, B, 8, 552, D),
			view("v", ir.Input, dt, B, 8, 552, D)},
		Out:  view("partial", ir.Temp, ir.F32, B, 5, 32, 1, D+2),
		Attr: ir.Attrs{Splits: 5, Interleave: 5, UnitHeads: 4, Groups: 4, Fresh: &ir.FreshRows{}}}
}

// TestKVStream: a kv_pages attention's task streams its unit's chunk, 111
// rows of 128 a page (the last chunk 108), from its KV head's rows; an
// attention that is not a fresh-row one, whose splits share a group, whose
// cache is fp32 or not in contiguous rows, or whose chunk takes more than
// two pages streams nothing.
func TestKVStream(t *testing.T) {
	ks, ok := kvStreamOf(kvOp(ir.BF16, 64))
	if !ok || ks.Chunk != 111 || ks.RowsPerPage != 128 || ks.pagesPerPart(ks.Chunk) != 1 {
		t.Fatalf("kvStreamOf = %+v, %v; want chunks of 111 rows, 128 a page", ks, ok)
	}
	for _, c := range []struct{ lo, kvh, j0, rows int64 }{{0, 0, 0, 111}, {8, 1, 333, 111}, {39, 7, 444, 108}} {
		if b, kvh, j0, rows := ks.first(c.lo); b != 0 || kvh != c.kvh || j0 != c.j0 || rows != c.rows {
			t.Errorf("unit %d: row %d, KV head %d, rows [%d, +%d); want 0, %d, [%d, +%d)", c.lo, b, kvh, j0, rows, c.kvh, c.j0, c.rows)
		}
	}
	// A batch of 3: each row's 40 units (8 KV heads x 5 chunks) after the last row's.
	kb, ok := kvStreamOf(kvBatchOp(ir.BF16, 64, 3))
	if !ok {
		t.Fatalf("a batch of 3 streams nothing")
	}
	for _, c := range []struct{ lo, b, kvh, j0 int64 }{{0, 0, 0, 0}, {39, 0, 7, 444}, {40, 1, 0, 0}, {93, 2, 2, 333}} {
		if b, kvh, j0, _ := kb.first(c.lo); b != c.b || kvh != c.kvh || j0 != c.j0 {
			t.Errorf("batch, unit %d: row %d, KV head %d, from %d; want %d, %d, %d", c.lo, b, kvh, j0, c.b, c.kvh, c.j0)
		}
	}
	// The batch's task takes its pages round by round: a round of 4 warps'
	// 128 rows is one page of K and one of V (a ring of 2 fits it), where a
	// single sequence's task holds all its pages at once.
	if !kb.Stream || ks.Stream || kb.RoundRows != 128 || kb.roundPairs() != 1 || !kb.fits(2) || kb.fits(1) {
		t.Errorf("batch: stream %v (one row's %v), rounds of %d rows, %d page pairs, fits 2 %v, 1 %v; want true (false), 128, 1, true, false",
			kb.Stream, ks.Stream, kb.RoundRows, kb.roundPairs(), kb.fits(2), kb.fits(1))
	}
	if kd, _ := kvStreamOf(kvBatchOp(ir.BF16, 128, 3)); kd.roundPairs() != 2 || kd.fits(3) || !kd.fits(4) {
		t.Errorf("batch, head dim 128: %d page pairs a round, fits 3 %v, 4 %v; want 2, false, true", kd.roundPairs(), kd.fits(3), kd.fits(4))
	}
	// A batch's rounds on the tensor cores at either head dim, one row's
	// never, with mpk::kv_mma_bytes(64, 4) of shared memory: 4 heads' queries
	// and new V rows, 16 warps' states a head, the queries' staged hi and lo
	// rows.
	if kd, _ := kvStreamOf(kvBatchOp(ir.BF16, 128, 3)); !kb.mma() || ks.mma() || !kd.mma() || kb.mmaBytes() != (2*4*64+16*4*66)*4+2*8*72*2 {
		t.Errorf("tensor-core rounds: batch %v, one row %v, head dim 128 %v, %d bytes; want true, false, true, %d",
			kb.mma(), ks.mma(), kd.mma(), kb.mmaBytes(), (2*4*64+16*4*66)*4+2*8*72*2)
	}
	// Shapes mpk::DecodeMma does not take keep the lanes: a unit of 16
	// heads, and head dim 256 with 8 heads (153 KB of shared memory); 256
	// with 4 heads still fits.
	for _, c := range []struct {
		D, UG int64
		want  bool
	}{{64, 16, false}, {256, 8, false}, {256, 4, true}, {128, 8, true}} {
		op := kvBatchOp(ir.BF16, c.D, 3)
		op.Attr.UnitHeads, op.Attr.Groups = c.UG, c.UG
		k, ok := kvStreamOf(op)
		if !ok || !k.Stream || k.mma() != c.want {
			t.Errorf("head dim %d, %d heads a unit: stream %v/%v, tensor-core rounds %v (%d bytes); want %v", c.D, c.UG, ok, k.Stream,
				k.mma(), k.mmaBytes(), c.want)
		}
	}
	// Head dims attention_decode's vector loads or a page's whole rows do
	// not take (mpk::decode_fast_dims, mpk::KVPages) stream nothing: 192
	// (a lane's 12 bytes of V; 384-byte rows), 96, 80.
	for _, D := range []int64{192, 96, 80} {
		if _, ok := kvStreamOf(kvBatchOp(ir.BF16, D, 3)); ok {
			t.Errorf("head dim %d streams its K and V", D)
		}
	}
	if ks, ok := kvStreamOf(kvOp(ir.BF16, 128)); !ok || ks.RowsPerPage != 64 || ks.pagesPerPart(ks.Chunk) != 2 {
		t.Errorf("head dim 128: %+v, %v; want 64 rows a page, 2 pages a part", ks, ok)
	}
	// A task's 2 pages of K and 2 of V fit a ring of 4, not of 3 (then the
	// loader streams nothing for it and the task reads the cache).
	if ks, _ := kvStreamOf(kvOp(ir.BF16, 128)); !ks.fits(4) || ks.fits(3) {
		t.Errorf("head dim 128: fits a ring of 4 %v, of 3 %v; want true, false", ks.fits(4), ks.fits(3))
	}
	for name, edit := range map[string]func(*ir.Op){
		"no fresh rows":    func(op *ir.Op) { op.Attr.Fresh = nil },
		"groups of splits": func(op *ir.Op) { op.Attr.Interleave = 1 },
		"fp32 cache":       func(op *ir.Op) { *op = *kvOp(ir.F32, 64) },
		"head dim 512":     func(op *ir.Op) { *op = *kvOp(ir.BF16, 512) },
		"strided rows":     func(op *ir.Op) { op.In[1].Strides[2] = 128 },
		"a temporary":      func(op *ir.Op) { op.In[2].Buf.Kind = ir.Temp },
	} {
		op := kvOp(ir.BF16, 64)
		edit(op)
		if _, ok := kvStreamOf(op); ok {
			t.Errorf("%s: streams", name)
		}
	}
}

// TestKVLiveExtent: the loader may cut the kv streams to the live length
// only when every kv_pages attention reads one mask extent (In[4]); one
// without an extent, two extents, or a batch's (an extent a row) keep every
// chunk whole.
func TestKVLiveExtent(t *testing.T) {
	withExtent := func(ext ir.View) *ir.Op {
		op := kvOp(ir.BF16, 64)
		op.In = append(op.In, op.In[0], ext) // in[3] (the mask) stands in; in[4] the extent
		op.Attr.HasExtent = true
		return op
	}
	g := &ir.Graph{}
	e1 := ir.View{Buf: g.NewBuffer("extent", ir.Temp, ir.I32, 1), Shape: []int64{1}, Strides: []int64{1}}
	e2 := ir.View{Buf: g.NewBuffer("extent2", ir.Temp, ir.I32, 1), Shape: []int64{1}, Strides: []int64{1}}
	for _, c := range []struct {
		name string
		ops  []*ir.Op
		want bool
	}{
		{"one extent", []*ir.Op{withExtent(e1), withExtent(e1)}, true},
		{"two extents", []*ir.Op{withExtent(e1), withExtent(e2)}, false},
		{"no extent", []*ir.Op{withExtent(e1), kvOp(ir.BF16, 64)}, false},
		{"a batch's extents", []*ir.Op{func() *ir.Op { op := withExtent(e1); op.In[0].Shape[0] = 4; return op }()}, false},
		{"no kv_pages attention", nil, false},
	} {
		gen := &generator{kvs: map[*ir.Op]kvStream{}}
		for _, op := range c.ops {
			gen.kvs[op] = kvStream{}
		}
		if got := gen.kvLiveExtent(); got != c.want {
			t.Errorf("%s: kvLiveExtent = %v, want %v", c.name, got, c.want)
		}
	}
}

// TestKVSwizzles: a batch's kv stream on the tensor cores can take
// swizzled pages (kv_swizzle) at head dims of whole 128-byte blocks (64,
// 128), its K and V viewed alike from whole rows; not a single sequence's
// (no Stream), or a V viewed from another offset.
func TestKVSwizzles(t *testing.T) {
	for _, c := range []struct {
		D, B  int64
		shift bool // V's view one row further into its buffer
		want  bool
	}{{64, 3, false, true}, {128, 3, false, true}, {64, 1, false, false}, {64, 3, true, false}} {
		op := kvBatchOp(ir.BF16, c.D, c.B)
		if c.shift {
			op.In[2].Offset += c.D
		}
		ks, ok := kvStreamOf(op)
		if !ok {
			t.Fatalf("%+v streams nothing", c)
		}
		if got := ks.swizzles(op); got != c.want {
			t.Errorf("%+v: swizzles %v, want %v", c, got, c.want)
		}
	}
}
