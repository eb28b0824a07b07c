package tgraph

import (
	"container/heap"
	"fmt"
	"math"
	"slices"
	"sort"
)

// Fused is the event structure after event fusion and before normalization:
// each task waits on at most one event but may still trigger several.
type Fused struct {
	Wait     []int   // per task
	Triggers [][]int // per task
	Needed   []int   // per event
}

// FuseEvents builds events from task dependencies the way MPK's event fusion
// does. Start from one event per dependency edge; successor-set fusion merges
// the events that gate the same consumer (one event per consumer, fed by all
// its predecessors), and predecessor-set fusion then merges events fed by the
// same producers (one event per distinct predecessor set).
func FuseEvents(g *Graph, preds [][]int) *Fused {
	f := &Fused{Wait: make([]int, len(g.Tasks)), Triggers: make([][]int, len(g.Tasks))}
	byHash := map[uint64][]int{} // hash of a predecessor set → events with it
	var sets [][]int             // predecessor set of each event
	for _, t := range g.Tasks {
		f.Wait[t.ID] = None
		ps := preds[t.ID]
		if len(ps) == 0 {
			continue
		}
		sorted := append([]int(nil), ps...)
		sort.Ints(sorted)
		h := uint64(14695981039346656037)
		for _, p := range sorted {
			h = (h ^ uint64(p)) * 1099511628211
		}
		e := -1
		for _, cand := range byHash[h] {
			if slices.Equal(sets[cand], sorted) {
				e = cand
				break
			}
		}
		if e < 0 {
			e = len(f.Needed)
			byHash[h] = append(byHash[h], e)
			sets = append(sets, sorted)
			f.Needed = append(f.Needed, len(sorted))
			for _, p := range sorted {
				f.Triggers[p] = append(f.Triggers[p], e)
			}
		}
		f.Wait[t.ID] = e
	}
	return f
}

// Normalize gives every task at most one triggered event: a task triggering
// k > 1 events triggers one new event instead, which k empty relay tasks wait
// on, each triggering one of the original events (MPK's fan-out rule).
func Normalize(g *Graph, f *Fused) {
	g.Events = g.Events[:0]
	for e, n := range f.Needed {
		g.Events = append(g.Events, &Event{ID: e, Needed: n})
	}
	n := len(g.Tasks)
	for id := 0; id < n; id++ {
		t := g.Tasks[id]
		t.Wait = f.Wait[id]
		trig := f.Triggers[id]
		switch len(trig) {
		case 0:
			t.Trigger = None
		case 1:
			t.Trigger = trig[0]
		default:
			hub := &Event{ID: len(g.Events), Needed: 1}
			g.Events = append(g.Events, hub)
			t.Trigger = hub.ID
			for _, e := range trig {
				relay := &Task{ID: len(g.Tasks), Op: -1, Wait: hub.ID, Trigger: e, Order: t.Order}
				g.Tasks = append(g.Tasks, relay)
			}
		}
	}
}

// Linearize renumbers tasks in an order over events (MPK's Algorithm 1) so
// the tasks waiting on each event form the contiguous range [First, Last).
// Fired events are taken level by level (an event's level is one more than
// the deepest level its producers waited on, as in a BFS), and within a level
// the one whose consumers come first in program order (Task.Order) goes
// first, not the one that fired first: workers run their queues in this
// order, and a small op of the preamble (RoPE's cos and sin) queued behind
// the first layer's Linears waited for the embedding they wait on, holding
// back the first attention.
func Linearize(g *Graph) error {
	consumers := g.Consumers()
	producers := g.Producers()
	var order []int
	fired := make([]int, len(g.Events))
	level := make([]int, len(g.Events))
	firstOrder := make([]int, len(g.Events))
	for e, cs := range consumers {
		firstOrder[e] = math.MaxInt
		for _, t := range cs {
			firstOrder[e] = min(firstOrder[e], g.Tasks[t].Order)
		}
	}
	queue := &eventHeap{level: level, order: firstOrder}
	emit := func(t int) {
		order = append(order, t)
		if e := g.Tasks[t].Trigger; e != None {
			below := 0
			if w := g.Tasks[t].Wait; w != None {
				below = level[w]
			}
			level[e] = max(level[e], below+1)
			fired[e]++
			if fired[e] == len(producers[e]) {
				heap.Push(queue, e)
			}
		}
	}
	for _, t := range g.Tasks {
		if t.Wait == None {
			emit(t.ID)
		}
	}
	first := make([]int, len(g.Events))
	last := make([]int, len(g.Events))
	for queue.Len() > 0 {
		e := heap.Pop(queue).(int)
		first[e] = len(order)
		for _, t := range sinksLast(g, consumers[e]) {
			emit(t)
		}
		last[e] = len(order)
	}
	if len(order) != len(g.Tasks) {
		return fmt.Errorf("linearize: %d of %d tasks are unreachable (a dependency cycle or an event without producers)", len(g.Tasks)-len(order), len(g.Tasks))
	}
	newID := make([]int, len(g.Tasks))
	tasks := make([]*Task, len(g.Tasks))
	for i, old := range order {
		newID[old] = i
		tasks[i] = g.Tasks[old]
		tasks[i].ID = i
	}
	g.Tasks = tasks
	for e, ev := range g.Events {
		ev.First, ev.Last = first[e], last[e]
	}
	return nil
}

