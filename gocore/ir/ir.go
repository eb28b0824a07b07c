// Package ir is the op graph: buffers, strided views of them, and ops that
// read views and write views. Lowering produces it from the wire graph; the
// decompose pass turns each op into tasks.
package ir

import (
	"fmt"
	"strings"
)

// DType is an element type.
type DType int

const (
	F32 DType = iota
	BF16
	F16
	F64
	I64
	I32
	I16
	I8
	U8
	Bool
)

var dtypeNames = [...]string{"float32", "bfloat16", "float16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool"}
var dtypeSizes = [...]int64{4, 2, 2, 8, 8, 4, 2, 1, 1, 1}

func (d DType) String() string { return dtypeNames[d] }

// Size is the element size in bytes.
func (d DType) Size() int64 { return dtypeSizes[d] }

// IsFloat reports whether d is a floating-point type.
func (d DType) IsFloat() bool { return d <= F64 }

// ParseDType maps a wire dtype name to a DType.
func ParseDType(s string) (DType, error) {
	for i, n := range dtypeNames {
		if n == s {
			return DType(i), nil
		}
	}
	return 0, fmt.Errorf("unknown dtype %q", s)
}

// BufKind says where a buffer's memory comes from.
type BufKind int

const (
	// Input buffers are graph inputs (parameters, the KV cache, token ids): the caller owns them.
	Input BufKind = iota
	// Temp buffers are intermediates the runtime allocates.
	Temp
	// Output buffers are graph outputs the caller allocates.
	Output
)

// Buffer is a flat array of elements.
type Buffer struct {
	ID    int
	Name  string
	Kind  BufKind
	DType DType
	Numel int64
	// Index is the graph input index (Input) or output index (Output).
	Index int
	// Param marks inputs that are model parameters (never written).
	Param bool
}

// View is a strided window onto a buffer. Strides and Offset count elements.
type View struct {
	Buf     *Buffer
	Offset  int64
	Shape   []int64
	Strides []int64
}

// DType is the element type of the viewed buffer.
func (v View) DType() DType { return v.Buf.DType }

// Rank is the number of dimensions.
func (v View) Rank() int { return len(v.Shape) }

// Numel is the number of elements in the view.
func (v View) Numel() int64 { return Numel(v.Shape) }

// Numel multiplies a shape.
func Numel(shape []int64) int64 {
	n := int64(1)
	for _, s := range shape {
		n *= s
	}
	return n
}

// ContiguousStrides returns row-major strides for shape.
func ContiguousStrides(shape []int64) []int64 {
	st := make([]int64, len(shape))
	acc := int64(1)
	for i := len(shape) - 1; i >= 0; i-- {
		st[i] = acc
		acc *= shape[i]
	}
	return st
}

// IsContiguous reports whether v is row-major dense (size-1 dims ignored).
func (v View) IsContiguous() bool {
	acc := int64(1)
	for i := len(v.Shape) - 1; i >= 0; i-- {
		if v.Shape[i] == 1 {
			continue
		}
		if v.Strides[i] != acc {
			return false
		}
		acc *= v.Shape[i]
	}
	return true
}

// IsWhole reports whether v covers its whole buffer densely in order.
func (v View) IsWhole() bool {
	return v.Offset == 0 && v.IsContiguous() && v.Numel() == v.Buf.Numel
}

// Span returns the lowest and one-past-highest element offsets v can touch.
func (v View) Span() (lo, hi int64) {
	lo, hi = v.Offset, v.Offset+1
	if v.Numel() == 0 {
		return v.Offset, v.Offset
	}
	for i, s := range v.Shape {
		d := (s - 1) * v.Strides[i]
		if d < 0 {
			lo += d
		} else {
			hi += d
		}
	}
	return lo, hi
}

func (v View) String() string {
	return fmt.Sprintf("%s%v@%d/%v", v.Buf.Name, v.Shape, v.Offset, v.Strides)
}

// Clone copies the view's slices.
func (v View) Clone() View {
	return View{Buf: v.Buf, Offset: v.Offset, Shape: append([]int64(nil), v.Shape...), Strides: append([]int64(nil), v.Strides...)}
}

// Kind is the task-op kind an op lowers to.
type Kind int

