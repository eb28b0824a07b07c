package main

/*
#include <stdint.h>
#include <stdlib.h>
*/
import "C"

import (
	"fmt"
	"unsafe"

	json "github.com/goccy/go-json"

	"mpk/gocore/compiler"
	"mpk/gocore/safety"
	"mpk/gocore/tgraph"
	"mpk/gocore/wire"
)

// SuiteRequest is what mpk_validate_suite reads: real compile requests
// (each a wire request, zstd or JSON, base64 in JSON) to validate and mutate.
type SuiteRequest struct {
	Real []struct {
		Name string `json:"name"`
		Data []byte `json:"data"`
	} `json:"real"`
}

// SuiteResult answers mpk_validate_suite.
type SuiteResult struct {
	OK           bool        `json:"ok"`
	Error        *wire.Error `json:"error,omitempty"`
	Table        string      `json:"table"`
	Unsafe       int         `json:"unsafe"`
	Rejected     int         `json:"rejected"`
	FalseAccepts int         `json:"false_accepts"`
	FalseRejects int         `json:"false_rejects"`
	RealAccepted int         `json:"real_accepted"`
	RealTotal    int         `json:"real_total"`
}

// mpk_validate_suite runs the validator's adversarial mutant suite: n
// mutants from seed, plus the real requests in realReq (a SuiteRequest JSON
// document; may be empty). The result JSON (SuiteResult) is written to *out.
//
//export mpk_validate_suite
func mpk_validate_suite(n C.int64_t, seed C.int64_t, realReq *C.char, realLen C.size_t, out **C.char, outLen *C.size_t) {
	res := &SuiteResult{}
	defer func() {
		if r := recover(); r != nil {
			res = &SuiteResult{Error: internalError(r)}
		}
		reply(res, out, outLen)
	}()
	var sreq SuiteRequest
	if realLen > 0 {
		data := C.GoBytes(unsafe.Pointer(realReq), C.int(realLen))
		if err := json.Unmarshal(data, &sreq); err != nil {
			res.Error = &wire.Error{Kind: "bad_request", Message: fmt.Sprintf("validate-suite: malformed request: %v", err)}
			return
		}
	}
	var graphs []*tgraph.Graph
	var names []string
	var failed []safety.RealResult
	for _, r := range sreq.Real {
		c, werr := compiler.CompileBytes(r.Data)
		if werr != nil {
			failed = append(failed, safety.RealResult{Name: r.Name, Err: werr.Error()})
			continue
		}
		graphs = append(graphs, c.Tasks)
		names = append(names, r.Name)
	}
	rep := safety.SuiteNamed(int(n), int64(seed), graphs, names)
	rep.Real = append(rep.Real, failed...)
	*res = SuiteResult{OK: true, Table: rep.String(), Unsafe: rep.Unsafe, Rejected: rep.Rejected,
		FalseAccepts: rep.FalseAccepts, FalseRejects: rep.FalseRejects, RealAccepted: rep.RealAccepted, RealTotal: len(rep.Real)}
}
