package refexec

import (
	"fmt"
	"math"

	"mpk/gocore/ir"
	"mpk/gocore/tgraph"
)

// eval computes an elementwise expression at output index idx.
func (x *exec) eval(op *ir.Op, e *ir.Expr, idx []int64) float64 {
	arg := func(i int) float64 { return x.eval(op, e.Args[i], idx) }
	switch e.Op {
	case ir.ELoad:
		return x.load(op.In[e.Input], idx)
	case ir.EConst:
		return e.Const
	case ir.EIndex:
		return float64(idx[e.Dim])
	case ir.ECast:
		return round(e.DType, arg(0))
	case ir.EWhere:
		if arg(0) != 0 {
			return arg(1)
		}
		return arg(2)
	}
	a := arg(0)
	switch e.Op {
	case ir.ENeg:
		return -a
	case ir.EExp:
		return math.Exp(a)
	case ir.ELog:
		return math.Log(a)
	case ir.ESqrt:
		return math.Sqrt(a)
	case ir.ERsqrt:
		return 1 / math.Sqrt(a)
	case ir.ESin:
		return math.Sin(a)
	case ir.ECos:
		return math.Cos(a)
	case ir.ETanh:
		return math.Tanh(a)
	case ir.ESigmoid:
		return 1 / (1 + math.Exp(-a))
	case ir.ESilu:
		return a / (1 + math.Exp(-a))
	case ir.EGelu:
		return 0.5 * a * (1 + math.Erf(a/math.Sqrt2))
	case ir.EGeluTanh:
		return 0.5 * a * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(a+0.044715*a*a*a)))
	case ir.EAbs:
		return math.Abs(a)
	case ir.ERecip:
		return 1 / a
	case ir.ERelu:
		return math.Max(a, 0)
	case ir.EErf:
		return math.Erf(a)
	case ir.ENot:
		return b2f(a == 0)
	case ir.EIsNaN:
		return b2f(math.IsNaN(a))
	case ir.EFloor:
		return math.Floor(a)
	case ir.ETrunc:
		return math.Trunc(a)
	}
	c := arg(1)
	switch e.Op {
	case ir.EAdd:
		return a + c
	case ir.ESub:
		return a - c
	case ir.EMul:
		return a * c
	case ir.EDiv:
		return a / c
	case ir.EPow:
		if c == 2 {
			return a * a
		}
		return math.Pow(a, c)
	case ir.EMax:
		return math.Max(a, c)
	case ir.EMin:
		return math.Min(a, c)
	case ir.ELt:
		return b2f(a < c)
	case ir.ELe:
		return b2f(a <= c)
	case ir.EGt:
		return b2f(a > c)
	case ir.EGe:
		return b2f(a >= c)
	case ir.EEq:
		return b2f(a == c)
	case ir.ENe:
		return b2f(a != c)
	case ir.EAnd:
		return float64(int64(a) & int64(c))
	case ir.EOr:
		return float64(int64(a) | int64(c))
	case ir.EXor:
		return float64(int64(a) ^ int64(c))
	case ir.EAtan2:
		return math.Atan2(a, c)
	}
	panic(fmt.Sprintf("refexec: no reference for expression op %s", e.Op))
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// row loads the last dim of v at the leading index lead into dst.
func (x *exec) row(v ir.View, lead []int64, dst []float64) []float64 {
	m := x.mems[v.Buf.ID]
	off := at(ir.View{Offset: v.Offset, Strides: v.Strides}, lead)
	s := v.Strides[v.Rank()-1]
	n := v.Shape[v.Rank()-1]
	dst = dst[:0]
	for i := int64(0); i < n; i++ {
		if x.audit {
			x.check(v.Buf.ID, off+i*s, false)
		}
		dst = append(dst, m.load(off+i*s))
	}
	return dst
}

