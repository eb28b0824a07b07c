package lower

import "mpk/gocore/ir"

// fuseEpilogue folds an elementwise op that reads a Linear's product into
// that Linear's store (SiLU·mul into the up projection: it reads the gate
// projection's output at the same index). The op's stage disappears, and so
// does the recomputation of SiLU·mul by every task of the down projection,
// which otherwise folds it into its x as a prologue. The Linear must be the
// last writer of the op's inputs, so the other inputs are ready when its
// tasks store.
func fuseEpilogue(g *ir.Graph) {
	u := analyze(g)
	index := opIndex(g)
	dead := map[*ir.Op]bool{}
	for _, e := range g.Ops {
		if e.Kind != ir.Elementwise || e.Out.Buf.Kind != ir.Temp || !e.Out.IsWhole() || u.outputs[e.Out.Buf.ID] ||
			len(u.writers[e.Out.Buf.ID]) != 1 || hasIndex(e.Attr.Expr) {
			continue
		}
		for i := range e.In {
			lin := u.soleWriter(e.In[i].Buf)
			if lin == nil || dead[lin] || !epilogueFits(g, u, index, lin, e, i) {
				continue
			}
			shape := lin.Out.Shape
			var extra []ir.View
			remap := map[int]int{i: 0}
			for j, v := range e.In {
				if j != i {
					extra = append(extra, ir.View{Buf: v.Buf, Offset: v.Offset, Shape: shape, Strides: viewAs2D(v, shape)})
					remap[j] = len(extra)
				}
			}
			expr := e.Attr.Expr.Map(func(n *ir.Expr) *ir.Expr {
				if n.Op == ir.ELoad {
					return ir.Load(remap[n.Input])
				}
				return n
			})
			lin.Attr.Epi = &ir.Epilogue{First: len(lin.In), Expr: expr, DType: lin.Out.DType()}
			lin.In = append(lin.In, extra...)
			lin.Out = ir.View{Buf: e.Out.Buf, Offset: e.Out.Offset, Shape: shape, Strides: viewAs2D(e.Out, shape)}
			lin.Label += "+" + elementwiseLabel(e)
			dead[e] = true
			break
		}
	}
	removeOps(g, dead)
}

// epilogueFits reports whether elementwise e, whose input i is lin's whole
// product read element for element, can move into lin's store.
func epilogueFits(g *ir.Graph, u uses, index map[*ir.Op]int, lin, e *ir.Op, i int) bool {
	if len(e.In)-1 > ir.MaxEpilogueInputs || lin.Kind != ir.Linear || lin.Attr.Residual || lin.Attr.Epi != nil || lin.Attr.Pro != nil || !lin.Out.IsWhole() ||
		lin.Out.Buf.Kind != ir.Temp || !u.onlyReader(lin.Out.Buf, e) || index[lin] > index[e] {
		return false
	}
	shape := lin.Out.Shape
	if st := viewAs2D(e.In[i], shape); st == nil || e.In[i].Offset != lin.Out.Offset || !equalShape(st, lin.Out.Strides) {
		return false
	}
	if viewAs2D(e.Out, shape) == nil {
		return false
	}
	for j, v := range e.In {
		if j == i {
			continue
		}
		if v.Buf == lin.Out.Buf || v.Buf == e.Out.Buf || viewAs2D(v, shape) == nil {
			return false
		}
		// The other inputs must be complete before lin runs and stay as they
		// are until e would have read them.
		for _, w := range u.writers[v.Buf.ID] {
			if index[w] >= index[lin] && index[w] < index[e] {
				return false
			}
		}
	}
	// lin now writes e's output early: nothing in between may touch it.
	return !touchedBetween(g, lin, e, e.Out.Buf)
}
