// Package safety is the adversarial schedule suite of issue 4: a generator of
// task graphs with one injected fault each, an independent oracle that runs
// them on the CPU, and a suite that counts how often the static validator
// (package validate) accepts a graph the oracle found unsafe.
//
// The oracle never calls the validator. It executes the counter semantics
// (a task waits until its event has been triggered Needed times, runs, then
// triggers its event) under many seeded adversarial interleavings, in two
// modes: the ahead-of-time queues (each worker runs its queue in order) and
// dataflow dispatch (an event that fires launches the tasks [First, Last), as
// the just-in-time scheduler would; tasks without a wait start at once). It
// reports a hang (no progress before every task ran), a task that runs twice or
// never, and memory races found with a shadow memory at interval granularity:
// every read must see, element by element, the version the sequential program
// (tasks in Order, each op reading before it writes) would show it, and writes
// to one element must land in Order.
package safety

import (
	"fmt"
	"math/rand"
	"sort"

	"mpk/gocore/tgraph"
)

// Verdict is the oracle's label of one graph.
type Verdict struct {
	Unsafe bool
	Reason string // why it is unsafe; "" when safe
}

// OracleOptions sets how hard the oracle looks.
type OracleOptions struct {
	Runs int   // interleavings per mode (default 16)
	Seed int64 // seeds the interleavings
	// Suspects are tasks the adversary delays first (a hint from whoever
	// built the graph; the oracle is sound without it, only slower to find).
	Suspects []int
}

// Oracle labels g by running it; see the package comment.
func Oracle(g *tgraph.Graph, opt OracleOptions) Verdict {
	if opt.Runs <= 0 {
		opt.Runs = 16
	}
	if r := malformed(g); r != "" {
		return Verdict{true, "malformed: " + r}
	}
	o := newOracle(g)
	rng := rand.New(rand.NewSource(opt.Seed))
	writers := o.writers()
	for mode := range 2 {
		for run := range opt.Runs {
			adv := adversary{kind: run % 4, rng: rng}
			switch {
			case run < len(opt.Suspects):
				adv.kind, adv.target = 2, opt.Suspects[run]
			case adv.kind == 2 && len(writers) > 0:
				adv.target = writers[rng.Intn(len(writers))]
			case adv.kind == 2:
				adv.target = rng.Intn(len(g.Tasks) + 1)
			case adv.kind == 3:
				adv.delayed = make([]bool, len(g.Tasks))
				for i := range adv.delayed {
					adv.delayed[i] = rng.Intn(2) == 0
				}
			}
			var r string
			if mode == 0 {
				r = o.runQueues(&adv)
			} else {
				r = o.runDataflow(&adv)
			}
			if r != "" {
				return Verdict{true, fmt.Sprintf("%s (%s run %d)", r, [2]string{"queues", "dataflow"}[mode], run)}
			}
		}
	}
	return Verdict{}
}

// malformed is the oracle's own bounds check: what the runtime tables could
// not hold or would index out of range.
func malformed(g *tgraph.Graph) string {
	nt, ne := len(g.Tasks), len(g.Events)
	if nt > tgraph.MaxTasks || ne > tgraph.MaxEvents || g.Workers < 1 || g.Workers > tgraph.MaxWorkers {
		return fmt.Sprintf("%d tasks, %d events, %d workers exceed the runtime tables", nt, ne, g.Workers)
	}
	if len(g.Queues) != g.Workers {
		return fmt.Sprintf("%d queues for %d workers", len(g.Queues), g.Workers)
	}
	inEv := func(e int) bool { return e == tgraph.None || (e >= 0 && e < ne) }
	for i, t := range g.Tasks {
		if t == nil || t.ID != i || !inEv(t.Wait) || !inEv(t.Trigger) || t.Worker < 0 || t.Worker >= g.Workers {
			return fmt.Sprintf("task %d has an id out of range", i)
		}
		for _, accs := range [][]tgraph.Access{t.Reads, t.Writes} {
			for _, a := range accs {
				if a.Buf < 0 || a.Buf >= len(g.Buffers) {
					return fmt.Sprintf("task %d touches buffer %d of %d", i, a.Buf, len(g.Buffers))
				}
				end := int64(0)
				for _, iv := range a.Ivs {
					if iv.Lo < end || iv.Hi <= iv.Lo || iv.Hi > g.Buffers[a.Buf].Numel {
						return fmt.Sprintf("task %d touches [%d, %d) of buffer %d (%d elements)", i, iv.Lo, iv.Hi, a.Buf, g.Buffers[a.Buf].Numel)
					}
					end = iv.Hi
				}
			}
		}
	}
	for i, e := range g.Events {
		if e == nil || e.ID != i || e.Needed < 0 || e.First < 0 || e.Last < e.First || e.Last > nt {
			return fmt.Sprintf("event %d has a field out of range", i)
		}
	}
	for w, q := range g.Queues {
		for _, t := range q {
			if t < 0 || t >= nt {
				return fmt.Sprintf("queue %d holds task %d of %d", w, t, nt)
			}
		}
	}
	return ""
}