const (
	Elementwise Kind = iota // fused elementwise expression over same-shaped input views
	Reduce                  // sum/mean/max/min/argmax over trailing dims
	RMSNorm                 // x * rsqrt(mean(x²)+eps) * w over the last dim
	RoPE                    // x*cos + rotate_half(x)*sin over the last dim
	Linear                  // out = x @ Wᵀ (+ residual)
	Matmul                  // batched out = a @ b
	Attention               // scaled dot-product attention with GQA and mask
	Embedding               // out[i] = table[idx[i]]
	Cat                     // concatenation along one dim
	KVWrite                 // in-place index_copy into a cache buffer
	Copy                    // out = in (layout change or write into an input)
	Gather                  // advanced indexing along one dim
	AttnMerge               // merges split-KV attention partials into the output
	Empty                   // no computation (normalization relays)
	MaskExtent              // out[b] = 1 + the last position a mask's row b leaves visible (0: none); see MaskHideMargin
	numKinds
)

// MaskHideMargin: a float mask value this far below its row's largest hides
// the position (MaskExtent), as -inf does. Hugging Face hides with the
// dtype's finite minimum (finfo.min), not -inf; a score of such a position
// is exp(-1e4 + spread) below the row's best, exactly 0 in fp32 for any
// spread of scores under ~9,900, so skipping it changes nothing. A row whose
// values all lie within the margin (e.g. all finfo.min) hides nothing.
const MaskHideMargin = 1e4

var kindNames = [...]string{"elementwise", "reduce", "rmsnorm", "rope", "linear", "matmul", "attention", "embedding", "cat", "kv_write", "copy", "gather", "attn_merge", "empty", "mask_extent"}

func (k Kind) String() string { return kindNames[k] }

// Op is one node of the op graph. Out[0] is the op's output view; ops that
// write in place (KVWrite, Copy into an input) name the written view there.
type Op struct {
	ID     int
	Kind   Kind
	Label  string // a finer name for summaries: "rope", "silu_mul", "residual_add"
	Node   string // FX node that produced it (the last one fused in)
	Target string // its ATen target
	Source string // model source line
	In     []View
	Out    View
	Attr   Attrs
}

// Attrs holds the per-kind parameters of an op.
type Attrs struct {
	Expr   *Expr   // Elementwise
	Reduce string  // Reduce: sum mean amax amin argmax
	Dims   int     // Reduce: number of trailing dims reduced
	Eps    float64 // RMSNorm
	Scale  float64 // Attention softmax scale
	Causal bool    // Attention with implicit causal mask
	Groups int64   // Attention: query heads per KV head
	// Splits > 1: Attention covers the KV positions in Splits chunks and writes
	// partials [B, Splits, H, Sq, Dv+2] (max, sum, unnormalised output) that
	// an AttnMerge op combines; decode then spreads over many workers.
	Splits  int64
	HasMask bool // Attention: In[3] is an additive or boolean mask
	// HasExtent: decode Attention's In[4] is its mask's extent per batch row
	// (MaskExtent); chunks that start at or past it are skipped, partials
	// unwritten (the merge reads no split past the extent either). On a
	// decode AttnMerge: In[1] is that extent, and split s covers the
	// positions from Chunk·(its chunk), so it merges the splits below it only.
	HasExtent bool
	// Interleave > 1, on a decode Attention with an extent (and its
	// AttnMerge): its splits are that many groups of interleaved chunks
	// (SplitGroups), a task per group and head, so a short live length
	// spreads over every task.
	Interleave int64
	Chunk      int64 // AttnMerge with HasExtent: the positions a KV chunk covers
	// UnitHeads > 1, on a decode Attention: a unit (DecodeUnits) takes that
	// many query heads, all of one KV head, which share each K and V load.
	UnitHeads int64
	// Paged, on a decode Attention: kv_pages' layout (lower's
	// splitAttention), a task one chunk of one unit; with an extent its
	// splits are one a group (Interleave = Splits) however many tasks
	// that makes (a batch's: rounds of the workers).
	Paged bool
	// SharedKV, on a decode Attention over a prompt chunk's queries as rows
	// (lower's queriesAsRows: K and V broadcast over the rows), makes a task
	// one KV head's chunk of positions for a block of rows, its K and V
	// read once into shared memory for all of them (decompose's
	// sharedKVTiles; taskRange's flat order (group·Splits + split)·B + row).
	SharedKV bool
	Residual bool // Linear: In[2] is added to the product
	// KParts > 1, on a Linear: it is one of KParts slices of a Linear's K
	// (lower's splitLinearK), which run side by side, each on 1/KParts of
	// the workers, so each worker stages one slice of x, not all of them.
	KParts int64
	// Spread, on a Linear: a block of x's rows that runs beside the other
	// blocks of its weight rows on workers of its own (lower's
	// balanceGemmTail), not after them on theirs (decompose's
	// WeightAffinity leaves it out).
	Spread bool
	// Workers > 0, on a Linear: its tasks spread over that many workers, its
	// share of sibling Linears that read the same x and run side by side
	// (lower's shareSiblingWorkers: q, k and v, each worker one of them).
	Workers int64
	// Gemm, on a Linear: its x (32 rows or more) streams a block of K at a
	// time, as a plain input (lower's markGemm keeps the norm that makes it
	// out of its prologue).
	Gemm bool
	// Wgmma, on a Gemm Linear with bf16 weights: its products run on
	// Hopper's wgmma (mpk::linear_wgmma) rather than mma.sync.
	Wgmma     bool
	HasWeight bool // RMSNorm: In[1] is the weight
	Dim       int  // Cat, KVWrite, Gather: the dimension
	// Pro, on a Linear, computes x while staging it instead of reading In[0]:
	// the norm or elementwise op that produced x, folded into every reader.
	Pro *Prologue
	// Epi, on a Linear, computes what it stores from the product: the
	// elementwise op that read the product (SiLU·mul), folded into the store.
	Epi *Epilogue
	// IndexIn > 0, on a RoPE, makes it also the KV-cache write that read it:
	// In[IndexIn] holds the positions, and row i of the rotation lands at
	// Out.select(Dim, In[IndexIn][i]) (Out is the cache, as for a KVWrite).
	IndexIn int
	// Fresh, on a decode Attention, folds in the RoPE of its queries and the
	// step's new K and V rows (lower's freshRows).
	Fresh *FreshRows
}

