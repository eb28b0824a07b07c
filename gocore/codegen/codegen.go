package codegen

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"mpk/gocore/ir"
	"mpk/gocore/stream"
	"mpk/gocore/tgraph"
)

// Module is what Generate produces: source files by name.
type Module struct {
	Files map[string]string
	// BulkInputs are the graph inputs the loader reads with bulk copies
	// (streamed weights, kv_pages caches), by index: their data must be
	// 16-byte aligned, which the caller checks at every call.
	BulkInputs []int
}

// layout assigns every buffer a pointer slot and every temporary an offset
// (in elements) in the arena.
type layout struct {
	slot       map[*ir.Buffer]int
	offset     map[*ir.Buffer]int64
	arenaSlot  int
	arenaBytes int64
}

// newLayout gives the inputs and outputs their slots and the temporaries
// their arena offsets, as package arena placed them in tg.
func newLayout(g *ir.Graph, tg *tgraph.Graph) (layout, error) {
	l := layout{slot: map[*ir.Buffer]int{}, offset: map[*ir.Buffer]int64{}, arenaBytes: tg.ArenaBytes}
	nIn := len(g.Inputs)
	l.arenaSlot = nIn + len(g.Outputs)
	for _, b := range g.Buffers {
		switch {
		case b.Kind == ir.Input:
			l.slot[b] = b.Index
		case b.Kind == ir.Output:
			l.slot[b] = nIn + b.Index
		case b.ID < len(tg.Buffers) && tg.Buffers[b.ID].InArena:
			info := tg.Buffers[b.ID]
			l.slot[b] = l.arenaSlot
			l.offset[b] = info.Arena / info.ElemBytes
		}
	}
	for _, op := range g.Ops {
		for _, v := range append([]ir.View{op.Out}, op.In...) {
			if _, ok := l.slot[v.Buf]; !ok {
				return l, fmt.Errorf("codegen: op %d's buffer %s has no place in the arena (arena.Place did not run)", op.ID, v.Buf.Name)
			}
		}
	}
	return l, nil
}

// splitDim finds the one dim along which decompose cut op's tiles. An op
// left whole reports the dim its task kernel reads [lo, hi) along: Linear's
// weight rows, attention's heads or KV chunks, the merge's heads (dim 0
// there was a batch range, which those kernels took for the whole op's
// first rows or chunks).
func splitDim(op *ir.Op, b tgraph.Box) int {
	shape := op.IterShape()
	for d := range shape {
		if b.Lo[d] != 0 || b.Hi[d] != shape[d] {
			return d
		}
	}
	switch op.Kind {
	case ir.Linear, ir.Attention, ir.AttnMerge:
		return 1
	}
	return 0
}

// taskRange is the [lo, hi) a task's kernel reads: the box along the split
// dim, or for decode attention the flat units (row·groups + group)·Splits +
// chunk it covers, a group being HeadsPerUnit heads (whole rows, whole
// groups of one row, or chunks of one group: decompose cuts no other boxes).
func taskRange(op *ir.Op, b tgraph.Box, d int) (int64, int64) {
	if op.Attr.SharedKV { // rows of one (head group, split): flat (group·Splits + split)·B + row
		B, splits, ug := op.Out.Shape[0], op.Out.Shape[1], op.HeadsPerUnit()
		first := (b.Lo[2]/ug*splits + b.Lo[1]) * B
		return first + b.Lo[0], first + b.Hi[0]
	}
	if op.DecodeUnits() {
		splits, H, ug := op.Out.Shape[1], op.Out.Shape[2], op.HeadsPerUnit()
		row := H / ug * splits
		if wholeDecodeRows(op, b) {
			return b.Lo[0] * row, b.Hi[0] * row
		}
		return b.Lo[0]*row + b.Lo[2]/ug*splits + b.Lo[1], b.Lo[0]*row + (b.Hi[2]/ug-1)*splits + b.Hi[1]
	}
	return b.Lo[d], b.Hi[d]
}

// sharedKVBytes mirrors mpk::attention_rows_bytes: a chunk of K and of V
// (rows padded by 8 elements) and every warp's queries; or, for a shape the
// tensor-core body takes (mpk::rows_mma_shape), its bytes if larger.
func sharedKVBytes(C, D, G int) int {
	warps := Threads / 32
	scalar := 2*C*(D+8)*2 + warps*G*D*4
	parts := 1 // mpk::rows_mma_parts
	if D > 64 {
		parts = 2
	}
	if D%16 != 0 || D > 128 || D%(16*parts) != 0 || G < 1 || G > 4 || warps%G != 0 || warps/G%parts != 0 {
		return scalar
	}
	// K and V tiles of whole groups of 16 positions, whose bytes the summed
	// outputs reuse; mask adds' and outputs' rows padded by 8 (rows_mma_*_pitch).
	ct := (C + 15) / 16 * 16
	tiles := max(4*ct*(D+8)*2, G*16*(D+8)*4)
	mma := tiles + 2*G*16*(D+8)*2 + G*16*(ct+8)*4 + 16*4 + warps*16*4 + G*16*4
	return max(scalar, mma)
}

// decodeBoxOK says whether a decode attention box is a flat range of units
// (taskRange): whole rows, or in one row whole head groups, or chunks of one.
func decodeBoxOK(op *ir.Op, b tgraph.Box) bool {
	splits, ug := op.Out.Shape[1], op.HeadsPerUnit()
	if op.Attr.SharedKV { // rows of one head group and split (taskRange), a consumer warp each
		return b.Hi[1]-b.Lo[1] == 1 && b.Lo[2]%ug == 0 && b.Hi[2]-b.Lo[2] == ug && b.Hi[0]-b.Lo[0] <= Threads/32
	}
	return wholeDecodeRows(op, b) || b.Hi[0]-b.Lo[0] == 1 && b.Lo[2]%ug == 0 && b.Hi[2]%ug == 0 &&
		(b.Hi[2]-b.Lo[2] == ug || b.Lo[1] == 0 && b.Hi[1] == splits)
}

// wholeDecodeRows says whether a decode attention box covers every split
// and head of its batch rows.
func wholeDecodeRows(op *ir.Op, b tgraph.Box) bool {
	return b.Lo[1] == 0 && b.Hi[1] == op.Out.Shape[1] && b.Lo[2] == 0 && b.Hi[2] == op.Out.Shape[2]
}

