// Package lower turns the wire graph (ATen ops) into the op graph (package
// ir) and rewrites it into task ops. Lowering goes by semantics: view ops
// become strided views, elementwise ATen ops become expression trees, and the
// rewrite passes (fuse.go, patterns.go) recognise RMSNorm, Linear, RoPE,
// SiLU·mul, grouped-query attention and in-place cache writes from what the
// ops compute, not from one version's exact graph.
package lower

import (
	"fmt"
	"strings"

	"mpk/gocore/ir"
	"mpk/gocore/wire"
)

// value is what a node name stands for: one view per tensor output (nil for
// non-tensor outputs).
type value []*ir.View

type lowerer struct {
	g    *ir.Graph
	env  map[string]value
	node *wire.Node
	// outMeta of the node being lowered, by output index.
	outs []*wire.Meta
}

// Config carries per-compile choices of the rewrite passes.
type Config struct {
	// Workers is the worker count the graph will run on; 0 leaves the
	// worker-dependent rewrites (split-KV attention) out.
	Workers int
	// RoundIntermediates keeps every half-precision intermediate in its own
	// dtype, rounding after each op as eager does (see widenTemps).
	RoundIntermediates bool
	// SplitRows cuts Linears whose x has too many rows to stream into
	// blocks of rows that do (splitLinearRows).
	SplitRows bool
	// PrefillRows runs a sequence's masked prompt chunk as decode attention
	// over its queries (queriesAsRows).
	PrefillRows bool
	// SplitK cuts Linears whose x is too large to stream into Linears over
	// slices of K and their sum (splitLinearK), before SplitRows.
	SplitK bool
	// Gemm streams Linears whose x has 32 rows or more a block of K at a
	// time (markGemm), before SplitK.
	Gemm bool
	// Wgmma marks those GEMM streams with bf16 weights for wgmma (markGemm).
	Wgmma bool
	// GemmBatch marks Linears with bf16 weights from GemmBatchMinRows rows
	// of x on (a decode batch) whose tasks cover the workers with K whole
	// as wgmma GEMM streams too (markGemm).
	GemmBatch bool
	// RoundGemmInputs keeps the x of each GEMM stream in the weights'
	// dtype, rounded as eager rounds it, where widenTemps would widen it
	// (gemmInputs).
	RoundGemmInputs bool
	// LongAttentionChunks gives a prompt chunk's attention with shared K and
	// V chunks of positions long enough for its tasks to fit one wave of
	// the workers (splitAttention).
	LongAttentionChunks bool
	// GemmRowBlocks lets a GEMM stream whose weight rows are too few to
	// cover the workers cut x's rows into blocks instead of K into slices
	// and their sum, where that costs less (gemmRowBlocks).
	GemmRowBlocks bool
	// GemmSiblings cuts a run of sibling GEMM streams (a chunk's q, k and
	// v projections) as one stage, by its cost (gemmRunCuts), rather than
	// each as if it ran alone.
	GemmSiblings bool
	// FreshRows folds a decode attention's RoPE and the step's new K and V
	// rows into it (freshRows): one dependent stage fewer a layer.
	FreshRows bool
	// PairLinears folds a gate projection into the up projection whose
	// store reads it (pairLinears): one dependent stage fewer a layer.
	PairLinears bool
	// PairGemm lets pairLinears pair GEMM streams too: a task's x block
	// meets the rows of both weights (mpk::linear_gemm with a PairEpi).
	PairGemm bool
	// PairTiles lets pairLinears pair tile streams too (a decode batch's
	// MLP): a task's staged x meets each row group of both weights
	// (mpk::linear_tiles with a PairEpi).
	PairTiles bool
	// BalanceGemmTail runs the short last round of a GEMM stream's tasks
	// as two streams over halves of x's rows (balanceGemmTail).
	BalanceGemmTail bool
	// TimedSchedule: the tasks go to workers by estimated times
	// (tgraph.Schedule), so a K-sliced GEMM stream reading a stage with a
	// short last round takes slices for that round's idle workers
	// (tailOverlapParts) and that stage's tail is not balanced.
	TimedSchedule bool
	// KVPages cuts a single sequence's decode attention into chunks of
	// kvPagePositions positions, a unit of a KV head's query heads each
	// (splitAttention), so that codegen can stream each task's K and V
	// chunk through the ring ahead of its inputs.
	KVPages bool
	// KVPagesBatch gives a decode batch's attention kv_pages' layout too
	// (pagedBatchSplit): a task a chunk of a KV head's heads of one row,
	// its K and V streamed through the ring.
	KVPagesBatch bool
}

