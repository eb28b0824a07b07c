// Package wire defines the bytes that cross the boundary between the Python
// front end and the Go core. Wire types stay separate from the compiler's IR;
// package lower converts them in one place.
//
// # Request (Python → Go)
//
// A compile request is one JSON document, zstd-compressed (a frame starting
// with the zstd magic 28 B5 2F FD); an uncompressed document starting with '{'
// is also accepted, for debugging. Its shape, version 1:
//
//	{"version": 1,
//	 "options": {"target": "reference"|"cuda", "num_workers": 132, "seed": 0,
//	             "skip_validate": false, "drop_dependency": false, "check_ir": false},
//	 "graph": {
//	   "inputs":  [{"name": "arg0_1", "kind": "param"|"buffer"|"input",
//	                "meta": Meta}],
//	   "nodes":   [{"name": "mm", "target": "aten.mm.default",
//	                "args": [Arg], "kwargs": {"name": Arg},
//	                "outs": [Meta|null], "source": "model.py:12  x = self.proj(h)"}],
//	   "outputs": [Arg]}}
//
// Meta describes one tensor: {"dtype": "float32", "shape": [1, 64],
// "strides": [64, 1], "offset": 0}. Strides and offset count elements.
// dtype is one of float32 bfloat16 float16 float64 int64 int32 int16 int8
// uint8 bool.
//
// Arg is a tagged value:
//
//	{"k": "node", "node": "mm", "index": 0}   output `index` of node or input `node`
//	{"k": "int", "i": 3}    {"k": "float", "f": 0.5}   {"k": "bool", "b": true}
//	{"k": "float", "s": "inf"|"-inf"|"nan"}   non-finite floats (JSON has none)
//	{"k": "none"}           {"k": "str", "s": "..."}   {"k": "dtype", "s": "float32"}
//	{"k": "list", "list": [Arg, ...]}
//
// Python resolves operator.getitem nodes into node Args with an index, so no
// getitem node ever appears. A tensor constant the graph reads (an FX
// get_attr) is a node with target "mpk.constant" whose one argument is the
// list of its values in row-major order, and whose outs meta is contiguous. In-place writes to inputs (the KV cache, the
// cache's position counter) appear as aten.copy_.default nodes whose first
// argument is the input.
//
// # Results (Go → Python)
//
// Every entry point answers with uncompressed JSON: a Result. On failure
// "ok" is false and "error" says what went wrong and where.
package wire

import (
	"bytes"
	"fmt"
	"math"
	"os"

	json "github.com/goccy/go-json"
	"github.com/klauspost/compress/zstd"
)

// Version is the only request version this core understands.
const Version = 1

// MaxRequestBytes bounds the decompressed size of a request.
const MaxRequestBytes = 1 << 30

type Request struct {
	Version int     `json:"version"`
	Options Options `json:"options"`
	Graph   Graph   `json:"graph"`
}

