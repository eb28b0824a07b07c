// Package stream decides which Linear ops stream their weights through a
// worker's ring (csrc/runtime/ring.cuh) and how: the page size and the task
// split. decompose tiles by it, codegen emits the loader's table and the task
// template from it, and the CUDA task static_asserts the same page size.
package stream

import "mpk/gocore/ir"

// The shapes of the runtime these plans are for.
const (
	// Threads is a worker's consumer threads (MPK_THREADS).
	Threads = 512
	// PageBytes is a ring slot (mpk::kPageBytes).
	PageBytes = 16384
	// MaxKVPagesPerPart bounds a kv_pages attention task's pages of K (and
	// of V) for a single sequence: all of them sit in the ring at once while
	// the task runs (a ring of fewer than twice as many pages: codegen's
	// kvStream.fits). A batch's task takes them round by round.
	MaxKVPagesPerPart = 5
	// MaxRingPages bounds a worker's ring: landed pages ride out waits, but
	// more than ~10 gained nothing on the H100 (bench/NOTES.md).
	MaxRingPages = 10
	// TaskBytes bounds the weights one streamed task reads: its chunk partials
	// live in shared memory.
	TaskBytes = 512 << 10
	// maxXRegs is how many x values a consumer thread may hold in registers.
	maxXRegs = 32
	// MaxXBytes bounds x staged in shared memory (M rows of K fp32).
	MaxXBytes = 48 << 10
	// TileRows is the weight rows of a tile page (mpk::kTileRows, the mma's n).
	TileRows = 8
	// MaxTileXBytes bounds x of a tile stream in shared memory (M rows of
	// K+32 2-byte elements): eight rows of 8,192 fit beside a ring of 5 pages.
	MaxTileXBytes = 132 << 10
	// TileXPartBytes bounds a part of a tile stream's x staged in parts of
	// K (TileXParts): batch 8's x of a K = 2,048 Linear with its low part
	// (66.5 KB: q/k/v, o, gate, up; batch 16's in two parts, 66 KB each).
	// MaxTilePartGroups bounds the row groups of such a task whose sums stay
	// in registers across the parts (mpk::kTilePartGroups; with WideXParts a
	// task of more adds them in shared memory part by part).
	TileXPartBytes    = 67 << 10
	MaxTilePartGroups = 2
	// consumerWarps is MPK_THREADS / 32.
	consumerWarps = Threads / 32
	// GemmCols is the columns of K a GEMM stream's page and x block span
	// (mpk::kGemmCols); GemmPageRows the weight rows of its page, GemmRows
	// those of its task (two pages of each block of K).
	GemmCols     = 256
	GemmPageRows = 32
	GemmRows     = 64
	// GemmBlockCols is the columns of a GEMM page's column block
	// (mpk::kGemmBlockCols): a page holds its 32 rows' first 32 columns,
	// then their next 32, ..., so a row of a block is 64 bytes and the two
	// rows an mma load phase reads sit in different banks.
	GemmBlockCols = 32
	// GemmMaxRows bounds x's rows in a GEMM stream (its accumulators sit in
	// the consumers' registers); GemmMinRows is where lower picks it.
	GemmMaxRows = 64
	GemmMinRows = 32
	// GemmBatchMinRows is where lower picks a wgmma GEMM stream for bf16
	// weights with the GemmBatch option (a decode batch of 4 to 31, which
	// else streams as tiles; lower.markGemm says which Linears): x's split
	// rows are wgmma's B, N as small as 16.
	GemmBatchMinRows = 4
	// gemmPitch is a staged row of an x block in the weights' 2-byte type,
	// gemmPitchF one in fp32 (x with its low part), in elements
	// (mpk::kGemmPitch, mpk::kGemmPitchF).
	gemmPitch  = GemmCols + 32
	gemmPitchF = GemmCols + 4
	// gemmRedPad is the floats past each row of a GEMM task's partials
	// (mpk::kGemmRedPad: its stores free of bank conflicts).
	gemmRedPad = 8
	// WgmmaPageRows and WgmmaCols are a wgmma stream's page (mpk::kWgPageRows,
	// kWgPageCols): 64 weight rows (wgmma's N) × 128 columns, a column half
	// of a GemmCols block; wgmmaPitch is its staged row of an fp32 x
	// (mpk::kWgPitch).
	WgmmaPageRows = 64
	WgmmaCols     = 128
	wgmmaPitch    = GemmCols + 8
	// WgmmaRowBytes is a row of a wgmma page's column block, the span its
	// tensor map swizzles (mpk::kWgRowBytes): 64 columns, 128-byte swizzled
	// (4-8% faster a block than 64-byte rows: bench/NOTES.md, forty-second
	// session).
	WgmmaRowBytes = 128
)

