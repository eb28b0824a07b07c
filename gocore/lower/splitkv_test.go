package lower

import (
	"slices"
	"testing"

	"mpk/gocore/ir"
)

// TestDecodeUnitHeads: a KV head's query heads share a decode attention unit
// (each K and V load serves all of them) when the units still cover every
// worker: llama-3.2-1b's shapes at batch 4, not at batch 1. A batch's chunks
// are 128 positions (5 of 552), a single sequence's 512 (2).
func TestDecodeUnitHeads(t *testing.T) {
	for _, c := range []struct {
		B, want, splits int64
	}{{1, 0, 2}, {4, 4, 5}, {16, 4, 5}} {
		b := newBuilder()
		q := b.input("q", ir.BF16, c.B, 32, 1, 64)
		k := b.input("k", ir.BF16, c.B, 8, 552, 64)
		v := b.input("v", ir.BF16, c.B, 8, 552, 64)
		att := b.temp("att", ir.F32, c.B, 32, 1, 64)
		a := b.op(ir.Attention, att, q, k, v)
		a.Attr.Scale, a.Attr.Groups = 1, 4
		b.output(att)
		splitAttention(b.g, 132, false, false, false, false)
		if a.Attr.Splits != c.splits || a.Attr.UnitHeads != c.want {
			t.Errorf("batch %d: %d splits, %d heads a unit; want %d splits, %d heads", c.B, a.Attr.Splits, a.Attr.UnitHeads, c.splits, c.want)
		}
	}
	// Head dim 128 (qwen3-8b): 4 outputs a lane a head, so 2 heads a unit; 6 groups of 256: none.
	for _, c := range []struct{ G, Dv, want int64 }{{4, 128, 2}, {4, 64, 4}, {8, 64, 4}, {6, 256, 1}, {3, 64, 3}, {3, 128, 1}} {
		if got := unitHeads(c.G, c.Dv); got != c.want {
			t.Errorf("unitHeads(%d, %d) = %d, want %d", c.G, c.Dv, got, c.want)
		}
	}
}

// TestKVPagesChunks: with kv_pages a single sequence's masked decode takes
// chunks of at most 128 positions (552: 5 of 111) and units of a KV head's
// query heads (unitHeads) wherever they fit the workers; a longer cache,
// units of all a KV head's heads and as many chunks as fit the workers,
// within stream.MaxKVPagesPerPart pages; a batch, an unmasked attention
// and a chunk past the pages keep the ordinary split.
func TestKVPagesChunks(t *testing.T) {
	build := func(B, S, Dv int64, mask bool) (*builder, *ir.Op) {
		b := newBuilder()
		q := b.input("q", ir.BF16, B, 32, 1, Dv)
		k := b.input("k", ir.BF16, B, 8, S, Dv)
		v := b.input("v", ir.BF16, B, 8, S, Dv)
		att := b.temp("att", ir.F32, B, 32, 1, Dv)
		a := b.op(ir.Attention, att, q, k, v)
		a.Attr.Scale, a.Attr.Groups = 1, 4
		if mask {
			a.In = append(a.In, b.input("mask", ir.BF16, B, 1, 1, S))
			a.Attr.HasMask = true
		}
		b.output(att)
		return b, a
	}
	for _, c := range []struct {
		B, S, Dv     int64
		mask         bool
		splits, unit int64
	}{
		{1, 552, 64, true, 5, 4},  // llama-3.2-1b: 8 units of 4 heads x 5 chunks
		{1, 552, 128, true, 5, 2}, // qwen3-8b: 16 units of 2 heads x 5 (4: 2.2% slower, H100)
		{1, 552, 64, false, 2, 0}, // no mask: the ordinary split
		{4, 552, 64, true, 5, 4},  // a batch: the ordinary split (5 of 128 too)
		// A long cache: units of all 4 heads and 16 chunks (8 x 16 <= 132 workers)
		{1, 4096, 64, true, 16, 4},  // chunks of 256 rows: 2 pages of K, 2 of V
		{1, 4136, 64, true, 16, 4},  // 259 rows: 3 pages each
		{1, 4136, 128, true, 16, 4}, // head dim 128 (qwen3-8b): 5 pages each
		{1, 8192, 128, true, 16, 2}, // 512 rows at head dim 128: 8 pages each, the ordinary split
		{1, 4096, 64, false, 8, 0},  // no mask: the ordinary split
		{1, 72, 64, true, 2, 0},     // a cache of one chunk: the ordinary split
	} {
		b, a := build(c.B, c.S, c.Dv, c.mask)
		splitAttention(b.g, 132, false, true, false, false)
		if a.Attr.Splits != c.splits || a.Attr.UnitHeads != c.unit {
			t.Errorf("%+v: %d splits, %d heads a unit", c, a.Attr.Splits, a.Attr.UnitHeads)
		}
	}
	// kv_pages_batch: a unit of all 4 heads of a KV head, and as many chunks
	// a (row, KV head) cell as fill the 132 workers in one round, two at
	// least (8 x 8 x 2 = 128 tasks at batch 8), whatever their pages (a task
	// takes them round by round); unmasked, or a round's pages past the
	// ring's, the ordinary split.
	for _, c := range []struct {
		B, S, Dv     int64
		mask, paged  bool
		splits, unit int64
	}{
		{8, 552, 64, true, true, 2, 4},
		{4, 552, 64, true, true, 4, 4},
		{16, 552, 128, true, true, 2, 4},
		{8, 552, 64, false, false, 5, 4},
		{8, 8192, 128, true, true, 2, 4},  // a long cache: chunks of 4,096 rows, 64 pages of K each
		{2, 552, 1024, true, false, 5, 0}, // head dim 1,024: a round of 96 rows takes 12 pages of K
	} {
		b, a := build(c.B, c.S, c.Dv, c.mask)
		splitAttention(b.g, 132, false, true, true, false)
		if a.Attr.Splits != c.splits || a.Attr.UnitHeads != c.unit || a.Attr.Paged != c.paged {
			t.Errorf("batch %+v: %d splits, %d heads a unit, paged %v", c, a.Attr.Splits, a.Attr.UnitHeads, a.Attr.Paged)
		}
		// The extent's bound keeps a paged task one chunk (one split a
		// group), where 64 (row, KV head) cells would interleave 2 groups.
		boundMergeByExtent(b.g, 132)
		if c.paged && (!a.Attr.HasExtent || a.Attr.Interleave != a.Attr.Splits) {
			t.Errorf("batch %+v: extent %v, %d groups of %d splits; want one split a group", c, a.Attr.HasExtent,
				a.Attr.Interleave, a.Attr.Splits)
		}
	}
}

