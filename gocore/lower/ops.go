package lower

import (
	"math"
	"slices"
	"strings"

	"mpk/gocore/ir"
)

// computeOps lower the ATen ops that are not elementwise and not views.
var computeOps = map[string]func(l *lowerer){
	"mm.default":                 mmOp,
	"bmm.default":                bmmOp,
	"addmm.default":              addmmOp,
	"baddbmm.default":            baddbmmOp,
	"gather.default":             gatherOp,
	"mean.dim":                   reduceOp("mean"),
	"mean.default":               reduceOp("mean"),
	"sum.dim_IntList":            reduceOp("sum"),
	"sum.default":                reduceOp("sum"),
	"amax.default":               reduceOp("amax"),
	"amin.default":               reduceOp("amin"),
	"argmax.default":             reduceOp("argmax"),
	"cumsum.default":             cumsumOp,
	"argmin.default":             argminOp,
	"max.dim":                    extremumDimOp("amax"),
	"min.dim":                    extremumDimOp("amin"),
	"any.dim":                    truthOp("amax"),
	"any.dims":                   truthOp("amax"),
	"any.default":                truthOp("amax"),
	"all.dim":                    truthOp("amin"),
	"all.dims":                   truthOp("amin"),
	"all.default":                truthOp("amin"),
	"var.correction":             varianceOp(false),
	"std.correction":             varianceOp(true),
	"logsumexp.default":          logsumexpOp,
	"linalg_vector_norm.default": vectorNormOp,
	"index_select.default":       indexSelectOp,
	"flip.default":               flipOp,
	"_softmax.default":           softmaxOp,
	"_log_softmax.default":       logSoftmaxOp,
	"nll_loss_forward.default":   nllLossOp,
	"native_layer_norm.default":  layerNormOp,
	"embedding.default":          embeddingOp,
	"index.Tensor":               indexOp,
	"cat.default":                joinOp(false),
	"stack.default":              joinOp(true),
	"roll.default":               rollOp,
	"repeat.default":             repeatOp,
	"index_put.default":          indexPutOp(false),
	"index_put_.default":         indexPutOp(true),
	"index_copy.default":         indexCopyOp(false),
	"index_copy_.default":        indexCopyOp(true),
	"copy_.default":              copyInPlaceOp,
	"clone.default":              cloneOp,
	"lift_fresh_copy.default":    cloneOp,
	"contiguous.default":         cloneOp,
	"constant_pad_nd.default":    padOp,
	"mpk.constant":               constantOp,
}

// padOp lowers constant_pad_nd: fill the output with the value, then copy the
// input into its interior (negative pads crop the input).
func padOp(l *lowerer) {
	x := l.tensorArg(0, "self")
	pad := l.intsArg(1, "pad")
	value := l.floatArg(2, "value", 0)
	dt, shape := l.outDType(0), l.outShape(0)
	if len(pad)%2 != 0 || len(pad)/2 > x.Rank() {
		l.failf("constant_pad_nd with %d pad values for a %d-d tensor", len(pad), x.Rank())
	}
	out := l.temp(dt, shape)
	l.emit(&ir.Op{Kind: ir.Elementwise, Out: out, Attr: ir.Attrs{Expr: ir.Cast(dt, ir.Const(value))}})
	src, dst := x.Clone(), out.Clone()
	for i := 0; i < len(pad); i += 2 {
		d := x.Rank() - 1 - i/2
		left, right := pad[i], pad[i+1]
		if left >= 0 {
			dst.Offset += left * dst.Strides[d]
		} else {
			src.Offset -= left * src.Strides[d]
			src.Shape[d] += left
		}
		if right < 0 {
			src.Shape[d] += right
		}
		if src.Shape[d] < 0 {
			src.Shape[d] = 0
		}
		dst.Shape[d] = src.Shape[d]
	}
	if src.Numel() > 0 {
		l.emit(&ir.Op{Kind: ir.Copy, In: []ir.View{src}, Out: dst})
	}
	l.set(&out)
}

// matmul emits out[b] = a[b] @ bm[b] for 3-d views and returns the out view.
func (l *lowerer) matmul(a, bm ir.View) ir.View {
	if a.Rank() != 3 || bm.Rank() != 3 || a.Shape[2] != bm.Shape[1] || a.Shape[0] != bm.Shape[0] {
		l.failf("matmul of %v by %v", a.Shape, bm.Shape)
	}
	if a.DType() != bm.DType() {
		l.failf("matmul of %s by %s: mixed dtypes", a.DType(), bm.DType())
	}
	out := l.temp(a.DType(), []int64{a.Shape[0], a.Shape[1], bm.Shape[2]})
	if a.Shape[2] == 1 {
		// An outer product (RoPE's angles: inv_freq @ position) is elementwise,
		// one rounding of one product as the matmul's, so it folds into its readers.
		av := ir.View{Buf: a.Buf, Offset: a.Offset, Shape: out.Shape, Strides: []int64{a.Strides[0], a.Strides[1], 0}}
		bv := ir.View{Buf: bm.Buf, Offset: bm.Offset, Shape: out.Shape, Strides: []int64{bm.Strides[0], 0, bm.Strides[2]}}
		l.emit(&ir.Op{Kind: ir.Elementwise, In: []ir.View{av.Clone(), bv.Clone()}, Out: out,
			Attr: ir.Attrs{Expr: ir.Cast(a.DType(), ir.Apply(ir.EMul, ir.Load(0), ir.Load(1)))}})
		return out
	}
	l.emit(&ir.Op{Kind: ir.Matmul, In: []ir.View{a, bm}, Out: out})
	return out
}

