// Sum (reduce) and dot product of f32 vectors, sharing one implementation: term i is x[i]
// (DOT = false) or x[i] * y[i] (DOT = true).
//
// Two shapes:
//   * one big vector, two passes: {reduce,dot}_partial writes one partial sum per block
//     (the host launches about SMs x 8 blocks), then reduce_final adds the partials in one
//     block;
//   * a batch of small vectors: {reduce,dot}_segments, one block per segment.
// Every f32 sum is accumulated in f32: each thread sums a strided slice into eight
// independent accumulators, then the block and the partials are added as trees, which keeps
// the rounding error far below that of one long sequential sum.
//
// f64 vectors have the two-pass shape only ({reduce,dot}_partial_f64, reduce_final_f64),
// accumulated in f64 the same way (four accumulators per thread, then trees).
#include "common.cuh"

namespace erlcuda_reduce {

template <bool DOT>
__device__ __forceinline__ float term(const float* __restrict__ x, const float* __restrict__ y,
                                      long long i) {
    return DOT ? x[i] * y[i] : x[i];
}

template <bool DOT>
__device__ __forceinline__ void accumulate4(float4& s, const float4 a, const float4* __restrict__ y4,
                                            long long i) {
    if (DOT) {
        const float4 b = y4[i];
        s.x = fmaf(a.x, b.x, s.x);
        s.y = fmaf(a.y, b.y, s.y);
        s.z = fmaf(a.z, b.z, s.z);
        s.w = fmaf(a.w, b.w, s.w);
    } else {
        s.x += a.x;
        s.y += a.y;
        s.z += a.z;
        s.w += a.w;
    }
}

// This thread's share of terms 0..n-1: the terms first, first + stride, first + 2*stride, ...
// in the vectorised body and in the scalar head and tail. x (and y) may start anywhere: a
// scalar head of up to three terms brings x to a 16-byte boundary, then the body reads
// float4s. The body needs y on the same boundary, so when x and y are misaligned
// differently everything is read as scalars (the host never does that; it stays correct).
template <bool DOT>
__device__ float thread_sum(const float* __restrict__ x, const float* __restrict__ y,
                            long long n, long long first, long long stride) {
    const uintptr_t xmis = reinterpret_cast<uintptr_t>(x) & 15u;
    const bool same_mis = !DOT || (reinterpret_cast<uintptr_t>(y) & 15u) == xmis;
    if ((xmis & 3u) != 0 || !same_mis) {
        float acc = 0.0f;
        for (long long i = first; i < n; i += stride) {
            acc += term<DOT>(x, y, i);
        }
        return acc;
    }

    long long head = static_cast<long long>(((16u - xmis) & 15u) >> 2);
    if (head > n) {
        head = n;
    }
    float acc = 0.0f;
    for (long long i = first; i < head; i += stride) {
        acc += term<DOT>(x, y, i);
    }

    const float4* __restrict__ x4 = reinterpret_cast<const float4*>(x + head);
    const float4* __restrict__ y4 = DOT ? reinterpret_cast<const float4*>(y + head) : nullptr;
    const long long n4 = (n - head) >> 2;
    float4 s0 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float4 s1 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    long long i = first;
    // Two float4 loads (four for dot) in flight per iteration.
    for (; i + stride < n4; i += 2 * stride) {
        const float4 a0 = x4[i];
        const float4 a1 = x4[i + stride];
        accumulate4<DOT>(s0, a0, y4, i);
        accumulate4<DOT>(s1, a1, y4, i + stride);
    }
    if (i < n4) {
        accumulate4<DOT>(s0, x4[i], y4, i);
    }

    for (long long j = head + (n4 << 2) + first; j < n; j += stride) {
        acc += term<DOT>(x, y, j);
    }
    return acc + (((s0.x + s1.x) + (s0.y + s1.y)) + ((s0.z + s1.z) + (s0.w + s1.w)));
}

template <bool DOT>
__device__ __forceinline__ void partial(const float* __restrict__ x, const float* __restrict__ y,
                                        long long n, float* __restrict__ partials) {
    float v = thread_sum<DOT>(x, y, n, erlcuda::global_thread(), erlcuda::grid_threads());
    v = erlcuda::block_sum(v);
    if (threadIdx.x == 0) {
        partials[blockIdx.x] = v;
    }
}

template <bool DOT>
__device__ __forceinline__ void segments(const float* __restrict__ x, const float* __restrict__ y,
                                         const long long* __restrict__ offsets, int nseg,
                                         float* __restrict__ out) {
    const int s = blockIdx.x;
    if (s >= nseg) {
        return;  // whole block: block_sum below is never reached by part of a block
    }
    const long long begin = offsets[s];
    const long long n = offsets[s + 1] - begin;
    float v = thread_sum<DOT>(x + begin, DOT ? y + begin : nullptr, n, threadIdx.x, blockDim.x);
    v = erlcuda::block_sum(v);
    if (threadIdx.x == 0) {
        out[s] = v;
    }
}

}  // namespace erlcuda_reduce

// Pass 1 for one vector of n terms: partials[blockIdx.x] = this block's share. y is unused
// by reduce_partial (the host passes x again).
extern "C" __global__ void __launch_bounds__(erlcuda::kBlock1D)
reduce_partial(const float* __restrict__ x, const float* __restrict__ y, long long n,
               float* __restrict__ partials) {
    erlcuda_reduce::partial<false>(x, y, n, partials);
}

