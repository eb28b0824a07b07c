package lower

import "mpk/gocore/ir"

// inPlace turns "compute into a temporary, then copy_ it into an input" into
// a write straight into the input. Functionalization makes every KV-cache
// update look like copy(cache → T); index_copy into T; copy_(cache ← T):
// here T becomes the cache itself, so the cache is never copied.
func inPlace(g *ir.Graph) {
	u := analyze(g)
	var copies []*ir.Op
	for _, c := range g.Ops {
		if c.Kind == ir.Copy && c.Out.Buf.Kind == ir.Input && c.Out.IsWhole() && c.In[0].IsWhole() {
			copies = append(copies, c)
		}
	}
	for _, c := range copies {
		ci := -1
		for i, op := range g.Ops {
			if op == c {
				ci = i
				break
			}
		}
		x, t := c.Out.Buf, c.In[0].Buf
		if ci < 0 || t.Kind != ir.Temp || t.DType != x.DType || t.Numel != x.Numel || u.outputs[t.ID] {
			continue
		}
		aliasInto(g, ci, x, t)
	}
}

// aliasInto makes temp t share the memory of input x, deleting the copy at
// index ci (and a leading copy x → t), when no op can tell the difference.
func aliasInto(g *ir.Graph, ci int, x, t *ir.Buffer) bool {
	first := -1
	for i, op := range g.Ops {
		if op.Out.Buf == t {
			first = i
			break
		}
	}
	if first < 0 || first > ci {
		return false
	}
	p := g.Ops[first]
	seed := p.Kind == ir.Copy && p.In[0].Buf == x && p.In[0].IsWhole() && p.Out.IsWhole()
	if !seed && !p.Out.IsWhole() {
		return false
	}
	// The producer may read x only elementwise at the very element it writes.
	if !seed && touchesIn(p, x) {
		if p.Kind != ir.Elementwise {
			return false
		}
		for _, v := range p.In {
			if v.Buf == x && !sameLayout(v, ir.View{Buf: x, Offset: p.Out.Offset, Shape: p.Out.Shape, Strides: p.Out.Strides}) {
				return false
			}
		}
	}
	// Between the producer and the copy nothing else may see x.
	for _, op := range g.Ops[first+1 : ci] {
		if touches(op, x) {
			return false
		}
	}
	// After the copy, t and x must not diverge.
	for _, op := range g.Ops[ci+1:] {
		if op.Out.Buf == x || op.Out.Buf == t {
			return false
		}
	}
	dead := map[*ir.Op]bool{g.Ops[ci]: true}
	if seed {
		dead[p] = true
	}
	removeOps(g, dead)
	replaceBuffer(g, t, x)
	return true
}

func touchesIn(op *ir.Op, b *ir.Buffer) bool {
	for _, v := range op.In {
		if v.Buf == b {
			return true
		}
	}
	return false
}
