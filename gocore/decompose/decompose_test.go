package decompose

import (
	"fmt"
	"reflect"
	"sort"
	"testing"

	"mpk/gocore/ir"
	"mpk/gocore/stream"
	"mpk/gocore/tgraph"
)

func sh(xs ...int64) []int64 { return xs }

// upTo is 0, 1, ..., n: the bounds of n tiles of one element.
func upTo(n int64) []int64 {
	xs := make([]int64, n+1)
	for i := range xs {
		xs[i] = int64(i)
	}
	return xs
}

func box(lo, hi []int64) tgraph.Box { return tgraph.Box{Lo: lo, Hi: hi} }

func ivs(pairs ...int64) []tgraph.Interval {
	var out []tgraph.Interval
	for i := 0; i < len(pairs); i += 2 {
		out = append(out, tgraph.Interval{Lo: pairs[i], Hi: pairs[i+1]})
	}
	return out
}

func TestSplit(t *testing.T) {
	cases := []struct {
		name        string
		shape       []int64
		dim         int
		parts, unit int64
		want        [][2]int64 // [lo, hi) along dim
	}{
		{"even", sh(12), 0, 3, 1, [][2]int64{{0, 4}, {4, 8}, {8, 12}}},
		{"remainder spread", sh(10), 0, 3, 1, [][2]int64{{0, 3}, {3, 6}, {6, 10}}},
		{"one part", sh(10), 0, 1, 1, [][2]int64{{0, 10}}},
		{"more parts than elements", sh(3), 0, 8, 1, [][2]int64{{0, 1}, {1, 2}, {2, 3}}},
		{"units of 4", sh(16), 0, 2, 4, [][2]int64{{0, 8}, {8, 16}}},
		{"units with a short last unit", sh(10), 0, 4, 4, [][2]int64{{0, 4}, {4, 8}, {8, 10}}},
		{"unit covers the dim", sh(4), 0, 4, 4, [][2]int64{{0, 4}}},
		{"units split unevenly", sh(8), 0, 3, 2, [][2]int64{{0, 2}, {2, 4}, {4, 8}}},
		{"inner dim", sh(2, 8), 1, 4, 1, [][2]int64{{0, 2}, {2, 4}, {4, 6}, {6, 8}}},
	}
	for _, c := range cases {
		bs := split(c.shape, c.dim, c.parts, c.unit)
		var got [][2]int64
		for _, b := range bs {
			got = append(got, [2]int64{b.Lo[c.dim], b.Hi[c.dim]})
			for d := range c.shape {
				if d != c.dim && (b.Lo[d] != 0 || b.Hi[d] != c.shape[d]) {
					t.Errorf("%s: box %v-%v cuts dim %d too", c.name, b.Lo, b.Hi, d)
				}
			}
		}
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: split(%v, %d, %d, %d) = %v, want %v", c.name, c.shape, c.dim, c.parts, c.unit, got, c.want)
		}
	}
	if bs := split(sh(), 0, 4, 1); len(bs) != 1 || len(bs[0].Lo) != 0 {
		t.Errorf("split of a scalar = %v, want one empty box", bs)
	}
}

// opOf builds an op over fresh contiguous buffers with ids in order.
type opBuilder struct{ g *ir.Graph }

func (b *opBuilder) buf(name string, shape ...int64) ir.View {
	return b.g.NewTemp(name, ir.F32, shape)
}

func (b *opBuilder) op(kind ir.Kind, out ir.View, in ...ir.View) *ir.Op {
	op := &ir.Op{ID: len(b.g.Ops), Kind: kind, Label: kind.String(), Out: out, In: in}
	b.g.Ops = append(b.g.Ops, op)
	return op
}