extern "C" __global__ void __launch_bounds__(erlcuda::kBlock1D)
dot_partial(const float* __restrict__ x, const float* __restrict__ y, long long n,
            float* __restrict__ partials) {
    erlcuda_reduce::partial<true>(x, y, n, partials);
}

// Pass 2, one block: *out = sum of partials[0..count-1] (0.0f when count == 0).
extern "C" __global__ void __launch_bounds__(erlcuda::kBlock1D)
reduce_final(const float* __restrict__ partials, int count, float* __restrict__ out) {
    float v = 0.0f;
    for (int i = threadIdx.x; i < count; i += blockDim.x) {
        v += partials[i];
    }
    v = erlcuda::block_sum(v);
    if (threadIdx.x == 0) {
        *out = v;
    }
}

// One block per segment s: out[s] = sum of terms offsets[s]..offsets[s+1]-1 (0.0f when the
// segment is empty). offsets has nseg + 1 entries. y is unused by reduce_segments.
extern "C" __global__ void __launch_bounds__(erlcuda::kBlock1D)
reduce_segments(const float* __restrict__ x, const float* __restrict__ y,
                const long long* __restrict__ offsets, int nseg, float* __restrict__ out) {
    erlcuda_reduce::segments<false>(x, y, offsets, nseg, out);
}

extern "C" __global__ void __launch_bounds__(erlcuda::kBlock1D)
dot_segments(const float* __restrict__ x, const float* __restrict__ y,
             const long long* __restrict__ offsets, int nseg, float* __restrict__ out) {
    erlcuda_reduce::segments<true>(x, y, offsets, nseg, out);
}

// -- f64 ------------------------------------------------------------------------------------

namespace erlcuda_reduce {

__device__ __forceinline__ double warp_sum_f64(double v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        v += __shfl_down_sync(erlcuda::kFullMask, v, offset);
    }
    return v;
}

// erlcuda::block_sum for doubles: valid in thread 0 only; every thread of the block calls it.
__device__ __forceinline__ double block_sum_f64(double v) {
    __shared__ double warp_totals[32];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int warps = blockDim.x >> 5;

    v = warp_sum_f64(v);
    if (lane == 0) {
        warp_totals[warp] = v;
    }
    __syncthreads();
    if (warp == 0) {
        v = lane < warps ? warp_totals[lane] : 0.0;
        v = warp_sum_f64(v);
    }
    return v;
}

// This thread's share of terms first, first + stride, ... below n: four loads in flight.
template <bool DOT>
__device__ __forceinline__ double thread_sum_f64(const double* __restrict__ x,
                                                 const double* __restrict__ y, long long n,
                                                 long long first, long long stride) {
    double s0 = 0.0;
    double s1 = 0.0;
    double s2 = 0.0;
    double s3 = 0.0;
    long long i = first;
    for (; i + 3 * stride < n; i += 4 * stride) {
        if (DOT) {
            s0 = fma(x[i], y[i], s0);
            s1 = fma(x[i + stride], y[i + stride], s1);
            s2 = fma(x[i + 2 * stride], y[i + 2 * stride], s2);
            s3 = fma(x[i + 3 * stride], y[i + 3 * stride], s3);
        } else {
            s0 += x[i];
            s1 += x[i + stride];
            s2 += x[i + 2 * stride];
            s3 += x[i + 3 * stride];
        }
    }
    for (; i < n; i += stride) {
        s0 = DOT ? fma(x[i], y[i], s0) : s0 + x[i];
    }
    return (s0 + s1) + (s2 + s3);
}

template <bool DOT>
__device__ __forceinline__ void partial_f64(const double* __restrict__ x,
                                            const double* __restrict__ y, long long n,
                                            double* __restrict__ partials) {
    double v = thread_sum_f64<DOT>(x, y, n, erlcuda::global_thread(), erlcuda::grid_threads());
    v = block_sum_f64(v);
    if (threadIdx.x == 0) {
        partials[blockIdx.x] = v;
    }
}

}  // namespace erlcuda_reduce

// Pass 1 for one f64 vector of n terms: partials[blockIdx.x] = this block's share. y is
// unused by reduce_partial_f64.
extern "C" __global__ void __launch_bounds__(erlcuda::kBlock1D)
reduce_partial_f64(const double* __restrict__ x, const double* __restrict__ y, long long n,
                   double* __restrict__ partials) {
    erlcuda_reduce::partial_f64<false>(x, y, n, partials);
}

extern "C" __global__ void __launch_bounds__(erlcuda::kBlock1D)
dot_partial_f64(const double* __restrict__ x, const double* __restrict__ y, long long n,
                double* __restrict__ partials) {
    erlcuda_reduce::partial_f64<true>(x, y, n, partials);
}

// Pass 2, one block: *out = sum of partials[0..count-1] (0.0 when count == 0).
extern "C" __global__ void __launch_bounds__(erlcuda::kBlock1D)
reduce_final_f64(const double* __restrict__ partials, int count, double* __restrict__ out) {
    double v = 0.0;
    for (int i = threadIdx.x; i < count; i += blockDim.x) {
        v += partials[i];
    }
    v = erlcuda_reduce::block_sum_f64(v);
    if (threadIdx.x == 0) {
        *out = v;
    }
}
