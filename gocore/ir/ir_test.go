package ir

import (
	"reflect"
	"testing"
)

func view(numel int64, off int64, shape, strides []int64) View {
	return View{Buf: &Buffer{Name: "b", Numel: numel}, Offset: off, Shape: shape, Strides: strides}
}

func TestContiguousStrides(t *testing.T) {
	cases := []struct {
		shape, want []int64
	}{
		{[]int64{}, []int64{}},
		{[]int64{5}, []int64{1}},
		{[]int64{2, 3, 4}, []int64{12, 4, 1}},
		{[]int64{2, 1, 3}, []int64{3, 3, 1}},
		{[]int64{4, 0, 3}, []int64{0, 3, 1}},
	}
	for _, c := range cases {
		if got := ContiguousStrides(c.shape); !reflect.DeepEqual(got, c.want) {
			t.Errorf("ContiguousStrides(%v) = %v, want %v", c.shape, got, c.want)
		}
	}
}

func TestViewPredicates(t *testing.T) {
	cases := []struct {
		name       string
		v          View
		contiguous bool
		whole      bool
		lo, hi     int64
	}{
		{"scalar", view(1, 0, []int64{}, []int64{}), true, true, 0, 1},
		{"dense", view(24, 0, []int64{2, 3, 4}, []int64{12, 4, 1}), true, true, 0, 24},
		{"dense with offset", view(30, 6, []int64{2, 3, 4}, []int64{12, 4, 1}), true, false, 6, 30},
		{"prefix of buffer", view(30, 0, []int64{2, 3, 4}, []int64{12, 4, 1}), true, false, 0, 24},
		{"transposed", view(6, 0, []int64{3, 2}, []int64{1, 3}), false, false, 0, 6},
		{"size-1 dims ignored", view(6, 0, []int64{1, 2, 1, 3}, []int64{99, 3, 7, 1}), true, true, 0, 6},
		{"broadcast (zero stride)", view(4, 0, []int64{3, 4}, []int64{0, 1}), false, false, 0, 4},
		{"broadcast with offset", view(10, 5, []int64{3, 4}, []int64{0, 1}), false, false, 5, 9},
		{"all-zero strides", view(1, 2, []int64{5, 5}, []int64{0, 0}), false, false, 2, 3},
		{"row slice", view(32, 8, []int64{2, 4}, []int64{8, 1}), false, false, 8, 20},
		{"step-2 slice", view(8, 1, []int64{4}, []int64{2}), false, false, 1, 8},
		{"empty", view(8, 3, []int64{2, 0}, []int64{0, 1}), true, false, 3, 3},
		{"negative stride", view(11, 10, []int64{3}, []int64{-2}), false, false, 6, 11},
	}
	for _, c := range cases {
		if got := c.v.IsContiguous(); got != c.contiguous {
			t.Errorf("%s: IsContiguous = %v, want %v", c.name, got, c.contiguous)
		}
		if got := c.v.IsWhole(); got != c.whole {
			t.Errorf("%s: IsWhole = %v, want %v", c.name, got, c.whole)
		}
		if lo, hi := c.v.Span(); lo != c.lo || hi != c.hi {
			t.Errorf("%s: Span = [%d, %d), want [%d, %d)", c.name, lo, hi, c.lo, c.hi)
		}
	}
}

func TestCloneCopiesSlices(t *testing.T) {
	v := view(6, 0, []int64{2, 3}, []int64{3, 1})
	c := v.Clone()
	c.Shape[0], c.Strides[0] = 9, 9
	if v.Shape[0] != 2 || v.Strides[0] != 3 || c.Buf != v.Buf {
		t.Errorf("Clone shares slices or drops the buffer: v=%v c=%v", v, c)
	}
}

func TestParseDType(t *testing.T) {
	for d := F32; d <= Bool; d++ {
		got, err := ParseDType(d.String())
		if err != nil || got != d {
			t.Errorf("ParseDType(%q) = %v, %v; want %v", d.String(), got, err, d)
		}
	}
	if _, err := ParseDType("complex64"); err == nil {
		t.Error("ParseDType(complex64) succeeded")
	}
	sizes := map[DType]int64{F32: 4, BF16: 2, F16: 2, F64: 8, I64: 8, I32: 4, I16: 2, I8: 1, U8: 1, Bool: 1}
	for d, s := range sizes {
		if d.Size() != s {
			t.Errorf("%s.Size() = %d, want %d", d, d.Size(), s)
		}
		if d.IsFloat() != (d <= F64) {
			t.Errorf("%s.IsFloat() = %v", d, d.IsFloat())
		}
	}
}

