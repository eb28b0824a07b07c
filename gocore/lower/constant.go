package lower

import (
	"fmt"
	"math"

	"mpk/gocore/ir"
)

// maxSelectConstant bounds the values of a constant built by a chain of
// selects (each element walks the chain).
const maxSelectConstant = 64

// constantOp lowers a tensor constant the graph reads ("mpk.constant": the
// values of a get_attr tensor in row-major order, see python/mpk/export.py)
// to an elementwise op with no inputs that computes it, so the constant is
// part of the compiled module: one value everywhere, an arithmetic
// progression in the flat index, or, for a few values, selects on the flat
// index.
func constantOp(l *lowerer) {
	dt, shape := l.outDType(0), l.outShape(0)
	a := l.arg(0, "values")
	if a == nil || a.K != "list" {
		l.failf("a tensor constant needs its list of values")
	}
	vals := make([]float64, len(a.List))
	for i := range a.List {
		switch e := a.List[i]; e.K {
		case "int":
			vals[i] = float64(e.I)
		case "float":
			vals[i] = e.Float()
		case "bool":
			vals[i] = boolf(e.B)
		default:
			l.failf("tensor constant value %d is a %s, want a number", i, e.K)
		}
	}
	if int64(len(vals)) != ir.Numel(shape) {
		l.failf("tensor constant of shape %v has %d values", shape, len(vals))
	}
	e := constantExpr(vals, shape)
	if e == nil {
		l.unsupported(fmt.Sprintf("a tensor constant of %d distinct values (mpk embeds up to %d, or any arithmetic progression)", len(vals), maxSelectConstant))
	}
	out := l.temp(dt, shape)
	l.emit(&ir.Op{Kind: ir.Elementwise, Out: out, Attr: ir.Attrs{Expr: ir.Cast(dt, e)}})
	l.set(&out)
}

// constantExpr computes vals (row-major over shape) from the output index, or
// returns nil when the values are too many and follow no progression.
func constantExpr(vals []float64, shape []int64) *ir.Expr {
	n := len(vals)
	same := func(a, b float64) bool { return a == b || math.IsNaN(a) && math.IsNaN(b) }
	uniform := true
	for _, v := range vals {
		uniform = uniform && same(v, vals[0])
	}
	if n == 0 || uniform {
		if n == 0 {
			return ir.Const(0)
		}
		return ir.Const(vals[0])
	}
	flat := flatIndex(shape)
	step := vals[1] - vals[0]
	progression := !math.IsNaN(step) && !math.IsInf(step, 0)
	for i, v := range vals {
		progression = progression && v == vals[0]+float64(i)*step
	}
	if progression {
		return ir.Apply(ir.EAdd, ir.Const(vals[0]), ir.Apply(ir.EMul, flat, ir.Const(step)))
	}
	if n > maxSelectConstant {
		return nil
	}
	e := ir.Const(vals[n-1])
	for i := n - 2; i >= 0; i-- {
		e = ir.Apply(ir.EWhere, ir.Apply(ir.EEq, flat, ir.Const(float64(i))), ir.Const(vals[i]), e)
	}
	return e
}

// flatIndex is the row-major flat position of the output index in shape.
func flatIndex(shape []int64) *ir.Expr {
	st := ir.ContiguousStrides(shape)
	var e *ir.Expr
	for d := range shape {
		if shape[d] == 1 {
			continue
		}
		t := ir.Apply(ir.EMul, ir.Index(d), ir.Const(float64(st[d])))
		if e == nil {
			e = t
		} else {
			e = ir.Apply(ir.EAdd, e, t)
		}
	}
	if e == nil {
		return ir.Const(0)
	}
	return e
}
