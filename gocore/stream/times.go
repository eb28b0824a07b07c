package stream

// Estimated task times (ns) of weight streams, for a timed schedule
// (decompose.EstimateTimes, tgraph.Schedule) and the cuts made for it
// (lower's tailOverlapParts). A GEMM stream's rates are what the
// forty-third session's trace measured on the H200 (qwen3-8b's 64-token
// chunk: a pair's task, 1 MB, in 62.6 us, over 32 rows of x 52.2; q, k, v
// and the down projection's slices ~15 KB a us; o's 32-row streams 512 KB
// in 31 us); a decode stream's (a row or a few of x) ~26 bytes a ns, the
// H100's llama-3.2-1b pair.
const (
	StagingNs        = 2500 // a task's staging before its weights stream
	streamBytesPerNs = 25
)

var gemmBytesPerNs = map[[2]bool]float64{ // by (a pair's two weights, x of at most 32 rows)
	{true, false}: 17.8, {true, true}: 21.7, {false, false}: 15.4, {false, true}: 18.3,
}

// TaskNs is the estimated time of a task streaming `bytes` of weights (a
// pair's: both weights'): a GEMM stream's over `rows` rows of x, or (gemm
// false) a decode stream's.
func TaskNs(bytes int64, gemm, pair bool, rows int64) int64 {
	rate := float64(streamBytesPerNs)
	if gemm {
		rate = gemmBytesPerNs[[2]bool{pair, rows <= GemmMinRows}]
	}
	return StagingNs + int64(float64(bytes)/rate)
}