// batch1 views a 2-d tensor as a batch of one.
func batch1(v ir.View) ir.View {
	return ir.View{Buf: v.Buf, Offset: v.Offset, Shape: append([]int64{1}, v.Shape...), Strides: append([]int64{0}, v.Strides...)}
}

func unbatch(v ir.View) ir.View {
	return ir.View{Buf: v.Buf, Offset: v.Offset, Shape: v.Shape[1:], Strides: v.Strides[1:]}
}

func mmOp(l *lowerer) {
	a, b := l.tensorArg(0, "self"), l.tensorArg(1, "mat2")
	out := unbatch(l.matmul(batch1(a), batch1(b)))
	l.set(&out)
}

func bmmOp(l *lowerer) {
	out := l.matmul(l.tensorArg(0, "self"), l.tensorArg(1, "mat2"))
	l.set(&out)
}

func addmmOp(l *lowerer) {
	bias := l.tensorArg(0, "self")
	prod := unbatch(l.matmul(batch1(l.tensorArg(1, "mat1")), batch1(l.tensorArg(2, "mat2"))))
	l.addScaled(bias, prod)
}

// baddbmm is beta·self + alpha·(b1 @ b2) over a batch.
func baddbmmOp(l *lowerer) {
	self := l.tensorArg(0, "self")
	l.addScaled(self, l.matmul(l.tensorArg(1, "batch1"), l.tensorArg(2, "batch2")))
}

// addScaled emits and binds beta·c + alpha·prod (the beta and alpha keyword
// arguments), c broadcast to prod's shape. A plain bias add (beta = alpha =
// 1) stays add(c, prod), which the fuse_residual pass folds into the Linear's
// store.
func (l *lowerer) addScaled(c, prod ir.View) {
	beta, alpha := l.floatArg(-1, "beta", 1), l.floatArg(-1, "alpha", 1)
	dt := l.outDType(0)
	out := l.temp(dt, prod.Shape)
	scaled := func(i int, k float64) *ir.Expr {
		if k == 1 {
			return ir.Load(i)
		}
		return ir.Apply(ir.EMul, ir.Load(i), ir.Const(k))
	}
	e := ir.Apply(ir.EAdd, scaled(0, beta), scaled(1, alpha))
	l.emit(&ir.Op{Kind: ir.Elementwise, In: []ir.View{broadcast(l, c, prod.Shape), prod}, Out: out, Attr: ir.Attrs{Expr: ir.Cast(dt, e)}})
	l.set(&out)
}

// reduceOp lowers reductions over a set of dims: the input is permuted so the
// reduced dims trail, and the result is viewed back with keepdim if asked.
func reduceOp(kind string) func(l *lowerer) {
	return func(l *lowerer) {
		x := l.tensorArg(0, "self")
		var dims []int64
		keep := false
		if kind == "argmax" {
			if a := l.arg(1, "dim"); !l.isNone(a) {
				dims = []int64{l.intArg(1, "dim", 0)}
			}
			keep = l.boolArg(2, "keepdim", false)
		} else if strings.HasPrefix(l.node.Target, "aten.sum.default") || strings.HasPrefix(l.node.Target, "aten.mean.default") {
		} else {
			dims = l.intsArg(1, "dim")
			keep = l.boolArg(2, "keepdim", false)
		}
		v := l.reduce(kind, x, dims, l.outDType(0), keep)
		l.set(&v)
	}
}

// cumsumOp lowers cumsum along a dim as a sum over a triangle: out[.., i] =
// Σ_{j ≤ i} x[.., j] is an elementwise op over [.., N, N] (x broadcast along
// i, zero where j > i) and a sum of its last dim. N² work: a cumsum in an
// LLM's graph counts along a row of a mask or of positions (Hugging Face's
// packed-sequence detection, a call without a cache), not hidden states.
func cumsumOp(l *lowerer) {
	x := l.tensorArg(0, "self")
	dt := l.outDType(0)
	d := wrapDim(l, l.intArg(1, "dim", 0), x.Rank())
	if x.Rank() == 0 { // a scalar's cumsum is itself
		out := l.temp(dt, nil)
		l.emit(&ir.Op{Kind: ir.Elementwise, In: []ir.View{x}, Out: out, Attr: ir.Attrs{Expr: ir.Cast(dt, ir.Load(0))}})
		l.set(&out)
		return
	}
	perm := make([]int, 0, x.Rank()) // d last
	for i := range x.Rank() {
		if i != d {
			perm = append(perm, i)
		}
	}
	perm = append(perm, d)
	xp := permute(x, perm)
	r := xp.Rank() + 1 // [.., i, j]
	rows := ir.View{Buf: xp.Buf, Offset: xp.Offset,
		Shape:   append(slices.Clone(xp.Shape), xp.Shape[r-2]),
		Strides: append(slices.Clone(xp.Strides), xp.Strides[r-2])}
	rows.Strides[r-2] = 0
	tri := l.temp(dt, rows.Shape)
	upTo := ir.Apply(ir.EWhere, ir.Apply(ir.ELe, ir.Index(r-1), ir.Index(r-2)), ir.Load(0), ir.Const(0))
	l.emit(&ir.Op{Kind: ir.Elementwise, In: []ir.View{rows}, Out: tri, Attr: ir.Attrs{Expr: ir.Cast(dt, upTo)}})
	sum := l.reduce("sum", tri, []int64{int64(r - 1)}, dt, false)
	back := make([]int, len(perm)) // x's dim order again
	for i, p := range perm {
		back[p] = i
	}
	out := permute(sum, back)
	l.set(&out)
}