func TestTiles(t *testing.T) {
	cases := []struct {
		name    string
		op      func(b *opBuilder) *ir.Op
		workers int
		dim     int     // split dim
		bounds  []int64 // lo of each tile along dim, then the end
	}{
		{"linear splits N into 8-row tiles at most", func(b *opBuilder) *ir.Op {
			return b.op(ir.Linear, b.buf("o", 1, 64), b.buf("x", 1, 16), b.buf("w", 64, 16))
		}, 132, 1, sh(0, 8, 16, 24, 32, 40, 48, 56, 64)},
		{"linear with few workers", func(b *opBuilder) *ir.Op {
			return b.op(ir.Linear, b.buf("o", 1, 64), b.buf("x", 1, 16), b.buf("w", 64, 16))
		}, 4, 1, sh(0, 16, 32, 48, 64)},
		{"tiny linear is one task", func(b *opBuilder) *ir.Op {
			return b.op(ir.Linear, b.buf("o", 2, 3), b.buf("x", 2, 16), b.buf("w", 3, 16))
		}, 132, 1, sh(0, 3)},
		{"attention keeps whole KV groups", func(b *opBuilder) *ir.Op {
			op := b.op(ir.Attention, b.buf("o", 1, 8, 1, 16), b.buf("q", 1, 8, 1, 16), b.buf("k", 1, 4, 5, 16), b.buf("v", 1, 4, 5, 16))
			op.Attr.Groups = 2
			return op
		}, 132, 1, sh(0, 2, 4, 6, 8)},
		{"attention with fewer workers than groups", func(b *opBuilder) *ir.Op {
			op := b.op(ir.Attention, b.buf("o", 1, 8, 1, 16), b.buf("q", 1, 8, 1, 16), b.buf("k", 1, 4, 5, 16), b.buf("v", 1, 4, 5, 16))
			op.Attr.Groups = 2
			return op
		}, 3, 1, sh(0, 2, 4, 8)},
		{"large elementwise splits its largest dim", func(b *opBuilder) *ir.Op {
			return b.op(ir.Elementwise, b.buf("o", 64, 4096), b.buf("x", 64, 4096))
		}, 8, 1, sh(0, 512, 1024, 1536, 2048, 2560, 3072, 3584, 4096)},
		{"small elementwise is one task", func(b *opBuilder) *ir.Op {
			return b.op(ir.Elementwise, b.buf("o", 16, 16), b.buf("x", 16, 16))
		}, 132, 0, sh(0, 16)},
		{"rmsnorm keeps rows whole, a warp per row", func(b *opBuilder) *ir.Op {
			return b.op(ir.RMSNorm, b.buf("o", 32, 256), b.buf("x", 32, 256))
		}, 4, 0, sh(0, 16, 32)},
		{"rmsnorm of long rows takes a row a task", func(b *opBuilder) *ir.Op {
			return b.op(ir.RMSNorm, b.buf("o", 32, 1024), b.buf("x", 32, 1024))
		}, 4, 0, sh(0, 8, 16, 24, 32)},
		{"rmsnorm task count capped by workers", func(b *opBuilder) *ir.Op {
			return b.op(ir.RMSNorm, b.buf("o", 32, 1024), b.buf("x", 32, 1024))
		}, 1, 0, sh(0, 32)},
		{"rope writing the cache splits heads, never the positions it writes", func(b *opBuilder) *ir.Op {
			op := b.op(ir.RoPE, b.buf("cache", 1, 8, 64, 64), b.buf("x", 1, 8, 16, 64), b.buf("cos", 1, 8, 16, 64),
				b.buf("sin", 1, 8, 16, 64), b.buf("pos", 16))
			op.Attr.IndexIn, op.Attr.Dim = 4, 2
			return op
		}, 132, 1, sh(0, 1, 2, 3, 4, 5, 6, 7, 8)}, // 512 rotated pairs a head: a task per head
		{"rope: at most a rotated pair per thread", func(b *opBuilder) *ir.Op {
			return b.op(ir.RoPE, b.buf("o", 1, 32, 1, 64), b.buf("x", 1, 32, 1, 64), b.buf("cos", 1, 1, 1, 64), b.buf("sin", 1, 1, 1, 64))
		}, 132, 1, sh(0, 8, 16, 24, 32)}, // 2,048 elements: a task per 512, as elementwise ops
		{"a 4,096-element mask where splits to an element a thread", func(b *opBuilder) *ir.Op {
			return b.op(ir.Elementwise, b.buf("o", 1, 1, 1, 4096), b.buf("x", 1, 1, 1, 4096))
		}, 132, 3, sh(0, 512, 1024, 1536, 2048, 2560, 3072, 3584, 4096)},
		{"embedding: at most an element a thread per task", func(b *opBuilder) *ir.Op {
			return b.op(ir.Embedding, b.buf("o", 1, 1, 2048), b.buf("w", 100, 2048), b.buf("ids", 1, 1))
		}, 132, 2, sh(0, 512, 1024, 1536, 2048)},
		{"embedding of more tokens than an exact region has intervals takes whole rows", func(b *opBuilder) *ir.Op {
			return b.op(ir.Embedding, b.buf("o", 1, 300, 64), b.buf("w", 100, 64), b.buf("ids", 1, 300))
		}, 4, 1, sh(0, 75, 150, 225, 300)},
		{"a decode merge of 16 rows splits its heads", func(b *opBuilder) *ir.Op {
			return b.op(ir.AttnMerge, b.buf("o", 16, 8, 1, 64), b.buf("p", 16, 9, 8, 1, 66))
		}, 4, 1, sh(0, 2, 4, 6, 8)},
		{"a decode merge of 512 rows (a long prompt chunk's) splits its rows", func(b *opBuilder) *ir.Op {
			return b.op(ir.AttnMerge, b.buf("o", 512, 8, 1, 64), b.buf("p", 512, 9, 8, 1, 66))
		}, 4, 0, sh(0, 128, 256, 384, 512)},
		{"a prompt chunk's merge of 64 rows over 32 heads splits its rows", func(b *opBuilder) *ir.Op {
			return b.op(ir.AttnMerge, b.buf("o", 64, 32, 1, 128), b.buf("p", 64, 5, 32, 1, 130))
		}, 132, 0, upTo(64)}, // a row a task
		{"a mask of 512 rows splits its rows, not its positions", func(b *opBuilder) *ir.Op {
			return b.op(ir.Elementwise, b.buf("o", 1, 1, 512, 528), b.buf("x", 1, 1, 512, 528))
		}, 4, 2, sh(0, 128, 256, 384, 512)},
		{"kv write iterates source rows", func(b *opBuilder) *ir.Op {
			op := b.op(ir.KVWrite, b.buf("cache", 1, 2, 8, 4), b.buf("pos", 1), b.buf("src", 1, 2, 1, 4))
			op.Attr.Dim = 2
			return op
		}, 132, 0, sh(0, 1)},
		{"a batch's kv write: an element a thread, cut along the batch", func(b *opBuilder) *ir.Op {
			op := b.op(ir.KVWrite, b.buf("cache", 16, 8, 552, 64), b.buf("pos", 1), b.buf("src", 16, 8, 1, 64))
			op.Attr.Dim = 2
			return op
		}, 132, 0, sh(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16)},
		{"mask extent: a task per batch row", func(b *opBuilder) *ir.Op {
			return b.op(ir.MaskExtent, b.buf("ext", 4), b.buf("mask", 4, 1, 1, 552))
		}, 132, 0, sh(0, 1, 2, 3, 4)},
	}
	for _, c := range cases {
		b := &opBuilder{g: &ir.Graph{}}
		op := c.op(b)
		bs := tiles(op, c.workers, func(*ir.Buffer) bool { return false })
		var got []int64
		for i, bx := range bs {
			got = append(got, bx.Lo[c.dim])
			if i == len(bs)-1 {
				got = append(got, bx.Hi[c.dim])
			}
		}
		if !reflect.DeepEqual(got, c.bounds) {
			t.Errorf("%s (workers %d): tile bounds along dim %d = %v, want %v", c.name, c.workers, c.dim, got, c.bounds)
		}
	}
}