// Options are the choices of the request that codegen makes.
type Options struct {
	Trace      bool // the kernel records per-task timestamps
	SplitGemmX bool // wgmma GEMM streams' x stored as bf16 hi and lo planes (splitX)
	TileXParts bool // a tile stream's large plain x staged in parts of K (stream.TileXParts)
	WideXParts bool // TileXParts for a normed x, a pair and any number of row groups too
	KVSwizzle  bool // a batch's kv_pages chunks land 128-byte swizzled (kvStream.Swizzle)
}

// Generate emits module.cu for the task graph.
func Generate(g *ir.Graph, tg *tgraph.Graph, opt Options) (*Module, error) {
	l, err := newLayout(g, tg)
	if err != nil {
		return nil, err
	}
	gen := &generator{g: g, l: l, variants: map[string]int{}, plans: map[*ir.Op]stream.Plan{}, xkeys: map[string]int{},
		kvs:     map[*ir.Op]kvStream{},
		written: stream.Writers(g), tileXParts: opt.TileXParts, wideXParts: opt.WideXParts,
		kvSwizzle: opt.KVSwizzle}
	split := make([]int, len(g.Ops))
	seen := make([]bool, len(g.Ops))
	rows := make([]int64, len(g.Ops)) // the most weight rows one task of a Linear reads
	for _, t := range tg.Tasks {
		if t.Op < 0 {
			continue
		}
		op := g.Ops[t.Op]
		d := splitDim(op, t.Box)
		if !seen[t.Op] {
			seen[t.Op] = true
			split[t.Op] = d
		}
		if op.DecodeUnits() {
			if !decodeBoxOK(op, t.Box) {
				return nil, fmt.Errorf("codegen: decode attention op %d has a task %v-%v that is not whole rows, whole head groups of one row or chunks of one group",
					t.Op, t.Box.Lo, t.Box.Hi)
			}
		} else if d != split[t.Op] && len(op.IterShape()) > 0 {
			return nil, fmt.Errorf("codegen: op %d is tiled along two dims (%d and %d)", t.Op, d, split[t.Op])
		}
		if op.Kind == ir.Linear {
			rows[t.Op] = max(rows[t.Op], t.Box.Hi[1]-t.Box.Lo[1])
		}
	}
	gen.planStreams(rows, l.arenaSlot+1)
	if opt.SplitGemmX {
		gen.split = gen.splitX()
	}
	var ops strings.Builder
	for _, op := range g.Ops {
		desc, err := gen.op(op, split[op.ID])
		if err != nil {
			return nil, err
		}
		ops.WriteString(desc)
	}
	if err := gen.sizeRing(l.arenaSlot + 1); err != nil {
		return nil, err
	}
	gen.kvLive = gen.kvLiveExtent()
	var src strings.Builder
	src.WriteString("// Generated by the mpk Go core. Do not edit: it is rebuilt from the model on every compile.\n")
	if opt.Trace {
		src.WriteString("#define MPK_TRACE 1\n")
	}
	src.WriteString("#include \"runtime/runtime.cuh\"\n#include \"tasks/tasks.cuh\"\n\nnamespace mpk_gen {\n\n")
	fmt.Fprintf(&src, "constexpr int kNumSlots = %d;\nconstexpr int kNumInputs = %d;\nconstexpr int kNumOutputs = %d;\n", l.arenaSlot+1, len(g.Inputs), len(g.Outputs))
	fmt.Fprintf(&src, "constexpr int kNumWorkers = %d;\nconstexpr int kNumTasks = %d;\nconstexpr int kNumEvents = %d;\n", tg.Workers, len(tg.Tasks), len(tg.Events))
	fmt.Fprintf(&src, "constexpr unsigned long long kArenaBytes = %dull;\nconstexpr int kSharedBytes = %d;\n", l.arenaBytes, gen.smem)
	src.WriteString(gen.ringPagesDecl())
	src.WriteString("constexpr int kRingSlots = kRingPages > 0 ? kRingPages : 1;  // the ring's type needs a slot\n")
	fmt.Fprintf(&src, "constexpr bool kKVLive = %v;  // kv_pages chunks may stop at the mask's extent (kvLiveExtent)\n", gen.kvLive)
	wgmma := false
	for _, p := range gen.plans {
		wgmma = wgmma || p.Wgmma
	}
	fmt.Fprintf(&src, "constexpr bool kWgmmaStreams = %v;  // a wgmma stream's pages are swizzled tensor-map boxes\n", wgmma)
	kvSwizzle := false
	for _, ks := range gen.kvs {
		kvSwizzle = kvSwizzle || ks.Swizzle
	}
	fmt.Fprintf(&src, "constexpr bool kKVSwizzle = %v;  // a kv chunk's pages may be swizzled tensor-map boxes (kvStream.Swizzle)\n\n", kvSwizzle)
	src.WriteString(gen.exprs.String())
	src.WriteString("// One device function per distinct task variant; each returns the consumers' new place in the weight ring.\n")
	src.WriteString(gen.funcs.String())
	src.WriteString("__device__ __forceinline__ uint32_t run_task(const mpk::Op& op, int lo, int hi, const mpk::Slots<kNumSlots>& s, const mpk::Ctx c) {\n  switch (op.variant) {\n")
	for i := 0; i < len(gen.variants); i++ {
		fmt.Fprintf(&src, "    case %d: return variant%d(op, lo, hi, s, c);\n", i, i)
	}
	src.WriteString("  }\n  return c.seq;\n}\n\n")
	fmt.Fprintf(&src, "__device__ const mpk::Op ops[%d] = {\n%s};\n\n", max(1, len(g.Ops)), ops.String())
	writeTables(&src, g, tg, split)
	gen.writeStreams(&src, tg, split)
	if gen.err != nil {
		return nil, gen.err
	}
	src.WriteString("}  // namespace mpk_gen\n\n#include \"runtime/module.cuh\"\n")
	return &Module{Files: map[string]string{"module.cu": src.String()}, BulkInputs: gen.bulkInputs()}, nil
}

