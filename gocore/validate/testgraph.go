package validate

import (
	"sort"

	"mpk/gocore/tgraph"
)

// Builder assembles small task graphs for tests and the mutant suite:
//
//	b := NewBuilder(2)
//	x := b.Buf("x", 64)
//	e := b.Event()
//	b.Task("producer#0", 0, tgraph.None, e, W(x, 0, 64))
//	b.Task("consumer#1", 1, e, tgraph.None, R(x, 0, 64))
//	g := b.Finish()
//
// Finish fills in what the compiler's late passes would: Needed (for events
// created with Event), a linearization (tasks renumbered so that the consumers
// of each event are contiguous, in topological order), launch ranges, and a
// round-robin ahead-of-time schedule.
type Builder struct {
	G     *tgraph.Graph
	Final []int // task handle (creation index) → id after Finish
	ops   map[string]int
}

// Acc is one access of one interval.
type Acc struct {
	Buf    int
	Lo, Hi int64
	Write  bool
}

// R reads [lo, hi) of buf; W writes it.
func R(buf int, lo, hi int64) Acc { return Acc{buf, lo, hi, false} }
func W(buf int, lo, hi int64) Acc { return Acc{buf, lo, hi, true} }

// NewBuilder starts a graph run by the given number of workers.
func NewBuilder(workers int) *Builder {
	return &Builder{G: &tgraph.Graph{Workers: workers}, ops: map[string]int{}}
}

// Buf adds a buffer; Output marks it a graph output.
func (b *Builder) Buf(name string, numel int64) int {
	b.G.Buffers = append(b.G.Buffers, tgraph.BufInfo{Name: name, Numel: numel})
	return len(b.G.Buffers) - 1
}

// Output marks buf a graph output.
func (b *Builder) Output(buf int) { b.G.Buffers[buf].Output = true }

// Event adds an event whose Needed Finish sets to its producer count.
func (b *Builder) Event() int { return b.EventNeeding(-1) }

// EventNeeding adds an event that needs exactly n triggers.
func (b *Builder) EventNeeding(n int) int {
	id := len(b.G.Events)
	b.G.Events = append(b.G.Events, &tgraph.Event{ID: id, Needed: n})
	return id
}

// Task adds a task of the op labelled op ("" for an empty relay task) and
// returns its handle, which is its id until Finish renumbers.
func (b *Builder) Task(op string, order, wait, trigger int, accs ...Acc) int {
	id := len(b.G.Tasks)
	t := &tgraph.Task{ID: id, Op: -1, Wait: wait, Trigger: trigger, Order: order}
	if op != "" {
		k, ok := b.ops[op]
		if !ok {
			k = len(b.G.OpNames)
			b.ops[op] = k
			b.G.OpNames = append(b.G.OpNames, op)
		}
		t.Op = k
	}
	for _, a := range accs {
		acc := tgraph.Access{Buf: a.Buf, Ivs: []tgraph.Interval{{Lo: a.Lo, Hi: a.Hi}}}
		if a.Write {
			if t.Box.Lo == nil {
				t.Box = tgraph.Box{Lo: []int64{a.Lo}, Hi: []int64{a.Hi}}
			}
			t.Writes = append(t.Writes, acc)
		} else {
			t.Reads = append(t.Reads, acc)
		}
	}
	b.G.Tasks = append(b.G.Tasks, t)
	return id
}

// Finish sets Needed, linearizes, sets launch ranges and schedules. Ids out of
// range are left as they are (tests of the ids rule build such graphs).
func (b *Builder) Finish() *tgraph.Graph {
	g := b.G
	prod := g.Producers()
	for e, ev := range g.Events {
		if ev.Needed < 0 {
			ev.Needed = len(prod[e])
		}
	}
	rank := eventRanks(g)
	perm := make([]int, len(g.Tasks)) // new position → old id
	for i := range perm {
		perm[i] = i
	}
	key := func(t *tgraph.Task) int {
		if t.Wait < 0 || t.Wait >= len(rank) {
			return -1
		}
		return rank[t.Wait]
	}
	sort.SliceStable(perm, func(i, j int) bool { return key(g.Tasks[perm[i]]) < key(g.Tasks[perm[j]]) })
	tasks := make([]*tgraph.Task, len(perm))
	b.Final = make([]int, len(perm))
	for i, old := range perm {
		tasks[i] = g.Tasks[old]
		tasks[i].ID = i
		b.Final[old] = i
	}
	g.Tasks = tasks
	for _, ev := range g.Events {
		ev.First, ev.Last = 0, 0
	}
	for i := len(tasks) - 1; i >= 0; i-- {
		if w := tasks[i].Wait; w >= 0 && w < len(g.Events) {
			g.Events[w].First = i
			if g.Events[w].Last == 0 {
				g.Events[w].Last = i + 1
			}
		}
	}
	w := max(g.Workers, 1)
	g.Queues = make([][]int, w)
	for i, t := range tasks {
		t.Worker = i % w
		g.Queues[t.Worker] = append(g.Queues[t.Worker], i)
	}
	return g
}

// eventRanks orders events topologically (those on cycles last, by id).
func eventRanks(g *tgraph.Graph) []int {
	ne := len(g.Events)
	ok := func(e int) bool { return e >= 0 && e < ne }
	indeg := make([]int, ne)
	out := make([][]int, ne)
	for _, t := range g.Tasks {
		if ok(t.Wait) && ok(t.Trigger) {
			indeg[t.Trigger]++
			out[t.Wait] = append(out[t.Wait], t.Trigger)
		}
	}
	rank := make([]int, ne)
	for i := range rank {
		rank[i] = -1
	}
	var q []int
	for e := range ne {
		if indeg[e] == 0 {
			q = append(q, e)
		}
	}
	n := 0
	for len(q) > 0 {
		e := q[0]
		q = q[1:]
		rank[e] = n
		n++
		for _, f := range out[e] {
			if indeg[f]--; indeg[f] == 0 {
				q = append(q, f)
			}
		}
	}
	for e := range rank {
		if rank[e] < 0 {
			rank[e] = n
			n++
		}
	}
	return rank
}