func (x *exec) reduce(op *ir.Op, b tgraph.Box) error {
	in := op.In[0]
	k := in.Rank() - op.Attr.Dims
	red := tgraph.Box{Lo: make([]int64, op.Attr.Dims), Hi: in.Shape[k:]}
	n := ir.Numel(in.Shape[k:])
	full := make([]int64, in.Rank())
	return each(b, func(idx []int64) error {
		copy(full, idx)
		acc, best, arg, pos := 0.0, math.Inf(-1), 0.0, 0.0
		if op.Attr.Reduce == "amin" {
			best = math.Inf(1)
		}
		each(red, func(r []int64) error {
			copy(full[k:], r)
			v := x.load(in, full)
			switch op.Attr.Reduce {
			case "sum", "mean":
				acc += v
			case "amax", "argmax": // NaN is the maximum; the first one wins
				if !math.IsNaN(best) && (v > best || math.IsNaN(v)) {
					best, arg = v, pos
				}
			case "amin":
				if !math.IsNaN(best) && (v < best || math.IsNaN(v)) {
					best = v
				}
			}
			pos++
			return nil
		})
		switch op.Attr.Reduce {
		case "mean":
			acc /= float64(n)
		case "amax", "amin":
			acc = best
		case "argmax":
			acc = arg
		}
		x.store(op.Out, idx, acc)
		return nil
	})
}

// rmsNorm follows HF: y = x·rsqrt(mean(x²)+eps) in fp32, rounded to x's
// dtype, then times the weight.
func (x *exec) rmsNorm(op *ir.Op, b tgraph.Box) error {
	in := op.In[0]
	r := in.Rank() - 1
	lead := tgraph.Box{Lo: b.Lo[:r], Hi: b.Hi[:r]}
	var xs, ws []float64
	out := make([]int64, in.Rank())
	return each(lead, func(idx []int64) error {
		xs = x.row(in, idx, xs)
		if op.Attr.HasWeight {
			ws = x.row(op.In[1], idx, ws)
		}
		ss := 0.0
		for _, v := range xs {
			ss += v * v
		}
		inv := 1 / math.Sqrt(float64(float32(ss/float64(len(xs))))+op.Attr.Eps)
		copy(out, idx)
		for i, v := range xs {
			y := round(in.DType(), round(ir.F32, v*inv))
			if op.Attr.HasWeight {
				y *= ws[i]
			}
			out[r] = int64(i)
			x.store(op.Out, out, y)
		}
		return nil
	})
}

// rope computes x·cos + rotate_half(x)·sin, rotate_half(x) = cat(-x₂, x₁).
func (x *exec) rope(op *ir.Op, b tgraph.Box) error {
	in := op.In[0]
	r := in.Rank() - 1
	dt := op.Out.DType()
	lead := tgraph.Box{Lo: b.Lo[:r], Hi: b.Hi[:r]}
	var xs, cs, ss, ys []float64
	out := make([]int64, in.Rank())
	return each(lead, func(idx []int64) error {
		if op.Attr.Pro != nil { // x is an RMSNorm of its inputs, row by row
			xs = x.normRow(op.ProIn(), idx, op.Attr.Pro, xs)
		} else {
			xs = x.row(in, idx, xs)
		}
		cs, ss = x.row(op.In[1], idx, cs), x.row(op.In[2], idx, ss)
		copy(out, idx)
		if op.Attr.IndexIn > 0 { // the row lands in the cache at its run-time position
			d := op.Attr.Dim
			pos, err := x.index(op.In[op.Attr.IndexIn], []int64{idx[d]}, op.Out.Shape[d])
			if err != nil {
				return fmt.Errorf("KV-cache write: position %v", err)
			}
			out[d] = pos
		}
		ys = x.rotate(xs, cs, ss, dt, ys)
		for j, y := range ys {
			out[r] = int64(j)
			x.store(op.Out, out, y)
		}
		return nil
	})
}