// Plan is how one Linear streams. With Tiles, x's M rows meet the weights on
// the tensor cores (mpk::linear_tiles): a page holds TileRows rows of Cols
// columns; else x sits in the consumers' registers (mpk::linear_stream, one
// or two rows) and a page holds whole rows or 1/Split of one.
type Plan struct {
	M, K      int64 // rows of x, the reduction length
	ElemBytes int64 // of a weight
	PageBytes int64 // whole rows per page, or 1/Split of a row; tiles: TileRows·Cols elements; gemm: GemmPageRows·Cols
	Split     int64 // pages per row (1: a page holds whole rows)
	Tiles     bool
	Cols      int64 // tiles: the columns of a page
	XLow      bool  // tiles: x is staged as hi + lo (else rounded to the weights' dtype)
	RowStride int64 // tiles, gemm: elements from one weight row to the next (K, or more for a slice of columns)
	// Gemm: x's M rows are staged a block of GemmCols columns at a time (as
	// fp32 with XLow) and the task's GemmRows weight rows arrive block by
	// block (pages of GemmPageRows rows, column-block-major), the products
	// accumulating in registers across K (mpk::linear_gemm).
	Gemm bool
	// Wgmma: a Gemm plan of an fp32 x whose products run on wgmma
	// (mpk::linear_wgmma): the same tasks and blocks, pages of
	// WgmmaPageRows rows × WgmmaCols columns (128-byte swizzled tensor-map
	// boxes), x staged a block at a time as for Gemm.
	Wgmma bool
	// Pair: a paired Linear (ir.Epilogue.Pair) streams the task's rows of
	// its second weight after those of its first (x in registers), each row
	// group's pages after the first weight's (tiles), or each block's
	// (Gemm).
	Pair bool
	// XParts: tiles whose x is staged in this many parts of K, one after
	// another (TileXParts; 0 or 1: whole), the task's pages part by part,
	// each part's row groups in order.
	XParts int64
}

// tileCols mirrors mpk::tile_cols: the columns of a tile page of K-wide rows
// (the most that fit, in whole 32-column slices for every consumer warp,
// dividing K), 0 if none.
func tileCols(K, esz int64) int64 {
	for c := PageBytes / (TileRows * esz); c >= 32*consumerWarps; c -= 32 * consumerWarps {
		if K%c == 0 {
			return c
		}
	}
	return 0
}

// TileXBytes mirrors mpk::tile_x_bytes: x of a tile stream in shared
// memory, twice with its low part.
func TileXBytes(K, M, esz int64, low bool) int64 {
	parts := int64(1)
	if low {
		parts = 2
	}
	return (parts*M*(K+32)*esz + 15) / 16 * 16
}

// GemmWarpsK is the most consumer warps that split a block of K in a GEMM
// stream of M rows (the rest split the rows of x and the two pages):
// mpk::gemm_warps_k at MPK_GEMM_WARP_MTILES=2, the larger of its two
// settings, so the scratch reserved for their partials fits either. A
// pair's tasks have four pages a block and half as many (the partials take
// the same bytes: twice the rows).
func GemmWarpsK(M int64) int64 {
	mt := (M + 15) / 16
	return consumerWarps / (2 * ((mt + 1) / 2))
}

// GemmScratch mirrors mpk::gemm_scratch_bytes: x's double-buffered block
// (fp32 with low, else in the weights' 2-byte type), or (after the last
// block) every K warp's partials of the task's outputs.
func GemmScratch(M int64, low bool) int64 {
	x := 2 * M * gemmPitch * 2
	if low {
		x = 2 * M * gemmPitchF * 4
	}
	return max(x, GemmWarpsK(M)*M*(GemmRows+gemmRedPad)*4)
}

// WgmmaScratch mirrors mpk::wgmma_scratch_bytes: two blocks of an fp32 x,
// 64 rows each, or the four partials of the task's outputs.
func WgmmaScratch() int64 {
	return max(2*64*wgmmaPitch*4, 4*64*(GemmRows+gemmRedPad)*4)
}

