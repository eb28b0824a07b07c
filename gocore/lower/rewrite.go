package lower

import (
	"mpk/gocore/ir"
)

// Rewrite runs the op-graph rewrite passes in order. Each pass is one file.
func Rewrite(g *ir.Graph, cfg Config) {
	for _, p := range rewrites {
		if p.name == "fuse_prologue" && cfg.Gemm && cfg.Workers > 0 {
			markGemm(g, cfg.Workers, cfg.SplitRows, cfg.Wgmma, cfg.GemmBatch) // before the prologues fold: a GEMM stream's x is a plain input
		}
		p.fn(g)
		g.Renumber()
	}
	if !cfg.RoundIntermediates {
		keep := attentionKV(g)
		if cfg.RoundGemmInputs {
			for b := range gemmInputs(g) {
				keep[b] = true
			}
		}
		widenTemps(g, keep)
	}
	if cfg.Workers > 0 {
		splitAttention(g, cfg.Workers, cfg.PrefillRows, cfg.KVPages && cfg.FreshRows, cfg.KVPagesBatch, cfg.LongAttentionChunks)
		g.Renumber()
		fuseMergePrologue(g)
		g.Renumber()
		boundMergeByExtent(g, cfg.Workers)
		g.Renumber()
		shareRepeatedOps(g) // one extent for the layers' one mask
		g.Renumber()
		if cfg.FreshRows {
			freshRows(g)
			g.Renumber()
		}
	}
	if cfg.SplitK || cfg.Gemm { // before split_rows: a Linear whose K slices stream needs no blocks of rows
		splitLinearK(g, cfg.Workers, cfg.SplitK, cfg.GemmRowBlocks, cfg.GemmSiblings, cfg.TimedSchedule)
		g.Renumber()
	}
	if cfg.SplitRows { // last: it copies each Linear as the passes above left it
		splitLinearRows(g)
		g.Renumber()
	}
	if cfg.Workers > 0 && cfg.PairLinears { // after split_k and split_rows: they copy a Linear and its epilogue as it was
		pairLinears(g, cfg.PairGemm, cfg.PairTiles)
		g.Renumber()
	}
	if cfg.BalanceGemmTail { // after pairing: a pair's tail is cut as one
		balanceGemmTail(g, cfg.Workers, cfg.TimedSchedule)
		g.Renumber()
	}
	if cfg.Workers > 0 {
		shareSiblingWorkers(g, cfg.Workers)
	}
}

// rewrites is the pass table of the op graph; the order matters: aliasing
// must see the copies lowering made, fusion must see aliased buffers, and the
// pattern passes match fused expressions.
var rewrites = []struct {
	name string
	fn   func(*ir.Graph)
}{
	{"dce", deadCode},
	{"inplace", inPlace},
	{"gqa", groupedQueryAttention},
	{"fold_copies", foldCopies},
	{"fuse_elementwise", fuseElementwise},
	{"rmsnorm", rmsNorm},
	{"rope", rope},
	{"linear", linear},
	{"fuse_residual", fuseResidual},
	{"fuse_epilogue", fuseEpilogue},
	{"fuse_prologue", fusePrologue},
	{"norm_rope", foldNormIntoRoPE},
	{"rope_kv", foldRoPEIntoCacheWrite},
	{"share", shareRepeatedOps},
	{"fold_repeated_cat", foldRepeatedCat},
	{"inline_producers", inlineProducers},
	{"dce", deadCode},
	{"bind_outputs", bindOutputs},
	{"label", label},
}

// uses indexes which ops read and write each buffer (by buffer ID).
type uses struct {
	readers [][]*ir.Op
	writers [][]*ir.Op
	outputs []bool
}

