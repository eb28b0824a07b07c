package safety

import (
	"math/rand"

	"mpk/gocore/tgraph"
	"mpk/gocore/validate"
)

// Classes are the fault classes, in report order; "none" is the unmutated
// graph, which must be accepted.
var Classes = []string{"none", "cycle", "dropped-wait", "wait-above-producers", "wait-no-producer",
	"partial-wait", "read-before-writer", "kv-read-before-append", "out-of-range-id",
	"capacity-overflow", "queue-deadlock", "random-dag"}

// mutant is one graph with its class and the tasks the oracle should delay.
type mutant struct {
	class    string
	g        *tgraph.Graph
	suspects []int
}

// makeMutant generates a random graph and injects one fault of class. ok is
// false when the graph has no place for that fault (the caller retries).
func makeMutant(rng *rand.Rand, class string) (m mutant, ok bool) {
	if class == "random-dag" {
		return mutant{class: class, g: randomDAG(rng)}, true
	}
	gg := generate(rng)
	b, g := gg.b, gg.b.G
	m.class = class
	pick := func(xs []int) int { return xs[rng.Intn(len(xs))] }
	waiting := func() []int {
		var ts []int
		for _, t := range g.Tasks {
			if t.Wait != tgraph.None {
				ts = append(ts, t.ID)
			}
		}
		return ts
	}
	final := func(ids []int) []int {
		out := make([]int, len(ids))
		for i, t := range ids {
			out[i] = b.Final[t]
		}
		return out
	}
	switch class {
	case "none":
		b.Finish()
	case "cycle":
		ws := waiting()
		if len(ws) == 0 {
			return m, false
		}
		t := pick(ws)
		desc := []int{t}
		for _, d := range g.Tasks {
			if d.Wait != tgraph.None && gg.anc[d.Wait][t] {
				desc = append(desc, d.ID)
			}
		}
		g.Tasks[pick(desc)].Trigger = g.Tasks[t].Wait
		b.Finish()
	case "dropped-wait":
		ws := waiting()
		if len(ws) == 0 {
			return m, false
		}
		t := pick(ws)
		sus := sortedKeys(gg.anc[g.Tasks[t].Wait])
		g.Tasks[t].Wait = tgraph.None
		b.Finish()
		m.suspects = final(sus)
	case "wait-no-producer":
		e := b.EventNeeding(1)
		g.Tasks[rng.Intn(len(g.Tasks))].Wait = e
		b.Finish()
	case "read-before-writer", "kv-read-before-append":
		type pair struct{ a, b int }
		var pairs []pair
		for _, rd := range g.Tasks {
			if rd.Wait == tgraph.None {
				continue
			}
			for _, wr := range g.Tasks {
				if wr.Order >= rd.Order || !gg.anc[rd.Wait][wr.ID] || !conflict(wr, rd) {
					continue
				}
				if class == "kv-read-before-append" && !(contains(gg.kvWrites, wr.ID) && contains(gg.attn, rd.ID)) {
					continue
				}
				pairs = append(pairs, pair{wr.ID, rd.ID})
			}
		}
		if len(pairs) == 0 {
			return m, false
		}
		p := pairs[rng.Intn(len(pairs))]
		earlier := []int{tgraph.None}
		for e, a := range gg.anc {
			if !a[p.a] && !a[p.b] && e != g.Tasks[p.b].Trigger {
				earlier = append(earlier, e)
			}
		}
		sortInts(earlier)
		g.Tasks[p.b].Wait = pick(earlier)
		b.Finish()
		m.suspects = final([]int{p.a})
	case "wait-above-producers", "partial-wait", "out-of-range-id", "capacity-overflow", "queue-deadlock":
		b.Finish()
		if !mutateFinished(rng, g, class, &m) {
			return m, false
		}
	default:
		panic("safety: unknown class " + class)
	}
	m.g = g
	return m, true
}