// XBytes is the shared memory x takes while the plan's tasks run.
func (p Plan) XBytes() int64 {
	if p.Wgmma {
		return WgmmaScratch()
	}
	if p.Gemm {
		return GemmScratch(p.M, p.XLow)
	}
	if p.Tiles {
		return TileXBytes(p.K/max(1, p.XParts), p.M, p.ElemBytes, p.XLow)
	}
	return p.M * p.K * 4
}

// TileXParts is how many parts of K a tile stream's x is staged in, one
// after another, so that a part takes at most TileXPartBytes: a plain x
// (no prologue: the caller's to check) whose whole would leave the worker's
// ring fewer pages than the other tile streams leave it (llama-3.2-1b's down
// projection at batch 8: 8 rows of 8,192, 132 KB, a ring of 5 pages where
// the others' 66.5 KB leave 8). Only where a task reads at most
// MaxTilePartGroups groups of TileRows weight rows: each group's sums live
// across the parts; not a pair. wide (codegen's WideXParts) lifts both
// bounds. 1: x whole.
func TileXParts(p Plan, taskRows int64, wide bool) int64 {
	if !p.Tiles || !wide && (p.Pair || taskRows > MaxTilePartGroups*TileRows) ||
		TileXBytes(p.K, p.M, p.ElemBytes, p.XLow) <= TileXPartBytes {
		return 1
	}
	blocks := p.K / p.Cols
	for parts := int64(2); parts <= blocks; parts++ {
		if blocks%parts == 0 && TileXBytes(p.K/parts, p.M, p.ElemBytes, p.XLow) <= TileXPartBytes {
			return parts
		}
	}
	return 1
}

// DeferredNorm says whether op's prologue is a norm that a tile stream
// defers (mpk::tile_norm_deferred, up to its run-time check of the rows'
// alignment): an RMSNorm with a bf16 weight, one row broadcast over x's,
// over an fp32 x with an fp32 result (every decoder's norm over the widened
// residual stream). Only its x may be staged in parts of K: the rows' sums
// of squares add up part by part, and the dots are scaled once all are in.
func DeferredNorm(op *ir.Op) bool {
	pro := op.Attr.Pro
	if op.Kind != ir.Linear || pro == nil || pro.Kind != ir.RMSNorm || !pro.HasWeight || pro.First >= len(op.In) {
		return false
	}
	w := op.In[pro.First]
	return op.In[0].DType() == ir.F32 && w.DType() == ir.BF16 && pro.DType == ir.F32 && w.Rank() == 2 && w.Strides[0] == 0
}

// BlockBytes is the bytes of a row a Gemm plan's page holds a column
// block at a time (mpk::gemm_page_at, mpk::kWgBlockBytes): the page lands
// block after block.
func (p Plan) BlockBytes() int64 {
	if p.Wgmma {
		return WgmmaRowBytes
	}
	return GemmBlockCols * p.ElemBytes
}

// Unit is the weight rows a task's tile is a multiple of (but the last).
func (p Plan) Unit() int64 {
	if p.Gemm {
		return GemmPageRows
	}
	if p.Tiles {
		return TileRows
	}
	return 1
}

// chunk is the elements a warp's 16-byte loads cover: one partial sum.
func chunk(elemBytes int64) int64 { return 32 * 16 / elemBytes }

// pageSplit mirrors mpk::page_split: how many pages a row of K spans.
func pageSplit(K, slotElems, chunk int64) int64 {
	if K <= 0 || K%chunk != 0 {
		return 0
	}
	for s := int64(1); s <= K/chunk; s++ {
		if K%s == 0 && (K/s)%chunk == 0 && K/s <= slotElems {
			return s
		}
	}
	return 0
}

