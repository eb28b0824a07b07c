// Package decompose splits each op of the op graph into tasks by output
// tiles, records the element ranges every task reads and writes, and finds
// the dependencies between tasks by region overlap.
package decompose

import (
	"fmt"
	"slices"

	"mpk/gocore/ir"
	"mpk/gocore/stream"
	"mpk/gocore/tgraph"
)

// Decompose builds the tasks of g for the given worker count. Task counts per
// op come from the op's size and the worker count, never from constants.
func Decompose(g *ir.Graph, workers int) *tgraph.Graph {
	tg := &tgraph.Graph{Workers: workers}
	for _, b := range g.Buffers {
		tg.Buffers = append(tg.Buffers, tgraph.BufInfo{Name: b.Name, Numel: b.Numel, Output: b.Kind == ir.Output, Input: b.Kind == ir.Input})
	}
	written := stream.Writers(g)
	for _, op := range g.Ops {
		tg.OpNames = append(tg.OpNames, fmt.Sprintf("%s#%d (%s)", op.Label, op.ID, op.Node))
		for _, box := range tiles(op, workers, written) {
			t := &tgraph.Task{ID: len(tg.Tasks), Op: op.ID, Box: box, Wait: tgraph.None, Trigger: tgraph.None, Order: op.ID}
			t.Reads, t.Writes = accesses(op, box)
			tg.Tasks = append(tg.Tasks, t)
		}
	}
	return tg
}

// WeightAffinity gives the Linear tasks that read the same rows of the same
// weight (the blocks of rows lower's splitLinearRows cut) an affinity key
// (tgraph.Schedule keeps a key's tasks on one worker, so the rows come from
// HBM once). A weight of fewer row ranges than workers (a 2,048-row o or
// down projection in ranges of 64: 32 of 132 workers) would leave most
// workers idle while 32 run every block in turn: its blocks then take up to
// AffinitySpread(ranges, workers) keys a range, consecutive blocks a key.
func WeightAffinity(g *ir.Graph, tg *tgraph.Graph) {
	type weight struct{ buf, offset, k int64 }
	type rows struct {
		w      weight
		lo, hi int64
	}
	byRows := map[rows][]*tgraph.Task{}
	ranges := map[weight]int64{}
	var order []rows
	for _, t := range tg.Tasks {
		op := g.Ops[t.Op]
		if op.Kind != ir.Linear || op.In[1].Rank() != 2 || op.Out.Rank() != 2 || op.In[1].Buf.Kind != ir.Input ||
			op.Attr.Spread {
			continue
		}
		w := op.In[1]
		r := rows{weight{int64(w.Buf.ID), w.Offset, w.Shape[1]}, t.Box.Lo[1], t.Box.Hi[1]}
		if _, ok := byRows[r]; !ok {
			order = append(order, r)
			ranges[r.w]++
		}
		byRows[r] = append(byRows[r], t)
	}
	key := 0
	for ri, r := range order {
		ts := byRows[r]
		if len(ts) < 2 {
			continue
		}
		keys := min(int64(len(ts)), AffinitySpread(ranges[r.w], int64(tg.Workers)))
		for i, t := range ts {
			if int64(i)*keys%int64(len(ts)) < keys {
				key++ // the first block of each of the range's keys
			}
			t.Affinity, t.Rows, t.Cost = key, ri+1, r.w.k*(r.hi-r.lo)
		}
	}
}

// AffinitySpread is the affinity keys a weight's row range takes when the
// weight has `ranges` of them: one while the ranges cover the workers,
// else as many as keep the workers busy.
func AffinitySpread(ranges, workers int64) int64 {
	return max(1, workers/max(1, ranges))
}

