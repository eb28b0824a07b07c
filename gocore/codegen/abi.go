// Package codegen emits the CUDA module for a task graph: one source file
// holding the task-op variants (template instantiations from the task
// library in csrc/tasks), the op, task, queue and event tables, and the
// kernel entry from csrc/runtime.
package codegen

import (
	"fmt"
	"strings"

	"mpk/gocore/ir"
	"mpk/gocore/stream"
)

// Capacity limits of the device tables. They are defined here once and
// written into csrc/runtime/abi_gen.cuh by ABIHeader; a test fails when the
// committed header drifts from this definition.
const (
	MaxRank   = 6            // dims of a view
	MaxInputs = ir.MaxInputs // input views of one op
	// Threads is a worker's consumer threads; a loader and a signaller warp
	// run beside them (csrc/runtime/roles.cuh).
	Threads = stream.Threads
	// MaxSharedBytes bounds the task scratch in shared memory.
	MaxSharedBytes = 200 * 1024
	// dynamicSharedBudget bounds a worker's dynamic shared memory (the ring
	// and the scratch): the H100's 227 KiB less the kernel's static shared
	// variables.
	dynamicSharedBudget = 227*1024 - 4096
	// maxRingPages bounds the ring (stream.MaxRingPages).
	maxRingPages = stream.MaxRingPages
	// minRingPages is the smallest ring worth streaming through.
	minRingPages = 4
	// ringBarsBytes is the ring's barriers (two mbarriers a page, rounded up),
	// and the bytes mpk's megakernel may skip so its pages start 1,024-byte
	// aligned (a swizzled page's pattern: runtime/module.cuh kRingAlign).
	ringBarsBytes = 256 + 1024
)

// Task kinds the device dispatch knows, mirrored as an enum in the header.
var opKinds = []ir.Kind{ir.Elementwise, ir.Reduce, ir.RMSNorm, ir.RoPE, ir.Linear, ir.Matmul, ir.Attention,
	ir.Embedding, ir.Cat, ir.KVWrite, ir.Copy, ir.Gather, ir.AttnMerge, ir.Empty, ir.MaskExtent}

// field is one member of a table struct, in layout order.
type field struct{ ctype, name, doc string }

// The table structs. Go writes initialisers in exactly this member order.
var (
	viewFields = []field{
		{"int32_t", "slot", "pointer slot: input, output or the arena"},
		{"int32_t", "dtype", "DType code"},
		{"int32_t", "rank", ""},
		{"int32_t", "tmap", "a GEMM stream's split x (DT_SPLIT_BF16): 1 + its tensor map's index in kTmaps; 0: none"},
		{"int64_t", "offset", "in elements from the slot's base"},
		{"int64_t", "shape[MPK_MAX_RANK]", ""},
		{"int64_t", "stride[MPK_MAX_RANK]", "in elements"},
	}
	opFields = []field{
		{"int32_t", "kind", "OpKind"},
		{"int32_t", "variant", "index into the generated dispatch"},
		{"int32_t", "num_in", ""},
		{"int32_t", "split_dim", "the output dim tasks split; tasks carry [lo, hi)"},
		{"int32_t", "dim", "cat / gather / kv_write dim"},
		{"int32_t", "groups", "attention: query heads per KV head"},
		{"int32_t", "flags", "OpFlags"},
		{"int32_t", "reduce", "ReduceKind"},
		{"int32_t", "pro_first", "linear prologue: its inputs are in[0] and in[pro_first..epi_first or num_in)"},
		{"int32_t", "pro_dtype", "linear prologue: the dtype x rounds to"},
		{"int32_t", "epi_first", "linear epilogue: its inputs besides the product are in[epi_first..num_in)"},
		{"int32_t", "epi_dtype", "linear epilogue: the dtype the product rounds to before it"},
		{"int32_t", "xkey", "streamed linear: ops with one key stage the same x; -1 otherwise"},
		{"float", "eps", "rmsnorm, or a linear's rmsnorm prologue"},
		{"float", "scale", ""},
		{"mpk::View", "out", ""},
		{"mpk::View", "in[MPK_MAX_INPUTS]", ""},
	}
	streamFields = []field{
		{"int32_t", "slot", "the weight's pointer slot"},
		{"int32_t", "page_bytes", "a page: whole rows, or a fraction of a row; tile pages: one row's segment"},
		{"int64_t", "offset", "bytes from the slot's base to the task's first row"},
		{"int64_t", "bytes", "the task's weights; 0: the task streams nothing"},
		{"int32_t", "tile_rows", "0: pages of contiguous bytes; else tile pages of this many rows' segments"},
		{"int32_t", "row_span", "tile pages: bytes of each row the task reads (K of them), row_bytes apart"},
		{"int64_t", "row_bytes", "tile pages: bytes from one weight row to the next; kv_j0 >= 0 or a kv chunk's tmap: a K (or V) row's bytes"},
		{"int32_t", "block_bytes", "gemm pages: bytes of a row a column block holds (each block's row groups, block after block); 0: tile pages (each row group's blocks)"},
		{"int32_t", "pair_slot", "a paired linear's second weight: its pointer slot; -1: none"},
		{"int64_t", "pair_offset", "bytes from that slot's base to the task's first row (bytes of them, after the first weight's; gemm: a block's after its)"},
		{"int32_t", "kv_j0", "a kv_pages chunk cut to the live length (runtime.cuh s_kv_extent): its first position; -1: whole"},
		{"int32_t", "kv_interleave", "a kv_pages chunk whose task takes its pages round by round (mpk::KVPages STREAM): K and V pages alternate; 0: the K rows' pages, then the V rows'"},
		{"int32_t", "tmap", "tile pages (or a kv chunk's K pages, 128-byte swizzled: codegen's kvStream.Swizzle): the tensor map (kTmaps, State.tmaps) one copy of whose box fills a page; -1: row copies"},
		{"int32_t", "pair_tmap", "the same for the paired linear's second weight (a kv chunk's V)"},
		{"int32_t", "tmap_row", "the task's first row in its tensor maps"},
		{"int32_t", "x_parts", "tile pages: the parts of K the task stages x in (mpk::linear_tiles XP): its pages part by part, each part's row groups in order; 1: x whole"},
	}
	// tmapFields is a tensor map's description (host side: mpk_launch
	// encodes one per entry from the slot pointers).
	tmapFields = []field{
		{"int32_t", "slot", "the weight's pointer slot"},
		{"int32_t", "box_rows", "rows a box (a page) holds"},
		{"int64_t", "offset", "bytes from the slot's base to the matrix's first row"},
		{"int64_t", "cols", "8-byte units of a row"},
		{"int64_t", "rows", ""},
		{"int64_t", "row_bytes", "bytes from one row to the next (a multiple of 16)"},
		{"int32_t", "box_cols", "8-byte units of a row a box holds (at most 256)"},
		{"int32_t", "block_cols", "GEMM pages: 8-byte units of a column block (the box lands block after block); 0: row after row"},
		{"int32_t", "swizzle", "bytes a block's rows are swizzled over as wgmma reads them (128: a wgmma stream's pages); 0: none"},
		{"int32_t", "split_x", "1: a split GEMM x (cols: its rows' 64-element groups; a box both planes of one group), not weights"},
	}
	taskFields = []field{
		{"int32_t", "op", "-1 for an empty relay task"},
		{"int32_t", "lo", "tile along the op's split dim"},
		{"int32_t", "hi", ""},
		{"int32_t", "wait", "event, or -1"},
		{"int32_t", "trigger", "event, or -1"},
	}
)

