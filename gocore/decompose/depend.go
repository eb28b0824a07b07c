package decompose

import "mpk/gocore/tgraph"

// Depend finds, for every task, the earlier tasks it must follow: a read
// after an overlapping write (RAW), and a write after an overlapping read or
// write (WAR, WAW; these arise on the KV cache and counters the graph updates
// in place). Buffers nothing writes (weights) need no ordering.
func Depend(tg *tgraph.Graph) [][]int {
	written := make([]bool, len(tg.Buffers))
	for _, t := range tg.Tasks {
		for _, a := range t.Writes {
			written[a.Buf] = true
		}
	}
	type access struct {
		task  int
		ivs   []tgraph.Interval
		write bool
	}
	history := make([][]access, len(tg.Buffers))
	preds := make([][]int, len(tg.Tasks))
	for _, t := range tg.Tasks {
		seen := map[int]bool{}
		add := func(p int) {
			if !seen[p] {
				seen[p] = true
				preds[t.ID] = append(preds[t.ID], p)
			}
		}
		check := func(a tgraph.Access, write bool) {
			for _, h := range history[a.Buf] {
				if tg.Tasks[h.task].Op == t.Op || !(write || h.write) {
					continue
				}
				if tgraph.Overlaps(h.ivs, a.Ivs) {
					add(h.task)
				}
			}
		}
		for _, a := range t.Reads {
			if written[a.Buf] {
				check(a, false)
			}
		}
		for _, a := range t.Writes {
			check(a, true)
		}
		for _, a := range t.Reads {
			if written[a.Buf] {
				history[a.Buf] = append(history[a.Buf], access{t.ID, a.Ivs, false})
			}
		}
		for _, a := range t.Writes {
			history[a.Buf] = append(history[a.Buf], access{t.ID, a.Ivs, true})
		}
	}
	return preds
}

// Reduce drops dependencies implied by others: p → t is redundant when every
// task of p's op is already an ancestor of another predecessor of t. Each task
// carries the set of ops it has fully waited for, a sound under-approximation
// of its ancestors that costs one bit per op.
func Reduce(tg *tgraph.Graph, preds [][]int) [][]int {
	nOps := 0
	for _, t := range tg.Tasks {
		nOps = max(nOps, t.Op+1)
	}
	opSize := make([]int, nOps)
	for _, t := range tg.Tasks {
		opSize[t.Op]++
	}
	words := (nOps + 63) / 64
	done := make([][]uint64, len(tg.Tasks))
	out := make([][]int, len(tg.Tasks))
	for _, t := range tg.Tasks { // tasks are in op order, preds come first
		d := make([]uint64, words)
		perOp := map[int]int{}
		for _, p := range preds[t.ID] {
			for w, x := range done[p] {
				d[w] |= x
			}
			perOp[tg.Tasks[p].Op]++
		}
		// d is now the union of the predecessors' done sets; p's own op is
		// never in done[p], so a hit means another predecessor covers p.
		for _, p := range preds[t.ID] {
			op := tg.Tasks[p].Op
			if d[op/64]&(1<<(op%64)) == 0 {
				out[t.ID] = append(out[t.ID], p)
			}
		}
		for op, n := range perOp {
			if n == opSize[op] {
				d[op/64] |= 1 << (op % 64)
			}
		}
		done[t.ID] = d
	}
	return out
}
