package lower

import (
	"slices"

	"mpk/gocore/ir"
	"mpk/gocore/stream"
)

// A run of sibling GEMM streams (a prompt chunk's q, k and v projections:
// one x, none reading another's product) runs as one stage: the tasks of
// all of them go round-robin onto the workers side by side. Cut one at a
// time (gemmKParts, gemmRowBlocks), each filled every worker by itself:
// qwen3-8b's 64-token chunk ran q as 128 tasks over blocks of 32 rows of x
// and k and v as 8 slices of K each, 384 tasks and two stages of sums (75 us
// of a 422 us layer; bench/NOTES.md, forty-second session), where their 96
// tasks of 64 weight rows each, uncut, fit one round of 132 workers.
// gemmRunCuts picks every stream's cut together, by the stage's cost.

// gemmCut is how a GEMM stream runs: as it is, as Parts slices of K and a
// stage of their sums, or as Blocks streams over blocks of GemmMinRows rows
// of x.
type gemmCut struct{ Parts, Blocks int64 }

// maxGemmRunCuts bounds the combinations gemmRunCuts weighs (a run of three
// streams with every cut open has ~5³).
const maxGemmRunCuts = 4096

// gemmRunEnd is the end of the run of sibling GEMM streams starting at
// ops[i]: Linears of at most GemmMaxRows rows of x (one block: longer x is
// split_rows' to cut), uncut, reading the same x, none reading another's
// product.
func gemmRunEnd(ops []*ir.Op, i int) int {
	first := ops[i]
	if !gemmSibling(first) {
		return i + 1
	}
	j := i + 1
	for ; j < len(ops); j++ {
		op := ops[j]
		if !gemmSibling(op) || op.XKey() != first.XKey() || op.Out.Shape[0] != first.Out.Shape[0] ||
			!independent(ops[i:j], op) {
			break
		}
	}
	return j
}

func gemmSibling(op *ir.Op) bool {
	return op.Kind == ir.Linear && op.Attr.Gemm && op.Attr.KParts <= 1 && op.Out.Rank() == 2 &&
		op.Out.Shape[0] <= stream.GemmMaxRows
}

// gemmCutsOf lists the cuts a stream may take: as it is; blocks of
// GemmMinRows rows of x (with rowBlocks); every count of K slices of whole
// GemmCols blocks that the sum's inputs allow.
func gemmCutsOf(op *ir.Op, rowBlocks bool) []gemmCut {
	cuts := []gemmCut{{}}
	M, K := op.Out.Shape[0], op.LinearK()
	if rowBlocks && M%stream.GemmMinRows == 0 && M/stream.GemmMinRows >= 2 && rowSliceable(op) {
		cuts = append(cuts, gemmCut{Blocks: M / stream.GemmMinRows})
	}
	for _, parts := range gemmSliceCounts(K, int64(len(sumInputs(op)))) {
		cuts = append(cuts, gemmCut{Parts: parts})
	}
	return cuts
}

// gemmCutTasks is the tasks a cut stream runs and what each costs
// (gemmCosts' units).
func gemmCutTasks(op *ir.Op, c gemmCut) (tasks, cost int64) {
	M, K, N := op.Out.Shape[0], op.LinearK(), op.Out.Shape[1]
	task, _, block := gemmCosts(op)
	tasks = (N + stream.GemmRows - 1) / stream.GemmRows
	switch {
	case c.Blocks > 1:
		return tasks * c.Blocks, task + K/stream.GemmCols*block(M/c.Blocks)
	case c.Parts > 1:
		return tasks * c.Parts, task + K/c.Parts/stream.GemmCols*block(M)
	}
	return tasks, task + K/stream.GemmCols*block(M)
}

// gemmRunCost is the stage's cost with each stream of run cut as cuts say:
// the most any worker runs, the tasks dealt round-robin in the run's order
// (tgraph.Schedule), plus a stage of sums where any stream is sliced (the
// streams' sums run side by side); and the tasks in all.
func gemmRunCost(run []*ir.Op, cuts []gemmCut, workers int) (cost, tasks int64) {
	load := make([]int64, workers)
	var sums int64 // the dearest stage of sums among the sliced streams'
	for i, op := range run {
		n, c := gemmCutTasks(op, cuts[i])
		for range n {
			load[tasks%int64(workers)] += c
			tasks++
		}
		if cuts[i].Parts > 1 {
			_, sum, _ := gemmCosts(op)
			sums = max(sums, sum)
		}
	}
	return slices.Max(load) + sums, tasks
}

// gemmRunCuts picks the cut of every stream of a sibling run with the least
// stage cost (the fewest tasks among equals), or nil where the run offers
// too many combinations to weigh.
func gemmRunCuts(run []*ir.Op, workers int, rowBlocks bool) []gemmCut {
	options := make([][]gemmCut, len(run))
	combos := 1
	for i, op := range run {
		options[i] = gemmCutsOf(op, rowBlocks)
		if combos *= len(options[i]); combos > maxGemmRunCuts {
			return nil
		}
	}
	var best []gemmCut
	var bestCost, bestTasks int64
	cur := make([]gemmCut, len(run))
	var visit func(i int)
	visit = func(i int) {
		if i == len(run) {
			cost, tasks := gemmRunCost(run, cur, workers)
			if best == nil || cost < bestCost || cost == bestCost && tasks < bestTasks {
				best, bestCost, bestTasks = slices.Clone(cur), cost, tasks
			}
			return
		}
		for _, c := range options[i] {
			cur[i] = c
			visit(i + 1)
		}
	}
	visit(0)
	return best
}

// cutGemm is op cut as c says.
func cutGemm(g *ir.Graph, op *ir.Op, c gemmCut) []*ir.Op {
	switch {
	case c.Blocks > 1:
		return sliceRowBlocks(op, op.Out.Shape[0]/c.Blocks)
	case c.Parts > 1:
		return sliceK(g, op, c.Parts)
	}
	return []*ir.Op{op}
}
