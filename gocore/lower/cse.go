package lower

import (
	"fmt"
	"strings"

	"mpk/gocore/ir"
)

// shareRepeatedOps removes an op that computes what an earlier op already
// computed (common subexpression elimination): the same kind, attributes
// and input views, inputs unchanged in between, into a temporary of the same
// layout; its readers read the earlier result. Hugging Face recomputes a
// decode step's attention mask in every layer (the -inf where, and the
// mask's extent after it): a llama-3.2-1b step ran 80 such single-task ops at
// its start, each ahead of its worker's first Linears.
func shareRepeatedOps(g *ir.Graph) {
	u := analyze(g)
	index := opIndex(g)
	first := map[string]*ir.Op{}
	dead := map[*ir.Op]bool{}
	for _, op := range g.Ops {
		if !repeatable(op, u) {
			continue
		}
		key := opKey(op)
		f, ok := first[key]
		if !ok || writtenBetween(g, index[f], index[op], op.In) {
			first[key] = op
			continue
		}
		for _, r := range u.readers[op.Out.Buf.ID] {
			for i := range r.In {
				if r.In[i].Buf == op.Out.Buf {
					r.In[i].Buf = f.Out.Buf
				}
			}
		}
		dead[op] = true
	}
	removeOps(g, dead)
}

// repeatable says whether op's result may stand for a later identical op's:
// a pure op of a kind with no folded prologue or epilogue, writing the whole
// of a temporary that nothing else writes and that is not a graph output.
func repeatable(op *ir.Op, u uses) bool {
	switch op.Kind {
	case ir.Elementwise, ir.Cat, ir.Copy, ir.Reduce, ir.Gather, ir.MaskExtent:
	default:
		return false
	}
	b := op.Out.Buf
	return b.Kind == ir.Temp && op.Out.IsWhole() && len(u.writers[b.ID]) == 1 && !u.outputs[b.ID] &&
		op.Attr.Pro == nil && op.Attr.Epi == nil
}

// opKey is op's identity for shareRepeatedOps: kind, attributes, the input
// views, and the output's dtype and layout.
func opKey(op *ir.Op) string {
	var sb strings.Builder
	a := op.Attr
	expr := ""
	if a.Expr != nil {
		expr = a.Expr.String()
	}
	a.Expr, a.Pro, a.Epi = nil, nil, nil
	fmt.Fprintf(&sb, "%d|%s|%+v|", op.Kind, expr, a)
	for _, v := range op.In {
		fmt.Fprintf(&sb, "%d@%d%v%v;", v.Buf.ID, v.Offset, v.Shape, v.Strides)
	}
	o := op.Out
	fmt.Fprintf(&sb, "->%s:%d:%d%v%v", o.DType(), o.Buf.Numel, o.Offset, o.Shape, o.Strides)
	return sb.String()
}