// Flag bits of an op.
const (
	flagResidual = 1 << iota
	flagWeight
	flagMask
	flagCausal
	flagCache  // rope: rows land in the cache (out) at the positions in the last input, along dim
	flagExtent // decode attention: in[4] is the mask's extent per batch row
)

var reduceKinds = []string{"sum", "mean", "amax", "amin", "argmax"}

func reduceCode(s string) int {
	for i, k := range reduceKinds {
		if k == s {
			return i
		}
	}
	return -1
}

// ABIHeader returns csrc/runtime/abi_gen.cuh.
func ABIHeader() string {
	var b strings.Builder
	b.WriteString("// Generated from gocore/codegen/abi.go by TestABIHeaderUpToDate (UPDATE_GOLDEN=1). Do not edit.\n")
	b.WriteString("#pragma once\n#include <stdint.h>\n\n")
	fmt.Fprintf(&b, "#define MPK_MAX_RANK %d\n#define MPK_MAX_INPUTS %d\n#define MPK_MAX_EPI_INPUTS %d\n#define MPK_THREADS %d\n#define MPK_MAX_SHARED_BYTES %d\n#define MPK_MASK_HIDE_MARGIN %.1ff\n\n",
		MaxRank, MaxInputs, ir.MaxEpilogueInputs, Threads, MaxSharedBytes, ir.MaskHideMargin)
	b.WriteString("namespace mpk {\n\n")
	b.WriteString("enum DType : int32_t {")
	for i := ir.F32; i <= ir.Bool; i++ {
		fmt.Fprintf(&b, " DT_%s = %d,", strings.ToUpper(i.String()), int(i))
	}
	fmt.Fprintf(&b, " DT_SPLIT_BF16 = %d,", dtSplit) // an fp32 temporary stored as bf16 hi and lo planes (splitX)
	b.WriteString(" };\n\nenum OpKind : int32_t {")
	for i, k := range opKinds {
		fmt.Fprintf(&b, " OP_%s = %d,", strings.ToUpper(k.String()), i)
	}
	b.WriteString(" };\n\nenum ReduceKind : int32_t {")
	for i, k := range reduceKinds {
		fmt.Fprintf(&b, " RED_%s = %d,", strings.ToUpper(k), i)
	}
	b.WriteString(" };\n\n")
	fmt.Fprintf(&b, "enum OpFlags : int32_t { FLAG_RESIDUAL = %d, FLAG_WEIGHT = %d, FLAG_MASK = %d, FLAG_CAUSAL = %d, FLAG_CACHE = %d, FLAG_EXTENT = %d };\n\n", flagResidual, flagWeight, flagMask, flagCausal, flagCache, flagExtent)
	writeStruct(&b, "View", viewFields)
	writeStruct(&b, "Op", opFields)
	writeStruct(&b, "Task", taskFields)
	writeStruct(&b, "Stream", streamFields)
	writeStruct(&b, "TmapSpec", tmapFields)
	b.WriteString("}  // namespace mpk\n")
	return b.String()
}

func writeStruct(b *strings.Builder, name string, fs []field) {
	fmt.Fprintf(b, "struct %s {\n", name)
	for _, f := range fs {
		if f.doc != "" {
			fmt.Fprintf(b, "  %s %s;  // %s\n", f.ctype, f.name, f.doc)
		} else {
			fmt.Fprintf(b, "  %s %s;\n", f.ctype, f.name)
		}
	}
	b.WriteString("};\n\n")
}

func kindCode(k ir.Kind) int {
	for i, x := range opKinds {
		if x == k {
			return i
		}
	}
	panic(fmt.Sprintf("codegen: op kind %s has no device code", k))
}
