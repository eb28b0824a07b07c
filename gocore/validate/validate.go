// Package validate is the static validator of docs/architecture.md contract 5: it proves,
// before anything is launched, that a task graph cannot hang or race.
//
// Semantics checked: a task waits on event Wait (or none) until Needed tasks
// have triggered it, executes, then triggers Trigger (or none). Counters are
// monotonic. Rules, each with a stable name that appears in the error:
//
//	capacity         counts within the runtime tables; at least one worker
//	ids              every id in range; Task.ID and Event.ID equal their index;
//	                 intervals sorted, disjoint, non-empty and within the buffer
//	no-producer      a wait on an event that no task triggers
//	unsatisfiable-wait  Needed above the number of producers
//	partial-wait     Needed below the number of producers (consumers would race
//	                 on which producer finished)
//	cycle            the task → event → task graph has a cycle
//	launch-range     the tasks waiting on event e are exactly [e.First, e.Last)
//	queue            every task is in exactly one queue, its own worker's
//	queue-deadlock   the ahead-of-time queues stall before every task ran
//	unordered-read   a read of a region whose lower-Order writer is not an
//	                 event ancestor of the reader (or a same-op read/write race)
//	unordered-write  a write that is not event-ordered after a lower-Order
//	                 reader or writer of the region, or two tiles of one op
//	                 writing one element
//	shared-arena     two temporaries share arena bytes (package arena) while a
//	                 task of one is not event-ordered before every task of the
//	                 other
//	output           an element of an output buffer that no task writes
//
// Queue order never counts as ordering for memory: only events do. Queue
// rules are skipped for a graph that has not been scheduled (Queues == nil).
package validate

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"mpk/gocore/tgraph"
)

// Error is a rejected graph: which rule, which tasks and events, and why.
type Error struct {
	Rule   string
	Tasks  []int
	Events []int
	Msg    string
}

func (e *Error) Error() string { return fmt.Sprintf("validate: rule %q: %s", e.Rule, e.Msg) }

// Rules lists every rule name in the order Check applies them.
var Rules = []string{"capacity", "ids", "no-producer", "unsatisfiable-wait", "partial-wait",
	"cycle", "launch-range", "queue", "queue-deadlock", "unordered-read", "unordered-write", "shared-arena", "output"}

// Check returns nil if g is safe to launch, or the first violated rule as an
// *Error. It runs in O(tasks·events/64 + accesses·log + conflicting pairs).
func Check(g *tgraph.Graph) error {
	if e := checkCapacity(g); e != nil {
		return e
	}
	if e := checkIDs(g); e != nil {
		return e
	}
	c := &checker{g: g, prod: g.Producers(), cons: g.Consumers()}
	for _, f := range []func() *Error{c.waits, c.order, c.launchRange, c.queues, c.deadlock, c.memory, c.sharedArena, c.outputs} {
		if e := f(); e != nil {
			return e
		}
	}
	return nil
}

type checker struct {
	g          *tgraph.Graph
	prod, cons [][]int
	topo       []int    // events in topological order
	anc        []bitset // per event: every task that happens-before its consumers
}

func fail(rule string, tasks, events []int, format string, args ...any) *Error {
	return &Error{Rule: rule, Tasks: tasks, Events: events, Msg: fmt.Sprintf(format, args...)}
}

func checkCapacity(g *tgraph.Graph) *Error {
	switch {
	case len(g.Tasks) > tgraph.MaxTasks:
		return fail("capacity", nil, nil, "%d tasks, the runtime holds at most %d", len(g.Tasks), tgraph.MaxTasks)
	case len(g.Events) > tgraph.MaxEvents:
		return fail("capacity", nil, nil, "%d events, the runtime holds at most %d", len(g.Events), tgraph.MaxEvents)
	case g.Workers < 1 || g.Workers > tgraph.MaxWorkers:
		return fail("capacity", nil, nil, "%d workers, want 1 to %d", g.Workers, tgraph.MaxWorkers)
	}
	return nil
}

