package decompose

import (
	"encoding/binary"
	"slices"

	"mpk/gocore/tgraph"
)

// Depend finds, for every task, the earlier tasks it must follow: a read
// after an overlapping write (RAW), and a write after an overlapping read or
// write (WAR, WAW; these arise on the KV cache and counters the graph updates
// in place). Buffers nothing writes (weights) need no ordering.
func Depend(tg *tgraph.Graph) [][]int {
	// Reads matter to later writes (WAR) only for buffers written more than
	// once or owned by the caller (the KV cache, counters): temporaries are
	// written by one op before anything reads them.
	writerOps := make([]map[int]bool, len(tg.Buffers))
	for _, t := range tg.Tasks {
		for _, a := range t.Writes {
			if writerOps[a.Buf] == nil {
				writerOps[a.Buf] = map[int]bool{}
			}
			writerOps[a.Buf][t.Op] = true
		}
	}
	trackReads := make([]bool, len(tg.Buffers))
	for b, ops := range writerOps {
		trackReads[b] = len(ops) > 1 || len(ops) == 1 && tg.Buffers[b].Input
	}
	writes := make([]*accessIndex, len(tg.Buffers))
	reads := make([]*accessIndex, len(tg.Buffers))
	for b, info := range tg.Buffers {
		if writerOps[b] != nil {
			writes[b] = newAccessIndex(info.Numel)
			if trackReads[b] {
				reads[b] = newAccessIndex(info.Numel)
			}
		}
	}
	preds := make([][]int, len(tg.Tasks))
	seen := make([]int, len(tg.Tasks)) // seen[p] == t+1: p already a predecessor of t
	var hits []int32
	for _, t := range tg.Tasks {
		add := func(x *accessIndex, ivs []tgraph.Interval) {
			if x == nil {
				return
			}
			hits = x.overlapping(ivs, hits[:0])
			for _, h := range hits {
				p := x.tasks[h]
				if tg.Tasks[p].Op != t.Op && seen[p] != t.ID+1 {
					seen[p] = t.ID + 1
					preds[t.ID] = append(preds[t.ID], p)
				}
			}
		}
		for _, a := range t.Reads {
			if !a.Fresh { // a Fresh read never reads what the launch writes
				add(writes[a.Buf], a.Ivs)
			}
		}
		for _, a := range t.Writes {
			add(writes[a.Buf], a.Ivs)
			add(reads[a.Buf], a.Ivs)
		}
		for _, a := range t.Reads {
			if reads[a.Buf] != nil && !a.Fresh {
				reads[a.Buf].insert(t.ID, a.Ivs)
			}
		}
		for _, a := range t.Writes {
			writes[a.Buf].insert(t.ID, a.Ivs)
		}
	}
	return preds
}

// accessIndex holds the accesses made so far to one buffer, filed under the
// buckets of 2^shift elements their intervals touch, so that finding those
// that overlap a new access looks only at the ones sharing a bucket with it.
// (Checking every pair took 13 of a 17 s compile of a 512-token chunk of
// llama-3.2-1b: its RoPE'd queries have 1,024 writer and 1,024 reader tasks
// a layer, each 64 strided rows of one head.)
type accessIndex struct {
	shift   uint
	buckets [][]int32 // bucket → the accesses with an interval in it, in order
	tasks   []int     // access → its task
	ivs     [][]tgraph.Interval
	stamp   []int32 // access → the last query that looked at it, plus one
	queries int32
}

// indexBuckets bounds a buffer's buckets (and so each access's filings).
const indexBuckets = 4096

func newAccessIndex(numel int64) *accessIndex {
	x := &accessIndex{}
	for numel>>x.shift > indexBuckets {
		x.shift++
	}
	x.buckets = make([][]int32, numel>>x.shift+1)
	return x
}

// span is the buckets [lo, hi] an interval touches, clamped to the buffer
// (an access past its end lands in the last bucket; the validator refuses it).
func (x *accessIndex) span(iv tgraph.Interval) (int64, int64) {
	last := int64(len(x.buckets) - 1)
	lo, hi := iv.Lo>>x.shift, (iv.Hi-1)>>x.shift
	return min(max(lo, 0), last), min(max(hi, 0), last)
}

func (x *accessIndex) insert(task int, ivs []tgraph.Interval) {
	a := int32(len(x.tasks))
	x.tasks = append(x.tasks, task)
	x.ivs = append(x.ivs, ivs)
	x.stamp = append(x.stamp, 0)
	for _, iv := range ivs {
		lo, hi := x.span(iv)
		for b := lo; b <= hi; b++ {
			if n := len(x.buckets[b]); n == 0 || x.buckets[b][n-1] != a {
				x.buckets[b] = append(x.buckets[b], a)
			}
		}
	}
}