// ringPagesDecl declares kRingPages, the ring sizeRing gave the module.
// MPK_RING_PAGES_CAP (an A/B knob of the ring's size) makes it smaller,
// down to what a task holds at once: a GEMM block's pages (minRingPages)
// and each kv stream's pages of K and V (the loader streams them because
// they fit this ring, and the task waits for all of them).
func (gen *generator) ringPagesDecl() string {
	decl := fmt.Sprintf("constexpr int kSizedRingPages = %d;  // sizeRing's\n", gen.ringPages)
	if gen.ringPages == 0 {
		return decl + "constexpr int kRingPages = 0;\n"
	}
	need := int64(minRingPages)
	for _, ks := range gen.kvs {
		if ks.fits(gen.ringPages) {
			need = max(need, ks.pagesAtOnce())
		}
	}
	return decl + fmt.Sprintf("#ifndef MPK_RING_PAGES_CAP\n#define MPK_RING_PAGES_CAP kSizedRingPages\n#endif\n"+
		"static_assert(MPK_RING_PAGES_CAP >= %d, \"MPK_RING_PAGES_CAP leaves the ring fewer pages than a task holds at once\");\n"+
		"constexpr int kRingPages = kSizedRingPages < MPK_RING_PAGES_CAP ? kSizedRingPages : MPK_RING_PAGES_CAP;\n", need)
}

// planStreams decides which Linears stream their weights through the ring
// and reserves their scratch (x and the chunk partials). rows[op] is the
// most weight rows one of its tasks reads.
func (gen *generator) planStreams(rows []int64, slots int) {
	// A tile stream's x and partials may take what a ring of minRingPages
	// leaves (sizeRing's sum).
	tileScratchBudget := dynamicSharedBudget - minRingPages*stream.PageBytes - ringBarsBytes - 8*slots
	for _, op := range gen.g.Ops {
		p, ok := stream.For(op, gen.written)
		if !ok || !linearOnGPU(op) {
			continue
		}
		scratch := int(p.XBytes() + p.PartialFloats(rows[op.ID])*4)
		if (p.Tiles || p.Gemm) && scratch > tileScratchBudget {
			continue // its x and partials would leave too small a ring: the plain Linear
		}
		if gen.tileXParts && p.Tiles && (op.Attr.Pro == nil || gen.wideXParts && stream.DeferredNorm(op)) {
			p.XParts = stream.TileXParts(p, rows[op.ID], gen.wideXParts)
			scratch = int(p.XBytes() + p.PartialFloats(rows[op.ID])*4)
		}
		gen.plans[op] = p
		gen.smem = max(gen.smem, scratch)
	}
}

// sizeRing gives the ring the shared memory the task scratch and the
// workers' copy of the slot pointers (8 bytes each, static shared memory)
// leave, at most maxRingPages; called once every op's scratch is known.
func (gen *generator) sizeRing(slots int) error {
	if len(gen.plans) == 0 && len(gen.kvs) == 0 {
		return nil
	}
	gen.ringPages = min(maxRingPages, (dynamicSharedBudget-8*slots-ringBarsBytes-gen.smem)/stream.PageBytes)
	if gen.ringPages < minRingPages {
		return fmt.Errorf("codegen: the tasks' %d bytes of shared memory leave room for %d weight pages, fewer than %d",
			gen.smem, gen.ringPages, minRingPages)
	}
	return nil
}

// linearOnGPU reports whether the CUDA task library has a Linear for op's dtypes.
func linearOnGPU(op *ir.Op) bool {
	_, wok := cType[op.In[1].DType()]
	_, xok := cType[op.LinearX()]
	return wok && xok
}

// streamEntry is a row of the loader's table (mpk::Stream, streamFields'
// order).
type streamEntry struct {
	slot, pageBytes             int64
	offset, bytes               int64
	tileRows, rowSpan, rowBytes int64
	blockBytes                  int64
	pairSlot, pairOffset        int64
	kvJ0, kvInterleave          int64
	tmap, pairTmap, tmapRow     int64
	xParts                      int64
}

// noStream is the entry of a task that streams nothing.
var noStream = streamEntry{pairSlot: -1, kvJ0: -1, tmap: -1, pairTmap: -1, xParts: 1}

func (e streamEntry) String() string {
	return fmt.Sprintf("  {%d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d},\n", e.slot, e.pageBytes, e.offset, e.bytes,
		e.tileRows, e.rowSpan, e.rowBytes, e.blockBytes, e.pairSlot, e.pairOffset, e.kvJ0, e.kvInterleave, e.tmap, e.pairTmap,
		e.tmapRow, e.xParts)
}

// writeStreams emits the loader's table: for every task, the weight bytes
// it streams, or a kv_pages attention's K and V rows (none for tasks of
// other ops), then the tensor maps its tile pages are boxes of.
func (gen *generator) writeStreams(src *strings.Builder, tg *tgraph.Graph, split []int) {
	var rows strings.Builder
	for _, t := range tg.Tasks {
		rows.WriteString(gen.streamOf(t, split).String())
	}
	gen.writeTmaps(src)
	fmt.Fprintf(src, "__device__ const mpk::Stream streams[%d] = {\n%s", max(1, len(tg.Tasks)), rows.String())
	if len(tg.Tasks) == 0 {
		src.WriteString(noStream.String())
	}
	src.WriteString("};\n\n")
}

