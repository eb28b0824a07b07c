// Command mpkdump prints the op graph the core lowers a recorded request to
// (MPK_DUMP_REQUEST=req.json writes one), one op a line, for debugging:
//
//	go run ./gocore/cmd/mpkdump req.json
package main

import (
	"fmt"
	"os"

	"mpk/gocore/lower"
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
	g, werr := lower.LowerWith(&req.Graph, lower.Config{Workers: req.Options.NumWorkers})
	if werr != nil {
		fmt.Fprintln(os.Stderr, werr)
		os.Exit(1)
	}
	fmt.Print(g.Dump())
}
