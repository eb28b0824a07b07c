// Package compiler holds the pass table and Compile; it is the only package
// that knows the order of the passes.
package compiler

import (
	"fmt"
	"time"

	"mpk/gocore/ir"
	"mpk/gocore/tgraph"
	"mpk/gocore/wire"
)

// Compiled is a compiled graph: the op graph, the task graph, and what
// Python needs to call it.
type Compiled struct {
	Options wire.Options
	Ops     *ir.Graph
	Tasks   *tgraph.Graph
	Result  *wire.CompileResult

	preds [][]int       // task dependencies, between depend and fuse_events
	fused *tgraph.Fused // events before normalization
}

// CompileBytes decodes a wire request and compiles it.
func CompileBytes(data []byte) (*Compiled, *wire.Error) {
	start := time.Now()
	req, err := wire.DecodeRequest(data)
	if err != nil {
		return nil, &wire.Error{Kind: "bad_request", Message: err.Error()}
	}
	c, werr := Compile(req)
	if werr != nil {
		return nil, werr
	}
	c.Result.Summary.CoreMs = float64(time.Since(start).Microseconds()) / 1000
	return c, nil
}

// Compile runs the passes on a decoded request.
func Compile(req *wire.Request) (*Compiled, *wire.Error) {
	opts := req.Options
	if opts.Target == "" {
		opts.Target = "cuda"
	}
	if opts.Target != "cuda" && opts.Target != "reference" {
		return nil, &wire.Error{Kind: "bad_request", Message: fmt.Sprintf("unknown target %q (want \"cuda\" or \"reference\")", opts.Target)}
	}
	if opts.NumWorkers == 0 {
		opts.NumWorkers = 132
	}
	if opts.NumWorkers < 1 || opts.NumWorkers > tgraph.MaxWorkers {
		return nil, &wire.Error{Kind: "bad_request", Message: fmt.Sprintf("num_workers %d outside [1, %d]", opts.NumWorkers, tgraph.MaxWorkers)}
	}
	c := &Compiled{Options: opts, Result: &wire.CompileResult{Summary: &wire.Summary{}}}
	for _, p := range passes {
		t := time.Now()
		if err := p.fn(c, req); err != nil {
			return nil, err
		}
		c.Result.Summary.Passes = append(c.Result.Summary.Passes, wire.PassTime{Name: p.name, Ms: float64(time.Since(t).Microseconds()) / 1000})
	}
	return c, nil
}
