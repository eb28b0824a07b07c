package refexec_test

import (
	"math/rand"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"unsafe"

	"mpk/gocore/compiler"
	"mpk/gocore/ir"
	"mpk/gocore/refexec"
	"mpk/gocore/wire"
)

// audited compiles a recorded request for the reference target, lets edit
// change its task graph, and runs it with the access audit on random inputs.
func audited(t *testing.T, path string, edit func(*compiler.Compiled)) (*compiler.Compiled, int, error) {
	return auditedWith(t, path, func(*wire.Options) {}, edit)
}

// auditedWith is audited with the request's options changed by opts first.
func auditedWith(t *testing.T, path string, opts func(*wire.Options), edit func(*compiler.Compiled)) (*compiler.Compiled, int, error) {
	t.Helper()
	c, n, _, err := auditedOutputs(t, path, opts, edit)
	return c, n, err
}

// auditedOutputs is auditedWith that also returns the graph's outputs.
func auditedOutputs(t *testing.T, path string, opts func(*wire.Options), edit func(*compiler.Compiled)) (*compiler.Compiled, int, [][]byte, error) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	req, derr := wire.DecodeRequest(data)
	if derr != nil {
		t.Fatal(derr)
	}
	req.Options.Target = "reference"
	opts(&req.Options)
	c, werr := compiler.Compile(req)
	if werr != nil {
		t.Fatal(werr)
	}
	if edit != nil {
		edit(c)
	}
	rng := rand.New(rand.NewSource(1))
	var mems [][]byte
	var ptrs []uintptr
	for _, b := range c.Ops.Inputs {
		m := make([]byte, b.Numel*b.DType.Size()+8)
		fill(m, b.DType, rng)
		mems, ptrs = append(mems, m), append(ptrs, uintptr(unsafe.Pointer(&m[0])))
	}
	for _, o := range c.Ops.Outputs {
		m := make([]byte, o.Buf.Numel*o.Buf.DType.Size()+8)
		mems, ptrs = append(mems, m), append(ptrs, uintptr(unsafe.Pointer(&m[0])))
	}
	n, err := refexec.RunAudited(c.Ops, c.Tasks, ptrs, 3)
	runtime.KeepAlive(mems)
	return c, n, mems[len(c.Ops.Inputs):], err
}

// TestAccessAudit runs every real lowering in testdata on the reference
// executor with the audit on: each element a task reads or writes must lie
// inside the accesses the task declares, which is all the validator knows
// of it. A decomposition whose declared accesses miss what its task really
// touches would let the validator accept a race; this catches it.
func TestAccessAudit(t *testing.T) {
	var files []string
	for _, pat := range []string{"*.json", "*.json.zst"} {
		m, _ := filepath.Glob(filepath.Join("..", "testdata", pat))
		files = append(files, m...)
	}
	if len(files) == 0 {
		t.Fatal("no real lowerings in testdata")
	}
	for _, f := range files {
		name := filepath.Base(f)
		if testing.Short() && strings.HasSuffix(name, ".zst") {
			continue // the big model: 20 s of float64 reference math
		}
		t.Run(name, func(t *testing.T) {
			c, n, err := audited(t, f, nil)
			if err != nil {
				t.Fatal(err)
			}
			if n != len(c.Tasks.Tasks) {
				t.Fatalf("ran %d of %d tasks", n, len(c.Tasks.Tasks))
			}
		})
	}
}

// TestAccessAuditCatchesAnUndeclaredAccess: with one task's declared reads
// (then writes) trimmed by an element, the audit reports it.
func TestAccessAuditCatchesAnUndeclaredAccess(t *testing.T) {
	path := filepath.Join("..", "testdata", "tiny-llama-decode.json")
	for _, write := range []bool{false, true} {
		victim := -1
		trim := func(c *compiler.Compiled) { // the first task with an access: its last interval loses an element
			for _, tk := range c.Tasks.Tasks {
				as := tk.Reads
				if write {
					as = tk.Writes
				}
				if tk.Op < 0 || len(as) == 0 {
					continue
				}
				a := &as[len(as)-1]
				a.Ivs[len(a.Ivs)-1].Hi--
				victim = tk.ID
				return
			}
		}
		_, _, err := audited(t, path, trim)
		verb := map[bool]string{false: "reads", true: "writes"}[write]
		if victim < 0 {
			t.Fatal("no task to trim")
		}
		if err == nil || !strings.Contains(err.Error(), "outside its declared "+verb) {
			t.Fatalf("trimmed the %s of task %d: the audit said %v", verb, victim, err)
		}
	}
}

