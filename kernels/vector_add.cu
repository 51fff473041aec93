// c = a + b over n f32 elements.
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(erlcuda::kBlock1D)
vector_add(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ c,
           long long n) {
    const long long first = erlcuda::global_thread();
    const long long stride = erlcuda::grid_threads();

    if (erlcuda::aligned16(a) && erlcuda::aligned16(b) && erlcuda::aligned16(c)) {
        const long long n4 = n >> 2;
        const float4* __restrict__ a4 = reinterpret_cast<const float4*>(a);
        const float4* __restrict__ b4 = reinterpret_cast<const float4*>(b);
        float4* __restrict__ c4 = reinterpret_cast<float4*>(c);
        for (long long i = first; i < n4; i += stride) {
            const float4 x = a4[i];
            const float4 y = b4[i];
            c4[i] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
        }
        // The last n % 4 elements, at most three.
        for (long long i = (n4 << 2) + first; i < n; i += stride) {
            c[i] = a[i] + b[i];
        }
    } else {
        for (long long i = first; i < n; i += stride) {
            c[i] = a[i] + b[i];
        }
    }
}

// c = a + b over n f64 elements: double2 loads and stores where all three are 16-byte
// aligned (device allocations are), element by element otherwise.
extern "C" __global__ void __launch_bounds__(erlcuda::kBlock1D)
vector_add_f64(const double* __restrict__ a, const double* __restrict__ b,
               double* __restrict__ c, long long n) {
    const long long first = erlcuda::global_thread();
    const long long stride = erlcuda::grid_threads();

    if (erlcuda::aligned16(a) && erlcuda::aligned16(b) && erlcuda::aligned16(c)) {
        const long long n2 = n >> 1;
        const double2* __restrict__ a2 = reinterpret_cast<const double2*>(a);
        const double2* __restrict__ b2 = reinterpret_cast<const double2*>(b);
        double2* __restrict__ c2 = reinterpret_cast<double2*>(c);
        for (long long i = first; i < n2; i += stride) {
            const double2 x = a2[i];
            const double2 y = b2[i];
            c2[i] = make_double2(x.x + y.x, x.y + y.y);
        }
        // The last element when n is odd.
        for (long long i = (n2 << 1) + first; i < n; i += stride) {
            c[i] = a[i] + b[i];
        }
    } else {
        for (long long i = first; i < n; i += stride) {
            c[i] = a[i] + b[i];
        }
    }
}
