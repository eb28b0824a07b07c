package lower

import (
	"mpk/gocore/ir"
	"mpk/gocore/stream"
)

// balanceGemmTail evens out a GEMM stream whose tasks (GemmRows weight rows
// each) run a short last round on the workers: qwen3-8b's 64-token chunk
// pairs its gate and up projections into 192 tasks, 60 of them a second
// round on 132 workers (133 us of a 476 us layer; bench/NOTES.md fortieth
// session). The full rounds' weight rows stay one stream; the tail's rows
// run as two streams over halves of x's rows, side by side on twice the
// workers. A task over 32 rows of x costs ~0.78 of one over 64 (its wgmmas
// stacked, half the x: bench/gemm_task.cu, forty-first session, 2.43
// against 3.10 us a block of the pair), so the slowest workers end at ~1.8
// rounds rather than 2. Only where the tail is at most half the workers (its
// halves then take a worker each), and where the stream is the only reader
// of its weight (a long prompt's blocks of rows, split_rows', fill the
// rounds among themselves). Runs after pairLinears: a pair is cut as one.
// With overlap (a timed schedule) a stream whose product K-sliced GEMM
// streams read keeps its tail: their first slices fill the idle workers
// (tailOverlapParts).
func balanceGemmTail(g *ir.Graph, workers int, overlap bool) {
	if workers <= 0 {
		return
	}
	readers := map[*ir.Buffer]int{}
	sliced := map[*ir.Buffer]bool{} // x of a K-sliced GEMM stream
	for _, op := range g.Ops {
		if op.Kind == ir.Linear {
			readers[op.In[1].Buf]++
			sliced[op.In[0].Buf] = sliced[op.In[0].Buf] || op.Attr.Gemm && op.Attr.KParts > 1
		}
	}
	var ops []*ir.Op
	for _, op := range g.Ops {
		head, ok := tailSplit(op, workers)
		if !ok || readers[op.In[1].Buf] > 1 || overlap && sliced[op.Out.Buf] {
			ops = append(ops, op)
			continue
		}
		N, M := op.Out.Shape[1], op.Out.Shape[0]
		ops = append(ops, sliceCols(op, 0, head))
		for _, half := range sliceRowBlocks(sliceCols(op, head, N-head), M/2) {
			half.Attr.Spread = true
			ops = append(ops, half)
		}
	}
	g.Ops = ops
}

// tailSplit returns the weight rows of op's full rounds of tasks when op is
// a GEMM stream whose last round is short enough to balance.
func tailSplit(op *ir.Op, workers int) (int64, bool) {
	if op.Kind != ir.Linear || !op.Attr.Gemm || op.Attr.KParts > 1 || op.Out.Rank() != 2 {
		return 0, false
	}
	M, N, W := op.Out.Shape[0], op.Out.Shape[1], int64(workers)
	if M%2 != 0 || M/2 < stream.GemmMinRows || M > stream.GemmMaxRows || N%stream.GemmRows != 0 {
		return 0, false
	}
	tasks := N / stream.GemmRows
	tail := tasks % W
	if tasks <= W || tail == 0 || 2*tail > W || !colSliceable(op) || !rowSliceable(op) {
		return 0, false
	}
	return (tasks - tail) * stream.GemmRows, true
}

// colSliceable: every operand but x and the weights (a pair's second too)
// has the output's shape, so weight rows [n0, n1) read and write its
// columns [n0, n1); no folded expression reads an index.
func colSliceable(op *ir.Op) bool {
	if op.Attr.Pro != nil || op.Out.Rank() != 2 {
		return false
	}
	pair := op.PairInput()
	for i, v := range op.In {
		if i > 1 && i != pair && !equalShape(v.Shape, op.Out.Shape) {
			return false
		}
	}
	e := op.Attr.Epi
	return e == nil || e.Expr == nil || !hasIndex(e.Expr)
}

// sliceCols is op over weight rows [n0, n0+n): those rows of its weights
// (a pair's second too), and those columns of its output and of every other
// operand but x (colSliceable).
func sliceCols(op *ir.Op, n0, n int64) *ir.Op {
	c := *op
	c.In = make([]ir.View, len(op.In))
	pair := op.PairInput()
	for i, v := range op.In {
		switch {
		case i == 0:
			c.In[i] = v.Clone()
		case i == 1 || i == pair:
			c.In[i] = sliceView(v, 0, n0, n)
		default:
			c.In[i] = sliceView(v, 1, n0, n)
		}
	}
	c.Out = sliceView(op.Out, 1, n0, n)
	return &c
}