// FreshRows describes a decode Attention that reads its queries and this
// step's K and V rows before the KV-cache writes land: In[0] is q before
// its RoPE, and In[First:] are cos, sin (RoPE's views over the query heads,
// broadcast over them), the new K row before its RoPE [B, KVH, 1, D], the
// new V row, and the one cache position they are written at; with Norm, then
// the q and k RMSNorm weights. The row at that position is taken from these
// (rotated, rounded as the RoPE and the cache write round it), never read
// from the cache, so the attention need not wait for the writes: its cache
// reads exclude what the step writes (tgraph.Access.Fresh).
type FreshRows struct {
	First     int
	Norm      bool    // q and k are RMS-normalised (weighted) before the rotation
	Eps       float64 // Norm: the norms' epsilon
	NormDType DType   // Norm: the dtype a normalised element rounds to
	QDType    DType   // the rotated query's dtype (the RoPE's output)
}

// Prologue is an op folded into a Linear's load of x. Its inputs, viewed in
// x's [M, K] index space, are the Linear's In[0] followed by In[First:];
// results round to DType, the folded op's output dtype.
type Prologue struct {
	// RMSNorm or Elementwise: x in the Linear's [M, K] shape is computed
	// from In[0] (and In[First..]) at the same index. AttnMerge: In[0] is
	// split-KV attention's partials [M, Splits, H, 1, Dv+2] and x[m, h·Dv+d]
	// their merge (the attn_merge op folded into its reader).
	Kind      Kind
	First     int
	Expr      *Expr // Elementwise
	Eps       float64
	HasWeight bool // RMSNorm: the second input is the weight
	DType     DType
	// Chunk > 0, on an AttnMerge prologue: In[First] is the extent [M]
	// (int32) of the attention's mask, and split s covers positions from
	// s·Chunk, so the splits from ⌈extent/Chunk⌉ on hold nothing and are not
	// read: a long cache with few live positions merges few partials.
	Chunk int64
	// Interleave: the attention's split groups (SplitGroups), so the merge
	// finds the split that covers each live chunk.
	Interleave int64
}

// MaxInputs is the most input views one op may have (the task ABI's
// MPK_MAX_INPUTS): a pass that builds an op of many inputs stays within it.
const MaxInputs = 12

// MaxEpilogueInputs bounds an epilogue's inputs besides the product: the
// CUDA store loads them into registers before the weights stream
// (mpk::kMaxEpiInputs, generated from this).
const MaxEpilogueInputs = 2

// Epilogue is an elementwise op folded into a Linear's store. In its Expr,
// Load(0) is the product rounded to DType (the Linear's output dtype before
// the fold) and Load(i), i ≥ 1, is In[First+i-1] viewed in the [M, N] index
// space of the output; the result rounds to the Linear's Out dtype.
type Epilogue struct {
	First int
	Expr  *Expr
	DType DType
	// Pair > 0 makes Load(Pair) the product of x with a second weight,
	// In[First+Pair-1] ([N, K], like In[1]), rounded to PairDType: the
	// Linear that made that operand (a gate projection) folded in beside
	// this one (lower's pairLinears), so one task streams both weights'
	// rows and meets their products in the store.
	Pair      int
	PairDType DType
}

