package tgraph

import (
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
)

func ivs(pairs ...int64) []Interval {
	var out []Interval
	for i := 0; i < len(pairs); i += 2 {
		out = append(out, Interval{Lo: pairs[i], Hi: pairs[i+1]})
	}
	return out
}

func TestOverlaps(t *testing.T) {
	cases := []struct {
		a, b []Interval
		want bool
	}{
		{nil, ivs(0, 4), false},
		{ivs(0, 4), ivs(4, 8), false},
		{ivs(0, 4), ivs(3, 8), true},
		{ivs(0, 1, 4, 5), ivs(1, 4), false},
		{ivs(0, 1, 4, 5), ivs(1, 4, 6, 7), false},
		{ivs(0, 1, 4, 6), ivs(1, 4, 5, 9), true},
		{ivs(2, 3), ivs(0, 10), true},
		{ivs(0, 10), ivs(2, 3), true},
		{ivs(0, 2, 8, 10), ivs(3, 5, 9, 12), true},
	}
	for _, c := range cases {
		if got := Overlaps(c.a, c.b); got != c.want {
			t.Errorf("Overlaps(%v, %v) = %v, want %v", c.a, c.b, got, c.want)
		}
		if got := Overlaps(c.b, c.a); got != c.want {
			t.Errorf("Overlaps(%v, %v) = %v, want %v (not symmetric)", c.b, c.a, got, c.want)
		}
	}
}

