package lower

import "mpk/gocore/ir"

// freshRows folds the RoPE of a decode attention's queries, and the step's
// new K and V rows, into the attention (ir.FreshRows). HF's step rotates q,
// rotates k and writes it into the cache, writes v into the cache, then
// attends over the cache: three light ops between the q/k/v projections and
// the attention, a dependent stage of their own (~4 us a layer on the H100,
// and a hop). Folded, the attention rotates its queries as it stages them
// and takes the row at the written position from the new k (rotated) and v,
// so it reads nothing the cache writes store: the writes stay (the cache is
// the step's result) and run beside it instead of before it.
//
// It applies where the attention is the cache's only reader, each cache has
// one writer (a RoPE storing k at one run-time position, a KVWrite storing
// v at the same one), and the q and k rotations are alike (the same cos and
// sin, broadcast over the heads; both RMS-normalised with a weight, or
// neither), over head dims whose rotated pairs sit in one lane (D a multiple
// of 64, up to 256).
func freshRows(g *ir.Graph) {
	u := analyze(g)
	index := opIndex(g)
	dead := map[*ir.Op]bool{}
	for _, a := range g.Ops {
		if !a.DecodeUnits() || a.Attr.SharedKV || a.Attr.Causal || a.Attr.Fresh != nil {
			continue
		}
		rq, rk, wv := freshParts(g, u, index, a)
		if rq == nil || dead[rq] {
			continue
		}
		first := len(a.In)
		a.In = append(a.In, rq.In[1], rq.In[2], rk.In[0], wv.In[1], wv.In[0])
		f := &ir.FreshRows{First: first, QDType: rq.Out.DType()}
		if p := rq.Attr.Pro; p != nil {
			f.Norm, f.Eps, f.NormDType = true, p.Eps, p.DType
			a.In = append(a.In, rq.In[p.First], rk.In[rk.Attr.Pro.First])
		}
		a.In[0] = rq.In[0]
		a.Attr.Fresh = f
		a.Label = "rope+" + a.Label
		dead[rq] = true
	}
	removeOps(g, dead)
}

// freshParts returns the q rotation, the k rotation that writes the K cache
// and the v write of attention a, when freshRows can fold them; nils
// otherwise.
func freshParts(g *ir.Graph, u uses, index map[*ir.Op]int, a *ir.Op) (rq, rk, wv *ir.Op) {
	q, kc, vc := a.In[0], a.In[1], a.In[2]
	D := q.Shape[3]
	if D%64 != 0 || D > 256 || kc.Shape[3] != D || vc.Shape[3] != D {
		return nil, nil, nil
	}
	rq = u.soleWriter(q.Buf)
	if rq == nil || rq.Kind != ir.RoPE || rq.Attr.IndexIn > 0 || rq.Out.Buf.Kind != ir.Temp || !u.onlyReader(q.Buf, a) ||
		!sameLayout(q, rq.Out) {
		return nil, nil, nil
	}
	rk, wv = cacheWriter(u, kc, a), cacheWriter(u, vc, a)
	if rk == nil || wv == nil || rk.Kind != ir.RoPE || rk.Attr.IndexIn == 0 || wv.Kind != ir.KVWrite {
		return nil, nil, nil
	}
	kx, vx, pk, pv := rk.In[0], wv.In[1], rk.In[rk.Attr.IndexIn], wv.In[0]
	n := 5
	if rq.Attr.Pro != nil {
		n = 7
	}
	switch {
	case !rowsOfHeads(kx, kc) || !rowsOfHeads(vx, vc) || !gpuFloats(append([]ir.View{kx, vx}, rq.In...)...) ||
		!gpuFloats(rk.In[:rk.Attr.IndexIn]...):
		return nil, nil, nil
	case !sameLayout(pk, pv) || ir.Numel(pk.Shape) != 1:
		return nil, nil, nil
	case !headBroadcast(rq.In[1], rk.In[1]) || !headBroadcast(rq.In[2], rk.In[2]):
		return nil, nil, nil
	case !sameNorm(rq.Attr.Pro, rk.Attr.Pro) || len(a.In)+n > ir.MaxInputs:
		return nil, nil, nil
	case index[rq] > index[a] || index[rk] > index[a] || index[wv] > index[a]:
		return nil, nil, nil
	}
	// What the folded attention reads must hold, at its place in the
	// program, what the rotations and the write read at theirs.
	if writtenBetween(g, index[rq], index[a], rq.In) || writtenBetween(g, index[rk], index[a], rk.In) ||
		writtenBetween(g, index[wv], index[a], wv.In) {
		return nil, nil, nil
	}
	return rq, rk, wv
}

// cacheWriter is the one op writing the cache view c that attention a reads
// (as a whole: the same layout), when a is the cache's only reader.
func cacheWriter(u uses, c ir.View, a *ir.Op) *ir.Op {
	ws, rs := u.writers[c.Buf.ID], u.readers[c.Buf.ID]
	if len(ws) != 1 || len(rs) != 1 || rs[0] != a || !sameLayout(ws[0].Out, c) || ws[0].Attr.Dim != 2 {
		return nil
	}
	return ws[0]
}

// rowsOfHeads says whether x is one new row per batch row and KV head
// [B, KVH, 1, D] of cache c [B, KVH, S, D].
func rowsOfHeads(x, c ir.View) bool {
	return x.Rank() == 4 && x.Shape[0] == c.Shape[0] && x.Shape[1] == c.Shape[1] && x.Shape[2] == 1 &&
		x.Shape[3] == c.Shape[3]
}

// headBroadcast says whether the query rotation's cos (or sin) view cq and
// the key rotation's ck are one tensor broadcast over the heads, so the
// attention reads both from cq (at the KV head's index for k).
func headBroadcast(cq, ck ir.View) bool {
	if cq.Buf != ck.Buf || cq.Offset != ck.Offset || cq.Rank() != 4 || ck.Rank() != 4 ||
		cq.Strides[1] != 0 || ck.Strides[1] != 0 {
		return false
	}
	for _, d := range []int{0, 2, 3} {
		if cq.Shape[d] != ck.Shape[d] || cq.Strides[d] != ck.Strides[d] {
			return false
		}
	}
	return true
}

// sameNorm says whether the q and k rotations normalise alike: neither, or
// both a weighted RMSNorm of one epsilon and rounding.
func sameNorm(pq, pk *ir.Prologue) bool {
	if pq == nil || pk == nil {
		return pq == nil && pk == nil
	}
	return pq.Kind == ir.RMSNorm && pk.Kind == ir.RMSNorm && pq.HasWeight && pk.HasWeight && pq.Eps == pk.Eps &&
		pq.DType == pk.DType
}

// gpuFloats says whether every view holds fp32, bf16 or fp16 (what the
// attention's element loads read).
func gpuFloats(vs ...ir.View) bool {
	for _, v := range vs {
		if d := v.DType(); d != ir.F32 && d != ir.BF16 && d != ir.F16 {
			return false
		}
	}
	return true
}
