package tgraph

import (
	"fmt"
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

// Linearize renumbers tasks in BFS order over events (MPK's Algorithm 1) so
// the tasks waiting on each event form the contiguous range [First, Last).
func Linearize(g *Graph) error {
	consumers := g.Consumers()
	producers := g.Producers()
	var order []int
	fired := make([]int, len(g.Events))
	var queue []int
	emit := func(t int) {
		order = append(order, t)
		if e := g.Tasks[t].Trigger; e != None {
			fired[e]++
			if fired[e] == len(producers[e]) {
				queue = append(queue, e)
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
	for len(queue) > 0 {
		e := queue[0]
		queue = queue[1:]
		first[e] = len(order)
		for _, t := range consumers[e] {
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

// Schedule assigns tasks to workers round-robin in linearized order and
// writes each worker's static queue. Any per-worker order that follows the
// linearization is deadlock-free: the earliest unfinished task is always
// ready and at the head of its worker's queue.
func Schedule(g *Graph) {
	g.Queues = make([][]int, g.Workers)
	for i, t := range g.Tasks {
		t.Worker = i % g.Workers
		g.Queues[t.Worker] = append(g.Queues[t.Worker], t.ID)
	}
}
