package lower

import "mpk/gocore/ir"

// fuseElementwise inlines an elementwise producer into its only consumer when
// the consumer reads the producer's whole output in the same layout, so chains
// like cast → pow or silu → mul run as one task op with no temporary.
func fuseElementwise(g *ir.Graph) {
	// Each sweep fuses every pair it can without touching an op twice (so the
	// use index stays true for what it checks); chains take several sweeps.
	for changed := true; changed; {
		changed = false
		u := analyze(g)
		index := opIndex(g)
		touched, fused := map[*ir.Op]bool{}, map[*ir.Op]bool{}
		for _, c := range g.Ops {
			if c.Kind != ir.Elementwise || touched[c] {
				continue
			}
			for i, v := range c.In {
				p := u.soleWriter(v.Buf)
				if p == nil || touched[p] || p.Kind != ir.Elementwise || v.Buf.Kind != ir.Temp || !u.onlyReader(v.Buf, c) || !sameLayout(v, p.Out) {
					continue
				}
				if writtenBetween(g, index[p], index[c], p.In) {
					continue
				}
				inline(c, i, p)
				touched[p], touched[c] = true, true
				fused[p] = true
				changed = true
				break
			}
		}
		removeOps(g, fused)
	}
}

// writtenBetween reports whether an op strictly between i and j writes a buffer of vs.
func writtenBetween(g *ir.Graph, i, j int, vs []ir.View) bool {
	for _, op := range g.Ops[i+1 : j] {
		for _, v := range vs {
			if op.Out.Buf == v.Buf {
				return true
			}
		}
	}
	return false
}

// inline substitutes producer p's expression for every load of input i of c.
func inline(c *ir.Op, i int, p *ir.Op) {
	base := len(c.In)
	pe := p.Attr.Expr.Map(func(n *ir.Expr) *ir.Expr {
		if n.Op == ir.ELoad {
			return ir.Load(base + n.Input)
		}
		return n
	})
	target := c.In[i]
	ins := append(append([]ir.View{}, c.In...), p.In...)
	e := c.Attr.Expr.Map(func(n *ir.Expr) *ir.Expr {
		if n.Op == ir.ELoad && sameLayout(ins[n.Input], target) {
			return pe
		}
		return n
	})
	c.In, c.Attr.Expr = compactInputs(ins, e)
}

// compactInputs drops unread inputs and merges duplicate views.
func compactInputs(ins []ir.View, e *ir.Expr) ([]ir.View, *ir.Expr) {
	used := e.Loads()
	var out []ir.View
	remap := map[int]int{}
	for i, v := range ins {
		if !used[i] {
			continue
		}
		j := -1
		for k, w := range out {
			if sameLayout(v, w) {
				j = k
				break
			}
		}
		if j < 0 {
			out = append(out, v)
			j = len(out) - 1
		}
		remap[i] = j
	}
	e = e.Map(func(n *ir.Expr) *ir.Expr {
		if n.Op == ir.ELoad {
			return ir.Load(remap[n.Input])
		}
		return n
	})
	return out, e
}

// foldCopies lets an op store straight into the destination of a layout copy
// (attention's [B, H, S, D] output copied to [B, S, H, D] by
// transpose().contiguous()): the op writes the permuted view and the copy dies.
func foldCopies(g *ir.Graph) {
	u := analyze(g)
	dead := map[*ir.Op]bool{}
	for _, c := range g.Ops {
		if c.Kind != ir.Copy || c.Out.Buf.Kind != ir.Temp || !c.Out.IsWhole() {
			continue
		}
		t := c.In[0].Buf
		p := u.soleWriter(t)
		if p == nil || dead[p] || t.Kind != ir.Temp || !u.onlyReader(t, c) || !p.Out.IsContiguous() {
			continue
		}
		if touchedBetween(g, p, c, c.Out.Buf) {
			continue // the copy's write cannot move up past a use of its destination
		}
		if st, ok := permutedStrides(p.Out, c.In[0], c.Out); ok {
			p.Out = ir.View{Buf: c.Out.Buf, Shape: p.Out.Shape, Strides: st}
			dead[c] = true
		}
	}
	removeOps(g, dead)
}

// touchedBetween reports whether an op strictly between a and b reads or writes buf.
func touchedBetween(g *ir.Graph, a, b *ir.Op, buf *ir.Buffer) bool {
	in := false
	for _, op := range g.Ops {
		switch {
		case op == a:
			in = true
		case op == b:
			return false
		case in && touches(op, buf):
			return true
		}
	}
	return false
}

// permutedStrides maps the contiguous layout out (over buffer T) through a
// copy src → dst, where src is a permutation of T's dims: it returns strides
// that address, for every index of out, the dst element its value lands in.
func permutedStrides(out, src, dst ir.View) ([]int64, bool) {
	if src.Offset != 0 || src.Numel() != out.Numel() {
		return nil, false
	}
	used := make([]bool, src.Rank())
	st := make([]int64, out.Rank())
	for k := range out.Shape {
		if out.Shape[k] == 1 {
			continue
		}
		found := false
		for d := range src.Shape {
			if !used[d] && src.Shape[d] == out.Shape[k] && src.Strides[d] == out.Strides[k] {
				used[d], found = true, true
				st[k] = dst.Strides[d]
				break
			}
		}
		if !found {
			return nil, false
		}
	}
	return st, true
}
