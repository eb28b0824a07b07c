package lower

import "mpk/gocore/ir"

// layerNormOp lowers native_layer_norm(x, normalized_shape, w, b, eps) to
// reductions and elementwise ops, in fp32 as ATen computes it:
//
//	mean = mean(x); rstd = rsqrt(mean((x-mean)²) + eps)
//	out  = (x-mean)·rstd·w + b
//
// Its three outputs are out, mean and rstd (the last two keep the normalized
// dims as size 1). The weight and the bias are optional.
func layerNormOp(l *lowerer) {
	x := l.tensorArg(0, "input")
	k := len(l.intsArg(1, "normalized_shape"))
	eps := l.floatArg(4, "eps", 1e-5)
	if k < 1 || k > x.Rank() {
		l.failf("layer_norm over %d dims of a %d-d tensor", k, x.Rank())
	}
	dims := make([]int64, k)
	for i := range dims {
		dims[i] = int64(x.Rank() - k + i)
	}
	mean := l.reduce("mean", x, dims, ir.F32, true)
	meanB := broadcast(l, mean, x.Shape)

	centered := ir.Apply(ir.ESub, ir.Load(0), ir.Load(1))
	sq := l.temp(ir.F32, x.Shape)
	l.emit(&ir.Op{Kind: ir.Elementwise, In: []ir.View{x, meanB}, Out: sq,
		Attr: ir.Attrs{Expr: ir.Cast(ir.F32, ir.Apply(ir.EMul, centered, centered))}})
	variance := l.reduce("mean", sq, dims, ir.F32, true)
	rstd := l.temp(ir.F32, variance.Shape)
	l.emit(&ir.Op{Kind: ir.Elementwise, In: []ir.View{variance}, Out: rstd,
		Attr: ir.Attrs{Expr: ir.Cast(ir.F32, ir.Apply(ir.ERsqrt, ir.Apply(ir.EAdd, ir.Load(0), ir.Const(eps))))}})

	ins := []ir.View{x, meanB, broadcast(l, rstd, x.Shape)}
	e := ir.Apply(ir.EMul, centered, ir.Load(2))
	for i, name := range []string{"weight", "bias"} {
		a := l.arg(2+i, name)
		if l.isNone(a) {
			continue
		}
		ins = append(ins, broadcast(l, l.tensor(*a), x.Shape))
		op := ir.EMul
		if name == "bias" {
			op = ir.EAdd
		}
		e = ir.Apply(op, e, ir.Load(len(ins)-1))
	}
	dt := l.outDType(0)
	out := l.temp(dt, x.Shape)
	l.emit(&ir.Op{Kind: ir.Elementwise, In: ins, Out: out, Attr: ir.Attrs{Expr: ir.Cast(dt, e)}})
	mv, rv := l.asOut(mean, 1), l.asOut(rstd, 2)
	l.set(&out, mv, rv)
}

// asOut views v as output i of the current node, converting its dtype when
// the trace says another (mean and rstd of a half-precision layer norm are
// fp32 on some devices and half on others); nil when output i is absent.
func (l *lowerer) asOut(v ir.View, i int) *ir.View {
	if i >= len(l.outs) || l.outs[i] == nil {
		return nil
	}
	if dt := l.outDType(i); dt != v.DType() {
		c := l.temp(dt, v.Shape)
		l.emit(&ir.Op{Kind: ir.Elementwise, In: []ir.View{v}, Out: c, Attr: ir.Attrs{Expr: ir.Cast(dt, ir.Load(0))}})
		v = c
	}
	r := l.reshape(v, l.outShape(i))
	return &r
}