type Options struct {
	Target         string `json:"target"`
	NumWorkers     int    `json:"num_workers"`
	Seed           int64  `json:"seed"`
	SkipValidate   bool   `json:"skip_validate"`
	DropDependency bool   `json:"drop_dependency"`
	CheckIR        bool   `json:"check_ir"`
	// Trace makes the CUDA module record when each task waited, started and
	// ended (bench/trace.py reads it); it costs a few global stores a task.
	Trace bool `json:"trace"`
	// RoundIntermediates rounds half-precision intermediates after every op,
	// as eager does, instead of keeping them in fp32.
	RoundIntermediates bool `json:"round_intermediates"`
	// SplitRows streams a Linear whose x has too many rows for one weight
	// stream as blocks of rows, each reading the weights once (lower.Config).
	SplitRows bool `json:"split_rows"`
	// PrefillRows runs a sequence's masked prompt chunk as decode attention
	// over its queries (lower.Config).
	PrefillRows bool `json:"prefill_rows"`
	// SplitK streams a Linear whose x is too large for one weight stream as
	// slices of K and their sum (lower.Config).
	SplitK bool `json:"split_k"`
	// Gemm streams a Linear whose x has 32 rows or more (a prompt chunk) a
	// block of K at a time, its weights read once (lower.Config).
	Gemm bool `json:"gemm"`
	// Wgmma runs those GEMM streams with bf16 weights on wgmma (Hopper)
	// instead of mma.sync (lower.Config).
	Wgmma bool `json:"wgmma"`
	// GemmRowBlocks lets a GEMM stream with too few weight rows for the
	// workers run as blocks of x's rows rather than slices of K and their
	// sum, where that costs less (lower.Config).
	GemmRowBlocks bool `json:"gemm_row_blocks"`
	// GemmSiblings cuts a run of sibling GEMM streams (a chunk's q, k and
	// v projections) as one stage, by its cost (lower.Config).
	GemmSiblings bool `json:"gemm_siblings"`
	// LongAttentionChunks gives a prompt chunk's attention with shared K
	// and V chunks of positions long enough for its tasks to fit one wave
	// of the workers (lower.Config).
	LongAttentionChunks bool `json:"long_attention_chunks"`
	// RoundGemmInputs keeps the x of each GEMM stream (a prompt chunk's
	// Linears) in the weights' dtype, rounded as eager rounds it: half the
	// bytes and half the multiplies of an fp32 x (lower.Config).
	RoundGemmInputs bool `json:"round_gemm_inputs"`
	// CoarseEvents makes an op whose tasks wait on overlapping sets of
	// producer tasks (each producer in more than 2 of them on average) wait
	// on their union: one event, and no relay tasks fanning a producer out
	// to many (decompose.Coarsen).
	CoarseEvents bool `json:"coarse_events"`
	// FreshRows folds the RoPE of a decode attention's queries and its new
	// K and V rows into the attention, which then runs beside the KV-cache
	// writes rather than after them (lower.Config).
	FreshRows bool `json:"fresh_rows"`
	// PairLinears folds a gate projection into the up projection that reads
	// it: one task streams both weights' rows (lower.Config).
	PairLinears bool `json:"pair_linears"`
	// PairGemm lets PairLinears fold a gate projection into its up
	// projection where both are GEMM streams (a prompt chunk's MLP): one
	// task streams the rows of both weights past one staging of x
	// (lower.Config).
	PairGemm bool `json:"pair_gemm"`
	// BalanceGemmTail runs the short last round of a GEMM stream's tasks
	// as two streams over halves of x's rows (lower.Config).
	BalanceGemmTail bool `json:"balance_gemm_tail"`
	// TimedSchedule places each task on the worker that can start it first
	// by estimated task times (tgraph.Schedule), rather than round-robin,
	// and cuts the GEMM stream after a stage with a short last round so its
	// slices fill that round's idle workers (lower.Config).
	TimedSchedule bool `json:"timed_schedule"`
	// SplitGemmX stores the x of a wgmma GEMM stream (a prompt chunk's
	// normed hidden states, attention output, SiLU·mul) as bf16 hi and lo
	// planes, made by the op that writes it and staged by the GEMM with
	// tensor-map copies as wgmma's B operand (codegen.splitX).
	SplitGemmX bool `json:"split_gemm_x"`
	// TileXParts stages a tile stream's plain x in parts of K, one after
	// another, where the whole would shrink the workers' weight ring (the
	// down projection at batch 8: stream.TileXParts).
	TileXParts bool `json:"tile_x_parts"`
	// WideXParts lets TileXParts stage in parts what it otherwise stages
	// whole: a normed x (the deferred norm: each part's sums of squares
	// added up) and a pair's, and tasks of any number of row groups (their
	// sums added part by part in shared memory), so no tile stream's x
	// shrinks the ring (batch 16's, qwen3-8b's batch 8).
	WideXParts bool `json:"wide_x_parts"`
	// PairTiles lets pair_linears pair tile streams too (a decode batch's
	// gate and up projections): a task stages x once and streams each row
	// group's pages of both weights (lower.Config).
	PairTiles bool `json:"pair_tiles"`
	// GemmBatch streams a Linear with bf16 weights whose x has
	// stream.GemmBatchMinRows rows or more (a decode batch of 4 to 31) and
	// whose tasks cover the workers with K whole as a wgmma GEMM stream
	// too, not as a tile stream (lower.Config).
	GemmBatch bool `json:"gemm_batch"`
	// KVPages makes a single sequence's fresh-row decode attention read
	// its K and V chunks from the weight ring, streamed there by the
	// loader ahead of the attention's inputs (lower.Config).
	KVPages bool `json:"kv_pages"`
	// KVPagesBatch extends kv_pages to a decode batch's attention: a task
	// a chunk of one row's KV head, its K and V streamed through the ring
	// (lower.Config).
	KVPagesBatch bool `json:"kv_pages_batch"`
	// KVSwizzle lands a batch's kv_pages chunks through tensor maps whose
	// boxes are 128-byte swizzled, so the tensor-core rounds' ldmatrix
	// reads of K and V rows are free of bank conflicts (codegen's
	// kvStream.Swizzle).
	KVSwizzle bool `json:"kv_swizzle"`
	// WeightAffinity schedules the blocks of rows of a prompt chunk's Linear
	// that read the same weight rows on one worker, one after another, so
	// the rows come from HBM once (decompose.WeightAffinity).
	WeightAffinity bool `json:"weight_affinity"`
	// ArenaReuse lets temporaries whose accesses the events order share
	// arena bytes (package arena); the validator checks the sharing.
	ArenaReuse bool `json:"arena_reuse"`
}