func TestNormalizeIntervals(t *testing.T) {
	cases := []struct {
		in, want []Interval
	}{
		{nil, nil},
		{ivs(4, 8, 0, 2), ivs(0, 2, 4, 8)},
		{ivs(0, 2, 2, 4), ivs(0, 4)},
		{ivs(0, 5, 1, 3), ivs(0, 5)},
		{ivs(3, 3, 5, 4, 0, 1), ivs(0, 1)},
		{ivs(6, 9, 0, 4, 3, 7), ivs(0, 9)},
		{ivs(0, 1, 2, 3), ivs(0, 1, 2, 3)},
	}
	for _, c := range cases {
		in := append([]Interval(nil), c.in...)
		got := NormalizeIntervals(in)
		if len(got) == 0 && len(c.want) == 0 {
			continue
		}
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("NormalizeIntervals(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}

// tasks makes a graph of n tasks of op i (one task per op), no events yet.
func tasks(n, workers int) *Graph {
	g := &Graph{Workers: workers}
	for i := 0; i < n; i++ {
		g.Tasks = append(g.Tasks, &Task{ID: i, Op: i, Wait: None, Trigger: None, Order: i})
		g.OpNames = append(g.OpNames, "op")
	}
	return g
}

func TestFuseEvents(t *testing.T) {
	g := tasks(6, 1)
	preds := [][]int{nil, nil, {0, 1}, {1, 0}, {1}, {0, 1, 4}}
	f := FuseEvents(g, preds)
	if want := []int{None, None, 0, 0, 1, 2}; !reflect.DeepEqual(f.Wait, want) {
		t.Errorf("Wait = %v, want %v (equal predecessor sets share an event)", f.Wait, want)
	}
	if want := []int{2, 1, 3}; !reflect.DeepEqual(f.Needed, want) {
		t.Errorf("Needed = %v, want %v (|preds| of each event)", f.Needed, want)
	}
	want := [][]int{{0, 2}, {0, 1, 2}, nil, nil, {2}, nil}
	if !reflect.DeepEqual(f.Triggers, want) {
		t.Errorf("Triggers = %v, want %v", f.Triggers, want)
	}
	// Every event's Needed equals the number of tasks that trigger it.
	count := make([]int, len(f.Needed))
	for _, ts := range f.Triggers {
		for _, e := range ts {
			count[e]++
		}
	}
	if !reflect.DeepEqual(count, f.Needed) {
		t.Errorf("triggers per event %v, Needed %v", count, f.Needed)
	}
}

func TestNormalize(t *testing.T) {
	g := tasks(5, 1)
	g.Tasks[1].Order = 7
	preds := [][]int{nil, nil, {0, 1}, {1}, {3, 1}}
	f := FuseEvents(g, preds)
	Normalize(g, f)
	// Task 1 triggers events 0, 1 and 2: it gets a hub event and three relays.
	if len(g.Tasks) != 8 || len(g.Events) != 4 {
		t.Fatalf("%d tasks, %d events; want 8 and 4", len(g.Tasks), len(g.Events))
	}
	hub := g.Events[3]
	if hub.Needed != 1 || g.Tasks[1].Trigger != hub.ID {
		t.Errorf("task 1 triggers %d, hub %+v; want the hub with Needed 1", g.Tasks[1].Trigger, hub)
	}
	var relayed []int
	for _, r := range g.Tasks[5:] {
		if r.Op != -1 || r.Wait != hub.ID || r.Order != 7 || r.Box.Lo != nil || r.Reads != nil || r.Writes != nil {
			t.Errorf("relay %+v: want an empty task waiting on the hub with order 7", r)
		}
		relayed = append(relayed, r.Trigger)
	}
	if !reflect.DeepEqual(relayed, []int{0, 1, 2}) {
		t.Errorf("relays trigger %v, want [0 1 2]", relayed)
	}
	for _, tk := range g.Tasks {
		if tk.Trigger == None {
			continue
		}
		n := 0
		for _, u := range g.Tasks {
			if u.Trigger == tk.Trigger {
				n++
			}
		}
		if n != g.Events[tk.Trigger].Needed {
			t.Errorf("event %d has %d producers, Needed %d", tk.Trigger, n, g.Events[tk.Trigger].Needed)
		}
	}
	if g.Tasks[0].Trigger != 0 || g.Tasks[3].Trigger != 2 {
		t.Errorf("tasks 0 and 3 trigger %d and %d, want 0 and 2 directly", g.Tasks[0].Trigger, g.Tasks[3].Trigger)
	}
	if w := []int{None, None, 0, 1, 2}; g.Tasks[2].Wait != w[2] || g.Tasks[3].Wait != w[3] || g.Tasks[4].Wait != w[4] {
		t.Errorf("waits %d %d %d, want 0 1 2", g.Tasks[2].Wait, g.Tasks[3].Wait, g.Tasks[4].Wait)
	}
}

// checkLinear verifies Linearize's contract: ids are positions, the waiters
// of each event are exactly [First, Last), and every producer of an event
// comes before its first waiter.
func checkLinear(t *testing.T, g *Graph) {
	t.Helper()
	for i, tk := range g.Tasks {
		if tk.ID != i {
			t.Errorf("task at %d has id %d", i, tk.ID)
		}
	}
	cons, prods := g.Consumers(), g.Producers()
	for e, ev := range g.Events {
		var want []int
		for i := ev.First; i < ev.Last; i++ {
			want = append(want, i)
		}
		got := append([]int(nil), cons[e]...)
		sort.Ints(got)
		if !reflect.DeepEqual(got, want) {
			t.Errorf("event %d: waiters %v, range [%d, %d)", e, got, ev.First, ev.Last)
		}
		for _, p := range prods[e] {
			if p >= ev.First {
				t.Errorf("event %d: producer %d at or after its first waiter %d", e, p, ev.First)
			}
		}
	}
}

func TestLinearize(t *testing.T) {
	// A diamond with shared predecessor sets and a fan-out that needs relays.
	g := tasks(7, 2)
	preds := [][]int{nil, nil, {0}, {0, 1}, {1, 0}, {2, 3}, {0}}
	Normalize(g, FuseEvents(g, preds))
	n := len(g.Tasks)
	if err := Linearize(g); err != nil {
		t.Fatal(err)
	}
	if len(g.Tasks) != n {
		t.Fatalf("%d tasks after linearize, want %d", len(g.Tasks), n)
	}
	checkLinear(t, g)
	ops := map[int]bool{}
	for _, tk := range g.Tasks {
		if tk.Op >= 0 {
			ops[tk.Op] = true
		}
	}
	if len(ops) != 7 {
		t.Errorf("ops %v after renumbering, want all 7", ops)
	}

	// linearOrders linearizes tasks with these program orders and
	// predecessors and returns the orders in the linear order.
	linearOrders := func(t *testing.T, orders []int, preds [][]int) []int {
		g := tasks(len(orders), 1)
		for i, o := range orders {
			g.Tasks[i].Order = o
		}
		Normalize(g, FuseEvents(g, preds))
		if err := Linearize(g); err != nil {
			t.Fatal(err)
		}
		checkLinear(t, g)
		var got []int
		for _, tk := range g.Tasks {
			got = append(got, tk.Order)
		}
		return got
	}
	t.Run("program order among fired events", func(t *testing.T) {
		// Task 0 (the embedding) feeds tasks 2 and 3 (the first Linears,
		// later in the program); task 1 feeds task 4 (RoPE's tables, earlier
		// in the program). Both events fire at once: task 4 must come first.
		got := linearOrders(t, []int{0, 1, 11, 12, 6}, [][]int{nil, nil, {0}, {0}, {1}})
		if want := []int{0, 1, 6, 11, 12}; !reflect.DeepEqual(got, want) {
			t.Errorf("tasks in program order %v, want %v", got, want)
		}
	})
	t.Run("levels before program order", func(t *testing.T) {
		// A deeper chain (1 -> 3 -> 4) earlier in the program does not jump
		// ahead of a shallower task later in it (2, a per-layer table that
		// only needs the preamble): levels keep the BFS shape.
		got := linearOrders(t, []int{0, 1, 10, 2, 3}, [][]int{nil, nil, {0}, {1}, {3}})
		if want := []int{0, 1, 2, 10, 3}; !reflect.DeepEqual(got, want) {
			t.Errorf("tasks in order %v, want %v", got, want)
		}
	})
	t.Run("an event's sinks after its chain", func(t *testing.T) {
		// Tasks 1-4 wait on task 0; 1 and 2 (a layer's cache writes, first
		// in the program) trigger nothing, 3 and 4 (the attention) feed
		// task 5. The chain's waiters take the event's first places, so
		// round-robin gives them workers first.
		got := linearOrders(t, []int{0, 1, 2, 3, 4, 5}, [][]int{nil, {0}, {0}, {0}, {0}, {3, 4}})
		if want := []int{0, 3, 4, 1, 2, 5}; !reflect.DeepEqual(got, want) {
			t.Errorf("tasks in order %v, want %v", got, want)
		}
	})
	t.Run("event without producers", func(t *testing.T) {
		g := tasks(2, 1)
		g.Events = []*Event{{ID: 0, Needed: 1}}
		g.Tasks[1].Wait = 0
		err := Linearize(g)
		if err == nil || !strings.Contains(err.Error(), "1 of 2 tasks are unreachable") {
			t.Errorf("err %v, want 1 of 2 unreachable", err)
		}
	})
	t.Run("cycle", func(t *testing.T) {
		g := tasks(3, 1)
		g.Events = []*Event{{ID: 0, Needed: 1}, {ID: 1, Needed: 1}}
		g.Tasks[1].Wait, g.Tasks[1].Trigger = 0, 1
		g.Tasks[2].Wait, g.Tasks[2].Trigger = 1, 0
		err := Linearize(g)
		if err == nil || !strings.Contains(err.Error(), "2 of 3 tasks are unreachable") {
			t.Errorf("err %v, want 2 of 3 unreachable", err)
		}
	})
}

func TestSchedule(t *testing.T) {
	cases := []struct {
		tasks, workers int
		want           [][]int
	}{
		{7, 3, [][]int{{0, 3, 6}, {1, 4}, {2, 5}}},
		{2, 4, [][]int{{0}, {1}, nil, nil}},
		{3, 1, [][]int{{0, 1, 2}}},
	}
	for _, c := range cases {
		g := tasks(c.tasks, c.workers)
		Schedule(g, false)
		if !reflect.DeepEqual(g.Queues, c.want) {
			t.Errorf("%d tasks on %d workers: queues %v, want %v", c.tasks, c.workers, g.Queues, c.want)
		}
		for _, tk := range g.Tasks {
			if tk.Worker != tk.ID%c.workers {
				t.Errorf("task %d on worker %d", tk.ID, tk.Worker)
			}
		}
	}
	// On a linearized graph every queue is increasing: a linear extension.
	g := tasks(9, 4)
	Normalize(g, FuseEvents(g, [][]int{nil, {0}, {0}, {1, 2}, {3}, {3}, {4, 5}, {0}, {6, 7}}))
	if err := Linearize(g); err != nil {
		t.Fatal(err)
	}
	Schedule(g, false)
	total := 0
	for w, q := range g.Queues {
		total += len(q)
		if !sort.IntsAreSorted(q) {
			t.Errorf("queue %d = %v is not in linearized order", w, q)
		}
	}
	if total != len(g.Tasks) {
		t.Errorf("queues hold %d tasks, want %d", total, len(g.Tasks))
	}
}

func TestGraphNameAndText(t *testing.T) {
	g := &Graph{Workers: 2, OpNames: []string{"linear#0 (mm)"}}
	g.Tasks = []*Task{
		{ID: 0, Op: 0, Box: Box{Lo: []int64{0, 0}, Hi: []int64{1, 8}}},
		{ID: 1, Op: -1},
		{ID: 2, Op: 5},
	}
	cases := map[int]string{
		0:  "task 0 (linear#0 (mm) [0 0]-[1 8])",
		1:  "task 1 (empty)",
		2:  "task 2 (op 5)",
		7:  "task 7 (out of range)",
		-1: "task -1 (out of range)",
	}
	for id, want := range cases {
		if got := g.Name(id); got != want {
			t.Errorf("Name(%d) = %q, want %q", id, got, want)
		}
	}
}

// A task that alone waits on producers of one worker joins that worker, and
// its wait is local; a wait shared with another task, or on producers of
// several workers, stays where round-robin puts it.
func TestScheduleLocalWaits(t *testing.T) {
	// 0 and 1 start; 2 alone waits on 1; 3 and 4 both wait on 0; 5 waits on {0, 1}.
	g := tasks(6, 3)
	Normalize(g, FuseEvents(g, [][]int{nil, nil, {1}, {0}, {0}, {0, 1}}))
	if err := Linearize(g); err != nil {
		t.Fatal(err)
	}
	Schedule(g, false)
	byOp := map[int]*Task{}
	for _, tk := range g.Tasks {
		byOp[tk.Op] = tk
	}
	if byOp[2].Worker != byOp[1].Worker {
		t.Errorf("task of op 2 on worker %d, its sole producer on %d", byOp[2].Worker, byOp[1].Worker)
	}
	local := LocalWaits(g)
	if !local[byOp[2].ID] {
		t.Errorf("op 2's wait is not local")
	}
	if byOp[0].Worker == byOp[1].Worker || local[byOp[5].ID] {
		t.Errorf("op 5 waits on two workers' tasks (%d, %d) but its wait is local", byOp[0].Worker, byOp[1].Worker)
	}
	producers := g.Producers()
	for _, op := range []int{3, 4} { // their event (through op 0's relay) has two waiters
		tk := byOp[op]
		p := g.Tasks[producers[tk.Wait][0]]
		if local[tk.ID] != (tk.Worker == p.Worker) {
			t.Errorf("op %d on worker %d (producer on %d): local %v", op, tk.Worker, p.Worker, local[tk.ID])
		}
	}
	for w, q := range g.Queues {
		if !sort.IntsAreSorted(q) {
			t.Errorf("queue %d = %v is not in linearized order", w, q)
		}
	}
	// A producer after its waiter in the queue makes the wait not local.
	q := g.Queues[byOp[2].Worker]
	slices.Reverse(q)
	if LocalWaits(g)[byOp[2].ID] {
		t.Errorf("op 2's wait is local with its producer after it in queue %v", q)
	}
}

// TestScheduleTimed: three tasks on two workers, the first 100 ns long and
// the others 10; then a task waiting on the third, which follows it to its
// worker either way (its wait is then local). Round-robin deals the third
// behind the long task; timed, it goes to the worker free at 10.
func TestScheduleTimed(t *testing.T) {
	for timed, want := range map[bool][][]int{false: {{0, 2, 3}, {1}}, true: {{0}, {1, 2, 3}}} {
		g := tasks(4, 2)
		for i, d := range []int64{100, 10, 10, 10} {
			g.Tasks[i].Time, g.Tasks[i].Timed = d, true
		}
		Normalize(g, FuseEvents(g, [][]int{nil, nil, nil, {2}}))
		if err := Linearize(g); err != nil {
			t.Fatal(err)
		}
		Schedule(g, timed)
		if !reflect.DeepEqual(g.Queues, want) {
			t.Errorf("timed %v: queues %v, want %v", timed, g.Queues, want)
		}
	}
}
