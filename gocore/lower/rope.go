package lower

import "mpk/gocore/ir"

// rope recognises rotary embedding as HF applies it:
// x*cos + cat(-x[..., h:], x[..., :h])*sin, and makes it one RoPE op that
// reads x, cos and sin, so the rotation needs no temporaries.
func rope(g *ir.Graph) {
	u := analyze(g)
	dead := map[*ir.Op]bool{}
	for _, e := range g.Ops {
		if e.Kind != ir.Elementwise || e.Out.Rank() == 0 {
			continue
		}
		s := uncast(e.Attr.Expr)
		if s.Op != ir.EAdd {
			continue
		}
		t0, t1 := factors(s.Args[0]), factors(s.Args[1])
		if len(t0) != 2 || len(t1) != 2 {
			continue
		}
		// Find which term holds the rotated x (a load of a Cat output).
		matched := false
		for swap := 0; swap < 2 && !matched; swap++ {
			a, b := t0, t1
			if swap == 1 {
				a, b = t1, t0
			}
			for ri := 0; ri < 2 && !matched; ri++ {
				rot, sin := b[ri], b[1-ri]
				if rot.Op != ir.ELoad || sin.Op != ir.ELoad {
					continue
				}
				x, ok := rotatedInput(u, e, e.In[rot.Input], dead)
				if !ok {
					continue
				}
				for xi := 0; xi < 2; xi++ {
					xl, cos := a[xi], a[1-xi]
					if xl.Op != ir.ELoad || cos.Op != ir.ELoad || !sameLayout(e.In[xl.Input], x) {
						continue
					}
					cat := u.soleWriter(e.In[rot.Input].Buf)
					neg := u.soleWriter(cat.In[0].Buf)
					dead[cat], dead[neg] = true, true
					e.Kind, e.Label = ir.RoPE, "rope"
					e.In = []ir.View{x, e.In[cos.Input], e.In[sin.Input]}
					e.Attr = ir.Attrs{}
					matched = true
					break
				}
			}
		}
	}
	removeOps(g, dead)
}

// rotatedInput checks that r (read by e) is cat(-x2, x1) of halves of one x
// along the last dim, each temp read only on this path, and returns x.
func rotatedInput(u uses, e *ir.Op, r ir.View, dead map[*ir.Op]bool) (ir.View, bool) {
	cat := u.soleWriter(r.Buf)
	if cat == nil || dead[cat] || cat.Kind != ir.Cat || len(cat.In) != 2 || cat.Attr.Dim != cat.Out.Rank()-1 ||
		!u.onlyReader(r.Buf, e) || !sameLayout(r, cat.Out) {
		return ir.View{}, false
	}
	neg := u.soleWriter(cat.In[0].Buf)
	if neg == nil || neg.Kind != ir.Elementwise || len(neg.In) != 1 || !u.onlyReader(cat.In[0].Buf, cat) || !sameLayout(cat.In[0], neg.Out) {
		return ir.View{}, false
	}
	if ne := uncast(neg.Attr.Expr); ne.Op != ir.ENeg || uncast(ne.Args[0]).Op != ir.ELoad {
		return ir.View{}, false
	}
	x2, x1 := neg.In[0], cat.In[1]
	last := x1.Rank() - 1
	h := x1.Shape[last]
	if x2.Buf != x1.Buf || x2.Shape[last] != h || x2.Offset != x1.Offset+h*x1.Strides[last] {
		return ir.View{}, false
	}
	for d := range x1.Shape {
		if x1.Shape[d] != x2.Shape[d] || x1.Strides[d] != x2.Strides[d] {
			return ir.View{}, false
		}
	}
	x := x1.Clone()
	x.Shape[last] = 2 * h
	return x, true
}