// sinksLast orders an event's waiters so that those triggering nothing
// (nothing in the step waits on them: a decode layer's KV-cache writes, which
// the attention beside them does not read) come after the others. Schedule
// deals workers round-robin in this order, so the step's chain takes the
// workers first and a worker given a sink runs it after its chain task, in
// the stage's slack: in program order the cache writes came first, and 13 of
// llama-3.2-1b's 128 batch-8 attention tasks waited behind 17 writes of 3-11
// us, which doubled the stage (bench/NOTES.md, fiftieth session).
func sinksLast(g *Graph, ts []int) []int {
	out := make([]int, 0, len(ts))
	for _, sink := range []bool{false, true} {
		for _, t := range ts {
			if (g.Tasks[t].Trigger == None) == sink {
				out = append(out, t)
			}
		}
	}
	return out
}

// Schedule assigns tasks to workers round-robin in linearized order and
// writes each worker's static queue. Any per-worker order that follows the
// linearization is deadlock-free: the earliest unfinished task is always
// ready and at the head of its worker's queue, whatever worker each task has.
// So a task that alone waits on an event whose producers all sit on one
// worker (the up projection's rows waiting on the same rows of gate) joins
// them there: its wait is then local (LocalWaits), and costs no hop through
// global memory. Tasks of one affinity key (Task.Affinity: blocks of rows of
// a long prompt chunk's Linear that read the same weight rows) share one
// worker, which runs them one after another: the rows come from HBM once and
// from L2 after, where round-robin workers read them at different times (a
// 512-token chunk in blocks of 64 rows read every weight 8 times). The keys
// of one row range (Task.Rows) go to different workers.
//
// Timed (each Task.Time estimated), a task marked Timed goes to the worker
// that can start it first by the estimates (list scheduling; ties to the
// round-robin one): round-robin deals the next op's tasks to workers still
// busy with a stage's short last round while others idle (a 64-token
// chunk's K slices of qwen3-8b's down projection, behind the 60 tasks past
// the gate/up pair's first 132).
func Schedule(g *Graph, timed bool) {
	g.Queues = make([][]int, g.Workers)
	consumers := g.Consumers()
	producers := g.Producers()
	members := map[int]int64{} // affinity key → its tasks' cost
	for _, t := range g.Tasks {
		if t.Affinity > 0 {
			members[t.Affinity] += max(1, t.Cost)
		}
	}
	home := map[int]int{}             // affinity key → worker
	keyed := make([]int64, g.Workers) // the cost of keyed tasks a worker has or will have
	taken := map[int][]int{}          // weight rows (Task.Rows) → the workers its keys have
	clock := newClock(g)
	for i, t := range g.Tasks {
		t.Worker = i % g.Workers
		joins := t.Wait != None && len(consumers[t.Wait]) == 1 // the event's only waiter
		sole := -1
		if joins {
			sole = soleWorker(g, producers[t.Wait], t.ID)
		}
		switch {
		case sole >= 0:
			t.Worker = sole
		case timed && t.Timed && t.Affinity == 0:
			t.Worker = clock.earliest(t, t.Worker)
		case !joins && t.Affinity > 0:
			w, ok := home[t.Affinity]
			if !ok {
				w = lightest(keyed, t.Worker, taken[t.Rows])
				home[t.Affinity] = w
				keyed[w] += members[t.Affinity]
				if t.Rows > 0 {
					taken[t.Rows] = append(taken[t.Rows], w)
				}
			}
			t.Worker = w
		}
		g.Queues[t.Worker] = append(g.Queues[t.Worker], t.ID)
		clock.run(t)
	}
}

// HopNs is the estimated time from an event's last trigger to a waiter on
// another worker starting (its counter read through global memory: ~1.5 us
// between a prompt chunk's stages on the H200, bench/NOTES.md).
const HopNs = 1500

// clock replays a schedule by the tasks' estimated times: when each worker
// is free, when each event's last trigger ends, and which worker triggered
// it (a waiter there starts without the hop).
type clock struct {
	free  []int64
	ready []int64
	home  []int // the worker of every trigger so far; -1: none yet, -2: several
}

func newClock(g *Graph) *clock {
	c := &clock{free: make([]int64, g.Workers), ready: make([]int64, len(g.Events)), home: make([]int, len(g.Events))}
	for e := range c.home {
		c.home[e] = -1
	}
	return c
}

// startOn is when t could start on worker w. Every trigger of its event
// comes before it in the linearization, so ready holds the last one's end.
func (c *clock) startOn(t *Task, w int) int64 {
	if t.Wait == None {
		return c.free[w]
	}
	r := c.ready[t.Wait]
	if c.home[t.Wait] != w {
		r += HopNs
	}
	return max(c.free[w], r)
}

