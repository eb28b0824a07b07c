package lower

import (
	"mpk/gocore/ir"
	"mpk/gocore/stream"
)

// markGemm marks the Linears whose x has GemmMinRows rows or more (a prompt
// chunk, a large decode batch) as GEMM streams (stream.Plan.Gemm): x is
// staged a block of K at a time and the weights are read once. A tile
// stream stages x whole and applies each 8-row page of weights to all of
// it, so it reads x from shared memory once per 8 weight rows (at 64 rows,
// 8 times the weights' bytes), and x of 64 rows of 2,048 columns does not
// fit at all (blocks of rows, splitLinearRows, then read the weights once
// per block: a 64-token chunk's down projection 16 times).
// An x of more than GemmMaxRows rows (a long prompt chunk) is marked too
// when splitRows will cut it into blocks of GemmMaxRows rows, each a GEMM
// stream (the weights read once a block).
// With wgmma, those with bf16 weights multiply on wgmma (ir.Attr.Wgmma);
// with batch too, from GemmBatchMinRows rows on (a decode batch), where
// its tasks of GemmRows weight rows cover the workers with K whole (the gate
// and up projections, the LM head): a batch's q, k, v, o and down
// projections as K slices and their sums' stages took longer than as tile
// streams (bench/NOTES.md, forty-eighth session).
// It runs before fusePrologue, which then leaves the norm or elementwise op
// that makes such an x as its own op (a norm needs whole rows: x is staged
// a block of K at a time).
func markGemm(g *ir.Graph, workers int, splitRows, wgmma, batch bool) {
	written := stream.Writers(g)
	for _, op := range g.Ops {
		if op.Kind != ir.Linear || op.Attr.Pro != nil || op.Out.Rank() != 2 {
			continue
		}
		M, N, onWgmma := op.Out.Shape[0], op.Out.Shape[1], wgmma && op.In[1].DType() == ir.BF16
		minRows := int64(stream.GemmMinRows)
		if batch && onWgmma && coversWorkers((N+stream.GemmRows-1)/stream.GemmRows, workers) {
			minRows = stream.GemmBatchMinRows
		}
		if M < minRows || M > stream.GemmMaxRows && !(splitRows && rowSliceable(op)) {
			continue
		}
		c := *op
		c.Attr.Gemm = true
		c.Attr.Wgmma = onWgmma
		c.Out = op.Out.Clone()
		c.Out.Shape[0] = min(M, stream.GemmMaxRows) // a block's rows
		if _, ok := stream.For(&c, written); ok {
			op.Attr.Gemm, op.Attr.Wgmma = true, c.Attr.Wgmma
		}
	}
}

// coversWorkers says whether a GEMM stream's tasks cover the workers (nine
// tenths of them, the bound gemmKParts has used).
func coversWorkers(tasks int64, workers int) bool { return tasks >= int64(workers)*9/10 }

// gemmKParts is how many slices of K a GEMM stream takes (splitLinearK):
// its tasks take GemmRows weight rows each, so a short N (the q, k, v and o
// projections) of one block of rows fills the workers only when K is cut too; the fewest slices
// whose tasks cover the workers, each a whole number of GemmCols blocks,
// within the sum's input limit (extra: its inputs besides the slices).
func gemmKParts(op *ir.Op, workers int, extra int64) int64 {
	K, M, N := op.LinearK(), op.Out.Shape[0], op.Out.Shape[1]
	// tasks of GemmRows weight rows, in each block of rows (markGemm)
	tasks := (N + stream.GemmRows - 1) / stream.GemmRows * ((M + stream.GemmMaxRows - 1) / stream.GemmMaxRows)
	best := int64(1)
	for _, parts := range gemmSliceCounts(K, extra) {
		if coversWorkers(tasks*best, workers) {
			break
		}
		best = parts
	}
	return best
}

// gemmSliceCounts lists, in order, the counts of K slices a GEMM stream
// may take: from 2, each slice whole GemmCols blocks, within maxKParts and
// the sum's input limit (extra: its inputs besides the slices).
func gemmSliceCounts(K, extra int64) []int64 {
	var counts []int64
	for parts := int64(2); parts <= maxKParts && parts+extra <= maxSliceInputs; parts++ {
		if K%(parts*stream.GemmCols) == 0 {
			counts = append(counts, parts)
		}
	}
	return counts
}

// Costs of a GEMM stream's tasks, in fifths of a unit of GemmRows weight
// rows × GemmCols columns × 16 rows of x (an m-tile) on mma.sync: ~1.2 us on
// the H100, where a task spends ~2.5 us staging x besides, and a stage of
// K-split sums ~14 us with its hop (bench/NOTES.md, twenty-ninth session:
// the 64-token chunk's trace).
const (
	gemmTaskCost = 10
	gemmSumCost  = 60
	gemmTileCost = 5
)

// A wgmma stream's, in fifths of a quarter of its block of 64 rows of x
// (2.15 us on the H200): a block of at most 32 rows, hi and lo stacked in
// one m64 tile, costs 0.65 of it (1.39 us), not half; staging ~1.8 us; a
// stage of sums with its hop ~11 us (bench/NOTES.md, forty-second session:
// with the old units qwen3-8b's down projection took two streams of 32
// rows, which its 64-token chunk ran 3.7% slower than K slices).
const (
	wgmmaTaskCost    = 15
	wgmmaSumCost     = 100
	wgmmaBlockCost   = 20
	wgmmaStackedCost = 13
)

