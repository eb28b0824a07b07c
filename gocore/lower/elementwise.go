package lower

import (
	"math"

	"mpk/gocore/ir"
)

// ewSpec lowers one elementwise ATen op: operands are the positional
// arguments (tensor or scalar) that feed the expression; build combines them.
// The result is always rounded to the node's traced dtype, as eager does.
type ewSpec struct {
	operands []int
	build    func(l *lowerer, x []*ir.Expr) *ir.Expr
}

func unary(op ir.ExprOp) ewSpec {
	return ewSpec{[]int{0}, func(_ *lowerer, x []*ir.Expr) *ir.Expr { return ir.Apply(op, x[0]) }}
}

func binary(op ir.ExprOp) ewSpec {
	return ewSpec{[]int{0, 1}, func(_ *lowerer, x []*ir.Expr) *ir.Expr { return ir.Apply(op, x[0], x[1]) }}
}

// withAlpha builds a op alpha*b for add/sub.
func withAlpha(op ir.ExprOp) ewSpec {
	return ewSpec{[]int{0, 1}, func(l *lowerer, x []*ir.Expr) *ir.Expr {
		b := x[1]
		if alpha := l.floatArg(-1, "alpha", 1); alpha != 1 {
			b = ir.Apply(ir.EMul, b, ir.Const(alpha))
		}
		return ir.Apply(op, x[0], b)
	}}
}

// constant builds a tensor filled from a scalar argument.
func constant(arg int, name string, def float64) ewSpec {
	return ewSpec{nil, func(l *lowerer, _ []*ir.Expr) *ir.Expr { return ir.Const(l.floatArg(arg, name, def)) }}
}

// rounded divides a by b and rounds the quotient with op (EFloor, ETrunc).
func rounded(op ir.ExprOp, a, b *ir.Expr) *ir.Expr { return ir.Apply(op, ir.Apply(ir.EDiv, a, b)) }

// modulo is a - round(a / b)·b: remainder (floor: the sign of b, as
// Python's %) or fmod (trunc: the sign of a).
func modulo(op ir.ExprOp) ewSpec {
	return ewSpec{[]int{0, 1}, func(_ *lowerer, x []*ir.Expr) *ir.Expr {
		return ir.Apply(ir.ESub, x[0], ir.Apply(ir.EMul, rounded(op, x[0], x[1]), x[1]))
	}}
}

// divMode is div with rounding_mode None (true division), "floor" or "trunc".
var divMode = ewSpec{[]int{0, 1}, func(l *lowerer, x []*ir.Expr) *ir.Expr {
	a := l.arg(-1, "rounding_mode")
	switch {
	case l.isNone(a):
		return ir.Apply(ir.EDiv, x[0], x[1])
	case a.K == "str" && a.S == "floor":
		return rounded(ir.EFloor, x[0], x[1])
	case a.K == "str" && a.S == "trunc":
		return rounded(ir.ETrunc, x[0], x[1])
	}
	l.failf("div with rounding_mode %q", a.S)
	return nil
}}

// Helpers for composite activations (each a few expression ops).
func gt0(x *ir.Expr) *ir.Expr         { return ir.Apply(ir.EGt, x, ir.Const(0)) }
func times(a, b *ir.Expr) *ir.Expr    { return ir.Apply(ir.EMul, a, b) }
func where(c, a, b *ir.Expr) *ir.Expr { return ir.Apply(ir.EWhere, c, a, b) }

// softplus is log(1 + exp(βx)) / β, and x itself past the threshold (as torch).
func softplus(x *ir.Expr, beta, threshold float64) *ir.Expr {
	bx := times(x, ir.Const(beta))
	soft := ir.Apply(ir.EDiv, ir.Apply(ir.ELog, ir.Apply(ir.EAdd, ir.Const(1), ir.Apply(ir.EExp, bx))), ir.Const(beta))
	return where(ir.Apply(ir.EGt, bx, ir.Const(threshold)), x, soft)
}

// triangle keeps the elements on and above (upper) or on and below the
// k-th diagonal of the last two dims, zero elsewhere (triu, tril).
func triangle(upper bool) ewSpec {
	return ewSpec{[]int{0}, func(l *lowerer, x []*ir.Expr) *ir.Expr {
		r, k := len(l.outShape(0)), float64(l.intArg(1, "diagonal", 0))
		if r < 2 {
			l.failf("triu/tril of a %d-d tensor", r)
		}
		off := ir.Apply(ir.ESub, ir.Index(r-1), ir.Index(r-2)) // column - row
		keep := ir.Apply(ir.ELe, off, ir.Const(k))
		if upper {
			keep = ir.Apply(ir.EGe, off, ir.Const(k))
		}
		return where(keep, x[0], times(x[0], ir.Const(0)))
	}}
}

