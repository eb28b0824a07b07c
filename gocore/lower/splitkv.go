package lower

import (
	"mpk/gocore/ir"
	"mpk/gocore/stream"
)

// minPositionsPerSplit keeps each KV chunk worth a warp of its own: the
// CUDA decode attention gives a chunk's positions to a warp's 32 lanes.
const minPositionsPerSplit = 32

// decodePositionsPerSplit is decode's chunk: the CUDA decode attention gives
// a chunk to 4 warps of 32 positions each and merges their states in shared
// memory, so each head leaves a few partials, not one per 32 positions, for
// the merge (folded into the o projection, which reads them all) to read.
const decodePositionsPerSplit = 4 * 32

// decodeOneRowPositionsPerSplit is the chunk of a single sequence's decode:
// its few units would each leave 12 of a task's 16 warps idle at 128
// positions, so a chunk takes every warp, and a head leaves a quarter of the
// partials. Batch 1 on the H100 (bench/NOTES.md, fifteenth session): the same
// at a cache of 552, -3% at 4,096 (512 live: 2 live chunks a head, not 4 of 32).
// A lane a position and every consumer warp (stream.Threads / 32) in a round.
const decodeOneRowPositionsPerSplit = stream.Threads

// maxSplits is the most partials the CUDA merge combines (32 per warp).
const maxSplits = 512

// queriesAsRows rewrites the attention of one sequence's prompt chunk (B =
// 1, Sq queries, an explicit mask: a prefill over a cache) as decode over
// Sq batch rows of one query each: q, the mask and the output are viewed
// [Sq, H, 1, ·] and K and V broadcast over the rows (stride 0), so the
// decode kernel's units, per-row mask extents and shared GQA loads serve a
// prompt too (its generic path ran the queries one after another). Each
// query's extent (its causal mask's last visible position) bounds the
// chunks it computes. It reports whether it rewrote op.
func queriesAsRows(op *ir.Op) bool {
	if !op.Attr.HasMask || op.Attr.Causal || len(op.In) != 4 {
		return false
	}
	q, k, v, m := op.In[0], op.In[1], op.In[2], op.In[3]
	Sq := q.Shape[2]
	if q.Rank() != 4 || m.Rank() != 4 || op.Out.Rank() != 4 || q.Shape[0] != 1 || Sq < 2 || m.Shape[0] != 1 ||
		m.Shape[2] != 1 && m.Shape[2] != Sq {
		return false
	}
	// rows views x [1, A, Sq, C] as [Sq, A, 1, C]: the query dim leads.
	rows := func(x ir.View) ir.View {
		st := x.Strides[2]
		if x.Shape[2] == 1 {
			st = 0
		}
		return ir.View{Buf: x.Buf, Offset: x.Offset, Shape: []int64{Sq, x.Shape[1], 1, x.Shape[3]},
			Strides: []int64{st, x.Strides[1], 0, x.Strides[3]}}
	}
	// every row reads the one sequence's K and V
	bcast := func(x ir.View) ir.View {
		return ir.View{Buf: x.Buf, Offset: x.Offset, Shape: []int64{Sq, x.Shape[1], x.Shape[2], x.Shape[3]},
			Strides: []int64{0, x.Strides[1], x.Strides[2], x.Strides[3]}}
	}
	op.In = []ir.View{rows(q), bcast(k), bcast(v), rows(m)}
	op.Out = rows(op.Out)
	return true
}

// A prompt chunk of at least sharedKVMinRows queries (rows) runs its
// attention with K and V shared (ir.Attrs.SharedKV): chunks of
// ir.SharedKVTile positions, a KV head's G query heads in a warp, at most
// maxSharedKVOutputs outputs a lane. As decode over the rows, each query
// re-read its KV head's K and V (a 64-token chunk: 1,024 tasks of 19.5 us a
// layer on the H100).
const (
	sharedKVMinRows    = 16
	maxSharedKVOutputs = 16
)

// maxSharedKVTasksPerWorker bounds the tasks of one attention with shared K
// and V (KV heads × blocks of rows × chunks): past it the chunks grow
// (tiles read one after another) instead. A 512-token chunk over a cache of
// 16,392 took 65,792 tasks a layer in chunks of 64, past the runtime's
// capacity over 16 layers, when its queries see at most 512 positions.
const maxSharedKVTasksPerWorker = 32