func checkIDs(g *tgraph.Graph) *Error {
	nt, ne := len(g.Tasks), len(g.Events)
	evOK := func(e int) bool { return e == tgraph.None || (e >= 0 && e < ne) }
	for i, t := range g.Tasks {
		if t == nil {
			return fail("ids", []int{i}, nil, "task %d is nil", i)
		}
		if t.ID != i {
			return fail("ids", []int{i}, nil, "task at index %d has ID %d", i, t.ID)
		}
		if !evOK(t.Wait) {
			return fail("ids", []int{i}, []int{t.Wait}, "%s waits on event %d, out of range [0, %d)", g.Name(i), t.Wait, ne)
		}
		if !evOK(t.Trigger) {
			return fail("ids", []int{i}, []int{t.Trigger}, "%s triggers event %d, out of range [0, %d)", g.Name(i), t.Trigger, ne)
		}
		if t.Worker < 0 || t.Worker >= g.Workers {
			return fail("ids", []int{i}, nil, "%s runs on worker %d, out of range [0, %d)", g.Name(i), t.Worker, g.Workers)
		}
		for _, set := range [2][]tgraph.Access{t.Reads, t.Writes} {
			for _, a := range set {
				if a.Buf < 0 || a.Buf >= len(g.Buffers) {
					return fail("ids", []int{i}, nil, "%s accesses buffer %d, out of range [0, %d)", g.Name(i), a.Buf, len(g.Buffers))
				}
				numel := g.Buffers[a.Buf].Numel
				prev := int64(0)
				for k, iv := range a.Ivs {
					if iv.Lo < prev || iv.Hi <= iv.Lo || iv.Hi > numel {
						return fail("ids", []int{i}, nil, "%s accesses buf %s interval %d [%d, %d): want sorted, disjoint, non-empty, within [0, %d)",
							g.Name(i), g.Buffers[a.Buf].Name, k, iv.Lo, iv.Hi, numel)
					}
					prev = iv.Hi
				}
			}
		}
	}
	for i, e := range g.Events {
		if e == nil {
			return fail("ids", nil, []int{i}, "event %d is nil", i)
		}
		if e.ID != i {
			return fail("ids", nil, []int{i}, "event at index %d has ID %d", i, e.ID)
		}
		if e.Needed < 0 {
			return fail("ids", nil, []int{i}, "event %d needs %d producers, want >= 0", i, e.Needed)
		}
		if e.First < 0 || e.First > e.Last || e.Last > nt {
			return fail("ids", nil, []int{i}, "event %d launch range [%d, %d) is not within [0, %d)", i, e.First, e.Last, nt)
		}
	}
	for _, b := range g.Buffers {
		if b.InArena && (b.Input || b.Output || b.ElemBytes <= 0 || b.Arena < 0 || b.Arena%b.ElemBytes != 0 ||
			b.Arena+b.Numel*b.ElemBytes > g.ArenaBytes) {
			return fail("ids", nil, nil, "buf %s (%d elements of %d bytes) at arena byte %d does not fit an arena of %d bytes",
				b.Name, b.Numel, b.ElemBytes, b.Arena, g.ArenaBytes)
		}
	}
	if g.Queues != nil && len(g.Queues) != g.Workers {
		return fail("ids", nil, nil, "%d queues for %d workers", len(g.Queues), g.Workers)
	}
	for w, q := range g.Queues {
		for k, t := range q {
			if t < 0 || t >= nt {
				return fail("ids", []int{t}, nil, "queue of worker %d holds task %d at position %d, out of range [0, %d)", w, t, k, nt)
			}
		}
	}
	return nil
}

// waits: every wait is satisfiable and waits for all producers of its event.
func (c *checker) waits() *Error {
	g := c.g
	for e, cons := range c.cons {
		if len(cons) == 0 {
			continue
		}
		p, need := len(c.prod[e]), g.Events[e].Needed
		switch {
		case p == 0:
			return fail("no-producer", cons, []int{e}, "%s waits on event %d, which no task triggers", g.Name(cons[0]), e)
		case need > p:
			return fail("unsatisfiable-wait", cons, []int{e}, "%s waits on event %d for %d triggers, but only %d tasks trigger it (%s)",
				g.Name(cons[0]), e, need, p, c.names(c.prod[e], 3))
		case need < p:
			return fail("partial-wait", append(append([]int{}, cons...), c.prod[e]...), []int{e},
				"%s waits on event %d for %d of its %d producers (%s); want all %d, or consumers race on which finished",
				g.Name(cons[0]), e, need, p, c.names(c.prod[e], 3), p)
		}
	}
	return nil
}

