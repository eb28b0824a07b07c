package safety

import (
	"math/rand"
	"os"
	"strconv"
	"testing"
)

// TestSuiteFast runs a subset of the mutant suite: no oracle-unsafe graph may
// be accepted, and every unmutated graph must be accepted and oracle-safe.
func TestSuiteFast(t *testing.T) {
	n := 300
	if testing.Short() {
		n = 120
	}
	real, names := realGraphs(t)
	rep := SuiteNamed(n, 1, real, names)
	t.Log("\n" + rep.String())
	if rep.FalseAccepts != 0 {
		t.Errorf("%d false accepts", rep.FalseAccepts)
	}
	for _, c := range rep.Classes {
		if c.Class == "none" && (c.Rejected != 0 || c.Unsafe != 0) {
			t.Errorf("unmutated graphs: %d rejected, %d oracle-unsafe of %d", c.Rejected, c.Unsafe, c.Generated)
		}
		if c.Class != "none" && c.Class != "random-dag" && c.Unsafe == 0 {
			t.Errorf("class %s: the oracle found no unsafe mutant in %d", c.Class, c.Generated)
		}
	}
	if rep.RealAccepted != len(rep.Real) {
		t.Errorf("real lowerings accepted %d/%d", rep.RealAccepted, len(rep.Real))
	}
}

// TestGeneratedGraphsAreSafe checks the generator against both judges.
func TestGeneratedGraphsAreSafe(t *testing.T) {
	for i := range 200 {
		rng := rand.New(rand.NewSource(int64(i)))
		m, _ := makeMutant(rng, "none")
		if v := Oracle(m.g, OracleOptions{Seed: int64(i)}); v.Unsafe {
			t.Fatalf("seed %d: oracle: %s", i, v.Reason)
		}
		if err := check(m.g); err != nil {
			t.Fatalf("seed %d: %v", i, err)
		}
	}
}

// TestSuiteFull is the n=5000 run, on request: MPK_SUITE_N=5000 go test -run SuiteFull -v.
func TestSuiteFull(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("MPK_SUITE_N"))
	if n == 0 {
		t.Skip("set MPK_SUITE_N")
	}
	real, names := realGraphs(t)
	rep := SuiteNamed(n, 7, real, names)
	t.Log("\n" + rep.String())
	if rep.FalseAccepts != 0 || rep.RealAccepted != len(rep.Real) {
		t.Fail()
	}
}
