package lower

import (
	"reflect"
	"strings"
	"testing"

	"mpk/gocore/ir"
	"mpk/gocore/wire"
)

// TestViewStrides follows ATen's computeStride: dims merge only when they are
// contiguous with each other, split freely, and size-1 dims never block a view.
func TestViewStrides(t *testing.T) {
	cases := []struct {
		name           string
		shape, strides []int64
		newShape       []int64
		want           []int64 // nil: not viewable
	}{
		{"merge contiguous", sh(2, 3, 4), sh(12, 4, 1), sh(6, 4), sh(4, 1)},
		{"flatten", sh(2, 3, 4), sh(12, 4, 1), sh(24), sh(1)},
		{"merge trailing", sh(2, 3, 4), sh(12, 4, 1), sh(2, 12), sh(12, 1)},
		{"split last", sh(2, 3, 4), sh(12, 4, 1), sh(2, 3, 2, 2), sh(12, 4, 2, 1)},
		{"identity", sh(2, 3), sh(3, 1), sh(2, 3), sh(3, 1)},
		{"row slice keeps row stride", sh(2, 4), sh(8, 1), sh(2, 2, 2), sh(8, 2, 1)},
		{"row slice cannot flatten", sh(2, 4), sh(8, 1), sh(8), nil},
		{"transposed cannot flatten", sh(3, 2), sh(1, 3), sh(6), nil},
		{"transposed adds size-1", sh(3, 2), sh(1, 3), sh(3, 2, 1), sh(1, 3, 3)},
		{"transposed splits a dim", sh(4, 3), sh(1, 4), sh(2, 2, 3), sh(2, 1, 4)},
		{"permuted cannot merge", sh(2, 4, 3), sh(12, 1, 4), sh(8, 3), nil},
		{"permuted cannot merge trailing", sh(2, 4, 3), sh(12, 1, 4), sh(2, 12), nil},
		{"permuted merges leading contiguous pair", sh(2, 3, 4), sh(3, 1, 6), sh(6, 4), sh(1, 6)},
		{"size-1 dim with odd stride", sh(2, 1, 3), sh(3, 99, 1), sh(6), sh(1)},
		{"drop size-1 dims", sh(1, 4, 1), sh(4, 1, 1), sh(4), sh(1)},
		{"expanded cannot flatten", sh(3, 4), sh(0, 1), sh(12), nil},
		{"expanded splits inner", sh(3, 4), sh(0, 1), sh(3, 2, 2), sh(0, 2, 1)},
		{"scalar to [1,1]", sh(), sh(), sh(1, 1), sh(1, 1)},
		{"empty is always viewable", sh(2, 0), sh(5, 7), sh(0, 3), sh(3, 1)},
	}
	for _, c := range cases {
		got, ok := viewStrides(c.shape, c.strides, c.newShape)
		if c.want == nil {
			if ok {
				t.Errorf("%s: %v/%v as %v gave strides %v, want no view", c.name, c.shape, c.strides, c.newShape, got)
			}
			continue
		}
		if !ok || !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: %v/%v as %v = %v, %v; want %v", c.name, c.shape, c.strides, c.newShape, got, ok, c.want)
		}
	}
}

// catchLower runs f, returning the *wire.Error a lowerer panicked with.
func catchLower(f func()) (err *wire.Error) {
	defer func() {
		if r := recover(); r != nil {
			err = r.(*wire.Error)
		}
	}()
	f()
	return nil
}

func TestBroadcast(t *testing.T) {
	buf := &ir.Buffer{Name: "b", Numel: 64}
	cases := []struct {
		name  string
		v     ir.View
		shape []int64
		want  []int64 // strides; nil: error
	}{
		{"same shape keeps strides", ir.View{Buf: buf, Shape: sh(3, 4), Strides: sh(1, 3)}, sh(3, 4), sh(1, 3)},
		{"leading dim added", ir.View{Buf: buf, Shape: sh(4), Strides: sh(2)}, sh(3, 4), sh(0, 2)},
		{"size-1 dim expanded", ir.View{Buf: buf, Shape: sh(3, 1), Strides: sh(1, 1)}, sh(3, 4), sh(1, 0)},
		{"scalar to matrix", ir.View{Buf: buf, Shape: sh(), Strides: sh()}, sh(2, 2), sh(0, 0)},
		{"two leading dims", ir.View{Buf: buf, Shape: sh(1, 5), Strides: sh(5, 1)}, sh(2, 3, 5), sh(0, 0, 1)},
		{"incompatible size", ir.View{Buf: buf, Shape: sh(3), Strides: sh(1)}, sh(4), nil},
		{"rank too high", ir.View{Buf: buf, Shape: sh(1, 4), Strides: sh(4, 1)}, sh(4), nil},
	}
	for _, c := range cases {
		var got ir.View
		l := &lowerer{g: &ir.Graph{}}
		c.v.Offset = 7
		err := catchLower(func() { got = broadcast(l, c.v, c.shape) })
		if c.want == nil {
			if err == nil || !strings.Contains(err.Message, "cannot broadcast") {
				t.Errorf("%s: got %v, err %v; want a broadcast error", c.name, got, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if !reflect.DeepEqual(got.Strides, c.want) || !reflect.DeepEqual(got.Shape, c.shape) || got.Offset != 7 || got.Buf != buf {
			t.Errorf("%s: got %v, want shape %v strides %v offset 7", c.name, got, c.shape, c.want)
		}
	}
}