type Graph struct {
	Inputs  []Input `json:"inputs"`
	Nodes   []Node  `json:"nodes"`
	Outputs []Arg   `json:"outputs"`
}

type Input struct {
	Name string `json:"name"`
	Kind string `json:"kind"`
	Meta Meta   `json:"meta"`
}

type Node struct {
	Name   string         `json:"name"`
	Target string         `json:"target"`
	Args   []Arg          `json:"args"`
	Kwargs map[string]Arg `json:"kwargs"`
	Outs   []*Meta        `json:"outs"`
	Source string         `json:"source"`
}

type Meta struct {
	DType   string  `json:"dtype"`
	Shape   []int64 `json:"shape"`
	Strides []int64 `json:"strides"`
	Offset  int64   `json:"offset"`
}

type Arg struct {
	K     string  `json:"k"`
	Node  string  `json:"node,omitempty"`
	Index int     `json:"index,omitempty"`
	I     int64   `json:"i,omitempty"`
	F     float64 `json:"f,omitempty"`
	B     bool    `json:"b,omitempty"`
	S     string  `json:"s,omitempty"`
	List  []Arg   `json:"list,omitempty"`
}

// Float is the value of a float Arg, non-finite ones included.
func (a Arg) Float() float64 {
	switch a.S {
	case "inf":
		return math.Inf(1)
	case "-inf":
		return math.Inf(-1)
	case "nan":
		return math.NaN()
	}
	return a.F
}

var zstdMagic = []byte{0x28, 0xb5, 0x2f, 0xfd}

// DecodeRequest decompresses and parses a request, rejecting unknown versions.
func DecodeRequest(data []byte) (*Request, error) {
	raw := data
	if bytes.HasPrefix(data, zstdMagic) {
		dec, err := zstd.NewReader(nil, zstd.WithDecoderMaxMemory(MaxRequestBytes), zstd.WithDecoderConcurrency(1))
		if err != nil {
			return nil, err
		}
		defer dec.Close()
		raw, err = dec.DecodeAll(data, nil)
		if err != nil {
			return nil, fmt.Errorf("wire: corrupt zstd request: %v", err)
		}
	} else if len(bytes.TrimSpace(data)) == 0 || bytes.TrimSpace(data)[0] != '{' {
		return nil, fmt.Errorf("wire: request is neither zstd nor JSON (%d bytes)", len(data))
	}
	var probe struct {
		Version *int `json:"version"`
	}
	if err := json.Unmarshal(raw, &probe); err != nil {
		return nil, fmt.Errorf("wire: malformed request JSON: %v", err)
	}
	if probe.Version == nil {
		return nil, fmt.Errorf("wire: request has no version")
	}
	if *probe.Version != Version {
		return nil, fmt.Errorf("wire: request version %d is not supported (this core reads version %d)", *probe.Version, Version)
	}
	req := &Request{}
	if err := json.Unmarshal(raw, req); err != nil {
		return nil, fmt.Errorf("wire: malformed request JSON: %v", err)
	}
	return req, nil
}