// finiteMax is the largest finite value of a float dtype (nan_to_num).
var finiteMax = map[ir.DType]float64{ir.F32: math.MaxFloat32, ir.F64: math.MaxFloat64, ir.F16: 65504,
	ir.BF16: 3.3895313892515355e38}

// logical applies a bitwise op to the truth of its operands (x != 0): a
// float 0.5 is true, where its int64 value is 0.
func logical(op ir.ExprOp) ewSpec {
	return ewSpec{[]int{0, 1}, func(_ *lowerer, x []*ir.Expr) *ir.Expr {
		return ir.Apply(op, ir.Apply(ir.ENe, x[0], ir.Const(0)), ir.Apply(ir.ENe, x[1], ir.Const(0)))
	}}
}

// roundHalfEven rounds x to an integer, ties to even (torch.round).
func roundHalfEven(x *ir.Expr) *ir.Expr {
	f := ir.Apply(ir.EFloor, ir.Apply(ir.EAdd, x, ir.Const(0.5)))
	tie := ir.Apply(ir.EEq, ir.Apply(ir.ESub, f, x), ir.Const(0.5))
	odd := ir.Apply(ir.ENe, ir.Apply(ir.ESub, f, times(ir.Const(2), ir.Apply(ir.EFloor, times(f, ir.Const(0.5))))), ir.Const(0))
	return where(ir.Apply(ir.EAnd, tie, odd), ir.Apply(ir.ESub, f, ir.Const(1)), f)
}

// nearZero is e where |x| < small, else far: log1p and expm1 keep the
// digits of a tiny x by their series there (float32 functions would lose
// them in 1 + x).
func nearZero(x *ir.Expr, small float64, e, far *ir.Expr) *ir.Expr {
	return where(ir.Apply(ir.ELt, ir.Apply(ir.EAbs, x), ir.Const(small)), e, far)
}

