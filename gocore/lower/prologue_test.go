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
