package safety

import (
	"fmt"
	"math/rand"

	"mpk/gocore/tgraph"
	"mpk/gocore/validate"
)

// genGraph is a safe-by-construction random graph before Finish, with the
// handles a mutator needs.
type genGraph struct {
	b        *validate.Builder
	kvWrites []int // tasks writing the kv buffer
	attn     []int // tasks reading it after the append
	anc      map[int]set
}

// set is a small task set.
type set map[int]bool

// generate builds a random layered program: ops of 1–6 tiles writing fresh
// buffers (or, now and then, updating an earlier buffer in place), reading
// whole buffers, matching tiles or random ranges of earlier ones; a kv_write
// op appending to a "kv" cache and an attention op reading the cache prefix.
// Each task's wait is the tightest existing event whose ancestors cover every
// earlier task it conflicts with; when none does, relay tasks join the
// needed events into a barrier, as normalization would.
func generate(rng *rand.Rand) *genGraph {
	b := validate.NewBuilder(1 + rng.Intn(4))
	gg := &genGraph{b: b}
	type buf struct {
		id         int
		tiles, ts  int64
		writtenBy  int // op index, -1 for inputs
		consumedAs int
	}
	x := b.Buf("x", 32)
	b.G.Buffers[x].Input = true
	wt := b.Buf("w", 256)
	b.G.Buffers[wt].Input = true
	const kvSlot = 8
	kvSlots := int64(4 + rng.Intn(4))
	kv := b.Buf("kv", kvSlots*kvSlot)
	b.G.Buffers[kv].Input = true
	pos := rng.Int63n(kvSlots)
	bufs := []buf{{x, 4, 8, -1, 0}, {wt, 1, 256, -1, 0}}

	anc := map[int]set{} // event → ancestor tasks
	gg.anc = anc
	var events []int // closed events (all producers known)
	nOps := 3 + rng.Intn(8)
	kvOp := rng.Intn(nOps - 1)
	attnOp := kvOp + 1 + rng.Intn(nOps-kvOp-1)
	var last int
	for op := range nOps {
		tiles := int64(1 + rng.Intn(6))
		ts := int64(2 + rng.Intn(7))
		name := fmt.Sprintf("op%d#%d", op, op)
		var out buf
		switch {
		case op == kvOp:
			name = fmt.Sprintf("kv_write#%d", op)
			tiles, ts = 2, kvSlot/2
			out = buf{kv, 0, 0, op, 0}
		case op > 0 && rng.Intn(6) == 0 && len(bufs) > 2:
			out = bufs[2+rng.Intn(len(bufs)-2)] // in place
			tiles, ts = out.tiles, out.ts
			name = fmt.Sprintf("inplace%d#%d", op, op)
		default:
			out = buf{b.Buf(fmt.Sprintf("t%d", op), tiles*ts), tiles, ts, op, 0}
			bufs = append(bufs, out)
		}
		if op == attnOp {
			name = fmt.Sprintf("attention#%d", op)
		}
		last = out.id
		// Accesses per tile.
		ts0 := make([][]validate.Acc, tiles)
		srcs := []buf{bufs[rng.Intn(len(bufs))]}
		if rng.Intn(2) == 0 {
			srcs = append(srcs, bufs[rng.Intn(len(bufs))])
		}
		for j := range tiles {
			var accs []validate.Acc
			if op == kvOp {
				lo := pos*kvSlot + j*ts
				accs = append(accs, validate.W(kv, lo, lo+ts))
			} else {
				accs = append(accs, validate.W(out.id, j*ts, j*ts+ts))
				if out.writtenBy >= 0 && out.writtenBy != op && rng.Intn(2) == 0 {
					accs = append(accs, validate.R(out.id, j*ts, j*ts+ts)) // residual-style update
				}
			}
			if op == attnOp {
				accs = append(accs, validate.R(kv, 0, (pos+1)*kvSlot))
			}
			for _, s := range srcs {
				if s.id == out.id {
					continue
				}
				n := s.tiles * s.ts
				switch r := rng.Intn(3); {
				case r == 0 || s.tiles != tiles:
					if rng.Intn(2) == 0 {
						accs = append(accs, validate.R(s.id, 0, n))
					} else {
						lo := rng.Int63n(n)
						accs = append(accs, validate.R(s.id, lo, lo+1+rng.Int63n(n-lo)))
					}
				default:
					accs = append(accs, validate.R(s.id, j*s.ts, j*s.ts+s.ts))
				}
			}
			ts0[j] = accs
		}
		// Triggers: one counter for the op, one per tile, or pairs.
		mode := rng.Intn(3)
		trig := make([]int, tiles)
		for j := range trig {
			switch {
			case mode == 0 && j > 0:
				trig[j] = trig[0]
			case mode == 2 && j%2 == 1:
				trig[j] = trig[j-1]
			default:
				trig[j] = b.Event()
			}
		}
		// Waits.
		barrier := -1
		var newEvents []int
		for j := range tiles {
			need := gg.conflicts(ts0[j], op)
			wait := tgraph.None
			if len(need) > 0 || rng.Intn(4) == 0 {
				best := -1
				for _, e := range events {
					if covers(anc[e], need) && (best < 0 || len(anc[e]) < len(anc[best]) || (len(anc[e]) == len(anc[best]) && rng.Intn(2) == 0)) {
						best = e
					}
				}
				if best < 0 && len(need) > 0 {
					if barrier < 0 {
						barrier = gg.join(anc, gg.opNeeds(ts0, op), op)
						newEvents = append(newEvents, barrier)
					}
					best = barrier
				}
				wait = best
			}
			id := b.Task(name, op, wait, trig[j], ts0[j]...)
			if op == kvOp {
				gg.kvWrites = append(gg.kvWrites, id)
			}
			if op == attnOp {
				gg.attn = append(gg.attn, id)
			}
			a := anc[trig[j]]
			if a == nil {
				a = set{}
				anc[trig[j]] = a
				newEvents = append(newEvents, trig[j])
			}
			a[id] = true
			if wait != tgraph.None {
				for t := range anc[wait] {
					a[t] = true
				}
			}
		}
		events = append(events, newEvents...)
	}
	b.Output(last)
	return gg
}