// decodeAttentionTiles cuts decode attention's partials [B, Splits, H, 1,
// Dv+2] into tasks of (batch row, head group, chunk) units, a head group
// being ug query heads (ir.Op.HeadsPerUnit). A decode attention task waits
// on its warps' chains of dependent instructions, not on memory, so the
// units are spread over every worker, a few per task: a task takes some
// chunks of one group, whole groups of one row, or whole rows, when there
// are more units than workers have warps for chunks (codegen gives the
// kernel a flat range of units: ir.Op.DecodeUnits). A group's chunks in
// order go to the same few tasks, so the live chunks of a partly filled
// cache (the first ones) land on as many tasks as there are groups.
// perRound > 0 (an attention that skips the chunks past its mask's extent)
// caps a task at the units its warps take in one round: a long cache's few
// live chunks of a group then spread over several tasks, each one round, and
// the empty tasks cost almost nothing, so the step costs what a short
// cache's does.
func decodeAttentionTiles(out []int64, ug, workers, perRound int64) []tgraph.Box {
	B, splits, ng := out[0], out[1], out[2]/ug
	perTask := max(1, ceilDiv(B*ng*splits, workers)) // units
	if perRound > 0 {
		perTask = min(perTask, perRound)
	}
	if perTask >= splits { // whole groups
		if B >= workers {
			return split(out, 0, workers, 1)
		}
		var boxes []tgraph.Box
		for _, row := range split(out, 0, B, 1) {
			for _, b := range split(out, 2, min(ng, workers/B), ug) {
				b.Lo[0], b.Hi[0] = row.Lo[0], row.Hi[0]
				boxes = append(boxes, b)
			}
		}
		return boxes
	}
	return cellTiles(out, ug, func() []tgraph.Box { return split(out, 1, ceilDiv(splits, perTask), 1) })
}

// sharedKVTiles is a task per KV head (ug query heads), chunk and block of
// sharedKVRows rows of the partials [B, Splits, H, 1, Dv+2] of a prompt
// chunk's attention with shared K and V (ir.Attrs.SharedKV): the task reads
// its KV head's chunk once for all its rows, a warp a row.
func sharedKVTiles(out []int64, ug int64) []tgraph.Box {
	var boxes []tgraph.Box
	for h := int64(0); h < out[2]; h += ug {
		for s := int64(0); s < out[1]; s++ {
			for _, b := range split(out, 0, ceilDiv(out[0], sharedKVRows), 1) {
				b.Lo[1], b.Hi[1] = s, s+1
				b.Lo[2], b.Hi[2] = h, h+ug
				boxes = append(boxes, b)
			}
		}
	}
	return boxes
}

// sharedKVRows is the rows a task of attention with shared K and V takes:
// one a consumer warp.
const sharedKVRows = stream.Threads / 32

// groupTiles is a task per batch row, head group and split group
// (ir.SplitGroups) of decode attention's partials [B, Splits, H, 1, Dv+2]:
// a worker each when there are B·(H/ug)·R ≤ workers, and whatever prefix of
// the chunks is live, each task gets an even share of it (a 512-long live
// length in a 4,096 cache: 5 chunks of 128, on 128 tasks no more than 2
// each, where contiguous chunks put 4 on one task and none on 6 others of
// each head).
func groupTiles(out []int64, ug, R int64) []tgraph.Box {
	g := ir.SplitGroups{Splits: out[1], R: R}
	return cellTiles(out, ug, func() []tgraph.Box {
		var boxes []tgraph.Box
		for r := int64(0); r < R && g.Start(r) < out[1]; r++ {
			b := fullBox(ir.View{Shape: out})
			b.Lo[1], b.Hi[1] = g.Start(r), g.Start(r+1)
			boxes = append(boxes, b)
		}
		return boxes
	})
}

// cellTiles is the boxes of chunks() (each some splits of all rows and
// heads) for each batch row and head group of ug heads.
func cellTiles(out []int64, ug int64, chunks func() []tgraph.Box) []tgraph.Box {
	var boxes []tgraph.Box
	for row := int64(0); row < out[0]; row++ {
		for h := int64(0); h < out[2]; h += ug {
			for _, c := range chunks() {
				c.Lo[0], c.Hi[0] = row, row+1
				c.Lo[2], c.Hi[2] = h, h+ug
				boxes = append(boxes, c)
			}
		}
	}
	return boxes
}

// decodeUnitsPerRound is how many (head, chunk) units the CUDA decode
// attention runs at once: a unit takes a warp per 32 of its chunk's
// positions (attention_decode's cp), up to all the consumer warps.
func decodeUnitsPerRound(chunk int64) int64 {
	warps := int64(stream.Threads / 32)
	return warps / min(warps, ceilDiv(chunk, 32))
}

// ceilDiv is ⌈a/b⌉ for positive b.
func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