// streamOf is task t's entry in the loader's table.
func (gen *generator) streamOf(t *tgraph.Task, split []int) streamEntry {
	if t.Op < 0 {
		return noStream
	}
	op := gen.g.Ops[t.Op]
	if ks, ok := gen.kvs[op]; ok {
		return gen.kvStreamOf(op, ks, t, split[t.Op])
	}
	p, ok := gen.plans[op]
	if !ok {
		return noStream
	}
	w := op.In[1]
	e := noStream
	e.slot = int64(gen.l.slot[w.Buf])
	if p.Tiles || p.Gemm {
		// A page: segments of Cols of TileRows rows (GemmPageRows, a
		// block of columns' pages before the next block's); the task's
		// rows RowStride apart, K of each read.
		e.tileRows = stream.TileRows
		if p.Gemm {
			e.tileRows, e.blockBytes = stream.GemmPageRows, p.BlockBytes()
		}
		if p.Wgmma {
			e.tileRows = stream.WgmmaPageRows
		}
		rowsAt := func(w ir.View) int64 { return (gen.l.offset[w.Buf] + w.Offset + t.Box.Lo[1]*p.RowStride) * p.ElemBytes }
		e.pageBytes, e.offset = p.Cols*p.ElemBytes, rowsAt(w)
		e.bytes = (t.Box.Hi[1] - t.Box.Lo[1]) * p.RowStride * p.ElemBytes
		e.rowSpan, e.rowBytes = p.K*p.ElemBytes, p.RowStride*p.ElemBytes
		e.xParts = max(1, p.XParts)
		spec, tmOK := gen.tmapOf(p, w, e.tileRows)
		if tmOK {
			e.tmap, e.tmapRow = int64(gen.tmap(spec)), t.Box.Lo[1]
		}
		if w2, ok := op.PairWeight(); ok { // a paired GEMM stream: each block's second-weight pages after the first's
			e.pairSlot, e.pairOffset = int64(gen.l.slot[w2.Buf]), rowsAt(w2)
			if spec2, ok2 := gen.tmapOf(p, w2, e.tileRows); ok2 && tmOK {
				e.pairTmap = int64(gen.tmap(spec2))
			} else {
				e.tmap = -1 // both weights' pages alike
			}
		}
		if p.Wgmma && e.tmap < 0 { // stream.For took only what a map describes: a bug if not
			gen.err = fmt.Errorf("codegen: op %d (%s): a wgmma stream's weights have no tensor map (its pages are swizzled boxes)",
				op.ID, op.Label)
		}
		return e
	}
	rowsAt := func(w ir.View) int64 { return (gen.l.offset[w.Buf] + w.Offset + t.Box.Lo[1]*p.K) * p.ElemBytes }
	e.pageBytes, e.offset = p.PageBytes, rowsAt(w)
	e.bytes = (t.Box.Hi[1] - t.Box.Lo[1]) * p.K * p.ElemBytes
	if w2, ok := op.PairWeight(); ok {
		e.pairSlot, e.pairOffset = int64(gen.l.slot[w2.Buf]), rowsAt(w2)
	}
	return e
}

func writeTables(src *strings.Builder, g *ir.Graph, tg *tgraph.Graph, split []int) {
	wait, trigger := tgraph.RuntimeEvents(tg)
	fmt.Fprintf(src, "__device__ const mpk::Task tasks[%d] = {\n", max(1, len(tg.Tasks)))
	for _, t := range tg.Tasks {
		lo, hi := int64(0), int64(1)
		if t.Op >= 0 && len(t.Box.Lo) > 0 {
			lo, hi = taskRange(g.Ops[t.Op], t.Box, split[t.Op])
		}
		fmt.Fprintf(src, "  {%d, %d, %d, %d, %d},\n", t.Op, lo, hi, wait[t.ID], trigger[t.ID])
	}
	src.WriteString("};\n\n")
	fmt.Fprintf(src, "__device__ const int32_t queue_start[%d] = {", len(tg.Queues)+1)
	n := 0
	for _, q := range tg.Queues {
		fmt.Fprintf(src, "%d, ", n)
		n += len(q)
	}
	fmt.Fprintf(src, "%d};\n", n)
	fmt.Fprintf(src, "__device__ const int32_t queue[%d] = {", max(1, n))
	for _, q := range tg.Queues {
		for _, t := range q {
			fmt.Fprintf(src, "%d,", t)
		}
		src.WriteString("\n")
	}
	src.WriteString("};\n")
	fmt.Fprintf(src, "__device__ const uint32_t event_needed[%d] = {", max(1, len(tg.Events)))
	for _, e := range tg.Events {
		fmt.Fprintf(src, "%d,", e.Needed)
	}
	src.WriteString("};\n\n")
}

type generator struct {
	g          *ir.Graph
	l          layout
	variants   map[string]int
	funcs      strings.Builder
	exprs      strings.Builder
	nexpr      int
	exprIDs    map[string]int
	smem       int
	plans      map[*ir.Op]stream.Plan // the Linears that stream
	written    func(*ir.Buffer) bool  // whether an op of the graph writes a buffer
	ringPages  int
	xkeys      map[string]int      // a streamed Linear's x (its prologue and inputs) → key
	kvs        map[*ir.Op]kvStream // the attentions whose K and V stream (kvStreamOf)
	kvLive     bool                // every kv stream is cut to the live length of one mask extent (kvLiveExtent)
	tmaps      []tmapSpec          // the tensor maps of tile and GEMM streams' weights (tmapOf)
	tmapIDs    map[tmapSpec]int
	split      map[*ir.Buffer]bool // the temporaries stored as bf16 hi and lo planes (splitX)
	tileXParts bool                // Options.TileXParts
	wideXParts bool                // Options.WideXParts
	kvSwizzle  bool                // Options.KVSwizzle
	err        error               // the first error of a table writer
}

// variant returns the id of the device function whose body is code.
func (gen *generator) variant(code string) int {
	if id, ok := gen.variants[code]; ok {
		return id
	}
	id := len(gen.variants)
	gen.variants[code] = id
	// A wgmma task is inlined into the megakernel: ptxas serialises every
	// wgmma of a kernel when one sits in a function it calls (C7510).
	inline := "__noinline__"
	if strings.Contains(code, "mpk::linear_wgmma<") {
		inline = "__forceinline__"
	}
	fmt.Fprintf(&gen.funcs, "__device__ %s uint32_t variant%d(const mpk::Op& op, int lo, int hi, const mpk::Slots<kNumSlots>& s, const mpk::Ctx c) {\n  %s\n}\n\n", inline, id, code)
	return id
}

// xkey returns the key of a streamed Linear's x: Linears with one key (q, k
// and v after one RMSNorm) compute the same x, so a task may reuse the x the
// task before it staged.
func (gen *generator) xkey(op *ir.Op) int {
	// the staged layout, then what x is (an expression prologue also by how it evaluates)
	k := fmt.Sprintf("%d|%v|%v|%s", gen.plans[op].M, gen.plans[op].Tiles, gen.plans[op].XLow, op.XKey())
	if p := op.Attr.Pro; p != nil && p.Expr != nil {
		k += fmt.Sprintf("f64=%v|", touchesF64(op))
	}
	if id, ok := gen.xkeys[k]; ok {
		return id
	}
	gen.xkeys[k] = len(gen.xkeys)
	return gen.xkeys[k]
}

