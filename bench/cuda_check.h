// CK: a CUDA runtime call in the bench programs, exiting with the call and
// its error on failure; CK_DRIVER the same for a driver call (the tensor-map
// encoder); copy_bandwidth: the device copy rate they compare with.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      exit(1);                                                                             \
    }                                                                                      \
  } while (0)

#define CK_DRIVER(x)                                                           \
  do {                                                                         \
    const CUresult r_ = (x);                                                   \
    if (r_ != CUDA_SUCCESS) {                                                  \
      fprintf(stderr, "%s:%d: %s: CUresult %d\n", __FILE__, __LINE__, #x, (int)r_); \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

// copy_bandwidth is the device's copy rate (bytes read + written per second)
// over 10 copies of 1 GiB, measured in the caller's run.
inline double copy_bandwidth() {
  const size_t n = 1ull << 30;
  void *a, *b;
  CK(cudaMalloc(&a, n));
  CK(cudaMalloc(&b, n));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int i = 0; i < 3; ++i) CK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice));
  CK(cudaEventRecord(e0));
  for (int i = 0; i < 10; ++i) CK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice));
  CK(cudaEventRecord(e1));
  CK(cudaEventSynchronize(e1));
  float ms;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  CK(cudaFree(a));
  CK(cudaFree(b));
  return 2.0 * n * 10 / (ms / 1e3);
}
