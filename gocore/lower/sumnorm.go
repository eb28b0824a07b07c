package lower

import (
	"slices"

	"mpk/gocore/ir"
)

// foldSumIntoNorm lets the RMSNorm ahead of a prompt chunk's GEMM streams
// (q, k and v) compute its input itself from what the elementwise op before
// it reads (a K-split down projection's slices and the residual: lower's
// sliceK), so the norm no longer waits a stage for that op. The op still
// writes its output (the residual stream, read a layer later) beside the
// norm, on a quarter of the workers (Attr.Workers), which the GEMM stage
// after the norm leaves idle when its streams have fewer tasks than there
// are workers (a 64-token chunk's q, k and v: 96 of 132 on qwen3-8b). A
// qwen3-8b chunk's layer ran the sum (9.4 us a task), a hop and the norm
// (6 us) in a row (bench/NOTES.md, forty-fifth session).
func foldSumIntoNorm(g *ir.Graph, workers int) {
	u := analyze(g)
	dead := map[*ir.Op]bool{}
	for i := 1; i < len(g.Ops); i++ {
		n, e := g.Ops[i], g.Ops[i-1]
		out, weight, ok := sumIntoNorm(u, n, e)
		if !ok {
			continue
		}
		// n over e's 2-D index space: x's first input, the weight, then x's
		// other inputs (the prologue's).
		in := []ir.View{e.In[0]}
		if n.Attr.HasWeight {
			in = append(in, weight)
		}
		n.Attr.Pro = &ir.Prologue{Kind: ir.Elementwise, First: len(in), Expr: e.Attr.Expr, DType: e.Out.DType()}
		n.In, n.Out = append(in, e.In[1:]...), out
		n.Label = e.Label + "+rmsnorm"
		if len(u.readers[e.Out.Buf.ID]) == 1 && !u.outputs[e.Out.Buf.ID] {
			dead[e] = true // n was its only reader
			continue
		}
		// The norm first, so that on a worker with both tasks the norm runs
		// first; the op then runs beside the GEMM stage the norm feeds.
		e.Attr.Workers = max(1, int64(workers)/4)
		g.Ops[i-1], g.Ops[i] = n, e
	}
	removeOps(g, dead)
}

// sumIntoNorm reports whether RMSNorm n, right after elementwise op e, can
// compute e's output as its prologue, and gives n's output and weight
// viewed in e's index space: n reads all of e's 2-D output as x (in any
// shape of the same rows) and is read only by GEMM streams (a prompt
// chunk's or batch's rows), e reads views of its output's shape and no
// index, and n's inputs stay within the task ABI's limit. (e may add in
// place, the residual stream its input and output: n, moved before it,
// reads the old rows, and e's tasks wait for n's as for any reader of what
// they overwrite.)
func sumIntoNorm(u uses, n, e *ir.Op) (out, weight ir.View, ok bool) {
	if n.Kind != ir.RMSNorm || n.Attr.Pro != nil || e.Kind != ir.Elementwise || hasIndex(e.Attr.Expr) ||
		e.Attr.Workers > 0 || e.Out.Rank() != 2 || !e.Out.IsWhole() || e.Out.Buf.Kind != ir.Temp ||
		n.In[0].Buf != e.Out.Buf || !n.In[0].IsWhole() || len(n.In)+len(e.In)-1 > ir.MaxInputs {
		return out, weight, false
	}
	shape := e.Out.Shape
	for _, v := range e.In {
		if !slices.Equal(v.Shape, shape) {
			return out, weight, false
		}
	}
	readers := u.readers[n.Out.Buf.ID]
	for _, r := range readers {
		if r.Kind != ir.Linear || !r.Attr.Gemm {
			return out, weight, false
		}
	}
	out, ok = viewAs(n.Out, shape)
	if n.Attr.HasWeight && ok {
		weight, ok = viewAs(n.In[1], shape)
	}
	return out, weight, ok && len(readers) > 0 && ir.Numel(n.In[0].Shape) == ir.Numel(shape) &&
		n.In[0].Shape[n.In[0].Rank()-1] == shape[1]
}