// TestElementwiseTilesInGroupsOfFour: an elementwise op cut along a last
// dim of a multiple of 4 (a prompt chunk's K-split sum, 64 x 2,048 over 132
// workers) gets tiles of whole groups of 4 columns, which the CUDA task
// loads 16 bytes at a time (elementwise_rows4); another last dim is cut
// anywhere.
func TestElementwiseTilesInGroupsOfFour(t *testing.T) {
	for _, c := range []struct {
		cols  int64
		tasks int
		unit  int64
	}{{2048, 132, 4}, {2046, 132, 1}} {
		b := &opBuilder{g: &ir.Graph{}}
		op := b.op(ir.Elementwise, b.buf("o", 64, c.cols), b.buf("x", 64, c.cols), b.buf("y", 64, c.cols))
		bs := tiles(op, 132, func(*ir.Buffer) bool { return false })
		if len(bs) != c.tasks {
			t.Errorf("%d columns: %d tiles, want %d", c.cols, len(bs), c.tasks)
		}
		odd := false
		for i, bx := range bs {
			if bx.Lo[0] != 0 || bx.Hi[0] != 64 {
				t.Fatalf("%d columns: tile %d cuts the rows: %v", c.cols, i, bx)
			}
			if i > 0 && bx.Lo[1] != bs[i-1].Hi[1] || i == 0 && bx.Lo[1] != 0 || i == len(bs)-1 && bx.Hi[1] != c.cols {
				t.Fatalf("%d columns: tiles do not cover the columns once: %v", c.cols, bs)
			}
			odd = odd || bx.Lo[1]%4 != 0 || bx.Hi[1]%4 != 0
		}
		if odd != (c.unit == 1) {
			t.Errorf("%d columns: a tile bound off a multiple of 4 = %v, want %v", c.cols, odd, c.unit == 1)
		}
	}
}

// TestTaskCountsScaleWithWorkers: no op gets more tasks than workers, and a
// large op gets more tasks with more workers.
func TestTaskCountsScaleWithWorkers(t *testing.T) {
	b := &opBuilder{g: &ir.Graph{}}
	ops := []*ir.Op{
		b.op(ir.Linear, b.buf("o", 1, 4096), b.buf("x", 1, 1024), b.buf("w", 4096, 1024)),
		b.op(ir.Elementwise, b.buf("e", 16, 65536), b.buf("ex", 16, 65536)),
		b.op(ir.RMSNorm, b.buf("n", 512, 1024), b.buf("nx", 512, 1024)),
	}
	for _, op := range ops {
		prev := 0
		for _, w := range []int{1, 2, 8, 32, 132} {
			n := len(tiles(op, w, func(*ir.Buffer) bool { return false }))
			if n > w || n < prev {
				t.Errorf("%s: %d tasks with %d workers (previous %d)", op.Kind, n, w, prev)
			}
			prev = n
		}
		if prev < 32 {
			t.Errorf("%s: only %d tasks at 132 workers", op.Kind, prev)
		}
	}
}

// TestStreamedLinearTiles: a Linear whose weight streams (a caller-owned
// tensor of contiguous rows) splits into a multiple of the workers, each task
// at most stream.TaskBytes, so every worker streams part of every matrix.
func TestStreamedLinearTiles(t *testing.T) {
	b := &opBuilder{g: &ir.Graph{}}
	w := b.buf("w", 128256, 2048)
	w.Buf.Kind, w.Buf.DType = ir.Input, ir.BF16
	x := b.buf("x", 1, 2048)
	x.Buf.DType = ir.BF16
	op := b.op(ir.Linear, b.buf("o", 1, 128256), x, w)
	never := func(*ir.Buffer) bool { return false }
	bs := tiles(op, 132, never)
	if len(bs)%132 != 0 {
		t.Fatalf("%d tiles, want a multiple of 132 workers", len(bs))
	}
	for _, bx := range bs {
		if bytes := (bx.Hi[1] - bx.Lo[1]) * 2048 * 2; bytes > stream.TaskBytes+2048*2 {
			t.Fatalf("tile %v reads %d bytes of weights, more than a task's %d", bx, bytes, stream.TaskBytes)
		}
	}
	if n := len(tiles(op, 132, func(b *ir.Buffer) bool { return b == w.Buf })); n != 132 {
		t.Errorf("a weight the graph writes does not stream: %d tiles, want the register Linear's 132", n)
	}
	// One of 4 slices of K (lower's splitLinearK) takes a quarter of the
	// workers: 2,048 rows of 2,048 in 33 tasks of 62 or 63 rows.
	ws := b.buf("ws", 2048, 2048)
	ws.Buf.Kind, ws.Buf.DType = ir.Input, ir.BF16
	slice := b.op(ir.Linear, b.buf("os", 1, 2048), x, ws)
	slice.Attr.KParts = 4
	if n := len(tiles(slice, 132, never)); n != 33 {
		t.Errorf("a quarter slice of K: %d tiles, want 33 (a quarter of the workers)", n)
	}
}

