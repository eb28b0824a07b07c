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
	"mpk/gocore/refexec"
	"mpk/gocore/wire"
)

// audited compiles a recorded request for the reference target, lets edit
// change its task graph, and runs it with the access audit on random inputs.
func audited(t *testing.T, path string, edit func(*compiler.Compiled)) (*compiler.Compiled, int, error) {
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
	return c, n, err
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