func (x *exec) linear(op *ir.Op, b tgraph.Box) error {
	dt := op.Out.DType()
	var xs, ws []float64
	dot := func(w ir.View, n int64) float64 {
		ws = x.row(w, []int64{n}, ws)
		acc := 0.0
		for k, v := range xs {
			acc += v * ws[k]
		}
		return acc
	}
	w2, paired := op.PairWeight()
	for m := b.Lo[0]; m < b.Hi[0]; m++ {
		xs = x.linearInput(op, m, xs)
		for n := b.Lo[1]; n < b.Hi[1]; n++ {
			acc := dot(op.In[1], n)
			idx := []int64{m, n}
			if op.Attr.Residual {
				acc = round(dt, acc) + x.load(op.In[2], idx)
			}
			if epi := op.Attr.Epi; epi != nil {
				pair := 0.0
				if paired { // the second weight's product, rounded as its own Linear stored it
					pair = round(epi.PairDType, dot(w2, n))
				}
				acc = x.epilogue(op, round(epi.DType, acc), pair, idx)
			}
			x.store(op.Out, idx, acc)
		}
	}
	return nil
}

// epilogue is what a Linear with an epilogue stores at idx, given its
// product rounded as the folded op read it (and a pair's second product).
func (x *exec) epilogue(op *ir.Op, product, pair float64, idx []int64) float64 {
	e := op.Attr.Epi.Expr.Map(func(n *ir.Expr) *ir.Expr {
		if n.Op == ir.ELoad && (n.Input == 0 || n.Input == op.Attr.Epi.Pair) {
			c := product
			if n.Input != 0 {
				c = pair
			}
			return &ir.Expr{Op: ir.EConst, Const: c}
		}
		if n.Op == ir.ELoad {
			return ir.Load(n.Input - 1)
		}
		return n
	})
	return x.eval(&ir.Op{In: op.EpiIn()}, e, idx)
}

// linearInput is row m of a Linear's x: read, or computed by its prologue
// exactly as the folded op would have, rounded to that op's output dtype.
func (x *exec) linearInput(op *ir.Op, m int64, dst []float64) []float64 {
	pro := op.Attr.Pro
	if pro == nil {
		return x.row(op.In[0], []int64{m}, dst)
	}
	K := op.LinearK()
	in := op.ProIn()
	dst = dst[:0]
	switch pro.Kind {
	case ir.RMSNorm:
		dst = x.normRow(in, []int64{m}, pro, dst)
	case ir.AttnMerge: // x[m, h·Dv+d] from the partials of batch row m (one query)
		Dv, splits := in[0].Shape[4]-2, in[0].Shape[1]
		chunks := splits // the chunks merged: all, or those below the extent
		if pro.Chunk > 0 {
			chunks = x.splitsBelowExtent(in[1], m, pro.Chunk, splits)
		}
		g := ir.SplitGroups{Splits: splits, R: pro.Interleave}
		for k := int64(0); k < K; k++ {
			dst = append(dst, round(pro.DType, x.merged(in[0], g, chunks, m, k/Dv, 0, k%Dv)))
		}
	default:
		fake := &ir.Op{In: in}
		for k := int64(0); k < K; k++ {
			dst = append(dst, round(pro.DType, x.eval(fake, pro.Expr, []int64{m, k})))
		}
	}
	return dst
}

// normRow is an RMSNorm prologue's result for the row at lead: in[0] is x,
// in[1] the weight when it has one; rounded as the folded op's output was.
func (x *exec) normRow(in []ir.View, lead []int64, pro *ir.Prologue, dst []float64) []float64 {
	xr := x.row(in[0], lead, nil)
	var w []float64
	if pro.HasWeight {
		w = x.row(in[1], lead, nil)
	}
	ss := 0.0
	for _, v := range xr {
		ss += v * v
	}
	inv := 1 / math.Sqrt(float64(float32(ss/float64(len(xr))))+pro.Eps)
	dst = dst[:0]
	for k, v := range xr {
		y := round(in[0].DType(), round(ir.F32, v*inv))
		if pro.HasWeight {
			y *= w[k]
		}
		dst = append(dst, round(pro.DType, y))
	}
	return dst
}

