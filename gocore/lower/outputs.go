package lower

import "mpk/gocore/ir"

// bindOutputs makes each graph output a buffer the caller allocates: the op
// that produced it writes there directly when it wrote the whole temporary;
// otherwise a copy fills it. Outputs that view an input stay views.
func bindOutputs(g *ir.Graph) {
	u := analyze(g)
	taken := map[*ir.Buffer]bool{}
	for i, v := range g.Outputs {
		if v.Buf.Kind == ir.Input {
			continue
		}
		if w := u.soleWriter(v.Buf); w != nil && v.IsWhole() && !taken[v.Buf] && v.Buf.Kind == ir.Temp {
			v.Buf.Kind, v.Buf.Index = ir.Output, i
			taken[v.Buf] = true
			continue
		}
		b := g.NewBuffer("output", ir.Output, v.DType(), v.Numel())
		b.Index = i
		out := ir.View{Buf: b, Shape: append([]int64(nil), v.Shape...), Strides: ir.ContiguousStrides(v.Shape)}
		g.Ops = append(g.Ops, &ir.Op{Kind: ir.Copy, Label: "output_copy", In: []ir.View{v}, Out: out})
		g.Outputs[i] = out
	}
}

// label names elementwise ops by what they compute, for summaries and for the
// CUDA task library's specialised variants.
func label(g *ir.Graph) {
	for _, op := range g.Ops {
		if op.Label != "" {
			continue
		}
		switch op.Kind {
		case ir.Elementwise:
			op.Label = elementwiseLabel(op)
		case ir.KVWrite:
			op.Label = "kv_write"
		default:
			op.Label = op.Kind.String()
		}
	}
}

func elementwiseLabel(op *ir.Op) string {
	e := uncast(op.Attr.Expr)
	fs := factors(e)
	if len(fs) == 2 {
		for i := 0; i < 2; i++ {
			if a, b := uncast(fs[i]), uncast(fs[1-i]); a.Op == ir.ESilu && uncast(a.Args[0]).Op == ir.ELoad && b.Op == ir.ELoad {
				return "silu_mul"
			}
		}
	}
	if e.Op == ir.EAdd && len(op.In) == 2 && uncast(e.Args[0]).Op == ir.ELoad && uncast(e.Args[1]).Op == ir.ELoad {
		return "residual_add"
	}
	return "elementwise"
}