func TestRegion(t *testing.T) {
	buf := &ir.Buffer{Name: "b", Numel: 1 << 20}
	v := func(off int64, shape, strides []int64) ir.View {
		return ir.View{Buf: buf, Offset: off, Shape: shape, Strides: strides}
	}
	cases := []struct {
		name string
		v    ir.View
		b    tgraph.Box
		want []tgraph.Interval
	}{
		{"contiguous rows are one interval", v(0, sh(4, 8), sh(8, 1)), box(sh(1, 0), sh(3, 8)), ivs(8, 24)},
		{"offset", v(5, sh(4, 8), sh(8, 1)), box(sh(0, 0), sh(1, 8)), ivs(5, 13)},
		{"column block is one interval per row", v(0, sh(4, 8), sh(8, 1)), box(sh(0, 2), sh(4, 4)), ivs(2, 4, 10, 12, 18, 20, 26, 28)},
		{"transposed whole view is one interval", v(0, sh(8, 4), sh(1, 8)), box(sh(0, 0), sh(8, 4)), ivs(0, 32)},
		{"transposed column", v(0, sh(8, 4), sh(1, 8)), box(sh(0, 1), sh(8, 2)), ivs(8, 16)},
		{"step-2 slice", v(1, sh(3), sh(2)), box(sh(0), sh(3)), ivs(1, 2, 3, 4, 5, 6)},
		{"zero-stride dims add nothing", v(3, sh(4, 8), sh(0, 1)), box(sh(0, 0), sh(4, 8)), ivs(3, 11)},
		{"zero-stride inner dim", v(0, sh(4, 8), sh(2, 0)), box(sh(0, 0), sh(4, 8)), ivs(0, 1, 2, 3, 4, 5, 6, 7)},
		{"size-1 extents", v(0, sh(4, 8), sh(8, 1)), box(sh(2, 3), sh(3, 4)), ivs(19, 20)},
		{"empty box", v(0, sh(4, 8), sh(8, 1)), box(sh(1, 0), sh(1, 8)), nil},
		{"too many intervals: bounding interval", v(0, sh(300, 8), sh(16, 1)), box(sh(0, 0), sh(300, 8)), ivs(0, 299*16+8)},
		{"exactly the limit stays exact", v(0, sh(256, 8), sh(16, 1)), box(sh(0, 0), sh(256, 8)), nil},
		{"scalar", v(7, sh(), sh()), box(sh(), sh()), ivs(7, 8)},
	}
	for _, c := range cases {
		got := Region(c.v, c.b)
		if c.name == "exactly the limit stays exact" {
			if len(got) != 256 || got[0] != (tgraph.Interval{Lo: 0, Hi: 8}) || got[255] != (tgraph.Interval{Lo: 255 * 16, Hi: 255*16 + 8}) {
				t.Errorf("%s: %d intervals from %v to %v, want 256 exact rows", c.name, len(got), got[0], got[len(got)-1])
			}
			continue
		}
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: Region(%v, %v-%v) = %v, want %v", c.name, c.v, c.b.Lo, c.b.Hi, got, c.want)
		}
	}
}