var composites = map[string]ewSpec{
	"round.default": {[]int{0}, func(_ *lowerer, x []*ir.Expr) *ir.Expr { return roundHalfEven(x[0]) }},
	"round.decimals": {[]int{0}, func(l *lowerer, x []*ir.Expr) *ir.Expr {
		scale := math.Pow(10, float64(l.intArg(1, "decimals", 0)))
		return ir.Apply(ir.EDiv, roundHalfEven(times(x[0], ir.Const(scale))), ir.Const(scale))
	}},
	"log1p.default": {[]int{0}, func(_ *lowerer, x []*ir.Expr) *ir.Expr { // x - x²/2 + x³/3
		x2 := times(x[0], x[0])
		series := ir.Apply(ir.EAdd, ir.Apply(ir.ESub, x[0], times(x2, ir.Const(0.5))), times(times(x2, x[0]), ir.Const(1.0/3)))
		return nearZero(x[0], 1e-4, series, ir.Apply(ir.ELog, ir.Apply(ir.EAdd, ir.Const(1), x[0])))
	}},
	"expm1.default": {[]int{0}, func(_ *lowerer, x []*ir.Expr) *ir.Expr { // x + x²/2 + x³/6
		x2 := times(x[0], x[0])
		series := ir.Apply(ir.EAdd, ir.Apply(ir.EAdd, x[0], times(x2, ir.Const(0.5))), times(times(x2, x[0]), ir.Const(1.0/6)))
		return nearZero(x[0], 1e-4, series, ir.Apply(ir.ESub, ir.Apply(ir.EExp, x[0]), ir.Const(1)))
	}},
	"sign.default": {[]int{0}, func(_ *lowerer, x []*ir.Expr) *ir.Expr { // 0 and NaN stay
		return where(gt0(x[0]), ir.Const(1), where(ir.Apply(ir.ELt, x[0], ir.Const(0)), ir.Const(-1), times(x[0], ir.Const(0))))
	}},
	"leaky_relu.default": {[]int{0}, func(l *lowerer, x []*ir.Expr) *ir.Expr {
		return where(gt0(x[0]), x[0], times(x[0], ir.Const(l.floatArg(1, "negative_slope", 0.01))))
	}},
	"elu.default": {[]int{0}, func(l *lowerer, x []*ir.Expr) *ir.Expr {
		alpha, scale, in := l.floatArg(1, "alpha", 1), l.floatArg(2, "scale", 1), l.floatArg(3, "input_scale", 1)
		neg := times(ir.Const(scale*alpha), ir.Apply(ir.ESub, ir.Apply(ir.EExp, times(x[0], ir.Const(in))), ir.Const(1)))
		return where(gt0(x[0]), times(x[0], ir.Const(scale)), neg)
	}},
	"hardtanh.default": {[]int{0}, func(l *lowerer, x []*ir.Expr) *ir.Expr {
		return ir.Apply(ir.EMax, ir.Apply(ir.EMin, x[0], ir.Const(l.floatArg(2, "max_val", 1))), ir.Const(l.floatArg(1, "min_val", -1)))
	}},
	"softplus.default": {[]int{0}, func(l *lowerer, x []*ir.Expr) *ir.Expr {
		return softplus(x[0], l.floatArg(1, "beta", 1), l.floatArg(2, "threshold", 20))
	}},
	"mish.default": {[]int{0}, func(_ *lowerer, x []*ir.Expr) *ir.Expr {
		return times(x[0], ir.Apply(ir.ETanh, softplus(x[0], 1, 20)))
	}},
	"isinf.default": {[]int{0}, func(_ *lowerer, x []*ir.Expr) *ir.Expr {
		return ir.Apply(ir.EEq, ir.Apply(ir.EAbs, x[0]), ir.Const(math.Inf(1)))
	}},
	"nan_to_num.default": {[]int{0}, func(l *lowerer, x []*ir.Expr) *ir.Expr {
		top, ok := finiteMax[l.outDType(0)]
		if !ok {
			return x[0] // integers hold no NaN or infinity
		}
		pos, neg := l.floatArg(2, "posinf", top), l.floatArg(3, "neginf", -top)
		inf := func(sign float64) *ir.Expr { return ir.Apply(ir.EEq, x[0], ir.Const(math.Inf(int(sign)))) }
		return where(ir.Apply(ir.EIsNaN, x[0]), ir.Const(l.floatArg(1, "nan", 0)),
			where(inf(1), ir.Const(pos), where(inf(-1), ir.Const(neg), x[0])))
	}},
	"exp2.default": {[]int{0}, func(_ *lowerer, x []*ir.Expr) *ir.Expr { return ir.Apply(ir.EExp, times(x[0], ir.Const(math.Ln2))) }},
	"log2.default": {[]int{0}, func(_ *lowerer, x []*ir.Expr) *ir.Expr {
		return ir.Apply(ir.EDiv, ir.Apply(ir.ELog, x[0]), ir.Const(math.Ln2))
	}},
	"sinh.default": {[]int{0}, func(_ *lowerer, x []*ir.Expr) *ir.Expr {
		return times(ir.Const(0.5), ir.Apply(ir.ESub, ir.Apply(ir.EExp, x[0]), ir.Apply(ir.EExp, ir.Apply(ir.ENeg, x[0]))))
	}},
	"cosh.default": {[]int{0}, func(_ *lowerer, x []*ir.Expr) *ir.Expr {
		return times(ir.Const(0.5), ir.Apply(ir.EAdd, ir.Apply(ir.EExp, x[0]), ir.Apply(ir.EExp, ir.Apply(ir.ENeg, x[0]))))
	}},
	"addcmul.default": {[]int{0, 1, 2}, func(l *lowerer, x []*ir.Expr) *ir.Expr {
		return ir.Apply(ir.EAdd, x[0], times(ir.Const(l.floatArg(3, "value", 1)), times(x[1], x[2])))
	}},
	"addcdiv.default": {[]int{0, 1, 2}, func(l *lowerer, x []*ir.Expr) *ir.Expr {
		return ir.Apply(ir.EAdd, x[0], times(ir.Const(l.floatArg(3, "value", 1)), ir.Apply(ir.EDiv, x[1], x[2])))
	}},
	"lerp.Scalar": {[]int{0, 1, 2}, func(_ *lowerer, x []*ir.Expr) *ir.Expr {
		return ir.Apply(ir.EAdd, x[0], times(x[2], ir.Apply(ir.ESub, x[1], x[0])))
	}},
	"lerp.Tensor": {[]int{0, 1, 2}, func(_ *lowerer, x []*ir.Expr) *ir.Expr {
		return ir.Apply(ir.EAdd, x[0], times(x[2], ir.Apply(ir.ESub, x[1], x[0])))
	}},
	"logical_xor.default": {[]int{0, 1}, func(_ *lowerer, x []*ir.Expr) *ir.Expr {
		return ir.Apply(ir.ENe, ir.Apply(ir.ENe, x[0], ir.Const(0)), ir.Apply(ir.ENe, x[1], ir.Const(0)))
	}},
	"bitwise_xor.Tensor": binary(ir.EXor),
	"bitwise_xor.Scalar": binary(ir.EXor),
	"atan2.default":      binary(ir.EAtan2),
	"triu.default":       triangle(true),
	"tril.default":       triangle(false),
}

