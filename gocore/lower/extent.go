package lower

import "mpk/gocore/ir"

// boundMergeByExtent bounds each merge folded into a Linear
// (fuseMergePrologue) by the live extent of its attention's mask. A decode
// step over a cache of capacity S with L positions written has a mask that
// hides every position from L on, so the splits that start at or past L
// hold nothing; without a bound, a long and mostly empty cache would have
// every o-projection task read every split's partials. A MaskExtent op,
// placed just before the attention (so both see the same mask), computes
// 1 + the last visible position of each batch row; the Linear reads it as
// In[Pro.First] and merges only the splits below it, and the attention
// reads it as In[4] and computes no chunk past it. The attention's splits
// are interleaved (ir.SplitGroups) into a group per worker a head leaves, so
// the live chunks spread over all its tasks rather than the first of each
// head's.
func boundMergeByExtent(g *ir.Graph, workers int) {
	u := analyze(g)
	extentOf := map[*ir.Op]*ir.Op{} // attention → the extent of its mask
	for _, l := range g.Ops {
		p := l.Attr.Pro
		if l.Kind != ir.Linear || p == nil || p.Kind != ir.AttnMerge || len(u.writers[l.In[0].Buf.ID]) != 1 {
			continue
		}
		a := u.writers[l.In[0].Buf.ID][0]
		if a.Kind != ir.Attention || !a.Attr.HasMask || !a.DecodeUnits() {
			continue
		}
		mask, S := a.In[3], a.In[1].Shape[2]
		if mask.Shape[3] != S || mask.Shape[0] != l.In[0].Shape[0] {
			continue
		}
		ext, ok := extentOf[a]
		if !ok {
			ext = &ir.Op{Kind: ir.MaskExtent, Label: "mask_extent", Node: a.Node, Target: a.Target, Source: a.Source,
				In: []ir.View{mask}, Out: g.NewTemp(a.Node+"_extent", ir.I32, []int64{mask.Shape[0]})}
			extentOf[a] = ext
			// The attention skips the chunks past it too: a long cache's
			// empty chunks cost no task time.
			a.In = append(a.In, ext.Out)
			a.Attr.HasExtent = true
			a.Attr.Interleave = max(1, min(a.Attr.Splits, int64(workers)/a.In[0].Shape[1]))
		}
		at := prologueAt(l)
		if l.Attr.Epi != nil {
			l.Attr.Epi.First++
		}
		l.In = append(append(append([]ir.View{}, l.In[:at]...), ext.Out), l.In[at:]...)
		p.First = at
		p.Chunk = ir.SplitChunk(S, a.Attr.Splits)
		p.Interleave = a.Attr.Interleave
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