func (gen *generator) view(v ir.View) string { return gen.viewTmap(v, -1) }

// viewTmap is view with the index of its tensor map in kTmaps (-1: none).
func (gen *generator) viewTmap(v ir.View, tmap int) string {
	if v.Rank() > MaxRank {
		panic(fmt.Sprintf("codegen: a %d-d view exceeds MPK_MAX_RANK=%d", v.Rank(), MaxRank))
	}
	shape := make([]int64, MaxRank)
	stride := make([]int64, MaxRank)
	copy(shape, v.Shape)
	copy(stride, v.Strides)
	off := v.Offset + gen.l.offset[v.Buf]
	dt := int(v.DType())
	if gen.split[v.Buf] {
		dt = dtSplit
	}
	return fmt.Sprintf("{%d, %d, %d, %d, %d, %s, %s}", gen.l.slot[v.Buf], dt, v.Rank(), tmap+1, off, ints(shape), ints(stride))
}

// floatLit formats v as a C float literal body (always with an exponent).
func floatLit(v float64) string { return strconv.FormatFloat(v, 'e', -1, 32) }

func ints(xs []int64) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = fmt.Sprint(x)
	}
	return "{" + strings.Join(s, ", ") + "}"
}

var cType = map[ir.DType]string{ir.F32: "float", ir.BF16: "__nv_bfloat16", ir.F16: "__half"}

