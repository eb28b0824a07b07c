package lower

import "mpk/gocore/ir"

// foldRoPEIntoCacheWrite makes a RoPE whose output only a KV-cache write
// reads (HF's key_states, rotated, then index_copy'd into a StaticCache) write
// the cache itself: each rotated row goes straight to its run-time position,
// and the write's separate dependent stage disappears from the path to
// attention. The fused op takes the write's place in the program (its
// positions may be computed after the rotation's inputs).
func foldRoPEIntoCacheWrite(g *ir.Graph) {
	u := analyze(g)
	index := opIndex(g)
	dead := map[*ir.Op]bool{}
	for _, w := range g.Ops {
		if w.Kind != ir.KVWrite || w.Attr.Dim >= w.Out.Rank()-1 {
			continue
		}
		src := w.In[1]
		r := u.soleWriter(src.Buf)
		if r == nil || r.Kind != ir.RoPE || r.Attr.IndexIn > 0 || dead[r] || r.Out.Buf.Kind != ir.Temp ||
			u.outputs[r.Out.Buf.ID] || !u.onlyReader(src.Buf, w) || !sameLayout(src, r.Out) || w.In[0].Buf == r.Out.Buf ||
			index[r] > index[w] || writtenBetween(g, index[r], index[w], r.In) {
			continue
		}
		r.In = append(r.In, w.In[0])
		r.Attr.IndexIn, r.Attr.Dim = len(r.In)-1, w.Attr.Dim
		r.Out = w.Out
		r.Label += "+kv_write"
		r.Node = w.Node
		*w = *r // the fused op takes the write's place
		dead[r] = true
	}
	removeOps(g, dead)
}
