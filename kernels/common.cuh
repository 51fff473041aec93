// Helpers shared by erlcuda's kernels. Every kernel file includes this; the include guard
// keeps it safe to concatenate sources.
#ifndef ERLCUDA_COMMON_CUH
#define ERLCUDA_COMMON_CUH

#include <stdint.h>

namespace erlcuda {

// Threads per block for the 1-D kernels (vector_add, reductions). The host uses the same
// number (cuda.py: BLOCK_1D); block_sum below relies on it being a multiple of 32.
constexpr int kBlock1D = 256;
constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ bool aligned16(const void* p) {
    return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

// First thread index of this thread in a 1-D grid-stride loop, and the stride, as 64-bit
// values so that loops over more than 2^31 elements cannot overflow.
__device__ __forceinline__ long long global_thread() {
    return static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ long long grid_threads() {
    return static_cast<long long>(gridDim.x) * blockDim.x;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        v += __shfl_down_sync(kFullMask, v, offset);
    }
    return v;
}

// Sum of v over the whole block; the result is valid in thread 0 only. Every thread of the
// block must call it (it synchronises). blockDim.x must be a multiple of 32 and <= 1024.
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float warp_totals[32];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int warps = blockDim.x >> 5;

    v = warp_sum(v);
    if (lane == 0) {
        warp_totals[warp] = v;
    }
    __syncthreads();
    if (warp == 0) {
        v = lane < warps ? warp_totals[lane] : 0.0f;
        v = warp_sum(v);
    }
    return v;
}

}  // namespace erlcuda

#endif  // ERLCUDA_COMMON_CUH
