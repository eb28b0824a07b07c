package lower

import "mpk/gocore/ir"

// groupedQueryAttention recognises repeat_kv: K and V reach attention as a
// contiguous copy of the cache expanded over a group dim ([B, Hkv, G, S, D]
// with stride 0 on G), viewed as [B, Hkv·G, S, D]. Attention then reads the
// cache directly with G query heads per KV head, and the copy dies.
func groupedQueryAttention(g *ir.Graph) {
	u := analyze(g)
	for _, op := range g.Ops {
		if op.Kind != ir.Attention {
			continue
		}
		k, gk, okK := ungroup(u, op.In[1])
		v, gv, okV := ungroup(u, op.In[2])
		if !okK || !okV || gk != gv {
			continue
		}
		op.In[1], op.In[2] = k, v
		op.Attr.Groups *= gk
	}
	deadCode(g)
}

// ungroup returns the cache view behind a repeat_kv copy and the group size.
func ungroup(u uses, kv ir.View) (ir.View, int64, bool) {
	c := u.soleWriter(kv.Buf)
	if c == nil || c.Kind != ir.Copy || kv.Buf.Kind != ir.Temp || kv.Rank() != 4 || !kv.IsWhole() {
		return kv, 1, false
	}
	src := c.In[0]
	if src.Rank() != 5 || src.Strides[2] != 0 || src.Shape[2] < 1 {
		return kv, 1, false
	}
	B, Hkv, G, S, D := src.Shape[0], src.Shape[1], src.Shape[2], src.Shape[3], src.Shape[4]
	if kv.Shape[0] != B || kv.Shape[1] != Hkv*G || kv.Shape[2] != S || kv.Shape[3] != D {
		return kv, 1, false
	}
	return ir.View{Buf: src.Buf, Offset: src.Offset,
		Shape:   []int64{B, Hkv, S, D},
		Strides: []int64{src.Strides[0], src.Strides[1], src.Strides[3], src.Strides[4]}}, G, true
}
