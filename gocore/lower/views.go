package lower

import "mpk/gocore/ir"

// viewOps lower ATen view ops to strided views; no data moves. A reshape that
// no strided view can express becomes a copy into a contiguous temporary.
var viewOps = map[string]func(l *lowerer) *ir.View{
	"view.default":           reshapeOp,
	"_unsafe_view.default":   reshapeOp,
	"reshape.default":        reshapeOp,
	"alias.default":          aliasOp,
	"detach.default":         aliasOp,
	"lift_fresh.default":     aliasOp,
	"unsqueeze.default":      unsqueezeOp,
	"squeeze.dim":            squeezeOp,
	"squeeze.dims":           squeezeOp,
	"squeeze.default":        squeezeOp,
	"transpose.int":          transposeOp,
	"t.default":              tOp,
	"permute.default":        permuteOp,
	"expand.default":         expandOp,
	"slice.Tensor":           sliceOp,
	"select.int":             selectOp,
	"as_strided.default":     asStridedOp,
	"unflatten.int":          reshapeOp,
	"flatten.using_ints":     reshapeOp,
	"expand_as.default":      expandOp,
	"view_as.default":        reshapeOp,
	"_reshape_alias.default": reshapeOp,
}

// splitOps lower the view ops with several outputs: each piece is a view.
var splitOps = map[string]func(l *lowerer) []*ir.View{
	"split.Tensor":             splitOp,
	"split_with_sizes.default": splitWithSizesOp,
	"chunk.default":            chunkOp,
	"unbind.int":               unbindOp,
}

// pieces views consecutive slices of v along d with the given sizes.
func pieces(l *lowerer, v ir.View, d int, sizes []int64) []*ir.View {
	var out []*ir.View
	off := int64(0)
	for _, n := range sizes {
		if n < 0 || off+n > v.Shape[d] {
			l.failf("split sizes %v do not fit dim %d of size %d", sizes, d, v.Shape[d])
		}
		p := v.Clone()
		p.Offset += off * v.Strides[d]
		p.Shape[d] = n
		out = append(out, &p)
		off += n
	}
	if off != v.Shape[d] {
		l.failf("split sizes %v do not add up to dim %d of size %d", sizes, d, v.Shape[d])
	}
	return out
}

// evenSizes cuts n into pieces of size (the last one smaller), as split does.
func evenSizes(n, size int64) []int64 {
	var sizes []int64
	for off := int64(0); off < n || len(sizes) == 0; off += size {
		sizes = append(sizes, min(size, n-off))
		if size <= 0 {
			break
		}
	}
	return sizes
}

func splitOp(l *lowerer) []*ir.View {
	v := l.tensorArg(0, "self")
	d := wrapDim(l, l.intArg(2, "dim", 0), v.Rank())
	size := l.intArg(1, "split_size", 1)
	if size <= 0 && v.Shape[d] > 0 {
		l.failf("split size %d must be positive", size)
	}
	return pieces(l, v, d, evenSizes(v.Shape[d], size))
}

func splitWithSizesOp(l *lowerer) []*ir.View {
	v := l.tensorArg(0, "self")
	d := wrapDim(l, l.intArg(2, "dim", 0), v.Rank())
	return pieces(l, v, d, l.intsArg(1, "split_sizes"))
}

// chunkOp: chunks of ceil(n/chunks), as many as that takes.
func chunkOp(l *lowerer) []*ir.View {
	v := l.tensorArg(0, "self")
	d := wrapDim(l, l.intArg(2, "dim", 0), v.Rank())
	chunks := l.intArg(1, "chunks", 1)
	if chunks <= 0 {
		l.failf("chunk count %d must be positive", chunks)
	}
	return pieces(l, v, d, evenSizes(v.Shape[d], max((v.Shape[d]+chunks-1)/chunks, 1)))
}

func unbindOp(l *lowerer) []*ir.View {
	v := l.tensorArg(0, "self")
	d := wrapDim(l, l.intArg(1, "dim", 0), v.Rank())
	var out []*ir.View
	for i := int64(0); i < v.Shape[d]; i++ {
		s := selectView(v, d, i)
		out = append(out, &s)
	}
	return out
}

func wrapDim(l *lowerer, d int64, rank int) int {
	r := int64(rank)
	if r == 0 {
		r = 1
	}
	if d < 0 {
		d += r
	}
	if d < 0 || d >= r {
		l.failf("dimension %d out of range for a %d-d tensor", d, rank)
	}
	return int(d)
}

func aliasOp(l *lowerer) *ir.View {
	v := l.tensorArg(0, "self").Clone()
	return &v
}