// split cuts the full box of shape into parts near-equal chunks along dim,
// keeping chunk sizes multiples of unit.
func split(shape []int64, dim int, parts, unit int64) []tgraph.Box {
	full := tgraph.Box{Lo: make([]int64, len(shape)), Hi: append([]int64(nil), shape...)}
	if len(shape) == 0 || parts <= 1 || shape[dim] <= unit {
		return []tgraph.Box{full}
	}
	units := ceilDiv(shape[dim], unit)
	if parts > units {
		parts = units
	}
	var out []tgraph.Box
	for p := int64(0); p < parts; p++ {
		lo, hi := p*units/parts*unit, (p+1)*units/parts*unit
		if hi > shape[dim] {
			hi = shape[dim]
		}
		if lo >= hi {
			continue
		}
		b := tgraph.Box{Lo: append([]int64(nil), full.Lo...), Hi: append([]int64(nil), full.Hi...)}
		b.Lo[dim], b.Hi[dim] = lo, hi
		out = append(out, b)
	}
	return out
}

// largestDim returns the dim with the largest extent among dims (ties: first).
func largestDim(shape []int64, dims []int) int {
	best := dims[0]
	for _, d := range dims {
		if shape[d] > shape[best] {
			best = d
		}
	}
	return best
}

func allDims(n int) []int {
	d := make([]int, n)
	for i := range d {
		d[i] = i
	}
	return d
}

// dimsBut is the dims [0, n) but skip.
func dimsBut(n, skip int) []int {
	var d []int
	for i := 0; i < n; i++ {
		if i != skip {
			d = append(d, i)
		}
	}
	return d
}

// Elements per task below which splitting an elementwise-like op costs more
// in synchronisation than it saves: one a thread. The generic task body
// reads an element's inputs one dependent round trip after another, so a
// thread's second element doubles the task (a 4,096-element mask `where` in
// one task took 40 us on the H100, bench/NOTES.md).
const minElemsPerTask = stream.Threads

// rowsPerNormTask matches the CUDA rmsnorm task: one warp per row, every
// consumer warp.
const rowsPerNormTask = stream.Threads / 32

// maxNormRegRow is the longest row the rmsnorm task holds in a warp's
// registers (kMaxPer elements a lane); longer rows take the whole block.
const maxNormRegRow = 256

