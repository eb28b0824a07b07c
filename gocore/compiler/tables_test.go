package compiler

import (
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"mpk/gocore/ir"
)

// table returns the integers of the C array initialiser `name[...] = {...};`.
func table(t *testing.T, src, name string) []int {
	t.Helper()
	re := regexp.MustCompile(`(?s)` + regexp.QuoteMeta(name) + `\[(\d+)\] = \{(.*?)\};`)
	m := re.FindStringSubmatch(src)
	if m == nil {
		t.Fatalf("module.cu has no table %s", name)
	}
	var out []int
	for _, f := range regexp.MustCompile(`-?\d+`).FindAllString(m[2], -1) {
		n, _ := strconv.Atoi(f)
		out = append(out, n)
	}
	return out
}

// streamFields is a row of the loader's table (mpk::Stream): slot, page
// bytes, offset, bytes, tile rows, row span, row bytes, column-major, pair
// slot, pair offset, kv j0, kv interleave, tensor map, the pair's, the
// task's first row in them, x's parts of K.
const streamFields = 16

func constant(t *testing.T, src, name string) int {
	t.Helper()
	m := regexp.MustCompile(`constexpr int ` + name + ` = (\d+);`).FindStringSubmatch(src)
	if m == nil {
		t.Fatalf("module.cu has no constant %s", name)
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// TestGeneratedTables checks the tables Generate writes for each recorded
// model against the task graph they came from: one row per task with its
// op, wait and trigger; queue_start delimiting each worker's queue; the
// queues a permutation of the tasks; event_needed per event.
func TestGeneratedTables(t *testing.T) {
	for _, f := range fixtures {
		for _, workers := range []int{3, 132} {
			req := loadRequest(t, f)
			req.Options.Target, req.Options.NumWorkers = "cuda", workers
			c, err := Compile(req)
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			src := c.Result.CUDA["module.cu"]
			tg := c.Tasks
			nt := len(tg.Tasks)
			if got := constant(t, src, "kNumTasks"); got != nt {
				t.Errorf("%s: kNumTasks %d, task graph has %d", f, got, nt)
			}
			if got := constant(t, src, "kNumEvents"); got != len(tg.Events) {
				t.Errorf("%s: kNumEvents %d, task graph has %d", f, got, len(tg.Events))
			}
			if got := constant(t, src, "kNumWorkers"); got != workers {
				t.Errorf("%s: kNumWorkers %d, want %d", f, got, workers)
			}
			if c.Result.Summary.Tasks != nt {
				t.Errorf("%s: summary says %d tasks, task graph has %d", f, c.Result.Summary.Tasks, nt)
			}
			rows := table(t, src, "mpk::Task tasks")
			if len(rows) != 5*nt {
				t.Fatalf("%s: tasks table has %d fields, want 5 per task (%d tasks)", f, len(rows), nt)
			}
			// A wait the runtime drops must be local: each producer of the
			// event earlier on the task's own worker. A trigger it drops must
			// be waited on by dropped waits only.
			producers, consumers := tg.Producers(), tg.Consumers()
			local := func(id int) bool {
				task := tg.Tasks[id]
				for _, p := range producers[task.Wait] {
					if p >= id || tg.Tasks[p].Worker != task.Worker {
						return false
					}
				}
				return len(producers[task.Wait]) > 0
			}
			dropped := 0
			for i, task := range tg.Tasks {
				r := rows[5*i : 5*i+5]
				waitOK := r[3] == task.Wait || r[3] == -1 && task.Wait != -1 && local(i)
				trigOK := r[4] == task.Trigger
				if r[4] == -1 && task.Trigger != -1 {
					trigOK = true
					for _, c := range consumers[task.Trigger] {
						trigOK = trigOK && local(c)
					}
				}
				if r[0] != task.Op || !waitOK || !trigOK || r[1] >= r[2] {
					t.Errorf("%s: task row %d = %v, task %+v", f, i, r, task)
					break
				}
				if r[3] != task.Wait {
					dropped++
				}
			}
			if got := c.Result.Summary.LocalWaits; got != dropped {
				t.Errorf("%s: summary says %d local waits, the tasks table drops %d", f, got, dropped)
			}
			if workers == 132 && strings.Contains(f, "decode") && dropped == 0 {
				t.Errorf("%s: no local wait dropped (the up projection's rows wait on gate's on one worker)", f)
			}
			starts := table(t, src, "queue_start")
			if len(starts) != workers+1 || starts[0] != 0 || starts[workers] != nt {
				t.Fatalf("%s: queue_start %v for %d workers and %d tasks", f, starts, workers, nt)
			}
			queue := table(t, src, "int32_t queue")
			if len(queue) != nt {
				t.Fatalf("%s: queue holds %d tasks, want %d", f, len(queue), nt)
			}
			for w := 0; w < workers; w++ {
				q := queue[starts[w]:starts[w+1]]
				if len(q) != len(tg.Queues[w]) {
					t.Errorf("%s: worker %d: queue_start gives %d tasks, schedule has %d", f, w, len(q), len(tg.Queues[w]))
					continue
				}
				for i, id := range q {
					if id != tg.Queues[w][i] || tg.Tasks[id].Worker != w {
						t.Errorf("%s: worker %d queue %v, schedule %v", f, w, q, tg.Queues[w])
						break
					}
				}
				if !sort.IntsAreSorted(q) {
					t.Errorf("%s: worker %d queue is not in linearized order", f, w)
				}
			}
			sorted := append([]int(nil), queue...)
			sort.Ints(sorted)
			for i, id := range sorted {
				if id != i {
					t.Fatalf("%s: queue is not a permutation of the tasks (position %d holds %d)", f, i, id)
				}
			}
			needed := table(t, src, "event_needed")
			if len(tg.Events) > 0 && len(needed) != len(tg.Events) {
				t.Fatalf("%s: event_needed has %d entries, %d events", f, len(needed), len(tg.Events))
			}
			for e, ev := range tg.Events {
				if needed[e] != ev.Needed {
					t.Errorf("%s: event_needed[%d] = %d, want %d", f, e, needed[e], ev.Needed)
					break
				}
			}
			if ops := strings.Count(src[strings.Index(src, "mpk::Op ops["):], "\n  /* "); ops != len(c.Ops.Ops) {
				t.Errorf("%s: %d op descriptors, %d ops", f, ops, len(c.Ops.Ops))
			}
		}
	}
}

func TestCompileRejectsOptions(t *testing.T) {
	cases := []struct {
		target  string
		workers int
		msg     string
	}{
		{"tpu", 8, `unknown target "tpu"`},
		{"reference", 1025, "num_workers 1025 outside [1, 1024]"},
		{"reference", -1, "num_workers -1 outside [1, 1024]"},
	}
	for _, c := range cases {
		req := loadRequest(t, fixtures[0])
		req.Options.Target, req.Options.NumWorkers = c.target, c.workers
		_, err := Compile(req)
		if err == nil || err.Kind != "bad_request" || !strings.Contains(err.Message, c.msg) {
			t.Errorf("target %q workers %d: err %v, want bad_request %q", c.target, c.workers, err, c.msg)
		}
	}
	if _, err := CompileBytes([]byte("not json")); err == nil || err.Kind != "bad_request" {
		t.Errorf("garbage request: err %v, want bad_request", err)
	}
}

// TestStreamTable checks the loader's table: every task of a streamed Linear
// (one whose weight is a model parameter) streams exactly its weight rows,
// and every other task streams nothing. At decode (qwen3-0.6b, batch 1) the
// pages hold whole rows; at batch 3 (wide-llama) they are tile pages of 8
// rows' segments (tasks/tiles.cuh), and each task's rows are whole groups
// of 8 but the op's last. (TestDefaultOptionsAtScale checks a GEMM stream's.)
// The kernel's loader and the task's consumers walk the same pages, so a
// mismatch here would hang or corrupt a launch.
func TestStreamTable(t *testing.T) {
	for _, c := range []struct {
		fixture    string
		kind       string
		pair       bool
		minStreams int
	}{
		// a layer: q, k and v share the workers (lower's shareSiblingWorkers),
		// then one task per worker for each of o, gate, up and down, or (with
		// pair_linears) of o, gate and up paired, and down
		{"qwen3-0.6b-decode.json.zst", "rows", false, 132 * 5 * 28},
		{"qwen3-0.6b-decode.json.zst", "rows", true, 132 * 4 * 28},
		{"wide-llama-batch3-decode.json.zst", "tiles", true, 2 * 7 * 8},
	} {
		req := loadRequest(t, c.fixture)
		req.Options.Target, req.Options.NumWorkers, req.Options.PairLinears = "cuda", 132, c.pair
		comp, err := Compile(req)
		if err != nil {
			t.Fatal(err)
		}
		// Every layer's gate and up pair where x sits in registers (batch 1), none at batch 3 (tiles).
		if paired := checkStreams(t, c.fixture, comp, c.kind, c.minStreams); (paired > 0) != (c.pair && c.kind == "rows") {
			t.Errorf("%s: %d paired tasks with pair_linears %v", c.fixture, paired, c.pair)
		}
	}
}

// checkStreams checks comp's loader table (TestStreamTable): its Linears
// stream pages of whole rows ("rows"), tile pages ("tiles") or GEMM pages
// ("gemm": 32 rows' segments of 256 columns, "wgmma": 64 rows' of 128, a block of columns
// at a time).
func checkStreams(t *testing.T, name string, comp *Compiled, kind string, minStreams int) (paired int) {
	t.Helper()
	src := comp.Result.CUDA["module.cu"]
	const F = streamFields
	rows := table(t, src, "mpk::Stream streams")
	const TF = 10 // a tensor map: slot, box rows, offset, 8-byte units a row, rows, row bytes, box units, column block units, swizzle, split x
	tmaps := table(t, src, "mpk::TmapSpec kTmaps")
	if len(rows) != F*len(comp.Tasks.Tasks) {
		t.Fatalf("%s: streams table has %d fields, want %d per task (%d tasks)", name, len(rows), F, len(comp.Tasks.Tasks))
	}
	if constant(t, src, "kSizedRingPages") < 4 {
		t.Fatalf("%s: kSizedRingPages %d: the ring is too small to stream", name, constant(t, src, "kSizedRingPages"))
	}
	streamed, paired := 0, 0
	// The weights read in bulk are what the call checks for 16-byte alignment.
	bulk := map[int]bool{}
	for _, k := range comp.Result.BulkInputs {
		bulk[k] = true
	}
	for i, task := range comp.Tasks.Tasks {
		r := rows[F*i : F*i+F]
		if task.Op < 0 || comp.Ops.Ops[task.Op].Kind != ir.Linear {
			if r[3] != 0 {
				t.Fatalf("%s: task %d (%s) streams %d bytes", name, i, comp.Tasks.Name(i), r[3])
			}
			continue
		}
		op := comp.Ops.Ops[task.Op]
		w := op.In[1]
		K := w.Shape[1]
		esz := w.DType().Size()
		n, stride := task.Box.Hi[1]-task.Box.Lo[1], w.Strides[0] // rows K wide, stride apart
		if r[0] != w.Buf.Index || int64(r[3]) != n*stride*esz || int64(r[2]) != (w.Offset+task.Box.Lo[1]*stride)*esz {
			t.Fatalf("%s: task %d (%s, rows %d of K %d): stream row %v", name, i, comp.Tasks.Name(i), n, K, r)
		}
		// A pair's second weight: the same rows of its own buffer.
		if w2, ok := op.PairWeight(); ok {
			if r[8] != w2.Buf.Index || int64(r[9]) != (w2.Offset+task.Box.Lo[1]*K)*esz || w2.Strides[0] != K {
				t.Fatalf("%s: task %d (%s): paired stream row %v", name, i, comp.Tasks.Name(i), r)
			}
		} else if r[8] != -1 || r[9] != 0 {
			t.Fatalf("%s: task %d (%s): unpaired stream row %v names a second weight", name, i, comp.Tasks.Name(i), r)
		}
		if r[8] >= 0 {
			paired++
		}
		if r[10] != -1 || r[11] != 0 {
			t.Fatalf("%s: task %d (%s): a Linear's weights cut to a live length (%d) or interleaved (%d)", name, i,
				comp.Tasks.Name(i), r[10], r[11])
		}
		if r[15] != 1 {
			t.Fatalf("%s: task %d (%s): x in %d parts without option tile_x_parts", name, i, comp.Tasks.Name(i), r[15])
		}
		if !bulk[r[0]] || r[8] >= 0 && !bulk[r[8]] {
			t.Fatalf("%s: task %d (%s) streams inputs %d and %d; bulk inputs %v", name, i, comp.Tasks.Name(i), r[0], r[8],
				comp.Result.BulkInputs)
		}

		// Tile and GEMM pages are boxes of a tensor map of the whole weight
		// (the loader's one copy a page); pages of whole rows have none.
		if (kind == "rows") != (r[12] == -1) || (r[13] >= 0) != (r[12] >= 0 && r[8] >= 0) {
			t.Fatalf("%s: task %d (%s): tensor maps %d and %d for %s pages", name, i, comp.Tasks.Name(i), r[12], r[13], kind)
		}
		if r[12] >= 0 {
			m := tmaps[TF*r[12] : TF*r[12]+TF]
			block, swizzle := 0, 0 // GEMM pages land in column blocks of 64 bytes, wgmma's of 128, swizzled
			if kind == "gemm" {
				block = 64 / 8
			}
			if kind == "wgmma" {
				block, swizzle = 128/8, 128
			}
			want := []int{r[0], r[4], int(w.Offset * esz), int(K * esz / 8), int(w.Shape[0]), int(stride * esz), r[1] / 8, block,
				swizzle, 0}
			if !slices.Equal(m, want) || r[14] != int(task.Box.Lo[1]) {
				t.Fatalf("%s: task %d (%s): tensor map %v (first row %d), want %v (first row %d)", name, i, comp.Tasks.Name(i),
					m, r[14], want, task.Box.Lo[1])
			}
		}

		switch kind {
		case "rows":
			if int64(r[1])%(K*esz) != 0 || r[1] > 16384 || r[4] != 0 || r[5] != 0 || r[7] != 0 || stride != K {
				t.Fatalf("%s: task %d (%s): want pages of whole rows, got %v", name, i, comp.Tasks.Name(i), r)
			}
		case "tiles":
			if r[4] != 8 || int64(r[5]) != K*esz || int64(r[6]) != stride*esz || int64(r[1])*8 > 16384 || (K*esz)%int64(r[1]) != 0 ||
				r[7] != 0 || (task.Box.Lo[1]%8 != 0) || (n%8 != 0 && task.Box.Hi[1] != op.Out.Shape[1]) {
				t.Fatalf("%s: task %d (%s, rows [%d, %d) of K %d): want tile pages of 8 segments, got %v", name, i,
					comp.Tasks.Name(i), task.Box.Lo[1], task.Box.Hi[1], K, r)
			}
		case "gemm": // pages of 32 rows' segments of 256 columns
			if r[4] != 32 || int64(r[5]) != K*esz || int64(r[6]) != stride*esz || r[1] != 256*int(esz) || r[7] != 32*int(esz) ||
				task.Box.Lo[1]%32 != 0 || n > 64 || (n%32 != 0 && task.Box.Hi[1] != op.Out.Shape[1]) {
				t.Fatalf("%s: task %d (%s, rows [%d, %d) of K %d): want GEMM pages of 32 segments, got %v", name, i,
					comp.Tasks.Name(i), task.Box.Lo[1], task.Box.Hi[1], K, r)
			}
		case "wgmma": // pages of 64 rows' segments of 128 columns (wgmma's n of 64)
			if r[4] != 64 || int64(r[5]) != K*esz || int64(r[6]) != stride*esz || r[1] != 128*int(esz) || r[7] != 128 ||
				task.Box.Lo[1]%32 != 0 || n > 64 || (n%32 != 0 && task.Box.Hi[1] != op.Out.Shape[1]) {
				t.Fatalf("%s: task %d (%s, rows [%d, %d) of K %d): want wgmma pages of 64 segments, got %v", name, i,
					comp.Tasks.Name(i), task.Box.Lo[1], task.Box.Hi[1], K, r)
			}
		}
		streamed++
	}
	if streamed < minStreams {
		t.Errorf("%s: %d streamed tasks, want at least %d", name, streamed, minStreams)
	}
	for k, template := range map[string]string{"tiles": "mpk::linear_tiles<", "gemm": "mpk::linear_gemm<",
		"wgmma": "mpk::linear_wgmma<"} {
		if (kind == k) != strings.Contains(src, template) {
			t.Errorf("%s: %s streams %v, want %v", name, k, !(kind == k), kind == k)
		}
	}
	return paired
}

// TestKVStreamTable: with kv_pages (small-llama: 2 KV heads of 2 query
// heads; over 300 cached tokens 3 chunks of 107 positions, and on 6 workers
// over a cache of 1,024 the long-cache layout's 3 chunks of 342, 3 pages
// each), each attention task is one chunk of one unit, and its loader row
// streams that chunk's K rows then its V rows from the caches, in pages of
// 128 rows; both caches are bulk inputs. The CUDA task (attention_kv_pages)
// reads the pages by the same arithmetic, so a mismatch here would hang or
// corrupt a launch.
func TestKVStreamTable(t *testing.T) {
	for _, f := range []string{"small-llama-kvpages-decode.json.zst", "small-llama-kvpages-long-decode.json.zst"} {
		t.Run(f, func(t *testing.T) { testKVStreamTable(t, f) })
	}
}

// TestKVStreamTableBatch: a batch's kv_pages lowering (small-llama, 4 rows
// over 300 cached tokens, 16 workers: kv_pages_batch, on by default) cuts
// each (row, KV head) into 2 chunks, one task each, whose loader row
// streams that row's chunk with K and V pages alternating (kv_interleave)
// and whole (no live cut: each row has its own extent). The CUDA task
// (attention_kv_pages, BATCH) takes the pages round by round by the same
// arithmetic, so a mismatch here would stall or corrupt a launch. With
// kv_swizzle a page is one box of the K (then V) cache's tensor map, from
// the chunk's first row in it, 128-byte swizzled.
func TestKVStreamTableBatch(t *testing.T) {
	for _, swizzle := range []bool{false, true} {
		t.Run(fmt.Sprintf("swizzle=%v", swizzle), func(t *testing.T) { testKVStreamTableBatch(t, swizzle) })
	}
}

func testKVStreamTableBatch(t *testing.T, swizzle bool) {
	req := loadRequest(t, "small-llama-kvpages-batch4-decode.json.zst")
	req.Options.KVSwizzle = swizzle
	comp, err := Compile(req)
	if err != nil {
		t.Fatal(err)
	}
	src := comp.Result.CUDA["module.cu"]
	const F = streamFields
	rows := table(t, src, "mpk::Stream streams")
	streamed := 0
	for i, task := range comp.Tasks.Tasks {
		if task.Op < 0 || comp.Ops.Ops[task.Op].Kind != ir.Attention {
			continue
		}
		op, r := comp.Ops.Ops[task.Op], rows[F*i:F*i+F]
		k, v, G, B := op.In[1], op.In[2], op.Attr.Groups, op.In[0].Shape[0]
		S, D, splits := k.Shape[2], k.Shape[3], op.Attr.Splits
		if B != 4 || splits != 2 || op.Attr.Interleave != splits || op.HeadsPerUnit() != G || !op.Attr.Paged {
			t.Fatalf("attention op %d: %d rows, %d splits, interleave %d, %d heads a unit of %d, paged %v; want 4, 2, 2, all, true",
				op.ID, B, splits, op.Attr.Interleave, op.HeadsPerUnit(), G, op.Attr.Paged)
		}
		// One chunk of one row's unit: box [B, splits, H, 1, D+2].
		b, sp, h0 := task.Box.Lo[0], task.Box.Lo[1], task.Box.Lo[2]
		if task.Box.Hi[0]-b != 1 || task.Box.Hi[1]-sp != 1 || task.Box.Hi[2]-h0 != G {
			t.Fatalf("task %d (%s): box %v-%v is not one chunk of one row's unit", i, comp.Tasks.Name(i), task.Box.Lo, task.Box.Hi)
		}
		chunk := (S + splits - 1) / splits
		kvh, j0 := h0/G, sp*chunk
		n := min(chunk, S-j0)
		at := func(x ir.View) int { return int((x.Offset + b*x.Strides[0] + kvh*x.Strides[1] + j0*x.Strides[2]) * 2) }
		want := []int{k.Buf.Index, 128 * int(D) * 2, at(k), int(n * D * 2), 0, 0, 0, 0, v.Buf.Index, at(v), -1, 1, -1, -1, 0, 1}
		if swizzle { // a row's bytes, the maps of K and V, the chunk's first row in them
			want[6], want[12], want[13] = int(D)*2, kvMapIndex(t, src, k, D), kvMapIndex(t, src, v, D)
			want[14] = int((k.Offset+b*k.Strides[0]+kvh*k.Strides[1])/D + j0)
		}
		if !slices.Equal(r, want) {
			t.Fatalf("task %d (%s, row %d, KV head %d, rows [%d, +%d)): stream row %v, want %v", i, comp.Tasks.Name(i), b, kvh,
				j0, n, r, want)
		}
		streamed++
	}
	if streamed != 2*4*2*2 { // 2 layers x 4 rows x 2 KV heads x 2 chunks
		t.Errorf("%d attention tasks stream their K and V, want 32", streamed)
	}
	if !strings.Contains(src, "mpk::attention_kv_pages<") || !strings.Contains(src, "mpk::kv_round_pairs(") {
		t.Error("no batch attention_kv_pages variant (with its round assert) in the module")
	}
	// Head dim 64: the rounds on the tensor cores (BATCH and MMA), swizzled or not.
	if !strings.Contains(src, fmt.Sprintf("kKVLive, true, true, %v>(op, lo, hi, s, c)", swizzle)) {
		t.Errorf("the batch attention_kv_pages variants do not fold on the tensor cores at head dim 64 (swizzled %v)", swizzle)
	}
}

// kvMapIndex is the index in the module's kTmaps of the swizzled kv map of
// cache x (its slot, rows of D elements, a box a page of 128 rows in
// 128-byte blocks, swizzled); it fails t when there is none.
func kvMapIndex(t *testing.T, src string, x ir.View, D int64) int {
	t.Helper()
	maps := table(t, src, "mpk::TmapSpec kTmaps")
	// {slot, box_rows, offset, cols, rows, row_bytes, box_cols, block_cols, swizzle, split_x}
	want := []int{x.Buf.Index, 128, -1, int(D * 2 / 8), int(x.Buf.Numel / D), int(D * 2), int(D * 2 / 8), 16, 128, 0}
	for i := 0; i+10 <= len(maps); i += 10 {
		m := slices.Clone(maps[i : i+10])
		m[2] = -1 // (the buffer's offset in its slot: 0 for a caller's cache)
		if slices.Equal(m, want) {
			return i / 10
		}
	}
	t.Fatalf("no swizzled kv map %v in kTmaps", want)
	return -1
}

func testKVStreamTable(t *testing.T, fixture string) {
	comp, err := Compile(loadRequest(t, fixture))
	if err != nil {
		t.Fatal(err)
	}
	src := comp.Result.CUDA["module.cu"]
	const F = streamFields
	rows := table(t, src, "mpk::Stream streams")
	bulk := map[int]bool{}
	for _, k := range comp.Result.BulkInputs {
		bulk[k] = true
	}
	streamed := 0
	for i, task := range comp.Tasks.Tasks {
		if task.Op < 0 || comp.Ops.Ops[task.Op].Kind != ir.Attention {
			continue
		}
		op, r := comp.Ops.Ops[task.Op], rows[F*i:F*i+F]
		k, v, G, ug := op.In[1], op.In[2], op.Attr.Groups, op.HeadsPerUnit()
		S, D, splits := k.Shape[2], k.Shape[3], op.Attr.Splits
		if op.Attr.Fresh == nil || splits != 3 || op.Attr.Interleave != splits || ug != 2 {
			t.Fatalf("attention op %d: fresh %v, %d splits, interleave %d, %d heads a unit; want fresh rows, 3, 3, 2",
				op.ID, op.Attr.Fresh != nil, splits, op.Attr.Interleave, ug)
		}
		// One chunk of one unit: box [B, splits, H, 1, D+2] over one split and ug heads.
		sp, h0 := task.Box.Lo[1], task.Box.Lo[2]
		if task.Box.Hi[1]-sp != 1 || task.Box.Hi[2]-h0 != ug {
			t.Fatalf("task %d (%s): box %v-%v is not one chunk of one unit", i, comp.Tasks.Name(i), task.Box.Lo, task.Box.Hi)
		}
		chunk := (S + splits - 1) / splits
		kvh, j0 := h0/G, sp*chunk
		n := min(chunk, S-j0)
		at := func(x ir.View) int { return int((x.Offset + kvh*x.Strides[1] + j0*x.Strides[2]) * 2) }
		// cut to the live length (every kv op reads one mask extent): the chunk's first position, a row's bytes
		want := []int{k.Buf.Index, 128 * int(D) * 2, at(k), int(n * D * 2), 0, 0, int(D) * 2, 0, v.Buf.Index, at(v), int(j0), 0, -1, -1, 0, 1}
		if !slices.Equal(r, want) {
			t.Fatalf("task %d (%s, KV head %d, rows [%d, +%d)): stream row %v, want %v", i, comp.Tasks.Name(i), kvh, j0, n, r, want)
		}
		if !bulk[k.Buf.Index] || !bulk[v.Buf.Index] {
			t.Fatalf("caches %d and %d not among the bulk inputs %v", k.Buf.Index, v.Buf.Index, comp.Result.BulkInputs)
		}
		streamed++
	}
	if streamed != 2*2*3 { // 2 layers x 2 units x 3 chunks
		t.Errorf("%d attention tasks stream their K and V, want 12", streamed)
	}
	if !strings.Contains(src, "mpk::attention_kv_pages<") {
		t.Error("no attention_kv_pages variant in the module")
	}
}

// TestSplitGemmXTables: with SplitGemmX a chunk's wgmma streams read their
// x split (DT_SPLIT_BF16 views, XS variants), each x view naming a tensor
// map of split_x boxes from its own first element: at most 64 rows, boxes of
// 32 or 64, rows and start on 64-element groups.
func TestSplitGemmXTables(t *testing.T) {
	req := loadRequest(t, "wide-llama-prefill320.json.zst")
	req.Options.Target, req.Options.NumWorkers = "cuda", 132
	req.Options.Gemm, req.Options.Wgmma, req.Options.SplitRows, req.Options.SplitGemmX = true, true, true, true
	comp, err := Compile(req)
	if err != nil {
		t.Fatal(err)
	}
	src := comp.Result.CUDA["module.cu"]
	if !regexp.MustCompile(`mpk::linear_wgmma<[^;]*, true>\(`).MatchString(src) {
		t.Fatal("no wgmma stream reads a split x")
	}
	const TF = 10
	tmaps := table(t, src, "mpk::TmapSpec kTmaps")
	// A view of the arena (the last slot: split buffers are temporaries):
	// slot, dtype, rank, tmap + 1, offset (elements).
	arena := constant(t, src, "kNumSlots") - 1
	views := regexp.MustCompile(`\{(`+strconv.Itoa(arena)+`), 10, 2, (\d+), (\d+),`).FindAllStringSubmatch(src, -1)
	read := 0
	for _, v := range views {
		tm, _ := strconv.Atoi(v[2])
		off, _ := strconv.Atoi(v[3])
		if tm == 0 { // a writer's view
			continue
		}
		read++
		m := tmaps[TF*(tm-1) : TF*tm]
		slot, _ := strconv.Atoi(v[1])
		box := 64
		if m[4] <= 32 {
			box = 32
		}
		if m[9] != 1 || m[0] != slot || m[2] != 4*off || off%64 != 0 || m[4] > 64 || m[1] != box || m[5]%256 != 0 ||
			m[8] != 128 {
			t.Errorf("split x view at element %d (slot %d): map %v", off, slot, m)
		}
	}
	if read == 0 {
		t.Fatal("no GEMM x view names its tensor map")
	}
}

// TestTileXParts: llama-3.2-1b at batch 8 (a recorded request, its default
// options). Its down projection's x (8 rows of 8,192, rounded: 132 KB) is the
// module's largest scratch and leaves the ring 5 pages. With option
// tile_x_parts its tasks (16 weight rows: two groups) stage x in two halves of
// K, their loader rows say so, no other task's do, and the ring grows to what
// the other tile streams leave.
func TestTileXParts(t *testing.T) {
	const F = streamFields
	build := func(parts bool) (string, *Compiled) {
		req := loadRequest(t, "scale/llama-3.2-1b-batch8-decode.json.zst")
		req.Options.TileXParts = parts
		comp, err := Compile(req)
		if err != nil {
			t.Fatal(err)
		}
		return comp.Result.CUDA["module.cu"], comp
	}
	whole, _ := build(false)
	src, comp := build(true)
	if got := constant(t, whole, "kSizedRingPages"); got != 5 {
		t.Fatalf("x whole: a ring of %d pages, want 5", got)
	}
	t.Logf("ring pages: x whole %d, in parts %d", constant(t, whole, "kSizedRingPages"), constant(t, src, "kSizedRingPages"))
	if got := constant(t, src, "kSizedRingPages"); got < 8 {
		t.Errorf("x in parts: a ring of %d pages, want at least 8", got)
	}
	if !strings.Contains(src, "mpk::linear_tiles<__nv_bfloat16, 8192, 8, false, kRingSlots, true, mpk::NoPro, mpk::NoEpi, 2>") {
		t.Error("the down projection's tile stream does not stage x in 2 parts")
	}
	rows := table(t, src, "mpk::Stream streams")
	parted := 0
	for i, task := range comp.Tasks.Tasks {
		r := rows[F*i : F*i+F]
		down := task.Op >= 0 && comp.Ops.Ops[task.Op].Kind == ir.Linear && comp.Ops.Ops[task.Op].LinearK() == 8192 &&
			comp.Ops.Ops[task.Op].Attr.Pro == nil
		switch {
		case down && r[15] != 2:
			t.Fatalf("task %d (%s): x in %d parts, want 2", i, comp.Tasks.Name(i), r[15])
		case !down && r[15] != 1:
			t.Fatalf("task %d (%s): x in %d parts, want 1", i, comp.Tasks.Name(i), r[15])
		}
		if down {
			parted++
		}
	}
	if parted == 0 {
		t.Error("no down projection task")
	}
}

// TestPairTiles: with pair_tiles, llama-3.2-1b's batch-8 gate and up tile
// streams pair (one op a layer fewer), each pair task's loader row naming
// the second weight (its slot, its tensor map where the first has one),
// x whole.
func TestPairTiles(t *testing.T) {
	const F = streamFields
	req := loadRequest(t, "scale/llama-3.2-1b-batch8-decode.json.zst")
	comp, err := Compile(req)
	if err != nil {
		t.Fatal(err)
	}
	req.Options.PairTiles = true
	paired, err := Compile(req)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(paired.Ops.Ops), len(comp.Ops.Ops)-16; got != want {
		t.Errorf("%d ops with pair_tiles, want %d (a gate a layer folded into its up projection)", got, want)
	}
	src := paired.Result.CUDA["module.cu"]
	if !strings.Contains(src, "mpk::linear_tiles<__nv_bfloat16, 2048, 8, true, kRingSlots, false, mpk::NormPro, mpk::PairEpi<") {
		t.Fatal("no paired tile stream in the module")
	}
	rows := table(t, src, "mpk::Stream streams")
	pairs := 0
	for i, task := range paired.Tasks.Tasks {
		if task.Op < 0 {
			continue
		}
		op := paired.Ops.Ops[task.Op]
		if op.Kind != ir.Linear || op.Attr.Epi == nil || op.Attr.Epi.Pair == 0 {
			continue
		}
		pairs++
		r := rows[F*i : F*i+F]
		if r[4] != 8 || r[8] < 0 || r[15] != 1 || r[12] >= 0 && r[13] < 0 {
			t.Fatalf("task %d (%s): tile rows %d, pair slot %d, x parts %d, tensor maps %d/%d; want 8, a slot, 1, both or none",
				i, paired.Tasks.Name(i), r[4], r[8], r[15], r[12], r[13])
		}
	}
	if pairs == 0 {
		t.Error("no pair task")
	}
}