// pointwise emits one elementwise op of e over the inputs (broadcast to
// shape) and returns its output.
func (l *lowerer) pointwise(dt ir.DType, shape []int64, e *ir.Expr, in ...ir.View) ir.View {
	ins := make([]ir.View, len(in))
	for i, v := range in {
		ins[i] = broadcast(l, v, shape)
	}
	out := l.temp(dt, shape)
	l.emit(&ir.Op{Kind: ir.Elementwise, In: ins, Out: out, Attr: ir.Attrs{Expr: ir.Cast(dt, e)}})
	return out
}

// dimsArg reads a reduction's dims: an int, a list, or none (all dims).
func (l *lowerer) dimsArg(i int) []int64 {
	a := l.arg(i, "dim")
	if l.isNone(a) {
		return nil
	}
	return l.intsArg(i, "dim")
}

// argminOp is argmax of -x (the first of equal minima, as torch).
func argminOp(l *lowerer) {
	x := l.tensorArg(0, "self")
	var dims []int64
	if !l.isNone(l.arg(1, "dim")) {
		dims = []int64{l.intArg(1, "dim", 0)}
	}
	neg := l.pointwise(ir.F64, x.Shape, ir.Apply(ir.ENeg, ir.Load(0)), x)
	v := l.reduce("argmax", neg, dims, l.outDType(0), l.boolArg(2, "keepdim", false))
	l.set(&v)
}

// extremumDimOp lowers max.dim and min.dim: the values and their indices.
func extremumDimOp(kind string) func(l *lowerer) {
	return func(l *lowerer) {
		x := l.tensorArg(0, "self")
		dims, keep := []int64{l.intArg(1, "dim", 0)}, l.boolArg(2, "keepdim", false)
		vals := l.reduce(kind, x, dims, l.outDType(0), keep)
		src := x
		if kind == "amin" {
			src = l.pointwise(ir.F64, x.Shape, ir.Apply(ir.ENeg, ir.Load(0)), x)
		}
		idx := l.reduce("argmax", src, dims, l.outDType(1), keep)
		l.set(&vals, &idx)
	}
}

// truthOp lowers any (amax) and all (amin) of x != 0.
func truthOp(kind string) func(l *lowerer) {
	return func(l *lowerer) {
		x := l.tensorArg(0, "self")
		nz := l.pointwise(ir.Bool, x.Shape, ir.Apply(ir.ENe, ir.Load(0), ir.Const(0)), x)
		v := l.reduce(kind, nz, l.dimsArg(1), l.outDType(0), l.boolArg(2, "keepdim", false))
		l.set(&v)
	}
}

// varianceOp lowers var and std: Σ(x - mean)² / (N - correction), in
// float64, then its square root for std.
func varianceOp(root bool) func(l *lowerer) {
	return func(l *lowerer) {
		x := l.tensorArg(0, "self")
		dims, keep := l.dimsArg(1), l.boolArg(-1, "keepdim", false)
		n := int64(1)
		for d := range x.Shape {
			if len(dims) == 0 || slices.Contains(dims, int64(d)) || slices.Contains(dims, int64(d-x.Rank())) {
				n *= x.Shape[d]
			}
		}
		corr := l.floatArg(-1, "correction", 1)
		mean := l.reduce("mean", x, dims, ir.F64, true)
		dev := ir.Apply(ir.ESub, ir.Load(0), ir.Load(1))
		sq := l.pointwise(ir.F64, x.Shape, ir.Apply(ir.EMul, dev, dev), x, mean)
		sum := l.reduce("sum", sq, dims, ir.F64, keep)
		e := ir.Apply(ir.EDiv, ir.Load(0), ir.Const(max(float64(n)-corr, 0)))
		if root {
			e = ir.Apply(ir.ESqrt, e)
		}
		out := l.pointwise(l.outDType(0), sum.Shape, e, sum)
		l.set(&out)
	}
}

// logsumexpOp: max + log Σ exp(x - max), the max taken as 0 where it is
// infinite (a row of -inf gives -inf, as torch).
func logsumexpOp(l *lowerer) {
	x := l.tensorArg(0, "self")
	dims, keep := l.dimsArg(1), l.boolArg(2, "keepdim", false)
	mx := l.reduce("amax", x, dims, ir.F64, true)
	finite := l.pointwise(ir.F64, mx.Shape, ir.Apply(ir.EWhere,
		ir.Apply(ir.EEq, ir.Apply(ir.EAbs, ir.Load(0)), ir.Const(math.Inf(1))), ir.Const(0), ir.Load(0)), mx)
	e := l.pointwise(ir.F64, x.Shape, ir.Apply(ir.EExp, ir.Apply(ir.ESub, ir.Load(0), ir.Load(1))), x, finite)
	sum := l.reduce("sum", e, dims, ir.F64, keep)
	shift := finite
	if !keep {
		shift = l.reduce("amax", finite, dims, ir.F64, false) // the same values, without the kept dims
	}
	out := l.pointwise(l.outDType(0), sum.Shape, ir.Apply(ir.EAdd, ir.Apply(ir.ELog, ir.Load(0)), ir.Load(1)), sum, shift)
	l.set(&out)
}