func TestAccesses(t *testing.T) {
	type acc struct {
		buf string
		ivs []tgraph.Interval
	}
	names := func(g *ir.Graph, as []tgraph.Access) []acc {
		var out []acc
		for _, a := range as {
			out = append(out, acc{g.Buffers[a.Buf].Name, a.Ivs})
		}
		sort.Slice(out, func(i, j int) bool { return out[i].buf < out[j].buf })
		return out
	}
	cases := []struct {
		name          string
		op            func(b *opBuilder) *ir.Op
		box           tgraph.Box
		reads, writes []acc
	}{
		{"linear reads all of x and rows [lo,hi) of W", func(b *opBuilder) *ir.Op {
			return b.op(ir.Linear, b.buf("o", 2, 8), b.buf("x", 2, 16), b.buf("w", 8, 16))
		}, box(sh(0, 2), sh(2, 4)),
			[]acc{{"w", ivs(32, 64)}, {"x", ivs(0, 32)}}, []acc{{"o", ivs(2, 4, 10, 12)}}},
		{"linear with residual reads its tile", func(b *opBuilder) *ir.Op {
			op := b.op(ir.Linear, b.buf("o", 2, 8), b.buf("x", 2, 16), b.buf("w", 8, 16), b.buf("r", 2, 8))
			op.Attr.Residual = true
			return op
		}, box(sh(0, 4), sh(2, 8)),
			[]acc{{"r", ivs(4, 8, 12, 16)}, {"w", ivs(64, 128)}, {"x", ivs(0, 32)}}, []acc{{"o", ivs(4, 8, 12, 16)}}},
		{"reduce reads whole rows", func(b *opBuilder) *ir.Op {
			op := b.op(ir.Reduce, b.buf("o", 4), b.buf("x", 4, 8))
			op.Attr.Reduce, op.Attr.Dims = "sum", 1
			return op
		}, box(sh(1), sh(3)), []acc{{"x", ivs(8, 24)}}, []acc{{"o", ivs(1, 3)}}},
		{"attention reads the KV heads of its groups", func(b *opBuilder) *ir.Op {
			op := b.op(ir.Attention, b.buf("o", 1, 4, 1, 2), b.buf("q", 1, 4, 1, 2), b.buf("k", 1, 2, 3, 2), b.buf("v", 1, 2, 3, 2))
			op.Attr.Groups = 2
			return op
		}, box(sh(0, 2, 0, 0), sh(1, 4, 1, 2)),
			[]acc{{"k", ivs(6, 12)}, {"q", ivs(4, 8)}, {"v", ivs(6, 12)}}, []acc{{"o", ivs(4, 8)}}},
		{"a prompt chunk's attention with shared K and V and an extent reads every position and row extent", func(b *opBuilder) *ir.Op {
			// Its chunks are cut from the longest row's extent at run time (ir.LiveChunk).
			m := b.buf("mask", 2, 1, 1, 8)
			mask := ir.View{Buf: m.Buf, Shape: sh(2, 2, 1, 8), Strides: sh(8, 0, 8, 1)} // heads broadcast
			op := b.op(ir.Attention, b.buf("o", 2, 2, 2, 1, 4), b.buf("q", 2, 2, 1, 2), b.buf("k", 2, 1, 8, 2),
				b.buf("v", 2, 1, 8, 2), mask, b.buf("ext", 2))
			op.Attr.Groups, op.Attr.Splits, op.Attr.SharedKV, op.Attr.HasMask, op.Attr.HasExtent = 2, 2, true, true, true
			return op
		}, box(sh(1, 1, 0, 0, 0), sh(2, 2, 2, 1, 4)),
			[]acc{{"ext", ivs(0, 2)}, {"k", ivs(16, 32)}, {"mask", ivs(8, 16)}, {"q", ivs(4, 8)}, {"v", ivs(16, 32)}},
			[]acc{{"o", ivs(24, 32)}}},
		{"embedding reads the whole table", func(b *opBuilder) *ir.Op {
			return b.op(ir.Embedding, b.buf("o", 3, 4), b.buf("table", 10, 4), b.buf("ids", 3))
		}, box(sh(1, 0), sh(2, 4)), []acc{{"ids", ivs(1, 2)}, {"table", ivs(0, 40)}}, []acc{{"o", ivs(4, 8)}}},
		{"cat reads the parts it covers", func(b *opBuilder) *ir.Op {
			op := b.op(ir.Cat, b.buf("o", 2, 5), b.buf("a", 2, 2), b.buf("c", 2, 3))
			op.Attr.Dim = 1
			return op
		}, box(sh(1, 0), sh(2, 5)), []acc{{"a", ivs(2, 4)}, {"c", ivs(3, 6)}}, []acc{{"o", ivs(5, 10)}}},
		{"kv write may land anywhere along its dim", func(b *opBuilder) *ir.Op {
			op := b.op(ir.KVWrite, b.buf("cache", 2, 8, 4), b.buf("pos", 1), b.buf("src", 2, 1, 4))
			op.Attr.Dim = 1
			return op
		}, box(sh(1, 0, 0), sh(2, 1, 4)), []acc{{"pos", ivs(0, 1)}, {"src", ivs(4, 8)}}, []acc{{"cache", ivs(32, 64)}}},
		{"same buffer read twice merges", func(b *opBuilder) *ir.Op {
			x := b.buf("x", 8)
			return b.op(ir.Elementwise, b.buf("o", 4), ir.View{Buf: x.Buf, Shape: sh(4), Strides: sh(1)}, ir.View{Buf: x.Buf, Offset: 2, Shape: sh(4), Strides: sh(1)})
		}, box(sh(0), sh(4)), []acc{{"x", ivs(0, 6)}}, []acc{{"o", ivs(0, 4)}}},
	}
	for _, c := range cases {
		b := &opBuilder{g: &ir.Graph{}}
		op := c.op(b)
		r, w := accesses(op, c.box)
		if got := names(b.g, r); !reflect.DeepEqual(got, c.reads) {
			t.Errorf("%s: reads %v, want %v", c.name, got, c.reads)
		}
		if got := names(b.g, w); !reflect.DeepEqual(got, c.writes) {
			t.Errorf("%s: writes %v, want %v", c.name, got, c.writes)
		}
	}
}

// taskGraph builds tasks directly: each task is (op, reads, writes) with one
// interval per access, for the dependency tests.
type tacc struct {
	buf    int
	lo, hi int64
}

func taskGraph(nbufs int, tasks ...struct {
	op     int
	reads  []tacc
	writes []tacc
}) *tgraph.Graph {
	g := &tgraph.Graph{Workers: 1}
	for i := 0; i < nbufs; i++ {
		g.Buffers = append(g.Buffers, tgraph.BufInfo{Name: fmt.Sprintf("b%d", i), Numel: 1 << 10})
	}
	for _, tk := range tasks {
		t := &tgraph.Task{ID: len(g.Tasks), Op: tk.op, Wait: tgraph.None, Trigger: tgraph.None, Order: tk.op}
		for _, a := range tk.reads {
			t.Reads = append(t.Reads, tgraph.Access{Buf: a.buf, Ivs: ivs(a.lo, a.hi)})
		}
		for _, a := range tk.writes {
			t.Writes = append(t.Writes, tgraph.Access{Buf: a.buf, Ivs: ivs(a.lo, a.hi)})
		}
		g.Tasks = append(g.Tasks, t)
	}
	return g
}

