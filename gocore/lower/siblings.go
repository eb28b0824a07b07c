package lower

import "mpk/gocore/ir"

// shareSiblingWorkers splits the workers among sibling Linears: a run of
// Linears, one after another in the program, that read the same x through
// the same prologue and none of which reads another's product (a layer's
// q, k and v projections). Each would otherwise spread over every worker,
// and each worker would run one task of each in turn: k's and v's tasks of
// one or two pages (llama-3.2-1b: 1.8 us a task for 16 KiB) after q's, the
// stage taking 12.8 us for 12 MiB. With a share of the workers in
// proportion to its rows, each worker streams one task of the stage.
func shareSiblingWorkers(g *ir.Graph, workers int) {
	for i := 0; i < len(g.Ops); {
		j := i + 1
		for j < len(g.Ops) && siblings(g.Ops[i:j], g.Ops[j]) {
			j++
		}
		if j-i > 1 {
			var rows int64
			for _, op := range g.Ops[i:j] {
				rows += weightRows(op)
			}
			for _, op := range g.Ops[i:j] {
				op.Attr.Workers = max(1, int64(workers)*weightRows(op)/rows)
			}
		}
		i = j
	}
}

// siblings says whether Linear op may join the run: it reads the run's x
// through the same prologue (none, or an RMSNorm), nothing in the run reads
// its product and it reads none of theirs, and neither it nor the run is cut
// along K.
func siblings(run []*ir.Op, op *ir.Op) bool {
	first := run[0]
	return shareable(first) && shareable(op) && first.XKey() == op.XKey() && independent(run, op)
}

// independent says whether op and every op of run neither read each
// other's products nor write one buffer.
func independent(run []*ir.Op, op *ir.Op) bool {
	for _, r := range run {
		if readsBuf(op.In, r.Out.Buf) || readsBuf(r.In, op.Out.Buf) || r.Out.Buf == op.Out.Buf {
			return false
		}
	}
	return true
}

// weightRows is the weight rows a Linear streams: its output's columns, twice
// for a pair (ir.Epilogue.Pair).
func weightRows(op *ir.Op) int64 {
	if _, ok := op.PairWeight(); ok {
		return 2 * op.Out.Shape[1]
	}
	return op.Out.Shape[1]
}

func shareable(op *ir.Op) bool {
	return op.Kind == ir.Linear && op.Attr.KParts <= 1 && !op.Attr.Gemm && op.Out.Rank() == 2 &&
		(op.Attr.Pro == nil || op.Attr.Pro.Kind == ir.RMSNorm)
}