// PairInput is the index in In of a paired Linear's second weight
// (Epilogue.Pair), or -1.
func (op *Op) PairInput() int {
	if op.Kind != Linear || op.Attr.Epi == nil || op.Attr.Epi.Pair == 0 {
		return -1
	}
	return op.Attr.Epi.First + op.Attr.Epi.Pair - 1
}

// PairWeight returns the second weight of a paired Linear (Epilogue.Pair).
func (op *Op) PairWeight() (View, bool) {
	if i := op.PairInput(); i >= 0 {
		return op.In[i], true
	}
	return View{}, false
}

// XKey identifies the x a Linear stages: its prologue's kind, parameters
// and expression, and the views it reads. Linears of one key stage the same
// x (codegen lets the second reuse the first's; lower's siblings share the
// workers).
func (op *Op) XKey() string {
	var sb strings.Builder
	views := []View{op.In[0]}
	if p := op.Attr.Pro; p != nil {
		views = op.ProIn()
		fmt.Fprintf(&sb, "%d|%v|%v|%v|", p.Kind, p.Eps, p.HasWeight, p.DType)
		if p.Expr != nil {
			sb.WriteString(p.Expr.String() + "|")
		}
	}
	for _, v := range views {
		sb.WriteString(v.String() + "|")
	}
	return sb.String()
}

// ProIn returns the inputs of op's prologue.
func (op *Op) ProIn() []View {
	end := len(op.In)
	if op.Attr.IndexIn > 0 {
		end = op.Attr.IndexIn
	}
	if op.Attr.Epi != nil {
		end = op.Attr.Epi.First
	}
	return append([]View{op.In[0]}, op.In[op.Attr.Pro.First:end]...)
}

// LinearK is a Linear's reduction length: its weight's row length (In[0] is
// not x's shape when a merge prologue computes x).
func (op *Op) LinearK() int64 { return op.In[1].Shape[1] }

// LinearX is the dtype of a Linear's x: its input's, or the dtype its
// prologue rounds to when x is computed.
func (op *Op) LinearX() DType {
	if op.Attr.Pro != nil {
		return op.Attr.Pro.DType
	}
	return op.In[0].DType()
}

// EpiIn returns the inputs of op's epilogue besides the product (a paired
// Linear's second weight among them: Epilogue.Pair).
func (op *Op) EpiIn() []View { return op.In[op.Attr.Epi.First:] }

// IterShape is the index space op's tasks tile: the output, except for ops
// that write rows at run-time positions (a KV-cache write, a RoPE storing
// into the cache), which iterate over their source rows.
func (op *Op) IterShape() []int64 {
	switch {
	case op.Kind == KVWrite:
		return op.In[1].Shape
	case op.Kind == RoPE && op.Attr.IndexIn > 0:
		return op.In[0].Shape
	}
	return op.Out.Shape
}

// DecodeUnits says whether a split-KV attention's tasks take flat units
// u = group·Splits + chunk (one query per head, decode; a group is
// HeadsPerUnit query heads): a task covers the units [lo, hi), either whole
// groups or chunks of one group, so its box stays a box. Group-major, so that
// when only the first chunks hold live positions (a long cache, partly
// filled) every group's live chunks go to a different task.
func (op *Op) DecodeUnits() bool {
	return op.Kind == Attention && op.Attr.Splits > 1 && op.In[0].Shape[2] == 1
}

// HeadsPerUnit is how many query heads a decode attention's unit takes.
func (op *Op) HeadsPerUnit() int64 { return max(1, op.Attr.UnitHeads) }

// SplitChunk is how many of S KV positions each chunk of a split-KV
// attention with splits chunks covers (the last may cover fewer).
func SplitChunk(S, splits int64) int64 { return (S + splits - 1) / splits }

// LiveChunk is the KV positions each split of a prompt chunk's attention
// with shared K and V (Attrs.SharedKV) and a mask extent covers: the live
// positions [0, extent) of the longest row, cut evenly over the splits
// (whole groups of 16), where cutting the capacity S left the splits past
// the live length empty and the live ones long (a 64-token chunk after 512
// tokens in a cache of 776: chunks of 194, a fourth of them empty). Every
// task and the merge compute it alike: the tasks from the extents of every
// row, and the merge reads every split (the rows that see none of theirs
// write an empty softmax, l = 0).
func LiveChunk(extent, splits int64) int64 {
	c := (max(extent, 1) + splits - 1) / splits
	return (c + 15) / 16 * 16
}

