package lower

import "mpk/gocore/ir"

// Row writes: index_copy (the KV-cache update of HF's StaticCache) and
// index_put with one index tensor (the sliding-window cache's
// keys[:, :, tensor([-1])] = k) both overwrite the slices of self that an
// index names, and both run as a KVWrite. The functional forms write into a
// copy of self; the inplace pass later makes that copy the cache itself when
// the graph copies the result back.

// indexCopyOp lowers index_copy(self, dim, index, source).
func indexCopyOp(inPlace bool) func(l *lowerer) {
	return func(l *lowerer) {
		self := l.tensorArg(0, "self")
		dim := wrapDim(l, l.intArg(1, "dim", 0), self.Rank())
		idx, src := l.tensorArg(2, "index"), l.tensorArg(3, "source")
		if idx.Rank() > 1 {
			l.failf("index_copy index must be 0-d or 1-d, got %v", idx.Shape)
		}
		if idx.Rank() == 0 {
			src = insertDim(src, dim)
		}
		l.writeRows(self, dim, idx, src, inPlace)
	}
}

// indexPutOp lowers index_put(self, indices, values, accumulate) where one
// entry of indices is a 0-d or 1-d tensor and the others are None.
func indexPutOp(inPlace bool) func(l *lowerer) {
	return func(l *lowerer) {
		self := l.tensorArg(0, "self")
		a := l.arg(1, "indices")
		if a == nil || a.K != "list" {
			l.failf("index_put needs a list of indices")
		}
		if l.boolArg(3, "accumulate", false) {
			l.unsupported("index_put with accumulate=True")
		}
		dim := -1
		var idx ir.View
		for i, e := range a.List {
			if e.K == "none" {
				continue
			}
			if dim >= 0 {
				l.unsupported("index_put with more than one index tensor")
			}
			dim, idx = i, l.tensor(e)
		}
		if dim < 0 || idx.DType() == ir.Bool || idx.Rank() > 1 {
			l.unsupported("index_put other than with one 0-d or 1-d integer index tensor")
		}
		shape := append([]int64{}, self.Shape...)
		if idx.Rank() == 0 {
			shape = append(shape[:dim], shape[dim+1:]...)
		} else {
			shape[dim] = idx.Shape[0]
		}
		src := broadcast(l, l.tensorArg(2, "values"), shape)
		if idx.Rank() == 0 {
			src = insertDim(src, dim)
		}
		l.writeRows(self, dim, idx, src, inPlace)
	}
}

// writeRows emits dst.select(dim, idx[i]) = src.select(dim, i) for every i,
// dst being self or (functional form) a fresh copy of it, and binds dst.
func (l *lowerer) writeRows(self ir.View, dim int, idx, src ir.View, inPlace bool) {
	dst := self
	if !inPlace {
		dst = l.temp(self.DType(), self.Shape)
		l.emit(&ir.Op{Kind: ir.Copy, In: []ir.View{self}, Out: dst})
	}
	if idx.Rank() == 0 {
		idx = ir.View{Buf: idx.Buf, Offset: idx.Offset, Shape: []int64{1}, Strides: []int64{1}}
	}
	if src.Rank() != dst.Rank() || src.Shape[dim] != idx.Shape[0] {
		l.failf("writing source %v with %d indices into %v along dim %d", src.Shape, idx.Shape[0], dst.Shape, dim)
	}
	l.emit(&ir.Op{Kind: ir.KVWrite, In: []ir.View{idx, src}, Out: dst, Attr: ir.Attrs{Dim: dim}})
	v := dst.Clone()
	l.set(&v)
}