type tk = struct {
	op     int
	reads  []tacc
	writes []tacc
}

func sorted(p [][]int) [][]int {
	out := make([][]int, len(p))
	for i, ps := range p {
		out[i] = append([]int{}, ps...)
		sort.Ints(out[i])
	}
	return out
}

func TestDepend(t *testing.T) {
	const w, a, cache = 0, 1, 2 // w is never written
	cases := []struct {
		name  string
		tasks []tk
		want  [][]int
	}{
		{"RAW on overlap only", []tk{
			{0, []tacc{{w, 0, 10}}, []tacc{{a, 0, 4}}},
			{0, []tacc{{w, 0, 10}}, []tacc{{a, 4, 8}}},
			{1, []tacc{{a, 0, 4}}, []tacc{{cache, 0, 1}}},
			{1, []tacc{{a, 2, 6}}, []tacc{{cache, 1, 2}}},
		}, [][]int{nil, nil, {0}, {0, 1}}},
		{"WAR and WAW on an in-place buffer", []tk{
			{0, nil, []tacc{{a, 0, 4}}},
			{1, []tacc{{a, 0, 4}}, []tacc{{cache, 0, 8}}},
			{2, []tacc{{cache, 0, 8}}, nil},
			{3, nil, []tacc{{cache, 2, 3}}},
			{4, nil, []tacc{{a, 0, 2}}},
		}, [][]int{nil, {0}, {1}, {1, 2}, {0, 1}}},
		{"adjacent intervals do not overlap", []tk{
			{0, nil, []tacc{{a, 0, 4}}},
			{1, []tacc{{a, 4, 8}}, nil},
		}, [][]int{nil, nil}},
		{"read after read needs nothing", []tk{
			{0, nil, []tacc{{a, 0, 4}}},
			{1, []tacc{{a, 0, 4}}, []tacc{{cache, 0, 1}}},
			{2, []tacc{{a, 0, 4}}, []tacc{{cache, 1, 2}}},
		}, [][]int{nil, {0}, {0}}},
		{"never-written buffer makes no edges", []tk{
			{0, []tacc{{w, 0, 10}}, []tacc{{a, 0, 1}}},
			{1, []tacc{{w, 0, 10}}, []tacc{{a, 1, 2}}},
			{2, []tacc{{w, 5, 6}}, []tacc{{cache, 0, 1}}},
		}, [][]int{nil, nil, nil}},
		{"tasks of one op never wait for each other", []tk{
			{0, []tacc{{a, 0, 8}}, []tacc{{a, 0, 4}}},
			{0, []tacc{{a, 0, 8}}, []tacc{{a, 4, 8}}},
		}, [][]int{nil, nil}},
	}
	for _, c := range cases {
		g := taskGraph(3, c.tasks...)
		got := sorted(Depend(g))
		want := sorted(c.want)
		for i := range want {
			if len(want[i]) == 0 {
				want[i] = []int{}
			}
			if len(got[i]) == 0 {
				got[i] = []int{}
			}
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: preds %v, want %v", c.name, got, want)
		}
	}
}

func TestReduce(t *testing.T) {
	const a, b, c = 0, 1, 2
	cases := []struct {
		name  string
		tasks []tk
		want  [][]int
	}{
		{"edge implied by a full predecessor op is dropped", []tk{
			{0, nil, []tacc{{a, 0, 4}}},
			{1, []tacc{{a, 0, 4}}, []tacc{{b, 0, 4}}},
			{2, []tacc{{a, 0, 4}, {b, 0, 4}}, []tacc{{c, 0, 4}}},
		}, [][]int{{}, {0}, {1}}},
		{"edge kept when the other predecessor saw only part of the op", []tk{
			{0, nil, []tacc{{a, 0, 4}}},
			{0, nil, []tacc{{a, 4, 8}}},
			{1, []tacc{{a, 0, 4}}, []tacc{{b, 0, 4}}},
			{2, []tacc{{a, 4, 8}, {b, 0, 4}}, []tacc{{c, 0, 4}}},
		}, [][]int{{}, {}, {0}, {1, 2}}},
		{"transitive through two hops", []tk{
			{0, nil, []tacc{{a, 0, 4}}},
			{1, []tacc{{a, 0, 4}}, []tacc{{b, 0, 4}}},
			{2, []tacc{{b, 0, 4}}, []tacc{{c, 0, 4}}},
			{3, []tacc{{a, 0, 4}, {c, 0, 4}}, []tacc{{b, 8, 9}}},
		}, [][]int{{}, {0}, {1}, {2}}},
	}
	for _, cs := range cases {
		g := taskGraph(3, cs.tasks...)
		got := sorted(Reduce(g, Depend(g)))
		for i := range got {
			if got[i] == nil {
				got[i] = []int{}
			}
		}
		if !reflect.DeepEqual(got, cs.want) {
			t.Errorf("%s: reduced preds %v, want %v", cs.name, got, cs.want)
		}
	}
}