// gemmRowBlocks is how many blocks of GemmMinRows rows of x a GEMM stream
// cut into parts slices of K (gemmKParts; its rows in blocks of
// GemmMaxRows) would rather take: each block's tasks stream every weight row
// (all but the first block's from L2) and no sum follows, where slices
// leave a stage of sums; 0 where the slices cost less by the costs above,
// or x's rows are one block. A 64-token chunk's q and o projections take 2
// blocks of 32, as do llama-3.2-1b's k and v (qwen3-8b's keep 8 slices);
// its down projection keeps its slices (K = 8,192: 4; qwen3-8b's 12,288:
// 2); a 512-token chunk's k and v take 16 blocks of 32 rather than 2 slices
// of each block of 64.
func gemmRowBlocks(op *ir.Op, workers int, parts int64) int64 {
	M, K, N := op.Out.Shape[0], op.LinearK(), op.Out.Shape[1]
	if parts < 2 || M%stream.GemmMinRows != 0 || M/stream.GemmMinRows < 2 || !rowSliceable(op) {
		return 0
	}
	task, sum, block := gemmCosts(op)
	blocks, rowTasks := M/stream.GemmMinRows, (N+stream.GemmRows-1)/stream.GemmRows
	waves := func(tasks int64) int64 { return (tasks + int64(workers) - 1) / int64(workers) }
	sliced := (M + stream.GemmMaxRows - 1) / stream.GemmMaxRows // blocks of rows the slices keep
	slices := waves(rowTasks*sliced*parts)*(task+K/parts/stream.GemmCols*block(min(M, stream.GemmMaxRows))) + sum
	rows := waves(rowTasks*blocks) * (task + K/stream.GemmCols*block(stream.GemmMinRows))
	if rows > slices {
		return 0
	}
	return blocks
}

// gemmCosts is a GEMM stream's costs by the units above: a task's own
// (staging, store), a stage of sums with its hop, and a GemmCols block of
// `rows` rows of x.
func gemmCosts(op *ir.Op) (task, sum int64, block func(rows int64) int64) {
	if op.Attr.Wgmma {
		return wgmmaTaskCost, wgmmaSumCost, func(rows int64) int64 {
			if rows <= 32 {
				return wgmmaStackedCost
			}
			return wgmmaBlockCost
		}
	}
	return gemmTaskCost, gemmSumCost, func(rows int64) int64 { return gemmTileCost * ((rows + 15) / 16) }
}

// tailOverlapParts is how many slices of K a GEMM stream op takes under a
// timed schedule when its x is the product of a GEMM stream whose tasks end
// in a short last round (at most half the workers; qwen3-8b's 64-token
// chunk: the gate/up pair's 192 tasks on 132 workers, then the down
// projection): the slices over the columns of the producer's full rounds
// run on the workers that round leaves idle, and only the rest wait for
// its end. Of the counts from parts (gemmKParts') up, the one whose slices
// end soonest after the producer's by the schedule's estimates
// (stream.TaskNs: the early slices' work past the last round, then the late
// ones' rounds), the fewest on a tie; 0 where op's x has no such producer.
func tailOverlapParts(u uses, op *ir.Op, workers int, parts, extra int64) int64 {
	p := u.soleWriter(op.In[0].Buf)
	if p == nil || p.Kind != ir.Linear || !p.Attr.Gemm || p.Attr.KParts > 1 || p.Out.Rank() != 2 ||
		p.Out.Shape[0] != op.Out.Shape[0] || p.Out.Shape[1] != op.LinearK() {
		return 0
	}
	W := int64(workers)
	M, K := op.Out.Shape[0], op.LinearK()
	if M > stream.GemmMaxRows {
		return 0
	}
	tasksP := (p.Out.Shape[1] + stream.GemmRows - 1) / stream.GemmRows
	tail := tasksP % W
	if tasksP <= W || tail == 0 || 2*tail > W {
		return 0
	}
	// a pair's tasks stream two weights (pairLinears, after this pass, folds a gate into p)
	pair := p.PairInput() >= 0 || pairedLater(u, p)
	pBytes := stream.GemmRows * p.LinearK() * p.In[1].DType().Size()
	if pair {
		pBytes *= 2
	}
	lastRound := stream.TaskNs(pBytes, true, pair, M)
	fullCols := (tasksP - tail) * stream.GemmRows // the producer's full rounds write x's columns [0, fullCols)
	rowTasks := (op.Out.Shape[1] + stream.GemmRows - 1) / stream.GemmRows
	ceil := func(a, b int64) int64 { return (a + b - 1) / b }
	best, bestCost := int64(0), int64(-1)
	for _, n := range gemmSliceCounts(K, extra) {
		if n < parts {
			continue
		}
		slice := stream.TaskNs(stream.GemmRows*K/n*op.In[1].DType().Size(), true, false, M)
		early := fullCols * n / K * rowTasks
		late := n*rowTasks - early
		cost := max(0, ceil(early, W-tail)*slice-lastRound) + ceil(late, W)*slice
		if bestCost < 0 || cost < bestCost {
			best, bestCost = n, cost
		}
	}
	return best
}

// pairedLater says whether p's epilogue reads the product of another GEMM
// stream over the same x (a gate projection), which pairLinears folds into
// p's tasks.
func pairedLater(u uses, p *ir.Op) bool {
	if p.Attr.Epi == nil {
		return false
	}
	for _, v := range p.In[p.Attr.Epi.First:] {
		if w := u.soleWriter(v.Buf); w != nil && w != p && w.Kind == ir.Linear && w.Attr.Gemm && w.In[0].Buf == p.In[0].Buf {
			return true
		}
	}
	return false
}
