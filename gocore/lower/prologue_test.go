package lower

import (
	"slices"
	"testing"

	"mpk/gocore/ir"
)

func TestThroughView(t *testing.T) {
	tmp := &ir.Buffer{Numel: 32}
	src := &ir.Buffer{Numel: 128}
	out := ir.View{Buf: tmp, Shape: []int64{1, 1, 4, 8}, Strides: []int64{32, 32, 8, 1}}
	x := ir.View{Buf: src, Offset: 3, Shape: []int64{1, 1, 4, 8}, Strides: []int64{64, 64, 16, 1}}
	w := ir.View{Buf: src, Shape: []int64{1, 1, 4, 8}, Strides: []int64{0, 0, 0, 1}} // a broadcast weight

	// The heads transposed to dim 1, as q.transpose(1, 2) reads the norm's output.
	heads := ir.View{Buf: tmp, Shape: []int64{1, 4, 1, 8}, Strides: []int64{32, 8, 32, 1}}
	got, ok := throughView(heads, out, x)
	if !ok || got.Buf != src || got.Offset != 3 || !slices.Equal(got.Shape, heads.Shape) ||
		!slices.Equal(got.Strides, []int64{0, 16, 0, 1}) {
		t.Fatalf("x through the transposed view: %v %v", got, ok)
	}
	if got, ok := throughView(heads, out, w); !ok || !slices.Equal(got.Strides, []int64{0, 0, 0, 1}) {
		t.Fatalf("weight through the transposed view: %v %v", got, ok)
	}
	// Rows must stay rows: a reader whose last dim is another dim of out.
	cols := ir.View{Buf: tmp, Shape: []int64{1, 8, 1, 4}, Strides: []int64{32, 1, 32, 8}}
	if _, ok := throughView(cols, out, x); ok {
		t.Fatal("a reader that rotates along the heads dim was accepted")
	}
	// A reader of part of the buffer is not a permutation of out.
	half := ir.View{Buf: tmp, Shape: []int64{1, 2, 1, 8}, Strides: []int64{32, 8, 32, 1}}
	if _, ok := throughView(half, out, x); ok {
		t.Fatal("a reader of half the rows was accepted")
	}
}

// mergeGraph is decode attention split into chunks, its merge read as x by
// an o projection ([B, 4, 1, 8] heads viewed as [B, 32]) and, with
// alsoOutput, the merge output returned as well.
func mergeGraph(alsoOutput bool, B int64) (*builder, *ir.Op) {
	b := newBuilder()
	q := b.input("q", ir.F32, B, 4, 1, 8)
	k := b.input("k", ir.F32, B, 2, 64, 8)
	v := b.input("v", ir.F32, B, 2, 64, 8)
	w := b.param("w", ir.F32, 16, 32)
	att := b.temp("att", ir.F32, B, 4, 1, 8)
	a := b.op(ir.Attention, att, q, k, v)
	a.Attr.Scale, a.Attr.Groups = 1, 2
	out := b.temp("out", ir.F32, B, 16)
	lin := b.op(ir.Linear, out, strided(att, 0, sh(B, 32), sh(32, 1)), w)
	lin.Label = "linear"
	b.output(out)
	if alsoOutput {
		b.output(att)
	}
	return b, lin
}

// TestMergeFoldsIntoTheLinear: after splitAttention, the merge becomes the
// o projection's prologue (it reads the partials), unless something else
// needs the merged output.
func TestMergeFoldsIntoTheLinear(t *testing.T) {
	b, lin := mergeGraph(false, 1)
	run(t, b.g, func(g *ir.Graph) { splitAttention(g, 4, false, false, false, false) })
	run(t, b.g, fuseMergePrologue)
	if got := kinds(b.g); got != "attention linear:attn_merge+linear" {
		t.Fatalf("ops %s", got)
	}
	p := lin.Attr.Pro
	if p == nil || p.Kind != ir.AttnMerge || p.First != 2 || lin.In[0].Buf != b.g.Ops[0].Out.Buf || lin.LinearK() != 32 {
		t.Fatalf("prologue %+v, x %v", p, lin.In[0])
	}

	b, _ = mergeGraph(true, 1)
	run(t, b.g, func(g *ir.Graph) { splitAttention(g, 4, false, false, false, false) })
	run(t, b.g, fuseMergePrologue)
	if got := kinds(b.g); got != "attention attn_merge linear" {
		t.Fatalf("a merge the caller reads was folded: %s", got)
	}

	// A batch stays one stage of merges: every task of the Linear would merge all its rows.
	b, _ = mergeGraph(false, 2)
	run(t, b.g, func(g *ir.Graph) { splitAttention(g, 4, false, false, false, false) })
	run(t, b.g, fuseMergePrologue)
	if got := kinds(b.g); got != "attention attn_merge linear" {
		t.Fatalf("a batch's merge was folded: %s", got)
	}
}

