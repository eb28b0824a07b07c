package lower

import (
	"mpk/gocore/ir"
	"mpk/gocore/stream"
)

// pairLinears folds a Linear whose product only another Linear's epilogue
// reads (a gate projection, read by SiLU·mul in the up projection's store)
// into that Linear: both read the same x, so one task streams the rows
// [lo, hi) of both weights and meets the two products in its store
// (ir.Epilogue.Pair). A layer's MLP loses a dependent stage, a task entry
// per worker, and the gate's store and reload. Where both stream with x in
// registers (stream.Plan without tiles), or, with gemm, where both are GEMM
// streams on mma.sync (a prompt chunk's MLP: each block of x staged once for
// the rows of both weights, half the x bytes a weight byte; a chunk of up to
// GemmMaxRows rows: split_rows' blocks write parts of one temporary, which
// the whole-buffer analysis below does not pair), or, with tiles, where both
// are tile streams (a decode batch's MLP: x staged once for both weights,
// one stage, hop and staging fewer a layer).
func pairLinears(g *ir.Graph, gemm, tiles bool) {
	u := analyze(g)
	index := opIndex(g)
	written := stream.Writers(g)
	dead := map[*ir.Op]bool{}
	for _, up := range g.Ops {
		if !pairable(up, written, gemm, tiles) || up.Attr.Epi == nil || dead[up] {
			continue
		}
		epi := up.Attr.Epi
		for j, v := range up.EpiIn() {
			gate := u.soleWriter(v.Buf)
			if gate == nil || dead[gate] || !pairFits(g, u, index, gate, up, v, written, gemm, tiles) {
				continue
			}
			up.In[epi.First+j] = gate.In[1]
			epi.Pair, epi.PairDType = j+1, gate.Out.DType()
			up.Label = "pair:" + up.Label
			dead[gate] = true
			break
		}
	}
	removeOps(g, dead)
}

// pairable says whether op may take part in a pair: a Linear that streams
// its weights with x in registers (or, with gemm, as a GEMM stream; with
// tiles, as a tile stream), uncut along K, its weight rows K apart, with no
// epilogue of its own beyond the one that reads its partner.
func pairable(op *ir.Op, written func(*ir.Buffer) bool, gemm, tiles bool) bool {
	if op.Kind != ir.Linear || op.Attr.KParts > 1 || (op.Attr.Gemm && !gemm) || op.Attr.Residual || op.Out.Rank() != 2 ||
		op.In[1].Rank() != 2 || (op.Attr.Epi != nil && op.Attr.Epi.Pair > 0) {
		return false
	}
	p, ok := stream.For(op, written)
	return ok && (!p.Tiles || tiles && p.RowStride == p.K) && (!p.Gemm || p.RowStride == p.K)
}

// pairFits reports whether gate, the sole writer of up's epilogue input v,
// can fold into up: it reads the same x, its weight has up's shape and
// dtype, up alone reads its whole product element for element, and nothing
// between them writes what gate reads (gate's work moves to up's place).
func pairFits(g *ir.Graph, u uses, index map[*ir.Op]int, gate, up *ir.Op, v ir.View, written func(*ir.Buffer) bool,
	gemm, tiles bool) bool {
	if !pairable(gate, written, gemm, tiles) || gate.Attr.Epi != nil || gate.Attr.Gemm != up.Attr.Gemm || gate.XKey() != up.XKey() ||
		index[gate] > index[up] ||
		gate.Out.Buf.Kind != ir.Temp || !gate.Out.IsWhole() || !u.onlyReader(gate.Out.Buf, up) ||
		!equalShape(gate.Out.Shape, up.Out.Shape) || !equalShape(gate.In[1].Shape, up.In[1].Shape) ||
		gate.In[1].DType() != up.In[1].DType() || gate.LinearK() != up.LinearK() {
		return false
	}
	if v.Offset != gate.Out.Offset || !equalShape(v.Shape, up.Out.Shape) || !equalShape(v.Strides, gate.Out.Strides) {
		return false
	}
	return !writtenBetween(g, index[gate], index[up], gate.In)
}
