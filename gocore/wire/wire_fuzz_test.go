package wire

import (
	"testing"
)

// FuzzDecodeRequest: DecodeRequest must never panic, whatever the bytes.
// Seeds: testdata/fuzz/FuzzDecodeRequest (a valid zstd request, JSON ones,
// a truncated frame) plus those below.
func FuzzDecodeRequest(f *testing.F) {
	req := &Request{Version: Version, Options: Options{Target: "reference", NumWorkers: 4},
		Graph: Graph{Nodes: []Node{{Name: "add", Target: "aten.add.Tensor"}}}}
	enc, err := EncodeRequest(req)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(enc)
	f.Add(enc[:len(enc)/2])
	f.Add([]byte(`{"version": 1, "graph": {"nodes": [{"name": "x", "args": [{"k": "list", "list": [{"k": "int", "i": 3}]}]}]}}`))
	f.Add([]byte(`{"version": 2}`))
	f.Add([]byte(`{"version": null, "graph": 7}`))
	f.Add([]byte(`{`))
	f.Add([]byte{0x28, 0xb5, 0x2f, 0xfd})
	f.Fuzz(func(t *testing.T, data []byte) {
		req, err := DecodeRequest(data)
		if err == nil && req == nil {
			t.Fatal("nil request without an error")
		}
		if err == nil && req.Version != Version {
			t.Fatalf("accepted version %d", req.Version)
		}
	})
}