// ConfigFor is the lowering a request's options ask for.
func ConfigFor(o wire.Options) Config {
	return Config{Workers: o.NumWorkers, RoundIntermediates: o.RoundIntermediates, SplitRows: o.SplitRows,
		PrefillRows: o.PrefillRows, SplitK: o.SplitK, Gemm: o.Gemm, Wgmma: o.Wgmma, GemmBatch: o.GemmBatch, GemmRowBlocks: o.GemmRowBlocks, GemmSiblings: o.GemmSiblings,
		LongAttentionChunks: o.LongAttentionChunks, RoundGemmInputs: o.RoundGemmInputs, FreshRows: o.FreshRows,
		PairLinears: o.PairLinears, PairGemm: o.PairGemm, PairTiles: o.PairTiles, BalanceGemmTail: o.BalanceGemmTail, KVPages: o.KVPages, KVPagesBatch: o.KVPagesBatch,
		TimedSchedule: o.TimedSchedule}
}

// Lower converts a wire graph into an op graph, then runs the rewrite passes.
func Lower(wg *wire.Graph) (*ir.Graph, *wire.Error) { return LowerWith(wg, Config{}) }

// LowerWith is Lower with a per-compile configuration.
func LowerWith(wg *wire.Graph, cfg Config) (g *ir.Graph, err *wire.Error) {
	l := &lowerer{g: &ir.Graph{}, env: map[string]value{}}
	defer func() {
		if r := recover(); r != nil {
			le, ok := r.(*wire.Error)
			if !ok {
				panic(r)
			}
			g, err = nil, le
		}
	}()
	l.inputs(wg.Inputs)
	for i := range wg.Nodes {
		l.node = &wg.Nodes[i]
		l.outs = l.node.Outs
		l.lowerNode()
	}
	l.node = nil
	for i, a := range wg.Outputs {
		if a.K != "node" {
			l.failf("graph output %d is a %s, not a tensor", i, a.K)
		}
		l.g.Outputs = append(l.g.Outputs, l.tensor(a).Clone())
	}
	Rewrite(l.g, cfg)
	return l.g, nil
}

// failf aborts lowering with an error located at the current node.
func (l *lowerer) failf(format string, args ...any) {
	e := &wire.Error{Kind: "invalid_graph", Message: fmt.Sprintf(format, args...)}
	if l.node != nil {
		e.Node, e.Op, e.Source = l.node.Name, l.node.Target, l.node.Source
	}
	panic(e)
}

func (l *lowerer) unsupported(what string) {
	e := &wire.Error{Kind: "unsupported_op",
		Message: fmt.Sprintf("mpk does not support %s", what),
		Node:    l.node.Name, Op: l.node.Target, Source: l.node.Source,
		Hint: "rewrite this line with supported ops, or run this part of the model outside torch.compile(backend=\"mpk\")"}
	panic(e)
}

func (l *lowerer) inputs(ins []wire.Input) {
	for i, in := range ins {
		dt, err := ir.ParseDType(in.Meta.DType)
		if err != nil {
			l.failf("input %s: %v", in.Name, err)
		}
		shape, strides := in.Meta.Shape, in.Meta.Strides
		if len(strides) != len(shape) {
			l.failf("input %s: %d strides for %d dims", in.Name, len(strides), len(shape))
		}
		checkShape(l, in.Name, shape)
		for d, s := range strides {
			if s < 0 {
				l.failf("input %s: negative stride %d in dim %d", in.Name, s, d)
			}
		}
		v := ir.View{Shape: append([]int64(nil), shape...), Strides: append([]int64(nil), strides...)}
		_, hi := (ir.View{Buf: &ir.Buffer{}, Shape: v.Shape, Strides: v.Strides}).Span()
		b := l.g.NewBuffer(in.Name, ir.Input, dt, hi)
		b.Index = i
		b.Param = in.Kind == "param"
		v.Buf = b
		l.g.Inputs = append(l.g.Inputs, b)
		l.env[in.Name] = value{&v}
	}
}

// maxDim bounds every dimension and element count the core accepts.
const maxDim = int64(1) << 36

func checkShape(l *lowerer, what string, shape []int64) {
	n := int64(1)
	for d, s := range shape {
		if s < 0 || s > maxDim {
			l.failf("%s: dimension %d has size %d, outside [0, 2^36]", what, d, s)
		}
		n *= s
		if n > maxDim {
			l.failf("%s: %d+ elements is more than mpk supports (2^36)", what, n)
		}
	}
}

// meta returns the output meta of the current node.
func (l *lowerer) meta(i int) *wire.Meta {
	if i >= len(l.outs) || l.outs[i] == nil {
		l.failf("node has no tensor metadata for output %d", i)
	}
	m := l.outs[i]
	checkShape(l, "output", m.Shape)
	return m
}

func (l *lowerer) outDType(i int) ir.DType {
	dt, err := ir.ParseDType(l.meta(i).DType)
	if err != nil {
		l.failf("%v", err)
	}
	return dt
}

func (l *lowerer) outShape(i int) []int64 { return append([]int64(nil), l.meta(i).Shape...) }

// arg returns positional argument i, or the keyword argument name, or nil.
func (l *lowerer) arg(i int, name string) *wire.Arg {
	if i >= 0 && i < len(l.node.Args) {
		return &l.node.Args[i]
	}
	if a, ok := l.node.Kwargs[name]; ok {
		return &a
	}
	return nil
}