// op returns the initialiser of op's descriptor, registering its variant.
func (gen *generator) op(op *ir.Op, split int) (string, error) {
	if len(op.In) > MaxInputs {
		return "", fmt.Errorf("codegen: op %d (%s) has %d inputs, more than MPK_MAX_INPUTS=%d", op.ID, op.Label, len(op.In), MaxInputs)
	}
	var code string // a call of the task library, or (ret) a return of one
	ret := false
	flags, proFirst, proDType, epiFirst, epiDType, eps, xkey := 0, 0, 0, 0, 0, op.Attr.Eps, -1
	switch op.Kind {
	case ir.Linear:
		w := op.In[1]
		// x is staged in shared memory as fp32 whatever its dtype; T is the weights'.
		if !linearOnGPU(op) {
			return "", fmt.Errorf("codegen: linear op %d on %s × %s is not supported on the GPU", op.ID, op.LinearX(), w.DType())
		}
		T := cType[w.DType()]
		K := op.LinearK()
		if op.Attr.Residual {
			flags |= flagResidual
		}
		pro := "mpk::NoPro"
		if p := op.Attr.Pro; p != nil {
			proFirst, proDType, eps = p.First, int(p.DType), p.Eps
			switch p.Kind {
			case ir.RMSNorm:
				pro = "mpk::NormPro"
				if p.HasWeight {
					flags |= flagWeight
				}
			case ir.Elementwise:
				pro = fmt.Sprintf("mpk::ExprPro<Expr%d>", gen.expr(p.Expr, touchesF64(op)))
			case ir.AttnMerge: // partials [M, Splits, H, 1, D+2], contiguous
				pv := op.In[0]
				D, H := pv.Shape[4]-2, pv.Shape[2]
				if D > 256 || !pv.IsContiguous() {
					return "", fmt.Errorf("codegen: attention merge of %v partials (head dim up to 256, contiguous) is not supported on the GPU", pv.Shape)
				}
				pro = fmt.Sprintf("mpk::MergePro<%d, %d, %d, %d, %d>", D, H, p.Chunk, max(1, p.Interleave), pv.Shape[1])
			}
		}
		epi := "mpk::NoEpi"
		if e := op.Attr.Epi; e != nil {
			epiFirst, epiDType = e.First, int(e.DType)
			epi = fmt.Sprintf("mpk::ExprEpi<Expr%d>", gen.expr(e.Expr, touchesF64(op)))
			if e.Pair > 0 { // Load(Pair) is the second weight's product (ir.Epilogue.Pair)
				epi = fmt.Sprintf("mpk::PairEpi<Expr%d, %d, %d>", gen.expr(e.Expr, touchesF64(op)), e.Pair, int(e.PairDType))
			}
		}
		if p, ok := gen.plans[op]; ok && p.Wgmma { // as a GEMM stream's, x is never reused
			code = fmt.Sprintf("mpk::linear_wgmma<%s, %d, %d, %v, kRingSlots, %v, %s, %v>(op, lo, hi, s, c)",
				T, K, p.M, p.XLow, op.Attr.Residual, epi, gen.split[op.In[0].Buf])
			ret = true
		} else if p, ok := gen.plans[op]; ok && p.Gemm { // x staged a block at a time: never reused (no xkey)
			code = fmt.Sprintf("mpk::linear_gemm<%s, %d, %d, %v, kRingSlots, %v, %s, kSharedBytes>(op, lo, hi, s, c)",
				T, K, p.M, p.XLow, op.Attr.Residual, epi)
			ret = true
		} else if p, ok := gen.plans[op]; ok && p.Tiles {
			code = fmt.Sprintf("mpk::linear_tiles<%s, %d, %d, %v, kRingSlots, %v, %s, %s, %d>(op, lo, hi, s, c)",
				T, K, p.M, p.XLow, op.Attr.Residual, pro, epi, max(1, p.XParts))
			ret = true
			if p.XParts <= 1 { // x in parts ends staged at its last part: never reused
				xkey = gen.xkey(op)
			}
		} else if ok {
			code = fmt.Sprintf("mpk::linear_stream<%s, %d, %d, %d, kRingSlots, %v, %s, %s>(op, lo, hi, s, c)",
				T, K, p.M, p.PageBytes, op.Attr.Residual, pro, epi)
			ret, xkey = true, gen.xkey(op)
		} else {
			// A weight the graph writes is read coherently (never through the read-only path).
			code = fmt.Sprintf("mpk::linear<%s, %d, %v, %s, %s, %v>(op, lo, hi, s, c.smem)", T, K, op.Attr.Residual, pro,
				epi, !gen.written(w.Buf))
			gen.smem = max(gen.smem, int(K)*4)
		}
	case ir.Attention:
		// q is read through its view's dtype; K and V (the cache) share T.
		T, ok := cType[op.In[1].DType()]
		if _, qok := cType[op.In[0].DType()]; !ok || !qok || op.In[2].DType() != op.In[1].DType() {
			return "", fmt.Errorf("codegen: attention op %d on q %s, k %s, v %s is not supported on the GPU",
				op.ID, op.In[0].DType(), op.In[1].DType(), op.In[2].DType())
		}
		D, Dv := op.In[0].Shape[3], op.In[2].Shape[3]
		if Dv != D || D > 256 {
			return "", fmt.Errorf("codegen: attention head dim %d (value %d) is not supported on the GPU (want equal dims up to 256)", D, Dv)
		}
		if op.Attr.HasMask {
			flags |= flagMask
		}
		if op.Attr.Causal {
			flags |= flagCausal
		}
		if op.Attr.HasExtent {
			flags |= flagExtent
		}
		G := op.Attr.Groups
		if G < 1 || G > 16 {
			return "", fmt.Errorf("codegen: attention with %d query heads per KV head is not supported on the GPU (up to 16)", G)
		}
		code = fmt.Sprintf("mpk::attention<%s, %s, %s, %d, %d>(op, lo, hi, s, c.smem)", T, cType[op.In[0].DType()], maskType(op), D, G)
		if op.Attr.Splits > 1 {
			// ROWS: a decode batch's rows share the task's rounds.
			// DecodeShape: the unit arithmetic's operands as constants.
			// FR: the queries' RoPE and the step's new K and V rows folded in.
			ft := "void"
			if fresh := op.Attr.Fresh; fresh != nil {
				if err := freshOnGPU(op); err != nil {
					return "", err
				}
				// The fresh inputs start at pro_first; the dtypes and whether
				// q and k are normalised are FreshTypes' constants.
				proFirst = fresh.First
				wT := "float"
				if fresh.Norm {
					eps = fresh.Eps
					wT = cType[op.In[fresh.First+5].DType()]
				}
				ft = fmt.Sprintf("mpk::FreshTypes<%s, %s, %s, %s, %d, %v, %d>", cType[op.In[fresh.First].DType()],
					cType[op.In[fresh.First+2].DType()], cType[op.In[fresh.First+3].DType()], wT, fresh.QDType, fresh.Norm,
					fresh.NormDType)
			}
			// (a kv_pages task is one batch row's unit: ROWS false)
			ks, streamed := kvStreamOf(op)
			ks.Swizzle = gen.kvSwizzle && ks.swizzles(op)
			batch := op.In[0].Shape[0] > 1
			args := fmt.Sprintf("%s, %s, %s, %d, %d, %d, %v, %d, mpk::DecodeShape<%d, %d, %d, %d>, %s", T, cType[op.In[0].DType()],
				maskType(op), D, G, max(1, op.Attr.Interleave), batch && !streamed, op.HeadsPerUnit(), op.In[0].Shape[1],
				op.Out.Shape[1], op.In[1].Shape[2], G, ft)
			code = fmt.Sprintf("mpk::attention_partial<%s>(op, lo, hi, s, c.smem)", args)
			if streamed {
				// kv_pages: the task's K and V chunk comes through the ring.
				gen.kvs[op] = ks
				code, ret = fmt.Sprintf("mpk::attention_kv_pages<%s, kRingSlots, kKVLive, %v, %v, %v>(op, lo, hi, s, c)", args,
					batch, ks.mma(), ks.Swizzle), true
				if ks.mma() {
					gen.smem = max(gen.smem, ks.mmaBytes())
				}
			}
		}
		// Per-warp softmax states (decode: each warp's queries and states, and
		// each batch row's live splits; fresh rows: then each warp's new V
		// row, after the rows' counts rounded up to 4).
		ug, rows, vrows := int(op.HeadsPerUnit()), int(op.In[0].Shape[0]), 0
		if _, ok := gen.kvs[op]; ok { // attention_kv_pages runs its unit's heads as units of one
			ug = 1
		}
		if op.Attr.Fresh != nil {
			rows, vrows = (rows+3)/4*4, (Threads/32)*int(D)*4
		}
		decodeBytes := (Threads/32)*ug*(2*int(D)+2)*4 + 4*rows + vrows
		gen.smem = max(gen.smem, (Threads/32)*int(G)*(int(D)+2)*4, decodeBytes)
		if op.Attr.SharedKV {
			k, v := op.In[1], op.In[2]
			C := min(ir.SplitChunk(k.Shape[2], op.Attr.Splits), ir.SharedKVTile)
			if k.DType() != ir.BF16 && k.DType() != ir.F16 || D%8 != 0 || k.Strides[3] != 1 ||
				v.Strides[3] != 1 || k.Strides[0] != 0 || v.Strides[0] != 0 {
				return "", fmt.Errorf("codegen: attention op %d with shared K and V wants 2-byte K and V rows (head dim a multiple of 8) broadcast over the rows", op.ID)
			}
			code = fmt.Sprintf("static_assert(mpk::attention_rows_bytes(%d, %d, %d) <= kSharedBytes, \"codegen reserved too "+
				"little shared memory for attention_rows\");\n  mpk::attention_rows<%s, %s, %s, %d, %d, %d>(op, lo, hi, s, c.smem)",
				C, D, G, T, cType[op.In[0].DType()], maskType(op), D, G, C)
			gen.smem = max(gen.smem, sharedKVBytes(int(C), int(D), int(G)))
		}
	case ir.MaskExtent:
		code = fmt.Sprintf("mpk::mask_extent<%s>(op, lo, hi, s, c.smem)", maskCType(op.In[0].DType()))
		gen.smem = max(gen.smem, 4*(1+Threads/32)) // the extent and a warp's largest add
	case ir.AttnMerge:
		D, pv := op.Out.Shape[op.Out.Rank()-1], op.In[0]
		if D > 256 {
			return "", fmt.Errorf("codegen: attention head dim %d is not supported on the GPU (up to 256)", D)
		}
		switch {
		case pv.Shape[3] == 1 && pv.IsContiguous(): // decode: a warp per (row, head)
			chunk := int64(0)
			if op.Attr.HasExtent {
				chunk = op.Attr.Chunk
			}
			code = fmt.Sprintf("mpk::attn_merge_decode<%d, %d, %d, %d, %d>(op, lo, hi, s)", D, pv.Shape[2], chunk, max(1, op.Attr.Interleave),
				pv.Shape[1])
		case op.Attr.HasExtent:
			return "", fmt.Errorf("codegen: attention merge of %v partials bounded by a mask extent (want one query, contiguous) is not supported on the GPU", pv.Shape)
		default:
			code = fmt.Sprintf("mpk::attn_merge<%d>(op, lo, hi, s, c.smem)", D)
			gen.smem = max(gen.smem, (Threads/32)*int(D+2)*4)
		}
	case ir.RMSNorm:
		if op.Attr.HasWeight {
			flags |= flagWeight
		}
		code = "mpk::rmsnorm(op, lo, hi, s, c.smem)"
	case ir.RoPE:
		if p := op.Attr.Pro; p != nil { // an RMSNorm of each row first
			proFirst, proDType, eps = p.First, int(p.DType), p.Eps
			if p.HasWeight {
				flags |= flagWeight
			}
		}
		if op.Attr.IndexIn > 0 { // rows land in the cache at run-time positions (last input)
			flags |= flagCache
		}
		code = "mpk::rope(op, lo, hi, s, c.smem)"
	case ir.Elementwise:
		code = fmt.Sprintf("mpk::elementwise<Expr%d>(op, lo, hi, s)", gen.expr(op.Attr.Expr, touchesF64(op)))
	default:
		code = fmt.Sprintf("mpk::%s(op, lo, hi, s, c.smem)", op.Kind.String())
	}
	gen.smem = max(gen.smem, 1024)
	if gen.smem > MaxSharedBytes {
		return "", fmt.Errorf("codegen: op %d (%s) needs %d bytes of shared memory, more than %d", op.ID, op.Label, gen.smem, MaxSharedBytes)
	}
	if ret {
		code = "return " + code + ";"
		if p, ok := gen.plans[op]; ok && p.Wgmma { // the scratch stream.WgmmaScratch reserved is what the task takes
			code = fmt.Sprintf("static_assert(mpk::wgmma_scratch_bytes() <= kSharedBytes, \"codegen reserved too "+
				"little shared memory for a wgmma stream\");\n  %s", code)
		} else if p, ok := gen.plans[op]; ok && p.Tiles && p.XParts > 1 {
			// Past this bound on its row groups, a task adds its sums in shared memory part by part.
			code = fmt.Sprintf("static_assert(mpk::kTilePartGroups == %d, \"stream.MaxTilePartGroups and "+
				"mpk::kTilePartGroups disagree\");\n  %s", stream.MaxTilePartGroups, code)
		} else if p, ok := gen.plans[op]; ok && p.Gemm { // the scratch stream.GemmScratch reserved is what the task takes
			code = fmt.Sprintf("static_assert(mpk::gemm_scratch_bytes(%d, %v) <= kSharedBytes, \"codegen reserved too "+
				"little shared memory for a GEMM stream\");\n  %s", p.M, p.XLow, code)
		} else if ks, ok := gen.kvs[op]; ok && ks.Stream {
			// The loader streams a task's pages iff a round's fit the ring
			// (kvStream.fits), the task takes them iff mpk::kv_round_pairs
			// says so: both sides must count alike, or the ring stalls.
			// (The tensor-core rounds' shared memory, kvStream.mmaBytes, reserved as CUDA counts it.)
			code = fmt.Sprintf("static_assert(mpk::kv_round_pairs(32 * mpk::decode_unit_warps(%d, %d), %d) == %d, "+
				"\"codegen's kvStream.roundPairs and mpk::kv_round_pairs disagree\");\n  "+
				"static_assert(!%v || mpk::kv_mma_bytes(%d, %d) <= kSharedBytes, \"codegen reserved too little shared "+
				"memory for kv_batch_mma\");\n  %s", ks.Chunk, ks.UG, ks.RowsPerPage, ks.roundPairs(), ks.mma(), ks.D, ks.UG, code)
		}
	} else {
		code += ";\n  return c.seq;"
	}
	id := gen.variant(code)
	var ins []string
	for i, v := range op.In {
		if i == 0 && op.Kind == ir.Linear && gen.split[v.Buf] { // a GEMM stream's split x: staged by its tensor map
			ins = append(ins, gen.viewTmap(v, gen.tmap(gen.splitXMap(v))))
			continue
		}
		ins = append(ins, gen.view(v))
	}
	return fmt.Sprintf("  /* %d %s %s */ {%d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %sf, %sf, %s, {%s}},\n",
		op.ID, op.Label, op.Node, kindCode(op.Kind), id, len(op.In), split, op.Attr.Dim, max(op.Attr.Groups, 1), flags,
		reduceCode(op.Attr.Reduce), proFirst, proDType, epiFirst, epiDType, xkey, floatLit(eps), floatLit(op.Attr.Scale), gen.view(op.Out), strings.Join(ins, ", ")), nil
}

