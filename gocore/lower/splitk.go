package lower

import (
	"mpk/gocore/ir"
	"mpk/gocore/stream"
)

// maxKParts bounds the slices of K a Linear is cut into (splitLinearK).
const maxKParts = 8

// maxSliceInputs bounds the inputs of the op that reads a Linear's K slices
// (the slices and the others): the ABI's bound when these passes were
// measured (ir.MaxInputs grew for the fresh-row attention, not for them).
const maxSliceInputs = 8

// splitLinearK cuts a Linear whose x is too large for a tile stream to stage
// (M·K too large: llama-3.2-1b's down projection, 16 × 8,192 at batch 16)
// into Linears over slices of K that stream x with its low part, each
// streaming its columns of the weight rows once on its share of the workers,
// and an elementwise op that sums their fp32 products in slice order and
// then stores what the Linear would (the residual added, its epilogue
// applied): the weights are read once, where blocks of rows
// (splitLinearRows) read them once per block. Linears with a prologue (a
// norm needs whole rows) are not cut.
//
// A GEMM stream (markGemm) is cut where its tasks of GemmRows weight rows
// would not cover the workers (gemmKParts), or with rowBlocks into blocks
// of x's rows where those cost less (gemmRowBlocks); others only with
// splitK.
//
// With siblings, a run of sibling GEMM streams (a chunk's q, k and v) is
// cut as one stage (gemmRunCuts). With overlap (a timed schedule), a GEMM
// stream after a stage with a short last round takes tailOverlapParts'
// slices.
func splitLinearK(g *ir.Graph, workers int, splitK, rowBlocks, siblings, overlap bool) {
	written := stream.Writers(g)
	var u uses
	if overlap {
		u = analyze(g) // tailOverlapParts' producers
	}
	var ops []*ir.Op
	for i := 0; i < len(g.Ops); i++ {
		op := g.Ops[i]
		if siblings && workers > 0 {
			if j := gemmRunEnd(g.Ops, i); j-i > 1 {
				if cuts := gemmRunCuts(g.Ops[i:j], workers, rowBlocks); cuts != nil {
					for k, c := range cuts {
						ops = append(ops, cutGemm(g, g.Ops[i+k], c)...)
					}
					i = j - 1
					continue
				}
			}
		}
		var parts int64
		if op.Attr.Gemm {
			extra := int64(len(sumInputs(op)))
			parts = gemmKParts(op, workers, extra)
			n := int64(0)
			if overlap {
				n = tailOverlapParts(u, op, workers, parts, extra)
			}
			if n > 0 {
				parts = n // not blocks of rows: those wait for every column of x
			} else if rowBlocks {
				if blocks := gemmRowBlocks(op, workers, parts); blocks > 1 {
					ops = append(ops, sliceRowBlocks(op, op.Out.Shape[0]/blocks)...)
					continue
				}
			}
		} else if splitK {
			parts = kParts(op, written)
		}
		if parts < 2 {
			ops = append(ops, op)
			continue
		}
		ops = append(ops, sliceK(g, op, parts)...)
	}
	g.Ops = ops
}

// kParts is how many slices of K op takes: the fewest (up to maxKParts)
// whose Linears stream x with its low part, when op itself does not stream;
// 0 when op streams as it is or no cut helps.
func kParts(op *ir.Op, written func(*ir.Buffer) bool) int64 {
	if op.Kind != ir.Linear || op.Attr.Pro != nil || op.In[0].Rank() != 2 || op.In[1].Rank() != 2 ||
		op.Attr.Epi != nil && hasIndex(op.Attr.Epi.Expr) {
		return 0
	}
	// x that streams at all, even rounded, is read once: a cut would only add
	// the sum's stage (llama-3.2-1b batch 8: 2.056 ms whole, 2.175 cut).
	if _, ok := stream.For(op, written); ok {
		return 0
	}
	// The sum reads every slice's product and the residual and epilogue
	// inputs: at most maxSliceInputs (qwen3-8b's down projection at batch 16,
	// K = 12,288, takes 6 slices of 2,048, not 8 of 1,536).
	K, extra := op.LinearK(), int64(len(sumInputs(op)))
	for parts := int64(2); parts <= maxKParts && parts+extra <= maxSliceInputs; parts++ {
		if K%parts != 0 {
			continue
		}
		c := sliceKOp(op, 0, K/parts)
		if p, ok := stream.For(c, written); ok && p.Tiles && p.KeepsX(c) {
			return parts
		}
	}
	return 0
}

// sliceKOp is op's product over columns [k0, k0+n) of x and of the weight
// rows, into a fresh fp32 output (set by the caller), with no residual.
func sliceKOp(op *ir.Op, k0, n int64) *ir.Op {
	c := *op
	c.In = []ir.View{sliceView(op.In[0], 1, k0, n), sliceView(op.In[1], 1, k0, n)}
	c.Attr.Residual, c.Attr.Epi = false, nil
	c.Label = "linear"
	return &c
}

// sliceK is op as parts Linears over slices of K and the elementwise sum.
func sliceK(g *ir.Graph, op *ir.Op, parts int64) []*ir.Op {
	K, M, N := op.LinearK(), op.Out.Shape[0], op.Out.Shape[1]
	n := K / parts
	var out []*ir.Op
	var sum *ir.Expr
	var in []ir.View // the slices' products, then sumInputs
	for p := int64(0); p < parts; p++ {
		c := sliceKOp(op, p*n, n)
		c.Attr.KParts = parts
		c.Out = g.NewTemp(op.Node+"_kslice", ir.F32, []int64{M, N})
		out = append(out, c)
		in = append(in, c.Out)
		if sum == nil {
			sum = ir.Load(int(p))
		} else {
			sum = ir.Cast(ir.F32, ir.Apply(ir.EAdd, sum, ir.Load(int(p))))
		}
	}
	// What the Linear stores from its product (refexec's linear): the
	// product rounded to the output's dtype plus the residual, then the
	// epilogue of that rounded to the folded op's dtype.
	dt := op.Out.DType()
	e, label, next := sum, "linear_k_sum", len(in) // next: the first of sumInputs not yet loaded
	in = append(in, sumInputs(op)...)
	if op.Attr.Residual {
		e = ir.Apply(ir.EAdd, ir.Cast(dt, e), ir.Load(next))
		label += "+residual"
		next++
	}
	if epi := op.Attr.Epi; epi != nil {
		product := ir.Cast(epi.DType, e)
		e = epi.Expr.Map(func(n *ir.Expr) *ir.Expr {
			if n.Op != ir.ELoad {
				return n
			}
			if n.Input == 0 {
				return product
			}
			return ir.Load(next + n.Input - 1)
		})
		label += "+epilogue"
	}
	return append(out, &ir.Op{Kind: ir.Elementwise, Label: label, Node: op.Node, Target: op.Target, Source: op.Source,
		In: in, Out: op.Out, Attr: ir.Attrs{Expr: ir.Cast(dt, e)}})
}

// sumInputs is what the sum of op's slices reads besides their products:
// the residual, then the epilogue's inputs.
func sumInputs(op *ir.Op) []ir.View {
	var in []ir.View
	if op.Attr.Residual {
		in = append(in, op.In[2])
	}
	if op.Attr.Epi != nil {
		in = append(in, op.EpiIn()...)
	}
	return in
}
