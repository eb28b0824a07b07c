package codegen

import (
	"slices"

	"mpk/gocore/ir"
	"mpk/gocore/stream"
	"mpk/gocore/tgraph"
)

// kvStream is how a fresh-row decode attention (option kv_pages; a batch's
// with kv_pages_batch) streams each task's K and V chunk through the
// worker's ring:
// the loader reads a task's first unit's K rows, then its V rows, into
// pages of whole rows (mpk::KVPages mirrors the arithmetic), while the
// task still waits for its queries. A fresh-row attention never reads the
// cache row the step writes (tgraph.Access.Fresh) and nothing else in the
// launch writes the cache, so its K and V rows, like weights, may be read
// before any event; the loader's copy of the written row is never used.
// A batch's (Stream) alternates the K and V rows' pages and its task takes
// them a round of RoundRows rows at a time (mpk::KVPages' STREAM), so its
// chunk need not fit the ring.
//
// Swizzle (option kv_swizzle): a Stream task on the tensor cores takes its
// pages as boxes of tensor maps over the caches (rows of D elements), each
// 64-column block's rows 128-byte swizzled (a row's 16-byte chunk c at c ^
// bits 7-9 of its address), so the 8 rows an ldmatrix reads fall in
// distinct banks: with plain 128-byte rows they were 8-way conflicted, a
// quarter of batch 8's excess shared-memory wavefronts, and a probe's
// rounds took 29-36% less time swizzled (bench/NOTES.md, fifty-third
// session).
type kvStream struct {
	D, S, H, G, UG, Splits int64
	Chunk, RowsPerPage     int64
	Stream                 bool
	RoundRows              int64
	Swizzle                bool
}

// kvPageDims says whether 2-byte K and V rows of head dim D suit a kv_pages
// task (mpk::attention_kv_pages): attention_decode's vector loads
// (mpk::decode_fast_dims: a lane's V columns one 4-, 8- or 16-byte load, so
// D is 64, 128 or 256) and whole rows a ring page (mpk::KVPages). A head
// dim of 192 failed both static_asserts in nvcc; it reads the cache.
func kvPageDims(D int64) bool {
	vbytes := (D + 31) / 32 * 2
	return D%32 == 0 && (vbytes == 4 || vbytes == 8 || vbytes == 16) && stream.PageBytes%(D*2) == 0
}

// kvStreamOf reports whether op's tasks stream their K and V: a fresh-row
// decode attention, one split a group (a task is one chunk of one unit of
// one batch row: mpk::attention_kv_pages), whose K and V are caller-owned caches
// of 2-byte elements in contiguous rows, every row 16-byte aligned (the
// bulk copies' rule, as for weights), a chunk within
// stream.MaxKVPagesPerPart pages (a batch's: any chunk, round by round).
func kvStreamOf(op *ir.Op) (kvStream, bool) {
	if op.Kind != ir.Attention || op.Attr.Fresh == nil || op.Attr.Splits < 2 || !op.DecodeUnits() ||
		op.Attr.SharedKV || op.Attr.Interleave != op.Attr.Splits {
		return kvStream{}, false
	}
	k, v := op.In[1], op.In[2]
	D := k.Shape[3]
	if !kvPageDims(D) {
		return kvStream{}, false
	}
	for _, x := range []ir.View{k, v} {
		if x.DType() != ir.BF16 && x.DType() != ir.F16 || x.Rank() != 4 || x.Shape[3] != D || x.Strides[3] != 1 ||
			x.Strides[2] != D || x.Buf.Kind != ir.Input || (x.Offset*2)%16 != 0 ||
			(x.Strides[1]*2)%16 != 0 || (x.Strides[0]*2)%16 != 0 {
			return kvStream{}, false
		}
	}
	if v.DType() != k.DType() || v.Shape[2] != k.Shape[2] {
		return kvStream{}, false
	}
	ks := kvStream{D: D, S: k.Shape[2], H: op.In[0].Shape[1], G: max(1, op.Attr.Groups), UG: op.HeadsPerUnit(),
		Splits: op.Attr.Splits, RowsPerPage: stream.KVRowsPerPage(D), Stream: op.In[0].Shape[0] > 1}
	ks.Chunk = ir.SplitChunk(ks.S, ks.Splits)
	ks.RoundRows = stream.KVRoundRows(ks.Chunk, ks.UG)
	if ks.RowsPerPage < 1 || !ks.Stream && ks.pagesPerPart(ks.Chunk) > stream.MaxKVPagesPerPart {
		return kvStream{}, false
	}
	return ks, true
}

