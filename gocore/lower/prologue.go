package lower

import "mpk/gocore/ir"

// fusePrologue folds an RMSNorm or an elementwise op (SiLU·mul) whose output
// only Linears read as x into those Linears: each task recomputes x while
// staging it (a few KB from L2) and the op's separate stage, with its
// synchronisation, disappears. Every reader gets its own copy of the prologue.
func fusePrologue(g *ir.Graph) {
	u := analyze(g)
	index := make(map[*ir.Op]int, len(g.Ops))
	for i, op := range g.Ops {
		index[op] = i
	}
	dead := map[*ir.Op]bool{}
	for _, p := range g.Ops {
		if p.Kind != ir.RMSNorm && p.Kind != ir.Elementwise || p.Out.Buf.Kind != ir.Temp || !p.Out.IsWhole() || u.outputs[p.Out.Buf.ID] {
			continue
		}
		if p.Kind == ir.Elementwise && hasIndex(p.Attr.Expr) {
			continue // index expressions mean something else in x's shape
		}
		readers := u.readers[p.Out.Buf.ID]
		ok := len(readers) > 0 && len(u.writers[p.Out.Buf.ID]) == 1
		var views [][]ir.View
		for _, l := range readers {
			if !ok {
				break
			}
			if l.Kind != ir.Linear || l.Attr.Pro != nil || l.In[0].Buf != p.Out.Buf || !l.In[0].IsWhole() || l.In[1].Buf == p.Out.Buf ||
				l.Attr.Residual && l.In[2].Buf == p.Out.Buf || writtenBetween(g, index[p], index[l], p.In) {
				ok = false
				break
			}
			var vs []ir.View
			for _, v := range p.In {
				st, can := viewStrides(v.Shape, v.Strides, l.In[0].Shape)
				if !can {
					ok = false
					break
				}
				vs = append(vs, ir.View{Buf: v.Buf, Offset: v.Offset, Shape: l.In[0].Shape, Strides: st})
			}
			views = append(views, vs)
		}
		if !ok {
			continue
		}
		for i, l := range readers {
			l.Attr.Pro = &ir.Prologue{Kind: p.Kind, First: len(l.In), Expr: p.Attr.Expr, Eps: p.Attr.Eps,
				HasWeight: p.Attr.HasWeight, DType: p.Out.DType()}
			l.In = append(append([]ir.View{views[i][0]}, l.In[1:]...), views[i][1:]...)
			if p.Kind == ir.RMSNorm {
				l.Label = "rmsnorm+" + l.Label
			} else {
				l.Label = elementwiseLabel(p) + "+" + l.Label
			}
		}
		dead[p] = true
	}
	removeOps(g, dead)
}

func hasIndex(e *ir.Expr) bool {
	found := false
	e.Map(func(n *ir.Expr) *ir.Expr {
		found = found || n.Op == ir.EIndex
		return n
	})
	return found
}
