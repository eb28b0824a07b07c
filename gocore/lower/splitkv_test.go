package lower

import (
	"testing"

	"mpk/gocore/ir"
)

// TestDecodeUnitHeads: a KV head's query heads share a decode attention unit
// (each K and V load serves all of them) when the units still cover every
// worker: llama-3.2-1b's shapes at batch 4, not at batch 1.
func TestDecodeUnitHeads(t *testing.T) {
	for _, c := range []struct {
		B, want int64
	}{{1, 0}, {4, 4}, {16, 4}} {
		b := newBuilder()
		q := b.input("q", ir.BF16, c.B, 32, 1, 64)
		k := b.input("k", ir.BF16, c.B, 8, 552, 64)
		v := b.input("v", ir.BF16, c.B, 8, 552, 64)
		att := b.temp("att", ir.F32, c.B, 32, 1, 64)
		a := b.op(ir.Attention, att, q, k, v)
		a.Attr.Scale, a.Attr.Groups = 1, 4
		b.output(att)
		splitAttention(b.g, 132)
		if a.Attr.Splits != 5 || a.Attr.UnitHeads != c.want {
			t.Errorf("batch %d: %d splits, %d heads a unit; want 5 splits, %d heads", c.B, a.Attr.Splits, a.Attr.UnitHeads, c.want)
		}
	}
	// Head dim 128 (qwen3-8b): 4 outputs a lane a head, so 2 heads a unit; 6 groups of 256: none.
	for _, c := range []struct{ G, Dv, want int64 }{{4, 128, 2}, {4, 64, 4}, {8, 64, 4}, {6, 256, 1}, {3, 64, 3}, {3, 128, 1}} {
		if got := unitHeads(c.G, c.Dv); got != c.want {
			t.Errorf("unitHeads(%d, %d) = %d, want %d", c.G, c.Dv, got, c.want)
		}
	}
}
