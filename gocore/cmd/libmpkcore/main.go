// Command libmpkcore is the C ABI of the Go core, built with
// `go build -buildmode=c-shared`. It holds only the //export functions: decode
// the request, call the compiler, encode the result. Every entry point turns a
// panic into an "internal" error result, because a panic in a c-shared library
// would kill the Python process.
//
// Ownership: every result buffer is allocated with C malloc and handed to the
// caller, who frees it with mpk_free. Compiled graphs stay in Go, named by a
// handle, until mpk_release.
package main

/*
#include <stdint.h>
#include <stdlib.h>
*/
import "C"

import (
	"fmt"
	"runtime/debug"
	"sync"
	"unsafe"

	json "github.com/goccy/go-json"

	"mpk/gocore/compiler"
	"mpk/gocore/wire"
)

var (
	mu       sync.Mutex
	nextID   int64 = 1
	compiled       = map[int64]*compiler.Compiled{}
)

func main() {}

// reply copies v as JSON into C memory for the caller.
func reply(v any, out **C.char, outLen *C.size_t) {
	data, err := json.Marshal(v)
	if err != nil {
		data = []byte(fmt.Sprintf(`{"ok":false,"error":{"kind":"internal","message":%q}}`, err.Error()))
	}
	*out = (*C.char)(C.CBytes(data))
	*outLen = C.size_t(len(data))
}

func internalError(r any) *wire.Error {
	return &wire.Error{Kind: "internal", Message: fmt.Sprintf("internal error in the mpk core: %v", r),
		Hint: "this is a bug in mpk; please report it with the stack below\n" + string(debug.Stack())}
}

// mpk_compile compiles a request and returns its handle (0 on failure). The
// result JSON (wire.CompileResult) is written to *out.
//
//export mpk_compile
func mpk_compile(req *C.char, reqLen C.size_t, out **C.char, outLen *C.size_t) (handle C.int64_t) {
	res := &wire.CompileResult{}
	defer func() {
		if r := recover(); r != nil {
			res = &wire.CompileResult{Error: internalError(r)}
			handle = 0
		}
		reply(res, out, outLen)
	}()
	data := C.GoBytes(unsafe.Pointer(req), C.int(reqLen))
	c, werr := compiler.CompileBytes(data)
	if werr != nil {
		res.Error = werr
		return 0
	}
	mu.Lock()
	id := nextID
	nextID++
	compiled[id] = c
	mu.Unlock()
	*res = *c.Result
	res.OK = true
	res.Handle = id
	return C.int64_t(id)
}

// mpk_run_reference executes a compiled graph with the CPU reference executor.
// ptrs holds the data pointers of the graph inputs in order, then of the
// outputs, laid out as the compile result's output specs say.
//
//export mpk_run_reference
func mpk_run_reference(handle C.int64_t, ptrs *C.uintptr_t, n C.int, seed C.int64_t, out **C.char, outLen *C.size_t) {
	res := &wire.RunResult{}
	defer func() {
		if r := recover(); r != nil {
			res = &wire.RunResult{Error: internalError(r)}
		}
		reply(res, out, outLen)
	}()
	mu.Lock()
	c := compiled[int64(handle)]
	mu.Unlock()
	if c == nil {
		res.Error = &wire.Error{Kind: "bad_request", Message: fmt.Sprintf("no compiled graph with handle %d (released?)", int64(handle))}
		return
	}
	addrs := make([]uintptr, int(n))
	if n > 0 {
		src := unsafe.Slice((*C.uintptr_t)(unsafe.Pointer(ptrs)), int(n))
		for i, p := range src {
			addrs[i] = uintptr(p)
		}
	}
	executed, ms, werr := c.RunReference(addrs, int64(seed))
	if werr != nil {
		res.Error = werr
		return
	}
	res.OK, res.Executed, res.Ms = true, executed, ms
}

// mpk_release frees a compiled graph.
//
//export mpk_release
func mpk_release(handle C.int64_t) {
	mu.Lock()
	delete(compiled, int64(handle))
	mu.Unlock()
}

// mpk_free frees a result buffer returned by any entry point.
//
//export mpk_free
func mpk_free(p unsafe.Pointer) {
	C.free(p)
}