// freshOnGPU checks a fresh-row attention (ir.FreshRows) against what
// attention_decode's FR path takes: its decode path (not a prompt chunk's
// shared K and V), and a head dim whose rotated pairs sit in one lane.
func freshOnGPU(op *ir.Op) error {
	D := op.In[0].Shape[3]
	if !op.DecodeUnits() || op.Attr.SharedKV || D%64 != 0 || D > 256 {
		return fmt.Errorf("codegen: attention op %d with its RoPE folded in wants decode of head dim a multiple of 64 up to 256 (got %d)", op.ID, D)
	}
	return nil
}

// maskType is the C type attention reads its mask as (a template argument,
// so the mask loads of a batch issue together): void without a mask,
// mpk::AnyMask for a dtype other than bool or a float kind.
func maskType(op *ir.Op) string {
	if !op.Attr.HasMask {
		return "void"
	}
	return maskCType(op.In[3].DType())
}

// maskCType is the C++ type a mask of dtype dt is read as (mpk::mask_add).
func maskCType(dt ir.DType) string {
	if c, ok := cType[dt]; ok {
		return c
	}
	if dt == ir.Bool {
		return "bool"
	}
	return "mpk::AnyMask"
}

// touchesF64 reports whether op reads or writes a float64 view: only then do
// its transcendental functions run in double precision.
func touchesF64(op *ir.Op) bool {
	for _, v := range append([]ir.View{op.Out}, op.In...) {
		if v.DType() == ir.F64 {
			return true
		}
	}
	return false
}