func (x *exec) matmul(op *ir.Op, b tgraph.Box) error {
	a, m := op.In[0], op.In[1]
	K := a.Shape[2]
	return each(b, func(idx []int64) error {
		acc := 0.0
		for k := int64(0); k < K; k++ {
			acc += x.load(a, []int64{idx[0], idx[1], k}) * x.load(m, []int64{idx[0], k, idx[2]})
		}
		x.store(op.Out, idx, acc)
		return nil
	})
}

// attention computes softmax(q·kᵀ·scale + mask)·v per query row; query head
// h reads KV head h/G. A row the mask hides entirely (a padded query) is 0,
// as PyTorch's scaled_dot_product_attention makes it.
func (x *exec) attention(op *ir.Op, b tgraph.Box) error {
	q, k, v := op.In[0], op.In[1], op.In[2]
	G := op.Attr.Groups
	Skv, Dv := k.Shape[2], v.Shape[3]
	scores := make([]float64, Skv)
	var qs []float64
	lead := tgraph.Box{Lo: b.Lo[:3], Hi: b.Hi[:3]}
	return each(lead, func(idx []int64) error {
		bi, h, i := idx[0], idx[1], idx[2]
		qs = x.row(q, idx, qs)
		mx := math.Inf(-1)
		for j := int64(0); j < Skv; j++ {
			scores[j] = x.score(op, qs, nil, bi, h, i, j)
			mx = math.Max(mx, scores[j])
		}
		sum := 0.0
		for j := range scores {
			scores[j] = math.Exp(scores[j] - mx)
			sum += scores[j]
		}
		for d := int64(0); d < Dv; d++ {
			acc := 0.0
			for j := int64(0); j < Skv; j++ {
				if scores[j] != 0 {
					acc += scores[j] * x.load(v, []int64{bi, h / G, j, d})
				}
			}
			if math.IsInf(mx, -1) {
				acc, sum = 0, 1
			}
			x.store(op.Out, []int64{bi, h, i, d}, acc/sum)
		}
		return nil
	})
}

// score is q·k·scale plus the mask at (b, h, i, j); -Inf when masked out.
// score is query i of head h (row bi) against position j: its K row read
// from the cache, or ks where given (a fresh-row attention's new row).
func (x *exec) score(op *ir.Op, qs, ks []float64, bi, h, i, j int64) float64 {
	if op.Attr.Causal && j > i {
		return math.Inf(-1)
	}
	if ks == nil {
		ks = x.row(op.In[1], []int64{bi, h / op.Attr.Groups, j}, nil)
	}
	dot := 0.0
	for d, qv := range qs {
		dot += qv * ks[d]
	}
	s := dot * op.Attr.Scale
	if op.Attr.HasMask {
		a := x.maskAdd(op.In[3], []int64{bi, h, i, j})
		if op.In[3].DType() == ir.Bool && a != 0 { // hidden, whatever the dot (even NaN)
			return a
		}
		s += a
	}
	return s
}

// splitsBelowExtent is how many of splits chunks of chunk positions start
// below row's mask extent (the int32 view e, from MaskExtent), as the CUDA
// splits_below_extent: the attention computes and the merge reads only these.
func (x *exec) splitsBelowExtent(e ir.View, row, chunk, splits int64) int64 {
	return min(splits, (int64(x.load(e, []int64{row}))+chunk-1)/chunk)
}

// longestExtent is the largest of the rows' mask extents (the int32 view
// e [B], from MaskExtent), as the CUDA live_chunk reads it.
func (x *exec) longestExtent(e ir.View) int64 {
	var m int64
	for r := int64(0); r < e.Shape[0]; r++ {
		m = max(m, int64(x.load(e, []int64{r})))
	}
	return m
}

