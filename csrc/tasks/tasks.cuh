// The task library: one header per task family, each a device template that
// computes one tile [lo, hi) of an op described by the op table.
#pragma once
#include "tasks/attention.cuh"
#include "tasks/gemm.cuh"
#include "tasks/generic.cuh"
#include "tasks/linear.cuh"
#include "tasks/tiles.cuh"
#include "tasks/wgmma.cuh"