// oneWaveSplits is how many chunks of positions a prompt chunk's attention
// with shared K and V takes (option long_attention_chunks) when its tasks,
// perSplit a chunk, are to fit one wave of the workers. A task's cost is
// mostly its round trips, not its tile's math: the 64-token chunk's tasks
// of one tile of 64 positions took ~15 us each in ~3 waves (bench/NOTES.md,
// twenty-ninth session); in 4 chunks of ~3 tiles they would run in one,
// and the merge reads 4 partials a row instead of 13.
func oneWaveSplits(workers int, perSplit int64) int64 { return max(1, int64(workers)/perSplit) }

// maxUnitOutputs bounds the outputs a lane of a decode attention unit
// accumulates (heads × ⌈Dv/32⌉): more and its registers spill.
const maxUnitOutputs = 8

// unitHeads is how many of a KV head's G query heads a decode attention
// unit takes: G, halved while their outputs exceed maxUnitOutputs. They
// share a unit only when the units still cover every worker (the caller's
// test): a unit of several heads costs more than one of a head, and at batch
// 1 there are few units.
func unitHeads(G, Dv int64) int64 {
	ug := max(G, 1)
	for ug > 1 && ug%2 == 0 && ug*((Dv+31)/32) > maxUnitOutputs {
		ug /= 2
	}
	if ug*((Dv+31)/32) > maxUnitOutputs {
		return 1
	}
	return ug
}

// kvPagePositions is the most positions of a chunk of a single sequence's
// decode with kv_pages (lower.Config.KVPages): its K rows fill one 16 KB
// ring page at head dim 64, two at 128 (codegen's kvStreamOf), and so do
// its V rows. A task is then one chunk of one unit of a KV head's query
// heads, which share every K and V row it reads from shared memory.
const kvPagePositions = 128

// pagedSplit is kv_pages' layout over S cached positions: splits chunks
// and units of ug query heads, or ok false; a batch's is pagedBatchSplit's.
// A single sequence's: chunks of at most kvPagePositions while their tasks
// fit the workers; past that (a long cache) a unit takes all G heads of its
// KV head, so K and V stream once a KV head, and as many chunks as the
// workers hold, while a chunk fits the pages (chunksFitPages; k: the cache).
func pagedSplit(S, H, G, ug int64, k ir.View, workers int) (splits, heads int64, ok bool) {
	n := (S + kvPagePositions - 1) / kvPagePositions
	if n < 2 { // a cache of one chunk: the ordinary split
		return 0, 0, false
	}
	if k.Shape[0] > 1 {
		return pagedBatchSplit(S, k.Shape[0]*k.Shape[1], G, k, workers)
	}
	if n <= maxSplits && H/ug*n <= int64(workers) {
		return n, ug, true
	}
	G = max(G, 1)
	n = min(int64(workers)/(H/G), maxSplits)
	if n < 2 || !chunksFitPages(S, n, k) {
		return 0, 0, false
	}
	chunk := ir.SplitChunk(S, n)
	return (S + chunk - 1) / chunk, G, true
}

// pagedBatchSplit is a decode batch's kv_pages layout (kv_pages_batch) for
// cells (row, KV head) pairs: a unit of all G heads of a KV head, so each
// row's K and V stream once a KV head, and as many chunks a cell as its
// tasks fill the workers in one round, two at least. A task takes its
// chunk's pages round by round (codegen's kvStream.Stream), so a chunk need
// not fit the ring, only a round's pages must (a head dim of 1,024: 24
// pages, the ordinary split). Chunks of at most kvPagePositions, the
// ring's size, took 2.4 rounds of the workers at batch 8 on llama-3.2-1b,
// each task ~9 us whatever its rows (bench/NOTES.md forty-ninth session),
// and the ordinary split's tasks read their rows from the cache,
// latency-bound.
func pagedBatchSplit(S, cells, G int64, k ir.View, workers int) (splits, heads int64, ok bool) {
	n, G := min(max(2, int64(workers)/cells), maxSplits, S), max(G, 1)
	D := k.Shape[3]
	if k.DType().Size() != 2 || stream.KVRowsPerPage(D) < 1 ||
		2*stream.KVRoundPairs(D, stream.KVRoundRows(ir.SplitChunk(S, n), G)) > stream.MaxRingPages {
		return 0, 0, false
	}
	return n, G, true
}