func reshapeOp(l *lowerer) *ir.View {
	src := l.tensorArg(0, "self")
	v := l.reshape(src, l.outShape(0))
	return &v
}

// reshape views src with a new shape, copying when strides cannot express it.
func (l *lowerer) reshape(src ir.View, shape []int64) ir.View {
	if ir.Numel(shape) != src.Numel() {
		l.failf("reshape of %v elements into %v", src.Shape, shape)
	}
	if v, ok := viewAs(src, shape); ok {
		return v
	}
	dst := l.temp(src.DType(), src.Shape)
	l.emit(&ir.Op{Kind: ir.Copy, In: []ir.View{src}, Out: dst})
	return ir.View{Buf: dst.Buf, Shape: shape, Strides: ir.ContiguousStrides(shape)}
}

// viewAs is v viewed as shape without a copy (its own copy of shape), if
// strides can express it.
func viewAs(v ir.View, shape []int64) (ir.View, bool) {
	st, ok := viewStrides(v.Shape, v.Strides, shape)
	return ir.View{Buf: v.Buf, Offset: v.Offset, Shape: append([]int64(nil), shape...), Strides: st}, ok
}

// viewStrides computes strides for viewing (shape, strides) as newShape
// without copying, the way ATen's computeStride does.
func viewStrides(shape, strides, newShape []int64) ([]int64, bool) {
	out := make([]int64, len(newShape))
	if ir.Numel(shape) == 0 || len(shape) == 0 {
		return ir.ContiguousStrides(newShape), true
	}
	viewD := len(newShape) - 1
	chunkBase := strides[len(strides)-1]
	tensorNumel, viewNumel := int64(1), int64(1)
	for d := len(shape) - 1; d >= 0; d-- {
		tensorNumel *= shape[d]
		if d == 0 || (shape[d-1] != 1 && strides[d-1] != tensorNumel*chunkBase) {
			for viewD >= 0 && (viewNumel < tensorNumel || newShape[viewD] == 1) {
				out[viewD] = viewNumel * chunkBase
				viewNumel *= newShape[viewD]
				viewD--
			}
			if viewNumel != tensorNumel {
				return nil, false
			}
			if d > 0 {
				chunkBase = strides[d-1]
				tensorNumel, viewNumel = 1, 1
			}
		}
	}
	if viewD != -1 {
		return nil, false
	}
	return out, true
}

func unsqueezeOp(l *lowerer) *ir.View {
	v := l.tensorArg(0, "self")
	d := l.intArg(1, "dim", 0)
	rank := v.Rank()
	if d < 0 {
		d += int64(rank) + 1
	}
	if d < 0 || d > int64(rank) {
		l.failf("unsqueeze dim %d out of range", d)
	}
	out := insertDim(v, int(d))
	return &out
}

// insertDim views v with a new size-1 dim at d.
func insertDim(v ir.View, d int) ir.View {
	stride := int64(1)
	if d < v.Rank() {
		stride = v.Strides[d] * v.Shape[d]
	}
	out := ir.View{Buf: v.Buf, Offset: v.Offset}
	out.Shape = append(append(append([]int64{}, v.Shape[:d]...), 1), v.Shape[d:]...)
	out.Strides = append(append(append([]int64{}, v.Strides[:d]...), stride), v.Strides[d:]...)
	return out
}

func squeezeOp(l *lowerer) *ir.View {
	v := l.tensorArg(0, "self")
	dims := map[int]bool{}
	if a := l.arg(1, "dim"); !l.isNone(a) {
		for _, d := range l.intsArg(1, "dim") {
			dims[wrapDim(l, d, v.Rank())] = true
		}
	} else {
		for d := range v.Shape {
			dims[d] = true
		}
	}
	out := ir.View{Buf: v.Buf, Offset: v.Offset, Shape: []int64{}, Strides: []int64{}}
	for d := range v.Shape {
		if dims[d] && v.Shape[d] == 1 {
			continue
		}
		out.Shape = append(out.Shape, v.Shape[d])
		out.Strides = append(out.Strides, v.Strides[d])
	}
	return &out
}

func permute(v ir.View, perm []int) ir.View {
	out := ir.View{Buf: v.Buf, Offset: v.Offset, Shape: make([]int64, len(perm)), Strides: make([]int64, len(perm))}
	for i, p := range perm {
		out.Shape[i], out.Strides[i] = v.Shape[p], v.Strides[p]
	}
	return out
}