// mma reports whether a Stream task folds its rounds on the tensor cores
// (mpk::kv_batch_mma: all UG heads of a unit in one m16n8k16 tile) rather
// than on attention_decode's lanes: llama-3.2-1b's batch 8 took 3.3% less
// time and batch 16 1.6% less (head dim 64, fiftieth session); qwen3-8b's
// batch 8 (head dim 128) 2.5% less once the queries stay in shared memory
// (MPK_DECODE_MMA_QSMEM; before, they spilled and it took 4.8% more; H200,
// bench/NOTES.md, fifty-first session). Only shapes mpk::DecodeMma takes
// (a head dim of whole 32-column steps, at most 8 heads a unit: Qwen3-235B's
// 16 query heads a KV head keep the lanes), and only where its shared
// memory stays within a tile stream's x bound (stream.MaxTileXBytes: at
// head dim 256, 8 heads took 153 KB and would squeeze the ring).
func (ks kvStream) mma() bool {
	return ks.Stream && ks.D%32 == 0 && ks.UG <= 8 && int64(ks.mmaBytes()) <= stream.MaxTileXBytes
}

// mmaBytes is kv_batch_mma's shared memory (mpk::kv_mma_bytes): the unit's
// queries and new V rows, then every warp's state for each head, then the
// queries' hi and lo as 8 bf16 rows each of D + 8 (mpk::decode_mma_q_bytes;
// reserved also where MPK_DECODE_MMA_QSMEM=0 leaves them in registers).
func (ks kvStream) mmaBytes() int {
	return int(2*ks.UG*ks.D+Threads/32*ks.UG*(ks.D+2))*4 + int(2*8*(ks.D+8))*2
}

// kvSwizzleBlock is the bytes of a swizzled page's column block: 64
// elements of each row, the span of a 128-byte swizzle (mpk::KVPages).
const kvSwizzleBlock = 128

// swizzles reports whether the Stream task on the tensor cores of op can
// take swizzled pages (Swizzle): a head dim of whole 128-byte blocks, and K
// and V viewed alike, each (row, KV head)'s rows starting a whole row of D
// elements into its buffer, so one tensor-map row (kvRow) serves both.
func (ks kvStream) swizzles(op *ir.Op) bool {
	k, v := op.In[1], op.In[2]
	return ks.Stream && ks.mma() && (ks.D*2)%kvSwizzleBlock == 0 && k.Offset == v.Offset &&
		slices.Equal(k.Strides, v.Strides) && k.Offset%ks.D == 0 && k.Strides[0]%ks.D == 0 && k.Strides[1]%ks.D == 0 &&
		k.Buf.Numel%ks.D == 0 && v.Buf.Numel == k.Buf.Numel
}

// kvMap is the tensor map of a swizzled chunk's K (or V) cache x: its
// buffer as rows of D elements, a box a page (RowsPerPage rows, landing
// block after block of 128 bytes, swizzled).
func (gen *generator) kvMap(ks kvStream, x ir.View) tmapSpec {
	return tmapSpec{Slot: gen.l.slot[x.Buf], Offset: gen.l.offset[x.Buf] * 2, Cols: ks.D * 2 / tmapUnit,
		Rows: x.Buf.Numel / ks.D, RowBytes: ks.D * 2, BoxCols: ks.D * 2 / tmapUnit, BoxRows: ks.RowsPerPage,
		BlockCols: kvSwizzleBlock / tmapUnit, Swizzle: kvSwizzleBlock}
}

// roundPairs is the (K, V) page pairs a Stream task's warp holds at once,
// a round's.
func (ks kvStream) roundPairs() int64 { return stream.KVRoundPairs(ks.D, ks.RoundRows) }

// fits reports whether a task's K and V pages fit a ring of ringPages at
// once (Stream: a round's). When they do not (a module whose scratch leaves
// a smaller ring), the loader streams nothing for the op and
// mpk::attention_kv_pages, by the same arithmetic, reads the chunk from the
// cache.
func (ks kvStream) fits(ringPages int) bool { return ks.pagesAtOnce() <= int64(ringPages) }

// pagesAtOnce is how many pages of K and V a task holds at once (Stream: a
// round's).
func (ks kvStream) pagesAtOnce() int64 {
	if ks.Stream {
		return 2 * ks.roundPairs()
	}
	return 2 * ks.pagesPerPart(ks.Chunk)
}