// names describes up to max tasks.
func (c *checker) names(ts []int, max int) string {
	var parts []string
	for i, t := range ts {
		if i == max {
			parts = append(parts, fmt.Sprintf("and %d more", len(ts)-max))
			break
		}
		parts = append(parts, c.g.Name(t))
	}
	return strings.Join(parts, ", ")
}

// order sorts events topologically (edge wait(p) → trigger(p) for every task
// p), reports a cycle, and computes per-event ancestor sets:
// anc(e) = ∪_{p ∈ producers(e)} {p} ∪ anc(wait(p)).
func (c *checker) order() *Error {
	g := c.g
	ne := len(g.Events)
	indeg := make([]int, ne)
	for _, t := range g.Tasks {
		if t.Wait != tgraph.None && t.Trigger != tgraph.None {
			indeg[t.Trigger]++
		}
	}
	c.topo = make([]int, 0, ne)
	for e := range ne {
		if indeg[e] == 0 {
			c.topo = append(c.topo, e)
		}
	}
	for i := 0; i < len(c.topo); i++ {
		for _, t := range c.cons[c.topo[i]] {
			if tr := g.Tasks[t].Trigger; tr != tgraph.None {
				if indeg[tr]--; indeg[tr] == 0 {
					c.topo = append(c.topo, tr)
				}
			}
		}
	}
	if len(c.topo) < ne {
		return c.cycle(indeg)
	}
	words := (len(g.Tasks) + 63) / 64
	c.anc = make([]bitset, ne)
	for _, e := range c.topo {
		if len(c.cons[e]) == 0 {
			continue // nobody asks; leave nil
		}
		b := make(bitset, words)
		for _, p := range c.prod[e] {
			b.set(p)
			if w := g.Tasks[p].Wait; w != tgraph.None {
				b.or(c.anc[w]) // w has p as a consumer, so anc[w] is set
			}
		}
		c.anc[e] = b
	}
	return nil
}

// cycle walks back from an event left with in-degree > 0 until an event
// repeats, and reports the tasks on that loop.
func (c *checker) cycle(indeg []int) *Error {
	g := c.g
	start := -1
	for e, d := range indeg {
		if d > 0 {
			start = e
			break
		}
	}
	seen := map[int]int{} // event → position in path
	var evs, tasks []int
	for e := start; ; {
		if pos, ok := seen[e]; ok {
			evs, tasks = evs[pos:], tasks[pos:]
			break
		}
		seen[e] = len(evs)
		var via int = -1
		for _, p := range c.prod[e] {
			if w := g.Tasks[p].Wait; w != tgraph.None && indeg[w] > 0 {
				via = p
				break
			}
		}
		evs = append(evs, e)
		tasks = append(tasks, via)
		e = g.Tasks[via].Wait
	}
	// The walk went backwards; present it forwards.
	for i, j := 0, len(tasks)-1; i < j; i, j = i+1, j-1 {
		tasks[i], tasks[j] = tasks[j], tasks[i]
		evs[i], evs[j] = evs[j], evs[i]
	}
	var sb strings.Builder
	for i, t := range tasks {
		if i > 0 {
			sb.WriteString(" → ")
		}
		fmt.Fprintf(&sb, "%s triggers event %d", g.Name(t), g.Tasks[t].Trigger)
	}
	return fail("cycle", tasks, evs, "tasks wait on each other in a loop: %s, which the first waits on", sb.String())
}