// vectorNormOp lowers linalg_vector_norm: (Σ|x|^p)^(1/p); p = inf is the
// largest |x|, p = 0 the count of nonzeros.
func vectorNormOp(l *lowerer) {
	x := l.tensorArg(0, "self")
	p := l.floatArg(1, "ord", 2)
	dims, keep := l.dimsArg(2), l.boolArg(3, "keepdim", false)
	dt := l.outDType(0)
	abs := ir.Apply(ir.EAbs, ir.Load(0))
	var out ir.View
	switch {
	case math.IsInf(p, 1):
		out = l.reduce("amax", l.pointwise(ir.F64, x.Shape, abs, x), dims, dt, keep)
	case math.IsInf(p, -1):
		out = l.reduce("amin", l.pointwise(ir.F64, x.Shape, abs, x), dims, dt, keep)
	case p == 0:
		out = l.reduce("sum", l.pointwise(ir.F64, x.Shape, ir.Apply(ir.ENe, ir.Load(0), ir.Const(0)), x), dims, dt, keep)
	default:
		pw := l.pointwise(ir.F64, x.Shape, ir.Apply(ir.EPow, abs, ir.Const(p)), x)
		sum := l.reduce("sum", pw, dims, ir.F64, keep)
		out = l.pointwise(dt, sum.Shape, ir.Apply(ir.EPow, ir.Load(0), ir.Const(1/p)), sum)
	}
	l.set(&out)
}

// indexSelectOp is a gather along dim with the index broadcast over the
// other dims.
func indexSelectOp(l *lowerer) {
	x := l.tensorArg(0, "self")
	d := wrapDim(l, l.intArg(1, "dim", 0), x.Rank())
	idx := l.tensorArg(2, "index")
	if idx.Rank() > 1 {
		l.failf("index_select with a %d-d index", idx.Rank())
	}
	if x.Rank() == 0 {
		out := l.pointwise(x.DType(), nil, ir.Load(0), x)
		l.set(&out)
		return
	}
	shape := slices.Clone(x.Shape)
	shape[d] = idx.Numel()
	strides := make([]int64, x.Rank())
	if idx.Rank() == 1 {
		strides[d] = idx.Strides[0]
	}
	out := l.gather(x, d, ir.View{Buf: idx.Buf, Offset: idx.Offset, Shape: shape, Strides: strides})
	l.set(&out)
}

// flipOp reverses x along dims: a Gather of the element at the mirrored
// index (views keep positive strides).
func flipOp(l *lowerer) {
	x := l.tensorArg(0, "self")
	flip := make([]bool, x.Rank())
	for _, d := range l.intsArg(1, "dims") {
		flip[wrapDim(l, d, x.Rank())] = true
	}
	at := elementAt(x, func(e int) *ir.Expr {
		if flip[e] {
			return ir.Apply(ir.ESub, ir.Const(float64(x.Shape[e]-1)), ir.Index(e))
		}
		return ir.Index(e)
	})
	out := l.readAt(x, l.pointwise(ir.I64, x.Shape, at))
	l.set(&out)
}

// elementAt is the offset in x's buffer of x's element at index idx(e)
// along each dim e (a dim of one element or of stride 0 adds nothing).
func elementAt(x ir.View, idx func(e int) *ir.Expr) *ir.Expr {
	at := ir.Const(float64(x.Offset))
	for e := range x.Shape {
		if x.Shape[e] > 1 && x.Strides[e] != 0 {
			at = ir.Apply(ir.EAdd, at, ir.Apply(ir.EMul, idx(e), ir.Const(float64(x.Strides[e]))))
		}
	}
	return at
}

// readAt is the elements of x's buffer at the offsets pos (a Gather; an
// offset past the buffer is an index error).
func (l *lowerer) readAt(x ir.View, pos ir.View) ir.View {
	out := l.temp(x.DType(), pos.Shape)
	whole := ir.View{Buf: x.Buf, Shape: []int64{x.Buf.Numel}, Strides: []int64{1}}
	l.emit(&ir.Op{Kind: ir.Gather, In: []ir.View{whole, pos}, Out: out})
	return out
}