func (l *lowerer) isNone(a *wire.Arg) bool { return a == nil || a.K == "none" }

func (l *lowerer) tensor(a wire.Arg) ir.View {
	if a.K != "node" {
		l.failf("expected a tensor argument, got %s", a.K)
	}
	val, ok := l.env[a.Node]
	if !ok {
		l.failf("argument refers to unknown node %q", a.Node)
	}
	if a.Index >= len(val) || val[a.Index] == nil {
		l.failf("argument %s[%d] is not a tensor mpk can use", a.Node, a.Index)
	}
	return *val[a.Index]
}

func (l *lowerer) tensorArg(i int, name string) ir.View {
	a := l.arg(i, name)
	if a == nil {
		l.failf("missing tensor argument %d (%s)", i, name)
	}
	return l.tensor(*a)
}

func (l *lowerer) intArg(i int, name string, def int64) int64 {
	a := l.arg(i, name)
	if l.isNone(a) {
		return def
	}
	switch a.K {
	case "int":
		return a.I
	case "bool":
		return int64(boolf(a.B))
	}
	l.failf("argument %d (%s) must be an int, got %s (symbolic sizes are not supported; compile with dynamic=False)", i, name, a.K)
	return 0
}

func (l *lowerer) floatArg(i int, name string, def float64) float64 {
	a := l.arg(i, name)
	if l.isNone(a) {
		return def
	}
	switch a.K {
	case "float":
		return a.Float()
	case "int":
		return float64(a.I)
	case "bool":
		return boolf(a.B)
	}
	l.failf("argument %d (%s) must be a number, got %s", i, name, a.K)
	return 0
}

func (l *lowerer) boolArg(i int, name string, def bool) bool {
	a := l.arg(i, name)
	if l.isNone(a) {
		return def
	}
	if a.K == "bool" {
		return a.B
	}
	if a.K == "int" {
		return a.I != 0
	}
	l.failf("argument %d (%s) must be a bool, got %s", i, name, a.K)
	return false
}

func (l *lowerer) intsArg(i int, name string) []int64 {
	a := l.arg(i, name)
	if l.isNone(a) {
		return nil
	}
	if a.K == "int" {
		return []int64{a.I}
	}
	if a.K != "list" {
		l.failf("argument %d (%s) must be a list of ints, got %s", i, name, a.K)
	}
	out := make([]int64, len(a.List))
	for j, e := range a.List {
		if e.K != "int" {
			l.failf("argument %d (%s) element %d must be an int, got %s (symbolic sizes are not supported; compile with dynamic=False)", i, name, j, e.K)
		}
		out[j] = e.I
	}
	return out
}

func (l *lowerer) dtypeArg(i int, name string) (ir.DType, bool) {
	a := l.arg(i, name)
	if l.isNone(a) {
		return 0, false
	}
	if a.K != "dtype" {
		l.failf("argument %s must be a dtype, got %s", name, a.K)
	}
	dt, err := ir.ParseDType(a.S)
	if err != nil {
		l.failf("%v", err)
	}
	return dt, true
}

// set binds the current node's outputs.
func (l *lowerer) set(vs ...*ir.View) {
	for i, v := range vs {
		if v == nil || i >= len(l.outs) || l.outs[i] == nil {
			continue
		}
		if !equalShape(v.Shape, l.outs[i].Shape) {
			l.failf("internal: lowered shape %v differs from traced shape %v", v.Shape, l.outs[i].Shape)
		}
	}
	l.env[l.node.Name] = value(vs)
}

func equalShape(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// emit appends an op located at the current node.
func (l *lowerer) emit(op *ir.Op) *ir.Op {
	op.Node, op.Target, op.Source = l.node.Name, l.node.Target, l.node.Source
	op.ID = len(l.g.Ops)
	l.g.Ops = append(l.g.Ops, op)
	return op
}

// temp allocates the output buffer of the current node.
func (l *lowerer) temp(dt ir.DType, shape []int64) ir.View {
	return l.g.NewTemp(l.node.Name, dt, shape)
}

// noOps are ATen calls that only assert metadata; they produce nothing to run.
var noOps = map[string]bool{
	"aten._assert_tensor_metadata.default":      true,
	"aten._assert_scalar.default":               true,
	"aten._assert_async.msg":                    true,
	"aten.sym_constrain_range_for_size.default": true,
}

func (l *lowerer) lowerNode() {
	t := l.node.Target
	if noOps[t] {
		return
	}
	name := t
	if strings.HasPrefix(name, "aten.") {
		name = strings.TrimPrefix(name, "aten.")
	}
	if f, ok := viewOps[name]; ok {
		l.set(f(l))
		return
	}
	if f, ok := splitOps[name]; ok {
		l.set(f(l)...)
		return
	}
	if b, ok := elementwiseOps[name]; ok {
		l.elementwise(b)
		return
	}
	if f, ok := computeOps[name]; ok {
		f(l)
		return
	}
	if isAttention(name) {
		l.attention(name)
		return
	}
	l.unsupported(fmt.Sprintf("the operator %s", t))
}
