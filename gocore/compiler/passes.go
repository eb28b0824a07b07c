package compiler

import (
	"mpk/gocore/lower"
	"mpk/gocore/wire"
)

type pass struct {
	name string
	fn   func(c *Compiled, req *wire.Request) *wire.Error
}

// passes is the pipeline, in order.
var passes = []pass{
	{"lower", func(c *Compiled, req *wire.Request) *wire.Error {
		g, err := lower.Lower(&req.Graph)
		c.Ops = g
		return err
	}},
}