func (l *lowerer) reduce(kind string, x ir.View, dims []int64, dt ir.DType, keep bool) ir.View {
	red := make([]bool, x.Rank())
	if len(dims) == 0 {
		for i := range red {
			red[i] = true
		}
	}
	for _, d := range dims {
		red[wrapDim(l, d, x.Rank())] = true
	}
	var perm []int
	var keptShape, keepShape []int64
	for d := range red {
		if !red[d] {
			perm = append(perm, d)
			keptShape = append(keptShape, x.Shape[d])
			keepShape = append(keepShape, x.Shape[d])
		} else {
			keepShape = append(keepShape, 1)
		}
	}
	nred := 0
	for d := range red {
		if red[d] {
			perm = append(perm, d)
			nred++
		}
	}
	in := x
	if x.Rank() > 0 {
		in = permute(x, perm)
	}
	out := l.temp(dt, keptShape)
	l.emit(&ir.Op{Kind: ir.Reduce, In: []ir.View{in}, Out: out, Attr: ir.Attrs{Reduce: kind, Dims: nred}})
	if keep {
		return ir.View{Buf: out.Buf, Shape: keepShape, Strides: ir.ContiguousStrides(keepShape)}
	}
	return out
}

// softmaxParts is softmax's max and Σ exp(x - max) along dim d (kept),
// and the exponentials, all in float32.
func softmaxParts(l *lowerer, x ir.View, d int) (mx, e, sum ir.View) {
	mx = l.reduce("amax", x, []int64{int64(d)}, ir.F32, true)
	e = l.pointwise(ir.F32, x.Shape, ir.Apply(ir.EExp, ir.Apply(ir.ESub, ir.Load(0), ir.Load(1))), x, mx)
	return mx, e, l.reduce("sum", e, []int64{int64(d)}, ir.F32, true)
}

// softmaxOp decomposes softmax into max, exp, sum and divide ops.
func softmaxOp(l *lowerer) {
	x := l.tensorArg(0, "self")
	_, e, sum := softmaxParts(l, x, wrapDim(l, l.intArg(1, "dim", -1), x.Rank()))
	out := l.pointwise(l.outDType(0), x.Shape, ir.Apply(ir.EDiv, ir.Load(0), ir.Load(1)), e, sum)
	l.set(&out)
}

// logSoftmaxOp: x - max - log Σ exp(x - max) along dim.
func logSoftmaxOp(l *lowerer) {
	x := l.tensorArg(0, "self")
	mx, _, sum := softmaxParts(l, x, wrapDim(l, l.intArg(1, "dim", -1), x.Rank()))
	shifted := ir.Apply(ir.ESub, ir.Load(0), ir.Load(1))
	out := l.pointwise(l.outDType(0), x.Shape, ir.Apply(ir.ESub, shifted, ir.Apply(ir.ELog, ir.Load(2))), x, mx, sum)
	l.set(&out)
}

// nllLossOp lowers nll_loss_forward (cross_entropy's second half: a
// language model's loss for labels) without class weights: each row's
// -logp[target], none where the target is ignore_index, then per reduction
// (0 none, 1 mean over the counted rows, 2 sum); the second output is the
// count of rows (0 for none).
func nllLossOp(l *lowerer) {
	lp, t := l.tensorArg(0, "self"), l.tensorArg(1, "target")
	if !l.isNone(l.arg(2, "weight")) {
		l.failf("nll_loss with class weights is not supported")
	}
	reduction, ignore := l.intArg(3, "reduction", 1), float64(l.intArg(4, "ignore_index", -100))
	single := lp.Rank() == 1
	if single { // one row: [C] and a scalar target
		lp = ir.View{Buf: lp.Buf, Offset: lp.Offset, Shape: []int64{1, lp.Shape[0]}, Strides: []int64{0, lp.Strides[0]}}
		t = ir.View{Buf: t.Buf, Offset: t.Offset, Shape: []int64{1}, Strides: []int64{0}}
	}
	if lp.Rank() != 2 || t.Rank() != 1 || t.Shape[0] != lp.Shape[0] || reduction < 0 || reduction > 2 {
		l.failf("nll_loss of %v log-probabilities, %v targets and reduction %d", lp.Shape, t.Shape, reduction)
	}
	N := t.Shape[0]
	kept := ir.Apply(ir.ENe, ir.Load(0), ir.Const(ignore))
	target := l.temp(ir.I64, []int64{N, 1}) // an ignored row reads class 0, then counts for nothing
	l.emit(&ir.Op{Kind: ir.Elementwise, In: []ir.View{t}, Out: ir.View{Buf: target.Buf, Shape: []int64{N}, Strides: []int64{1}},
		Attr: ir.Attrs{Expr: ir.Cast(ir.I64, ir.Apply(ir.EWhere, kept, ir.Load(0), ir.Const(0)))}})
	picked := l.gather(lp, 1, target)
	loss := l.temp(ir.F32, []int64{N})
	l.emit(&ir.Op{Kind: ir.Elementwise, In: []ir.View{ir.View{Buf: picked.Buf, Shape: []int64{N}, Strides: []int64{1}}, t}, Out: loss,
		Attr: ir.Attrs{Expr: ir.Cast(ir.F32, ir.Apply(ir.EWhere, ir.Apply(ir.ENe, ir.Load(1), ir.Const(ignore)),
			ir.Apply(ir.ENeg, ir.Load(0)), ir.Const(0)))}})
	dt := l.outDType(0)
	if reduction == 0 {
		out := l.pointwise(dt, []int64{N}, ir.Load(0), loss)
		if single { // one row without reduction: a scalar
			out = ir.View{Buf: out.Buf}
		}
		weight := l.pointwise(l.outDType(1), nil, ir.Const(0))
		l.set(&out, &weight)
		return
	}
	weight := l.reduce("sum", l.pointwise(ir.F32, []int64{N}, kept, t), nil, l.outDType(1), false)
	var out ir.View
	switch reduction {
	case 1:
		sum := l.reduce("sum", loss, nil, ir.F32, false)
		out = l.temp(dt, nil)
		l.emit(&ir.Op{Kind: ir.Elementwise, In: []ir.View{sum, weight}, Out: out,
			Attr: ir.Attrs{Expr: ir.Cast(dt, ir.Apply(ir.EDiv, ir.Load(0), ir.Load(1)))}})
	case 2:
		out = l.reduce("sum", loss, nil, dt, false)
	}
	l.set(&out, &weight)
}

