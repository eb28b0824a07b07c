package codegen

import (
	"os"
	"path/filepath"
	"testing"

	"mpk/gocore/ir"
	"mpk/gocore/tgraph"
)

// TestABIHeaderUpToDate fails when csrc/runtime/abi_gen.cuh drifts from the
// definitions in abi.go; UPDATE_GOLDEN=1 rewrites it.
func TestABIHeaderUpToDate(t *testing.T) {
	path := filepath.Join("..", "..", "csrc", "runtime", "abi_gen.cuh")
	want := ABIHeader()
	if os.Getenv("UPDATE_GOLDEN") != "" {
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Fatalf("%s is out of date with gocore/codegen/abi.go; run UPDATE_GOLDEN=1 go test ./gocore/codegen and review the diff", path)
	}
}

// TestSplitDimOfAWholeOp: an op decompose left in one task reports the dim
// its kernel reads [lo, hi) along, so the task covers the whole op (a
// one-task split-KV attention once got lo/hi of the batch dim, one chunk).
func TestSplitDimOfAWholeOp(t *testing.T) {
	whole := func(shape ...int64) (*ir.Op, tgraph.Box) {
		op := &ir.Op{Out: ir.View{Shape: shape}}
		return op, tgraph.Box{Lo: make([]int64, len(shape)), Hi: append([]int64(nil), shape...)}
	}
	for _, c := range []struct {
		kind ir.Kind
		want int
	}{{ir.Attention, 1}, {ir.AttnMerge, 1}, {ir.Linear, 1}, {ir.Elementwise, 0}} {
		op, box := whole(1, 4, 4, 1, 66)
		op.Kind = c.kind
		if got := splitDim(op, box); got != c.want {
			t.Errorf("%v: split dim %d, want %d", c.kind, got, c.want)
		}
	}
	op, box := whole(1, 4, 4, 1, 66)
	op.Kind = ir.Attention
	box.Lo[1], box.Hi[1] = 2, 4
	if got := splitDim(op, box); got != 1 {
		t.Errorf("a cut box: split dim %d, want 1", got)
	}
}

// TestTaskRangeOfDecodeAttention: a decode attention task's kernel gets the
// flat units (row·groups + group)·Splits + chunk its box covers.
func TestTaskRangeOfDecodeAttention(t *testing.T) {
	q := ir.View{Shape: []int64{1, 8, 1, 16}}
	op := &ir.Op{Kind: ir.Attention, In: []ir.View{q}, Out: ir.View{Shape: []int64{1, 4, 8, 1, 18}}, Attr: ir.Attrs{Splits: 4}}
	b := func(s0, s1, h0, h1 int64) tgraph.Box {
		return tgraph.Box{Lo: []int64{0, s0, h0, 0, 0}, Hi: []int64{1, s1, h1, 1, 18}}
	}
	for _, c := range []struct {
		box    tgraph.Box
		lo, hi int64
	}{{b(1, 3, 5, 6), 21, 23}, {b(0, 4, 2, 5), 8, 20}, {b(3, 4, 0, 1), 3, 4}} {
		if lo, hi := taskRange(op, c.box, 1); lo != c.lo || hi != c.hi {
			t.Errorf("box %v-%v: units [%d, %d), want [%d, %d)", c.box.Lo, c.box.Hi, lo, hi, c.lo, c.hi)
		}
	}
	// A batch of 3 rows, 2 heads a unit: units (row·4 + group)·4 + chunk.
	bq := ir.View{Shape: []int64{3, 8, 1, 16}}
	bop := &ir.Op{Kind: ir.Attention, In: []ir.View{bq}, Out: ir.View{Shape: []int64{3, 4, 8, 1, 18}},
		Attr: ir.Attrs{Splits: 4, UnitHeads: 2}}
	rb := func(r0, r1, s0, s1, h0, h1 int64) tgraph.Box {
		return tgraph.Box{Lo: []int64{r0, s0, h0, 0, 0}, Hi: []int64{r1, s1, h1, 1, 18}}
	}
	for _, c := range []struct {
		box    tgraph.Box
		lo, hi int64
	}{{rb(1, 3, 0, 4, 0, 8), 16, 48}, {rb(2, 3, 0, 4, 2, 6), 36, 44}, {rb(1, 2, 1, 3, 6, 8), 29, 31}} {
		if lo, hi := taskRange(bop, c.box, 1); lo != c.lo || hi != c.hi {
			t.Errorf("batch box %v-%v: units [%d, %d), want [%d, %d)", c.box.Lo, c.box.Hi, lo, hi, c.lo, c.hi)
		}
	}
	q.Shape[2] = 4 // a prefill chunk: the range is the box's chunks
	op.In[0] = q
	if lo, hi := taskRange(op, b(1, 3, 0, 8), 1); lo != 1 || hi != 3 {
		t.Errorf("prefill: [%d, %d), want [1, 3)", lo, hi)
	}
}

// TestSharedKVTaskRange: a task of attention with shared K and V (rows
// [r0, r1) of one head group and split) is the flat units (group·Splits +
// split)·B + row of mpk::attention_rows, and a box of one split and one head
// group is a flat range while one of two splits is not.
func TestSharedKVTaskRange(t *testing.T) {
	const B, splits, H, ug = 64, 9, 32, 4
	op := &ir.Op{Kind: ir.Attention, Out: ir.View{Shape: []int64{B, splits, H, 1, 66}},
		In:   []ir.View{{Shape: []int64{B, H, 1, 64}}},
		Attr: ir.Attrs{Splits: splits, UnitHeads: ug, SharedKV: true}}
	box := tgraph.Box{Lo: []int64{16, 5, 8, 0, 0}, Hi: []int64{32, 6, 12, 1, 66}}
	lo, hi := taskRange(op, box, 0)
	first := int64((2*splits + 5) * B) // head group 2, split 5
	if lo != first+16 || hi != first+32 {
		t.Errorf("taskRange = [%d, %d), want [%d, %d)", lo, hi, first+16, first+32)
	}
	if !decodeBoxOK(op, box) {
		t.Errorf("box %v-%v: want a flat range", box.Lo, box.Hi)
	}
	box.Hi[1] = 7
	if decodeBoxOK(op, box) {
		t.Errorf("box %v-%v of two splits: want no flat range", box.Lo, box.Hi)
	}
}