// promptAttention is a graph of one attention of B sequences' Sq queries
// (8 heads, 2 KV heads of 64) over a cache of S positions, with a mask or not.
func promptAttention(B, Sq, S int64, mask bool) (*builder, *ir.Op) {
	return promptAttentionHeads(B, Sq, S, 2, mask)
}

// promptAttentionHeads is promptAttention with kvHeads KV heads of 4 query heads each.
func promptAttentionHeads(B, Sq, S, kvHeads int64, mask bool) (*builder, *ir.Op) {
	b := newBuilder()
	H := 4 * kvHeads
	q := b.input("q", ir.BF16, B, H, Sq, 64)
	k := b.input("k", ir.BF16, B, kvHeads, S, 64)
	v := b.input("v", ir.BF16, B, kvHeads, S, 64)
	att := b.temp("att", ir.F32, B, H, Sq, 64)
	a := b.op(ir.Attention, att, q, k, v)
	a.Attr.Scale, a.Attr.Groups = 1, 4
	if mask {
		a.In = append(a.In, strided(b.input("mask", ir.F32, B, 1, Sq, S), 0, sh(B, H, Sq, S), sh(Sq*S, 0, S, 1)))
		a.Attr.HasMask = true
	}
	b.output(att)
	return b, a
}

// TestSharedKVTasksAreBounded: a long prompt chunk over a long cache takes
// chunks of a tile while its tasks (KV heads × blocks of 16 rows × chunks)
// stay within 32 a worker, longer chunks past that.
func TestSharedKVTasksAreBounded(t *testing.T) {
	for _, c := range []struct{ Sq, S, splits int64 }{
		{64, 576, 9},      // 2 x 4 x 9 = 72 tasks: chunks of 64
		{64, 2568, 41},    // 328
		{512, 576, 9},     // 2 x 32 x 9 = 576
		{512, 16392, 66},  // 4,224 tasks / 64 a chunk: chunks of 249 positions
		{2048, 16392, 16}, // 4,224 / 256
		{4096, 16392, 8},  // 4,224 / 512
	} {
		b, a := promptAttention(1, c.Sq, c.S, true)
		splitAttention(b.g, 132, true, false, false, false)
		if !a.Attr.SharedKV || a.Attr.Splits != c.splits {
			t.Errorf("%+v: shared K and V %v, %d splits", c, a.Attr.SharedKV, a.Attr.Splits)
		}
	}
	// long_attention_chunks: as many chunks as one wave of tasks holds, at
	// least two (a 512-token prompt's 256 tasks a chunk are past a wave).
	for _, c := range []struct{ Sq, S, kvHeads, splits int64 }{
		{64, 576, 2, 9},    // 2 x 4 = 8 tasks a chunk: 16 chunks would fit, 9 tiles
		{64, 776, 8, 4},    // llama-3.2-1b's 8 KV heads x 4 blocks: 32 a chunk, 4 fit
		{512, 2056, 2, 2},  // 2 x 32 = 64 a chunk: 2 fit
		{2048, 2056, 2, 2}, // 256 a chunk: none fits a wave, two chunks still
	} {
		b, a := promptAttentionHeads(1, c.Sq, c.S, c.kvHeads, true)
		splitAttention(b.g, 132, true, false, false, true)
		if !a.Attr.SharedKV || a.Attr.Splits != c.splits {
			t.Errorf("long chunks %+v: shared K and V %v, %d splits", c, a.Attr.SharedKV, a.Attr.Splits)
		}
	}
	// The most tasks a worker (a chunk of at least two).
	b, a := promptAttention(1, 32768, 1024, true)
	splitAttention(b.g, 132, true, false, false, false)
	if a.Attr.Splits != 2 {
		t.Errorf("32,768 queries: %d splits, want 2", a.Attr.Splits)
	}
}