func init() {
	for name, spec := range composites {
		elementwiseOps[name] = spec
	}
}

var elementwiseOps = map[string]ewSpec{
	"add.Tensor":           withAlpha(ir.EAdd),
	"add.Scalar":           withAlpha(ir.EAdd),
	"sub.Tensor":           withAlpha(ir.ESub),
	"sub.Scalar":           withAlpha(ir.ESub),
	"rsub.Scalar":          {[]int{1, 0}, func(l *lowerer, x []*ir.Expr) *ir.Expr { return withAlpha(ir.ESub).build(l, x) }},
	"rsub.Tensor":          {[]int{1, 0}, func(l *lowerer, x []*ir.Expr) *ir.Expr { return withAlpha(ir.ESub).build(l, x) }},
	"mul.Tensor":           binary(ir.EMul),
	"mul.Scalar":           binary(ir.EMul),
	"div.Tensor":           binary(ir.EDiv),
	"div.Scalar":           binary(ir.EDiv),
	"div.Tensor_mode":      divMode,
	"div.Scalar_mode":      divMode,
	"floor_divide.default": {[]int{0, 1}, func(_ *lowerer, x []*ir.Expr) *ir.Expr { return rounded(ir.EFloor, x[0], x[1]) }},
	"remainder.Tensor":     modulo(ir.EFloor),
	"remainder.Scalar":     modulo(ir.EFloor),
	"fmod.Tensor":          modulo(ir.ETrunc),
	"fmod.Scalar":          modulo(ir.ETrunc),
	"floor.default":        unary(ir.EFloor),
	"ceil.default": {[]int{0}, func(_ *lowerer, x []*ir.Expr) *ir.Expr {
		return ir.Apply(ir.ENeg, ir.Apply(ir.EFloor, ir.Apply(ir.ENeg, x[0])))
	}},
	"trunc.default":       unary(ir.ETrunc),
	"pow.Tensor_Scalar":   binary(ir.EPow),
	"pow.Tensor_Tensor":   binary(ir.EPow),
	"pow.Scalar":          binary(ir.EPow),
	"maximum.default":     binary(ir.EMax),
	"minimum.default":     binary(ir.EMin),
	"lt.Tensor":           binary(ir.ELt),
	"lt.Scalar":           binary(ir.ELt),
	"le.Tensor":           binary(ir.ELe),
	"le.Scalar":           binary(ir.ELe),
	"gt.Tensor":           binary(ir.EGt),
	"gt.Scalar":           binary(ir.EGt),
	"ge.Tensor":           binary(ir.EGe),
	"ge.Scalar":           binary(ir.EGe),
	"eq.Tensor":           binary(ir.EEq),
	"eq.Scalar":           binary(ir.EEq),
	"ne.Tensor":           binary(ir.ENe),
	"ne.Scalar":           binary(ir.ENe),
	"bitwise_and.Tensor":  binary(ir.EAnd),
	"bitwise_and.Scalar":  binary(ir.EAnd),
	"logical_and.default": logical(ir.EAnd),
	"bitwise_or.Tensor":   binary(ir.EOr),
	"bitwise_or.Scalar":   binary(ir.EOr),
	"logical_or.default":  logical(ir.EOr),
	"bitwise_not.default": unary(ir.ENot),
	"logical_not.default": unary(ir.ENot),
	"neg.default":         unary(ir.ENeg),
	"exp.default":         unary(ir.EExp),
	"log.default":         unary(ir.ELog),
	"sqrt.default":        unary(ir.ESqrt),
	"rsqrt.default":       unary(ir.ERsqrt),
	"sin.default":         unary(ir.ESin),
	"cos.default":         unary(ir.ECos),
	"tanh.default":        unary(ir.ETanh),
	"sigmoid.default":     unary(ir.ESigmoid),
	"silu.default":        unary(ir.ESilu),
	"relu.default":        unary(ir.ERelu),
	"abs.default":         unary(ir.EAbs),
	"reciprocal.default":  unary(ir.ERecip),
	"erf.default":         unary(ir.EErf),
	"isnan.default":       unary(ir.EIsNaN),
	"gelu.default": {[]int{0}, func(l *lowerer, x []*ir.Expr) *ir.Expr {
		if a := l.arg(-1, "approximate"); a != nil && a.S == "tanh" {
			return ir.Apply(ir.EGeluTanh, x[0])
		}
		return ir.Apply(ir.EGelu, x[0])
	}},
	"where.self":         {[]int{0, 1, 2}, func(_ *lowerer, x []*ir.Expr) *ir.Expr { return ir.Apply(ir.EWhere, x...) }},
	"where.Scalar":       {[]int{0, 1, 2}, func(_ *lowerer, x []*ir.Expr) *ir.Expr { return ir.Apply(ir.EWhere, x...) }},
	"where.ScalarSelf":   {[]int{0, 1, 2}, func(_ *lowerer, x []*ir.Expr) *ir.Expr { return ir.Apply(ir.EWhere, x...) }},
	"where.ScalarOther":  {[]int{0, 1, 2}, func(_ *lowerer, x []*ir.Expr) *ir.Expr { return ir.Apply(ir.EWhere, x...) }},
	"masked_fill.Scalar": {[]int{1, 2, 0}, func(_ *lowerer, x []*ir.Expr) *ir.Expr { return ir.Apply(ir.EWhere, x...) }},
	"masked_fill.Tensor": {[]int{1, 2, 0}, func(_ *lowerer, x []*ir.Expr) *ir.Expr { return ir.Apply(ir.EWhere, x...) }},
	"clamp.default": {[]int{0}, func(l *lowerer, x []*ir.Expr) *ir.Expr {
		e := x[0]
		if a := l.arg(1, "min"); !l.isNone(a) {
			e = ir.Apply(ir.EMax, e, ir.Const(l.floatArg(1, "min", 0)))
		}
		if a := l.arg(2, "max"); !l.isNone(a) {
			e = ir.Apply(ir.EMin, e, ir.Const(l.floatArg(2, "max", 0)))
		}
		return e
	}},
	"_to_copy.default":      unary(ir.ECast), // the cast itself is the final rounding
	"copy.default":          {[]int{1}, func(_ *lowerer, x []*ir.Expr) *ir.Expr { return x[0] }},
	"fill.Scalar":           constant(1, "value", 0),
	"scalar_tensor.default": constant(0, "s", 0),
	"full.default":          constant(1, "fill_value", 0),
	"full_like.default":     constant(1, "fill_value", 0),
	"new_full.default":      constant(2, "fill_value", 0),
	"zeros.default":         constant(-1, "", 0),
	"zeros_like.default":    constant(-1, "", 0),
	"new_zeros.default":     constant(-1, "", 0),
	"ones.default":          constant(-1, "", 1),
	"ones_like.default":     constant(-1, "", 1),
	"new_ones.default":      constant(-1, "", 1),
	"arange.default":        {nil, func(l *lowerer, _ []*ir.Expr) *ir.Expr { return ir.Index(0) }},
	"arange.start": {nil, func(l *lowerer, _ []*ir.Expr) *ir.Expr {
		return ir.Apply(ir.EAdd, ir.Const(l.floatArg(0, "start", 0)), ir.Index(0))
	}},
	"arange.start_step": {nil, func(l *lowerer, _ []*ir.Expr) *ir.Expr {
		step := ir.Apply(ir.EMul, ir.Index(0), ir.Const(l.floatArg(2, "step", 1)))
		return ir.Apply(ir.EAdd, ir.Const(l.floatArg(0, "start", 0)), step)
	}},
}

