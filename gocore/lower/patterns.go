package lower

import "mpk/gocore/ir"

// The pattern passes recognise task ops by what an expression computes,
// looking through dtype casts, operand order and pow-vs-mul spellings.

// uncast skips float casts.
func uncast(e *ir.Expr) *ir.Expr {
	for e.Op == ir.ECast && e.DType.IsFloat() {
		e = e.Args[0]
	}
	return e
}

// factors flattens a product (through casts) into its factors.
func factors(e *ir.Expr) []*ir.Expr {
	e = uncast(e)
	if e.Op != ir.EMul {
		return []*ir.Expr{e}
	}
	return append(factors(e.Args[0]), factors(e.Args[1])...)
}

// isSquareOfLoad reports whether e computes in0² (pow 2 or in0·in0).
func isSquareOfLoad(e *ir.Expr) bool {
	e = uncast(e)
	isLoad0 := func(x *ir.Expr) bool { x = uncast(x); return x.Op == ir.ELoad && x.Input == 0 }
	switch e.Op {
	case ir.EPow:
		c := uncast(e.Args[1])
		return isLoad0(e.Args[0]) && c.Op == ir.EConst && c.Const == 2
	case ir.EMul:
		return isLoad0(e.Args[0]) && isLoad0(e.Args[1])
	}
	return false
}

// rsqrtOfLoadPlusEps matches rsqrt(in_j + eps) and returns j and eps.
func rsqrtOfLoadPlusEps(e *ir.Expr) (int, float64, bool) {
	e = uncast(e)
	if e.Op != ir.ERsqrt {
		return 0, 0, false
	}
	s := uncast(e.Args[0])
	if s.Op == ir.ELoad {
		return s.Input, 0, true
	}
	if s.Op != ir.EAdd {
		return 0, 0, false
	}
	a, b := uncast(s.Args[0]), uncast(s.Args[1])
	if a.Op == ir.EConst {
		a, b = b, a
	}
	if a.Op == ir.ELoad && b.Op == ir.EConst {
		return a.Input, b.Const, true
	}
	return 0, 0, false
}

// rowBroadcast reports whether v varies only along its last dim (a norm weight).
func rowBroadcast(v ir.View) bool {
	for d := 0; d < v.Rank()-1; d++ {
		if v.Shape[d] != 1 && v.Strides[d] != 0 {
			return false
		}
	}
	return true
}

// invRMS matches a factor computing rsqrt(mean(x²) + eps), either inline or
// as a load of a separately computed (row-broadcast) temporary.
func invRMS(u uses, e *ir.Op, f *ir.Expr) (red, sq *ir.Op, eps float64, ok bool) {
	reader, expr, ins := e, f, e.In
	if f.Op == ir.ELoad {
		rs := u.soleWriter(e.In[f.Input].Buf)
		if rs == nil || rs.Kind != ir.Elementwise || len(rs.In) != 1 || !u.onlyReader(rs.Out.Buf, e) || e.In[f.Input].Strides[e.In[f.Input].Rank()-1] != 0 {
			return nil, nil, 0, false
		}
		reader, expr, ins = rs, rs.Attr.Expr, rs.In
	}
	j, eps, isR := rsqrtOfLoadPlusEps(expr)
	if !isR {
		return nil, nil, 0, false
	}
	r := u.soleWriter(ins[j].Buf)
	if r == nil || r.Kind != ir.Reduce || r.Attr.Reduce != "mean" || r.Attr.Dims != 1 || !u.onlyReader(r.Out.Buf, reader) {
		return nil, nil, 0, false
	}
	// Row i must be scaled by row i's mean: the mean is read broadcast along
	// the last dim and row-aligned with x.
	if f.Op != ir.ELoad && !readsRowwise(ins[j], r.Out) {
		return nil, nil, 0, false
	}
	if f.Op == ir.ELoad && (!readsRowwise(e.In[f.Input], reader.Out) || !readsRowwise(ins[j], r.Out) && !sameRows(ins[j], r.Out)) {
		return nil, nil, 0, false
	}
	s := u.soleWriter(r.In[0].Buf)
	if s == nil || s.Kind != ir.Elementwise || len(s.In) != 1 || !isSquareOfLoad(s.Attr.Expr) || !u.onlyReader(s.Out.Buf, r) || !sameLayout(r.In[0], s.Out) {
		return nil, nil, 0, false
	}
	return r, s, eps, true
}

// readsRowwise reports whether v reads the row-per-index buffer rows (the
// kept dims of a last-dim reduction, contiguous) broadcast along its last dim:
// element [i..., j] of v is rows[i...] for every j.
func readsRowwise(v, rows ir.View) bool {
	r := v.Rank() - 1
	if r < 0 || v.Strides[r] != 0 || v.Buf != rows.Buf || v.Offset != rows.Offset {
		return false
	}
	return sameRows(ir.View{Buf: v.Buf, Offset: v.Offset, Shape: v.Shape[:r], Strides: v.Strides[:r]}, rows)
}

// sameRows reports whether v addresses rows's elements in the same order,
// ignoring size-1 dims (rows may keep or drop the reduced dim).
func sameRows(v, rows ir.View) bool {
	var a, b []int64
	for d, n := range v.Shape {
		if n != 1 {
			a = append(a, n, v.Strides[d])
		}
	}
	for d, n := range rows.Shape {
		if n != 1 {
			b = append(b, n, rows.Strides[d])
		}
	}
	return v.Buf == rows.Buf && v.Offset == rows.Offset && equalShape(a, b)
}

