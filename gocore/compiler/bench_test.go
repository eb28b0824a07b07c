package compiler

import (
	"os"
	"testing"

	"mpk/gocore/wire"
)

// BenchmarkCompileRequest compiles the request in $MPK_BENCH_REQUEST (a real
// model's graph recorded with MPK_DUMP_REQUEST) and reports each pass.
func BenchmarkCompileRequest(b *testing.B) {
	path := os.Getenv("MPK_BENCH_REQUEST")
	if path == "" {
		b.Skip("set MPK_BENCH_REQUEST to a recorded request")
	}
	data, err := os.ReadFile(path)
	if err != nil {
		b.Fatal(err)
	}
	for i := 0; i < b.N; i++ {
		c, werr := CompileBytes(data)
		if werr != nil {
			b.Fatal(werr)
		}
		if i == 0 {
			for _, p := range c.Result.Summary.Passes {
				b.Logf("%-22s %8.1f ms", p.Name, p.Ms)
			}
		}
	}
	_ = wire.Version
}
