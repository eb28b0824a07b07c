package arena

import (
	"testing"

	"mpk/gocore/ir"
	"mpk/gocore/tgraph"
)

// chain is in → a → b → c → out, an op a step and one task each, each task
// waiting on the one before (e0, e1, e2); c's op also reads u, which nothing
// writes, and the last op reads d, which the first op (no wait) writes.
func chain() (*ir.Graph, *tgraph.Graph, map[string]*ir.Buffer) {
	g := &ir.Graph{}
	bufs := map[string]*ir.Buffer{}
	for _, n := range []string{"in", "a", "b", "c", "u", "d", "out"} {
		kind := ir.Temp
		switch n {
		case "in":
			kind = ir.Input
		case "out":
			kind = ir.Output
		}
		bufs[n] = g.NewBuffer(n, kind, ir.F32, 16)
	}
	flat := func(n string) ir.View { return ir.View{Buf: bufs[n], Shape: []int64{16}, Strides: []int64{1}} }
	g.Ops = []*ir.Op{
		{Kind: ir.Elementwise, In: []ir.View{flat("in")}, Out: flat("d")},
		{Kind: ir.Elementwise, In: []ir.View{flat("in")}, Out: flat("a")},
		{Kind: ir.Elementwise, In: []ir.View{flat("a")}, Out: flat("b")},
		{Kind: ir.Elementwise, In: []ir.View{flat("b"), flat("u")}, Out: flat("c")},
		{Kind: ir.Elementwise, In: []ir.View{flat("c"), flat("d")}, Out: flat("out")},
	}
	acc := func(n string) tgraph.Access {
		return tgraph.Access{Buf: bufs[n].ID, Ivs: []tgraph.Interval{{Lo: 0, Hi: 16}}}
	}
	tg := &tgraph.Graph{Workers: 1}
	for _, b := range g.Buffers {
		tg.Buffers = append(tg.Buffers, tgraph.BufInfo{Name: b.Name, Numel: b.Numel, Input: b.Kind == ir.Input, Output: b.Kind == ir.Output})
	}
	task := func(op, wait, trigger int, reads []string, write string) {
		t := &tgraph.Task{ID: len(tg.Tasks), Op: op, Order: op, Wait: wait, Trigger: trigger, Writes: []tgraph.Access{acc(write)}}
		for _, r := range reads {
			t.Reads = append(t.Reads, acc(r))
		}
		tg.Tasks = append(tg.Tasks, t)
	}
	for e := range 4 {
		tg.Events = append(tg.Events, &tgraph.Event{ID: e, Needed: 1})
	}
	task(0, tgraph.None, 3, []string{"in"}, "d")
	task(1, tgraph.None, 0, []string{"in"}, "a")
	task(2, 0, 1, []string{"a"}, "b")
	task(3, 1, 2, []string{"b", "u"}, "c")
	task(4, 2, tgraph.None, []string{"c", "d"}, "out") // d's event (3) has no consumer: d is read unordered
	return g, tg, bufs
}

func TestPlace(t *testing.T) {
	at := func(tg *tgraph.Graph, b *ir.Buffer) int64 {
		info := tg.Buffers[b.ID]
		if !info.InArena {
			t.Fatalf("%s is not in the arena", b.Name)
		}
		return info.Arena
	}
	g, tg, b := chain()
	Place(g, tg, false)
	// In the order ops first touch them: d, a, b, u, c; 64 bytes each, 256 apart.
	for i, n := range []string{"d", "a", "b", "u", "c"} {
		if got := at(tg, b[n]); got != int64(i)*Align {
			t.Errorf("without reuse: %s at %d, want %d", n, got, i*Align)
		}
	}
	if tg.ArenaBytes != 5*Align || tg.Buffers[b["in"].ID].InArena || tg.Buffers[b["out"].ID].InArena {
		t.Errorf("without reuse: arena %d bytes (want %d), inputs and outputs outside it", tg.ArenaBytes, 5*Align)
	}

	g, tg, b = chain()
	Place(g, tg, true)
	// c's task waits on b's event, after which a's ops (1, 2) are done: c
	// takes a's bytes. b is written while a is read, nothing writes u, and d
	// is read by the last task: those keep bytes of their own.
	if at(tg, b["c"]) != at(tg, b["a"]) {
		t.Errorf("with reuse: c at %d, want a's bytes at %d", at(tg, b["c"]), at(tg, b["a"]))
	}
	seen := map[int64]string{}
	for _, n := range []string{"d", "a", "b", "u"} {
		if other, ok := seen[at(tg, b[n])]; ok {
			t.Errorf("with reuse: %s and %s share bytes", n, other)
		}
		seen[at(tg, b[n])] = n
	}
	if tg.ArenaBytes != 4*Align {
		t.Errorf("with reuse: arena %d bytes, want %d", tg.ArenaBytes, 4*Align)
	}
}

// TestPlaceGrowsUnderARun: a temporary larger than the retired bytes at the
// arena's end takes them and the arena grows under it.
func TestPlaceGrowsUnderARun(t *testing.T) {
	var p placer
	p.need = []opSet{nil, {1}} // buffer 1 may take bytes whose holders' ops are in {0}
	p.ops = [][]int{{0}, {1}}  // buffer 0 is accessed by op 0, buffer 1 by op 1
	p.unwritten = []bool{false, false}
	if lo := p.place(0, 256, true); lo != 0 {
		t.Fatalf("first at %d", lo)
	}
	if lo := p.place(1, 512, true); lo != 0 || p.end != 512 {
		t.Errorf("second at %d, arena %d; want 0 and 512", lo, p.end)
	}
}
