package lower

import (
	"path/filepath"
	"strings"
	"testing"

	"mpk/gocore/ir"
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

func countKinds(g *ir.Graph) map[string]int {
	m := map[string]int{}
	for _, op := range g.Ops {
		m[op.Label]++
	}
	return m
}

func TestLowerRealModels(t *testing.T) {
	cases := []struct {
		file   string
		layers int
	}{
		{"tiny-llama-decode.json", 2},
		{"tiny-llama-prefill16.json", 2},
		{"tiny-qwen3-decode.json", 2},
		{"tiny-qwen3-prefill16.json", 2},
	}
	for _, c := range cases {
		t.Run(c.file, func(t *testing.T) {
			req := loadRequest(t, c.file)
			g, err := Lower(&req.Graph)
			if err != nil {
				t.Fatal(err)
			}
			if testing.Verbose() {
				t.Log("\n" + g.Dump())
			}
			k := countKinds(g)
			qwen := strings.Contains(c.file, "qwen3")
			// Every RMSNorm before a projection is folded into the Linears
			// that read it; Qwen3's per-head q/k norms into the RoPE after
			// them; k's RoPE into its KV-cache write (v's write stays).
			headNorms := 0
			if qwen {
				headNorms = c.layers
			}
			want := map[string]int{
				"rmsnorm":                  0,
				"rmsnorm+linear":           4*c.layers + 1, // q, k, v, gate; the LM head
				"rmsnorm+linear+silu_mul":  c.layers,       // up, storing SiLU(gate)·up
				"rmsnorm+rope":             headNorms,
				"rope":                     c.layers - headNorms,
				"rmsnorm+rope+kv_write":    headNorms,
				"rope+kv_write":            c.layers - headNorms,
				"attention":                c.layers,
				"kv_write":                 c.layers,
				"linear+residual":          2 * c.layers, // o_proj, down_proj
				"silu_mul+linear+residual": 0,
				"embedding":                1,
			}
			for label, n := range want {
				if k[label] != n {
					t.Errorf("%s: %d ops, want %d (all: %v)", label, k[label], n, k)
				}
			}
			for _, op := range g.Ops {
				if op.Kind == ir.Copy && op.Out.Buf.Kind == ir.Temp {
					t.Errorf("a copy into a temporary survived: op %d %v <- %v", op.ID, op.Out, op.In[0])
				}
				if op.Kind == ir.Attention && op.Attr.Groups != 2 {
					t.Errorf("attention op %d has %d groups, want 2 (GQA not recognised)", op.ID, op.Attr.Groups)
				}
			}
		})
	}
}