// maskAdd is what a mask element adds to a score: 0 or -inf for a bool
// mask, the value for a float one (as the CUDA mask_add).
func (x *exec) maskAdd(m ir.View, idx []int64) float64 {
	v := x.load(m, idx)
	if m.DType() != ir.Bool {
		return v
	}
	if v == 0 {
		return math.Inf(-1)
	}
	return 0
}

// freshRow is the rotated row of a fresh-row attention (ir.FreshRows) at
// batch row bi and head h of input in (0: the queries; First+2: the new K
// row), normalised first where the RoPE was, rounded to dt as the RoPE's
// output (the rotated query) or the cache (the new K row).
func (x *exec) freshRow(op *ir.Op, f *ir.FreshRows, in int, bi, h int64, dt ir.DType) []float64 {
	lead := []int64{bi, h, 0}
	var xs []float64
	if f.Norm {
		w := op.In[f.First+5]
		if in != 0 {
			w = op.In[f.First+6]
		}
		pro := &ir.Prologue{Kind: ir.RMSNorm, Eps: f.Eps, HasWeight: true, DType: f.NormDType}
		xs = x.normRow([]ir.View{op.In[in], w}, lead, pro, nil)
	} else {
		xs = x.row(op.In[in], lead, nil)
	}
	return x.rotate(xs, x.row(op.In[f.First], lead, nil), x.row(op.In[f.First+1], lead, nil), dt, nil)
}

// rotate is RoPE of row xs by cos cs and sin ss, each product and sum
// rounded to dt as eager rounds them.
func (x *exec) rotate(xs, cs, ss []float64, dt ir.DType, dst []float64) []float64 {
	h := len(xs) / 2
	dst = dst[:0]
	for j := range xs {
		rot := xs[(j+h)%len(xs)]
		if j < h {
			rot = -rot
		}
		dst = append(dst, round(dt, round(dt, xs[j]*cs[j])+round(dt, round(dt, rot)*ss[j])))
	}
	return dst
}

// attentionPartial computes, for each KV chunk s and head h of the box, the
// head's partial softmax over the chunk: max m, sum l of exp(score-m), and the
// unnormalised output Σ exp(score-m)·v, into [B, Splits, H, Sq, Dv+2].
// With the mask's extent (HasExtent), a chunk starting at or past it is
// skipped and its partials left as they were, as on the GPU; with shared K
// and V, the chunks are cut from the live length (ir.LiveChunk) and each
// written, empty (l = 0) for a row that sees none of it.
func (x *exec) attentionPartial(op *ir.Op, b tgraph.Box) error {
	q, v := op.In[0], op.In[2]
	Sq, Dv, S := q.Shape[2], v.Shape[3], op.In[1].Shape[2]
	f := op.Attr.Fresh
	for bi := b.Lo[0]; bi < b.Hi[0]; bi++ {
		pos := int64(-1) // a fresh-row attention's written position: its row comes from the new K and V
		if f != nil {
			if p, err := x.index(op.In[f.First+4], []int64{0}, S); err == nil {
				pos = p
			} // else the cache write reports it
		}
		live := op.Attr.Splits                            // chunks [0, live) hold visible positions
		chunk, end := ir.SplitChunk(S, op.Attr.Splits), S // end: the row's positions past it are hidden
		switch {
		case op.Attr.SharedKV && op.Attr.HasExtent:
			// Chunks cut from the longest row's live length; every split is
			// written (past the row's extent its positions are hidden), as
			// the merge reads them all.
			chunk = ir.LiveChunk(x.longestExtent(op.In[4]), op.Attr.Splits)
			end = int64(x.load(op.In[4], []int64{bi}))
		case op.Attr.HasExtent:
			live = x.splitsBelowExtent(op.In[4], bi, chunk, live)
		}
		g := ir.SplitGroups{Splits: op.Attr.Splits, R: op.Attr.Interleave}
		for s := b.Lo[1]; s < b.Hi[1]; s++ {
			c := g.Chunk(s)
			if c >= live {
				continue
			}
			lo, hi := ir.ChunkPositions(S, chunk, c, c+1)
			hi = max(lo, min(hi, end))
			for h := b.Lo[2]; h < b.Hi[2]; h++ {
				kvh := h / op.Attr.Groups
				var knew, vnew []float64
				if pos >= lo && pos < hi {
					knew = x.freshRow(op, f, f.First+2, bi, kvh, op.In[1].DType())
					vnew = x.row(op.In[f.First+3], []int64{bi, kvh, 0}, nil)
				}
				for i := int64(0); i < Sq; i++ {
					var qs []float64
					if f != nil {
						qs = x.freshRow(op, f, 0, bi, h, f.QDType)
					} else {
						qs = x.row(q, []int64{bi, h, i}, nil)
					}
					m := math.Inf(-1)
					scores := make([]float64, hi-lo)
					for j := lo; j < hi; j++ {
						var ks []float64
						if j == pos {
							ks = knew
						}
						scores[j-lo] = x.score(op, qs, ks, bi, h, i, j)
						m = math.Max(m, scores[j-lo])
					}
					l, acc := 0.0, make([]float64, Dv)
					if !math.IsInf(m, -1) {
						for j := lo; j < hi; j++ {
							p := math.Exp(scores[j-lo] - m)
							l += p
							if p != 0 {
								vs := vnew
								if j != pos {
									vs = x.row(v, []int64{bi, kvh, j}, nil)
								}
								for d := range acc {
									acc[d] += p * vs[d]
								}
							}
						}
					}
					out := []int64{bi, s, h, i, 0}
					x.store(op.Out, out, m)
					out[4] = 1
					x.store(op.Out, out, l)
					for d := range acc {
						out[4] = int64(2 + d)
						x.store(op.Out, out, acc[d])
					}
				}
			}
		}
	}
	return nil
}