// For returns op's plan, or false when op does not stream: not a Linear; a
// weight that is not a caller-owned tensor of contiguous, 16-byte aligned
// bf16/fp16/fp32 rows that nothing in the graph writes (the loader reads it
// ahead of every event); or x fits neither plan: in registers (K a multiple
// of a warp load, one or two rows) or on the tensor cores (2-byte weights,
// K a multiple of 512, x within MaxTileXBytes; an fp32 x is split into two
// parts of the weights' dtype where both fit, else rounded to it, as eager
// rounds every activation).
func For(op *ir.Op, written func(*ir.Buffer) bool) (Plan, bool) {
	if op.Kind != ir.Linear {
		return Plan{}, false
	}
	w := op.In[1]
	switch w.DType() {
	case ir.BF16, ir.F16, ir.F32:
	default:
		return Plan{}, false
	}
	esz := w.DType().Size()
	if w.Rank() != 2 {
		return Plan{}, false
	}
	M, K := op.Out.Shape[0], op.LinearK()
	// Rows of K weights, row_stride apart: K itself, or (tiles only: a row
	// segment is a bulk copy of its own) wider rows of which the Linear reads
	// K columns (lower.splitLinearK).
	if w.Strides[1] != 1 || w.Strides[0] < K || w.Strides[0]*esz%16 != 0 || w.Offset*esz%16 != 0 ||
		w.Buf.Kind != ir.Input || written(w.Buf) {
		return Plan{}, false
	}
	if op.Attr.Gemm {
		if !Gemmable(op) {
			return Plan{}, false
		}
		// An fp32 x (every intermediate) keeps its low part: x = hi + lo,
		// each on the tensor cores (rounded, a 64-token chunk's argmax
		// left both fp32's and eager's at a near tie).
		p := Plan{M: M, K: K, ElemBytes: esz, PageBytes: GemmPageRows * GemmCols * esz, Split: K / GemmCols, Gemm: true,
			Cols: GemmCols, XLow: op.LinearX().Size() > esz, RowStride: w.Strides[0]}
		// wgmma takes bf16 weights and an fp32 x (split into hi + lo in registers).
		if op.Attr.Wgmma && w.DType() == ir.BF16 && op.LinearX() == ir.F32 {
			p.Wgmma, p.Cols = true, WgmmaCols
		}
		if w2, ok := op.PairWeight(); ok { // each block's pages of the second weight follow the first's
			p.Pair = true
			return p, samePairWeight(w, w2, K, written)
		}
		return p, true
	}
	w2, pair := op.PairWeight()
	if pair && !samePairWeight(w, w2, K, written) {
		return Plan{}, false
	}
	if p, ok := regPlan(M, K, esz); ok && w.Strides[0] == K { // a pair: both weights stream alike, x in registers
		p.Pair = pair
		return p, true
	}
	xdt := op.LinearX()
	cols := tileCols(K, esz)
	if esz != 2 || !xdt.IsFloat() || cols == 0 || TileXBytes(K, M, esz, false) > MaxTileXBytes {
		return Plan{}, false
	}
	// x wider than the weights keeps its low part where that fits.
	low := xdt.Size() > esz && TileXBytes(K, M, esz, true) <= MaxTileXBytes
	// A pair (lower's pair_tiles): each row group's pages of the second
	// weight follow the first's.
	return Plan{M: M, K: K, ElemBytes: esz, PageBytes: TileRows * cols * esz, Split: K / cols, Tiles: true, Cols: cols,
		XLow: low, RowStride: w.Strides[0], Pair: pair}, true
}

// samePairWeight says whether a paired Linear's second weight w2 streams
// as its first, w, does: the same dtype and shape, both caller-owned rows
// K apart that nothing in the graph writes.
func samePairWeight(w, w2 ir.View, K int64, written func(*ir.Buffer) bool) bool {
	esz := w.DType().Size()
	return w2.DType() == w.DType() && w2.Rank() == 2 && w2.Shape[0] == w.Shape[0] && w2.Shape[1] == K &&
		w2.Strides[1] == 1 && w2.Strides[0] == K && w2.Offset*esz%16 == 0 && w2.Buf.Kind == ir.Input && !written(w2.Buf) &&
		w.Strides[0] == K
}

// Gemmable says whether op's shapes and dtypes fit a GEMM stream (its
// weight's layout aside, which For checks): 2-byte weights, K a multiple of
// GemmCols, at most GemmMaxRows rows of a plain x (no prologue: x is staged
// a block of K at a time, and a norm needs whole rows).
func Gemmable(op *ir.Op) bool {
	if op.Kind != ir.Linear || op.Attr.Pro != nil || op.In[1].Rank() != 2 || op.In[0].Rank() != 2 {
		return false
	}
	M, K := op.Out.Shape[0], op.LinearK()
	return op.In[1].DType().Size() == 2 && op.LinearX().IsFloat() && K%GemmCols == 0 && M >= 1 && M <= GemmMaxRows
}

// KeepsX says whether plan p for op streams x as it is: fp32 rows, x in the
// weights' dtype, or tiles that keep a wider x's low part (not rounded).
func (p Plan) KeepsX(op *ir.Op) bool {
	return !p.Tiles || p.XLow || op.LinearX().Size() <= p.ElemBytes
}

