package safety

import (
	"errors"
	"fmt"
	"math/rand"
	"strings"

	"mpk/gocore/tgraph"
	"mpk/gocore/validate"
)

// ClassStats counts one fault class. Rejected counts every rejected graph;
// FalseAccepts are oracle-unsafe graphs the validator accepted, FalseRejects
// oracle-safe graphs it rejected (a fault that happened to be harmless, or a
// rule stricter than the oracle, like Needed == producers).
type ClassStats struct {
	Class                                                   string
	Generated, Unsafe, Rejected, FalseAccepts, FalseRejects int
	Rules                                                   map[string]int // rule → rejections
}

// RealResult is one real lowering run through the validator.
type RealResult struct {
	Name     string
	Tasks    int
	Accepted bool
	Err      string
}

// Report is the suite's outcome.
type Report struct {
	Classes []ClassStats
	Real    []RealResult
	// Totals over all mutants. Rejected counts oracle-unsafe graphs that were
	// rejected, so Unsafe == Rejected + FalseAccepts.
	Unsafe, Rejected, FalseAccepts, FalseRejects int
	RealAccepted                                 int
	Examples                                     []string // a few false accepts, for debugging
}

// Suite generates n mutants (classes in turn, seeded), labels each with the
// oracle and runs the validator on it; real graphs are validated as they are
// and must be accepted, and also mutated (a read moved before its writer).
func Suite(n int, seed int64, real []*tgraph.Graph) Report {
	return SuiteNamed(n, seed, real, nil)
}

// SuiteNamed is Suite with names for the real graphs.
func SuiteNamed(n int, seed int64, real []*tgraph.Graph, names []string) Report {
	var rep Report
	stats := map[string]*ClassStats{}
	for _, c := range append(append([]string{}, Classes...), "real-read-before-writer") {
		stats[c] = &ClassStats{Class: c, Rules: map[string]int{}}
	}
	tally := func(m mutant, runs int, oseed int64) {
		s := stats[m.class]
		s.Generated++
		v := Oracle(m.g, OracleOptions{Runs: runs, Seed: oseed, Suspects: m.suspects})
		err := check(m.g)
		rejected := err != nil
		var ve *validate.Error
		if errors.As(err, &ve) {
			s.Rules[ve.Rule]++
		}
		if rejected {
			s.Rejected++
		}
		if v.Unsafe {
			s.Unsafe++
			rep.Unsafe++
			if rejected {
				rep.Rejected++
			} else {
				s.FalseAccepts++
				rep.FalseAccepts++
				if len(rep.Examples) < 5 {
					rep.Examples = append(rep.Examples, fmt.Sprintf("%s (oracle seed %d): %s", m.class, oseed, v.Reason))
				}
			}
		} else if rejected {
			s.FalseRejects++
			rep.FalseRejects++
		}
	}
	for i := 0; i < n; i++ {
		class := Classes[i%len(Classes)]
		mseed := seed*1_000_003 + int64(i)
		rng := rand.New(rand.NewSource(mseed))
		var m mutant
		for try := 0; ; try++ {
			var ok bool
			if m, ok = makeMutant(rng, class); ok {
				break
			}
		}
		tally(m, 16, mseed)
	}
	for i, g := range real {
		name := fmt.Sprintf("real%d", i)
		if i < len(names) {
			name = names[i]
		}
		r := RealResult{Name: name, Tasks: len(g.Tasks), Accepted: true}
		if err := check(g); err != nil {
			r.Accepted, r.Err = false, err.Error()
		} else {
			rep.RealAccepted++
		}
		rep.Real = append(rep.Real, r)
		rng := rand.New(rand.NewSource(seed + int64(i)))
		for k := 0; k < 4 && r.Accepted; k++ {
			if m, ok := realMutant(rng, g); ok {
				tally(m, 4, seed+int64(k))
			}
		}
	}
	for _, c := range append(append([]string{}, Classes...), "real-read-before-writer") {
		if s := stats[c]; s.Generated > 0 {
			rep.Classes = append(rep.Classes, *s)
		}
	}
	return rep
}

// check runs the validator, turning a panic into a rejection that names it
// (the suite must finish to report it).
func check(g *tgraph.Graph) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("validate panicked: %v", r)
		}
	}()
	return validate.Check(g)
}

// String prints the table and the summary line.
func (r Report) String() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "%-24s %9s %7s %8s %12s %13s  %s\n", "class", "generated", "unsafe", "rejected", "false_accept", "false_reject", "rules")
	for _, s := range r.Classes {
		fmt.Fprintf(&sb, "%-24s %9d %7d %8d %12d %13d  %s\n", s.Class, s.Generated, s.Unsafe, s.Rejected, s.FalseAccepts, s.FalseRejects, ruleString(s.Rules))
	}
	for _, x := range r.Real {
		verdict := "accepted"
		if !x.Accepted {
			verdict = "REJECTED: " + x.Err
		}
		fmt.Fprintf(&sb, "real %-19s %6d tasks  %s\n", x.Name, x.Tasks, verdict)
	}
	for _, e := range r.Examples {
		fmt.Fprintf(&sb, "false accept: %s\n", e)
	}
	fmt.Fprintf(&sb, "validate-suite: unsafe=%d rejected=%d false_accepts=%d real_accepted=%d/%d",
		r.Unsafe, r.Rejected, r.FalseAccepts, r.RealAccepted, len(r.Real))
	return sb.String()
}

func ruleString(m map[string]int) string {
	var parts []string
	for _, rule := range validate.Rules {
		if n := m[rule]; n > 0 {
			parts = append(parts, fmt.Sprintf("%s:%d", rule, n))
		}
	}
	if n := m[""]; n > 0 {
		parts = append(parts, fmt.Sprintf("other:%d", n))
	}
	return strings.Join(parts, " ")
}
