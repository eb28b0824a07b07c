package safety

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"mpk/gocore/compiler"
	"mpk/gocore/tgraph"
)

// realRequests lists the real compile requests the Python side saved.
func realRequests(t testing.TB) []string {
	var paths []string
	for _, pat := range []string{"*.json", "*.json.zst", "*.req.zst"} {
		m, _ := filepath.Glob(filepath.Join("..", "testdata", pat))
		paths = append(paths, m...)
	}
	return paths
}

// realGraphs compiles every saved real request (the compiler validates too;
// the suite checks again and mutates the graphs).
func realGraphs(t testing.TB) ([]*tgraph.Graph, []string) {
	var gs []*tgraph.Graph
	var names []string
	for _, p := range realRequests(t) {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		c, werr := compiler.CompileBytes(data)
		if werr != nil {
			t.Fatalf("%s: %v", p, werr)
		}
		gs = append(gs, c.Tasks)
		names = append(names, strings.TrimSuffix(strings.TrimSuffix(filepath.Base(p), ".json"), ".req.zst"))
	}
	return gs, names
}
