package compiler

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"mpk/gocore/decompose"
	"mpk/gocore/ir"
	"mpk/gocore/tgraph"
	"mpk/gocore/validate"
	"mpk/gocore/wire"
)

// loadRequest reads a request recorded from a real HF model (gocore/testdata).
func loadRequest(t testing.TB, name string) *wire.Request {
	t.Helper()
	req, err := wire.ReadRequestFile(filepath.Join("..", "testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return req
}

var fixtures = []string{"tiny-llama-decode.json", "tiny-llama-prefill16.json", "tiny-qwen3-decode.json", "tiny-qwen3-prefill16.json", "qwen3-0.6b-decode.json.zst", "wide-llama-batch3-decode.json.zst"}

// TestCompileRealLowerings compiles recorded HF graphs at several worker
// counts; every one must pass the validator.
func TestCompileRealLowerings(t *testing.T) {
	for _, f := range fixtures {
		for _, workers := range []int{1, 8, 132} {
			req := loadRequest(t, f)
			req.Options.NumWorkers = workers
			req.Options.Target = "reference"
			c, err := Compile(req)
			if err != nil {
				t.Fatalf("%s workers=%d: %v", f, workers, err)
			}
			s := c.Result.Summary
			if s.Tasks < s.Ops {
				t.Errorf("%s: %d tasks for %d ops", f, s.Tasks, s.Ops)
			}
			if testing.Verbose() && workers == 132 {
				t.Logf("%s\n%s", f, s.Text)
			}
		}
	}
}

// TestGenerateCUDA emits the CUDA module for each recorded graph; with
// MPK_DUMP_CUDA=dir it also writes module.cu files for compile checks.
func TestGenerateCUDA(t *testing.T) {
	for _, f := range fixtures {
		req := loadRequest(t, f)
		req.Options.Target = "cuda"
		req.Options.NumWorkers = 132
		c, err := Compile(req)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		src := c.Result.CUDA["module.cu"]
		if len(src) == 0 {
			t.Fatalf("%s: no module.cu", f)
		}
		if dir := os.Getenv("MPK_DUMP_CUDA"); dir != "" {
			os.MkdirAll(filepath.Join(dir, f), 0o755)
			os.WriteFile(filepath.Join(dir, f, "module.cu"), []byte(src), 0o644)
		}
	}
}

// TestDefaultOptionsAtScale compiles real models' batched and prompt-chunk steps for cuda
// with the default options (split_rows, prefill_rows, split_k, gemm, coarse_events,
// weight_affinity on):
// each must lower, validate and generate code within the task ABI (qwen3-8b
// at batch 16 once cut its down projection into 8 slices whose sum read 9
// inputs, which codegen refused), its down projections cut along K into
// the slices named. Their graphs sit in testdata/scale, apart from the
// fixtures the reference executor runs (these models are too large to run).
// Under a fifth of their tasks are empty relays.
// checkWgmma compiles req (a GEMM stream's, compiled to comp with default
// options) again with wgmma: the same ops, tasks and pages (checkStreams),
// each GEMM stream's task now mpk::linear_wgmma, whose three x buffers take
// less shared memory than linear_gemm's staged x, so the ring is no smaller.
func checkWgmma(t *testing.T, file string, comp *Compiled) {
	t.Helper()
	req := loadRequest(t, file)
	req.Options.Target, req.Options.NumWorkers = "cuda", 132
	req.Options.SplitRows, req.Options.PrefillRows, req.Options.SplitK, req.Options.Gemm = true, true, true, true
	req.Options.CoarseEvents, req.Options.Wgmma, req.Options.WeightAffinity = true, true, true
	wg, err := Compile(req)
	if err != nil {
		t.Fatalf("%s with wgmma: %v", file, err)
	}
	if len(wg.Tasks.Tasks) != len(comp.Tasks.Tasks) {
		t.Errorf("%s: %d tasks with wgmma, %d without", file, len(wg.Tasks.Tasks), len(comp.Tasks.Tasks))
	}
	checkStreams(t, file+" (wgmma)", wg, "wgmma", 0)
	src, before := wg.Result.CUDA["module.cu"], comp.Result.CUDA["module.cu"]
	if !strings.Contains(src, "mpk::wgmma_scratch_bytes(") {
		t.Errorf("%s: no static check of a wgmma stream's scratch", file)
	}
	if got, was := constant(t, src, "kSizedRingPages"), constant(t, before, "kSizedRingPages"); got < was {
		t.Errorf("%s: %d ring pages with wgmma, %d without", file, got, was)
	}
}

func TestDefaultOptionsAtScale(t *testing.T) {
	for _, c := range []struct {
		file           string
		layers, slices int
		others         int // plain Linears besides the layers'
		streams        string
	}{
		{"scale/llama-3.2-1b-batch16-decode.json.zst", 16, 4, 0, "tiles"},
		{"scale/qwen3-8b-batch16-decode.json.zst", 36, 6, 0, "tiles"},
		// A 64-token chunk: every Linear a GEMM stream (x's 64 rows do not
		// fit a tile stream), q and o cut into 4 slices of K, k and v into
		// 8, the down projection into 4 (each of 32 tasks of 64 rows), the
		// gate and up projections and the LM head whole; its attention runs
		// as decode over the queries.
		{"scale/llama-3.2-1b-prefill64.json.zst", 16, 4 + 8 + 8 + 4 + 1 + 4, 1, "gemm"},
	} {
		req := loadRequest(t, c.file)
		req.Options.Target, req.Options.NumWorkers = "cuda", 132
		req.Options.SplitRows, req.Options.PrefillRows, req.Options.SplitK, req.Options.Gemm = true, true, true, true
		req.Options.CoarseEvents, req.Options.WeightAffinity = true, true
		comp, err := Compile(req)
		if err != nil {
			t.Fatalf("%s: %v", c.file, err)
		}
		s := comp.Result.Summary
		if got := s.OpsByKind["linear"]; got != c.layers*c.slices+c.others {
			t.Errorf("%s: %d plain Linears (slices of K), want %d a layer over %d layers and %d more", c.file, got,
				c.slices, c.layers, c.others)
		}
		checkStreams(t, c.file, comp, c.streams, 0)
		if c.streams == "gemm" {
			checkWgmma(t, c.file, comp)
		}
		// coarse_events: a producer fans out through relay tasks only where its
		// consumers' sets overlap little. Without it about half of these
		// graphs' tasks were relays (the 64-token chunk 40,260 of 73,925,
		// qwen3-8b at batch 16 78,550 of 156,160); with it 9-13%.
		if s.EmptyTasks*5 > s.Tasks {
			t.Errorf("%s: %d of %d tasks are empty relays, want under a fifth", c.file, s.EmptyTasks, s.Tasks)
		}
	}
}

// TestWeightAffinity: a 320-token chunk's Linears run as 5 blocks of 64
// rows (split_rows), and the tasks of every block that read the same weight
// rows sit on one worker (tgraph.Schedule), so the rows come from HBM once;
// the workers' shares of Linear tasks stay within a block group of even; at
// decode no two tasks read the same rows.
func TestWeightAffinity(t *testing.T) {
	compile := func(file string, workers int, on bool) *Compiled {
		req := loadRequest(t, file)
		if workers > 0 {
			req.Options.NumWorkers = workers
		}
		req.Options.WeightAffinity = on
		comp, err := Compile(req)
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		return comp
	}
	noKeys := func(what string, comp *Compiled) {
		for i, task := range comp.Tasks.Tasks {
			if task.Affinity != 0 {
				t.Fatalf("%s: task %d (%s) has weight affinity %d", what, i, comp.Tasks.Name(i), task.Affinity)
			}
		}
	}
	noKeys("weight_affinity off", compile("wide-llama-prefill320.json.zst", 0, false))
	noKeys("decode", compile("qwen3-0.6b-decode.json.zst", 0, true))
	for _, workers := range []int{16, 132} {
		comp := compile("wide-llama-prefill320.json.zst", workers, true)
		type rows struct {
			buf, offset, lo, hi int64
		}
		readers := map[rows]map[int]bool{}
		blocks := map[rows]int{} // the tasks that read the rows
		perWorker := make([]int, workers)
		linears, group := 0, 0
		for _, task := range comp.Tasks.Tasks {
			if task.Op < 0 {
				continue
			}
			op := comp.Ops.Ops[task.Op]
			if op.Kind != ir.Linear {
				continue
			}
			perWorker[task.Worker]++
			linears++
			if op.In[1].Buf.Kind != ir.Input {
				continue
			}
			r := rows{int64(op.In[1].Buf.ID), op.In[1].Offset, task.Box.Lo[1], task.Box.Hi[1]}
			if readers[r] == nil {
				readers[r] = map[int]bool{}
			}
			readers[r][task.Worker] = true
			blocks[r]++
		}
		counts := map[int]int{}
		for _, task := range comp.Tasks.Tasks {
			if task.Affinity > 0 {
				counts[task.Affinity]++
				group = max(group, counts[task.Affinity])
			}
		}
		if group < 2 {
			t.Fatalf("workers=%d: no task shares its weight rows: the chunk was not cut into blocks of rows", workers)
		}
		ranges := map[[2]int64]int64{} // a weight's row ranges
		for r := range readers {
			ranges[[2]int64{r.buf, r.offset}]++
		}
		// A weight of fewer ranges than workers spreads over more workers
		// than it has ranges (not 32 of 132 workers running every block).
		spread := map[[2]int64]map[int]bool{}
		for r, ws := range readers {
			w := [2]int64{r.buf, r.offset}
			if blocks[r] < 2 {
				continue
			}
			if spread[w] == nil {
				spread[w] = map[int]bool{}
			}
			for k := range ws {
				spread[w][k] = true
			}
		}
		for w, ws := range spread {
			if decompose.AffinitySpread(ranges[w], int64(workers)) > 1 && int64(len(ws)) <= ranges[w] {
				t.Errorf("workers=%d: weight %v of %d row ranges runs on %d workers", workers, w, ranges[w], len(ws))
			}
		}
		for r, ws := range readers {
			if want := decompose.AffinitySpread(ranges[[2]int64{r.buf, r.offset}], int64(workers)); int64(len(ws)) > want {
				t.Errorf("workers=%d: weight rows %v are read on %d workers, want at most %d", workers, r, len(ws), want)
			}
		}
		even := (linears + workers - 1) / workers
		for w, n := range perWorker {
			if n > even+group {
				t.Errorf("workers=%d: worker %d runs %d Linear tasks, an even share is %d (blocks of %d)", workers, w, n, even, group)
			}
		}
	}
}

// TestArenaReuse: with arena_reuse, temporaries whose tasks the events order
// share arena bytes (package arena), and the validator accepts the result:
// a prompt chunk's arena shrinks to a fraction (each layer's activations
// take the bytes of the layer before); moving a temporary onto the bytes of
// another that a task of the same op accesses is refused (shared-arena).
func TestArenaReuse(t *testing.T) {
	for _, c := range []struct {
		file  string
		ratio int64 // at least this much smaller
	}{
		{"wide-llama-prefill320.json.zst", 4},
		{"scale/llama-3.2-1b-prefill64.json.zst", 10},
		{"qwen3-0.6b-decode.json.zst", 10},
		{"tiny-llama-decode.json", 2},
	} {
		arenas := map[bool]int64{}
		var shared *Compiled
		for _, reuse := range []bool{false, true} {
			req := loadRequest(t, c.file)
			req.Options.Target, req.Options.NumWorkers, req.Options.ArenaReuse = "cuda", 132, reuse
			comp, err := Compile(req)
			if err != nil {
				t.Fatalf("%s arena_reuse=%v: %v", c.file, reuse, err)
			}
			arenas[reuse] = comp.Tasks.ArenaBytes
			if reuse {
				shared = comp
			}
		}
		if arenas[true]*c.ratio > arenas[false] {
			t.Errorf("%s: arena %d bytes with reuse, %d without; want %dx smaller", c.file, arenas[true], arenas[false], c.ratio)
		}
		// Two temporaries one op's tasks access, the second moved onto the first.
		g := shared.Tasks
		var a, b int = -1, -1
		for _, task := range g.Tasks {
			var temps []int
			for _, set := range [2][]tgraph.Access{task.Reads, task.Writes} {
				for _, x := range set {
					if g.Buffers[x.Buf].InArena && !slices.Contains(temps, x.Buf) {
						temps = append(temps, x.Buf)
					}
				}
			}
			if len(temps) >= 2 && g.Buffers[temps[1]].Numel*g.Buffers[temps[1]].ElemBytes <= g.ArenaBytes {
				a, b = temps[0], temps[1]
				break
			}
		}
		if a < 0 {
			t.Fatalf("%s: no task accesses two temporaries", c.file)
		}
		g.Buffers[b].Arena = g.Buffers[a].Arena / g.Buffers[b].ElemBytes * g.Buffers[b].ElemBytes
		if end := g.Buffers[b].Arena + g.Buffers[b].Numel*g.Buffers[b].ElemBytes; end > g.ArenaBytes {
			g.Buffers[b].Arena -= end - g.ArenaBytes
		}
		var ve *validate.Error
		if err := validate.Check(g); !errors.As(err, &ve) || ve.Rule != "shared-arena" {
			t.Errorf("%s: bufs %s and %s moved onto one another's bytes: Check = %v, want rule shared-arena",
				c.file, g.Buffers[a].Name, g.Buffers[b].Name, err)
		}
	}
}