// conflicts lists earlier-op tasks whose accesses conflict with accs.
func (gg *genGraph) conflicts(accs []validate.Acc, op int) set {
	need := set{}
	for _, t := range gg.b.G.Tasks {
		if t.Order >= op || t.Op < 0 {
			continue
		}
		for _, a := range accs {
			for k, set := range [2][]tgraph.Access{t.Reads, t.Writes} {
				if k == 0 && !a.Write {
					continue
				}
				for _, x := range set {
					if x.Buf == a.Buf && tgraph.Overlaps(x.Ivs, []tgraph.Interval{{Lo: a.Lo, Hi: a.Hi}}) {
						need[t.ID] = true
					}
				}
			}
		}
	}
	return need
}

// opNeeds is the union of conflicts over every tile of an op.
func (gg *genGraph) opNeeds(tiles [][]validate.Acc, op int) set {
	need := set{}
	for _, accs := range tiles {
		for t := range gg.conflicts(accs, op) {
			need[t] = true
		}
	}
	return need
}

// join makes a barrier event whose ancestors cover need: one relay task per
// event that a needed task triggers.
func (gg *genGraph) join(anc map[int]set, need set, op int) int {
	b := gg.b
	bar := b.Event()
	seen := map[int]bool{}
	a := set{}
	for _, t := range sortedKeys(need) {
		e := b.G.Tasks[t].Trigger
		if seen[e] {
			continue
		}
		seen[e] = true
		r := b.Task("", op, e, bar)
		a[r] = true
		for x := range anc[e] {
			a[x] = true
		}
	}
	anc[bar] = a
	return bar
}

func covers(a, need set) bool {
	for t := range need {
		if !a[t] {
			return false
		}
	}
	return true
}

func sortedKeys(s set) []int {
	out := make([]int, 0, len(s))
	for k := range s {
		out = append(out, k)
	}
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && out[j] < out[j-1]; j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}