// SharedKVTile is the most K and V rows of a chunk that attention with
// shared K and V (Attrs.SharedKV) holds in shared memory at once: a longer
// chunk is read a tile after another.
const SharedKVTile = 64

// SplitPositions returns the KV positions [lo, hi) that the chunks [s0, s1)
// of a split-KV attention over S positions cover.
func SplitPositions(S, splits, s0, s1 int64) (int64, int64) {
	return ChunkPositions(S, SplitChunk(S, splits), s0, s1)
}

// ChunkPositions returns the positions [lo, hi) of S that the chunks
// [s0, s1) of chunk positions each cover (SplitChunk's, or LiveChunk's).
func ChunkPositions(S, chunk, s0, s1 int64) (int64, int64) {
	return min(s0*chunk, S), min(s1*chunk, S)
}

// SplitGroups maps the splits of a split-KV attention to the KV chunks they
// cover (chunk c: positions [c·SplitChunk, (c+1)·SplitChunk)). With R > 1,
// the splits form R contiguous groups (sizes differ by at most one) and
// group r covers the chunks r, r+R, r+2R, …: a task that takes one group of
// a head gets an even share of the first chunks, the ones a short live
// length fills (MaskExtent), where contiguous chunks would give them all to
// one task. R ≤ 1: split s covers chunk s.
type SplitGroups struct{ Splits, R int64 }

func (g SplitGroups) groups() (R, q, rem int64) {
	R = max(1, min(g.R, g.Splits))
	return R, g.Splits / R, g.Splits % R
}

// Start is the first split of group r.
func (g SplitGroups) Start(r int64) int64 {
	_, q, rem := g.groups()
	return r*q + min(r, rem)
}

// Group is the group split s belongs to.
func (g SplitGroups) Group(s int64) int64 {
	_, q, rem := g.groups()
	if s < rem*(q+1) {
		return s / (q + 1)
	}
	return rem + (s-rem*(q+1))/q
}

// Chunk is the KV chunk split s covers.
func (g SplitGroups) Chunk(s int64) int64 {
	R, _, _ := g.groups()
	r := g.Group(s)
	return (s-g.Start(r))*R + r
}

// Split is the split that covers chunk c.
func (g SplitGroups) Split(c int64) int64 {
	R, _, _ := g.groups()
	return g.Start(c%R) + c/R
}

// Graph is a lowered program: ops in a valid sequential order.
type Graph struct {
	Buffers []*Buffer
	Ops     []*Op
	Inputs  []*Buffer // graph inputs by index
	// Outputs are the views Python receives, in graph output order.
	Outputs []View
}

// NewBuffer appends a buffer to g.
func (g *Graph) NewBuffer(name string, kind BufKind, dt DType, numel int64) *Buffer {
	b := &Buffer{ID: len(g.Buffers), Name: name, Kind: kind, DType: dt, Numel: numel}
	g.Buffers = append(g.Buffers, b)
	return b
}

// NewTemp allocates a contiguous temporary of the given shape and returns a view of it.
func (g *Graph) NewTemp(name string, dt DType, shape []int64) View {
	b := g.NewBuffer(name, Temp, dt, Numel(shape))
	return View{Buf: b, Shape: append([]int64(nil), shape...), Strides: ContiguousStrides(shape)}
}

// Renumber gives ops and buffers dense ids in slice order.
func (g *Graph) Renumber() {
	for i, op := range g.Ops {
		op.ID = i
	}
	for i, b := range g.Buffers {
		b.ID = i
	}
}

// Dump prints the graph, one op a line, for debugging and golden files.
func (g *Graph) Dump() string {
	var sb strings.Builder
	for _, op := range g.Ops {
		fmt.Fprintf(&sb, "%3d %-11s %-12s out=%v in=[", op.ID, op.Kind, op.Label, op.Out)
		for i, v := range op.In {
			if i > 0 {
				sb.WriteString(" ")
			}
			sb.WriteString(v.String())
		}
		sb.WriteString("]")
		if op.Attr.Expr != nil {
			sb.WriteString(" expr=" + op.Attr.Expr.String())
		}
		sb.WriteString("\n")
	}
	return sb.String()
}