// earliest is the worker that can start t first, searched from `from` on
// so that ties keep the round-robin order.
func (c *clock) earliest(t *Task, from int) int {
	best, at := from, c.startOn(t, from)
	for k := 1; k < len(c.free); k++ {
		w := (from + k) % len(c.free)
		if s := c.startOn(t, w); s < at {
			best, at = w, s
		}
	}
	return best
}

// run places t on its worker's clock and records its trigger.
func (c *clock) run(t *Task) {
	end := c.startOn(t, t.Worker) + max(t.Time, 1)
	c.free[t.Worker] = end
	if e := t.Trigger; e != None {
		c.ready[e] = max(c.ready[e], end)
		switch c.home[e] {
		case -1:
			c.home[e] = t.Worker
		case t.Worker:
		default:
			c.home[e] = -2
		}
	}
}

// lightest is the worker with the least keyed cost, searched from `from`
// on so that ties keep the round-robin order. Keyed tasks (the blocks of a
// prompt chunk's Linears) are most of such a step's work: where a Linear has
// fewer tasks than there are workers, homing each key on its first task's
// round-robin worker piled all its blocks onto those few (25 against 10
// Linear tasks a worker, a 320-token chunk on 132 workers).
// Workers in avoid (homes of keys of the same weight rows) are taken only
// when every worker is.
func lightest(keyed []int64, from int, avoid []int) int {
	best := -1
	for k := range len(keyed) {
		w := (from + k) % len(keyed)
		if !slices.Contains(avoid, w) && (best < 0 || keyed[w] < keyed[best]) {
			best = w
		}
	}
	if best < 0 {
		return lightest(keyed, from, nil)
	}
	return best
}

// soleWorker is the worker every task of ts sits on, or -1; each must come
// before task `before` in the linearization (so it was scheduled already).
func soleWorker(g *Graph, ts []int, before int) int {
	w := -1
	for _, p := range ts {
		if p >= before || w >= 0 && g.Tasks[p].Worker != w {
			return -1
		}
		w = g.Tasks[p].Worker
	}
	return w
}

// LocalWaits says, per task of a scheduled graph, whether its wait is local:
// every producer of the event it waits on sits on its own worker, earlier in
// that worker's queue.
// The runtime runs a worker's tasks one after another, a barrier of its
// consumer threads between them, so such a task's inputs are complete and
// visible when it starts: codegen drops its wait (and a trigger only local
// waiters wait on), and the task starts without a round trip through the
// event counter. The validator still checks the graph with every event.
func LocalWaits(g *Graph) []bool {
	local := make([]bool, len(g.Tasks))
	pos := make([]int, len(g.Tasks)) // place in its worker's queue
	for _, q := range g.Queues {
		for i, t := range q {
			pos[t] = i
		}
	}
	producers := g.Producers()
	for _, t := range g.Tasks {
		if t.Wait == None || len(producers[t.Wait]) == 0 {
			continue
		}
		local[t.ID] = true
		for _, p := range producers[t.Wait] {
			if g.Tasks[p].Worker != t.Worker || pos[p] >= pos[t.ID] {
				local[t.ID] = false
				break
			}
		}
	}
	return local
}

// eventHeap holds fired events: lowest level, then first in program order,
// then lowest id first.
type eventHeap struct {
	ids          []int
	level, order []int
}

func (h *eventHeap) Len() int { return len(h.ids) }
func (h *eventHeap) Less(i, j int) bool {
	a, b := h.ids[i], h.ids[j]
	if h.level[a] != h.level[b] {
		return h.level[a] < h.level[b]
	}
	return h.order[a] < h.order[b] || h.order[a] == h.order[b] && a < b
}
func (h *eventHeap) Swap(i, j int) { h.ids[i], h.ids[j] = h.ids[j], h.ids[i] }
func (h *eventHeap) Push(x any)    { h.ids = append(h.ids, x.(int)) }
func (h *eventHeap) Pop() any {
	x := h.ids[len(h.ids)-1]
	h.ids = h.ids[:len(h.ids)-1]
	return x
}

// RuntimeEvents is each task's wait and trigger as the runtime sees them
// (codegen's task table): a local wait (LocalWaits) is dropped, and so is a
// trigger that only local waits wait on.
func RuntimeEvents(tg *Graph) (wait, trigger []int) {
	local := LocalWaits(tg)
	remote := make([]bool, len(tg.Events)) // some waiter of the event is not local
	for _, t := range tg.Tasks {
		if t.Wait != None && !local[t.ID] {
			remote[t.Wait] = true
		}
	}
	wait, trigger = make([]int, len(tg.Tasks)), make([]int, len(tg.Tasks))
	for _, t := range tg.Tasks {
		wait[t.ID], trigger[t.ID] = t.Wait, t.Trigger
		if local[t.ID] {
			wait[t.ID] = None
		}
		if t.Trigger != None && !remote[t.Trigger] {
			trigger[t.ID] = None
		}
	}
	return wait, trigger
}
