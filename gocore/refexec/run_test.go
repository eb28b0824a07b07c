package refexec_test

import (
	"bytes"
	"math"
	"math/rand"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"unsafe"

	"mpk/gocore/compiler"
	"mpk/gocore/ir"
	"mpk/gocore/wire"
)

// fill writes deterministic values of dtype dt into b: small floats, zero
// integers (token 0, position 0: valid for every index), true booleans.
func fill(b []byte, dt ir.DType, rng *rand.Rand) {
	n := len(b) / int(dt.Size())
	for i := 0; i < n; i++ {
		p := unsafe.Pointer(&b[i*int(dt.Size())])
		switch dt {
		case ir.F32:
			*(*float32)(p) = float32(rng.Float64() - 0.5)
		case ir.F64:
			*(*float64)(p) = rng.Float64() - 0.5
		case ir.BF16:
			*(*uint16)(p) = uint16(math.Float32bits(float32(rng.Float64()-0.5)) >> 16)
		case ir.Bool:
			*(*uint8)(p) = 1
		}
	}
}

// TestRunIsOrderIndependent runs recorded models on the reference executor
// with 20 seeds (random interleavings of the workers' queues, and random
// orders the events alone allow): outputs and the in-place updated KV
// caches must be bit-identical, with temporaries sharing arena bytes
// (arena_reuse, as on the GPU) and without.
func TestRunIsOrderIndependent(t *testing.T) {
	for _, f := range []string{"tiny-llama-decode.json", "tiny-qwen3-prefill16.json"} {
		var first [][]byte // seed 0's result without arena reuse
		for _, c := range []struct {
			workers int
			reuse   bool
		}{{8, false}, {8, true}, {132, false}, {132, true}} {
			workers := c.workers
			data, err := os.ReadFile(filepath.Join("..", "testdata", f))
			if err != nil {
				t.Skipf("fixture %s: %v", f, err)
			}
			req, derr := wire.DecodeRequest(data)
			if derr != nil {
				t.Fatal(derr)
			}
			req.Options.Target, req.Options.NumWorkers, req.Options.ArenaReuse = "reference", workers, c.reuse
			c, werr := compiler.Compile(req)
			if werr != nil {
				t.Fatalf("%s: %v", f, werr)
			}
			rng := rand.New(rand.NewSource(1))
			init := make([][]byte, len(c.Ops.Inputs))
			for i, b := range c.Ops.Inputs {
				init[i] = make([]byte, b.Numel*b.DType.Size())
				fill(init[i], b.DType, rng)
			}
			for seed := int64(0); seed < 20; seed++ {
				var mems [][]byte
				var ptrs []uintptr
				for _, b := range init {
					m := append([]byte(nil), b...)
					mems = append(mems, m)
					ptrs = append(ptrs, uintptr(unsafe.Pointer(&m[0])))
				}
				for _, o := range c.Ops.Outputs {
					b := o.Buf
					m := make([]byte, b.Numel*b.DType.Size()+8)
					mems = append(mems, m)
					ptrs = append(ptrs, uintptr(unsafe.Pointer(&m[0])))
				}
				// Odd seeds ignore the workers' queues: any order the events
				// allow; even ones run the queues as the cuda runtime does.
				queues := c.Tasks.Queues
				if seed%2 == 1 {
					c.Tasks.Queues = nil
				}
				n, _, rerr := c.RunReference(ptrs, seed)
				c.Tasks.Queues = queues
				runtime.KeepAlive(mems)
				if rerr != nil {
					t.Fatalf("%s workers=%d seed %d: %v", f, workers, seed, rerr)
				}
				if n != len(c.Tasks.Tasks) {
					t.Fatalf("%s: ran %d of %d tasks", f, n, len(c.Tasks.Tasks))
				}
				if first == nil {
					first = mems
					out := mems[len(init)]
					if c.Ops.Outputs[0].DType() == ir.F32 {
						nonzero := false
						for i := 0; i+4 <= len(out)-8; i += 4 {
							v := *(*float32)(unsafe.Pointer(&out[i]))
							if v != v || math.IsInf(float64(v), 0) {
								t.Fatalf("%s: output element %d is %v", f, i/4, v)
							}
							nonzero = nonzero || v != 0
						}
						if !nonzero {
							t.Fatalf("%s: output is all zeros", f)
						}
					}
					continue
				}
				for i := range mems {
					if !bytes.Equal(mems[i], first[i]) {
						t.Errorf("%s workers=%d arena_reuse=%v: seed %d changed buffer %d (inputs then outputs) compared with seed 0 at 8 workers without reuse", f, workers, req.Options.ArenaReuse, seed, i)
					}
				}
			}
		}
	}
}