func analyze(g *ir.Graph) uses {
	n := len(g.Buffers)
	u := uses{readers: make([][]*ir.Op, n), writers: make([][]*ir.Op, n), outputs: make([]bool, n)}
	for _, op := range g.Ops {
		for i, v := range op.In {
			dup := false
			for _, w := range op.In[:i] {
				dup = dup || w.Buf == v.Buf
			}
			if !dup {
				u.readers[v.Buf.ID] = append(u.readers[v.Buf.ID], op)
			}
		}
		u.writers[op.Out.Buf.ID] = append(u.writers[op.Out.Buf.ID], op)
	}
	for _, v := range g.Outputs {
		u.outputs[v.Buf.ID] = true
	}
	return u
}

// onlyReader reports whether op is the single reader of b and b is no output.
func (u uses) onlyReader(b *ir.Buffer, op *ir.Op) bool {
	if b.ID >= len(u.readers) {
		return false
	}
	r := u.readers[b.ID]
	return len(r) == 1 && r[0] == op && !u.outputs[b.ID]
}

// soleWriter returns the single op writing b with a whole-buffer output, or nil.
func (u uses) soleWriter(b *ir.Buffer) *ir.Op {
	if b.ID >= len(u.writers) {
		return nil
	}
	w := u.writers[b.ID]
	if len(w) != 1 || !w[0].Out.IsWhole() {
		return nil
	}
	return w[0]
}

// removeOps drops the ops in dead, keeping order.
func removeOps(g *ir.Graph, dead map[*ir.Op]bool) {
	if len(dead) == 0 {
		return
	}
	out := g.Ops[:0]
	for _, op := range g.Ops {
		if !dead[op] {
			out = append(out, op)
		}
	}
	g.Ops = out
}

// sameLayout reports whether two views address the same elements in the same order.
func sameLayout(a, b ir.View) bool {
	if a.Buf != b.Buf || a.Offset != b.Offset || len(a.Shape) != len(b.Shape) {
		return false
	}
	for i := range a.Shape {
		if a.Shape[i] != b.Shape[i] || (a.Shape[i] != 1 && a.Strides[i] != b.Strides[i]) {
			return false
		}
	}
	return true
}

// deadCode removes ops whose results nothing needs. Writes into graph inputs
// (the KV cache, counters) are always needed.
func deadCode(g *ir.Graph) {
	needed := map[*ir.Buffer]bool{}
	for _, v := range g.Outputs {
		needed[v.Buf] = true
	}
	live := map[*ir.Op]bool{}
	for i := len(g.Ops) - 1; i >= 0; i-- {
		op := g.Ops[i]
		if op.Out.Buf.Kind == ir.Input || needed[op.Out.Buf] {
			live[op] = true
			for _, v := range op.In {
				needed[v.Buf] = true
			}
		}
	}
	// A buffer is needed as a whole: every writer of a needed buffer lives.
	for changed := true; changed; {
		changed = false
		for i := len(g.Ops) - 1; i >= 0; i-- {
			op := g.Ops[i]
			if !live[op] && needed[op.Out.Buf] {
				live[op] = true
				changed = true
				for _, v := range op.In {
					needed[v.Buf] = true
				}
			}
		}
	}
	dead := map[*ir.Op]bool{}
	for _, op := range g.Ops {
		if !live[op] {
			dead[op] = true
		}
	}
	removeOps(g, dead)
}

// touches reports whether op reads or writes b.
func touches(op *ir.Op, b *ir.Buffer) bool {
	if op.Out.Buf == b {
		return true
	}
	for _, v := range op.In {
		if v.Buf == b {
			return true
		}
	}
	return false
}

// replaceBuffer points every view of from at to.
func replaceBuffer(g *ir.Graph, from, to *ir.Buffer) {
	for _, op := range g.Ops {
		for i := range op.In {
			if op.In[i].Buf == from {
				op.In[i].Buf = to
			}
		}
		if op.Out.Buf == from {
			op.Out.Buf = to
		}
	}
	for i := range g.Outputs {
		if g.Outputs[i].Buf == from {
			g.Outputs[i].Buf = to
		}
	}
}