// rmsNorm recognises x·rsqrt(mean(x²)+eps)·w: a square feeding a mean over the
// last dim, whose result scales the same x, optionally times a weight.
func rmsNorm(g *ir.Graph) {
	u := analyze(g)
	dead := map[*ir.Op]bool{}
	for _, e := range g.Ops {
		if e.Kind != ir.Elementwise || dead[e] {
			continue
		}
		fs := factors(e.Attr.Expr)
		if len(fs) < 2 || len(fs) > 3 {
			continue
		}
		// First the inverse RMS factor; it names the x that was squared.
		var red, sq *ir.Op
		eps, ri := 0.0, -1
		for i, f := range fs {
			if r, q, ep, ok := invRMS(u, e, f); ok {
				red, sq, eps, ri = r, q, ep, i
				break
			}
		}
		if red == nil {
			continue
		}
		var x, w *ir.View
		ok := true
		for i, f := range fs {
			if i == ri {
				continue
			}
			if f.Op != ir.ELoad {
				ok = false
				break
			}
			v := e.In[f.Input]
			switch {
			case x == nil && sameLayout(v, sq.In[0]):
				x = &v
			case w == nil && rowBroadcast(v) && v.Strides[v.Rank()-1] != 0:
				w = &v
			default:
				ok = false
			}
		}
		if !ok || x == nil {
			continue
		}
		if f := fs[ri]; f.Op == ir.ELoad {
			dead[u.soleWriter(e.In[f.Input].Buf)] = true
		}
		in := []ir.View{*x}
		if w != nil {
			in = append(in, *w)
		}
		e.Kind, e.Label, e.In = ir.RMSNorm, "rmsnorm", in
		e.Attr = ir.Attrs{Eps: eps, HasWeight: w != nil}
		dead[red], dead[sq] = true, true
	}
	removeOps(g, dead)
	castIntoNorm(g)
}

// castIntoNorm lets RMSNorm read a low-precision x directly when x was only
// upcast for it (HF's hidden_states.to(float32)): the norm computes in fp32.
func castIntoNorm(g *ir.Graph) {
	u := analyze(g)
	dead := map[*ir.Op]bool{}
	for _, n := range g.Ops {
		if n.Kind != ir.RMSNorm {
			continue
		}
		c := u.soleWriter(n.In[0].Buf)
		if c == nil || c.Kind != ir.Elementwise || len(c.In) != 1 || !u.onlyReader(n.In[0].Buf, n) || !sameLayout(n.In[0], c.Out) {
			continue
		}
		if e := c.Attr.Expr; e.Op == ir.ECast && e.DType == ir.F32 && e.Args[0].Op == ir.ELoad {
			n.In[0] = c.In[0]
			dead[c] = true
		}
	}
	removeOps(g, dead)
}

// linear recognises x @ Wᵀ with W a 2-d input (a weight): mm(x, t(W)).
func linear(g *ir.Graph) {
	for _, op := range g.Ops {
		if op.Kind != ir.Matmul || op.In[0].Shape[0] != 1 {
			continue
		}
		b := op.In[1] // [1, K, N] viewing W[N, K] transposed
		if b.Buf.Kind != ir.Input || b.Strides[1] != 1 || b.Shape[2] > 1 && b.Strides[2] < b.Shape[1] {
			continue
		}
		W := ir.View{Buf: b.Buf, Offset: b.Offset, Shape: []int64{b.Shape[2], b.Shape[1]}, Strides: []int64{b.Strides[2], 1}}
		x := unbatch(op.In[0])
		op.Kind, op.Label = ir.Linear, "linear"
		op.In = []ir.View{x, W}
		op.Out = unbatch(op.Out)
	}
}

// fuseResidual folds "out = linear(x) + r" into the Linear's store.
func fuseResidual(g *ir.Graph) {
	u := analyze(g)
	dead := map[*ir.Op]bool{}
	for _, e := range g.Ops {
		if e.Kind != ir.Elementwise || len(e.In) != 2 {
			continue
		}
		a := uncast(e.Attr.Expr)
		if a.Op != ir.EAdd || uncast(a.Args[0]).Op != ir.ELoad || uncast(a.Args[1]).Op != ir.ELoad || e.Attr.Expr.Op != ir.ECast {
			continue
		}
		for i := 0; i < 2; i++ {
			lin := u.soleWriter(e.In[i].Buf)
			r := e.In[1-i]
			if lin == nil || lin.Kind != ir.Linear || lin.Attr.Residual || dead[lin] || !u.onlyReader(lin.Out.Buf, e) || !e.In[i].IsWhole() || !lin.Out.IsWhole() ||
				lin.Out.DType() != e.Out.DType() || !equalShape(r.Shape, e.Out.Shape) || r.Strides[r.Rank()-1] == 0 {
				continue
			}
			// The add moves to the linear: its residual must not change in
			// between, and the linear now writes the sum's buffer early.
			rst, ost := viewAs2D(r, lin.Out.Shape), viewAs2D(e.Out, lin.Out.Shape)
			if rst == nil || ost == nil || e.Out.Buf.Kind != ir.Temp || writtenBetween(g, lin.ID, e.ID, []ir.View{r, e.Out}) {
				continue
			}
			lin.In = append(lin.In, ir.View{Buf: r.Buf, Offset: r.Offset, Shape: lin.Out.Shape, Strides: rst})
			lin.Out = ir.View{Buf: e.Out.Buf, Offset: e.Out.Offset, Shape: lin.Out.Shape, Strides: ost}
			lin.Attr.Residual, lin.Label = true, "linear+residual"
			dead[e] = true
			break
		}
	}
	removeOps(g, dead)
}

// viewAs2D returns strides that view v as the 2-d shape, or nil.
func viewAs2D(v ir.View, shape []int64) []int64 {
	st, ok := viewStrides(v.Shape, v.Strides, shape)
	if !ok {
		return nil
	}
	return st
}
