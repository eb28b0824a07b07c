// The warps of a worker (one CTA of the megakernel): MPK_THREADS / 32
// consumer warps run the tasks; beside them a loader warp streams weights
// into the ring (runtime/ring.cuh), a signaller warp publishes the tasks
// the consumers finished, and a fetcher warp hands them the next task.
// Task code synchronises with consumer_sync, never __syncthreads: the other
// three warps run their own loops.
#pragma once
#include "runtime/abi_gen.cuh"

namespace mpk {

constexpr int kConsumerWarps = MPK_THREADS / 32;
constexpr int kLoaderWarp = kConsumerWarps;
constexpr int kSignalWarp = kConsumerWarps + 1;
constexpr int kFetchWarp = kConsumerWarps + 2;
constexpr int kWorkerThreads = MPK_THREADS + 96;

// consumer_sync is a barrier of the consumer warps only (named barrier 1).
__device__ __forceinline__ void consumer_sync() { asm volatile("bar.sync 1, %0;" ::"n"(MPK_THREADS) : "memory"); }

}  // namespace mpk
