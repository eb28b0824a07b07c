package ir

import (
	"fmt"
	"strings"
)

// ExprOp is an operator of an elementwise expression.
type ExprOp int

const (
	ELoad  ExprOp = iota // the op's input Input, at the output index
	EConst               // Const
	EIndex               // the output index along Dim (arange)
	ECast                // round Args[0] to DType
	EAdd
	ESub
	EMul
	EDiv
	EPow
	EMax
	EMin
	ENeg
	EExp
	ELog
	ESqrt
	ERsqrt
	ESin
	ECos
	ETanh
	ESigmoid
	ESilu
	EGelu     // exact (erf) GELU
	EGeluTanh // tanh-approximated GELU
	EAbs
	ERecip
	ERelu
	EErf
	EWhere // Args[0] ? Args[1] : Args[2]
	ELt
	ELe
	EGt
	EGe
	EEq
	ENe
	EAnd
	EOr
	ENot
	EIsNaN
	EFloor
	ETrunc // toward zero
	EXor   // of the int64 values, as EAnd and EOr
	EAtan2 // atan2(Args[0], Args[1])
)

var exprNames = map[ExprOp]string{
	ELoad: "load", EConst: "const", EIndex: "index", ECast: "cast", EAdd: "add", ESub: "sub", EMul: "mul",
	EDiv: "div", EPow: "pow", EMax: "max", EMin: "min", ENeg: "neg", EExp: "exp", ELog: "log", ESqrt: "sqrt",
	ERsqrt: "rsqrt", ESin: "sin", ECos: "cos", ETanh: "tanh", ESigmoid: "sigmoid", ESilu: "silu", EGelu: "gelu",
	EGeluTanh: "gelu_tanh", EAbs: "abs", ERecip: "reciprocal", ERelu: "relu", EErf: "erf", EWhere: "where",
	ELt: "lt", ELe: "le", EGt: "gt", EGe: "ge", EEq: "eq", ENe: "ne", EAnd: "and", EOr: "or", ENot: "not", EIsNaN: "isnan",
	EFloor: "floor", ETrunc: "trunc", EXor: "xor", EAtan2: "atan2",
}

func (o ExprOp) String() string { return exprNames[o] }

// Arity is the number of arguments o takes (leaves take none).
func (o ExprOp) Arity() int {
	switch o {
	case ELoad, EConst, EIndex:
		return 0
	case EAdd, ESub, EMul, EDiv, EPow, EMax, EMin, ELt, ELe, EGt, EGe, EEq, ENe, EAnd, EOr:
		return 2
	case EWhere:
		return 3
	default:
		return 1
	}
}

// Expr is a node of an elementwise expression tree. Subtrees may be shared.
type Expr struct {
	Op    ExprOp
	Args  []*Expr
	Input int     // ELoad
	Const float64 // EConst
	Dim   int     // EIndex
	DType DType   // ECast target
}

func Load(i int) *Expr                  { return &Expr{Op: ELoad, Input: i} }
func Const(v float64) *Expr             { return &Expr{Op: EConst, Const: v} }
func Index(dim int) *Expr               { return &Expr{Op: EIndex, Dim: dim} }
func Cast(dt DType, a *Expr) *Expr      { return &Expr{Op: ECast, DType: dt, Args: []*Expr{a}} }
func Apply(op ExprOp, a ...*Expr) *Expr { return &Expr{Op: op, Args: a} }

// Map rebuilds e bottom-up, replacing each node by f(node with mapped args).
// Shared subtrees stay shared.
func (e *Expr) Map(f func(*Expr) *Expr) *Expr {
	memo := map[*Expr]*Expr{}
	var walk func(*Expr) *Expr
	walk = func(n *Expr) *Expr {
		if m, ok := memo[n]; ok {
			return m
		}
		c := *n
		c.Args = make([]*Expr, len(n.Args))
		for i, a := range n.Args {
			c.Args[i] = walk(a)
		}
		r := f(&c)
		memo[n] = r
		return r
	}
	return walk(e)
}

// Loads returns the set of input indices e reads.
func (e *Expr) Loads() map[int]bool {
	seen := map[int]bool{}
	e.Map(func(n *Expr) *Expr {
		if n.Op == ELoad {
			seen[n.Input] = true
		}
		return n
	})
	return seen
}

func (e *Expr) String() string {
	var sb strings.Builder
	var walk func(*Expr)
	walk = func(n *Expr) {
		switch n.Op {
		case ELoad:
			fmt.Fprintf(&sb, "in%d", n.Input)
			return
		case EConst:
			fmt.Fprintf(&sb, "%g", n.Const)
			return
		case EIndex:
			fmt.Fprintf(&sb, "idx%d", n.Dim)
			return
		case ECast:
			fmt.Fprintf(&sb, "%s(", n.DType)
		default:
			sb.WriteString(n.Op.String() + "(")
		}
		for i, a := range n.Args {
			if i > 0 {
				sb.WriteString(",")
			}
			walk(a)
		}
		sb.WriteString(")")
	}
	walk(e)
	return sb.String()
}