func (c *checker) launchRange() *Error {
	g := c.g
	for e, ev := range g.Events {
		cons := c.cons[e]
		if len(cons) == 0 && ev.First == ev.Last {
			continue
		}
		for _, t := range cons {
			if t < ev.First || t >= ev.Last {
				return fail("launch-range", []int{t}, []int{e}, "%s waits on event %d but is outside its launch range [%d, %d)",
					g.Name(t), e, ev.First, ev.Last)
			}
		}
		if len(cons) != ev.Last-ev.First {
			for t := ev.First; t < ev.Last; t++ {
				if g.Tasks[t].Wait != e {
					return fail("launch-range", []int{t}, []int{e}, "%s is in the launch range [%d, %d) of event %d but waits on event %d",
						g.Name(t), ev.First, ev.Last, e, g.Tasks[t].Wait)
				}
			}
		}
	}
	return nil
}

func (c *checker) queues() *Error {
	g := c.g
	if g.Queues == nil {
		return nil
	}
	where := make([]int, len(g.Tasks))
	for i := range where {
		where[i] = -1
	}
	for w, q := range g.Queues {
		for _, t := range q {
			if where[t] >= 0 {
				return fail("queue", []int{t}, nil, "%s is queued twice (workers %d and %d)", g.Name(t), where[t], w)
			}
			where[t] = w
			if g.Tasks[t].Worker != w {
				return fail("queue", []int{t}, nil, "%s is assigned worker %d but queued on worker %d", g.Name(t), g.Tasks[t].Worker, w)
			}
		}
	}
	for t, w := range where {
		if w < 0 {
			return fail("queue", []int{t}, nil, "%s is in no worker's queue", g.Name(t))
		}
	}
	return nil
}

// deadlock runs the static schedule: each worker runs its queue in order, a
// task runs once its wait is satisfied. O(tasks + events).
func (c *checker) deadlock() *Error {
	g := c.g
	if g.Queues == nil {
		return nil
	}
	count := make([]int, len(g.Events))
	blocked := make([][]int, len(g.Events)) // workers whose head waits on e
	head := make([]int, len(g.Queues))
	ready := make([]int, 0, len(g.Queues))
	for w := range g.Queues {
		ready = append(ready, w)
	}
	for len(ready) > 0 {
		w := ready[len(ready)-1]
		ready = ready[:len(ready)-1]
		for head[w] < len(g.Queues[w]) {
			t := g.Tasks[g.Queues[w][head[w]]]
			if t.Wait != tgraph.None && count[t.Wait] < g.Events[t.Wait].Needed {
				blocked[t.Wait] = append(blocked[t.Wait], w)
				break
			}
			head[w]++
			if e := t.Trigger; e != tgraph.None {
				count[e]++
				if count[e] == g.Events[e].Needed {
					ready = append(ready, blocked[e]...)
					blocked[e] = nil
				}
			}
		}
	}
	var stuck, evs []int
	var descr []string
	for w, q := range g.Queues {
		if head[w] < len(q) {
			t := q[head[w]]
			stuck = append(stuck, t)
			e := g.Tasks[t].Wait
			evs = append(evs, e)
			if len(descr) < 4 {
				descr = append(descr, fmt.Sprintf("worker %d at %s waits on event %d (%d of %d triggers)", w, g.Name(t), e, count[e], g.Events[e].Needed))
			}
		}
	}
	if stuck == nil {
		return nil
	}
	if len(stuck) > len(descr) {
		descr = append(descr, fmt.Sprintf("and %d more workers", len(stuck)-len(descr)))
	}
	return fail("queue-deadlock", stuck, evs, "the ahead-of-time queues stall: %s; want each queue a linear extension of the graph",
		strings.Join(descr, "; "))
}

// span is one interval of one access in a per-buffer sweep.
type span struct {
	lo, hi int64
	task   int
	write  bool
}

