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
	// TaskBytes bounds the weights one streamed task reads: its chunk partials
	// live in shared memory.
	TaskBytes = 512 << 10
	// maxXRegs is how many x values a consumer thread may hold in registers.
	maxXRegs = 32
	// MaxXBytes bounds x staged in shared memory (M rows of K fp32).
	MaxXBytes = 48 << 10
)

// Plan is how one Linear streams.
type Plan struct {
	M, K      int64 // rows of x, the reduction length
	ElemBytes int64 // of a weight
	PageBytes int64 // whole rows per page, or 1/Split of a row
	Split     int64 // pages per row (1: a page holds whole rows)
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
// ahead of every event); K not a multiple of a warp load; or x too large to
// keep in registers and shared memory.
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
	if w.Strides[1] != 1 || w.Strides[0] != K || w.Offset*esz%16 != 0 ||
		w.Buf.Kind != ir.Input || written(w.Buf) {
		return Plan{}, false
	}
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
	bytes := N * p.K * p.ElemBytes
	parts := (bytes + TaskBytes - 1) / TaskBytes
	W := int64(workers)
	parts = (parts + W - 1) / W * W
	return min(parts, N)
}

// PartialFloats is the shared memory (in floats) the chunk partials of a
// task of `rows` weight rows take.
func (p Plan) PartialFloats(rows int64) int64 { return rows * p.K / chunk(p.ElemBytes) * p.M }

// Writers returns a function telling whether any op of g writes a buffer.
func Writers(g *ir.Graph) func(*ir.Buffer) bool {
	w := map[*ir.Buffer]bool{}
	for _, op := range g.Ops {
		w[op.Out.Buf] = true
	}
	return func(b *ir.Buffer) bool { return w[b] }
}
