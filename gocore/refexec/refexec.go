// Package refexec runs a task graph on the CPU with a float reference
// implementation of every task op, in a random order the events allow. It
// reads and writes the caller's tensor memory, so it tests the whole compile
// path on machines without a GPU and debugs wrong results on ones with one.
package refexec

import (
	"fmt"
	"math/rand"
	"runtime"
	"sort"
	"unsafe"

	"mpk/gocore/ir"
	"mpk/gocore/tgraph"
)

// Run executes every task of tg over caller memory (ptrs: inputs in order,
// then outputs) and returns how many tasks ran.
func Run(g *ir.Graph, tg *tgraph.Graph, ptrs []uintptr, seed int64) (int, error) {
	return run(g, tg, ptrs, seed, false)
}

// RunAudited is Run that also checks every element each task reads or
// writes against the task's declared accesses (tgraph.Task.Reads and
// Writes, what the validator reasons with): the first element outside them
// is the error. It checks the compiler's claims against execution.
func RunAudited(g *ir.Graph, tg *tgraph.Graph, ptrs []uintptr, seed int64) (int, error) {
	return run(g, tg, ptrs, seed, true)
}

func run(g *ir.Graph, tg *tgraph.Graph, ptrs []uintptr, seed int64, audit bool) (int, error) {
	if want := len(g.Inputs) + len(g.Outputs); len(ptrs) != want {
		return 0, fmt.Errorf("refexec: got %d pointers, want %d (%d inputs, %d outputs)", len(ptrs), want, len(g.Inputs), len(g.Outputs))
	}
	mems := make([]mem, len(g.Buffers))
	keep := make([][]byte, 0)
	// The temporaries the arena holds share its bytes as on the GPU, so an
	// order the events allow that breaks the sharing gives a wrong result.
	arena := make([]byte, tg.ArenaBytes+8)
	for _, b := range g.Buffers {
		var p unsafe.Pointer
		switch {
		case b.Kind == ir.Input:
			p = callerMemory(ptrs[b.Index])
		case b.Kind == ir.Output:
			p = callerMemory(ptrs[len(g.Inputs)+b.Index])
		case b.ID < len(tg.Buffers) && tg.Buffers[b.ID].InArena:
			p = unsafe.Pointer(&arena[tg.Buffers[b.ID].Arena])
		default: // a temporary no op touches
			buf := make([]byte, b.Numel*b.DType.Size()+8)
			keep = append(keep, buf)
			p = unsafe.Pointer(&buf[0])
		}
		if p == nil && b.Numel > 0 {
			return 0, fmt.Errorf("refexec: buffer %s has a null pointer", b.Name)
		}
		mems[b.ID] = mem{base: p, dt: b.DType, n: b.Numel}
	}
	x := &exec{g: g, mems: mems, audit: audit}
	n, err := x.run(tg, rand.New(rand.NewSource(seed)))
	runtime.KeepAlive(keep) // the temporaries are reached only through unsafe pointers
	runtime.KeepAlive(arena)
	return n, err
}

// callerMemory turns an address the caller (Python, through C) owns into a
// pointer; that memory is not Go's, so the garbage collector never moves it.
func callerMemory(addr uintptr) unsafe.Pointer {
	return *(*unsafe.Pointer)(unsafe.Pointer(&addr))
}

type exec struct {
	g    *ir.Graph
	mems []mem
	// With audit, every load and store is checked against task's declared
	// accesses; the first violation is kept in bad.
	audit bool
	task  *tgraph.Task
	bad   error
	// With audit, the elements of buffers read through a Fresh access
	// (tgraph.Access) that were so read, and those written: one element in
	// both breaks the access's promise, in whichever order they ran.
	freshRead, written map[int]map[int64]bool
}

// check records a violation when element off of buffer buf lies outside the
// running task's declared reads (or writes).
func (x *exec) check(buf int, off int64, write bool) {
	if x.bad != nil {
		return
	}
	declared, verb := x.task.Reads, "reads"
	if write {
		declared, verb = x.task.Writes, "writes"
	}
	for _, a := range declared {
		if a.Buf != buf {
			continue
		}
		i := sort.Search(len(a.Ivs), func(i int) bool { return a.Ivs[i].Hi > off })
		if i < len(a.Ivs) && a.Ivs[i].Lo <= off {
			x.checkFresh(buf, off, write, a.Fresh)
			return
		}
	}
	x.bad = fmt.Errorf("refexec audit: task %d (op %d) %s element %d of buffer %s, outside its declared %s",
		x.task.ID, x.task.Op, verb, off, x.g.Buffers[buf].Name, verb)
}

// checkFresh records a violation when an element read through a Fresh
// access is also written in the launch.
func (x *exec) checkFresh(buf int, off int64, write, fresh bool) {
	if x.freshRead == nil {
		x.freshRead, x.written = map[int]map[int64]bool{}, map[int]map[int64]bool{}
	}
	mark := func(m map[int]map[int64]bool) {
		if m[buf] == nil {
			m[buf] = map[int64]bool{}
		}
		m[buf][off] = true
	}
	switch {
	case write:
		mark(x.written)
	case fresh:
		mark(x.freshRead)
	default:
		return
	}
	if x.freshRead[buf][off] && x.written[buf][off] {
		x.bad = fmt.Errorf("refexec audit: task %d (op %d) touches element %d of buffer %s, both written in the launch and read through a fresh-row access",
			x.task.ID, x.task.Op, off, x.g.Buffers[buf].Name)
	}
}

// run executes the tasks: as the cuda runtime does when tg is scheduled
// (runQueues), else in any order the events allow.
func (x *exec) run(tg *tgraph.Graph, rng *rand.Rand) (int, error) {
	if tg.Queues != nil {
		return x.runQueues(tg, rng)
	}
	return x.runEvents(tg, rng)
}

