package lower

import "mpk/gocore/ir"

// widenTemps keeps half-precision intermediates in float32: every bf16/fp16
// temporary becomes an fp32 buffer and every rounding to half precision inside
// an op (expression casts, a prologue's result) goes away. Only what the
// caller sees is rounded, once, when stored: graph outputs and written inputs
// such as the KV cache. A bf16 model then computes much closer to its float32
// twin than eager bf16, which rounds after every op (on random-weight
// models those roundings alone move the logits by 1e-2 to 5e-2 and flip
// near-tied argmaxes). At decode the intermediates are a few KB a layer, so the
// wider buffers cost no bandwidth that shows. Config.RoundIntermediates turns
// it off, for comparing with eager rounding for rounding. The buffers keep
// says stay as they are (attentionKV, gemmInputs).
func widenTemps(g *ir.Graph, keep map[*ir.Buffer]bool) {
	for _, b := range g.Buffers {
		if b.Kind == ir.Temp && isHalf(b.DType) && !keep[b] {
			b.DType = ir.F32
		}
	}
	for _, op := range g.Ops {
		op.Attr.Expr = dropHalfCasts(op.Attr.Expr)
		if p := op.Attr.Pro; p != nil {
			p.Expr = dropHalfCasts(p.Expr)
			if isHalf(p.DType) {
				p.DType = ir.F32
			}
		}
		if p := op.Attr.Epi; p != nil {
			p.Expr = dropHalfCasts(p.Expr)
			if isHalf(p.DType) {
				p.DType = ir.F32
			}
		}
	}
}

func isHalf(dt ir.DType) bool { return dt == ir.BF16 || dt == ir.F16 }

// dropHalfCasts removes every rounding to bf16/fp16 from e (nil stays nil).
func dropHalfCasts(e *ir.Expr) *ir.Expr {
	if e == nil {
		return nil
	}
	return e.Map(func(n *ir.Expr) *ir.Expr {
		if n.Op == ir.ECast && isHalf(n.DType) {
			return n.Args[0]
		}
		return n
	})
}

// gemmInputs are the half-precision temporaries that only GEMM streams
// (markGemm) read, each as its x, in the weights' dtype: a prompt chunk's
// normed hidden states, attention output and SiLU·mul, rounded there as
// eager rounds them (option round_gemm_inputs). A GEMM stream then stages x
// as it is, half the bytes each of its tasks reads from L2 (at 64 rows of
// fp32 a task reads twice as many bytes of x as of weights), and multiplies
// it once, where an fp32 x is split into hi + lo and multiplied twice.
func gemmInputs(g *ir.Graph) map[*ir.Buffer]bool {
	keep, other := map[*ir.Buffer]bool{}, map[*ir.Buffer]bool{}
	for _, op := range g.Ops {
		gemmX := op.Kind == ir.Linear && op.Attr.Gemm && op.In[1].DType() == op.In[0].DType()
		for i, v := range op.In {
			if gemmX && i == 0 {
				keep[v.Buf] = true
			} else {
				other[v.Buf] = true
			}
		}
	}
	for b := range keep {
		if other[b] || b.Kind != ir.Temp || !isHalf(b.DType) {
			delete(keep, b)
		}
	}
	return keep
}

// attentionKV are the half-precision temporaries that attentions read as
// their K or V and nothing else reads but a copy into a buffer of the same
// dtype: a sliding-window layer's cache joined with a prompt chunk's new
// rows (HF's sliding cache returns cat(window, new) when the chunk outgrows
// the window, and copies the joined rows' last window into the cache). They
// stay in the cache's dtype, rounded as the cache rounds the same rows (the
// copy rounds nothing twice), so the chunk's attention reads 2-byte rows as
// it reads the cache (its shared-K/V form takes nothing else: a 64-token
// chunk over a window of 16 failed codegen with an fp32 K).
func attentionKV(g *ir.Graph) map[*ir.Buffer]bool {
	keep, other := map[*ir.Buffer]bool{}, map[*ir.Buffer]bool{}
	for _, op := range g.Ops {
		for i, v := range op.In {
			switch {
			case op.Kind == ir.Attention && (i == 1 || i == 2):
				keep[v.Buf] = true
			case copiesAlike(op, i):
			default:
				other[v.Buf] = true
			}
		}
	}
	for _, o := range g.Outputs {
		other[o.Buf] = true
	}
	for b := range keep {
		if other[b] || b.Kind != ir.Temp || !isHalf(b.DType) {
			delete(keep, b)
		}
	}
	return keep
}

// copiesAlike says whether op only copies its input i into a buffer of that
// input's dtype that stays so (an elementwise load of it, or a Copy, into
// the caller's buffer: a temporary would be widened, and its copy of rows
// kept half would then hold rounded values where it held exact ones).
func copiesAlike(op *ir.Op, i int) bool {
	if op.Out.DType() != op.In[i].DType() || op.Out.Buf.Kind == ir.Temp {
		return false
	}
	e := dropHalfCasts(op.Attr.Expr) // a rounding to the output's own dtype is the store's
	return op.Kind == ir.Copy && i == 0 || op.Kind == ir.Elementwise && e != nil && e.Op == ir.ELoad && e.Input == i
}