// pagesPerPart is how many pages rows of K (or of V) take.
func (ks kvStream) pagesPerPart(rows int64) int64 { return stream.KVPagesPerPart(ks.D, rows) }

// first is the task's unit (one split a group: split sp covers chunk sp, as
// mpk::attention_kv_pages reads it): its batch row, KV head and the
// positions [j0, j0 + rows) of its chunk (rows 0: past the cache, nothing
// streams). Units are numbered row by row, a row's head units by heads.
func (ks kvStream) first(lo int64) (b, kvh, j0, rows int64) {
	sp, u, units := lo%ks.Splits, lo/ks.Splits, ks.H/ks.UG
	j0 = min(sp*ks.Chunk, ks.S)
	return u / units, u % units * ks.UG / ks.G, j0, min(ks.Chunk, ks.S-j0)
}

// kvStreamOf is the loader's table entry of task t of op: the first unit's K
// rows, then (a pair's second part) its V rows, in pages of whole rows
// (Stream: a K page, then the V page of the same rows).
func (gen *generator) kvStreamOf(op *ir.Op, ks kvStream, t *tgraph.Task, split int) streamEntry {
	lo, _ := taskRange(op, t.Box, split)
	b, kvh, j0, rows := ks.first(lo)
	if rows <= 0 || !ks.fits(gen.ringPages) {
		return noStream
	}
	at := func(x ir.View) int64 {
		return (gen.l.offset[x.Buf] + x.Offset + b*x.Strides[0] + kvh*x.Strides[1] + j0*x.Strides[2]) * 2
	}
	k, v := op.In[1], op.In[2]
	// Cut to the live length: the chunk's first position, and a row's bytes.
	liveJ0, rowBytes := int64(-1), int64(0)
	if gen.kvLive {
		liveJ0, rowBytes = j0, ks.D*2
	}
	e := noStream
	e.slot, e.pageBytes, e.offset, e.bytes, e.rowBytes = int64(gen.l.slot[k.Buf]), ks.RowsPerPage*ks.D*2, at(k), rows*ks.D*2, rowBytes
	e.pairSlot, e.pairOffset, e.kvJ0 = int64(gen.l.slot[v.Buf]), at(v), liveJ0
	if ks.Stream {
		e.kvInterleave = 1
	}
	if ks.Swizzle { // the chunk's first row in the maps (swizzles: K's and V's alike), and a row's bytes
		e.tmap, e.pairTmap = int64(gen.tmap(gen.kvMap(ks, k))), int64(gen.tmap(gen.kvMap(ks, v)))
		e.tmapRow, e.rowBytes = (k.Offset+b*k.Strides[0]+kvh*k.Strides[1])/ks.D+j0, ks.D*2
	}
	return e
}

// kvLiveExtent reports whether the loader may cut every kv stream to the
// live length (runtime.cuh's s_kv_extent): each kv_pages attention reads its mask's
// extent (ir.Attrs.HasExtent: In[4], one batch row) and all read the same
// one, so a worker's first kv_pages task can hand its value to the loader
// (mpk::s_kv_extent) and every chunk's rows past it are never read. A
// batch's rows each have their own extent: the loader streams whole chunks.
func (gen *generator) kvLiveExtent() bool {
	var ext *ir.View
	for op := range gen.kvs {
		if !op.Attr.HasExtent || len(op.In) < 5 || op.In[0].Shape[0] != 1 {
			return false
		}
		if e := op.In[4]; ext == nil {
			ext = &e
		} else if e.Buf != ext.Buf || e.Offset != ext.Offset {
			return false
		}
	}
	return ext != nil
}

// bulkInputs lists the graph inputs the loader reads with bulk copies: the
// streamed Linears' weights and the kv_pages attentions' caches, by index.
func (gen *generator) bulkInputs() []int {
	seen := map[int]bool{}
	add := func(v ir.View) {
		if v.Buf.Kind == ir.Input {
			seen[v.Buf.Index] = true
		}
	}
	for op := range gen.plans {
		add(op.In[1])
		if w2, ok := op.PairWeight(); ok {
			add(w2)
		}
	}
	for op := range gen.kvs {
		add(op.In[1])
		add(op.In[2])
	}
	out := make([]int, 0, len(seen))
	for i := range seen {
		out = append(out, i)
	}
	slices.Sort(out)
	return out
}