// expr emits a functor for an elementwise expression and returns its id.
// Arithmetic runs in double (expressions may mix int64 positions with
// floats; the final cast rounds as eager does). Transcendental functions run
// in fp32, as eager computes them for fp32, bf16 and fp16 tensors, unless the
// op touches float64: the double versions are large routines, and code size
// is what a rarely run task waits on (instruction fetch from L2).
func (gen *generator) expr(e *ir.Expr, fp64 bool) int {
	body := exprC(e, fp64)
	if gen.exprIDs == nil {
		gen.exprIDs = map[string]int{}
	}
	if id, ok := gen.exprIDs[body]; ok {
		return id
	}
	id := gen.nexpr
	gen.nexpr++
	gen.exprIDs[body] = id
	fmt.Fprintf(&gen.exprs, "struct Expr%d {\n  static __device__ __forceinline__ double eval(const double* in, const int64_t* idx) {\n    return %s;\n  }\n};\n\n", id, body)
	return id
}

var binOps = map[ir.ExprOp]string{ir.EAdd: "+", ir.ESub: "-", ir.EMul: "*", ir.EDiv: "/"}
var cmpOps = map[ir.ExprOp]string{ir.ELt: "<", ir.ELe: "<=", ir.EGt: ">", ir.EGe: ">=", ir.EEq: "==", ir.ENe: "!="}

// funcs32 are the fp32 versions of the transcendental functions (see expr).
var funcs32 = map[ir.ExprOp]string{ir.EExp: "expf", ir.ELog: "logf", ir.ESqrt: "sqrtf", ir.ERsqrt: "rsqrtf",
	ir.ESin: "sinf", ir.ECos: "cosf", ir.ETanh: "tanhf", ir.EErf: "erff", ir.EPow: "mpk::powf_",
	ir.ESigmoid: "mpk::sigmoidf", ir.ESilu: "mpk::siluf", ir.EGelu: "mpk::geluf", ir.EGeluTanh: "mpk::gelu_tanhf"}

var funcs = map[ir.ExprOp]string{ir.EExp: "exp", ir.ELog: "log", ir.ESqrt: "sqrt", ir.ERsqrt: "rsqrt", ir.ESin: "sin",
	ir.ECos: "cos", ir.ETanh: "tanh", ir.EAbs: "fabs", ir.EErf: "erf", ir.EMax: "fmax", ir.EMin: "fmin", ir.EPow: "mpk::powd",
	ir.EFloor: "floor", ir.ETrunc: "trunc", ir.EAtan2: "atan2"}

func exprC(e *ir.Expr, fp64 bool) string {
	a := func(i int) string { return exprC(e.Args[i], fp64) }
	// args renders the arguments, each wrapped as wrap says ("%s" for none).
	args := func(wrap string) string {
		out := make([]string, len(e.Args))
		for i := range e.Args {
			out[i] = fmt.Sprintf(wrap, a(i))
		}
		return strings.Join(out, ", ")
	}
	if f, ok := funcs32[e.Op]; ok && !fp64 {
		return fmt.Sprintf("(double)%s(%s)", f, args("(float)(%s)"))
	}
	switch e.Op {
	case ir.ELoad:
		return fmt.Sprintf("in[%d]", e.Input)
	case ir.EIndex:
		return fmt.Sprintf("(double)idx[%d]", e.Dim)
	case ir.EConst:
		switch {
		case math.IsNaN(e.Const):
			return "(double)NAN"
		case math.IsInf(e.Const, 1):
			return "(double)INFINITY"
		case math.IsInf(e.Const, -1):
			return "(-(double)INFINITY)"
		}
		return fmt.Sprintf("%.17g", e.Const)
	case ir.ECast:
		return fmt.Sprintf("mpk::round_to(%d, %s)", int(e.DType), a(0))
	case ir.EWhere:
		return fmt.Sprintf("(%s != 0.0 ? %s : %s)", a(0), a(1), a(2))
	case ir.ENeg:
		return "(-" + a(0) + ")"
	case ir.ESigmoid:
		return fmt.Sprintf("(1.0 / (1.0 + exp(-(%s))))", a(0))
	case ir.ESilu:
		return fmt.Sprintf("mpk::silud(%s)", a(0))
	case ir.EGelu:
		return fmt.Sprintf("mpk::gelud(%s)", a(0))
	case ir.EGeluTanh:
		return fmt.Sprintf("mpk::gelu_tanhd(%s)", a(0))
	case ir.ERecip:
		return fmt.Sprintf("(1.0 / (%s))", a(0))
	case ir.ERelu:
		return fmt.Sprintf("fmax(%s, 0.0)", a(0))
	case ir.ENot:
		return fmt.Sprintf("(double)(%s == 0.0)", a(0))
	case ir.EIsNaN:
		return fmt.Sprintf("(double)isnan(%s)", a(0))
	case ir.EAnd:
		return fmt.Sprintf("(double)((long long)(%s) & (long long)(%s))", a(0), a(1))
	case ir.EOr:
		return fmt.Sprintf("(double)((long long)(%s) | (long long)(%s))", a(0), a(1))
	case ir.EXor:
		return fmt.Sprintf("(double)((long long)(%s) ^ (long long)(%s))", a(0), a(1))
	}
	if op, ok := binOps[e.Op]; ok {
		return fmt.Sprintf("(%s %s %s)", a(0), op, a(1))
	}
	if op, ok := cmpOps[e.Op]; ok {
		return fmt.Sprintf("(double)(%s %s %s)", a(0), op, a(1))
	}
	if f, ok := funcs[e.Op]; ok {
		return fmt.Sprintf("%s(%s)", f, args("%s"))
	}
	panic(fmt.Sprintf("codegen: no CUDA for expression op %s", e.Op))
}
