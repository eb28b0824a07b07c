// Package tgraph is the SM-level task graph: tasks that each compute one tile
// of one op, and events (monotonic counters) that order them
// (docs/architecture.md, contract 4): a task waits on at most one event,
// needing all of its producers, and triggers at most one event when every
// write it made is complete.
package tgraph

import (
	"cmp"
	"fmt"
	"slices"
)

// None marks an absent event (no wait, no trigger).
const None = -1

// Capacity limits shared with the CUDA runtime tables.
const (
	MaxTasks   = 1 << 20
	MaxEvents  = 1 << 20
	MaxWorkers = 1024
)

// Interval is a half-open range of element offsets in one buffer.
type Interval struct{ Lo, Hi int64 }

// Access is a set of element ranges a task reads or writes in one buffer.
type Access struct {
	Buf int
	Ivs []Interval // sorted, disjoint, non-adjacent
	// Fresh, on a read: the task never reads the elements that the launch
	// writes into this buffer (a fresh-row attention's KV cache: the row the
	// step writes is taken from the new K and V, at a run-time position
	// inside Ivs). Its reads need no ordering against those writes.
	Fresh bool
}

// Box is a tile of an op's output: [Lo[d], Hi[d]) in each dim.
type Box struct{ Lo, Hi []int64 }

// Task computes one tile of one op, or nothing (Op < 0: an empty relay task
// inserted by normalization).
type Task struct {
	ID      int
	Op      int // index into the op graph; -1 for empty tasks
	Box     Box
	Reads   []Access
	Writes  []Access
	Wait    int // event waited on, or None
	Trigger int // event triggered on completion, or None
	Worker  int
	// Order is the position of Op in the sequential program (empty tasks take
	// the order of the op they serve); conflicting accesses must follow it.
	Order int
	// Affinity > 0: the tasks with this key read the same weight rows (a
	// Linear cut into blocks of x's rows), and Schedule keeps them on one
	// worker. 0: no other task reads them.
	Affinity int
	// Rows > 0 names the weight rows of an affinity key: the keys of one row
	// range spread over several workers (decompose.WeightAffinity) get
	// different workers where there are enough.
	Rows int
	// Cost is a keyed task's weight elements (rows × K): Schedule balances
	// the workers' keyed tasks by it, a down projection's block of K = 8,192
	// costing four of a gate's of 2,048.
	Cost int64
	// Time is the task's estimated run time in ns (decompose.EstimateTimes),
	// for a timed Schedule; 0 when not estimated. Timed: a timed Schedule
	// places the task by its clock (the others keep round-robin).
	Time  int64
	Timed bool
}

// Event is a counter: it is ready when Needed producer tasks have triggered it.
// After linearization the tasks that wait on it are exactly [First, Last).
type Event struct {
	ID          int
	Needed      int
	First, Last int
}

// BufInfo describes a buffer the tasks touch.
type BufInfo struct {
	Name   string
	Numel  int64
	Output bool // a graph output: every element must be written
	Input  bool // caller-owned memory
	// InArena: a temporary placed in the arena (package arena), Arena bytes
	// from its start, with elements of ElemBytes. Temporaries may share
	// arena bytes; the validator checks their accesses in arena bytes.
	InArena   bool
	Arena     int64
	ElemBytes int64
}

// Graph is a task graph and, once scheduled, its per-worker queues.
type Graph struct {
	Tasks   []*Task
	Events  []*Event
	Buffers []BufInfo
	OpNames []string // for messages: op index → "linear#12 (mm_3)"
	Workers int
	Queues  [][]int // per worker, task ids in execution order
	// ArenaBytes is the arena's size once its temporaries are placed.
	ArenaBytes int64
}

// Name describes task t for error messages.
func (g *Graph) Name(t int) string {
	if t < 0 || t >= len(g.Tasks) {
		return fmt.Sprintf("task %d (out of range)", t)
	}
	task := g.Tasks[t]
	if task.Op < 0 {
		return fmt.Sprintf("task %d (empty)", t)
	}
	if task.Op < len(g.OpNames) {
		return fmt.Sprintf("task %d (%s %v-%v)", t, g.OpNames[task.Op], task.Box.Lo, task.Box.Hi)
	}
	return fmt.Sprintf("task %d (op %d)", t, task.Op)
}

// Producers returns, for each event, the tasks that trigger it.
func (g *Graph) Producers() [][]int {
	p := make([][]int, len(g.Events))
	for _, t := range g.Tasks {
		if t.Trigger >= 0 && t.Trigger < len(p) {
			p[t.Trigger] = append(p[t.Trigger], t.ID)
		}
	}
	return p
}

// Consumers returns, for each event, the tasks that wait on it.
func (g *Graph) Consumers() [][]int {
	c := make([][]int, len(g.Events))
	for _, t := range g.Tasks {
		if t.Wait >= 0 && t.Wait < len(c) {
			c[t.Wait] = append(c[t.Wait], t.ID)
		}
	}
	return c
}

// Overlaps reports whether two sorted interval lists intersect.
func Overlaps(a, b []Interval) bool {
	i, j := 0, 0
	for i < len(a) && j < len(b) {
		if a[i].Hi <= b[j].Lo {
			i++
		} else if b[j].Hi <= a[i].Lo {
			j++
		} else {
			return true
		}
	}
	return false
}

// NormalizeIntervals sorts and merges intervals in place, dropping empty ones.
func NormalizeIntervals(ivs []Interval) []Interval {
	out := ivs[:0]
	slices.SortFunc(ivs, func(a, b Interval) int { return cmp.Compare(a.Lo, b.Lo) })
	for _, iv := range ivs {
		if iv.Hi <= iv.Lo {
			continue
		}
		if n := len(out); n > 0 && iv.Lo <= out[n-1].Hi {
			if iv.Hi > out[n-1].Hi {
				out[n-1].Hi = iv.Hi
			}
			continue
		}
		out = append(out, iv)
	}
	return out
}
