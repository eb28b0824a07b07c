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

// maxInlineNodes bounds the expression an elementwise producer may have to be
// computed again in a consumer while other ops still read its result.
const maxInlineNodes = 16

// inlineProducers inlines elementwise producers into the elementwise ops that
// read them, where fuseElementwise cannot: the consumer reads a broadcast or
// a reshape of the whole result (a position scalar, a constant, an arange
// viewed [1, 1, 1, S]), or other ops read it too (a small producer is then
// computed again in the consumer). It runs after the pattern passes and CSE,
// on what they left as plain elementwise ops: a decode step's preamble (the
// mask, RoPE's angles) is chains of one-task ops, each link a hop of a few us
// before the first attention can start (bench/NOTES.md). Consumers go from
// the last: a chain folds into its end before a write between its links
// (the position's in-place increment) stops it.
func inlineProducers(g *ir.Graph) {
	for changed := true; changed; {
		changed = false
		u := analyze(g)
		index := opIndex(g)
		for j := len(g.Ops) - 1; j >= 0 && !changed; j-- {
			c := g.Ops[j]
			if c.Kind != ir.Elementwise {
				continue
			}
			for i, v := range c.In {
				p := u.soleWriter(v.Buf)
				if p == nil || p == c || p.Kind != ir.Elementwise || v.Buf.Kind != ir.Temp {
					continue
				}
				if !u.onlyReader(v.Buf, c) && exprNodes(p.Attr.Expr) > maxInlineNodes {
					continue
				}
				dims, ok := walkedDims(v, p)
				if !ok || writtenBetween(g, index[p], index[c]+1, p.In) { // c itself included: an in-place c
					continue
				}
				if ins, e := inlineWalked(c, i, p, dims); len(ins) <= ir.MaxInputs { // the task ABI's limit
					c.In, c.Attr.Expr = ins, e
					changed = true
					break
				}
			}
		}
		deadCode(g)
	}
}

// walkedDims matches the dims of v, c's view of producer p's whole result, to
// the result's: dims[d] = k where v's dim d walks the result's dim k, -1 where
// v broadcasts (size 1 or stride 0). ok when v starts where the result does,
// walks each of its dims longer than 1 exactly once, and p's inputs are
// views of p's shape (as every elementwise op's are).
func walkedDims(v ir.View, p *ir.Op) ([]int, bool) {
	out := p.Out
	if v.Offset != out.Offset || !out.IsWhole() {
		return nil, false
	}
	for _, w := range p.In {
		if len(w.Shape) != len(out.Shape) {
			return nil, false
		}
	}
	dims := make([]int, len(v.Shape))
	used := make([]bool, len(out.Shape))
	for d := range v.Shape {
		dims[d] = -1
		if v.Shape[d] == 1 || v.Strides[d] == 0 {
			continue
		}
		for k := range out.Shape {
			if !used[k] && out.Shape[k] == v.Shape[d] && out.Strides[k] == v.Strides[d] {
				dims[d], used[k] = k, true
				break
			}
		}
		if dims[d] < 0 {
			return nil, false
		}
	}
	for k, n := range out.Shape {
		if n > 1 && !used[k] {
			return nil, false
		}
	}
	return dims, true
}

// inlineWalked returns c's inputs and expression with p's expression in
// place of c's loads of input i, c's view of p's result walking it as dims
// says (walkedDims): p's inputs become views over c's shape and p's index
// along its dim k becomes c's along the dim that walks k (0 for a dim of
// size 1).
func inlineWalked(c *ir.Op, i int, p *ir.Op, dims []int) ([]ir.View, *ir.Expr) {
	from := make([]int, len(p.Out.Shape)) // p's dim k -> c's dim walking it, or -1
	for k := range from {
		from[k] = -1
	}
	for d, k := range dims {
		if k >= 0 {
			from[k] = d
		}
	}
	base := len(c.In)
	ins := append([]ir.View{}, c.In...)
	for _, w := range p.In {
		nw := ir.View{Buf: w.Buf, Offset: w.Offset, Shape: append([]int64(nil), c.Out.Shape...), Strides: make([]int64, len(c.Out.Shape))}
		for d, k := range dims {
			if k >= 0 {
				nw.Strides[d] = w.Strides[k]
			}
		}
		ins = append(ins, nw)
	}
	pe := p.Attr.Expr.Map(func(n *ir.Expr) *ir.Expr {
		switch n.Op {
		case ir.ELoad:
			return ir.Load(base + n.Input)
		case ir.EIndex:
			if from[n.Dim] < 0 {
				return ir.Const(0)
			}
			return ir.Index(from[n.Dim])
		}
		return n
	})
	e := c.Attr.Expr.Map(func(n *ir.Expr) *ir.Expr {
		if n.Op == ir.ELoad && n.Input == i {
			return pe
		}
		return n
	})
	return compactInputs(ins, e)
}