func TestExprMapKeepsSharing(t *testing.T) {
	s := Apply(EExp, Load(0))
	e := Apply(EAdd, s, Apply(EMul, s, Const(2)))
	calls := map[ExprOp]int{}
	m := e.Map(func(n *Expr) *Expr {
		calls[n.Op]++
		if n.Op == ELoad {
			return Load(n.Input + 3)
		}
		return n
	})
	if calls[EExp] != 1 || calls[ELoad] != 1 {
		t.Errorf("f called %d times on the shared exp and %d on its load, want once each", calls[EExp], calls[ELoad])
	}
	if m.Args[0] != m.Args[1].Args[0] {
		t.Error("the shared exp subtree is no longer shared after Map")
	}
	if m == e || m.Args[0] == s {
		t.Error("Map returned original nodes instead of copies")
	}
	if got, want := m.String(), "add(exp(in3),mul(exp(in3),2))"; got != want {
		t.Errorf("mapped = %s, want %s", got, want)
	}
	if got, want := e.String(), "add(exp(in0),mul(exp(in0),2))"; got != want {
		t.Errorf("Map changed the original: %s, want %s", got, want)
	}
}

func TestExprLoads(t *testing.T) {
	cases := []struct {
		e    *Expr
		want map[int]bool
	}{
		{Const(1), map[int]bool{}},
		{Index(0), map[int]bool{}},
		{Load(2), map[int]bool{2: true}},
		{Apply(EWhere, Load(0), Load(2), Cast(BF16, Load(0))), map[int]bool{0: true, 2: true}},
		{Apply(EAdd, Apply(ENeg, Load(3)), Index(1)), map[int]bool{3: true}},
	}
	for _, c := range cases {
		if got := c.e.Loads(); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s.Loads() = %v, want %v", c.e, got, c.want)
		}
	}
}

func TestExprArityAndString(t *testing.T) {
	cases := []struct {
		e     *Expr
		arity int
		str   string
	}{
		{Load(1), 0, "in1"},
		{Const(0.5), 0, "0.5"},
		{Index(2), 0, "idx2"},
		{Cast(BF16, Load(0)), 1, "bfloat16(in0)"},
		{Apply(ESilu, Load(0)), 1, "silu(in0)"},
		{Apply(EPow, Load(0), Const(2)), 2, "pow(in0,2)"},
		{Apply(ELe, Load(0), Load(1)), 2, "le(in0,in1)"},
		{Apply(EWhere, Load(0), Const(1), Const(0)), 3, "where(in0,1,0)"},
	}
	for _, c := range cases {
		if got := c.e.Op.Arity(); got != c.arity {
			t.Errorf("%s: arity %d, want %d", c.e.Op, got, c.arity)
		}
		if got := c.e.String(); got != c.str {
			t.Errorf("String = %q, want %q", got, c.str)
		}
	}
	for op := ELoad; op <= EIsNaN; op++ {
		if op.String() == "" {
			t.Errorf("expression op %d has no name", op)
		}
	}
}

// TestSplitGroups: Split and Chunk are inverse bijections of [0, Splits);
// group r holds chunks r, r+R, … in order, contiguous splits; R ≤ 1 is the
// identity.
func TestSplitGroups(t *testing.T) {
	for _, c := range []struct{ splits, R int64 }{{32, 4}, {5, 4}, {7, 3}, {33, 8}, {4, 1}, {4, 0}, {3, 9}} {
		g := SplitGroups{Splits: c.splits, R: c.R}
		R := max(1, min(c.R, c.splits))
		seen := map[int64]bool{}
		for s := int64(0); s < c.splits; s++ {
			ch := g.Chunk(s)
			if ch < 0 || ch >= c.splits || seen[ch] {
				t.Fatalf("%+v: split %d covers chunk %d (seen %v)", c, s, ch, seen[ch])
			}
			seen[ch] = true
			if g.Split(ch) != s {
				t.Errorf("%+v: Split(Chunk(%d)) = %d", c, s, g.Split(ch))
			}
			if ch%R != g.Group(s) {
				t.Errorf("%+v: split %d in group %d covers chunk %d", c, s, g.Group(s), ch)
			}
			if s > g.Start(g.Group(s)) && g.Chunk(s-1) != ch-R {
				t.Errorf("%+v: group %d not in chunk order at split %d", c, g.Group(s), s)
			}
			if R == 1 && ch != s {
				t.Errorf("%+v: R 1 maps split %d to chunk %d", c, s, ch)
			}
		}
		if g.Start(R) != c.splits {
			t.Errorf("%+v: groups end at %d", c, g.Start(R))
		}
	}
}

// TestLiveChunk: a prompt chunk's split covers whole groups of 16 positions,
// enough that the splits cover the live length, and less than 16 more each
// than an even cut (a 64-token chunk after 512 tokens on 4 splits: 144).
func TestLiveChunk(t *testing.T) {
	if got := LiveChunk(576, 4); got != 144 {
		t.Errorf("LiveChunk(576, 4) = %d, want 144", got)
	}
	for splits := int64(1); splits <= 9; splits++ {
		for extent := int64(0); extent <= 1000; extent++ {
			c := LiveChunk(extent, splits)
			even := (max(extent, 1) + splits - 1) / splits
			if c%16 != 0 || c*splits < extent || c < even || c >= even+16 {
				t.Fatalf("LiveChunk(%d, %d) = %d: want a multiple of 16 covering the extent, within 16 of %d", extent, splits, c, even)
			}
		}
	}
}