// attnMerge combines the chunks' partials: out = Σ acc·e^(m-M) / Σ l·e^(m-M);
// 0 where every chunk was masked out (as attention gives a hidden row).
// With an extent (In[1]), only the chunks below it, whose splits the
// attention wrote.
func (x *exec) attnMerge(op *ir.Op, b tgraph.Box) error {
	splits := op.In[0].Shape[1]
	g := ir.SplitGroups{Splits: splits, R: op.Attr.Interleave}
	return each(b, func(idx []int64) error {
		chunks := splits
		if op.Attr.HasExtent {
			chunks = x.splitsBelowExtent(op.In[1], idx[0], op.Attr.Chunk, splits)
		}
		x.store(op.Out, idx, x.merged(op.In[0], g, chunks, idx[0], idx[1], idx[2], idx[3]))
		return nil
	})
}

// merged is element d of head h, query i of batch row bi, merged from the
// split-KV partials p [B, Splits, H, Sq, Dv+2] of the first `chunks` KV
// chunks, in chunk order (g says which split covers each).
func (x *exec) merged(p ir.View, g ir.SplitGroups, chunks, bi, h, i, d int64) float64 {
	M := math.Inf(-1)
	for c := int64(0); c < chunks; c++ {
		M = math.Max(M, x.load(p, []int64{bi, g.Split(c), h, i, 0}))
	}
	L, o := 0.0, 0.0
	for c := int64(0); c < chunks; c++ {
		s := g.Split(c)
		l := x.load(p, []int64{bi, s, h, i, 1})
		if l == 0 {
			continue
		}
		f := math.Exp(x.load(p, []int64{bi, s, h, i, 0}) - M)
		L += l * f
		o += x.load(p, []int64{bi, s, h, i, 2 + d}) * f
	}
	if L == 0 {
		return 0
	}
	return o / L
}