// mutateFinished injects the faults that act on a linearized, scheduled graph.
func mutateFinished(rng *rand.Rand, g *tgraph.Graph, class string, m *mutant) bool {
	prod, cons := g.Producers(), g.Consumers()
	var evs []int
	for e := range g.Events {
		if len(cons[e]) > 0 && (class != "partial-wait" || len(prod[e]) >= 2) {
			evs = append(evs, e)
		}
	}
	switch class {
	case "wait-above-producers":
		if len(evs) == 0 {
			return false
		}
		g.Events[evs[rng.Intn(len(evs))]].Needed++
	case "partial-wait":
		if len(evs) == 0 {
			return false
		}
		e := evs[rng.Intn(len(evs))]
		g.Events[e].Needed--
		m.suspects = prod[e]
	case "out-of-range-id":
		t := g.Tasks[rng.Intn(len(g.Tasks))]
		switch rng.Intn(7) {
		case 0:
			t.Wait = len(g.Events) + rng.Intn(3)
		case 1:
			t.Trigger = len(g.Events) + rng.Intn(3)
		case 2:
			t.Worker = g.Workers + rng.Intn(3)
		case 3:
			q := g.Queues[rng.Intn(len(g.Queues))]
			if len(q) == 0 {
				return false
			}
			q[rng.Intn(len(q))] = len(g.Tasks) + rng.Intn(3)
		case 4:
			if len(t.Reads) == 0 {
				return false
			}
			t.Reads[0].Buf = len(g.Buffers) + rng.Intn(3)
		case 5:
			if len(t.Writes) == 0 {
				return false
			}
			a := t.Writes[0]
			a.Ivs[len(a.Ivs)-1].Hi = g.Buffers[a.Buf].Numel + 1 + rng.Int63n(4)
		case 6:
			g.Events[rng.Intn(len(g.Events))].Last = len(g.Tasks) + 1 + rng.Intn(3)
		}
	case "capacity-overflow":
		if rng.Intn(2) == 0 {
			g.Workers, g.Queues = 0, nil
		} else {
			g.Workers = tgraph.MaxWorkers + 1
			for len(g.Queues) < g.Workers {
				g.Queues = append(g.Queues, nil)
			}
		}
	case "queue-deadlock":
		var ws []int
		for _, t := range g.Tasks {
			if t.Wait != tgraph.None && len(prod[t.Wait]) > 0 {
				ws = append(ws, t.ID)
			}
		}
		if len(ws) == 0 {
			return false
		}
		c := g.Tasks[ws[rng.Intn(len(ws))]]
		p := g.Tasks[prod[c.Wait][rng.Intn(len(prod[c.Wait]))]]
		g.Queues[p.Worker] = remove(g.Queues[p.Worker], p.ID)
		if rng.Intn(3) == 0 {
			// Anywhere on any worker: may or may not hang; the oracle decides.
			p.Worker = rng.Intn(g.Workers)
			q := g.Queues[p.Worker]
			k := rng.Intn(len(q) + 1)
			g.Queues[p.Worker] = append(q[:k:k], append([]int{p.ID}, q[k:]...)...)
		} else {
			// Right behind its consumer on the consumer's worker: a certain hang.
			p.Worker = c.Worker
			q := g.Queues[c.Worker]
			k := indexOf(q, c.ID) + 1
			g.Queues[p.Worker] = append(q[:k:k], append([]int{p.ID}, q[k:]...)...)
		}
	}
	return true
}

// randomDAG is a small graph with random waits, triggers, Needed, accesses
// and Orders: most are unsafe, some are not; only the oracle knows which.
func randomDAG(rng *rand.Rand) *tgraph.Graph {
	b := validate.NewBuilder(1 + rng.Intn(3))
	nb := 1 + rng.Intn(3)
	for i := range nb {
		b.Buf(string(rune('a'+i)), 16)
	}
	ne := 1 + rng.Intn(5)
	for range ne {
		if rng.Intn(4) == 0 {
			b.EventNeeding(rng.Intn(3))
		} else {
			b.Event()
		}
	}
	nt := 2 + rng.Intn(10)
	ev := func() int {
		if rng.Intn(3) == 0 {
			return tgraph.None
		}
		return rng.Intn(ne)
	}
	for i := range nt {
		var accs []validate.Acc
		for range rng.Intn(3) {
			lo := rng.Int63n(16)
			a := validate.Acc{Buf: rng.Intn(nb), Lo: lo, Hi: lo + 1 + rng.Int63n(16-lo), Write: rng.Intn(2) == 0}
			accs = append(accs, a)
		}
		b.Task("r#"+string(rune('0'+i%10)), rng.Intn(nt), ev(), ev(), accs...)
	}
	if rng.Intn(2) == 0 {
		b.Output(rng.Intn(nb))
	}
	return b.Finish()
}

func conflict(wr, rd *tgraph.Task) bool {
	for _, w := range wr.Writes {
		for _, r := range rd.Reads {
			if w.Buf == r.Buf && tgraph.Overlaps(w.Ivs, r.Ivs) {
				return true
			}
		}
	}
	return false
}

func contains(xs []int, x int) bool { return indexOf(xs, x) >= 0 }

func indexOf(xs []int, x int) int {
	for i, y := range xs {
		if y == x {
			return i
		}
	}
	return -1
}

func remove(xs []int, x int) []int {
	k := indexOf(xs, x)
	return append(xs[:k:k], xs[k+1:]...)
}

func sortInts(xs []int) {
	for i := 1; i < len(xs); i++ {
		for j := i; j > 0 && xs[j] < xs[j-1]; j-- {
			xs[j], xs[j-1] = xs[j-1], xs[j]
		}
	}
}