// exprNodes counts e's nodes (a shared node once).
func exprNodes(e *ir.Expr) int {
	n := 0
	e.Map(func(x *ir.Expr) *ir.Expr { n++; return x })
	return n
}

// foldRepeatedCat folds a cat of one view repeated along its last dim (RoPE's
// angles: cat(freqs, freqs)) into the elementwise ops that read all of it:
// each then runs over [..., k, n] instead of [..., k·n], reading the view with
// a stride of 0 along k, and the cat, a one-task link before the first
// attention, goes. A cat with any other reader stays.
func foldRepeatedCat(g *ir.Graph) {
	u := analyze(g)
	for _, cat := range g.Ops {
		last := cat.Out.Rank() - 1
		if cat.Kind != ir.Cat || cat.Attr.Dim != last || last < 0 || cat.Out.Buf.Kind != ir.Temp || !cat.Out.IsWhole() ||
			u.outputs[cat.Out.Buf.ID] || !repeatsOneView(cat.In) {
			continue
		}
		readers := u.readers[cat.Out.Buf.ID]
		ok := len(readers) > 0
		for _, c := range readers {
			ok = ok && splittable(c, cat)
		}
		if !ok {
			continue
		}
		a, k := cat.In[0], int64(len(cat.In))
		for _, c := range readers {
			for i, v := range c.In {
				if v.Buf == cat.Out.Buf {
					c.In[i] = splitLast(a, k, 0)
				} else {
					c.In[i] = splitLast(v, k, v.Shape[last]/k*v.Strides[last])
				}
			}
			c.Out = splitLast(c.Out, k, c.Out.Shape[last]/k*c.Out.Strides[last])
		}
	}
	deadCode(g)
}

// repeatsOneView reports whether vs are one view, at least twice.
func repeatsOneView(vs []ir.View) bool {
	for _, v := range vs[1:] {
		if !sameLayout(v, vs[0]) {
			return false
		}
	}
	return len(vs) > 1
}

// splittable reports whether c is an elementwise op over cat's shape that reads
// cat's result whole and nothing at an index it computes (no EIndex: the split
// would change its meaning).
func splittable(c, cat *ir.Op) bool {
	if c.Kind != ir.Elementwise || !c.Out.IsWhole() || !equalShape(c.Out.Shape, cat.Out.Shape) {
		return false
	}
	indexed := false
	c.Attr.Expr.Map(func(n *ir.Expr) *ir.Expr { indexed = indexed || n.Op == ir.EIndex; return n })
	for _, v := range c.In {
		if v.Buf == cat.Out.Buf && !sameLayout(v, cat.Out) || len(v.Shape) != len(cat.Out.Shape) {
			return false
		}
	}
	return !indexed
}

// splitLast views v's last dim as [k, n]: the n elements stride as before
// and the k blocks by outer. A view over the cat's shape (last dim k·n)
// passes n·stride; outer = 0 repeats v itself (last dim n) k times.
func splitLast(v ir.View, k, outer int64) ir.View {
	last := len(v.Shape) - 1
	n := v.Shape[last]
	if outer != 0 {
		n /= k
	}
	w := ir.View{Buf: v.Buf, Offset: v.Offset}
	w.Shape = append(append(append([]int64(nil), v.Shape[:last]...), k), n)
	w.Strides = append(append(append([]int64(nil), v.Strides[:last]...), outer), v.Strides[last])
	return w
}