// maskExtent is 1 + the last position that row b of the mask [B, H, Sq, S]
// leaves visible to any head and query, 0 when it hides every position. A
// position is hidden by a bool false, by -inf, or by a float more than
// ir.MaskHideMargin below its row's largest (HF's finfo.min); NaN is visible.
func (x *exec) maskExtent(op *ir.Op, b tgraph.Box) error {
	m := op.In[0]
	for bi := b.Lo[0]; bi < b.Hi[0]; bi++ {
		last := int64(0)
		for h := int64(0); h < m.Shape[1]; h++ {
			for i := int64(0); i < m.Shape[2]; i++ {
				top := math.Inf(-1) // NaN ignored, as the CUDA fmaxf does
				for j := int64(0); j < m.Shape[3]; j++ {
					if v := x.maskAdd(m, []int64{bi, h, i, j}); v > top {
						top = v
					}
				}
				for j := m.Shape[3] - 1; j >= last; j-- {
					if maskVisible(x.maskAdd(m, []int64{bi, h, i, j}), top) {
						last = j + 1
						break
					}
				}
			}
		}
		x.store(op.Out, []int64{bi}, float64(last))
	}
	return nil
}

// maskVisible says whether a mask add leaves its position visible in a row
// whose largest add is top (as the CUDA mask_visible).
func maskVisible(add, top float64) bool {
	return !math.IsInf(add, -1) && !(add < top-ir.MaskHideMargin)
}

// index reads an index tensor element and checks it against size.
func (x *exec) index(v ir.View, idx []int64, size int64) (int64, error) {
	i := int64(x.load(v, idx))
	if i < 0 {
		i += size
	}
	if i < 0 || i >= size {
		return 0, fmt.Errorf("index %d out of range for size %d", int64(x.load(v, idx)), size)
	}
	return i, nil
}

func (x *exec) embedding(op *ir.Op, b tgraph.Box) error {
	w, ids := op.In[0], op.In[1]
	r := len(b.Lo) - 1
	return each(b, func(idx []int64) error {
		row, err := x.index(ids, idx[:r], w.Shape[0])
		if err != nil {
			return fmt.Errorf("embedding: %v", err)
		}
		x.store(op.Out, idx, x.load(w, []int64{row, idx[r]}))
		return nil
	})
}

func (x *exec) gather(op *ir.Op, b tgraph.Box) error {
	src, ids := op.In[0], op.In[1]
	d, n := op.Attr.Dim, ids.Rank()
	sidx := make([]int64, src.Rank())
	return each(b, func(idx []int64) error {
		i, err := x.index(ids, idx[d:d+n], src.Shape[d])
		if err != nil {
			return fmt.Errorf("index: %v", err)
		}
		copy(sidx, idx[:d])
		sidx[d] = i
		copy(sidx[d+1:], idx[d+n:])
		x.store(op.Out, idx, x.load(src, sidx))
		return nil
	})
}

func (x *exec) cat(op *ir.Op, b tgraph.Box) error {
	d := op.Attr.Dim
	in := make([]int64, len(b.Lo))
	return each(b, func(idx []int64) error {
		off := idx[d]
		for _, v := range op.In {
			if off < v.Shape[d] {
				copy(in, idx)
				in[d] = off
				x.store(op.Out, idx, x.load(v, in))
				return nil
			}
			off -= v.Shape[d]
		}
		return fmt.Errorf("cat: index %d past the inputs", idx[d])
	})
}

// kvWrite is index_copy in place: dst.select(dim, index[i]) = src.select(dim, i).
func (x *exec) kvWrite(op *ir.Op, b tgraph.Box) error {
	ids, src, dst := op.In[0], op.In[1], op.Out
	d := op.Attr.Dim
	out := make([]int64, len(b.Lo))
	return each(b, func(idx []int64) error {
		pos, err := x.index(ids, []int64{idx[d]}, dst.Shape[d])
		if err != nil {
			return fmt.Errorf("KV-cache write: position %v", err)
		}
		copy(out, idx)
		out[d] = pos
		x.store(dst, out, x.load(src, idx))
		return nil
	})
}