// overlapping appends to out the accesses whose intervals overlap ivs, in
// the order they were made (as a scan of them all would find them).
func (x *accessIndex) overlapping(ivs []tgraph.Interval, out []int32) []int32 {
	x.queries++
	for _, iv := range ivs {
		lo, hi := x.span(iv)
		for b := lo; b <= hi; b++ {
			for _, a := range x.buckets[b] {
				if x.stamp[a] == x.queries {
					continue
				}
				x.stamp[a] = x.queries
				if tgraph.Overlaps(x.ivs[a], ivs) {
					out = append(out, a)
				}
			}
		}
	}
	slices.Sort(out)
	return out
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
	perOp := make([]int, nOps) // predecessors of the current task per op
	var touched []int
	for _, t := range tg.Tasks { // tasks are in op order, preds come first
		d := make([]uint64, words)
		touched = touched[:0]
		for _, p := range preds[t.ID] {
			for w, x := range done[p] {
				d[w] |= x
			}
			op := tg.Tasks[p].Op
			if perOp[op] == 0 {
				touched = append(touched, op)
			}
			perOp[op]++
		}
		// d is now the union of the predecessors' done sets; p's own op is
		// never in done[p], so a hit means another predecessor covers p.
		for _, p := range preds[t.ID] {
			op := tg.Tasks[p].Op
			if d[op/64]&(1<<(op%64)) == 0 {
				out[t.ID] = append(out[t.ID], p)
			}
		}
		for _, op := range touched {
			if perOp[op] == opSize[op] {
				d[op/64] |= 1 << (op % 64)
			}
			perOp[op] = 0
		}
		done[t.ID] = d
	}
	return out
}

// Coarsen makes the tasks of an op wait on the union of their predecessor
// sets when their distinct sets share producers: event fusion gives each
// distinct set an event that each producer in it triggers, and a producer of
// several events fans out through empty relay tasks, one a worker runs per
// event (a 64-token prompt chunk's attention: 288 tasks, 32 sets over 144
// producers; in all 40,260 relays among 73,925 tasks, and a 512-token chunk
// 550,328 among 666,121, past the runtime's task limit at a cache of 2,056).
// An op is coarsened when its producers would each trigger more than
// maxShare of its sets on average; sets that do not overlap (the up
// projection's rows each waiting on the gate's same rows) keep their fine
// waits. The union only adds waits for producers of the same stage. An op
// whose tasks wait on each other (a predecessor in the op) keeps its sets.
//
// An op that no task waits on (a fresh-row attention's KV-cache writes,
// which run beside it) then waits on such a union too, where every one of
// its sets lies in it: its delay holds nothing back, and its producers need
// no relay to reach a second event.
func Coarsen(tg *tgraph.Graph, preds [][]int, maxShare float64) [][]int {
	out := append([][]int(nil), preds...)
	var unions [][]int
	var sinks [][2]int // the task ranges of ops no task waits on
	waited := map[int]bool{}
	for _, ps := range preds {
		for _, p := range ps {
			waited[tg.Tasks[p].Op] = true
		}
	}
	coarsen := func(lo, hi int) {
		if coarse := sharedUnion(preds, lo, hi, maxShare); coarse != nil {
			for id := lo; id < hi; id++ {
				out[id] = coarse
			}
			unions = append(unions, coarse)
		}
	}
	for lo := 0; lo < len(tg.Tasks); {
		op, hi := tg.Tasks[lo].Op, lo
		for hi < len(tg.Tasks) && tg.Tasks[hi].Op == op {
			hi++
		}
		if op >= 0 && !waited[op] {
			sinks = append(sinks, [2]int{lo, hi}) // after the others' unions are known
		} else {
			coarsen(lo, hi)
		}
		lo = hi
	}
	for _, r := range sinks {
		joined := false
		for _, u := range unions {
			if containsSets(u, preds[r[0]:r[1]]) {
				for id := r[0]; id < r[1]; id++ {
					out[id] = u
				}
				joined = true
				break
			}
		}
		if !joined {
			coarsen(r[0], r[1])
		}
	}
	return out
}

// containsSets says whether sorted set u holds every element of each set
// (and the sets are not all empty).
func containsSets(u []int, sets [][]int) bool {
	some := false
	for _, ps := range sets {
		for _, p := range ps {
			if _, ok := slices.BinarySearch(u, p); !ok {
				return false
			}
			some = true
		}
	}
	return some
}

// sharedUnion returns the union of the predecessor sets of tasks [lo, hi)
// (one op's) when its producers would each be in more than maxShare of the
// distinct sets on average; nil otherwise, or when a predecessor is a task
// of the op itself.
func sharedUnion(preds [][]int, lo, hi int, maxShare float64) []int {
	distinct := map[string]bool{}
	seen := map[int]bool{}
	var union []int
	members := 0 // Σ |set| over the distinct sets
	for id := lo; id < hi; id++ {
		ps := append([]int(nil), preds[id]...)
		slices.Sort(ps)
		key := make([]byte, 0, 4*len(ps))
		for _, p := range ps {
			if p >= lo && p < hi {
				return nil
			}
			key = binary.LittleEndian.AppendUint32(key, uint32(p))
			if !seen[p] {
				seen[p] = true
				union = append(union, p)
			}
		}
		if k := string(key); !distinct[k] {
			distinct[k] = true
			members += len(ps)
		}
	}
	if len(distinct) < 2 || float64(members) <= maxShare*float64(len(union)) {
		return nil
	}
	slices.Sort(union)
	return union
}
