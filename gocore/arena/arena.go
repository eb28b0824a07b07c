// Package arena places a compiled graph's temporaries in the arena, the one
// device allocation a module's launches keep them in. With reuse,
// temporaries whose accesses the events order share bytes: a layer's
// activations take the bytes of an earlier layer's, where a 512-token
// chunk of llama-3.2-1b held every layer's at once (1.67 GB; 59 MB shared).
// A placement is never trusted unchecked: the validator checks that the
// tasks of temporaries sharing bytes are ordered (rule shared-arena), and
// the reference executor runs with the same sharing.
package arena

import (
	"mpk/gocore/ir"
	"mpk/gocore/tgraph"
)

// Align is the alignment of each temporary's first byte.
const Align = 256

// Place sets each temporary's arena offset (tgraph.BufInfo.InArena, Arena,
// ElemBytes) and the arena's size (tgraph.Graph.ArenaBytes). It places only
// the temporaries some op reads or writes, in the order ops first touch
// them: lowering leaves behind the temporaries of the ops it fused away
// (HF's expanded K/V for GQA, their fp32 copies: tens of MB a layer at a
// long cache). Without reuse each takes bytes of its own after the last.
// With reuse, a temporary takes the first run of bytes whose holders are
// done for it: every op that accesses them finished before any task that
// accesses the newcomer can start (doneOps, a sound under-approximation of
// the events' order).
func Place(g *ir.Graph, tg *tgraph.Graph, reuse bool) {
	for _, b := range g.Buffers[len(tg.Buffers):] { // a graph built by hand (tests)
		tg.Buffers = append(tg.Buffers, tgraph.BufInfo{Name: b.Name, Numel: b.Numel, Output: b.Kind == ir.Output, Input: b.Kind == ir.Input})
	}
	for i := range tg.Buffers {
		tg.Buffers[i].InArena, tg.Buffers[i].Arena = false, 0
	}
	var p placer
	if reuse {
		p.done = doneOps(tg, len(g.Ops))
		p.ops, p.need, p.unwritten = accessorOps(tg, p.done)
	}
	seen := map[*ir.Buffer]bool{}
	place := func(b *ir.Buffer) {
		if seen[b] || b.Kind != ir.Temp {
			return
		}
		seen[b] = true
		info := &tg.Buffers[b.ID]
		info.InArena, info.ElemBytes = true, b.DType.Size()
		info.Arena = p.place(b.ID, (b.Numel*b.DType.Size()+Align-1)/Align*Align, reuse)
	}
	for _, op := range g.Ops {
		for _, v := range op.In {
			place(v.Buf)
		}
		place(op.Out.Buf)
	}
	tg.ArenaBytes = p.end
}

// A segment is a run of arena bytes and the temporary that last held them.
type segment struct {
	lo, hi int64
	holder int
}

type placer struct {
	segs []segment // in address order, covering [0, end)
	end  int64
	done []opSet // per event: the ops finished before its consumers start
	ops  [][]int // per buffer: the ops whose tasks access it
	need []opSet // per buffer: the ops finished before every task accessing it (nil: none)
	// unwritten: per buffer, no task writes it (codegen may read such a one
	// through the non-coherent path, whose cached lines no event makes
	// stale): it shares no bytes.
	unwritten []bool
}

// retired says whether the bytes holder held may go to buffer b.
func (p *placer) retired(holder, b int) bool {
	if p.need[b] == nil || p.unwritten[holder] || len(p.ops[holder]) == 0 {
		return false // see accessorOps; a holder no task accesses keeps its bytes
	}
	for _, op := range p.ops[holder] {
		if !p.need[b].has(op) {
			return false
		}
	}
	return true
}

// place gives buffer b size bytes and returns their offset.
func (p *placer) place(b int, size int64, reuse bool) int64 {
	if reuse {
		for i := range p.segs {
			lo, j := p.segs[i].lo, i
			for j < len(p.segs) && p.retired(p.segs[j].holder, b) && p.segs[j].hi-lo < size {
				j++
			}
			switch {
			case j < len(p.segs) && p.retired(p.segs[j].holder, b): // [lo, lo+size) ends inside segs[j]
				return p.take(i, j, lo, lo+size, b)
			case j == len(p.segs): // the run reaches the end: the arena grows under it
				p.end = lo + size
				return p.take(i, j-1, lo, lo+size, b)
			}
		}
	}
	lo := p.end
	p.end += size
	p.segs = append(p.segs, segment{lo, p.end, b})
	return lo
}