// MaxRows is how many rows of op's x (at most its own) a block of a Linear
// too tall for For takes (lower.splitLinearRows): the most that stream with
// op's other shapes and dtypes and keep an fp32 x's low part (rounding x
// flipped near-tied argmaxes at batch 8), if that is at least 4 (or all that
// stream); else the most that stream, x rounded; 0 if none do.
func MaxRows(op *ir.Op, written func(*ir.Buffer) bool) int64 {
	c := *op
	c.Out = op.Out.Clone()
	var mExact, mAny int64
	for m := op.Out.Shape[0]; m > 0 && mExact == 0; m-- {
		c.Out.Shape[0] = m
		p, ok := For(&c, written)
		if !ok {
			continue
		}
		if p.KeepsX(op) {
			mExact = m
		}
		if mAny == 0 {
			mAny = m
		}
	}
	if mExact >= min(4, mAny) {
		return mExact
	}
	return mAny
}

// regPlan is the plan with x in the consumers' registers, if it fits.
func regPlan(M, K, esz int64) (Plan, bool) {
	c := chunk(esz)
	slot := PageBytes / esz
	split := pageSplit(K, slot, c)
	if split == 0 || M*K*4 > MaxXBytes {
		return Plan{}, false
	}
	elems := K / split
	if split == 1 {
		elems = slot / K * K
	}
	vec := 16 / esz
	loads := (elems + Threads*vec - 1) / (Threads * vec)
	if M*split*loads*vec > maxXRegs {
		return Plan{}, false
	}
	return Plan{M: M, K: K, ElemBytes: esz, PageBytes: elems * esz, Split: split}, true
}

// Tasks is how many tasks a streamed Linear with N weight rows splits into
// on `workers` workers: every worker streams a part of every matrix (the LM
// head included), each task at most TaskBytes.
func (p Plan) Tasks(N int64, workers int) int64 {
	if p.Gemm { // GemmRows a task: lower's splitLinearK spreads a short N over the workers
		return (N + GemmRows - 1) / GemmRows
	}
	bytes := N * p.K * p.ElemBytes * p.weights()
	parts := (bytes + TaskBytes - 1) / TaskBytes
	W := int64(workers)
	parts = (parts + W - 1) / W * W
	return min(parts, N)
}

// PartialFloats is the shared memory (in floats) the partials of a task of
// `rows` weight rows take: a chunk's per row, or, with tiles, every warp's
// for two row groups and the dots of every row.
func (p Plan) PartialFloats(rows int64) int64 {
	if p.Gemm {
		return 0 // in GemmScratch
	}
	if p.Tiles {
		return (2*consumerWarps*TileRows + rows*p.weights()) * p.M
	}
	return rows * p.weights() * p.K / chunk(p.ElemBytes) * p.M
}

// weights is how many weights a task streams rows of: 2 for a pair.
func (p Plan) weights() int64 {
	if p.Pair {
		return 2
	}
	return 1
}

// Writers returns a function telling whether any op of g writes a buffer.
func Writers(g *ir.Graph) func(*ir.Buffer) bool {
	w := map[*ir.Buffer]bool{}
	for _, op := range g.Ops {
		w[op.Out.Buf] = true
	}
	return func(b *ir.Buffer) bool { return w[b] }
}

// KVRowsPerPage is how many K (or V) rows of head dim d in 2-byte elements
// a ring page holds (mpk::KVPages::RPP).
func KVRowsPerPage(d int64) int64 { return PageBytes / (2 * d) }

// KVPagesPerPart is how many ring pages n such rows take (mpk::KVPages::pages_of).
func KVPagesPerPart(d, n int64) int64 {
	rpp := KVRowsPerPage(d)
	return (n + rpp - 1) / rpp
}

// KVRoundRows mirrors 32·mpk::decode_unit_warps: the rows a round of a
// decode attention task's units takes, a warp's 32 each, for chunks of
// chunk rows and units one-head units side by side.
func KVRoundRows(chunk, units int64) int64 {
	warps := int64(Threads / 32)
	return 32 * min(warps, (chunk+31)/32, max(1, warps/units))
}

// KVRoundPairs mirrors mpk::kv_round_pairs: the (K, V) page pairs of head
// dim d a streamed kv task's warp holds at once, one round's of R rows
// (rounds from the chunk's first row).
func KVRoundPairs(d, R int64) int64 {
	rpp := KVRowsPerPage(d)
	switch {
	case R%rpp == 0:
		return R / rpp
	case rpp%R == 0:
		return 1
	}
	return (R+rpp-1)/rpp + 1
}