// TestDecomposeGraph runs Decompose on a two-op graph and checks the tasks
// cover each op's output exactly once.
func TestDecomposeGraph(t *testing.T) {
	b := &opBuilder{g: &ir.Graph{}}
	x := b.buf("x", 64, 4096)
	y := b.buf("y", 64, 4096)
	b.op(ir.Elementwise, y, x).Attr.Expr = ir.Load(0)
	o := b.buf("o", 64)
	r := b.op(ir.Reduce, o, y)
	r.Attr.Reduce, r.Attr.Dims = "sum", 1
	tg := Decompose(b.g, 8)
	per := map[int]int64{}
	for i, task := range tg.Tasks {
		if task.ID != i || task.Wait != tgraph.None || task.Trigger != tgraph.None || task.Order != task.Op {
			t.Errorf("task %d: id %d wait %d trigger %d order %d", i, task.ID, task.Wait, task.Trigger, task.Order)
		}
		n := int64(1)
		for d := range task.Box.Lo {
			n *= task.Box.Hi[d] - task.Box.Lo[d]
		}
		per[task.Op] += n
	}
	if per[0] != 64*4096 || per[1] != 64 {
		t.Errorf("tiles cover %v elements per op, want 262144 and 64", per)
	}
	if len(tg.OpNames) != 2 || len(tg.Buffers) != 3 || tg.Workers != 8 {
		t.Errorf("op names %v, %d buffers, %d workers", tg.OpNames, len(tg.Buffers), tg.Workers)
	}
	preds := Reduce(tg, Depend(tg))
	for _, task := range tg.Tasks {
		if task.Op == 1 && len(preds[task.ID]) == 0 {
			t.Errorf("reduce task %d has no predecessor", task.ID)
		}
	}
}

// TestDecodeAttentionTiles: decode attention's (row, head group, chunk)
// units are covered once each, by at most one task per worker while there
// are workers, and every task is whole rows, whole groups of one row or
// chunks of one group (codegen gives the kernel a flat range of units).
func TestDecodeAttentionTiles(t *testing.T) {
	for _, c := range []struct {
		B, splits, H, ug, workers, perRound int64
		wantTasks                           int
	}{
		{1, 18, 32, 1, 132, 0, 128},  // 18 chunks of 32 heads: 4 or 5 chunks a task
		{1, 18, 16, 1, 132, 0, 96},   // 18 chunks of 16 heads: 3 chunks a task
		{1, 4, 8, 1, 132, 0, 32},     // fewer units than workers: one a task
		{1, 5, 32, 1, 132, 0, 96},    // llama-3.2-1b at 552 positions (chunks of 128): 1 or 2 chunks a task
		{1, 5, 32, 1, 132, 4, 96},    // the same, bounded by its extent: within a round already
		{1, 32, 32, 1, 132, 0, 128},  // llama-3.2-1b at 4,096 positions: 8 chunks a task
		{1, 32, 32, 1, 132, 4, 256},  // bounded by its extent: one round (4 chunks) a task
		{1, 18, 32, 1, 8, 0, 8},      // few workers: whole heads, four a task
		{1, 18, 32, 1, 8, 4, 160},    // bounded: a head's chunks in tasks of four
		{16, 5, 32, 4, 132, 0, 128},  // batch 16, 4 heads a unit: a (row, group) a task
		{4, 5, 32, 4, 132, 0, 96},    // batch 4: 1 or 2 chunks of a group a task
		{200, 5, 32, 4, 132, 0, 132}, // more rows than workers: whole rows
		{8, 2, 32, 4, 16, 0, 16},     // 64 groups on 16 workers: 4 groups of a row a task
	} {
		out := sh(c.B, c.splits, c.H, 1, 66)
		boxes := decodeAttentionTiles(out, c.ug, c.workers, c.perRound)
		if len(boxes) != c.wantTasks || c.perRound == 0 && int64(len(boxes)) > c.workers {
			t.Errorf("%v: %d tasks, want %d", c, len(boxes), c.wantTasks)
		}
		checkDecodeBoxes(t, fmt.Sprint(c), boxes, c.B, c.splits, c.H, c.ug)
	}
}

// checkDecodeBoxes: every (row, chunk, head) unit covered once, each box
// whole rows, whole groups of one row, or chunks of one group, groups of ug
// heads aligned.
func checkDecodeBoxes(t *testing.T, name string, boxes []tgraph.Box, B, splits, H, ug int64) {
	t.Helper()
	seen := make([]int, B*splits*H)
	for _, b := range boxes {
		wholeRows := b.Lo[1] == 0 && b.Hi[1] == splits && b.Lo[2] == 0 && b.Hi[2] == H
		oneRow := b.Hi[0]-b.Lo[0] == 1 && b.Lo[2]%ug == 0 && b.Hi[2]%ug == 0 &&
			(b.Hi[2]-b.Lo[2] == ug || b.Lo[1] == 0 && b.Hi[1] == splits)
		if !wholeRows && !oneRow {
			t.Errorf("%s: box %v-%v is not whole rows, groups of one row or chunks of one group", name, b.Lo, b.Hi)
		}
		if b.Lo[3] != 0 || b.Hi[3] != 1 || b.Lo[4] != 0 || b.Hi[4] != 66 {
			t.Errorf("%s: box %v-%v cuts a dim other than rows, chunks and heads", name, b.Lo, b.Hi)
		}
		for r := b.Lo[0]; r < b.Hi[0]; r++ {
			for s := b.Lo[1]; s < b.Hi[1]; s++ {
				for h := b.Lo[2]; h < b.Hi[2]; h++ {
					seen[(r*splits+s)*H+h]++
				}
			}
		}
	}
	for u, n := range seen {
		if n != 1 {
			t.Errorf("%s: unit %d covered %d times", name, u, n)
		}
	}
}