// seg is one run of elements last written by the same task.
type seg struct {
	lo, hi int64
	order  int // Order of the writer; -1 for the initial contents
	task   int
}

type oracle struct {
	g        *tgraph.Graph
	tracked  []bool    // buffers some task writes
	expected [][][]seg // task → read access → the versions it must see
	seq      []int     // tasks in sequential program order
}

func newOracle(g *tgraph.Graph) *oracle {
	o := &oracle{g: g, tracked: make([]bool, len(g.Buffers)), expected: make([][][]seg, len(g.Tasks))}
	for _, t := range g.Tasks {
		for _, a := range t.Writes {
			o.tracked[a.Buf] = true
		}
	}
	o.seq = make([]int, len(g.Tasks))
	for i := range o.seq {
		o.seq[i] = i
	}
	sort.SliceStable(o.seq, func(i, j int) bool { return g.Tasks[o.seq[i]].Order < g.Tasks[o.seq[j]].Order })
	// Sequential run: within one Order every task reads before any writes.
	mem := o.fresh()
	for i := 0; i < len(o.seq); {
		j := i
		for j < len(o.seq) && g.Tasks[o.seq[j]].Order == g.Tasks[o.seq[i]].Order {
			j++
		}
		for _, id := range o.seq[i:j] {
			t := g.Tasks[id]
			o.expected[id] = make([][]seg, len(t.Reads))
			for k, a := range t.Reads {
				if o.tracked[a.Buf] {
					o.expected[id][k] = view(mem[a.Buf], a.Ivs)
				}
			}
		}
		for _, id := range o.seq[i:j] {
			t := g.Tasks[id]
			for _, a := range t.Writes {
				for _, iv := range a.Ivs {
					mem[a.Buf] = write(mem[a.Buf], iv, t.Order, id)
				}
			}
		}
		i = j
	}
	return o
}

func (o *oracle) writers() []int {
	var ws []int
	for _, t := range o.g.Tasks {
		if len(t.Writes) > 0 {
			ws = append(ws, t.ID)
		}
	}
	return ws
}

func (o *oracle) fresh() [][]seg {
	mem := make([][]seg, len(o.g.Buffers))
	for b, info := range o.g.Buffers {
		if o.tracked[b] && info.Numel > 0 {
			mem[b] = []seg{{0, info.Numel, -1, -1}}
		}
	}
	return mem
}

// view is the versions seen over ivs, adjacent runs of one Order merged.
func view(s []seg, ivs []tgraph.Interval) []seg {
	var out []seg
	for _, iv := range ivs {
		k := sort.Search(len(s), func(i int) bool { return s[i].hi > iv.Lo })
		for ; k < len(s) && s[k].lo < iv.Hi; k++ {
			lo, hi := max(s[k].lo, iv.Lo), min(s[k].hi, iv.Hi)
			if n := len(out); n > 0 && out[n-1].hi == lo && out[n-1].order == s[k].order {
				out[n-1].hi = hi
				continue
			}
			out = append(out, seg{lo, hi, s[k].order, -1})
		}
	}
	return out
}

// write records that task wrote iv; s covers the whole buffer.
func write(s []seg, iv tgraph.Interval, order, task int) []seg {
	out := make([]seg, 0, len(s)+2)
	w := seg{iv.Lo, iv.Hi, order, task}
	inserted := false
	for _, x := range s {
		switch {
		case x.hi <= iv.Lo:
			out = append(out, x)
		case x.lo >= iv.Hi:
			if !inserted {
				out, inserted = append(out, w), true
			}
			out = append(out, x)
		default:
			if x.lo < iv.Lo {
				out = append(out, seg{x.lo, iv.Lo, x.order, x.task})
			}
			if !inserted {
				out, inserted = append(out, w), true
			}
			if x.hi > iv.Hi {
				out = append(out, seg{iv.Hi, x.hi, x.order, x.task})
			}
		}
	}
	if !inserted {
		out = append(out, w)
	}
	return out
}

// exec runs task id against mem; it returns a race description or "".
func (o *oracle) exec(mem [][]seg, id int) string {
	g := o.g
	t := g.Tasks[id]
	for k, a := range t.Reads {
		if !o.tracked[a.Buf] || a.Fresh { // a Fresh read reads nothing the launch writes (refexec audits it)
			continue
		}
		got, want := view(mem[a.Buf], a.Ivs), o.expected[id][k]
		if !sameSegs(got, want) {
			return fmt.Sprintf("task %d (order %d) reads buf %s and sees versions %s, want %s",
				id, t.Order, g.Buffers[a.Buf].Name, segString(got), segString(want))
		}
	}
	for _, a := range t.Writes {
		for _, iv := range a.Ivs {
			for _, x := range mem[a.Buf] {
				if x.hi > iv.Lo && x.lo < iv.Hi && x.task != id && x.order >= t.Order {
					return fmt.Sprintf("task %d (order %d) writes buf %s [%d, %d) over a write of order %d",
						id, t.Order, g.Buffers[a.Buf].Name, x.lo, x.hi, x.order)
				}
			}
			mem[a.Buf] = write(mem[a.Buf], iv, t.Order, id)
		}
	}
	return ""
}