// tiles chooses the output tiles of op.
func tiles(op *ir.Op, workers int, written func(*ir.Buffer) bool) []tgraph.Box {
	W := int64(workers)
	out := op.IterShape()
	n := ir.Numel(out)
	small := func(d int) int64 { // parts for a cheap op split along d
		return min(W, out[d], max(1, n/minElemsPerTask))
	}
	// Tasks along d of at most one of elems elements (or pairs) a thread, so
	// a task's loads go out in one batch.
	perThread := func(d int, elems int64) []tgraph.Box {
		return split(out, d, min(W, out[d], max(small(d), ceilDiv(elems, stream.Threads))), 1)
	}
	switch op.Kind {
	case ir.Linear: // [M, N]: every task reads N/parts weight rows
		if p, ok := stream.For(op, written); ok {
			// A slice of K shares the workers with its sibling slices: each
			// worker then stages x's columns of one slice (x is read from L2
			// once per task, and at batch 16 that costs as much as the weights).
			share := workers
			if op.Attr.Workers > 0 {
				share = int(op.Attr.Workers)
			}
			return split(out, 1, p.Tasks(out[1], max(1, share/int(max(1, op.Attr.KParts)))), p.Unit())
		}
		return split(out, 1, min(W, ceilDiv(out[1], 8)), 1)
	case ir.Matmul: // [B, M, N]
		d := largestDim(out, []int{0, 2})
		return split(out, d, min(W, out[d]), 1)
	case ir.Attention: // [B, H, Sq, D]: whole KV groups per task
		if op.DecodeUnits() {
			if op.Attr.SharedKV {
				return sharedKVTiles(out, op.HeadsPerUnit())
			}
			if op.Attr.Interleave > 1 {
				return groupTiles(out, op.HeadsPerUnit(), op.Attr.Interleave)
			}
			perRound := int64(0) // no cap: a unit past the cache's end still costs its round
			if op.Attr.HasExtent {
				perRound = decodeUnitsPerRound(ir.SplitChunk(op.In[1].Shape[2], op.Attr.Splits))
			}
			return decodeAttentionTiles(out, op.HeadsPerUnit(), W, perRound)
		}
		if op.Attr.Splits > 1 { // partials [B, Splits, H, Sq, Dv+2]: KV chunks per task
			return split(out, 1, min(W, out[1]), 1)
		}
		G := op.Attr.Groups
		return split(out, 1, min(W, out[1]/G), G)
	case ir.AttnMerge: // [B, H, Sq, Dv]: heads, or rows where they make more tasks (a prompt chunk's
		// queries: 64 rows over 32 heads is 64 tasks of two rounds of the warps, not 32 of four) or a
		// tile of heads would be too many intervals (exactDims)
		byRows := min(W, out[0]) > min(W, out[1]) || !slices.Contains(exactDims(out), 1)
		if op.In[0].Shape[3] == 1 && byRows { // decode partials (attn_merge_decode)
			return split(out, 0, min(W, out[0]), 1)
		}
		return split(out, 1, min(W, out[1]), 1)
	case ir.RMSNorm, ir.RoPE: // the last dim stays whole
		if len(out) < 2 {
			return split(out, 0, 1, 1)
		}
		dims := allDims(len(out) - 1)
		if op.Kind == ir.RoPE && op.Attr.IndexIn > 0 {
			// Rows land at run-time positions along Attr.Dim: tiles split
			// another dim, so what they write stays disjoint.
			dims = dimsBut(len(out)-1, op.Attr.Dim)
			if len(dims) == 0 {
				return split(out, 0, 1, 1)
			}
		}
		d := largestDim(out, dims)
		if op.Kind == ir.RMSNorm { // a warp per row: a task takes rowsPerNormTask rows
			if out[len(out)-1] > maxNormRegRow {
				// Long rows (a prompt chunk's norm ahead of a GEMM stream):
				// the block takes each row, so a row a task, on as many
				// workers as there are rows.
				return split(out, d, min(W, out[d]), 1)
			}
			return split(out, d, min(W, ceilDiv(out[d], rowsPerNormTask)), 1)
		}
		// A thread per rotated pair (RoPE is on the path to attention).
		return perThread(d, n/2)
	case ir.Embedding: // a thread per element: the step's first op, on everyone's path
		return perThread(largestDim(out, exactDims(out)), n)
	case ir.KVWrite: // over the source, an element a thread, cut along its batch or heads: not along
		// the run-time positions' dim, nor the last (a tile's cache rows stay one interval a row)
		dims := dimsBut(len(out)-1, op.Attr.Dim)
		if len(dims) == 0 {
			return split(out, 0, 1, 1)
		}
		return perThread(largestDim(out, dims), n)
	case ir.MaskExtent: // [B]: a task per batch row (each reads its whole mask row)
		return split(out, 0, min(W, out[0]), 1)
	case ir.Cat:
		dims := dimsBut(len(out), op.Attr.Dim)
		if len(dims) == 0 {
			return split(out, 0, 1, 1)
		}
		d := largestDim(out, dims)
		return split(out, d, small(d), 1)
	default: // elementwise, copy, reduce, embedding, gather
		if len(out) == 0 {
			return split(out, 0, 1, 1)
		}
		d := largestDim(out, exactDims(out))
		unit := int64(1)
		if d == len(out)-1 && out[d]%4 == 0 {
			unit = 4 // whole groups of 4 columns a task: the CUDA elementwise's 16-byte loads (elementwise_rows4)
		}
		return split(out, d, small(d), unit)
	}
}

// exactDims are the dims of out a tile may be cut along and stay at most
// maxIntervals intervals of a row-major output (the dims before it, whole
// in every tile, multiply to at most maxIntervals), or every dim if none
// does. Cut along the last dim, a long prompt chunk's 512 rows are 512
// intervals a tile, which Region bounds by their hull: the tiles of one op
// then overlap and the validator refuses them (unordered-write).
func exactDims(out []int64) []int {
	var dims []int
	outer := int64(1)
	for d := range out {
		if outer <= maxIntervals {
			dims = append(dims, d)
		}
		outer *= out[d]
	}
	if len(dims) == 0 {
		return allDims(len(out))
	}
	return dims
}