// runTaskOf runs task t (nothing for an empty relay).
func (x *exec) runTaskOf(tg *tgraph.Graph, t *tgraph.Task) error {
	if t.Op < 0 {
		return nil
	}
	x.task = t
	if err := x.runTask(x.g.Ops[t.Op], t.Box); err != nil {
		return fmt.Errorf("%s: %v", tg.Name(t.ID), err)
	}
	if x.bad != nil {
		return fmt.Errorf("%s: %v", tg.Name(t.ID), x.bad)
	}
	return nil
}

// runQueues runs each worker's queue in order, with the waits and triggers
// of the runtime's task table (tgraph.RuntimeEvents: local waits dropped, so
// queue order alone orders those tasks); which worker's head task runs next
// is random among those whose wait is met.
func (x *exec) runQueues(tg *tgraph.Graph, rng *rand.Rand) (int, error) {
	wait, trigger := tgraph.RuntimeEvents(tg)
	fired := make([]int, len(tg.Events))
	head := make([]int, len(tg.Queues))
	done := 0
	var ready []int
	for {
		ready = ready[:0]
		for w, q := range tg.Queues {
			if head[w] < len(q) {
				if e := wait[q[head[w]]]; e == tgraph.None || fired[e] >= tg.Events[e].Needed {
					ready = append(ready, w)
				}
			}
		}
		if len(ready) == 0 {
			break
		}
		w := ready[rng.Intn(len(ready))]
		t := tg.Tasks[tg.Queues[w][head[w]]]
		head[w]++
		if err := x.runTaskOf(tg, t); err != nil {
			return done, err
		}
		done++
		if e := trigger[t.ID]; e != tgraph.None {
			fired[e]++
		}
	}
	if done != len(tg.Tasks) {
		return done, fmt.Errorf("refexec: deadlock: %d of %d tasks never became ready", len(tg.Tasks)-done, len(tg.Tasks))
	}
	return done, nil
}

// runEvents picks ready tasks at random until none is left.
func (x *exec) runEvents(tg *tgraph.Graph, rng *rand.Rand) (int, error) {
	fired := make([]int, len(tg.Events))
	var ready []int
	for _, t := range tg.Tasks {
		if t.Wait == tgraph.None {
			ready = append(ready, t.ID)
		}
	}
	done := 0
	for len(ready) > 0 {
		i := rng.Intn(len(ready))
		t := tg.Tasks[ready[i]]
		ready[i] = ready[len(ready)-1]
		ready = ready[:len(ready)-1]
		if err := x.runTaskOf(tg, t); err != nil {
			return done, err
		}
		done++
		if e := t.Trigger; e != tgraph.None {
			fired[e]++
			if fired[e] == tg.Events[e].Needed {
				ev := tg.Events[e]
				for c := ev.First; c < ev.Last; c++ {
					ready = append(ready, c)
				}
			}
		}
	}
	if done != len(tg.Tasks) {
		return done, fmt.Errorf("refexec: deadlock: %d of %d tasks never became ready", len(tg.Tasks)-done, len(tg.Tasks))
	}
	return done, nil
}

// at returns the element offset of index idx in v.
func at(v ir.View, idx []int64) int64 {
	off := v.Offset
	for d, i := range idx {
		off += i * v.Strides[d]
	}
	return off
}

func (x *exec) load(v ir.View, idx []int64) float64 {
	off := at(v, idx)
	if x.audit {
		x.check(v.Buf.ID, off, false)
	}
	return x.mems[v.Buf.ID].load(off)
}

func (x *exec) store(v ir.View, idx []int64, val float64) {
	off := at(v, idx)
	if x.audit {
		x.check(v.Buf.ID, off, true)
	}
	x.mems[v.Buf.ID].store(off, val)
}

// each calls f for every index of box, in row-major order.
func each(b tgraph.Box, f func(idx []int64) error) error {
	idx := append([]int64(nil), b.Lo...)
	for d := range idx {
		if b.Lo[d] >= b.Hi[d] {
			return nil
		}
	}
	for {
		if err := f(idx); err != nil {
			return err
		}
		d := len(idx) - 1
		for ; d >= 0; d-- {
			idx[d]++
			if idx[d] < b.Hi[d] {
				break
			}
			idx[d] = b.Lo[d]
		}
		if d < 0 {
			return nil
		}
	}
}

func (x *exec) runTask(op *ir.Op, b tgraph.Box) error {
	switch op.Kind {
	case ir.Elementwise:
		return each(b, func(idx []int64) error {
			x.store(op.Out, idx, x.eval(op, op.Attr.Expr, idx))
			return nil
		})
	case ir.Copy:
		return each(b, func(idx []int64) error {
			x.store(op.Out, idx, x.load(op.In[0], idx))
			return nil
		})
	case ir.Reduce:
		return x.reduce(op, b)
	case ir.RMSNorm:
		return x.rmsNorm(op, b)
	case ir.RoPE:
		return x.rope(op, b)
	case ir.Linear:
		return x.linear(op, b)
	case ir.Matmul:
		return x.matmul(op, b)
	case ir.Attention:
		if op.Attr.Splits > 1 {
			return x.attentionPartial(op, b)
		}
		return x.attention(op, b)
	case ir.AttnMerge:
		return x.attnMerge(op, b)
	case ir.MaskExtent:
		return x.maskExtent(op, b)
	case ir.Embedding:
		return x.embedding(op, b)
	case ir.Gather:
		return x.gather(op, b)
	case ir.Cat:
		return x.cat(op, b)
	case ir.KVWrite:
		return x.kvWrite(op, b)
	case ir.Empty:
		return nil
	}
	return fmt.Errorf("refexec: no reference for op kind %s", op.Kind)
}