func sameSegs(a, b []seg) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].lo != b[i].lo || a[i].hi != b[i].hi || a[i].order != b[i].order {
			return false
		}
	}
	return true
}

func segString(s []seg) string {
	out := ""
	for i, x := range s {
		if i == 4 {
			return out + " ..."
		}
		out += fmt.Sprintf("[%d,%d)@%d ", x.lo, x.hi, x.order)
	}
	return out
}

// adversary picks which runnable task goes next.
type adversary struct {
	kind    int // 0 random, 1 highest Order first, 2 delay target, 3 delay a random half
	target  int
	delayed []bool
	rng     *rand.Rand
}

// pick returns an index into cands (task ids, non-empty).
func (a *adversary) pick(g *tgraph.Graph, cands []int) int {
	best, bestKey := -1, 0
	for i, t := range cands {
		key := a.rng.Intn(1 << 20)
		switch a.kind {
		case 1:
			key += g.Tasks[t].Order << 20
		case 2:
			if t == a.target {
				key -= 1 << 40
			} else {
				key += g.Tasks[t].Order << 20
			}
		case 3:
			if a.delayed[t] {
				key -= 1 << 40
			}
		}
		if best < 0 || key > bestKey {
			best, bestKey = i, key
		}
	}
	return best
}

func (o *oracle) runQueues(adv *adversary) string {
	g := o.g
	mem := o.fresh()
	count := make([]int, len(g.Events))
	ran := make([]int, len(g.Tasks))
	head := make([]int, len(g.Queues))
	var cands, ws []int
	for {
		cands, ws = cands[:0], ws[:0]
		done := true
		for w, q := range g.Queues {
			if head[w] == len(q) {
				continue
			}
			done = false
			t := g.Tasks[q[head[w]]]
			if t.Wait == tgraph.None || count[t.Wait] >= g.Events[t.Wait].Needed {
				cands = append(cands, t.ID)
				ws = append(ws, w)
			}
		}
		if done {
			break
		}
		if len(cands) == 0 {
			var stuck []int
			for w, q := range g.Queues {
				if head[w] < len(q) {
					stuck = append(stuck, q[head[w]])
				}
			}
			return fmt.Sprintf("hang: workers stuck at tasks %v", stuck)
		}
		i := adv.pick(g, cands)
		id := cands[i]
		head[ws[i]]++
		if ran[id]++; ran[id] > 1 {
			return fmt.Sprintf("task %d runs twice", id)
		}
		if r := o.exec(mem, id); r != "" {
			return r
		}
		if e := g.Tasks[id].Trigger; e != tgraph.None {
			count[e]++
		}
	}
	for id, n := range ran {
		if n == 0 {
			return fmt.Sprintf("task %d never runs (in no queue)", id)
		}
	}
	return o.outputsWritten(mem)
}

// outputsWritten reports an element of an output buffer nobody wrote.
func (o *oracle) outputsWritten(mem [][]seg) string {
	for b, info := range o.g.Buffers {
		if !info.Output || info.Numel == 0 {
			continue
		}
		if !o.tracked[b] {
			return fmt.Sprintf("output buf %s is never written", info.Name)
		}
		for _, x := range mem[b] {
			if x.order < 0 && x.task < 0 {
				return fmt.Sprintf("output buf %s [%d, %d) is never written", info.Name, x.lo, x.hi)
			}
		}
	}
	return ""
}

func (o *oracle) runDataflow(adv *adversary) string {
	g := o.g
	mem := o.fresh()
	count := make([]int, len(g.Events))
	launched := make([]int, len(g.Tasks))
	var ready []int
	launch := func(id int) string {
		if launched[id]++; launched[id] > 1 {
			return fmt.Sprintf("task %d is launched twice", id)
		}
		ready = append(ready, id)
		return ""
	}
	fire := func(e int) string {
		for id := g.Events[e].First; id < g.Events[e].Last; id++ {
			if r := launch(id); r != "" {
				return r
			}
		}
		return ""
	}
	for _, t := range g.Tasks {
		if t.Wait == tgraph.None {
			if r := launch(t.ID); r != "" {
				return r
			}
		}
	}
	for e, ev := range g.Events {
		if ev.Needed == 0 {
			if r := fire(e); r != "" {
				return r
			}
		}
	}
	for len(ready) > 0 {
		i := adv.pick(g, ready)
		id := ready[i]
		ready[i] = ready[len(ready)-1]
		ready = ready[:len(ready)-1]
		if r := o.exec(mem, id); r != "" {
			return r
		}
		if e := g.Tasks[id].Trigger; e != tgraph.None {
			if count[e]++; count[e] == g.Events[e].Needed {
				if r := fire(e); r != "" {
					return r
				}
			}
		}
	}
	var never []int
	for id, n := range launched {
		if n == 0 {
			never = append(never, id)
		}
	}
	if never != nil {
		return fmt.Sprintf("hang: tasks %v are never launched", never)
	}
	return o.outputsWritten(mem)
}
