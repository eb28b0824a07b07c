// Command mpkdump prints the op graph the core lowers a recorded request to
// (MPK_DUMP_REQUEST=req.json writes one), one op a line, then how each
// Linear streams its weights, for debugging:
//
//	go run ./gocore/cmd/mpkdump req.json
package main

import (
	"fmt"
	"os"

	"mpk/gocore/ir"
	"mpk/gocore/lower"
	"mpk/gocore/stream"
	"mpk/gocore/wire"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: mpkdump REQUEST.json")
		os.Exit(2)
	}
	req, err := wire.ReadRequestFile(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	g, werr := lower.LowerWith(&req.Graph, lower.ConfigFor(req.Options))
	if werr != nil {
		fmt.Fprintln(os.Stderr, werr)
		os.Exit(1)
	}
	fmt.Print(g.Dump())
	written := stream.Writers(g)
	for _, op := range g.Ops {
		if op.Kind != ir.Linear {
			continue
		}
		if p, ok := stream.For(op, written); ok {
			fmt.Printf("stream %3d %s: %+v\n", op.ID, op.Label, p)
		} else {
			fmt.Printf("stream %3d %s: none (M %d, K %d, x %s, w %s)\n", op.ID, op.Label, op.Out.Shape[0], op.LinearK(),
				op.LinearX(), op.In[1].DType())
		}
	}
}