// maskedMergeGraph is mergeGraph with a mask on its attention, split over
// splitWorkers, merges folded and bounded by the extent (16 workers); it
// returns the Linear and the attention.
func maskedMergeGraph(t *testing.T, B int64, splitWorkers int) (*builder, *ir.Op, *ir.Op) {
	b, lin := mergeGraph(false, B)
	a := b.g.Ops[0]
	a.In = append(a.In, b.input("mask", ir.Bool, B, 4, 1, 64))
	a.Attr.HasMask = true
	run(t, b.g, func(g *ir.Graph) { splitAttention(g, splitWorkers, false, false, false, false) })
	run(t, b.g, fuseMergePrologue)
	run(t, b.g, func(g *ir.Graph) { boundMergeByExtent(g, 16) })
	return b, lin, a
}

// TestMergeBoundByTheMaskExtent: with a mask, the folded merge reads the
// mask's extent, computed by a MaskExtent op just before the attention, and
// knows the chunk each split covers.
func TestMergeBoundByTheMaskExtent(t *testing.T) {
	b, lin, a := maskedMergeGraph(t, 1, 4)
	if got := kinds(b.g); got != "mask_extent attention linear:attn_merge+linear" {
		t.Fatalf("ops %s", got)
	}
	ext, p := b.g.Ops[0], lin.Attr.Pro
	if ext.In[0].Buf != a.In[3].Buf || !slices.Equal(ext.Out.Shape, []int64{1}) || ext.Out.DType() != ir.I32 {
		t.Fatalf("extent op %+v", ext)
	}
	if p.First != 2 || lin.In[p.First].Buf != ext.Out.Buf || p.Chunk != 64/a.Attr.Splits || a.Attr.Splits < 2 {
		t.Fatalf("prologue %+v with %d splits, inputs %v", p, a.Attr.Splits, lin.In)
	}
	if !a.Attr.HasExtent || len(a.In) != 5 || a.In[4].Buf != ext.Out.Buf {
		t.Fatalf("the attention does not read the extent: %+v, inputs %v", a.Attr, a.In)
	}
	// 16 workers over 4 heads: a group of splits per worker, as the merge knows.
	if want := min(a.Attr.Splits, 4); a.Attr.Interleave != want || p.Interleave != want || want < 2 {
		t.Fatalf("interleave: attention %d, merge %d, want %d (>1)", a.Attr.Interleave, p.Interleave, want)
	}

	// A batch's standalone merge reads the extent as In[1].
	b, _, a = maskedMergeGraph(t, 2, 8)
	if got := kinds(b.g); got != "mask_extent attention attn_merge linear" {
		t.Fatalf("batch 2: ops %s", got)
	}
	ext, m := b.g.Ops[0], b.g.Ops[2]
	if len(m.In) != 2 || m.In[1].Buf != ext.Out.Buf || !m.Attr.HasExtent || m.Attr.Chunk != 64/a.Attr.Splits ||
		m.Attr.Interleave != a.Attr.Interleave || !a.Attr.HasExtent || a.Attr.Splits < 2 {
		t.Fatalf("batch 2: merge %+v reading %v, attention %+v", m.Attr, m.In, a.Attr)
	}

	// Without a mask there is nothing to bound.
	b, lin = mergeGraph(false, 1)
	run(t, b.g, func(g *ir.Graph) { splitAttention(g, 4, false, false, false, false) })
	run(t, b.g, fuseMergePrologue)
	run(t, b.g, func(g *ir.Graph) { boundMergeByExtent(g, 4) })
	if got := kinds(b.g); got != "attention linear:attn_merge+linear" || lin.Attr.Pro.Chunk != 0 || b.g.Ops[0].Attr.HasExtent {
		t.Fatalf("ops %s, prologue %+v, attention %+v", got, lin.Attr.Pro, b.g.Ops[0].Attr)
	}
}