// memory checks every conflicting pair of accesses (same buffer, overlapping,
// at least one write) with a per-buffer sweep over intervals sorted by start.
func (c *checker) memory() *Error {
	g := c.g
	perBuf := make([][]span, len(g.Buffers))
	written := make([]bool, len(g.Buffers))
	for _, t := range g.Tasks {
		for _, a := range t.Writes {
			written[a.Buf] = true
		}
	}
	for _, t := range g.Tasks {
		for k, set := range [2][]tgraph.Access{t.Reads, t.Writes} {
			for _, a := range set {
				// A Fresh read promises to read nothing the launch writes (the
				// reference executor's audit checks the promise).
				if !written[a.Buf] || a.Fresh {
					continue
				}
				for _, iv := range a.Ivs {
					perBuf[a.Buf] = append(perBuf[a.Buf], span{iv.Lo, iv.Hi, t.ID, k == 1})
				}
			}
		}
	}
	for b, spans := range perBuf {
		// Generic: sort.Slice's reflection cost a fifth of a long chunk's compile.
		slices.SortFunc(spans, func(x, y span) int {
			if x.lo != y.lo {
				return cmp.Compare(x.lo, y.lo)
			}
			return x.task - y.task
		})
		var reads, writes []span // active spans
		for _, s := range spans {
			reads = prune(reads, s.lo)
			writes = prune(writes, s.lo)
			for _, w := range writes {
				if e := c.pair(b, w, s); e != nil {
					return e
				}
			}
			if s.write {
				for _, r := range reads {
					if e := c.pair(b, r, s); e != nil {
						return e
					}
				}
				writes = append(writes, s)
			} else {
				reads = append(reads, s)
			}
		}
	}
	return nil
}

func prune(active []span, lo int64) []span {
	out := active[:0]
	for _, s := range active {
		if s.hi > lo {
			out = append(out, s)
		}
	}
	return out
}

// before reports whether task a happens-before task b through events alone.
func (c *checker) before(a, b int) bool {
	w := c.g.Tasks[b].Wait
	return w != tgraph.None && c.anc[w].has(a)
}

// pair checks two overlapping accesses, at least one a write.
func (c *checker) pair(buf int, x, y span) *Error {
	if x.task == y.task {
		return nil
	}
	g := c.g
	tx, ty := g.Tasks[x.task], g.Tasks[y.task]
	if tx.Order > ty.Order || (tx.Order == ty.Order && x.task > y.task) {
		x, y, tx, ty = y, x, ty, tx
	}
	name := g.Buffers[buf].Name
	lo, hi := max(x.lo, y.lo), min(x.hi, y.hi)
	ts := []int{x.task, y.task}
	if tx.Order == ty.Order {
		switch {
		case x.write && y.write:
			return fail("unordered-write", ts, nil, "%s and %s, tiles of one op, both write buf %s [%d, %d); want an op's tiles disjoint",
				g.Name(x.task), g.Name(y.task), name, lo, hi)
		case x.write:
			return fail("unordered-read", ts, nil, "%s reads buf %s [%d, %d), which %s of the same op writes; want no read/write overlap within one op",
				g.Name(y.task), name, lo, hi, g.Name(x.task))
		default:
			return fail("unordered-read", ts, nil, "%s reads buf %s [%d, %d), which %s of the same op writes; want no read/write overlap within one op",
				g.Name(x.task), name, lo, hi, g.Name(y.task))
		}
	}
	if c.before(x.task, y.task) {
		return nil
	}
	switch {
	case !y.write:
		return fail("unordered-read", ts, nil, "%s reads buf %s [%d, %d) written by %s, want the writer ordered before it by events",
			g.Name(y.task), name, lo, hi, g.Name(x.task))
	case x.write:
		return fail("unordered-write", ts, nil, "%s writes buf %s [%d, %d) also written by the earlier %s, want that writer ordered before it by events",
			g.Name(y.task), name, lo, hi, g.Name(x.task))
	default:
		return fail("unordered-write", ts, nil, "%s writes buf %s [%d, %d) read by the earlier %s, want the reader ordered before it by events",
			g.Name(y.task), name, lo, hi, g.Name(x.task))
	}
}

