package lower

import "mpk/gocore/ir"

// boundMergeByExtent bounds each merge of a decode attention's partials, a
// standalone AttnMerge or one folded into a Linear (fuseMergePrologue), by
// the live extent of the attention's mask. A decode step over a cache of
// capacity S with L positions written has a mask that hides every position
// from L on, so the splits that start at or past L hold nothing; without a
// bound, a long and mostly empty cache would have every merge read every
// split's partials. A MaskExtent op, placed just before the attention (so
// both see the same mask), computes 1 + the last visible position of each
// batch row; the merge reads it (a Linear as In[Pro.First], an AttnMerge as
// In[1]) and merges only the splits below it, and the attention reads it as
// In[4] and computes no chunk past it. The attention's splits are
// interleaved (ir.SplitGroups) into a group per worker a head leaves, so the
// live chunks spread over all its tasks rather than the first of each head's.
// An attention is bounded only when every reader of its partials is such a
// merge: the chunks it skips are never written.
func boundMergeByExtent(g *ir.Graph, workers int) {
	u := analyze(g)
	extentOf := map[*ir.Op]*ir.Op{} // attention → the extent of its mask
	for _, a := range g.Ops {
		if a.Kind != ir.Attention || !a.Attr.HasMask || !a.DecodeUnits() || len(u.writers[a.Out.Buf.ID]) != 1 ||
			u.outputs[a.Out.Buf.ID] {
			continue
		}
		mask, S, readers := a.In[3], a.In[1].Shape[2], u.readers[a.Out.Buf.ID]
		ok := mask.Shape[3] == S && mask.Shape[0] == a.Out.Shape[0] && len(readers) > 0
		for _, r := range readers {
			merge := r.Kind == ir.AttnMerge && len(r.In) == 1 ||
				r.Kind == ir.Linear && r.Attr.Pro != nil && r.Attr.Pro.Kind == ir.AttnMerge && r.Attr.Pro.Chunk == 0
			ok = ok && merge && r.In[0].Buf == a.Out.Buf && !readsBuf(r.In[1:], a.Out.Buf)
		}
		if !ok {
			continue
		}
		ext := &ir.Op{Kind: ir.MaskExtent, Label: "mask_extent", Node: a.Node, Target: a.Target, Source: a.Source,
			In: []ir.View{mask}, Out: g.NewTemp(a.Node+"_extent", ir.I32, []int64{mask.Shape[0]})}
		extentOf[a] = ext
		// The attention skips the chunks past it too: a long cache's
		// empty chunks cost no task time.
		a.In = append(a.In, ext.Out)
		a.Attr.HasExtent = true
		cells := a.In[0].Shape[0] * (a.In[0].Shape[1] / a.HeadsPerUnit()) // (batch row, head group) pairs
		a.Attr.Interleave = max(1, min(a.Attr.Splits, int64(workers)/cells))
		if a.Attr.Paged { // a task a chunk, as the loader streams it (a single sequence's always are)
			a.Attr.Interleave = a.Attr.Splits
		}
		if a.Attr.SharedKV {
			// Its tasks take a chunk for many rows (no interleaving), cut
			// from the live length (ir.LiveChunk): the merge reads every
			// split, the empty ones with l = 0.
			a.Attr.Interleave = 1
			continue
		}
		chunk := ir.SplitChunk(S, a.Attr.Splits)
		for _, r := range readers {
			if r.Kind == ir.AttnMerge {
				r.In = append(r.In, ext.Out)
				r.Attr.HasExtent, r.Attr.Chunk, r.Attr.Interleave = true, chunk, a.Attr.Interleave
				continue
			}
			p, at := r.Attr.Pro, prologueAt(r)
			if r.Attr.Epi != nil {
				r.Attr.Epi.First++
			}
			r.In = append(append(append([]ir.View{}, r.In[:at]...), ext.Out), r.In[at:]...)
			p.First, p.Chunk, p.Interleave = at, chunk, a.Attr.Interleave
		}
	}
	if len(extentOf) == 0 {
		return
	}
	var ops []*ir.Op
	for _, op := range g.Ops {
		if ext, ok := extentOf[op]; ok {
			ops = append(ops, ext)
		}
		ops = append(ops, op)
	}
	g.Ops = ops
}