// chunksFitPages says whether S positions of the cache k cut into n chunks
// stream through the ring: 2-byte K rows (the ones its pages are sized
// for), a chunk's rows within stream.MaxKVPagesPerPart pages.
func chunksFitPages(S, n int64, k ir.View) bool {
	return k.DType().Size() == 2 && stream.KVRowsPerPage(k.Shape[3]) >= 1 &&
		stream.KVPagesPerPart(k.Shape[3], ir.SplitChunk(S, n)) <= stream.MaxKVPagesPerPart
}

// splitAttention spreads attention over the workers: decode has one query per
// head, so one task per KV head would leave most SMs idle while a few stream
// the whole cache. The KV positions are cut into chunks; each chunk's task
// writes a partial softmax (max, sum, unnormalised output) for every head and
// an AttnMerge op combines them (flash-decoding). With kvPages a single
// sequence's decode takes chunks of at most kvPagePositions, where its units
// (unitHeads) and chunks fit the workers. With longChunks a prompt chunk's
// attention with shared K and V takes chunks long enough for its tasks to
// fit one wave of the workers (oneWaveSplits).
func splitAttention(g *ir.Graph, workers int, prefillRows, kvPages, kvPagesBatch, longChunks bool) {
	var ops []*ir.Op
	for _, op := range g.Ops {
		ops = append(ops, op)
		if op.Kind != ir.Attention || op.Attr.Splits > 1 {
			continue
		}
		// (a cache of more than one chunk's positions: the rows then take two chunks at least)
		rows := prefillRows && op.In[1].Shape[2] > minPositionsPerSplit && queriesAsRows(op)
		q, k, v := op.In[0], op.In[1], op.In[2]
		B, H, Sq, Dv, S := q.Shape[0], q.Shape[1], q.Shape[2], v.Shape[3], k.Shape[2]
		per := int64(minPositionsPerSplit)
		if Sq == 1 {
			per = decodePositionsPerSplit
			if B == 1 {
				per = decodeOneRowPositionsPerSplit
			}
		}
		perRow := int64(workers) / max(B, 1)
		if rows { // a prompt's queries: the units past each query's extent cost little
			perRow = max(perRow, 2)
		}
		splits := min(perRow, (S+per-1)/per, maxSplits)
		if Sq == 1 { // a short cache still takes two chunks: the decode kernel is the split one
			splits = max(splits, min(2, perRow, (S+minPositionsPerSplit-1)/minPositionsPerSplit))
		}
		ug, paged := unitHeads(op.Attr.Groups, Dv), false
		// kv_pages (with a mask, whose extent then interleaves the splits one a group: boundMergeByExtent)
		if kvPages && Sq == 1 && (B == 1 || kvPagesBatch) && !rows && op.Attr.HasMask {
			if n, u, ok := pagedSplit(S, H, op.Attr.Groups, ug, k, workers); ok {
				splits, ug, paged = n, u, true
			}
		}
		sharedKV := rows && B >= sharedKVMinRows && op.Attr.Groups*((Dv+31)/32) <= maxSharedKVOutputs
		if sharedKV { // chunks of a tile, each read once for a block of rows, while the tasks are few enough
			perSplit := H / max(1, op.Attr.Groups) * ((B + stream.Threads/32 - 1) / (stream.Threads / 32))
			splits = min((S+ir.SharedKVTile-1)/ir.SharedKVTile, maxSplits, maxSharedKVTasksPerWorker*int64(workers)/perSplit)
			if longChunks {
				splits = min(splits, oneWaveSplits(workers, perSplit))
			}
			splits = max(2, splits)
		}
		if splits < 2 {
			continue
		}
		chunk := ir.SplitChunk(S, splits)
		splits = (S + chunk - 1) / chunk // no empty chunk
		partial := g.NewTemp(op.Node+"_partial", ir.F32, []int64{B, splits, H, Sq, Dv + 2})
		ops = append(ops, &ir.Op{Kind: ir.AttnMerge, Label: "attn_merge", Node: op.Node, Target: op.Target, Source: op.Source,
			In: []ir.View{partial}, Out: op.Out})
		op.Out, op.Attr.Splits = partial, splits
		if sharedKV {
			op.Attr.SharedKV, op.Attr.UnitHeads = true, max(1, op.Attr.Groups)
		} else if paged || Sq == 1 && ug > 1 && B*(H/ug)*splits >= int64(workers) {
			op.Attr.UnitHeads, op.Attr.Paged = ug, paged
		}
	}
	g.Ops = ops
}