// take gives [lo, hi) to b, which covers segments i..j (the last perhaps in
// part, or reaching past the old end).
func (p *placer) take(i, j int, lo, hi int64, b int) int64 {
	var rest []segment
	if j >= 0 && j < len(p.segs) && p.segs[j].hi > hi {
		rest = append(rest, segment{hi, p.segs[j].hi, p.segs[j].holder})
	}
	tail := append(append([]segment{{lo, hi, b}}, rest...), p.segs[j+1:]...)
	p.segs = append(p.segs[:i], tail...)
	return lo
}

// opSet is a set of op indices.
type opSet []uint64

func newOpSet(n int) opSet      { return make(opSet, (n+63)/64) }
func (s opSet) add(op int)      { s[op>>6] |= 1 << (uint(op) & 63) }
func (s opSet) has(op int) bool { return s[op>>6]&(1<<(uint(op)&63)) != 0 }
func (s opSet) union(o opSet) {
	for i, w := range o {
		s[i] |= w
	}
}
func (s opSet) intersect(o opSet) {
	for i, w := range o {
		s[i] &= w
	}
}

// doneOps gives, per event, the ops all of whose tasks have finished when
// the event fires, from each event's ancestor tasks (tasks are in linearized
// order, so an event's producers come before its first consumer). Counting
// only the ops all of whose tasks are among an event's producers, or done
// before one of them, missed those finished through several producers in
// parts, and shared 930 MB where this shares 59 MB (a 512-token chunk of
// llama-3.2-1b; 1.67 GB unshared).
func doneOps(tg *tgraph.Graph, nOps int) []opSet {
	words := (len(tg.Tasks) + 63) / 64
	// Each op's tasks as a bitset over the words it spans.
	first, last := make([]int, nOps), make([]int, nOps)
	for op := range first {
		first[op] = words
	}
	for _, t := range tg.Tasks {
		if t.Op >= 0 {
			first[t.Op], last[t.Op] = min(first[t.Op], t.ID>>6), max(last[t.Op], t.ID>>6)
		}
	}
	mask := make([][]uint64, nOps)
	for op := range mask {
		if first[op] <= last[op] {
			mask[op] = make([]uint64, last[op]-first[op]+1)
		}
	}
	for _, t := range tg.Tasks {
		if t.Op >= 0 {
			mask[t.Op][t.ID>>6-first[t.Op]] |= 1 << (uint(t.ID) & 63)
		}
	}
	prod := tg.Producers()
	anc := make([][]uint64, len(tg.Events))
	done := make([]opSet, len(tg.Events))
	for _, t := range tg.Tasks {
		e := t.Wait
		if e == tgraph.None || anc[e] != nil {
			continue
		}
		a, d := make([]uint64, words), newOpSet(nOps)
		merged := map[int]bool{}
		for _, p := range prod[e] {
			a[p>>6] |= 1 << (uint(p) & 63)
			if w := tg.Tasks[p].Wait; w != tgraph.None && !merged[w] {
				merged[w] = true
				for i, x := range anc[w] {
					a[i] |= x
				}
				d.union(done[w])
			}
		}
		for op, m := range mask {
			if m == nil || d.has(op) {
				continue
			}
			all := true
			for i, x := range m {
				if a[first[op]+i]&x != x {
					all = false
					break
				}
			}
			if all {
				d.add(op)
			}
		}
		anc[e], done[e] = a, d
	}
	return done
}

// accessorOps gives, per buffer, the ops whose tasks read or write it; the
// ops finished before every one of those tasks starts (nil where one of them
// waits on nothing, or no task writes the buffer); and whether no task
// writes it.
func accessorOps(tg *tgraph.Graph, done []opSet) ([][]int, []opSet, []bool) {
	ops := make([][]int, len(tg.Buffers))
	need := make([]opSet, len(tg.Buffers))
	unwritten := make([]bool, len(tg.Buffers))
	for b := range unwritten {
		unwritten[b] = true
	}
	for _, t := range tg.Tasks {
		for _, a := range t.Writes {
			unwritten[a.Buf] = false
		}
	}
	never := append([]bool(nil), unwritten...)
	for _, t := range tg.Tasks {
		for _, set := range [2][]tgraph.Access{t.Reads, t.Writes} {
			for _, a := range set {
				b := a.Buf
				if n := len(ops[b]); t.Op >= 0 && (n == 0 || ops[b][n-1] != t.Op) {
					ops[b] = append(ops[b], t.Op)
				}
				switch {
				case never[b]:
				case t.Wait == tgraph.None:
					never[b], need[b] = true, nil
				case need[b] == nil:
					need[b] = append(opSet(nil), done[t.Wait]...)
				default:
					need[b].intersect(done[t.Wait])
				}
			}
		}
	}
	return ops, need, unwritten
}