func embeddingOp(l *lowerer) {
	w, idx := l.tensorArg(0, "weight"), l.tensorArg(1, "indices")
	if w.Rank() != 2 {
		l.failf("embedding table must be 2-d, got %v", w.Shape)
	}
	out := l.temp(w.DType(), append(append([]int64{}, idx.Shape...), w.Shape[1]))
	l.emit(&ir.Op{Kind: ir.Embedding, In: []ir.View{w, idx}, Out: out})
	l.set(&out)
}

// indexOp lowers x[..., idx, ...] (aten.index.Tensor). One index tensor
// gathers along its dim; several are first combined into one flat index over
// their dims (multiIndex), so every form runs as one Gather.
func indexOp(l *lowerer) {
	x := l.tensorArg(0, "self")
	a := l.arg(1, "indices")
	if a == nil || a.K != "list" {
		l.failf("index needs a list of indices")
	}
	var dims []int
	var idxs []ir.View
	for i, e := range a.List {
		if e.K == "none" {
			continue
		}
		idx := l.tensor(e)
		if idx.DType() == ir.Bool {
			l.unsupported("indexing with a boolean mask (its result shape depends on the data)")
		}
		dims, idxs = append(dims, i), append(idxs, idx)
	}
	if len(dims) == 0 {
		v := x.Clone()
		l.set(&v)
		return
	}
	if len(dims) > x.Rank() {
		l.failf("index with %d index tensors into a %d-d tensor", len(dims), x.Rank())
	}
	dim, idx := dims[0], idxs[0]
	if len(dims) > 1 {
		x, dim, idx = l.multiIndex(x, dims, idxs)
	}
	shape := append(append(append([]int64{}, x.Shape[:dim]...), idx.Shape...), x.Shape[dim+1:]...)
	out := l.temp(x.DType(), shape)
	l.emit(&ir.Op{Kind: ir.Gather, In: []ir.View{x, idx}, Out: out, Attr: ir.Attrs{Dim: dim}})
	l.set(&out)
}

// multiIndex turns indexing by several tensors (HF's padding_mask[batch_idx,
// kv_idx]) into indexing by one: the indexed dims of x merge into one dim and
// an elementwise op computes the flat index Σ idxᵢ·strideᵢ over the index
// tensors' broadcast shape. As in PyTorch, the result's index dims stand where
// the indexed dims were when those are adjacent, and first otherwise. A
// negative index counts from the end of its dim; one out of range in its own
// dim makes the flat index out of range, so the Gather still rejects it.
func (l *lowerer) multiIndex(x ir.View, dims []int, idxs []ir.View) (ir.View, int, ir.View) {
	k := len(dims)
	adjacent := dims[k-1]-dims[0] == k-1
	perm, at := identity(x.Rank()), dims[0]
	if !adjacent {
		perm, at = append([]int{}, dims...), 0
		for d := range x.Shape {
			if !slices.Contains(dims, d) {
				perm = append(perm, d)
			}
		}
	}
	xp := permute(x, perm)
	n := ir.Numel(xp.Shape[at : at+k])
	merged := append(append(append([]int64{}, xp.Shape[:at]...), n), xp.Shape[at+k:]...)
	xm := l.reshape(xp, merged)

	var shape []int64
	for _, v := range idxs {
		shape = broadcastShapes(l, shape, v.Shape)
	}
	ins := make([]ir.View, k)
	var flat, ok *ir.Expr
	stride := n
	for i, v := range idxs {
		ins[i] = broadcast(l, v, shape)
		size := x.Shape[dims[i]]
		stride /= size
		raw := ir.Load(i)
		w := ir.Apply(ir.EWhere, ir.Apply(ir.ELt, raw, ir.Const(0)), ir.Apply(ir.EAdd, raw, ir.Const(float64(size))), raw)
		in := ir.Apply(ir.EAnd, ir.Apply(ir.EGe, w, ir.Const(0)), ir.Apply(ir.ELt, w, ir.Const(float64(size))))
		term := ir.Apply(ir.EMul, w, ir.Const(float64(stride)))
		if i == 0 {
			flat, ok = term, in
		} else {
			flat, ok = ir.Apply(ir.EAdd, flat, term), ir.Apply(ir.EAnd, ok, in)
		}
	}
	idx := l.temp(ir.I64, shape)
	l.emit(&ir.Op{Kind: ir.Elementwise, In: ins, Out: idx,
		Attr: ir.Attrs{Expr: ir.Cast(ir.I64, ir.Apply(ir.EWhere, ok, flat, ir.Const(float64(n))))}})
	return xm, at, idx
}