// EncodeRequest is the inverse of DecodeRequest; Go tests use it to build requests.
func EncodeRequest(req *Request) ([]byte, error) {
	raw, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1))
	if err != nil {
		return nil, err
	}
	defer enc.Close()
	return enc.EncodeAll(raw, nil), nil
}

// Error is a failure a user reads: what, which rule or op, and where in the model.
type Error struct {
	Kind    string `json:"kind"` // "unsupported_op", "invalid_graph", "validation", "bad_request", "runtime", "internal"
	Message string `json:"message"`
	Op      string `json:"op,omitempty"`
	Node    string `json:"node,omitempty"`
	Source  string `json:"source,omitempty"`
	Hint    string `json:"hint,omitempty"`
}

func (e *Error) Error() string {
	s := e.Message
	if e.Node != "" {
		s += fmt.Sprintf("\n  at node %s (%s)", e.Node, e.Op)
	}
	if e.Source != "" {
		s += "\n  model line: " + e.Source
	}
	if e.Hint != "" {
		s += "\n  hint: " + e.Hint
	}
	return s
}

// OutputSpec tells Python how to materialise one graph output: a fresh tensor
// it allocates ("new"), or a view of one of the call's inputs ("input").
type OutputSpec struct {
	Kind    string  `json:"kind"`
	Input   int     `json:"input,omitempty"`
	DType   string  `json:"dtype"`
	Shape   []int64 `json:"shape"`
	Strides []int64 `json:"strides"`
	Offset  int64   `json:"offset"`
}

// PassTime is one compiler pass and how long it took.
type PassTime struct {
	Name string  `json:"name"`
	Ms   float64 `json:"ms"`
}

// Summary is the task-graph summary a user can print.
type Summary struct {
	Ops        int            `json:"ops"`
	Tasks      int            `json:"tasks"`
	Events     int            `json:"events"`
	Workers    int            `json:"workers"`
	TasksByOp  map[string]int `json:"tasks_by_op"`
	OpsByKind  map[string]int `json:"ops_by_kind"`
	EmptyTasks int            `json:"empty_tasks"`
	LocalWaits int            `json:"local_waits"` // waits the runtime drops (tgraph.LocalWaits)
	ArenaBytes int64          `json:"arena_bytes"` // the temporaries' device memory (package arena)
	Passes     []PassTime     `json:"passes"`
	CoreMs     float64        `json:"core_ms"`
	OpLabels   []string       `json:"op_labels"` // by op index, as the task tables number ops
	OpNodes    []string       `json:"op_nodes"`  // by op index: the FX node each op came from (errors name it)
	Text       string         `json:"text"`
}

// CompileResult answers mpk_compile.
type CompileResult struct {
	OK      bool         `json:"ok"`
	Handle  int64        `json:"handle,omitempty"`
	Error   *Error       `json:"error,omitempty"`
	Summary *Summary     `json:"summary,omitempty"`
	Outputs []OutputSpec `json:"outputs,omitempty"`
	// BulkInputs (cuda) are the graph inputs the kernel reads with bulk
	// copies, by index: a call must pass them 16-byte aligned.
	BulkInputs []int `json:"bulk_inputs,omitempty"`
	// CUDA holds generated files by name (source, tables) for the cuda target.
	CUDA map[string]string `json:"cuda,omitempty"`
}

// RunResult answers mpk_run_reference.
type RunResult struct {
	OK       bool    `json:"ok"`
	Error    *Error  `json:"error,omitempty"`
	Executed int     `json:"executed"`
	Ms       float64 `json:"ms"`
}

// ReadRequestFile decodes a request saved to a file (MPK_DUMP_REQUEST writes
// them; gocore/testdata keeps ones recorded from real models).
func ReadRequestFile(path string) (*Request, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return DecodeRequest(data)
}