// splitSpan is the range of KV positions the splits [s0, s1) of a split-KV
// attention over S positions cover: with interleaved groups, from the lowest
// chunk's start to the highest one's end (a superset: the chunks between
// belong to other tasks, whose reads it only repeats).
func splitSpan(op *ir.Op, S, s0, s1 int64) (lo, hi int64) {
	g := ir.SplitGroups{Splits: op.Attr.Splits, R: op.Attr.Interleave}
	c0, c1 := g.Chunk(s0), g.Chunk(s0)
	for s := s0 + 1; s < s1; s++ {
		c0, c1 = min(c0, g.Chunk(s)), max(c1, g.Chunk(s))
	}
	lo, _ = ir.SplitPositions(S, op.Attr.Splits, c0, c0+1)
	_, hi = ir.SplitPositions(S, op.Attr.Splits, c1, c1+1)
	return lo, hi
}

// freshReads adds what a fresh-row attention's tasks over batch rows
// [b0, b1) and query heads [h0, h1) read besides q and the cache: the
// rotation's cos and sin rows (at the query heads, and at the KV heads for
// the new K), the new K and V rows of the heads' KV heads, the position,
// and the norms' weights.
func freshReads(op *ir.Op, f *ir.FreshRows, b0, b1, h0, h1 int64, read func(ir.View, tgraph.Box)) {
	G := max(1, op.Attr.Groups)
	k0, k1 := h0/G, (h1-1)/G+1
	rows := func(v ir.View, lo, hi int64) tgraph.Box {
		return tgraph.Box{Lo: []int64{b0, lo, 0, 0}, Hi: []int64{b1, hi, 1, v.Shape[3]}}
	}
	for _, v := range op.In[f.First : f.First+2] { // cos, sin
		read(v, rows(v, min(h0, k0), max(h1, k1)))
	}
	for _, v := range op.In[f.First+2 : f.First+4] { // the new K and V rows
		read(v, rows(v, k0, k1))
	}
	read(op.In[f.First+4], fullBox(op.In[f.First+4]))
	if f.Norm {
		read(op.In[f.First+5], rows(op.In[f.First+5], h0, h1))
		read(op.In[f.First+6], rows(op.In[f.First+6], k0, k1))
	}
}

// fullBox covers a whole view.
func fullBox(v ir.View) tgraph.Box {
	return tgraph.Box{Lo: make([]int64, v.Rank()), Hi: append([]int64(nil), v.Shape...)}
}