// gatherOp lowers torch.gather(x, dim, index): out[i] = x[i with i[dim]
// replaced by index[i]]. An elementwise op computes, from each output's own
// index and the gathered one, the element of x's buffer that x's strides put
// there, and a Gather reads the buffer there, so x is never copied (an index
// outside [0, size) maps past the buffer's end, an error).
func gatherOp(l *lowerer) {
	x := l.tensorArg(0, "self")
	d := wrapDim(l, l.intArg(1, "dim", 0), x.Rank())
	out := l.gather(x, d, l.tensorArg(2, "index"))
	l.set(&out)
}

// gather is torch.gather(x, d, idx): an index outside x's dim d reads past
// the buffer, which the Gather task reports as an index error.
func (l *lowerer) gather(x ir.View, d int, idx ir.View) ir.View {
	if idx.Rank() != x.Rank() {
		l.failf("gather of a %d-d tensor with a %d-d index", x.Rank(), idx.Rank())
	}
	w := ir.Load(0) // torch.gather takes no negative index
	at := elementAt(x, func(e int) *ir.Expr {
		if e == d {
			return w
		}
		return ir.Index(e)
	})
	ok := ir.Apply(ir.EAnd, ir.Apply(ir.EGe, w, ir.Const(0)), ir.Apply(ir.ELt, w, ir.Const(float64(x.Shape[d]))))
	pos := l.pointwise(ir.I64, idx.Shape, ir.Apply(ir.EWhere, ok, at, ir.Const(float64(x.Buf.Numel))), idx)
	return l.readAt(x, pos)
}

// broadcastShapes is the numpy broadcast of shapes a and b.
func broadcastShapes(l *lowerer, a, b []int64) []int64 {
	if len(a) < len(b) {
		a, b = b, a
	}
	out := append([]int64(nil), a...)
	for i := range b {
		j := len(a) - len(b) + i
		switch {
		case b[i] == out[j] || b[i] == 1:
		case out[j] == 1:
			out[j] = b[i]
		default:
			l.failf("index tensors of shapes %v and %v do not broadcast", a, b)
		}
	}
	return out
}

// joinOp lowers cat, and stack as a Cat of the tensors each viewed with the
// new size-1 dim.
func joinOp(stack bool) func(l *lowerer) {
	return func(l *lowerer) {
		a := l.arg(0, "tensors")
		if a == nil || a.K != "list" || len(a.List) == 0 {
			l.failf("%s needs a non-empty list of tensors", l.node.Target)
		}
		shape := l.outShape(0)
		dim := wrapDim(l, l.intArg(1, "dim", 0), len(shape))
		rank := len(shape)
		if stack {
			rank--
		}
		var ins []ir.View
		for _, e := range a.List {
			v := l.tensor(e)
			if !stack && v.Rank() == 1 && v.Shape[0] == 0 && len(shape) != 1 {
				continue // legacy empty tensor
			}
			if v.Rank() != rank {
				l.failf("joining a %d-d tensor into %d-d", v.Rank(), len(shape))
			}
			if stack {
				v = insertDim(v, dim)
			}
			ins = append(ins, v)
		}
		out := l.temp(l.outDType(0), shape)
		l.emit(&ir.Op{Kind: ir.Cat, In: ins, Out: out, Attr: ir.Attrs{Dim: dim}})
		l.set(&out)
	}
}

// rollOp lowers roll as, for each rolled dim, a Cat of the two slices that
// trade places; without dims it rolls the flattened tensor.
func rollOp(l *lowerer) {
	x := l.tensorArg(0, "self")
	shifts, dims := l.intsArg(1, "shifts"), l.intsArg(2, "dims")
	if len(dims) == 0 {
		if len(shifts) != 1 {
			l.failf("roll without dims takes one shift, got %v", shifts)
		}
		flat := l.rolled(l.reshape(x, []int64{x.Numel()}), 0, shifts[0])
		v := l.reshape(flat, x.Shape)
		l.set(&v)
		return
	}
	if len(shifts) != len(dims) {
		l.failf("roll with %d shifts for %d dims", len(shifts), len(dims))
	}
	v := x
	for i, d := range dims {
		v = l.rolled(v, wrapDim(l, d, x.Rank()), shifts[i])
	}
	l.set(&v)
}

// repeatOp lowers repeat(x, reps). Repeating only size-1 dims (a batch
// repeat of a [1, ...] tensor) is a broadcast view; otherwise x is copied
// broadcast over a repeat dim before each of its dims (extra leading reps
// repeat a size-1 dim): [r0, s0, r1, s1, ...] with stride 0 on every r,
// flattened to [r0·s0, ...].
func repeatOp(l *lowerer) {
	x := l.tensorArg(0, "self")
	reps := l.intsArg(1, "repeats")
	if len(reps) < x.Rank() {
		l.failf("repeat with %d repeats for a %d-d tensor", len(reps), x.Rank())
	}
	for x.Rank() < len(reps) {
		x = insertDim(x, 0)
	}
	var shape, strides, flat []int64
	onlyOnes := true
	for d, r := range reps {
		if r < 0 {
			l.failf("repeat count %d is negative", r)
		}
		shape = append(shape, r, x.Shape[d])
		strides = append(strides, 0, x.Strides[d])
		flat = append(flat, r*x.Shape[d])
		onlyOnes = onlyOnes && (r == 1 || x.Shape[d] == 1)
	}
	if onlyOnes {
		v := broadcast(l, x, flat)
		l.set(&v)
		return
	}
	src := ir.View{Buf: x.Buf, Offset: x.Offset, Shape: shape, Strides: strides}
	out := l.temp(x.DType(), shape)
	if out.Numel() > 0 {
		l.emit(&ir.Op{Kind: ir.Copy, In: []ir.View{src}, Out: out})
	}
	v := ir.View{Buf: out.Buf, Shape: flat, Strides: ir.ContiguousStrides(flat)}
	l.set(&v)
}