// TestPromptQueriesAsRows: one sequence's masked prompt chunk runs as decode
// over its queries: q, the mask and the output viewed [Sq, H, 1, D], K and V
// broadcast over the rows, and with 16 queries or more its tasks share each
// chunk of K and V (SharedKV); batches, causal and unmasked attention stay.
func TestPromptQueriesAsRows(t *testing.T) {
	b, a := promptAttention(1, 64, 576, true)
	q0, out0 := a.In[0], a.Out
	splitAttention(b.g, 132, true, false, false, false)
	q, k, m, out := a.In[0], a.In[1], a.In[3], b.g.Ops[1].Out
	if !a.DecodeUnits() || a.Attr.UnitHeads != 4 || b.g.Ops[1].Kind != ir.AttnMerge {
		t.Fatalf("prompt: decode units %v, %d heads a unit, ops %s", a.DecodeUnits(), a.Attr.UnitHeads, kinds(b.g))
	}
	// 64 rows share each chunk of 64 positions (9 of 576) of K and V.
	if !a.Attr.SharedKV || a.Attr.Splits != 9 {
		t.Fatalf("prompt: shared K and V %v, %d splits; want shared, 9", a.Attr.SharedKV, a.Attr.Splits)
	}
	if !slices.Equal(q.Shape, sh(64, 8, 1, 64)) || !slices.Equal(q.Strides, sh(q0.Strides[2], q0.Strides[1], 0, 1)) ||
		!slices.Equal(k.Shape, sh(64, 2, 576, 64)) || k.Strides[0] != 0 ||
		!slices.Equal(m.Shape, sh(64, 8, 1, 576)) || !slices.Equal(m.Strides, sh(576, 0, 0, 1)) ||
		out.Buf != out0.Buf || !slices.Equal(out.Shape, sh(64, 8, 1, 64)) || out.Strides[0] != out0.Strides[2] {
		t.Fatalf("views: q %v/%v, k %v/%v, mask %v/%v, out %v/%v", q.Shape, q.Strides, k.Shape, k.Strides,
			m.Shape, m.Strides, out.Shape, out.Strides)
	}
	// 8 queries: rows, each with its own units (too few rows to share a chunk).
	b, a = promptAttention(1, 8, 576, true)
	splitAttention(b.g, 132, true, false, false, false)
	if !a.DecodeUnits() || a.Attr.SharedKV {
		t.Errorf("8 queries: decode units %v, shared K and V %v; want units, not shared", a.DecodeUnits(), a.Attr.SharedKV)
	}
	for _, c := range []struct {
		B    int64
		mask bool
		on   bool
	}{{2, true, true}, {1, false, true}, {1, true, false}} { // the last: the option off
		b, a := promptAttention(c.B, 64, 576, c.mask)
		splitAttention(b.g, 132, c.on, false, false, false)
		if a.DecodeUnits() || a.In[0].Shape[2] != 64 {
			t.Errorf("%+v: rewritten as rows", c)
		}
	}
}