// TestAccessAuditFreshRows: with fresh_rows, each decode attention reads the
// KV cache through Fresh accesses (nothing ordered against the step's cache
// writes, which run beside it); the audit checks that no element it reads
// so is written in the launch, on qwen3-0.6b (q/k norms, batch 1) and
// wide-llama (batch 3). Marking a read of what the launch writes Fresh (the
// o projection's read of the attention's partials) is caught.
func TestAccessAuditFreshRows(t *testing.T) {
	fresh := func(o *wire.Options) { o.FreshRows = true }
	for _, name := range []string{"qwen3-0.6b-decode.json.zst", "wide-llama-batch3-decode.json.zst"} {
		if testing.Short() {
			continue
		}
		t.Run(name, func(t *testing.T) {
			c, n, err := auditedWith(t, filepath.Join("..", "testdata", name), fresh, nil)
			if err != nil {
				t.Fatal(err)
			}
			if n != len(c.Tasks.Tasks) {
				t.Fatalf("ran %d of %d tasks", n, len(c.Tasks.Tasks))
			}
			folded := 0
			for _, op := range c.Ops.Ops {
				if op.Attr.Fresh != nil {
					folded++
				}
			}
			if folded == 0 {
				t.Fatal("no attention took the fresh rows")
			}
		})
	}
	path := filepath.Join("..", "testdata", "tiny-llama-decode.json")
	c, _, err := auditedWith(t, path, fresh, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, op := range c.Ops.Ops {
		if op.Attr.Fresh != nil { // head dim 16: a rotated pair spans two lanes
			t.Fatalf("tiny-llama's attention (head dim 16) took the fresh rows: op %d", op.ID)
		}
	}
	lie := func(c *compiler.Compiled) { // the o projection's read of the partials, marked Fresh
		for _, tk := range c.Tasks.Tasks {
			if tk.Op >= 0 && c.Ops.Ops[tk.Op].Attr.Pro != nil && c.Ops.Ops[tk.Op].Attr.Pro.Kind == ir.AttnMerge {
				tk.Reads[0].Fresh = true
			}
		}
	}
	if _, _, err := auditedWith(t, path, func(o *wire.Options) { o.NumWorkers = 132 }, lie); err == nil ||
		!strings.Contains(err.Error(), "read through a fresh-row access") {
		t.Fatalf("a Fresh read of the partials the attention writes: the audit said %v", err)
	}
}

// TestPairLinears: with pair_linears, each layer's gate projection folds
// into its up projection (one task streams both weights' rows and meets the
// products in its store); the audit checks the paired tasks' declared reads
// (the second weight's rows), and the step's outputs equal, bit for bit,
// those of the same graph with the gate its own op (qwen3-0.6b, batch 1).
func TestPairLinears(t *testing.T) {
	if testing.Short() {
		t.Skip("two runs of a real model's reference math")
	}
	path := filepath.Join("..", "testdata", "qwen3-0.6b-decode.json.zst")
	run := func(pair bool) (*compiler.Compiled, [][]byte) {
		c, n, outs, err := auditedOutputs(t, path, func(o *wire.Options) { o.FreshRows, o.PairLinears = true, pair }, nil)
		if err != nil {
			t.Fatal(err)
		}
		if n != len(c.Tasks.Tasks) {
			t.Fatalf("ran %d of %d tasks", n, len(c.Tasks.Tasks))
		}
		return c, outs
	}
	plain, want := run(false)
	paired, got := run(true)
	pairs := 0
	for _, op := range paired.Ops.Ops {
		if _, ok := op.PairWeight(); ok {
			pairs++
		}
	}
	if layers := 28; pairs != layers || len(paired.Ops.Ops) != len(plain.Ops.Ops)-layers {
		t.Fatalf("%d paired Linears, %d ops against %d unpaired: want one pair a layer", pairs, len(paired.Ops.Ops), len(plain.Ops.Ops))
	}
	for i := range want {
		if string(got[i]) != string(want[i]) {
			t.Fatalf("output %d differs with the pairs", i)
		}
	}
}