func transposeOp(l *lowerer) *ir.View {
	v := l.tensorArg(0, "self")
	if v.Rank() == 0 {
		c := v.Clone()
		return &c
	}
	a := wrapDim(l, l.intArg(1, "dim0", 0), v.Rank())
	b := wrapDim(l, l.intArg(2, "dim1", 0), v.Rank())
	perm := identity(v.Rank())
	perm[a], perm[b] = perm[b], perm[a]
	out := permute(v, perm)
	return &out
}

func tOp(l *lowerer) *ir.View {
	v := l.tensorArg(0, "self")
	if v.Rank() < 2 {
		c := v.Clone()
		return &c
	}
	out := permute(v, []int{1, 0})
	return &out
}

func permuteOp(l *lowerer) *ir.View {
	v := l.tensorArg(0, "self")
	dims := l.intsArg(1, "dims")
	if len(dims) != v.Rank() {
		l.failf("permute of a %d-d tensor with %d dims", v.Rank(), len(dims))
	}
	perm := make([]int, len(dims))
	for i, d := range dims {
		perm[i] = wrapDim(l, d, v.Rank())
	}
	out := permute(v, perm)
	return &out
}

func identity(n int) []int {
	p := make([]int, n)
	for i := range p {
		p[i] = i
	}
	return p
}

// broadcast views v with shape (numpy rules; size-1 and missing dims get stride 0).
func broadcast(l *lowerer, v ir.View, shape []int64) ir.View {
	out := ir.View{Buf: v.Buf, Offset: v.Offset, Shape: append([]int64(nil), shape...), Strides: make([]int64, len(shape))}
	lead := len(shape) - v.Rank()
	if lead < 0 {
		l.failf("cannot broadcast shape %v to %v", v.Shape, shape)
	}
	for i := range shape {
		j := i - lead
		if j < 0 {
			continue
		}
		switch {
		case v.Shape[j] == shape[i]:
			out.Strides[i] = v.Strides[j]
		case v.Shape[j] == 1:
			out.Strides[i] = 0
		default:
			l.failf("cannot broadcast shape %v to %v", v.Shape, shape)
		}
	}
	return out
}

func expandOp(l *lowerer) *ir.View {
	v := l.tensorArg(0, "self")
	out := broadcast(l, v, l.outShape(0))
	return &out
}

func sliceOp(l *lowerer) *ir.View {
	v := l.tensorArg(0, "self").Clone()
	d := wrapDim(l, l.intArg(1, "dim", 0), v.Rank())
	n := v.Shape[d]
	start := l.intArg(2, "start", 0)
	end := l.intArg(3, "end", n)
	step := l.intArg(4, "step", 1)
	if step <= 0 {
		l.failf("slice step %d must be positive", step)
	}
	clamp := func(x int64) int64 {
		if x < 0 {
			x += n
		}
		if x < 0 {
			return 0
		}
		if x > n {
			return n
		}
		return x
	}
	start, end = clamp(start), clamp(end)
	if end < start {
		end = start
	}
	v.Offset += start * v.Strides[d]
	v.Shape[d] = (end - start + step - 1) / step
	v.Strides[d] *= step
	return &v
}

func selectOp(l *lowerer) *ir.View {
	v := l.tensorArg(0, "self")
	d := wrapDim(l, l.intArg(1, "dim", 0), v.Rank())
	i := l.intArg(2, "index", 0)
	if i < 0 {
		i += v.Shape[d]
	}
	if i < 0 || i >= v.Shape[d] {
		l.failf("select index %d out of range for size %d", i, v.Shape[d])
	}
	out := selectView(v, d, i)
	return &out
}

// selectView is v with dim d fixed at index i.
func selectView(v ir.View, d int, i int64) ir.View {
	out := ir.View{Buf: v.Buf, Offset: v.Offset + i*v.Strides[d]}
	out.Shape = append(append([]int64{}, v.Shape[:d]...), v.Shape[d+1:]...)
	out.Strides = append(append([]int64{}, v.Strides[:d]...), v.Strides[d+1:]...)
	return out
}

func asStridedOp(l *lowerer) *ir.View {
	v := l.tensorArg(0, "self")
	size := l.intsArg(1, "size")
	stride := l.intsArg(2, "stride")
	if len(size) != len(stride) {
		l.failf("as_strided with %d sizes and %d strides", len(size), len(stride))
	}
	off := l.intArg(3, "storage_offset", v.Offset)
	out := ir.View{Buf: v.Buf, Offset: off, Shape: size, Strides: stride}
	lo, hi := out.Span()
	if lo < 0 || hi > v.Buf.Numel {
		l.failf("as_strided view [%d, %d) falls outside its storage of %d elements", lo, hi, v.Buf.Numel)
	}
	return &out
}
