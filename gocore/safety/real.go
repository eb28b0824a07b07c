package safety

import (
	"math/rand"

	"mpk/gocore/tgraph"
	"mpk/gocore/validate"
)

// realMutant copies a real lowering and moves one reader's wait so that a
// writer it reads from is no longer its ancestor (preferring reads of a
// caller-owned buffer: the KV cache written by this step's append), then
// re-linearizes and re-schedules the copy as the compiler would.
func realMutant(rng *rand.Rand, orig *tgraph.Graph) (mutant, bool) {
	g := clone(orig)
	anc := ancestors(g)
	type pair struct{ a, b int }
	var pairs, kv []pair
	for _, rd := range g.Tasks {
		if rd.Wait == tgraph.None || len(rd.Reads) == 0 {
			continue
		}
		a := anc[rd.Wait]
		for _, wr := range g.Tasks {
			if wr.Order < rd.Order && a.has(wr.ID) && conflict(wr, rd) {
				pairs = append(pairs, pair{wr.ID, rd.ID})
				if wr.Writes[0].Buf < len(g.Buffers) && g.Buffers[wr.Writes[0].Buf].Input {
					kv = append(kv, pair{wr.ID, rd.ID})
				}
			}
			if len(pairs) > 2000 {
				break
			}
		}
		if len(pairs) > 2000 {
			break
		}
	}
	if len(kv) > 0 {
		pairs = kv
	}
	if len(pairs) == 0 {
		return mutant{}, false
	}
	p := pairs[rng.Intn(len(pairs))]
	earlier := []int{tgraph.None}
	for e := range g.Events {
		if anc[e] != nil && !anc[e].has(p.a) && !anc[e].has(p.b) && e != g.Tasks[p.b].Trigger {
			earlier = append(earlier, e)
		}
	}
	g.Tasks[p.b].Wait = earlier[rng.Intn(len(earlier))]
	b := &validate.Builder{G: g}
	b.Finish()
	return mutant{class: "real-read-before-writer", g: g, suspects: []int{b.Final[p.a]}}, true
}

// ancestors computes, independently of the validator, the tasks ordered
// before each event's consumers, as bitsets (nil for events on a cycle).
func ancestors(g *tgraph.Graph) []bits {
	prod := g.Producers()
	words := (len(g.Tasks) + 63) / 64
	anc := make([]bits, len(g.Events))
	state := make([]int, len(g.Events))
	var visit func(e int) bits
	visit = func(e int) bits {
		if state[e] != 0 {
			return anc[e] // done, or nil while on the stack (a cycle)
		}
		state[e] = 1
		a := make(bits, words)
		for _, p := range prod[e] {
			a[p>>6] |= 1 << (p & 63)
			if w := g.Tasks[p].Wait; w != tgraph.None {
				for i, x := range visit(w) {
					a[i] |= x
				}
			}
		}
		anc[e], state[e] = a, 2
		return a
	}
	for e := range g.Events {
		visit(e)
	}
	return anc
}

type bits []uint64

func (b bits) has(i int) bool { return b != nil && b[i>>6]&(1<<(i&63)) != 0 }

func clone(g *tgraph.Graph) *tgraph.Graph {
	c := *g
	c.Tasks = make([]*tgraph.Task, len(g.Tasks))
	for i, t := range g.Tasks {
		x := *t
		c.Tasks[i] = &x
	}
	c.Events = make([]*tgraph.Event, len(g.Events))
	for i, e := range g.Events {
		x := *e
		c.Events[i] = &x
	}
	c.Buffers = append([]tgraph.BufInfo(nil), g.Buffers...)
	c.Queues = make([][]int, len(g.Queues))
	for i, q := range g.Queues {
		c.Queues[i] = append([]int(nil), q...)
	}
	return &c
}
