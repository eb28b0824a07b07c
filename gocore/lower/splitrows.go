package lower

import (
	"mpk/gocore/ir"
	"mpk/gocore/stream"
)

// splitLinearRows cuts a Linear whose x has more rows than any weight stream
// takes (stream.For: the tensor-core tiles stage x's rows in shared memory)
// into Linears over blocks of rows that do stream: each block reads the
// weights once, so a step reads them ⌈M/rows⌉ times instead of M times (the
// plain Linear reads them once per row). llama-3.2-1b at batch 16: the down
// projection's x (16 × 8,192) streams as four blocks of 4 (stream.MaxRows);
// a 64-token chunk's q/k/v as four blocks of 16. The blocks write disjoint
// rows of the output and read the same rows of every other operand. A
// Linear keeps its rows whole when an operand other than the weight does
// not have x's rows as its first dim, or a folded expression reads the row
// index.
func splitLinearRows(g *ir.Graph) {
	written := stream.Writers(g)
	var ops []*ir.Op
	for _, op := range g.Ops {
		rows, M := int64(0), int64(0)
		if op.Kind == ir.Linear && rowSliceable(op) {
			M = op.Out.Shape[0]
			if _, ok := stream.For(op, written); !ok {
				rows = stream.MaxRows(op, written)
			}
		}
		if rows <= 0 || rows >= M {
			ops = append(ops, op)
			continue
		}
		ops = append(ops, sliceRowBlocks(op, rows)...)
	}
	g.Ops = ops
}

// rowSliceable: every operand but the weights (In[1], a pair's second) and
// the output have x's rows as dim 0, and no folded expression reads an index.
func rowSliceable(op *ir.Op) bool {
	if op.Out.Rank() == 0 {
		return false
	}
	M, pair := op.Out.Shape[0], op.PairInput()
	for i, v := range append([]ir.View{op.Out}, op.In...) {
		if i == 2 || pair >= 0 && i == pair+1 { // In[1] and a pair's second weight
			continue
		}
		if v.Rank() == 0 || v.Shape[0] != M {
			return false
		}
	}
	if p := op.Attr.Pro; p != nil && p.Expr != nil && hasIndex(p.Expr) {
		return false
	}
	e := op.Attr.Epi
	return e == nil || e.Expr == nil || !hasIndex(e.Expr)
}

// sliceRowBlocks is op as Linears over blocks of rows of x (the last block
// shorter where rows does not divide x's).
func sliceRowBlocks(op *ir.Op, rows int64) []*ir.Op {
	var ops []*ir.Op
	for M, r0 := op.Out.Shape[0], int64(0); r0 < M; r0 += rows {
		ops = append(ops, sliceRows(op, r0, min(rows, M-r0)))
	}
	return ops
}

// sliceRows is op on rows [r0, r0+n) of x: every operand but the weights,
// and the output, cut to those rows along dim 0.
func sliceRows(op *ir.Op, r0, n int64) *ir.Op {
	c := *op
	c.In = make([]ir.View, len(op.In))
	pair := op.PairInput()
	for i, v := range op.In {
		if i == 1 || i == pair {
			c.In[i] = v.Clone()
			continue
		}
		c.In[i] = sliceView(v, 0, r0, n)
	}
	c.Out = sliceView(op.Out, 0, r0, n)
	return &c
}

// sliceView is v's indices [lo, lo+n) along dim d.
func sliceView(v ir.View, d int, lo, n int64) ir.View {
	c := v.Clone()
	c.Offset += lo * v.Strides[d]
	c.Shape[d] = n
	return c
}
