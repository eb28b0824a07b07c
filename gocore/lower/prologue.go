package lower

import "mpk/gocore/ir"

// fusePrologue folds an RMSNorm or an elementwise op (SiLU·mul) whose output
// only Linears read as x into those Linears: each task recomputes x while
// staging it (a few KB from L2) and the op's separate stage, with its
// synchronisation, disappears. Every reader gets its own copy of the prologue.
func fusePrologue(g *ir.Graph) {
	u := analyze(g)
	index := opIndex(g)
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
			if l.Kind != ir.Linear || l.Attr.Pro != nil || l.Attr.Gemm || l.In[0].Buf != p.Out.Buf || !l.In[0].IsWhole() || l.In[1].Buf == p.Out.Buf ||
				l.Attr.Residual && l.In[2].Buf == p.Out.Buf || l.Attr.Epi != nil && readsBuf(l.EpiIn(), p.Out.Buf) ||
				writtenBetween(g, index[p], index[l], p.In) {
				ok = false
				break
			}
			var vs []ir.View
			for _, v := range p.In {
				w, can := viewAs(v, l.In[0].Shape)
				if !can {
					ok = false
					break
				}
				vs = append(vs, w)
			}
			views = append(views, vs)
		}
		if !ok {
			continue
		}
		for i, l := range readers {
			at := prologueAt(l)
			if l.Attr.Epi != nil {
				l.Attr.Epi.First += len(views[i]) - 1
			}
			l.Attr.Pro = &ir.Prologue{Kind: p.Kind, First: at, Expr: p.Attr.Expr, Eps: p.Attr.Eps,
				HasWeight: p.Attr.HasWeight, DType: p.Out.DType()}
			rest := append([]ir.View{}, l.In[at:]...)
			l.In = append(append(append([]ir.View{views[i][0]}, l.In[1:at]...), views[i][1:]...), rest...)
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

// fuseMergePrologue folds split-KV attention's merge into the Linears that
// read its output as x (the o projection): each task merges the partials
// while it stages x, and the merge's stage, with its synchronisation,
// disappears. It runs after splitAttention made the merges. x must be the
// whole merge output of one query per head read as [B, H·Dv], so that
// x[m, h·Dv+d] is the merge of batch row m, head h, element d; and B must be
// 1: every task of the Linear merges all of x, so at B > 1 the merges of
// its ~workers tasks cost more than one stage of merges (a warp per (row,
// head) pair) and the o projection staging a plain x.
func fuseMergePrologue(g *ir.Graph) {
	u := analyze(g)
	index := opIndex(g)
	dead := map[*ir.Op]bool{}
	for _, p := range g.Ops {
		if p.Kind != ir.AttnMerge || p.Out.Buf.Kind != ir.Temp || !p.Out.IsWhole() || u.outputs[p.Out.Buf.ID] ||
			len(u.writers[p.Out.Buf.ID]) != 1 {
			continue
		}
		B, H, Sq, Dv := p.Out.Shape[0], p.Out.Shape[1], p.Out.Shape[2], p.Out.Shape[3]
		readers := u.readers[p.Out.Buf.ID]
		ok := Sq == 1 && B == 1 && len(readers) > 0
		for _, l := range readers {
			x := l.In[0]
			if l.Kind != ir.Linear || l.Attr.Pro != nil || x.Buf != p.Out.Buf || !x.IsWhole() || x.Rank() != 2 ||
				x.Shape[0] != B || x.Shape[1] != H*Dv || l.In[1].Buf == p.Out.Buf ||
				l.Attr.Residual && l.In[2].Buf == p.Out.Buf || l.Attr.Epi != nil && readsBuf(l.EpiIn(), p.Out.Buf) ||
				writtenBetween(g, index[p], index[l], p.In) {
				ok = false
				break
			}
		}
		if !ok {
			continue
		}
		for _, l := range readers {
			l.Attr.Pro = &ir.Prologue{Kind: ir.AttnMerge, First: prologueAt(l), DType: p.Out.DType()}
			l.In[0] = p.In[0]
			l.Label = "attn_merge+" + l.Label
		}
		dead[p] = true
	}
	removeOps(g, dead)
}

// prologueAt is where a prologue's inputs go in Linear l's inputs: before
// the epilogue's, which stay last.
func prologueAt(l *ir.Op) int {
	if l.Attr.Epi != nil {
		return l.Attr.Epi.First
	}
	return len(l.In)
}

// readsBuf reports whether any of vs is a view of buf.
func readsBuf(vs []ir.View, buf *ir.Buffer) bool {
	for _, v := range vs {
		if v.Buf == buf {
			return true
		}
	}
	return false
}

func hasIndex(e *ir.Expr) bool {
	found := false
	e.Map(func(n *ir.Expr) *ir.Expr {
		found = found || n.Op == ir.EIndex
		return n
	})
	return found
}

// foldNormIntoRoPE folds an RMSNorm whose output only a RoPE reads as x
// (Qwen3's per-head q/k norm) into that RoPE as a prologue: each row is
// normalised and rotated in registers, one dependent stage fewer per layer on
// the path to attention. The norm's rows must be the RoPE's rows; the RoPE may
// read them through a permuted view (the heads transposed), which the norm's
// inputs are viewed through as well.
func foldNormIntoRoPE(g *ir.Graph) {
	u := analyze(g)
	index := opIndex(g)
	dead := map[*ir.Op]bool{}
	for _, p := range g.Ops {
		if p.Kind != ir.RMSNorm || p.Out.Buf.Kind != ir.Temp || !p.Out.IsWhole() || u.outputs[p.Out.Buf.ID] ||
			len(u.writers[p.Out.Buf.ID]) != 1 || len(u.readers[p.Out.Buf.ID]) != 1 {
			continue
		}
		r := u.readers[p.Out.Buf.ID][0]
		if r.Kind != ir.RoPE || r.Attr.Pro != nil || r.In[0].Buf != p.Out.Buf || r.In[1].Buf == p.Out.Buf ||
			r.In[2].Buf == p.Out.Buf || writtenBetween(g, index[p], index[r], p.In) {
			continue
		}
		var vs []ir.View
		for _, v := range p.In {
			cv, ok := throughView(r.In[0], p.Out, v)
			if !ok {
				break
			}
			vs = append(vs, cv)
		}
		if len(vs) != len(p.In) {
			continue
		}
		r.Attr.Pro = &ir.Prologue{Kind: ir.RMSNorm, First: len(r.In), Eps: p.Attr.Eps, HasWeight: p.Attr.HasWeight,
			DType: p.Out.DType()}
		r.In = append(append([]ir.View{vs[0]}, r.In[1:]...), vs[1:]...)
		r.Label = "rmsnorm+" + r.Label
		dead[p] = true
	}
	removeOps(g, dead)
}

// throughView returns the view of v (shaped like out) that reads, at each
// index of reader, the element of v at the index of out that reader reads.
// reader must permute out's dims (dims of size 1 aside) and keep its last dim
// last, so rows stay rows.
func throughView(reader, out, v ir.View) (ir.View, bool) {
	if reader.Offset != out.Offset || reader.Numel() != out.Numel() || len(v.Shape) != len(out.Shape) {
		return ir.View{}, false
	}
	used := make([]bool, len(out.Shape))
	strides := make([]int64, len(reader.Shape))
	last := len(reader.Shape) - 1
	for d, n := range reader.Shape {
		if n == 1 && d != last {
			continue // any stride reads the one element
		}
		k := -1
		for c := range out.Shape {
			if !used[c] && out.Shape[c] == n && out.Strides[c] == reader.Strides[d] && (out.Shape[c] > 1 || c == len(out.Shape)-1) {
				k = c
				break
			}
		}
		if k < 0 || (d == last) != (k == len(out.Shape)-1) {
			return ir.View{}, false
		}
		used[k] = true
		strides[d] = v.Strides[k]
	}
	return ir.View{Buf: v.Buf, Offset: v.Offset, Shape: append([]int64(nil), reader.Shape...), Strides: strides}, true
}

// opIndex maps each op to its position in g.Ops.
func opIndex(g *ir.Graph) map[*ir.Op]int {
	index := make(map[*ir.Op]int, len(g.Ops))
	for i, op := range g.Ops {
		index[op] = i
	}
	return index
}