// accesses returns what a task computing box of op reads and writes.
func accesses(op *ir.Op, b tgraph.Box) (reads, writes []tgraph.Access) {
	read := func(v ir.View, box tgraph.Box) {
		reads = append(reads, tgraph.Access{Buf: v.Buf.ID, Ivs: Region(v, box)})
	}
	writeBox := b
	switch op.Kind {
	case ir.Elementwise, ir.Copy, ir.RMSNorm, ir.RoPE:
		for i, v := range op.In {
			if op.Kind == ir.RoPE && op.Attr.IndexIn == i && i > 0 {
				read(v, fullBox(v)) // the positions rows land at
				continue
			}
			read(v, b)
		}
		if op.Kind == ir.RoPE && op.Attr.IndexIn > 0 { // rows land at run-time positions
			writeBox = tgraph.Box{Lo: append([]int64(nil), b.Lo...), Hi: append([]int64(nil), b.Hi...)}
			writeBox.Lo[op.Attr.Dim], writeBox.Hi[op.Attr.Dim] = 0, op.Out.Shape[op.Attr.Dim]
		}
	case ir.Reduce:
		in := op.In[0]
		box := tgraph.Box{Lo: append(append([]int64{}, b.Lo...), make([]int64, op.Attr.Dims)...),
			Hi: append(append([]int64{}, b.Hi...), in.Shape[len(b.Hi):]...)}
		read(in, box)
	case ir.Linear:
		x, w := op.In[0], op.In[1]
		K := op.LinearK()
		rows := tgraph.Box{Lo: []int64{b.Lo[0], 0}, Hi: []int64{b.Hi[0], K}}
		if p := op.Attr.Pro; p != nil && p.Kind == ir.AttnMerge { // every partial of the rows
			box := fullBox(x)
			box.Lo[0], box.Hi[0] = b.Lo[0], b.Hi[0]
			read(x, box)
			if p.Chunk > 0 { // and the rows' mask extents
				read(op.In[p.First], tgraph.Box{Lo: b.Lo[:1], Hi: b.Hi[:1]})
			}
		} else if op.Attr.Pro != nil { // x is computed from the prologue's inputs
			for _, v := range op.ProIn() {
				read(v, rows)
			}
		} else {
			read(x, rows)
		}
		read(w, tgraph.Box{Lo: []int64{b.Lo[1], 0}, Hi: []int64{b.Hi[1], K}})
		if op.Attr.Residual {
			read(op.In[2], b)
		}
		if e := op.Attr.Epi; e != nil { // read at the output index
			for j, v := range op.EpiIn() {
				if j+1 == e.Pair { // the second weight: its rows of the task, as In[1]'s
					read(v, tgraph.Box{Lo: []int64{b.Lo[1], 0}, Hi: []int64{b.Hi[1], K}})
					continue
				}
				read(v, b)
			}
		}
	case ir.Matmul:
		a, m := op.In[0], op.In[1]
		K := a.Shape[2]
		read(a, tgraph.Box{Lo: []int64{b.Lo[0], b.Lo[1], 0}, Hi: []int64{b.Hi[0], b.Hi[1], K}})
		read(m, tgraph.Box{Lo: []int64{b.Lo[0], 0, b.Lo[2]}, Hi: []int64{b.Hi[0], K, b.Hi[2]}})
	case ir.Attention:
		if op.Attr.Splits > 1 { // a box of partials [B, Splits, H, Sq, Dv+2]
			q, k := op.In[0], op.In[1]
			lo, hi := splitSpan(op, k.Shape[2], b.Lo[1], b.Hi[1])
			live := op.Attr.SharedKV && op.Attr.HasExtent // chunks cut from the live length (ir.LiveChunk): any position
			if live {
				lo, hi = 0, k.Shape[2]
			}
			h0, h1 := b.Lo[2], b.Hi[2]
			G := max(1, op.Attr.Groups)
			read(q, tgraph.Box{Lo: []int64{b.Lo[0], h0, 0, 0}, Hi: []int64{b.Hi[0], h1, q.Shape[2], q.Shape[3]}})
			for _, kv := range op.In[1:3] {
				read(kv, tgraph.Box{Lo: []int64{b.Lo[0], h0 / G, lo, 0}, Hi: []int64{b.Hi[0], (h1-1)/G + 1, hi, kv.Shape[3]}})
			}
			if f := op.Attr.Fresh; f != nil {
				// The cache rows the step writes come from the new rows instead.
				reads[1].Fresh, reads[2].Fresh = true, true
				freshReads(op, f, b.Lo[0], b.Hi[0], h0, h1, read)
			}
			if op.Attr.HasMask { // [B, H, Sq, S], heads broadcast or not
				m := op.In[3]
				read(m, tgraph.Box{Lo: []int64{b.Lo[0], h0, 0, lo}, Hi: []int64{b.Hi[0], h1, m.Shape[2], hi}})
			}
			if live { // [B]: every row's, for the longest
				read(op.In[4], fullBox(op.In[4]))
			} else if op.Attr.HasExtent {
				read(op.In[4], tgraph.Box{Lo: []int64{b.Lo[0]}, Hi: []int64{b.Hi[0]}})
			}
			break
		}
		G := op.Attr.Groups
		read(op.In[0], b)
		for _, kv := range op.In[1:3] {
			read(kv, tgraph.Box{Lo: []int64{b.Lo[0], b.Lo[1] / G, 0, 0},
				Hi: []int64{b.Hi[0], (b.Hi[1]-1)/G + 1, kv.Shape[2], kv.Shape[3]}})
		}
		if op.Attr.HasMask {
			m := op.In[3]
			read(m, tgraph.Box{Lo: []int64{b.Lo[0], b.Lo[1], b.Lo[2], 0}, Hi: []int64{b.Hi[0], b.Hi[1], b.Hi[2], m.Shape[3]}})
		}
	case ir.MaskExtent: // the rows' whole masks
		m := fullBox(op.In[0])
		m.Lo[0], m.Hi[0] = b.Lo[0], b.Hi[0]
		read(op.In[0], m)
	case ir.AttnMerge:
		p := op.In[0]
		read(p, tgraph.Box{Lo: []int64{b.Lo[0], 0, b.Lo[1], b.Lo[2], 0}, Hi: []int64{b.Hi[0], p.Shape[1], b.Hi[1], b.Hi[2], p.Shape[4]}})
		if op.Attr.HasExtent { // the rows' extents
			read(op.In[1], tgraph.Box{Lo: []int64{b.Lo[0]}, Hi: []int64{b.Hi[0]}})
		}
	case ir.Embedding:
		read(op.In[0], fullBox(op.In[0])) // rows chosen at run time
		r := len(b.Lo) - 1
		read(op.In[1], tgraph.Box{Lo: b.Lo[:r], Hi: b.Hi[:r]})
	case ir.Gather:
		d, idx := op.Attr.Dim, op.In[1]
		read(op.In[0], fullBox(op.In[0]))
		read(idx, tgraph.Box{Lo: b.Lo[d : d+idx.Rank()], Hi: b.Hi[d : d+idx.Rank()]})
	case ir.Cat:
		d, off := op.Attr.Dim, int64(0)
		for _, v := range op.In {
			lo, hi := max(b.Lo[d], off), min(b.Hi[d], off+v.Shape[d])
			if lo < hi {
				box := tgraph.Box{Lo: append([]int64(nil), b.Lo...), Hi: append([]int64(nil), b.Hi...)}
				box.Lo[d], box.Hi[d] = lo-off, hi-off
				read(v, box)
			}
			off += v.Shape[d]
		}
	case ir.KVWrite: // b is a box over the source; rows land at run-time positions
		read(op.In[0], fullBox(op.In[0]))
		read(op.In[1], b)
		writeBox = tgraph.Box{Lo: append([]int64(nil), b.Lo...), Hi: append([]int64(nil), b.Hi...)}
		writeBox.Lo[op.Attr.Dim], writeBox.Hi[op.Attr.Dim] = 0, op.Out.Shape[op.Attr.Dim]
	}
	writes = []tgraph.Access{{Buf: op.Out.Buf.ID, Ivs: Region(op.Out, writeBox)}}
	return mergeAccesses(reads), writes
}