// rolled returns v rolled by s along d: out[i] = v[(i - s) mod n].
func (l *lowerer) rolled(v ir.View, d int, s int64) ir.View {
	n := v.Shape[d]
	var ins []ir.View
	if n > 0 {
		s = (s%n + n) % n
		tail, head := v.Clone(), v.Clone()
		tail.Offset += (n - s) * v.Strides[d]
		tail.Shape[d] = s
		head.Shape[d] = n - s
		for _, p := range []ir.View{tail, head} {
			if p.Shape[d] > 0 {
				ins = append(ins, p)
			}
		}
	}
	out := l.temp(v.DType(), v.Shape)
	if len(ins) > 0 {
		l.emit(&ir.Op{Kind: ir.Cat, In: ins, Out: out, Attr: ir.Attrs{Dim: d}})
	}
	return out
}

func copyInPlaceOp(l *lowerer) {
	dst, src := l.tensorArg(0, "self"), l.tensorArg(1, "src")
	if dst.Buf.Kind == ir.Input && dst.Buf.Param {
		l.failf("the graph writes into parameter %s", dst.Buf.Name)
	}
	l.emit(&ir.Op{Kind: ir.Copy, In: []ir.View{broadcast(l, src, dst.Shape)}, Out: dst})
	v := dst.Clone()
	l.set(&v)
}

func cloneOp(l *lowerer) {
	x := l.tensorArg(0, "self")
	out := l.temp(x.DType(), x.Shape)
	l.emit(&ir.Op{Kind: ir.Copy, In: []ir.View{x}, Out: out})
	l.set(&out)
}

func isAttention(name string) bool {
	return strings.Contains(name, "scaled_dot_product") && strings.Contains(name, "attention")
}

// attention lowers every SDPA variant: q, k, v come first; the mask is the
// attn_mask keyword or, for the cuDNN/efficient variants, the 4th positional.
func (l *lowerer) attention(name string) {
	q, k, v := l.tensorArg(0, "query"), l.tensorArg(1, "key"), l.tensorArg(2, "value")
	var mask *ir.View
	causal := false
	dropout := 0.0
	pos := func(n string) int { return -1 }
	switch {
	case strings.HasPrefix(name, "scaled_dot_product_attention"):
		pos = func(n string) int { return map[string]int{"attn_mask": 3, "dropout_p": 4, "is_causal": 5}[n] }
	case strings.Contains(name, "cudnn") || strings.Contains(name, "efficient"):
		pos = func(n string) int { return map[string]int{"attn_mask": 3, "dropout_p": 5, "is_causal": 6}[n] }
	case strings.Contains(name, "flash"):
		pos = func(n string) int { return map[string]int{"attn_mask": -1, "dropout_p": 3, "is_causal": 4}[n] }
	}
	mname := "attn_mask"
	if _, ok := l.node.Kwargs["attn_bias"]; ok {
		mname = "attn_bias"
	}
	if a := l.arg(pos("attn_mask"), mname); !l.isNone(a) {
		m := l.tensor(*a)
		mask = &m
	}
	dropout = l.floatArg(pos("dropout_p"), "dropout_p", 0)
	causal = l.boolArg(pos("is_causal"), "is_causal", false)
	if dropout != 0 {
		l.unsupported("attention with dropout")
	}
	if q.Rank() != 4 || k.Rank() != 4 || v.Rank() != 4 {
		l.unsupported("attention on tensors that are not [batch, heads, seq, dim]")
	}
	B, H, Sq, D := q.Shape[0], q.Shape[1], q.Shape[2], q.Shape[3]
	Hkv, Skv := k.Shape[1], k.Shape[2]
	if k.Shape[0] != B || v.Shape[0] != B || v.Shape[1] != Hkv || v.Shape[2] != Skv || k.Shape[3] != D || H%Hkv != 0 {
		l.failf("attention shapes q%v k%v v%v do not match", q.Shape, k.Shape, v.Shape)
	}
	scale := l.floatArg(-1, "scale", 1/math.Sqrt(float64(D)))
	out := l.temp(q.DType(), []int64{B, H, Sq, v.Shape[3]})
	ins := []ir.View{q, k, v}
	if mask != nil {
		ins = append(ins, broadcast(l, *mask, []int64{B, H, Sq, Skv}))
	}
	l.emit(&ir.Op{Kind: ir.Attention, In: ins, Out: out,
		Attr: ir.Attrs{Scale: scale, Causal: causal, Groups: H / Hkv, HasMask: mask != nil}})
	vals := make([]*ir.View, len(l.outs))
	vals[0] = &out
	l.env[l.node.Name] = value(vals)
}
