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
			continue // the big model: minutes of float64 reference math
		}
		t.Run(name, func(t *testing.T) {
			data, err := os.ReadFile(f)
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
// (then writes) trimmed by an element, the audit reports that task.
func TestAccessAuditCatchesAnUndeclaredAccess(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "testdata", "tiny-llama-decode.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, write := range []bool{false, true} {
		req, derr := wire.DecodeRequest(data)
		if derr != nil {
			t.Fatal(derr)
		}
		req.Options.Target = "reference"
		c, werr := compiler.Compile(req)
		if werr != nil {
			t.Fatal(werr)
		}
		// The first task with an access to trim: its last interval loses its last element.
		victim := -1
		for i := range c.Tasks.Tasks {
			tk := c.Tasks.Tasks[i]
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
			break
		}
		if victim < 0 {
			t.Fatal("no task to trim")
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
		_, err := refexec.RunAudited(c.Ops, c.Tasks, ptrs, 3)
		runtime.KeepAlive(mems)
		verb := map[bool]string{false: "reads", true: "writes"}[write]
		if err == nil || !strings.Contains(err.Error(), "outside its declared "+verb) {
			t.Fatalf("trimmed %s of task %d: audit said %v", verb, victim, err)
		}
		if _, err := refexec.Run(c.Ops, c.Tasks, ptrs, 3); err != nil {
			t.Fatalf("without the audit the run should pass: %v", err)
		}
	}
}
