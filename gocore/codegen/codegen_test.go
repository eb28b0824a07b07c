package codegen

import (
	"os"
	"path/filepath"
	"testing"
)

// TestABIHeaderUpToDate fails when csrc/runtime/abi_gen.cuh drifts from the
// definitions in abi.go; UPDATE_GOLDEN=1 rewrites it.
func TestABIHeaderUpToDate(t *testing.T) {
	path := filepath.Join("..", "..", "csrc", "runtime", "abi_gen.cuh")
	want := ABIHeader()
	if os.Getenv("UPDATE_GOLDEN") != "" {
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Fatalf("%s is out of date with gocore/codegen/abi.go; run UPDATE_GOLDEN=1 go test ./gocore/codegen and review the diff", path)
	}
}