// mergeAccesses joins accesses to the same buffer.
func mergeAccesses(as []tgraph.Access) []tgraph.Access {
	var out []tgraph.Access
	for _, a := range as {
		merged := false
		for i := range out {
			if out[i].Buf == a.Buf {
				out[i].Ivs = tgraph.NormalizeIntervals(append(out[i].Ivs, a.Ivs...))
				merged = true
				break
			}
		}
		if !merged {
			out = append(out, a)
		}
	}
	return out
}

// maxIntervals bounds the exact description of a region; beyond it the
// region is over-approximated by its bounding interval, which only adds
// dependencies, never drops one.
const maxIntervals = 256

// Region returns the element ranges of view v inside box.
func Region(v ir.View, b tgraph.Box) []tgraph.Interval {
	base := v.Offset
	type dim struct{ n, s int64 }
	var dims []dim
	for d := range v.Shape {
		ext := b.Hi[d] - b.Lo[d]
		if ext <= 0 {
			return nil
		}
		base += b.Lo[d] * v.Strides[d]
		if ext > 1 && v.Strides[d] != 0 {
			dims = append(dims, dim{ext, v.Strides[d]})
		}
	}
	// Innermost first; fold dims that continue a contiguous run.
	for i := 1; i < len(dims); i++ {
		for j := i; j > 0 && dims[j].s < dims[j-1].s; j-- {
			dims[j], dims[j-1] = dims[j-1], dims[j]
		}
	}
	run := int64(1)
	k := 0
	for k < len(dims) && dims[k].s <= run {
		run = max(run, (dims[k].n-1)*dims[k].s+run)
		k++
	}
	outer := dims[k:]
	count := int64(1)
	span := run
	for _, d := range outer {
		count *= d.n
		span += (d.n - 1) * d.s
	}
	if count > maxIntervals {
		return []tgraph.Interval{{Lo: base, Hi: base + span}}
	}
	ivs := make([]tgraph.Interval, 0, count)
	idx := make([]int64, len(outer))
	for {
		off := base
		for i, d := range outer {
			off += idx[i] * d.s
		}
		ivs = append(ivs, tgraph.Interval{Lo: off, Hi: off + run})
		i := 0
		for ; i < len(outer); i++ {
			idx[i]++
			if idx[i] < outer[i].n {
				break
			}
			idx[i] = 0
		}
		if i == len(outer) {
			break
		}
	}
	return tgraph.NormalizeIntervals(ivs)
}