// elementwise lowers the current node through spec into an Elementwise op.
func (l *lowerer) elementwise(spec ewSpec) {
	dt := l.outDType(0)
	shape := l.outShape(0)
	var ins []ir.View
	args := make([]*ir.Expr, len(spec.operands))
	for k, pos := range spec.operands {
		a := l.arg(pos, "")
		if a == nil {
			l.failf("missing operand %d", pos)
		}
		switch a.K {
		case "node":
			ins = append(ins, broadcast(l, l.tensor(*a), shape))
			args[k] = ir.Load(len(ins) - 1)
		case "int":
			args[k] = ir.Const(float64(a.I))
		case "float":
			args[k] = ir.Const(a.Float())
		case "bool":
			args[k] = ir.Const(boolf(a.B))
		default:
			l.failf("operand %d is a %s, want a tensor or a number", pos, a.K)
		}
	}
	e := ir.Cast(dt, spec.build(l, args))
	if e.Args[0].Op == ir.ECast { // _to_copy: one cast is enough
		e = ir.Cast(dt, e.Args[0].Args[0])
	}
	out := l.temp(dt, shape)
	l.emit(&ir.Op{Kind: ir.Elementwise, In: ins, Out: out, Attr: ir.Attrs{Expr: e}})
	l.set(&out)
}

func boolf(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