// sharedArena checks the temporaries that share arena bytes: of each two
// whose bytes overlap, every task accessing one happens-before, by events,
// every task accessing the other (package arena places them so). Accesses
// of one buffer are checked by memory, in the buffer's own elements.
func (c *checker) sharedArena() *Error {
	g := c.g
	type held struct {
		buf    int
		lo, hi int64
	}
	var spans []held
	for b, info := range g.Buffers {
		if info.InArena && info.Numel > 0 {
			spans = append(spans, held{b, info.Arena, info.Arena + info.Numel*info.ElemBytes})
		}
	}
	if len(spans) < 2 {
		return nil
	}
	users := make([]taskSet, len(g.Buffers))
	for _, t := range g.Tasks {
		for _, set := range [2][]tgraph.Access{t.Reads, t.Writes} {
			for _, a := range set {
				if g.Buffers[a.Buf].InArena {
					users[a.Buf].add(t)
				}
			}
		}
	}
	slices.SortFunc(spans, func(x, y held) int { return cmp.Compare(x.lo, y.lo) })
	var active []held
	for _, s := range spans {
		active = slices.DeleteFunc(active, func(a held) bool { return a.hi <= s.lo })
		for _, a := range active {
			if c.allBefore(&users[a.buf], &users[s.buf]) || c.allBefore(&users[s.buf], &users[a.buf]) {
				continue
			}
			return fail("shared-arena", nil, nil, "bufs %s and %s share arena bytes [%d, %d), but their tasks are not ordered one buffer's before the other's by events",
				g.Buffers[a.buf].Name, g.Buffers[s.buf].Name, max(a.lo, s.lo), min(a.hi, s.hi))
		}
		active = append(active, s)
	}
	return nil
}

// taskSet is the tasks accessing one buffer: a bitset over the words of task
// ids they span (checked against an ancestor set a word at a time), and the
// events they wait on.
type taskSet struct {
	first  int
	words  bitset
	waits  []int
	noWait bool // one of them waits on nothing
}

func (s *taskSet) add(t *tgraph.Task) {
	w := t.ID >> 6
	switch {
	case s.words == nil:
		s.first, s.words = w, bitset{0}
	case w < s.first:
		s.words, s.first = append(make(bitset, s.first-w), s.words...), w
	case w >= s.first+len(s.words):
		s.words = append(s.words, make(bitset, w-s.first-len(s.words)+1)...)
	}
	s.words[w-s.first] |= 1 << (uint(t.ID) & 63)
	if t.Wait == tgraph.None {
		s.noWait = true
	} else if !slices.Contains(s.waits, t.Wait) {
		s.waits = append(s.waits, t.Wait)
	}
}

// allBefore reports whether every task of as happens-before every task of bs.
func (c *checker) allBefore(as, bs *taskSet) bool {
	if as.words == nil {
		return true
	}
	if bs.noWait {
		return false
	}
	for _, w := range bs.waits {
		anc := c.anc[w][as.first:]
		for i, x := range as.words {
			if anc[i]&x != x {
				return false
			}
		}
	}
	return true
}

func (c *checker) outputs() *Error {
	g := c.g
	cover := make([][]tgraph.Interval, len(g.Buffers))
	for _, t := range g.Tasks {
		for _, a := range t.Writes {
			if g.Buffers[a.Buf].Output {
				cover[a.Buf] = append(cover[a.Buf], a.Ivs...)
			}
		}
	}
	for b, info := range g.Buffers {
		if !info.Output || info.Numel == 0 {
			continue
		}
		ivs := tgraph.NormalizeIntervals(cover[b])
		gap := tgraph.Interval{Lo: 0, Hi: info.Numel}
		switch {
		case len(ivs) == 0:
		case ivs[0].Lo > 0:
			gap.Hi = ivs[0].Lo
		case ivs[0].Hi < info.Numel:
			gap.Lo = ivs[0].Hi
			if len(ivs) > 1 {
				gap.Hi = ivs[1].Lo
			}
		default:
			continue
		}
		return fail("output", nil, nil, "no task writes elements [%d, %d) of output buf %s (%d elements)", gap.Lo, gap.Hi, info.Name, info.Numel)
	}
	return nil
}

type bitset []uint64

func (b bitset) set(i int)      { b[i>>6] |= 1 << (uint(i) & 63) }
func (b bitset) has(i int) bool { return b[i>>6]&(1<<(uint(i)&63)) != 0 }
func (b bitset) or(o bitset) {
	for i, w := range o {
		b[i] |= w
	}
}
