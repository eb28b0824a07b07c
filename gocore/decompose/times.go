package decompose

import (
	"mpk/gocore/ir"
	"mpk/gocore/stream"
	"mpk/gocore/tgraph"
)

// EstimateTimes sets each task's estimated run time (Task.Time) for a timed
// tgraph.Schedule, and marks the GEMM streams' tasks as the ones it places
// by them (Task.Timed). What the schedule needs is where workers idle beside
// a long stage, so the weight streams (most of a prompt chunk's time) are
// timed by their bytes (stream.TaskNs) and every other task by its kind.
// Only GEMM tasks move: placed so, a decode step's relays and small tasks
// joined their producers' workers and the step ran 0.5-1.4% slower
// (bench/NOTES.md, forty-fourth session), where a chunk's K slices gain.
func EstimateTimes(g *ir.Graph, tg *tgraph.Graph) {
	for _, t := range tg.Tasks {
		if t.Op < 0 {
			t.Time = relayNs
			continue
		}
		op := g.Ops[t.Op]
		t.Time, t.Timed = taskNs(op, t.Box), op.Kind == ir.Linear && op.Attr.Gemm
	}
}

// Estimates (ns) of an empty relay, a prompt attention's task (36 us on
// qwen3-8b's 64-token chunk, 20 on llama-3.2-1b's) and any other task.
const (
	relayNs     = 400
	attentionNs = 25000
	otherNs     = 6000
)

func taskNs(op *ir.Op, b tgraph.Box) int64 {
	switch op.Kind {
	case ir.Linear:
		if op.Out.Rank() != 2 || len(b.Hi) != 2 {
			return otherNs
		}
		pair := op.PairInput() >= 0
		bytes := (b.Hi[1] - b.Lo[1]) * op.LinearK() * op.In[1].DType().Size()
		if pair {
			bytes *= 2
		}
		return stream.TaskNs(bytes, op.Attr.Gemm, pair, op.Out.Shape[0])
	case ir.Attention:
		return attentionNs
	}
	return otherNs
}