// TestDecodeUnitsPerRound: a unit takes a warp per 32 positions of its chunk,
// all 16 consumer warps at most.
func TestDecodeUnitsPerRound(t *testing.T) {
	for chunk, want := range map[int64]int64{32: 16, 106: 4, 128: 4, 96: 5, 512: 1, 4096: 1} {
		if got := decodeUnitsPerRound(chunk); got != want {
			t.Errorf("decodeUnitsPerRound(%d) = %d, want %d", chunk, got, want)
		}
	}
}

// TestGroupTiles: with interleaved split groups, a task per head and group,
// each unit covered once; a live prefix of the chunks (what a mask's extent
// leaves) is spread evenly: no task holds more than ⌈live/R⌉ live chunks.
func TestGroupTiles(t *testing.T) {
	for _, c := range []struct{ B, splits, H, ug, R int64 }{{1, 32, 32, 1, 4}, {1, 5, 32, 1, 4}, {1, 33, 16, 1, 8},
		{1, 3, 8, 1, 16}, {4, 5, 32, 4, 4}, {16, 5, 32, 4, 1}} {
		out := sh(c.B, c.splits, c.H, 1, 66)
		boxes := groupTiles(out, c.ug, c.R)
		R := min(c.R, c.splits)
		if int64(len(boxes)) != c.B*c.H/c.ug*R {
			t.Errorf("%v: %d tasks, want %d", c, len(boxes), c.B*c.H/c.ug*R)
		}
		checkDecodeBoxes(t, fmt.Sprint(c), boxes, c.B, c.splits, c.H, c.ug)
		g := ir.SplitGroups{Splits: c.splits, R: c.R}
		for _, b := range boxes {
			if b.Hi[0]-b.Lo[0] != 1 || b.Hi[2]-b.Lo[2] != c.ug || g.Group(b.Lo[1]) != g.Group(b.Hi[1]-1) {
				t.Errorf("%v: box %v-%v is not one split group of one head group of one row", c, b.Lo, b.Hi)
			}
			for live := int64(1); live <= c.splits; live++ {
				n := int64(0)
				for s := b.Lo[1]; s < b.Hi[1]; s++ {
					if g.Chunk(s) < live {
						n++
					}
				}
				if n > (live+R-1)/R {
					t.Errorf("%v: box %v-%v holds %d of %d live chunks", c, b.Lo, b.Hi, n, live)
				}
			}
		}
	}
}

// TestSharedKVTiles: attention with shared K and V takes a task per head
// group, split and block of up to 16 rows, each unit covered once (a
// 64-token chunk: 8 KV heads x 9 chunks x 4 blocks; 24 rows: blocks of 16
// and 8).
func TestSharedKVTiles(t *testing.T) {
	for _, c := range []struct{ B, splits, H, ug, want int64 }{{64, 9, 32, 4, 288}, {24, 2, 8, 2, 16}} {
		out := sh(c.B, c.splits, c.H, 1, 66)
		boxes := sharedKVTiles(out, c.ug)
		if int64(len(boxes)) != c.want {
			t.Errorf("%v: %d tasks, want %d", c, len(boxes), c.want)
		}
		seen := make([]int, c.B*c.splits*c.H)
		for _, b := range boxes {
			if b.Hi[1]-b.Lo[1] != 1 || b.Hi[2]-b.Lo[2] != c.ug || b.Lo[2]%c.ug != 0 || b.Hi[0]-b.Lo[0] > sharedKVRows ||
				b.Lo[3] != 0 || b.Hi[3] != 1 || b.Lo[4] != 0 || b.Hi[4] != 66 {
				t.Errorf("%v: box %v-%v is not one split of one head group, at most %d rows", c, b.Lo, b.Hi, sharedKVRows)
			}
			for r := b.Lo[0]; r < b.Hi[0]; r++ {
				for h := b.Lo[2]; h < b.Hi[2]; h++ {
					seen[(r*c.splits+b.Lo[1])*c.H+h]++
				}
			}
		}
		for i, n := range seen {
			if n != 1 {
				t.Errorf("%v: unit %d covered %d times", c, i, n)
			}
		}
	}
}

// TestSplitSpan: the positions a box of interleaved splits reads cover
// every chunk it computes.
func TestSplitSpan(t *testing.T) {
	op := &ir.Op{Kind: ir.Attention, Attr: ir.Attrs{Splits: 8, Interleave: 3}}
	g := ir.SplitGroups{Splits: 8, R: 3}
	const S = 250 // chunks of 32, the last of 26
	for s0 := int64(0); s0 < 8; s0++ {
		for s1 := s0 + 1; s1 <= 8; s1++ {
			lo, hi := splitSpan(op, S, s0, s1)
			for s := s0; s < s1; s++ {
				a, b := ir.SplitPositions(S, 8, g.Chunk(s), g.Chunk(s)+1)
				if a < lo || b > hi {
					t.Errorf("splits [%d, %d) read [%d, %d), but split %d covers [%d, %d)", s0, s1, lo, hi, s, a, b)
				}
			}
		}
	}
}
